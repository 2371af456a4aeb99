// Unit tests: the fencing table, the session watch against a scripted server,
// the watch pool, the error mapping, retries, validation, and the
// signal-taking calls (already aborted, aborted mid-call) on a real server.
import assert from "node:assert/strict";
import { EventEmitter } from "node:events";
import { describe, mock, test } from "node:test";

import { status as GrpcStatus } from "@grpc/grpc-js";

import * as pkg from "respcoord";

import {
  AlreadyFinishedError,
  CancelledError,
  Client,
  errorFromStatus,
  InternalError,
  InvalidArgumentError,
  NotFoundError,
  RespcoordError,
  SessionTerminatedError,
  UnauthenticatedError,
  UnavailableError,
} from "../src/index.js";
import * as pb from "../src/gen/respcoord/v1/coordinator.js";
import { backoffMs, defaultRetryPolicy, withRetry } from "../src/retry.js";
import { Liveness, Tracks } from "../src/fencing.js";
import { Linger, newCells, SessionWatch, Watches, type Cells, type WatchStream, type WatchTransport } from "../src/watch.js";
import { Fixture, freePort, until, within } from "./harness.js";

function event(sessionId: string, revision: bigint, kind: pb.LifecycleEvent["kind"]): pb.LifecycleEvent {
  return { sessionId, revision, seq: revision, unixNanos: 0n, kind };
}
const started = (id: bigint): pb.LifecycleEvent["kind"] => ({
  $case: "started",
  value: { responseId: id, source: pb.Source.SOURCE_CLIENT },
});
const cancelRequested = (id: bigint, reason: pb.CancelReason): pb.LifecycleEvent["kind"] => ({
  $case: "cancelRequested",
  value: { responseId: id, reason, source: pb.Source.SOURCE_UNSPECIFIED },
});
function sessionState(sessionId: string, phase: pb.Phase, active: bigint, revision: bigint): pb.SessionState {
  return { ...pb.SessionState.create(), sessionId, phase, activeResponseId: active, revision };
}

const terminated = (reason: pb.CancelReason): pb.LifecycleEvent["kind"] => ({ $case: "terminated", value: { reason } });

