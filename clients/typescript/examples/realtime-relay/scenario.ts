// The two-relay barge-in scenario, shared by the driver (driver.ts) and the
// end-to-end test (test/realtime-relay.test.ts): relay processes, WebSocket
// clients that record every event they receive, and one round.
//
// Every wait is for a condition, bounded by a generous timeout that only
// turns "never happened" into an error; nothing depends on timing.
import { spawn, type ChildProcess } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

import { WebSocket } from "ws";

import { nowMs } from "./relay.js";

/** The generous bound of every wait (a wait that fails means it never happened). */
export const WAIT_MS = 20_000;

async function within<T>(what: string, promise: Promise<T>, ms = WAIT_MS): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      reject(new Error(`${what}: did not happen within ${ms} ms`));
    }, ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** A list that can be waited on: `waitFor` resolves with the first item, present or future, matching. */
class Recorded<T> {
  readonly items: T[] = [];
  readonly #waiters = new Set<{ match: (item: T) => boolean; resolve: (item: T) => void }>();

  push(item: T): void {
    this.items.push(item);
    for (const waiter of this.#waiters) {
      if (waiter.match(item)) {
        this.#waiters.delete(waiter);
        waiter.resolve(item);
      }
    }
  }

  waitFor(what: string, match: (item: T) => boolean, ms = WAIT_MS): Promise<T> {
    const found = this.items.find(match);
    if (found !== undefined) return Promise.resolve(found);
    let waiter: { match: (item: T) => boolean; resolve: (item: T) => void } | undefined;
    const arrived = new Promise<T>((resolve) => {
      waiter = { match, resolve };
      this.#waiters.add(waiter);
    });
    return within(what, arrived, ms).finally(() => {
      if (waiter !== undefined) this.#waiters.delete(waiter);
    });
  }
}

/** A relay log line (see relay.ts), as parsed from the process's stdout. */
export interface RelayLog {
  readonly event: string;
  readonly atMs?: number;
  readonly response?: string;
  readonly outcome?: string;
  readonly reason?: string;
  readonly deltas?: number;
  readonly droppedByFence?: number;
  readonly [field: string]: unknown;
}

const serveJs = fileURLToPath(new URL("./serve.js", import.meta.url));

export interface RelaySpec {
  readonly name: string;
  readonly coordinator: string;
  readonly replyMs: number;
  readonly chunkMs?: number;
  readonly hz?: number;
}

/** A relay (serve.js) in its own Node process. */
export class RelayProcess {
  readonly name: string;
  readonly url: string;
  readonly logs: Recorded<RelayLog>;
  readonly #child: ChildProcess;

  private constructor(name: string, url: string, logs: Recorded<RelayLog>, child: ChildProcess) {
    this.name = name;
    this.url = url;
    this.logs = logs;
    this.#child = child;
  }

