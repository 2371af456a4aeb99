// A relay process in the shape of an OpenAI-Realtime gateway: a WebSocket
// server that browsers or phone legs connect to (`/v1/realtime?session=ID`),
// streaming a (fake) model's audio back. Every response runs under respcoord,
// so several relay processes can serve one session: a barge-in on any of
// them stops the audio on all the others within the watch delay.
//
// The three respcoord points, all in `#stream` and `#respond`:
// - each response is `session.run(source, body)`: the coordinator makes it
//   the session's one live response, superseding the previous one wherever
//   it runs, and the body's end is reported as Finish exactly once;
// - every audio delta goes out only while `ctx.isCurrent()` (the fence);
// - the model call takes `ctx.signal`, so a stop aborts the upstream stream.
import type { IncomingMessage } from "node:http";
import type { AddressInfo } from "node:net";
import { performance } from "node:perf_hooks";

import { WebSocket, WebSocketServer, type RawData } from "ws";

import { Source, type Client, type ResponseContext, type RunOutcome, type Session } from "respcoord";

import { fakeModel } from "./fake-model.js";
import { parseClientEvent, parseResponseName, responseName, type ClientEvent, type ResponseObject, type ServerEvent } from "./protocol.js";

/** One structured log line (the relay's only output besides the sockets). */
export type LogEvent = Readonly<Record<string, string | number | boolean | undefined>>;

export interface RelayOptions {
  /** The respcoord client this process shares across all its connections. */
  readonly client: Client;
  /** Shown in logs and in `session.created`. */
  readonly name: string;
  readonly host?: string;
  /** 0 (the default): any free port. */
  readonly port?: number;
  /** Length of the fake model's replies, in audio ms (default 3000). */
  readonly replyMs?: number;
  /** Audio per delta, in ms (default 20). */
  readonly chunkMs?: number;
  /** Tone of this relay's fake model (default 440 Hz). */
  readonly hz?: number;
  readonly log?: (event: LogEvent) => void;
}

/** The largest client frame accepted; larger ones close the socket (1009). */
const MAX_FRAME_BYTES = 1 << 20;

/** Wall-clock milliseconds with sub-millisecond resolution, comparable across local processes. */
export function nowMs(): number {
  return performance.timeOrigin + performance.now();
}

interface Turn {
  /** Resolves when the caller stops talking (`speech_stopped`). */
  readonly ended: Promise<void>;
  end(): void;
}

function newTurn(): Turn {
  let end!: () => void;
  const ended = new Promise<void>((resolve) => {
    end = resolve;
  });
  return { ended, end };
}

/** Resolves when `signal` aborts (never rejects). */
function untilAborted(signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) => {
    signal.addEventListener(
      "abort",
      () => {
        resolve();
      },
      { once: true },
    );
  });
}

/** A signal aborted when either aborts (AbortSignal.any needs Node 20.3). */
function eitherSignal(a: AbortSignal, b: AbortSignal): AbortSignal {
  const controller = new AbortController();
  const abort = (): void => {
    controller.abort();
  };
  if (a.aborted || b.aborted) abort();
  else {
    a.addEventListener("abort", abort, { once: true });
    b.addEventListener("abort", abort, { once: true });
  }
  return controller.signal;
}

function describeError(error: unknown): { code: string; message: string } {
  if (error instanceof Error) {
    const code = "code" in error && typeof error.code === "string" ? error.code : error.name;
    return { code, message: error.message };
  }
  return { code: "unknown", message: String(error) };
}

/** One client WebSocket, bound to one respcoord session. */
class Connection {
  readonly id: number;
  readonly socket: WebSocket;
  readonly session: Session;
  /** Aborted when the socket closes or the relay shuts down: the connection's responses end (FAILED). */
  readonly gone = new AbortController();
  /** This connection's responses whose `run` has not returned. */
  readonly live = new Set<bigint>();
  /** The caller's turn in progress (after `speech_started`), answered on `speech_stopped`. */
  turn: Turn | undefined;