// The same cases as clients/rust/src/fencing.rs's tests.
void describe("fencing table", () => {
  void test("the first response opens the watch from its start, and it lingers after the last", () => {
    const tracks = new Tracks();
    const ref = tracks.track("s");
    assert.equal(tracks.watched("s"), false, "a session handle alone watches nothing");
    const first = new Liveness(10n);
    const { order, idle } = tracks.register(ref, first, 7n, true);
    assert.ok(order, "a watch");
    assert.equal(idle, undefined);
    assert.deepEqual(
      [order.session, order.afterRevision, order.expectStarted],
      ["s", 6n, 10n],
      "replays the response's own start",
    );
    const second = new Liveness(11n);
    assert.equal(tracks.register(ref, second, 9n, true).order, undefined, "one watch a session");
    assert.equal(tracks.unregister(ref, first), undefined, "one still live: not idle");
    const notices = tracks.apply([event("s", 10n, started(12n))]);
    assert.equal(second.reason, "superseded");
    assert.equal(notices.length, 1, "the last live response stopped: an idle notice");
    assert.equal(order.stop.aborted, false, "the watch lingers");
    assert.equal(tracks.unregister(ref, second), undefined, "already idle: no second notice");
    const [notice] = notices;
    assert.ok(notice);
    tracks.lingerOver(notice);
    assert.equal(order.stop.aborted, true, "closed once the linger is over");
    assert.equal(tracks.watched("s"), false);
    const replayed = new Liveness(20n);
    const again = tracks.register(ref, replayed, 30n, false).order;
    assert.ok(again, "a new watch");
    assert.deepEqual([again.afterRevision, again.expectStarted], [30n, undefined]);
    tracks.lingerOver(notice);
    assert.equal(again.stop.aborted, false, "a stale notice closes nothing");
  });

  void test("a Start inside the linger reuses the watch, and the stale linger changes nothing", () => {
    const tracks = new Tracks();
    const ref = tracks.track("s");
    const first = new Liveness(10n);
    const { order } = tracks.register(ref, first, 1n, true);
    assert.ok(order);
    first.stop("finished");
    const notice = tracks.unregister(ref, first);
    assert.ok(notice, "idle while the watch is open");
    const next = new Liveness(11n);
    assert.deepEqual(tracks.register(ref, next, 3n, true), { order: undefined, idle: undefined }, "no Watch call: the open one is reused");
    tracks.lingerOver(notice);
    assert.equal(order.stop.aborted, false, "a response registered since: the watch stays");
    assert.equal(next.isCurrent(), true);
    tracks.apply([event("s", 4n, cancelRequested(11n, pb.CancelReason.CANCEL_REASON_REQUESTED))]);
    assert.equal(next.reason, "cancelled", "the reused watch delivers the stop");
    assert.equal(tracks.watched("s"), true);
  });

  void test("a response stopped at once on an idle watched session begins the linger again", () => {
    const tracks = new Tracks();
    const ref = tracks.track("s");
    const first = new Liveness(10n);
    const { order } = tracks.register(ref, first, 1n, true);
    assert.ok(order);
    const [notice] = tracks.apply([event("s", 2n, cancelRequested(10n, pb.CancelReason.CANCEL_REASON_REQUESTED))]);
    assert.ok(notice);
    const late = new Liveness(10n);
    const refused = tracks.register(ref, late, 1n, false);
    assert.equal(late.reason, "cancelled");
    assert.equal(refused.order, undefined);
    assert.ok(refused.idle, "a fresh notice: the registration moved the generation");
    assert.ok(refused.idle.generation > notice.generation);
    tracks.lingerOver(notice);
    assert.equal(order.stop.aborted, false, "the older notice is stale");
    tracks.lingerOver(refused.idle);
    assert.equal(order.stop.aborted, true);
  });

  void test("a track outlives its last handle while its watch lingers, and goes after", () => {
    const tracks = new Tracks();
    const ref = tracks.track("s");
    const response = new Liveness(5n);
    const { order } = tracks.register(ref, response, 1n, true);
    assert.ok(order);
    const [notice] = tracks.apply([event("s", 3n, cancelRequested(5n, pb.CancelReason.CANCEL_REASON_REQUESTED))]);
    assert.ok(notice);
    ref.release();
    assert.equal(tracks.deadThrough("s"), 5n, "kept while the watch lingers");
    // A Start inside the linger of the same, already stopped response (a replay) is stopped at once.
    const again = tracks.track("s");
    const late = new Liveness(5n);
    const refused = tracks.register(again, late, 3n, false);
    assert.equal(late.reason, "cancelled", "deadThrough outlived the handle");
    again.release();
    assert.ok(refused.idle);
    tracks.lingerOver(refused.idle);
    assert.equal(order.stop.aborted, true);
    assert.equal(tracks.deadThrough("s"), undefined, "forgotten after the linger");
    assert.equal(tracks.size, 0);
  });

  void test("a watch opened ahead reads first and lingers from then", () => {
    const tracks = new Tracks();
    const ahead = tracks.openWatch("s");
    assert.ok(ahead.order, "a watch");
    assert.deepEqual([ahead.order.afterRevision, ahead.order.expectStarted], [undefined, undefined], "read first, no proof");
    assert.ok(ahead.idle, "nothing registered: it lingers from now");
    assert.equal(tracks.size, 1, "tracked without a handle");
    const again = tracks.openWatch("s");
    assert.equal(again.order, undefined, "already open");
    assert.ok(again.idle, "the linger begins again");
    const ref = tracks.track("s");
    const response = new Liveness(3n);
    assert.deepEqual(tracks.register(ref, response, 1n, true), { order: undefined, idle: undefined }, "the first Start reuses it");
    tracks.lingerOver(ahead.idle);
    tracks.lingerOver(again.idle);
    assert.equal(ahead.order.stop.aborted, false, "stale lingers close nothing");
    assert.equal(tracks.openWatch("s").idle, undefined, "a response is live: no linger");
    ref.release();
    response.stop("finished");
    const notice = tracks.unregister(ref, response);
    assert.ok(notice);
    tracks.lingerOver(notice);
    assert.equal(ahead.order.stop.aborted, true);
    assert.equal(tracks.size, 0, "no handle holds it: forgotten");
  });

  void test("a read judges every Start it reached, whenever that Start registered", () => {
    const tracks = new Tracks();
    const { order } = tracks.openWatch("s");
    assert.ok(order);
    const ref = tracks.track("s");
    const ticket = tracks.ticket();
    // Answered after the read was sent, registered before its answer: the ticket cannot judge it, its revision can.
    const answeredLate = new Liveness(4n);
    tracks.register(ref, answeredLate, 4n, true);
    const notice = tracks.applyState("s", sessionState("s", pb.Phase.PHASE_IDLE, 0n, 5n), ticket);
    assert.equal(answeredLate.reason, "gone", "the read saw its Start and no live response");
    assert.ok(notice, "it left the session idle with its watch open");
    // Registered after the read was applied, with a revision the read reached: the kept read judged it.
    const afterTheRead = new Liveness(5n);
    const refused = tracks.register(ref, afterTheRead, 5n, true);
    assert.equal(afterTheRead.reason, "gone");
    assert.equal(refused.order, undefined);
    // A Start past the read is the watch's to judge.
    const past = new Liveness(6n);
    tracks.register(ref, past, 6n, true);
    assert.equal(past.isCurrent(), true);
  });

  void test("the response a read found live survives registering after it", () => {
    const tracks = new Tracks();
    tracks.openWatch("s");
    const ref = tracks.track("s");
    tracks.applyState("s", sessionState("s", pb.Phase.PHASE_ACTIVE, 7n, 3n), tracks.ticket());
    const live = new Liveness(7n);
    tracks.register(ref, live, 3n, true);
    assert.equal(live.isCurrent(), true, "the read shows it active");
    const older = new Liveness(6n);
    tracks.register(ref, older, 2n, true);
    assert.equal(older.reason, "superseded", "below the active one");
  });

  void test("a new watch forgets the read of the one before", () => {
    const tracks = new Tracks();
    const ref = tracks.track("s");
    const ahead = tracks.openWatch("s");
    assert.ok(ahead.order && ahead.idle);
    tracks.applyState("s", sessionState("s", pb.Phase.PHASE_IDLE, 0n, 9n), tracks.ticket());
    tracks.lingerOver(ahead.idle);
    assert.equal(ahead.order.stop.aborted, true);
    assert.equal(tracks.size, 1, "held by the handle");
    const response = new Liveness(3n);
    const { order } = tracks.register(ref, response, 2n, true);
    assert.ok(order, "a new watch, with its proof");
    assert.equal(response.isCurrent(), true, "the read died with its watch");
  });

  void test("termination ends the lingering watch and the next Start opens another", () => {
    const tracks = new Tracks();
    const ref = tracks.track("s");
    const response = new Liveness(5n);
    const { order } = tracks.register(ref, response, 1n, true);
    assert.ok(order);
    response.stop("finished");
    assert.ok(tracks.unregister(ref, response), "lingering");
    assert.deepEqual(tracks.apply([event("s", 3n, terminated(pb.CancelReason.CANCEL_REASON_SHUTDOWN))]), [], "over, not idle");
    assert.equal(order.stop.aborted, true, "nothing more comes on it");
    assert.equal(tracks.watched("s"), false);
    const next = tracks.register(ref, new Liveness(9n), 1n, true).order;
    assert.ok(next, "a new watch");
    assert.equal(next.expectStarted, 9n, "with its proof");
  });

  void test("termination forgets a track held only by its watch", () => {
    const tracks = new Tracks();
    const { order } = tracks.openWatch("s");
    assert.ok(order);
    tracks.apply([event("s", 3n, terminated(pb.CancelReason.CANCEL_REASON_EXPIRED))]);
    assert.equal(order.stop.aborted, true);
    assert.equal(tracks.size, 0);
  });

  void test("a terminated read stops everything and ends the watch", () => {
    const tracks = new Tracks();
    const ref = tracks.track("s");
    const response = new Liveness(5n);
    const { order } = tracks.register(ref, response, 4n, true);
    assert.ok(order);
    // Sent before the response registered, and at a revision below its Start: it judges nothing, yet nothing lives on.
    assert.equal(tracks.applyState("s", sessionState("s", pb.Phase.PHASE_TERMINATED, 0n, 2n), 0), undefined);
    assert.equal(response.reason, "shutdown");
    assert.equal(order.stop.aborted, true);
  });

  void test("a supersede stops the old response and not the new one", () => {
    const tracks = new Tracks();
    const ref = tracks.track("s");
    const old = new Liveness(10n);
    tracks.register(ref, old, 1n, true);
    tracks.apply([
      event("s", 1n, started(10n)),
      event("s", 2n, cancelRequested(10n, pb.CancelReason.CANCEL_REASON_SUPERSEDED)),
      event("s", 4n, started(20n)),
    ]);
    assert.equal(old.reason, "superseded");
    assert.equal(old.signal.aborted, true);
    // The new response registers after the watch saw its own start.
    const renewed = new Liveness(20n);
    tracks.register(ref, renewed, 4n, true);
    assert.equal(renewed.isCurrent(), true);
    assert.equal(tracks.deadThrough("s"), 19n);
  });

  void test("a response registered after its stop was seen is stopped at once", () => {
    const tracks = new Tracks();
    const ref = tracks.track("s");
    const other = new Liveness(1n);
    tracks.register(ref, other, 1n, true);
    tracks.apply([event("s", 3n, cancelRequested(30n, pb.CancelReason.CANCEL_REASON_REQUESTED))]);
    const late = new Liveness(30n);
    assert.equal(tracks.register(ref, late, 2n, true).order, undefined);
    assert.equal(late.reason, "cancelled");
  });

  void test("termination stops every response and a reborn session lives", () => {
    const tracks = new Tracks();
    const ref = tracks.track("s");
    const a = new Liveness(5n);
    tracks.register(ref, a, 1n, true);
    tracks.apply([event("s", 2n, terminated(pb.CancelReason.CANCEL_REASON_EXPIRED))]);
    assert.equal(a.reason, "expired");
    assert.equal(tracks.deadThrough("s"), 5n, "raised over the stopped ids, not to the event's seq");
    const reborn = new Liveness(100n);
    tracks.register(ref, reborn, 1n, true);
    assert.equal(reborn.isCurrent(), true);
  });

  void test("untracked sessions are ignored and tracks go with their references", () => {
    const tracks = new Tracks();
    const first = tracks.track("s");
    const second = tracks.track("s");
    tracks.apply([event("other", 3n, started(3n))]);
    assert.equal(tracks.deadThrough("other"), undefined);
    first.release();
    first.release();
    assert.notEqual(tracks.deadThrough("s"), undefined);
    second.release();
    assert.equal(tracks.deadThrough("s"), undefined);
    assert.equal(tracks.size, 0);
  });

  void test("a state read stops what it covered and spares later starts", () => {
    const tracks = new Tracks();
    const ref = tracks.track("s");
    const [old, active] = [new Liveness(5n), new Liveness(6n)];
    tracks.register(ref, old, 1n, true);
    tracks.register(ref, active, 3n, true);
    const ticket = tracks.ticket();
    // Registered while the read was on its way, past its revision: the read cannot judge it.
    const later = new Liveness(9n);
    tracks.register(ref, later, 9n, true);
    tracks.applyState("s", sessionState("s", pb.Phase.PHASE_ACTIVE, 6n, 4n), ticket);
    assert.equal(old.reason, "superseded");
    assert.equal(active.isCurrent(), true, "the active response lives on");
    assert.equal(later.isCurrent(), true);
    tracks.applyState("s", sessionState("s", pb.Phase.PHASE_IDLE, 0n, 8n), ticket);
    assert.equal(active.reason, "gone");
    assert.equal(later.isCurrent(), true, "started after the read was sent, past its revision");
  });

  void test("a session gone or recreated stops the responses the read covered, by ticket only", () => {
    const tracks = new Tracks();
    const ref = tracks.track("s");
    const lost = new Liveness(5n);
    const { order } = tracks.register(ref, lost, 3n, true);
    assert.ok(order, "a watch");
    const ticket = tracks.ticket();
    // Registered after the read was sent: a gone session's revisions judge nothing.
    const renewed = new Liveness(6n);
    tracks.register(ref, renewed, 1n, true);
    assert.equal(tracks.applyGone("s", ticket), undefined, "one still live");
    assert.equal(lost.reason, "gone");
    assert.equal(renewed.isCurrent(), true);
    assert.equal(order.stop.aborted, false);
    const notice = tracks.applyGone("s", tracks.ticket());
    assert.equal(renewed.reason, "gone");
    assert.ok(notice, "idle, the watch lingers");
    tracks.lingerOver(notice);
    assert.equal(order.stop.aborted, true);
    const stillRegistered = new Liveness(7n);
    tracks.register(ref, stillRegistered, 1n, true);
    tracks.applyState("s", sessionState("s", pb.Phase.PHASE_TERMINATED, 0n, 2n), tracks.ticket());
    assert.equal(stillRegistered.reason, "shutdown");
  });

  void test("dead_through only rises: a replayed older event changes nothing", () => {
    const tracks = new Tracks();
    tracks.track("s");
    tracks.apply([event("s", 50n, started(50n))]);
    tracks.apply([event("s", 10n, started(10n))]);
    assert.equal(tracks.deadThrough("s"), 49n);
  });
});