  /** Starts it and waits for its `listening` line. `onLog` sees every line (the driver prints them). */
  static async spawn(spec: RelaySpec, onLog?: (log: RelayLog) => void): Promise<RelayProcess> {
    const args = [
      serveJs,
      "--coordinator",
      spec.coordinator,
      "--name",
      spec.name,
      "--reply-ms",
      String(spec.replyMs),
      "--chunk-ms",
      String(spec.chunkMs ?? 20),
      "--hz",
      String(spec.hz ?? 440),
      "--exit-with-stdin",
    ];
    const child = spawn(process.execPath, ["--unhandled-rejections=strict", ...args], { stdio: ["pipe", "pipe", "pipe"] });
    const stderr: string[] = [];
    child.stderr.on("data", (chunk: Buffer) => {
      if (stderr.length < 200) stderr.push(chunk.toString());
    });
    const logs = new Recorded<RelayLog>();
    const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream });
    lines.on("line", (line) => {
      let parsed: unknown;
      try {
        parsed = JSON.parse(line);
      } catch {
        parsed = { event: "unparsed", line };
      }
      const log = (typeof parsed === "object" && parsed !== null ? parsed : { event: "unparsed", line }) as RelayLog;
      logs.push(log);
      onLog?.(log);
    });
    const exited = new Promise<never>((_, reject) => {
      child.once("error", reject);
      child.once("exit", (code, signal) => {
        reject(new Error(`relay ${spec.name} exited (${code ?? signal ?? "?"}): ${stderr.join("")}`));
      });
    });
    exited.catch(() => undefined);
    const listening = await within(`relay ${spec.name} listens`, Promise.race([logs.waitFor("listening", (l) => l.event === "listening"), exited]));
    if (typeof listening.url !== "string") throw new Error(`relay ${spec.name}: no url in ${JSON.stringify(listening)}`);
    return new RelayProcess(spec.name, listening.url, logs, child);
  }

  /** SIGTERM (the relay finishes its responses and closes), then waits for the exit. */
  async stop(): Promise<void> {
    if (this.#child.exitCode !== null || this.#child.signalCode !== null) return;
    const exited = new Promise((resolve) => this.#child.once("exit", resolve));
    this.#child.kill("SIGTERM");
    const timer = setTimeout(() => this.#child.kill("SIGKILL"), 10_000);
    await exited;
    clearTimeout(timer);
  }
}

/** A server event as a client receives it; `index` is its position on this socket. */
export interface Received {
  readonly index: number;
  readonly atMs: number;
  readonly type: string;
  readonly responseId: string | undefined;
  readonly status: string | undefined;
  readonly reason: string | undefined;
  readonly raw: Record<string, unknown>;
}

function field(record: Record<string, unknown>, name: string): unknown {
  return record[name];
}

function text(value: unknown): string | undefined {
  return typeof value === "string" ? value : undefined;
}

/** What a browser or phone leg would be: a WebSocket client recording every event. */
export class RealtimeSocket {
  readonly received = new Recorded<Received>();
  readonly #socket: WebSocket;
  readonly #closed: Promise<{ code: number; reason: string }>;

  private constructor(socket: WebSocket) {
    this.#socket = socket;
    this.#closed = new Promise((resolve) => {
      socket.once("close", (code, reason) => {
        resolve({ code, reason: reason.toString() });
      });
    });
    socket.on("message", (data, isBinary) => {
      if (isBinary) return;
      let parsed: unknown;
      try {
        parsed = JSON.parse(Buffer.isBuffer(data) ? data.toString("utf8") : Buffer.from(data as ArrayBuffer).toString("utf8"));
      } catch {
        return;
      }
      if (typeof parsed !== "object" || parsed === null) return;
      const raw = parsed as Record<string, unknown>;
      const response = field(raw, "response");
      const responseRecord = typeof response === "object" && response !== null ? (response as Record<string, unknown>) : undefined;
      const details = responseRecord === undefined ? undefined : field(responseRecord, "status_details");
      this.received.push({
        index: this.received.items.length,
        atMs: nowMs(),
        type: text(field(raw, "type")) ?? "",
        responseId: text(field(raw, "response_id")) ?? (responseRecord === undefined ? undefined : text(field(responseRecord, "id"))),
        status: responseRecord === undefined ? undefined : text(field(responseRecord, "status")),
        reason:
          typeof details === "object" && details !== null ? text(field(details as Record<string, unknown>, "reason")) : undefined,
        raw,
      });
    });
  }

  /** Connects to `relayUrl?session=...` (the session may be any string: it is the relay's to refuse). */
  static async open(relayUrl: string, session: string): Promise<RealtimeSocket> {
    const url = `${relayUrl}?session=${encodeURIComponent(session)}`;
    const socket = new WebSocket(url);
    // Errors after the open are reported as a close; never an unhandled 'error' event.
    const opened = new Promise<void>((resolve, reject) => {
      socket.once("open", resolve);
      socket.once("error", reject);
    });
    socket.on("error", () => undefined);
    // Recording from before the open: the first event can arrive with the upgrade reply.
    const recording = new RealtimeSocket(socket);
    await within(`connect to ${url}`, opened);
    return recording;
  }

  /** Sends one event (or raw text); returns when it was sent, in nowMs(). */
  send(event: Record<string, unknown> | string): number {
    this.#socket.send(typeof event === "string" ? event : JSON.stringify(event));
    return nowMs();
  }

  sendBinary(bytes: Buffer): void {
    this.#socket.send(bytes, { binary: true });
  }

  waitFor(what: string, match: (event: Received) => boolean, ms = WAIT_MS): Promise<Received> {
    return this.received.waitFor(what, match, ms);
  }

  /** Deltas received for a response (all of them, or those after event `afterIndex`). */
  deltas(responseId: string, afterIndex = -1): Received[] {
    return this.received.items.filter((e) => e.type === "response.audio.delta" && e.responseId === responseId && e.index > afterIndex);
  }

  /**
   * A WebSocket ping, answered by the relay's socket after everything it
   * sent before: once the pong is here, every earlier frame is too.
   */
  flush(): Promise<void> {
    return within(
      "the relay answers a ping",
      new Promise<void>((resolve, reject) => {
        this.#socket.once("pong", () => {
          resolve();
        });
        // ws calls back with null or undefined once the ping is written.
        this.#socket.ping(undefined, undefined, (error: Error | null | undefined) => {
          if (error instanceof Error) reject(error);
        });
      }),
    );
  }

  /** Resolves with the close code once the socket is closed (by either side). */
  closed(): Promise<{ code: number; reason: string }> {
    return within("the socket closes", this.#closed);
  }

  async close(): Promise<void> {
    if (this.#socket.readyState === WebSocket.CLOSED) return;
    this.#socket.close(1000);
    await this.closed();
  }
}

export type RoundMode = "barge-in" | "cancel";

export interface RoundReport {
  readonly mode: RoundMode;
  readonly sessionId: string;
  /** A's response: the one streaming when B barges in. */
  readonly a: {
    readonly responseId: string;
    readonly deltasBeforeBargeIn: number;
    /** Received by A's client after B's barge-in was sent, before A's response.done: in flight during propagation. */
    readonly deltasInFlight: number;
    /** Received by A's client after A's response.done, up to the end of A's body: must be 0. */
    readonly deltasAfterStop: number;
    readonly status: string | undefined;
    readonly reason: string | undefined;
    /** What A's relay's `run` returned. */
    readonly relayOutcome: string | undefined;
    readonly relayReason: string | undefined;
    /** Chunks the model produced after the stop that the fence dropped (the signal usually stops the model first). */
    readonly droppedByFence: number | undefined;
  };
  /** B's own response (barge-in mode: the VAD turn, answered after speech_stopped). */
  readonly b:
    | {
        readonly responseId: string;
        readonly deltas: number;
        readonly status: string | undefined;
        readonly relayOutcome: string | undefined;
        readonly finished: string | undefined;
      }
    | undefined;
  /** From B's client sending the barge-in to A's relay's `run` returning `stopped` (cross-process clocks). */
  readonly stopAtRelayMs: number;
  /** From B's client sending the barge-in to A's client receiving A's `response.done` (one clock). */
  readonly stopAtClientMs: number;
  /**
   * From B's relay getting its Start (or Cancel) reply to A's relay's `run`
   * returning `stopped`: the coordinator-to-other-gateway part, about the
   * watch delay (cross-process clocks; can be slightly negative when A's
   * watch beats B's reply).
   */
  readonly stopAfterReplyMs: number;
  /** `response.done` events per response id, over both clients. */
  readonly terminals: Readonly<Record<string, number>>;
}

export interface RoundSpec {
  readonly a: RelayProcess;
  readonly b: RelayProcess;
  readonly sessionId: string;
  readonly mode: RoundMode;
  /** Deltas A's client receives before B barges in (default 5). */
  readonly deltasBefore?: number;
}

function numberOr(value: unknown): number | undefined {
  return typeof value === "number" ? value : undefined;
}

/**
 * One round: A's client asks for a response and receives its audio; B's
 * client (another relay process, same session) barges in (`speech_started`)
 * or cancels A's response by id (`response.cancel`); A's audio must stop.
 */
export async function round(spec: RoundSpec): Promise<RoundReport> {
  const { sessionId, mode } = spec;
  const sa = await RealtimeSocket.open(spec.a.url, sessionId);
  const sb = await RealtimeSocket.open(spec.b.url, sessionId);
  try {
    await sa.waitFor("A's session.created", (e) => e.type === "session.created");
    await sb.waitFor("B's session.created", (e) => e.type === "session.created");

    sa.send({ type: "response.create" });
    const createdA = await sa.waitFor("A's response.created", (e) => e.type === "response.created");
    const idA = createdA.responseId;
    if (idA === undefined) throw new Error("A's response.created has no response id");
    const before = spec.deltasBefore ?? 5;
    await sa.waitFor(`A's client receives ${before} deltas`, () => sa.deltas(idA).length >= before);
    const deltasBeforeBargeIn = sa.deltas(idA).length;

    const bargeInAt =
      mode === "barge-in" ? sb.send({ type: "input_audio_buffer.speech_started" }) : sb.send({ type: "response.cancel", response_id: idA });
    const doneA = await sa.waitFor("A's response.done after the barge-in", (e) => e.type === "response.done" && e.responseId === idA);
    const idB =
      mode === "barge-in"
        ? (await sb.waitFor("B's response.created", (e) => e.type === "response.created")).responseId
        : undefined;
    // A's relay: its run returned, and its body (the model stream) is over,
    // so nothing more of A's response can be sent; the pong brings everything
    // it did send.
    const nA = idA.replace(/^resp_/, "");
    const endedA = await spec.a.logs.waitFor("A's relay ends A's response", (l) => l.event === "ended" && l.response === nA);
    const settledA = await spec.a.logs
      .waitFor("A's relay's body settles", (l) => l.event === "settled" && l.response === nA)
      .catch((error: unknown) => {
        // A body that never ends is usually one still streaming: say so.
        const after = sa.deltas(idA, doneA.index).length;
        const message = error instanceof Error ? error.message : String(error);
        throw new Error(`${message}; A's client got ${after} deltas after the stop so far`, { cause: error });
      });
    // B's relay's call returned: the coordinator had applied it.
    const replyB =
      idB === undefined
        ? await spec.b.logs.waitFor("B's relay's Cancel returns", (l) => l.event === "cancel" && l.response === nA)
        : await spec.b.logs.waitFor("B's relay's Start returns", (l) => l.event === "started" && l.response === idB.replace(/^resp_/, ""));
    await sa.flush();
    const deltasInFlight = sa.received.items.filter(
      (e) => e.type === "response.audio.delta" && e.responseId === idA && e.atMs >= bargeInAt && e.index < doneA.index,
    ).length;
    const deltasAfterStop = sa.deltas(idA, doneA.index).length;

    let b: RoundReport["b"];
    if (idB !== undefined) {
      sb.send({ type: "input_audio_buffer.speech_stopped" });
      const doneB = await sb.waitFor("B's response.done", (e) => e.type === "response.done" && e.responseId === idB);
      const nB = idB.replace(/^resp_/, "");
      const endedB = await spec.b.logs.waitFor("B's relay ends B's response", (l) => l.event === "ended" && l.response === nB);
      b = {
        responseId: idB,
        deltas: sb.deltas(idB).length,
        status: doneB.status,
        relayOutcome: endedB.outcome,
        finished: typeof endedB.finished === "string" ? endedB.finished : undefined,
      };
    }
    await sa.flush();
    await sb.flush();
    const terminals: Record<string, number> = {};
    for (const socket of [sa, sb]) {
      for (const e of socket.received.items) {
        if (e.type === "response.created" && e.responseId !== undefined) terminals[e.responseId] ??= 0;
        if (e.type === "response.done" && e.responseId !== undefined) terminals[e.responseId] = (terminals[e.responseId] ?? 0) + 1;
      }
    }
    return {
      mode,
      sessionId,
      a: {
        responseId: idA,
        deltasBeforeBargeIn,
        deltasInFlight,
        deltasAfterStop,
        status: doneA.status,
        reason: doneA.reason,
        relayOutcome: endedA.outcome,
        relayReason: endedA.reason,
        droppedByFence: numberOr(settledA.droppedByFence),
      },
      b,
      stopAtRelayMs: (numberOr(endedA.atMs) ?? Number.NaN) - bargeInAt,
      stopAtClientMs: doneA.atMs - bargeInAt,
      stopAfterReplyMs: (numberOr(endedA.atMs) ?? Number.NaN) - (numberOr(replyB.atMs) ?? Number.NaN),
      terminals,
    };
  } finally {
    await Promise.all([sa.close(), sb.close()]);
  }
}

/** What a round must show; empty when it holds. */
export function violations(report: RoundReport): string[] {
  const found: string[] = [];
  const expectReason = report.mode === "barge-in" ? "superseded" : "cancelled";
  if (report.a.deltasAfterStop !== 0) {
    found.push(`A's client received ${report.a.deltasAfterStop} deltas of ${report.a.responseId} after its response.done`);
  }
  if (report.a.status !== "cancelled") found.push(`A's response.done status is ${report.a.status ?? "missing"}, not cancelled`);
  if (report.a.reason !== expectReason) found.push(`A's stop reason is ${report.a.reason ?? "missing"}, not ${expectReason}`);
  if (report.a.relayOutcome !== "stopped") found.push(`A's relay's run returned ${report.a.relayOutcome ?? "nothing"}, not stopped`);
  if (report.mode === "barge-in") {
    if (report.b === undefined) found.push("B started no response");
    else {
      if (report.b.status !== "completed") found.push(`B's response.done status is ${report.b.status ?? "missing"}, not completed`);
      if (report.b.finished !== "applied") found.push(`B's Finish was ${report.b.finished ?? "missing"}, not applied`);
    }
  }
  for (const [id, count] of Object.entries(report.terminals)) {
    if (count !== 1) found.push(`${id}: ${count} response.done events, not exactly 1`);
  }
  return found;
}

/** Nearest-rank percentile of sorted values. */
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[rank] ?? Number.NaN;
}