  constructor(id: number, socket: WebSocket, session: Session) {
    this.id = id;
    this.socket = socket;
    this.session = session;
  }
}

/** A running relay. `close()` ends its responses, closes its sockets and stops listening. */
export class Relay {
  readonly name: string;
  readonly url: string;
  readonly #options: RelayOptions;
  readonly #server: WebSocketServer;
  readonly #connections = new Set<Connection>();
  readonly #runs = new Set<Promise<void>>();
  #nextConnection = 1;
  #nextEvent = 1;
  #closing = false;

  private constructor(options: RelayOptions, server: WebSocketServer, url: string) {
    this.name = options.name;
    this.#options = options;
    this.#server = server;
    this.url = url;
    server.on("connection", (socket, request) => {
      this.#onConnection(socket, request);
    });
  }

  /** Listens on `host:port` (default 127.0.0.1, any free port). */
  static async listen(options: RelayOptions): Promise<Relay> {
    const host = options.host ?? "127.0.0.1";
    const server = new WebSocketServer({ host, port: options.port ?? 0, path: "/v1/realtime", maxPayload: MAX_FRAME_BYTES });
    await new Promise<void>((resolve, reject) => {
      server.once("listening", resolve);
      server.once("error", reject);
    });
    // After listening, a server error is logged, never thrown (an unhandled 'error' event kills Node).
    server.on("error", (error) => {
      options.log?.({ event: "server-error", relay: options.name, ...describeError(error) });
    });
    const address = server.address() as AddressInfo;
    const shownHost = host.includes(":") ? `[${host}]` : host;
    const relay = new Relay(options, server, `ws://${shownHost}:${address.port}/v1/realtime`);
    relay.#log({ event: "listening", url: relay.url });
    return relay;
  }