/** A failed call as grpc-js reports it: an Error with a numeric code and details. */
function grpcError(code: number, details: string): Error & { code: number; details: string } {
  return Object.assign(new Error(`${code} ${details}`), { code, details });
}

/** How a scripted stream goes on once its messages are delivered. */
type Then = "hang" | { readonly fail: Error };

class ScriptedStream extends EventEmitter implements WatchStream {
  cancelled = false;

  cancel(): void {
    this.cancelled = true;
  }
}

/**
 * A scripted server: each Watch takes the next stream, each GetState the next
 * answer (a call past the script waits until its signal aborts); every call is
 * recorded.
 */
class Script implements WatchTransport {
  readonly watches: [readonly pb.WatchResponse[], Then][] = [];
  readonly states: (pb.SessionState | Error)[] = [];
  readonly calls: string[] = [];
  /** Set: every GetState answers only once it resolves. */
  hold: Promise<void> | undefined;

  openWatch(_sessionId: string, afterRevision: bigint): WatchStream {
    this.calls.push(`watch ${afterRevision}`);
    const stream = new ScriptedStream();
    const next = this.watches.shift();
    if (next === undefined) return stream;
    const [messages, then] = next;
    void (async () => {
      const steps = [
        () => stream.emit("metadata"),
        ...messages.map((message) => () => stream.emit("data", message)),
        () => {
          if (then !== "hang") stream.emit("error", then.fail);
        },
      ];
      for (const step of steps) {
        await new Promise((r) => setImmediate(r));
        if (stream.cancelled) return;
        step();
      }
    })();
    return stream;
  }

