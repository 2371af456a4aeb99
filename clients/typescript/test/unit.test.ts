// Unit tests: the fencing table, the error mapping, retries, validation, and
// the signal-taking calls (already aborted, aborted mid-call) on a real server.
import assert from "node:assert/strict";
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
import { Liveness, Tracks } from "../src/watcher.js";
import { Fixture, freePort, within } from "./harness.js";

function event(sessionId: string, seq: bigint, kind: pb.LifecycleEvent["kind"]): pb.LifecycleEvent {
  return { sessionId, revision: 0n, seq, unixNanos: 0n, kind };
}
const started = (id: bigint): pb.LifecycleEvent["kind"] => ({
  $case: "started",
  value: { responseId: id, source: pb.Source.SOURCE_CLIENT },
});
const cancelRequested = (id: bigint, reason: pb.CancelReason): pb.LifecycleEvent["kind"] => ({
  $case: "cancelRequested",
  value: { responseId: id, reason },
});

void describe("fencing table", () => {
  void test("a supersede stops the old response and not the new one", () => {
    const tracks = new Tracks();
    const ref = tracks.track("s");
    const old = new Liveness(10n);
    tracks.register(ref, old);
    tracks.apply([
      event("s", 10n, started(10n)),
      event("s", 20n, cancelRequested(10n, pb.CancelReason.CANCEL_REASON_SUPERSEDED)),
      event("s", 22n, started(20n)),
    ]);
    assert.equal(old.reason, "superseded");
    assert.equal(old.signal.aborted, true);
    const renewed = new Liveness(20n);
    tracks.register(ref, renewed);
    assert.equal(renewed.isCurrent(), true);
    assert.equal(tracks.deadThrough("s"), 19n);
  });

  void test("a response registered after its stop was seen is stopped at once", () => {
    const tracks = new Tracks();
    const ref = tracks.track("s");
    tracks.apply([event("s", 31n, cancelRequested(30n, pb.CancelReason.CANCEL_REASON_REQUESTED))]);
    const late = new Liveness(30n);
    tracks.register(ref, late);
    assert.equal(late.reason, "cancelled");
  });

  void test("dead_through only rises: a replayed older event changes nothing", () => {
    const tracks = new Tracks();
    tracks.track("s");
    tracks.apply([event("s", 50n, started(50n))]);
    tracks.apply([event("s", 10n, started(10n))]);
    assert.equal(tracks.deadThrough("s"), 49n);
  });

  void test("termination is fenced at its seq, so a reborn session lives", () => {
    const tracks = new Tracks();
    const ref = tracks.track("s");
    const a = new Liveness(5n);
    tracks.register(ref, a);
    tracks.apply([event("s", 8n, { $case: "terminated", value: { reason: pb.CancelReason.CANCEL_REASON_EXPIRED } })]);
    assert.equal(a.reason, "expired");
    const reborn = new Liveness(100n);
    tracks.register(ref, reborn);
    assert.equal(reborn.isCurrent(), true);
  });

  void test("untracked sessions are ignored; a track goes with its last reference", () => {
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

  void test("a re-list raises from listed states and from absence", () => {
    const tracks = new Tracks();
    const [a, b, c] = [tracks.track("a"), tracks.track("b"), tracks.track("c")];
    const [ra, rb, rc] = [new Liveness(5n), new Liveness(6n), new Liveness(7n)];
    tracks.register(a, ra);
    tracks.register(b, rb);
    tracks.register(c, rc);
    const epoch = tracks.beginRelist();
    const d = tracks.track("d");
    const rd = new Liveness(8n);
    tracks.register(d, rd);
    const active = (sessionId: string, id: bigint): pb.SessionState => ({
      ...pb.SessionState.create(),
      sessionId,
      phase: pb.Phase.PHASE_ACTIVE,
      activeResponseId: id,
    });
    const seen = new Set<string>();
    tracks.applyListed(50n, [active("a", 5n), active("b", 40n)], seen);
    tracks.applyAbsent(epoch, 50n, seen);
    assert.equal(ra.isCurrent(), true, "still the active response");
    assert.equal(rb.reason, "superseded");
    assert.equal(rc.reason, "gone", "absent: gone");
    assert.equal(rd.isCurrent(), true, "tracked during the listing: not judged by it");
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