  #log(event: LogEvent): void {
    this.#options.log?.({ relay: this.name, atMs: nowMs(), ...event });
  }

  #send(conn: Connection, event: ServerEvent): void {
    if (conn.socket.readyState === WebSocket.OPEN) conn.socket.send(JSON.stringify(event));
  }

  #eventId(): string {
    const id = `event_${this.name}_${this.#nextEvent}`;
    this.#nextEvent += 1;
    return id;
  }

  #sendError(conn: Connection | WebSocket, code: string, message: string, eventId?: string, type = "invalid_request_error"): void {
    const event: ServerEvent = {
      type: "error",
      event_id: this.#eventId(),
      error: { type, code, message, ...(eventId === undefined ? {} : { event_id: eventId }) },
    };
    const socket = conn instanceof Connection ? conn.socket : conn;
    if (socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(event));
  }

  #onConnection(socket: WebSocket, request: IncomingMessage): void {
    socket.on("error", (error) => {
      this.#log({ event: "socket-error", ...describeError(error) });
    });
    if (this.#closing) {
      socket.close(1001, "relay shutting down");
      return;
    }
    const sessionId = new URL(request.url ?? "/", "ws://relay").searchParams.get("session");
    let session: Session;
    try {
      // Throws InvalidArgumentError (field session_id) for an id the coordinator would refuse.
      session = this.#options.client.session(sessionId ?? "");
    } catch (error) {
      const { message } = describeError(error);
      this.#log({ event: "refused", reason: message });
      this.#sendError(socket, "invalid_session", `?session=: ${message}`);
      socket.close(1008, "invalid session id");
      return;
    }
    // This relay serves the session from now on: its watch opens ahead, so a
    // stop right after the first Start needs no Watch set-up.
    session.openWatch();
    const conn = new Connection(this.#nextConnection, socket, session);
    this.#nextConnection += 1;
    this.#connections.add(conn);
    this.#log({ event: "connected", conn: conn.id, session: session.id });
    this.#send(conn, { type: "session.created", event_id: this.#eventId(), session: { id: session.id, relay: this.name } });
    socket.on("message", (data, isBinary) => {
      this.#onFrame(conn, data, isBinary);
    });
    socket.on("close", () => {
      conn.gone.abort();
      this.#connections.delete(conn);
      this.#log({ event: "disconnected", conn: conn.id, session: session.id });
    });
  }

  #onFrame(conn: Connection, data: RawData, isBinary: boolean): void {
    if (isBinary) {
      this.#sendError(conn, "invalid_frame", "events are JSON text frames");
      return;
    }
    const bytes = Buffer.isBuffer(data) ? data : Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data);
    const parsed = parseClientEvent(bytes.toString("utf8"));
    if (!parsed.ok) {
      this.#sendError(conn, parsed.code, parsed.message, parsed.eventId);
      return;
    }
    this.#onEvent(conn, parsed.event);
  }

  #onEvent(conn: Connection, event: ClientEvent): void {
    switch (event.type) {
      case "response.create":
        this.#spawn(this.#respond(conn, Source.Client, undefined));
        break;
      case "input_audio_buffer.speech_started": {
        // Barge-in: a VAD Start supersedes the session's live response, on
        // whichever relay it runs. The new response holds the caller's turn
        // and answers it once the caller stops talking.
        const turn = newTurn();
        conn.turn = turn;
        this.#spawn(this.#respond(conn, Source.Vad, turn));
        break;
      }
      case "input_audio_buffer.speech_stopped":
        conn.turn?.end();
        conn.turn = undefined;
        break;
      case "response.cancel":
        this.#spawn(this.#cancel(conn, event));
        break;
      case "input_audio_buffer.append":
        break;
    }
  }

  /** Tracks a task (it never rejects) so `close()` can wait for it. */
  #spawn(task: Promise<void>): void {
    this.#runs.add(task);
    void task.finally(() => this.#runs.delete(task));
  }

  /** One response: Start (superseding), stream, then exactly one `response.done`. Never rejects. */
  async #respond(conn: Connection, source: Source, turn: Turn | undefined): Promise<void> {
    const counts = { deltas: 0, dropped: 0 };
    let outcome: RunOutcome<void>;
    try {
      outcome = await conn.session.run(source, (ctx) => this.#stream(conn, ctx, turn, counts));
    } catch (error) {
      // The Start failed (coordinator unreachable, session terminated): no response exists.
      const { code, message } = describeError(error);
      this.#log({ event: "start-failed", conn: conn.id, session: conn.session.id, code, message });
      this.#sendError(conn, code, `response not started: ${message}`, undefined, "server_error");
      return;
    }
    conn.live.delete(outcome.responseId);
    const base = { object: "realtime.response", id: responseName(outcome.responseId) } as const;
    let response: ResponseObject;
    switch (outcome.kind) {
      case "completed":
        response = { ...base, status: "completed" };
        break;
      case "failed":
        response = {
          ...base,
          status: "failed",
          status_details: { type: "failed", error: { type: "server_error", message: describeError(outcome.error).message } },
        };
        break;
      case "stopped":
        // Stopped by the coordinator (a barge-in or Cancel from any relay):
        // the body was aborted and no Finish was sent.
        response = { ...base, status: "cancelled", status_details: { type: "cancelled", reason: outcome.reason } };
        break;
    }
    this.#log({
      event: "ended",
      conn: conn.id,
      session: conn.session.id,
      response: outcome.responseId.toString(),
      outcome: outcome.kind,
      reason: outcome.kind === "stopped" ? outcome.reason : undefined,
      finished: outcome.kind === "stopped" ? undefined : outcome.finished.kind,
      deltas: counts.deltas,
    });
    this.#send(conn, { type: "response.done", event_id: this.#eventId(), response });
  }

  /** The body of a response: the model's audio, fenced. */
  async #stream(
    conn: Connection,
    ctx: ResponseContext,
    turn: Turn | undefined,
    counts: { deltas: number; dropped: number },
  ): Promise<void> {
    conn.live.add(ctx.responseId);
    const name = responseName(ctx.responseId);
    const item = `item_${ctx.responseId}`;
    this.#log({ event: "started", conn: conn.id, session: conn.session.id, response: ctx.responseId.toString(), turn: turn !== undefined });
    // The model stops on either: the coordinator stopping the response, or the client leaving.
    const signal = eitherSignal(ctx.signal, conn.gone.signal);
    try {
      if (!ctx.isCurrent()) return;
      this.#send(conn, {
        type: "response.created",
        event_id: this.#eventId(),
        response: { object: "realtime.response", id: name, status: "in_progress" },
      });
      if (turn !== undefined) await Promise.race([turn.ended, untilAborted(signal)]);
      const model = fakeModel({
        replyMs: this.#options.replyMs ?? 3000,
        chunkMs: this.#options.chunkMs ?? 20,
        signal,
        ...(this.#options.hz === undefined ? {} : { hz: this.#options.hz }),
      });
      for await (const delta of model) {
        // The fence: checked right before each chunk goes out.
        if (!ctx.isCurrent()) {
          counts.dropped += 1;
          break;
        }
        this.#send(conn, {
          type: "response.audio.delta",
          event_id: this.#eventId(),
          response_id: name,
          item_id: item,
          output_index: 0,
          content_index: 0,
          delta,
        });
        counts.deltas += 1;
      }
      // Reported as FAILED by run (unless the coordinator stopped it first).
      if (conn.gone.signal.aborted) throw new Error("the client disconnected");
      if (!ctx.isCurrent()) return;
      this.#send(conn, {
        type: "response.audio.done",
        event_id: this.#eventId(),
        response_id: name,
        item_id: item,
        output_index: 0,
        content_index: 0,
      });
    } finally {
      // The body is over: nothing of this response can be sent any more.
      this.#log({
        event: "settled",
        conn: conn.id,
        response: ctx.responseId.toString(),
        deltas: counts.deltas,
        droppedByFence: counts.dropped,
      });
    }
  }

  /** `response.cancel`: the given response (on any relay), else this connection's own. Never rejects. */
  async #cancel(conn: Connection, event: Extract<ClientEvent, { type: "response.cancel" }>): Promise<void> {
    let targets: bigint[];
    if (event.response_id !== undefined) {
      const id = parseResponseName(event.response_id);
      if (id === undefined) {
        this.#sendError(conn, "invalid_value", "response_id must be resp_<id>", event.event_id);
        return;
      }
      targets = [id];
    } else {
      targets = [...conn.live];
    }
    if (targets.length === 0) {
      this.#sendError(conn, "response_cancel_not_active", "no active response on this connection", event.event_id);
      return;
    }
    for (const id of targets) {
      try {
        // Only if it is still the live one: never a blind cancel of a newer response.
        const cancelled = await conn.session.cancel({ source: Source.Client, ifResponseId: id });
        this.#log({ event: "cancel", conn: conn.id, session: conn.session.id, response: id.toString(), cancelled: cancelled === id });
        if (cancelled !== id) {
          this.#sendError(conn, "response_cancel_not_active", `${responseName(id)} is not the session's live response`, event.event_id);
        }
      } catch (error) {
        const { code, message } = describeError(error);
        this.#log({ event: "cancel-failed", conn: conn.id, response: id.toString(), code, message });
        this.#sendError(conn, code, `cancel failed: ${message}`, event.event_id, "server_error");
      }
    }
  }

  /**
   * Ends every connection's responses (their bodies see the connection gone
   * and report FAILED), waits for their Finish calls, closes the sockets and
   * stops listening. The respcoord client stays open: it is the caller's.
   */
  async close(): Promise<void> {
    if (this.#closing) return;
    this.#closing = true;
    for (const conn of this.#connections) conn.gone.abort();
    await Promise.all([...this.#runs]);
    for (const conn of this.#connections) {
      conn.socket.close(1001, "relay shutting down");
      setTimeout(() => {
        conn.socket.terminate();
      }, 1000).unref();
    }
    await new Promise<void>((resolve) => {
      this.#server.close(() => {
        resolve();
      });
    });
    this.#log({ event: "closed" });
  }
}