  async getState(_sessionId: string, signal: AbortSignal): Promise<pb.SessionState> {
    this.calls.push("get_state");
    if (this.hold !== undefined) await this.hold;
    const next = this.states.shift();
    if (next instanceof Error) return Promise.reject(next);
    if (next !== undefined) return Promise.resolve(next);
    return new Promise((_, reject) => {
      signal.addEventListener("abort", () => {
        reject(new CancelledError("stopped"));
      });
    });
  }
}

function message(events: pb.LifecycleEvent[]): pb.WatchResponse {
  return { events, progressSeq: 0n };
}

const quick = { ...defaultRetryPolicy, attemptTimeoutMs: 100, initialBackoffMs: 1, maxBackoffMs: 5 };

/**
 * Response 10, whose Start reply carried revision 5, and its session's watch
 * running against `script` (linger 0 unless given: the watch closes with its
 * last response).
 */
function runWatch(
  script: Script,
  lingerMs = 0,
): { response: Liveness; stop: AbortSignal; cells: Cells; done: Promise<void>; close(): Promise<void> } {
  const tracks = new Tracks();
  const linger = new Linger(tracks, lingerMs);
  const ref = tracks.track("s");
  const response = new Liveness(10n);
  const { order } = tracks.register(ref, response, 5n, true);
  assert.ok(order, "the first response opens the watch");
  const cells = newCells();
  const done = new SessionWatch({ transport: script, tracks, linger, retry: quick, cells, order }).run();
  void response.stopped.then(() => {
    linger.begin(tracks.unregister(ref, response));
  });
  return {
    response,
    stop: order.stop,
    cells,
    done,
    close: () => {
      linger.close();
      tracks.releaseAll();
      ref.release();
      return within("the watch ends once its track is gone", done);
    },
  };
}

