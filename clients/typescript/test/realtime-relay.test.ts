// The realtime relay example (examples/realtime-relay) end to end: the real
// respcoord binary, two relay processes on one session, real WebSockets on
// loopback, and a raw watch-all recording what the coordinator saw.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { credentials, status as GrpcStatus, type ClientReadableStream, type ServiceError } from "@grpc/grpc-js";

import * as pb from "../src/gen/respcoord/v1/coordinator.js";
import { RealtimeSocket, RelayProcess, round, violations, type RoundReport } from "../examples/realtime-relay/scenario.js";
import { Binary, freePort, within } from "./harness.js";

/** Every lifecycle event of the coordinator from before the first test, per session. */
class WatchRecording {
  readonly #raw: pb.ResponseCoordinatorClient;
  readonly #stream: ClientReadableStream<pb.WatchResponse>;
  readonly #events = new Map<string, pb.LifecycleEvent[]>();
  readonly #listeners = new Set<() => void>();
  #failed: Error | undefined;

  private constructor(raw: pb.ResponseCoordinatorClient, afterSeq: bigint) {
    this.#raw = raw;
    this.#stream = raw.watch({ sessionId: "", afterSeq, afterRevision: undefined });
    this.#stream.on("data", (message: pb.WatchResponse) => {
      for (const event of message.events) {
        const list = this.#events.get(event.sessionId) ?? [];
        list.push(event);
        this.#events.set(event.sessionId, list);
      }
      for (const listener of this.#listeners) listener();
    });
    this.#stream.on("error", (error: ServiceError) => {
      if ((error.code as number) !== (GrpcStatus.CANCELLED as number)) this.#failed = error;
      for (const listener of this.#listeners) listener();
    });
  }

  static async open(target: string): Promise<WatchRecording> {
    const raw = new pb.ResponseCoordinatorClient(target, credentials.createInsecure());
    const listed = await new Promise<pb.ListSessionsResponse>((resolve, reject) => {
      raw.listSessions({ pageSize: 1, pageToken: "" }, (error, reply) => {
        if (error) reject(error);
        else resolve(reply);
      });
    });
    return new WatchRecording(raw, listed.seq);
  }

  /** The session's started and ended events, keyed by response id. */
  lifecycle(sessionId: string): { started: Map<bigint, number>; ended: Map<bigint, pb.ResponseEnded[]> } {
    const started = new Map<bigint, number>();
    const ended = new Map<bigint, pb.ResponseEnded[]>();
    for (const event of this.#events.get(sessionId) ?? []) {
      if (event.kind?.$case === "started") {
        const id = event.kind.value.responseId;
        started.set(id, (started.get(id) ?? 0) + 1);
      } else if (event.kind?.$case === "ended") {
        const id = event.kind.value.responseId;
        ended.set(id, [...(ended.get(id) ?? []), event.kind.value]);
      }
    }
    return { started, ended };
  }

  /** Waits until `done` holds over the recording (checked on every message). */
  until(what: string, done: () => boolean): Promise<void> {
    return within(
      what,
      new Promise<void>((resolve, reject) => {
        const check = (): void => {
          if (this.#failed !== undefined) {
            this.#listeners.delete(check);
            reject(this.#failed);
          } else if (done()) {
            this.#listeners.delete(check);
            resolve();
          }
        };
        this.#listeners.add(check);
        check();
      }),
    );
  }

  /**
   * Waits until `count` responses of the session have started and every
   * started one has ended, then checks: exactly one started and one ended
   * event per response. Returns each response's ended event.
   */
  async exactlyOneEndPerStart(sessionId: string, count: number): Promise<Map<bigint, pb.ResponseEnded>> {
    await this.until(`the watch shows ${count} started responses of ${sessionId}, each ended`, () => {
      const { started, ended } = this.lifecycle(sessionId);
      return started.size >= count && [...started.keys()].every((id) => ended.has(id));
    });
    const { started, ended } = this.lifecycle(sessionId);
    assert.equal(started.size, count, `${sessionId}: ${count} responses started`);
    const result = new Map<bigint, pb.ResponseEnded>();
    for (const [id, starts] of started) {
      assert.equal(starts, 1, `${sessionId}: one started event for ${id}`);
      const ends = ended.get(id) ?? [];
      assert.equal(ends.length, 1, `${sessionId}: exactly one ended event for ${id}`);
      const [end] = ends;
      if (end !== undefined) result.set(id, end);
    }
    for (const id of ended.keys()) assert.ok(started.has(id), `${sessionId}: an ended event for ${id}, which never started`);
    return result;
  }

  close(): void {
    this.#stream.cancel();
    this.#raw.close();
  }
}