// The same cases as clients/rust/src/watch.rs's tests, against a scripted server.
void describe("session watch", () => {
  void test("a stop replayed after the proof of the start stops the response", async () => {
    const script = new Script();
    script.watches.push([
      [
        message([event("s", 5n, started(10n))]),
        message([event("s", 6n, cancelRequested(10n, pb.CancelReason.CANCEL_REASON_SUPERSEDED)), event("s", 8n, started(11n))]),
      ],
      "hang",
    ]);
    const running = runWatch(script);
    assert.equal(await within("stopped", running.response.stopped), "superseded");
    assert.equal(running.stop.aborted, true, "nothing live: the watch closed");
    await within("the watch ends", running.done);
    assert.deepEqual(script.calls, ["watch 4"], "replayed from just below the reply");
  });

  void test("a first event that is not the start means a recreated session", async () => {
    const script = new Script();
    script.watches.push([[message([event("s", 5n, started(3n))])], "hang"]);
    // Revision 2: below the watch's position, a new session of that id.
    script.states.push(sessionState("s", pb.Phase.PHASE_ACTIVE, 12n, 2n));
    const running = runWatch(script);
    assert.equal(await within("stopped", running.response.stopped), "gone");
    await running.close();
    assert.deepEqual(script.calls, ["watch 4", "get_state"]);
  });

  void test("a session not found after a break is gone", async () => {
    const script = new Script();
    script.watches.push([[message([event("s", 5n, started(10n))])], { fail: grpcError(GrpcStatus.UNAVAILABLE, "connection reset") }]);
    script.states.push(errorFromStatus({ code: GrpcStatus.NOT_FOUND, details: "no session s" }));
    const running = runWatch(script);
    assert.equal(await within("stopped", running.response.stopped), "gone");
    await running.close();
    assert.deepEqual(script.calls, ["watch 4", "get_state"]);
  });

  void test("a broken stream resumes from the state it read", async () => {
    const script = new Script();
    script.watches.push(
      [[message([event("s", 5n, started(10n))])], { fail: grpcError(GrpcStatus.UNAVAILABLE, "connection reset") }],
      [[message([event("s", 7n, cancelRequested(10n, pb.CancelReason.CANCEL_REASON_REQUESTED))])], "hang"],
    );
    script.states.push(sessionState("s", pb.Phase.PHASE_ACTIVE, 10n, 6n));
    const running = runWatch(script);
    assert.equal(await within("stopped", running.response.stopped), "cancelled");
    await within("the watch ends", running.done);
    assert.deepEqual(script.calls, ["watch 4", "get_state", "watch 6"]);
    const { opened, reconnects, rereads } = running.cells;
    assert.deepEqual([opened, reconnects, rereads], [2, 1, 1]);
  });

  void test("no proof within the attempt timeout is checked by a state read", async () => {
    const script = new Script();
    script.watches.push([[], "hang"], [[], "hang"]);
    script.states.push(sessionState("s", pb.Phase.PHASE_ACTIVE, 10n, 5n));
    const running = runWatch(script);
    await until("a state read and a new stream", () => script.calls.length >= 3);
    assert.deepEqual(script.calls, ["watch 4", "get_state", "watch 5"]);
    assert.equal(running.response.isCurrent(), true, "the state shows it active");
    await running.close();
    assert.equal(running.cells.open, 0);
  });

  void test("a terminated event ends the watch", async () => {
    const script = new Script();
    script.watches.push([
      [message([event("s", 5n, started(10n)), event("s", 6n, { $case: "terminated", value: { reason: pb.CancelReason.CANCEL_REASON_SHUTDOWN } })])],
      "hang",
    ]);
    const running = runWatch(script);
    assert.equal(await within("stopped", running.response.stopped), "shutdown");
    await within("the watch ends by itself", running.done);
    assert.deepEqual(script.calls, ["watch 4"]);
  });

  void test("a terminated event ends a lingering watch before its linger is over", async () => {
    const script = new Script();
    script.watches.push([
      [
        message([event("s", 5n, started(10n))]),
        message([event("s", 6n, cancelRequested(10n, pb.CancelReason.CANCEL_REASON_REQUESTED))]),
        message([event("s", 7n, terminated(pb.CancelReason.CANCEL_REASON_SHUTDOWN))]),
      ],
      "hang",
    ]);
    const running = runWatch(script, 60_000);
    assert.equal(await within("stopped", running.response.stopped), "cancelled");
    await within("the watch ends by itself, an hour's linger notwithstanding", running.done);
    assert.equal(running.stop.aborted, true);
    assert.deepEqual(script.calls, ["watch 4"]);
    await running.close();
  });

  void test("a watch opened ahead of a session that does not exist watches from 0, and the first Start reuses it", async () => {
    const script = new Script();
    script.states.push(errorFromStatus({ code: GrpcStatus.NOT_FOUND, details: "no session s" }));
    let answer!: () => void;
    script.hold = new Promise((resolve) => {
      answer = resolve;
    });
    script.watches.push([
      [message([event("s", 1n, started(3n)), event("s", 2n, cancelRequested(3n, pb.CancelReason.CANCEL_REASON_REQUESTED))])],
      "hang",
    ]);
    const tracks = new Tracks();
    const linger = new Linger(tracks, 0);
    const ahead = tracks.openWatch("s");
    assert.ok(ahead.order);
    assert.equal(ahead.order.afterRevision, undefined, "read first");
    const cells = newCells();
    const done = new SessionWatch({ transport: script, tracks, linger, retry: quick, cells, order: ahead.order }).run();
    assert.deepEqual(script.calls, ["get_state"], "the state is read before any stream");
    // The session's first Start, answered while the read is on its way.
    const ref = tracks.track("s");
    const response = new Liveness(3n);
    assert.deepEqual(tracks.register(ref, response, 1n, true), { order: undefined, idle: undefined }, "no Watch call of its own");
    answer();
    assert.equal(await within("the stop reaches the response", response.stopped), "cancelled");
    assert.deepEqual(script.calls, ["get_state", "watch 0"], "NOT_FOUND: from the session's first event, no proof asked");
    assert.equal(response.reason, "cancelled", "not judged gone: it registered after the read was sent");
    linger.begin(tracks.unregister(ref, response));
    ref.release();
    await within("the watch closes with linger 0", done);
    assert.equal(tracks.size, 0);
    assert.deepEqual([cells.opened, cells.rereads, cells.reconnects], [1, 1, 0]);
  });

  void test("a watch opened ahead reads the state, applies it, and watches from its revision", async () => {
    const script = new Script();
    script.states.push(sessionState("s", pb.Phase.PHASE_ACTIVE, 2n, 4n));
    script.watches.push([[message([event("s", 5n, cancelRequested(2n, pb.CancelReason.CANCEL_REASON_REQUESTED))])], "hang"]);
    const tracks = new Tracks();
    const ahead = tracks.openWatch("s");
    assert.ok(ahead.order && ahead.idle);
    const done = new SessionWatch({
      transport: script,
      tracks,
      linger: new Linger(tracks, 60_000),
      retry: quick,
      cells: newCells(),
      order: ahead.order,
    }).run();
    await until("the event is applied", () => tracks.deadThrough("s") === 2n);
    assert.deepEqual(script.calls, ["get_state", "watch 4"], "from the state's revision; a first event that is no start is fine");
    // The response the read found active registers late (its Start reply lost in the wire): judged live by the read, stopped by the event.
    const ref = tracks.track("s");
    const late = new Liveness(2n);
    tracks.register(ref, late, 3n, false);
    assert.equal(late.reason, "cancelled");
    ref.release();
    tracks.lingerOver(ahead.idle);
    assert.equal(ahead.order.stop.aborted, false, "stale: the registration moved the generation");
    const again = tracks.openWatch("s");
    assert.ok(again.idle);
    tracks.lingerOver(again.idle);
    await within("the watch ends once its linger is over", done);
    assert.equal(tracks.size, 0);
  });
});

void describe("watch pool", () => {
  void test("a connection is added when every one carries its limit of streams; the last stop closes each watch", async () => {
    const script = new Script();
    let connections = 0;
    const tracks = new Tracks();
    const watches = new Watches(
      () => {
        connections += 1;
        return { transport: script, close: () => undefined };
      },
      tracks,
      quick,
      { lingerMs: 0, streamsPerConnection: 2 },
    );
    assert.deepEqual(watches.status(), { open: 0, opened: 0, reconnects: 0, rereads: 0, connections: 0 });
    const held = ["a", "b", "c", "d", "e"].map((session, i) => ({ ref: tracks.track(session), response: new Liveness(BigInt(i + 1)) }));
    for (const { ref, response } of held) {
      const { order } = tracks.register(ref, response, 1n, true);
      assert.ok(order);
      watches.open(order);
    }
    assert.equal(watches.status().open, 5);
    assert.equal(watches.status().connections, 3, "2 + 2 + 1 streams");
    assert.equal(connections, 3);
    for (const { ref, response } of held) {
      response.stop("finished");
      watches.linger.begin(tracks.unregister(ref, response));
      ref.release();
    }
    await within("every watch ends", watches.done());
    assert.equal(watches.status().open, 0);
    const again = tracks.track("f");
    const last = new Liveness(9n);
    const { order } = tracks.register(again, last, 1n, true);
    assert.ok(order);
    watches.open(order);
    assert.equal(connections, 3, "a freed slot is reused");
    last.stop("released");
    watches.linger.begin(tracks.unregister(again, last));
    again.release();
    await within("the last watch ends", watches.done());
    assert.equal(tracks.size, 0);
  });

  void test("a watch lingers after its last response; a Start inside the linger reuses it; then it closes", async () => {
    const script = new Script();
    script.watches.push([[message([event("s", 1n, started(1n))])], "hang"]);
    const tracks = new Tracks();
    const watches = new Watches(() => ({ transport: script, close: () => undefined }), tracks, quick, { lingerMs: 200 });
    const ref = tracks.track("s");
    const first = new Liveness(1n);
    watches.carryOut(tracks.register(ref, first, 1n, true));
    await until("the stream is open", () => watches.status().opened === 1);
    first.stop("finished");
    watches.linger.begin(tracks.unregister(ref, first));
    assert.equal(watches.status().open, 1, "lingering");
    const second = new Liveness(2n);
    watches.carryOut(tracks.register(ref, second, 3n, true));
    second.stop("finished");
    watches.linger.begin(tracks.unregister(ref, second));
    ref.release();
    assert.deepEqual([watches.status().open, script.calls], [1, ["watch 0"]], "one Watch call for both");
    await within("the linger closes the watch", watches.done());
    assert.equal(watches.status().open, 0);
    assert.equal(tracks.size, 0, "and forgets the track no handle holds");
  });

  void test("closing ends a watch opened ahead before its linger is over", async () => {
    const script = new Script();
    script.watches.push([[], "hang"]);
    const tracks = new Tracks();
    const watches = new Watches(() => ({ transport: script, close: () => undefined }), tracks, quick, { lingerMs: 60_000 });
    watches.carryOut(tracks.openWatch("s"));
    assert.equal(watches.status().open, 1);
    watches.close();
    tracks.releaseAll();
    await within("the watch ends", watches.done());
    assert.equal(tracks.size, 0);
  });
});