function idOf(name: string): bigint {
  return BigInt(name.replace(/^resp_/, ""));
}

function printRound(report: RoundReport): void {
  console.log(
    `realtime relay ${report.mode}: A streamed ${report.a.deltasBeforeBargeIn} deltas, ${report.a.deltasInFlight} in flight, ` +
      `${report.a.deltasAfterStop} after the stop; stop at A's relay ${report.stopAtRelayMs.toFixed(2)} ms, at A's client ` +
      `${report.stopAtClientMs.toFixed(2)} ms after B's event (${report.stopAfterReplyMs.toFixed(2)} ms after B's reply)`,
  );
}

void describe("realtime relay example (two relay processes, real WebSockets, the respcoord binary)", () => {
  let server: Binary | undefined;
  let watch: WatchRecording | undefined;
  let a: RelayProcess | undefined;
  let b: RelayProcess | undefined;

  before(async () => {
    server = await Binary.start(await freePort());
    watch = await WatchRecording.open(server.target);
    // A's replies are ten minutes long: only a stop can end them.
    a = await RelayProcess.spawn({ name: "A", coordinator: server.target, replyMs: 600_000 });
    b = await RelayProcess.spawn({ name: "B", coordinator: server.target, replyMs: 400, hz: 660 });
  });

  after(async () => {
    await Promise.all([a?.stop(), b?.stop()]);
    watch?.close();
    await server?.kill();
  });

  function running(): { a: RelayProcess; b: RelayProcess; watch: WatchRecording } {
    assert.ok(a !== undefined && b !== undefined && watch !== undefined, "the relays and the watch are up");
    return { a, b, watch };
  }

  void test("a barge-in on relay B stops relay A's audio; one ended per started response", async () => {
    const { a, b, watch } = running();
    const report = await round({ a, b, sessionId: "relay-barge-in", mode: "barge-in" });
    printRound(report);
    assert.deepEqual(violations(report), []);
    assert.equal(report.a.deltasAfterStop, 0, "no delta of A's response after A's client saw it stop");
    assert.equal(report.a.reason, "superseded");
    assert.ok(report.b !== undefined);
    assert.equal(report.b.status, "completed");
    assert.ok(report.b.deltas > 0, "B answered the turn with audio");
    const ends = await watch.exactlyOneEndPerStart("relay-barge-in", 2);
    const endA = ends.get(idOf(report.a.responseId));
    assert.equal(endA?.status, pb.TerminalStatus.TERMINAL_STATUS_CANCELLED);
    assert.equal(endA.reason, pb.CancelReason.CANCEL_REASON_SUPERSEDED);
    assert.equal(ends.get(idOf(report.b.responseId))?.status, pb.TerminalStatus.TERMINAL_STATUS_COMPLETED);
  });

  void test("a response.cancel on relay B by response id stops relay A's audio", async () => {
    const { a, b, watch } = running();
    const report = await round({ a, b, sessionId: "relay-cancel", mode: "cancel" });
    printRound(report);
    assert.deepEqual(violations(report), []);
    assert.equal(report.a.deltasAfterStop, 0);
    assert.equal(report.a.reason, "cancelled");
    const ends = await watch.exactlyOneEndPerStart("relay-cancel", 1);
    const endA = ends.get(idOf(report.a.responseId));
    assert.equal(endA?.status, pb.TerminalStatus.TERMINAL_STATUS_CANCELLED);
    assert.equal(endA.reason, pb.CancelReason.CANCEL_REASON_REQUESTED);
  });

  void test("barge-in rounds repeated on fresh sessions: never a delta after the stop", async () => {
    const { a, b, watch } = running();
    const rounds = 10;
    let inFlight = 0;
    const stops: number[] = [];
    for (let i = 0; i < rounds; i += 1) {
      const sessionId = `relay-repeat-${i}`;
      const report = await round({ a, b, sessionId, mode: i % 2 === 0 ? "barge-in" : "cancel", deltasBefore: 2 });
      assert.deepEqual(violations(report), [], `round ${i}`);
      await watch.exactlyOneEndPerStart(sessionId, i % 2 === 0 ? 2 : 1);
      inFlight += report.a.deltasInFlight;
      stops.push(report.stopAtClientMs);
    }
    stops.sort((x, y) => x - y);
    console.log(
      `realtime relay, ${rounds} rounds: 0 deltas after a stop, ${inFlight} in flight; B's event -> A's client stop ` +
        `median ${(stops[Math.floor(rounds / 2)] ?? Number.NaN).toFixed(2)} ms, max ${(stops[rounds - 1] ?? Number.NaN).toFixed(2)} ms`,
    );
  });

  void test("a client leaving mid-response: its response ends once, FAILED", async () => {
    const { a, watch } = running();
    const socket = await RealtimeSocket.open(a.url, "relay-leaves");
    socket.send({ type: "response.create" });
    const created = await socket.waitFor("response.created", (e) => e.type === "response.created");
    const name = created.responseId ?? "";
    await socket.waitFor("audio flows", (e) => e.type === "response.audio.delta" && e.responseId === name);
    await socket.close();
    const ends = await watch.exactlyOneEndPerStart("relay-leaves", 1);
    assert.equal(ends.get(idOf(name))?.status, pb.TerminalStatus.TERMINAL_STATUS_FAILED);
  });

  void test("SIGTERM: the relay ends its live responses (one FAILED each) and exits", async () => {
    const { watch } = running();
    assert.ok(server !== undefined);
    const c = await RelayProcess.spawn({ name: "C", coordinator: server.target, replyMs: 600_000 });
    try {
      const socket = await RealtimeSocket.open(c.url, "relay-sigterm");
      socket.send({ type: "response.create" });
      const created = await socket.waitFor("response.created", (e) => e.type === "response.created");
      await socket.waitFor("audio flows", (e) => e.type === "response.audio.delta");
      const stopped = c.stop();
      const done = await socket.waitFor("response.done", (e) => e.type === "response.done");
      assert.equal(done.responseId, created.responseId);
      assert.equal(done.status, "failed");
      assert.equal((await socket.closed()).code, 1001);
      await stopped;
      const ends = await watch.exactlyOneEndPerStart("relay-sigterm", 1);
      assert.equal(ends.get(idOf(created.responseId ?? ""))?.status, pb.TerminalStatus.TERMINAL_STATUS_FAILED);
    } finally {
      await c.stop();
    }
  });

  void test("malformed frames get error events and the connection stays usable; a bad session id is refused", async () => {
    const { a, watch } = running();
    const socket = await RealtimeSocket.open(a.url, "relay-protocol");
    await socket.waitFor("session.created", (e) => e.type === "session.created");
    const errorCode = async (send: () => void): Promise<unknown> => {
      const seen = socket.received.items.length;
      send();
      const error = await socket.waitFor("an error event", (e) => e.index >= seen && e.type === "error");
      const detail = error.raw.error;
      return typeof detail === "object" && detail !== null ? (detail as Record<string, unknown>).code : undefined;
    };
    assert.equal(await errorCode(() => socket.send("not json")), "invalid_json");
    assert.equal(await errorCode(() => socket.send("[1]")), "invalid_event");
    assert.equal(await errorCode(() => socket.send({ type: 5 })), "unknown_event");
    assert.equal(await errorCode(() => socket.send({ type: "conversation.item.create" })), "unknown_event");
    assert.equal(await errorCode(() => socket.send({ type: "response.create", event_id: 7 })), "invalid_event");
    assert.equal(await errorCode(() => socket.send({ type: "response.cancel", response_id: "resp_x" })), "invalid_value");
    assert.equal(await errorCode(() => socket.send({ type: "response.cancel", response_id: `resp_${1n << 64n}` })), "invalid_value");
    assert.equal(await errorCode(() => socket.send({ type: "response.cancel" })), "response_cancel_not_active");
    assert.equal(await errorCode(() => socket.send({ type: "input_audio_buffer.append", audio: 1 })), "invalid_value");
    assert.equal(await errorCode(() => { socket.sendBinary(Buffer.from([1, 2, 3])); }), "invalid_frame");
    // Still serving: a response, then this connection's own cancel.
    socket.send({ type: "input_audio_buffer.append", audio: "AAAA" });
    socket.send({ type: "response.create" });
    const created = await socket.waitFor("response.created", (e) => e.type === "response.created");
    await socket.waitFor("audio flows", (e) => e.type === "response.audio.delta");
    socket.send({ type: "response.cancel" });
    const done = await socket.waitFor("response.done", (e) => e.type === "response.done");
    assert.equal(done.responseId, created.responseId);
    assert.equal(done.status, "cancelled");
    assert.equal(done.reason, "cancelled");
    await socket.close();
    await watch.exactlyOneEndPerStart("relay-protocol", 1);

    for (const bad of ["", "call\u0001", "x".repeat(257)]) {
      const refused = await RealtimeSocket.open(a.url, bad);
      const error = await refused.waitFor("the refusal", (e) => e.type === "error");
      assert.equal((error.raw.error as Record<string, unknown>).code, "invalid_session");
      assert.equal((await refused.closed()).code, 1008);
    }
  });
});