void describe("error mapping", () => {
  void test("each code maps to its class under the root, keeping the cause", () => {
    const cases: [number, new (...args: never[]) => RespcoordError][] = [
      [GrpcStatus.NOT_FOUND, NotFoundError],
      [GrpcStatus.FAILED_PRECONDITION, SessionTerminatedError],
      [GrpcStatus.UNAUTHENTICATED, UnauthenticatedError],
      [GrpcStatus.UNAVAILABLE, UnavailableError],
      [GrpcStatus.CANCELLED, CancelledError],
      [GrpcStatus.INTERNAL, InternalError],
    ];
    for (const [code, ErrorClass] of cases) {
      const status = { code, details: "why" };
      const error = errorFromStatus(status);
      assert.ok(error instanceof ErrorClass, `${code} -> ${error.name}`);
      assert.ok(error instanceof RespcoordError);
      assert.equal(error.cause, status);
    }
  });

  void test("INVALID_ARGUMENT names the field from the server's message", () => {
    const error = errorFromStatus({ code: GrpcStatus.INVALID_ARGUMENT, details: "session_id: must not be empty" });
    assert.ok(error instanceof InvalidArgumentError);
    assert.equal(error.field, "session_id");
    assert.equal(error.reason, "must not be empty");
    assert.equal(error.code, "INVALID_ARGUMENT");
  });
});

/** A failed attempt as grpc-js rejects it: an Error with a numeric code. */
function status(code: number): Error & { code: number } {
  return Object.assign(new Error(`status ${code}`), { code });
}

void describe("retries", () => {
  void test("backoff doubles with jitter up to the cap", () => {
    const policy = { ...defaultRetryPolicy, initialBackoffMs: 100, maxBackoffMs: 800 };
    for (let i = 0; i < 100; i += 1) {
      const first = backoffMs(policy, 1);
      assert.ok(first >= 50 && first <= 100);
      const third = backoffMs(policy, 3);
      assert.ok(third >= 200 && third <= 400);
      const late = backoffMs(policy, 30);
      assert.ok(late >= 400 && late <= 800);
    }
  });

  void test("transport failures are retried, final answers are not", async () => {
    let calls = 0;
    const { value, attempts } = await withRetry(defaultRetryPolicy, () => {
      calls += 1;
      return calls < 3 ? Promise.reject(status(GrpcStatus.UNAVAILABLE)) : Promise.resolve(calls);
    });
    assert.deepEqual([value, attempts], [3, 3]);
    calls = 0;
    await assert.rejects(
      withRetry(defaultRetryPolicy, () => {
        calls += 1;
        return Promise.reject(status(GrpcStatus.NOT_FOUND));
      }),
      NotFoundError,
    );
    assert.equal(calls, 1);
  });

  void test("the deadline bounds all attempts", async () => {
    const policy = { ...defaultRetryPolicy, deadlineMs: 300 };
    const began = Date.now();
    await assert.rejects(withRetry(policy, () => Promise.reject(status(GrpcStatus.UNAVAILABLE))), UnavailableError);
    assert.ok(Date.now() - began < 5_000, "ended (generous bound: did it end at all)");
  });

  void test("a backoff that overruns the deadline rejects with the last real failure, making no attempt without time", async () => {
    mock.timers.enable({ apis: ["setTimeout", "Date"], now: 1_000_000 });
    try {
      let calls = 0;
      const policy = { ...defaultRetryPolicy, deadlineMs: 500, initialBackoffMs: 10, maxBackoffMs: 10 };
      const pending = withRetry(policy, () => {
        calls += 1;
        return Promise.reject(status(GrpcStatus.UNAVAILABLE));
      });
      // Let the first attempt fail and the backoff's timer be set, then wake it late.
      for (let i = 0; i < 10; i++) await Promise.resolve();
      mock.timers.tick(2_000);
      await assert.rejects(pending, UnavailableError);
      assert.equal(calls, 1);
    } finally {
      mock.timers.reset();
    }
  });

  void test("an already-aborted signal makes no attempt; an abort during backoff ends the call", async () => {
    let calls = 0;
    const reason = new Error("caller gave up");
    await assert.rejects(
      withRetry(defaultRetryPolicy, () => {
        calls += 1;
        return Promise.resolve(1);
      }, AbortSignal.abort(reason)),
      (error: unknown) => error instanceof CancelledError && error.cause === reason,
    );
    assert.equal(calls, 0);
    const controller = new AbortController();
    const pending = withRetry({ ...defaultRetryPolicy, deadlineMs: 120_000, initialBackoffMs: 60_000, maxBackoffMs: 60_000 }, () =>
      Promise.reject(status(GrpcStatus.UNAVAILABLE)),
    controller.signal);
    setTimeout(() => {
      controller.abort();
    }, 20);
    await assert.rejects(within("the abort ends the call", pending), CancelledError);
  });
});

void describe("the client against the fixture", () => {
  void test("malformed ids are refused naming the field, before anything is sent", async () => {
    const server = await Fixture.start();
    const client = await Client.connect(server.addresses.grpc);
    try {
      for (const bad of ["", "x".repeat(257), "a\u0007b"]) {
        assert.throws(() => client.session(bad), (e: unknown) => e instanceof InvalidArgumentError && e.field === "session_id");
      }
      const session = client.session("ids");
      await assert.rejects(session.start("client", { requestId: "r".repeat(129) }), (e: unknown) => e instanceof InvalidArgumentError && e.field === "request_id");
      await assert.rejects(session.start("bogus" as "client"), (e: unknown) => e instanceof InvalidArgumentError && e.field === "source");
      assert.equal(await server.starts(), 0);
    } finally {
      client.close();
      await server.stop();
    }
  });

  void test("already-aborted and mid-call aborts reject with CancelledError; a second finish is refused", async () => {
    const server = await Fixture.start();
    const client = await Client.connect(server.addresses.grpc);
    try {
      const session = client.session("signals");
      const reason = new Error("gone away");
      const aborted = AbortSignal.abort(reason);
      const isCancelled = (e: unknown): boolean => e instanceof CancelledError && e.cause === reason;
      await assert.rejects(session.start("client", { signal: aborted }), isCancelled);
      await assert.rejects(session.state({ signal: aborted }), isCancelled);
      await assert.rejects(session.cancel({ signal: aborted }), isCancelled);
      await assert.rejects(session.shutdown({ signal: aborted }), isCancelled);
      await assert.rejects(session.run("client", () => 1, { signal: aborted }), isCancelled);
      assert.equal(await server.starts(), 0, "nothing was sent");

      // Aborted while the body runs: the response is released, nothing is sent.
      const controller = new AbortController();
      let bodySignal: AbortSignal | undefined;
      const run = session.run("client", async (ctx) => {
        bodySignal = ctx.signal;
        controller.abort(reason);
        await ctx.stopped();
      }, { signal: controller.signal });
      await assert.rejects(run, isCancelled);
      assert.equal(bodySignal?.aborted, true);
      const live = await session.state();
      assert.ok(live.responseId !== undefined);
      assert.equal(await server.finishes(live.responseId), 0);

      const response = await session.start("client");
      assert.equal(typeof response.id, "bigint");
      assert.equal((await session.state()).responseId, response.id, "the id round-trips as a bigint");
      assert.equal((await response.finish("completed")).kind, "applied");
      await assert.rejects(response.finish("completed"), AlreadyFinishedError);
      assert.equal(await server.finishes(response.id), 1);
    } finally {
      client.close();
      await server.stop();
    }
  });

  void test("a Start aborted while retrying against a down coordinator ends promptly", async () => {
    const port = await freePort();
    const client = await Client.connect(`127.0.0.1:${port}`, { lazy: true, retry: { deadlineMs: 60_000 } });
    try {
      const controller = new AbortController();
      const start = client.session("down").start("client", { signal: controller.signal });
      setTimeout(() => {
        controller.abort();
      }, 100);
      await assert.rejects(within("the abort ends the Start", start), CancelledError);
    } finally {
      client.close();
    }
  });

  void test("closing the client fails every fence closed", async () => {
    const server = await Fixture.start();
    const client = await Client.connect(server.addresses.grpc);
    try {
      const response = await client.session("close").start("client");
      const fence = response.fence();
      await client[Symbol.asyncDispose]();
      assert.equal(fence.isCurrent(), false);
      assert.equal(await response.stopped(), "released");
      assert.throws(() => client.session("close"), RespcoordError);
    } finally {
      await server.stop();
    }
  });

  void test("connect fails fast with UnavailableError when nothing listens", async () => {
    const port = await freePort();
    await assert.rejects(Client.connect(`127.0.0.1:${port}`, { connectTimeoutMs: 300 }), UnavailableError);
  });

  void test("the package's exports map resolves to the built dist", () => {
    assert.equal(typeof pkg.Client.connect, "function");
    assert.ok(new pkg.NotFoundError("x") instanceof pkg.RespcoordError);
    assert.equal(pkg.StopReason.Superseded, "superseded");
  });
});
