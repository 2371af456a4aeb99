// The shared client scenarios (clients/scenarios/scenarios.json), each
// implemented under its id with its params read from the file, against the
// real servers on loopback.
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { describe, test } from "node:test";

import { credentials, status as GrpcStatus, type ServiceError } from "@grpc/grpc-js";

import {
  Client,
  PermissionDeniedError,
  SessionTerminatedError,
  UnauthenticatedError,
  UnavailableError,
  type Fence,
  type Response as Started,
  type RunOutcome,
} from "../src/index.js";
import * as pb from "../src/gen/respcoord/v1/coordinator.js";
import {
  Binary,
  Fixture,
  freePort,
  loadScenarios,
  numberParam,
  percentile,
  Rng,
  sleepMicros,
  stringParam,
  until,
  within,
  type Scenario,
} from "./harness.js";

interface Deferred<T> {
  readonly promise: Promise<T>;
  resolve(value: T): void;
}

function deferred<T>(): Deferred<T> {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

/** A body that never ends by itself: it hands out its fence and waits for the stop. */
function endless(fence: Deferred<Fence>) {
  return async (ctx: { fence(): Fence; stopped(): Promise<unknown> }): Promise<void> => {
    fence.resolve(ctx.fence());
    await ctx.stopped();
  };
}

/** Closes every client and server a scenario made, whatever happened. */
class Scope {
  readonly #clients: Client[] = [];
  readonly #cleanups: (() => Promise<void>)[] = [];

  async client(target: string, options: Parameters<typeof Client.connect>[1] = {}): Promise<Client> {
    const client = await Client.connect(target, options);
    this.#clients.push(client);
    return client;
  }

  adopt(client: Client): Client {
    this.#clients.push(client);
    return client;
  }

  defer(cleanup: () => Promise<void>): void {
    this.#cleanups.push(cleanup);
  }

  async close(): Promise<void> {
    for (const client of this.#clients) client.close();
    for (const cleanup of this.#cleanups.reverse()) await cleanup();
  }
}

async function scoped(body: (scope: Scope) => Promise<void>): Promise<void> {
  const scope = new Scope();
  try {
    await body(scope);
  } finally {
    await scope.close();
  }
}

async function fixture(scope: Scope, args: readonly string[] = []): Promise<Fixture> {
  const server = await Fixture.start(args);
  scope.defer(() => server.stop());
  return server;
}

async function binary(scope: Scope, port: number, args: readonly string[] = []): Promise<Binary> {
  const server = await Binary.start(port, args);
  scope.defer(() => server.kill());
  return server;
}

/** A's options for a scenario whose session watches linger for its `linger_ms`. */
function lingering(scenario: Scenario): { watchLingerMs: number } {
  return { watchLingerMs: numberParam(scenario, "linger_ms") };
}

const ms = (v: number): string => `${v.toFixed(2)} ms`;

/** p50, p99 and max of some latencies in milliseconds (sorts them). */
function summary(millis: number[]): string {
  millis.sort((x, y) => x - y);
  return `p50 ${ms(percentile(millis, 50))}, p99 ${ms(percentile(millis, 99))}, max ${ms(millis.at(-1) ?? Number.NaN)}`;
}

type Implementation = (scenario: Scenario) => Promise<void>;

const implementations: Record<string, Implementation> = {
  superseded_by_another_gateway: () =>
    scoped(async (scope) => {
      const server = await fixture(scope);
      const a = await scope.client(server.addresses.grpc);
      const b = await scope.client(server.addresses.grpc);
      const fence = deferred<Fence>();
      const run = a.session("superseded").run("client", endless(fence));
      const aFence = await within("A's body starts", fence.promise);
      const bResponse = await b.session("superseded").start("vad");
      assert.equal(bResponse.superseded, aFence.id, "B's Start reports A's response as superseded");
      const outcome = await within("A's run returns", run);
      assert.deepEqual(outcome, { kind: "stopped", responseId: aFence.id, reason: "superseded" });
      assert.equal(await server.finishes(aFence.id), 0, "no Finish for A's response");
      assert.equal(aFence.isCurrent(), false);
      assert.equal(aFence.stopReason(), "superseded");
      assert.equal(bResponse.isCurrent(), true, "B's response is still current");
      const cancelled = await a.session("superseded").cancel();
      assert.equal(cancelled, bResponse.id, "A's Cancel returns B's response id");
      assert.equal(await within("B's response stops", bResponse.stopped()), "cancelled");
      assert.equal(bResponse.isCurrent(), false);
    }),

  cancelled_and_shut_down_by_another_gateway: () =>
    scoped(async (scope) => {
      const server = await fixture(scope);
      const a = await scope.client(server.addresses.grpc);
      const b = await scope.client(server.addresses.grpc);
      const first = await a.session("teardown").start("client");
      assert.equal(await b.session("teardown").cancel(), first.id, "B's Cancel returns A's response id");
      assert.equal(await within("the cancel reaches A", first.stopped()), "cancelled");
      assert.deepEqual(await first.finish("completed"), { kind: "not_sent", reason: "cancelled" });
      assert.equal(await server.finishes(first.id), 0);
      const second = await a.session("teardown").start("client");
      assert.equal(await b.session("teardown").shutdown(), second.id, "B's Shutdown returns the second id");
      assert.equal(await within("the shutdown reaches A", second.stopped()), "shutdown");
      await assert.rejects(a.session("teardown").start("client"), (error: unknown) => {
        assert.ok(error instanceof SessionTerminatedError);
        assert.equal(error.code, "FAILED_PRECONDITION");
        return true;
      });
      const quick = await a.session("teardown-2").run("client", () => "done");
      assert.ok(quick.kind === "completed", `quick run: ${quick.kind}`);
      assert.equal(quick.finished.kind, "applied");
      const state = await a.session("teardown-2").state();
      assert.equal(state.phase, "idle");
      assert.equal(state.revision, 2n);
    }),

  finish_vs_cancel_race: (scenario) =>
    scoped(async (scope) => {
      const rounds = numberParam(scenario, "rounds");
      const maxDelay = numberParam(scenario, "max_delay_micros");
      const server = await fixture(scope);
      const a = await scope.client(server.addresses.grpc);
      const b = await scope.client(server.addresses.grpc);
      // The recording: a raw watch-all positioned before the first round.
      const raw = new pb.ResponseCoordinatorClient(server.addresses.grpc, credentials.createInsecure());
      scope.defer(() => {
        raw.close();
        return Promise.resolve();
      });
      const listed = await new Promise<pb.ListSessionsResponse>((resolve, reject) => {
        raw.listSessions({ pageSize: 1, pageToken: "" }, (error, reply) => {
          if (error) reject(error);
          else resolve(reply);
        });
      });
      const started = new Map<bigint, number>();
      const ended = new Map<bigint, number>();
      let endedTotal = 0;
      const allEnded = deferred<undefined>();
      const stream = raw.watch({ sessionId: "", afterSeq: listed.seq, afterRevision: undefined });
      stream.on("data", (message: pb.WatchResponse) => {
        for (const event of message.events) {
          if (!event.sessionId.startsWith("race-")) continue;
          if (event.kind?.$case === "started") {
            started.set(event.kind.value.responseId, (started.get(event.kind.value.responseId) ?? 0) + 1);
          } else if (event.kind?.$case === "ended") {
            ended.set(event.kind.value.responseId, (ended.get(event.kind.value.responseId) ?? 0) + 1);
            endedTotal += 1;
            if (endedTotal === rounds) allEnded.resolve(undefined);
          }
        }
      });
      stream.on("error", (error: ServiceError) => {
        if ((error.code as number) !== (GrpcStatus.CANCELLED as number)) allEnded.resolve(undefined);
      });
      scope.defer(() => {
        stream.cancel();
        return Promise.resolve();
      });
      const rng = new Rng(0x5eed);
      const tally = { applied: 0, stale: 0, notSent: 0, stopped: 0 };
      for (let round = 0; round < rounds; round += 1) {
        const session = `race-${round}`;
        const bodyDelay = rng.below(maxDelay);
        const cancelDelay = rng.below(maxDelay);
        const id = deferred<bigint>();
        const run = a.session(session).run("client", async (ctx) => {
          id.resolve(ctx.responseId);
          await sleepMicros(bodyDelay);
          return round;
        });
        const responseId = await within("A's response starts", id.promise);
        await sleepMicros(cancelDelay);
        await b.session(session).cancel({ ifResponseId: responseId });
        const outcome: RunOutcome<number> = await within("A's run returns", run);
        const finishes = await server.finishes(responseId);
        if (outcome.kind === "completed" && (outcome.finished.kind === "applied" || outcome.finished.kind === "stale")) {
          tally[outcome.finished.kind] += 1;
          assert.equal(finishes, 1, `round ${round}: ${outcome.finished.kind} means exactly 1 Finish`);
        } else if (outcome.kind === "completed" && outcome.finished.kind === "not_sent") {
          tally.notSent += 1;
          assert.equal(finishes, 0, `round ${round}: not_sent means no Finish`);
        } else if (outcome.kind === "stopped") {
          tally.stopped += 1;
          assert.equal(finishes, 0, `round ${round}: stopped means no Finish`);
        } else {
          assert.fail(`round ${round}: unexpected outcome ${JSON.stringify(outcome, (_, v: unknown) => (typeof v === "bigint" ? v.toString() : v))}`);
        }
      }
      await within("every response's end is recorded", allEnded.promise);
      assert.equal(started.size, rounds, "one started event per round");
      assert.equal(endedTotal, rounds, "one ended event per round");
      for (const [id, count] of started) {
        assert.equal(count, 1);
        assert.equal(ended.get(id), 1, `exactly one ended event for ${id}`);
      }
      console.log(`finish vs cancel race (typescript, ${rounds} rounds): ${JSON.stringify(tally)}`);
    }),

  lost_start_reply_is_replayed: () =>
    scoped(async (scope) => {
      const server = await fixture(scope);
      const a = await scope.client(server.addresses.grpc);
      const session = a.session("lost-reply");
      await server.loseNextStartReply();
      const before = await server.starts();
      const first = await session.start("client");
      assert.equal((await server.starts()) - before, 2, "the first call reached the server twice");
      assert.equal(first.replayed, true);
      assert.equal(first.isCurrent(), true);
      const state = await session.state();
      assert.equal(state.responsesStarted, 1n);
      assert.equal(state.responseId, first.id);
      const turn = await session.start("client", { requestId: "turn-7" });
      assert.equal(turn.superseded, first.id, "the first turn-7 Start supersedes");
      assert.equal(await within("the first response stops", first.stopped()), "superseded");
      const again = await session.start("client", { requestId: "turn-7" });
      assert.equal(again.replayed, true);
      assert.equal(again.id, turn.id);
      assert.equal(turn.isCurrent(), true);
      assert.equal(again.isCurrent(), true);
      assert.equal((await again.finish("completed")).kind, "applied");
    }),

  coordinator_down_then_back: () =>
    scoped(async (scope) => {
      const port = await freePort();
      const a = await scope.client(`127.0.0.1:${port}`, { lazy: true, retry: { deadlineMs: 20_000 } });
      const start = a.session("down-then-back").start("client");
      await new Promise((r) => setTimeout(r, 300));
      await fixture(scope, ["--listen", `127.0.0.1:${port}`]);
      const response = await within("the Start succeeds", start, 30_000);
      assert.equal(response.isCurrent(), true);
      assert.equal((await a.session("down-then-back").state()).responsesStarted, 1n);
    }),

  watch_broken_and_resumed: (scenario) =>
    scoped(async (scope) => {
      const server = await fixture(scope);
      const a = await scope.client(server.addresses.proxy, lingering(scenario));
      const b = await scope.client(server.addresses.grpc);
      const response = await a.session("broken-watch").start("client");
      await until("A's session watch is open", () => a.watchStatus().opened === 1);
      const before = a.watchStatus();
      assert.equal(before.open, 1, `one session watch: ${JSON.stringify(before)}`);
      // Cut A off; once its watch noticed (a state read is under way or
      // done), supersede its response.
      await server.cut();
      await until("A's watch notices the cut", () => a.watchStatus().rereads > before.rereads);
      const bargeIn = await b.session("broken-watch").start("vad");
      assert.equal(bargeIn.superseded, response.id);
      assert.equal(await within("A learns after resuming", response.stopped()), "superseded");
      const after = a.watchStatus();
      assert.ok(after.rereads >= before.rereads + 1, `rereads ${before.rereads} -> ${after.rereads}`);
      await until("the watch closes with its last response", () => a.watchStatus().open === 0);
    }),

  coordinator_restart_mid_run: () =>
    scoped(async (scope) => {
      const port = await freePort();
      const first = await Binary.start(port);
      const a = await scope.client(`127.0.0.1:${port}`, { retry: { deadlineMs: 20_000 } });
      const fence = deferred<Fence>();
      const run = a.session("restart").run("client", endless(fence));
      const oldFence = await within("A's body starts", fence.promise);
      await first.kill("SIGKILL");
      await binary(scope, port);
      const outcome = await within("A's run returns", run, 30_000);
      assert.deepEqual(outcome, { kind: "stopped", responseId: oldFence.id, reason: "gone" });
      assert.equal(oldFence.isCurrent(), false);
      const status = a.watchStatus();
      assert.ok(status.rereads >= 1, `the watch read the state (NOT_FOUND): ${JSON.stringify(status)}`);
      const renewed = await a.session("restart").start("client");
      assert.ok(renewed.id > oldFence.id, `${renewed.id} > ${oldFence.id}`);
      assert.equal((await a.session("restart").state()).responsesStarted, 1n);
      const b = await scope.client(`127.0.0.1:${port}`);
      await b.session("restart").start("vad");
      assert.equal(await within("a new session watch works after the restart", renewed.stopped()), "superseded");
    }),

  bearer_token_on_every_call: (scenario) =>
    scoped(async (scope) => {
      const token = stringParam(scenario, "token");
      const dir = mkdtempSync(join(tmpdir(), "respcoord-ts-token-"));
      scope.defer(() => {
        rmSync(dir, { recursive: true, force: true });
        return Promise.resolve();
      });
      writeFileSync(join(dir, "tokens"), `${token}\n`);
      const server = await fixture(scope, ["--auth-tokens", join(dir, "tokens")]);
      const anonymous = await scope.client(server.addresses.grpc);
      await assert.rejects(anonymous.getState("token-1"), UnauthenticatedError);
      const a = await scope.client(server.addresses.grpc, { token });
      const b = await scope.client(server.addresses.grpc, { token });
      const response = await a.session("token-1").start("client");
      await b.session("token-1").start("vad");
      assert.equal(await within("A's authorized watch sees the supersede", response.stopped()), "superseded");
    }),

  mutual_tls_with_scoped_token: (scenario) =>
    scoped(async (scope) => {
      const token = stringParam(scenario, "token");
      const scopePrefix = stringParam(scenario, "scope");
      const session = stringParam(scenario, "session");
      const outside = stringParam(scenario, "outside");
      const domain = stringParam(scenario, "domain");
      const dir = mkdtempSync(join(tmpdir(), "respcoord-ts-tls-"));
      scope.defer(() => {
        rmSync(dir, { recursive: true, force: true });
        return Promise.resolve();
      });
      await Fixture.certs(dir);
      writeFileSync(join(dir, "tokens"), `${token} ${scopePrefix}\n`);
      const port = await freePort();
      await binary(scope, port, [
        "--tls-cert",
        join(dir, "server.pem"),
        "--tls-key",
        join(dir, "server-key.pem"),
        "--tls-client-ca",
        join(dir, "client-ca.pem"),
        "--auth-tokens",
        join(dir, "tokens"),
      ]);
      const tls = {
        ca: join(dir, "server-ca.pem"),
        cert: join(dir, "gateway.pem"),
        key: join(dir, "gateway-key.pem"),
        domain,
      };
      const a = await scope.client(`127.0.0.1:${port}`, { tls, token });
      const b = await scope.client(`127.0.0.1:${port}`, { tls, token });
      const response = await a.session(session).start("client");
      await b.session(session).start("vad");
      assert.equal(await within("the supersede arrives over mutual TLS", response.stopped()), "superseded");
      await assert.rejects(a.getState(outside), PermissionDeniedError);
      const noCertificate = await scope.client(`127.0.0.1:${port}`, {
        tls: { ca: tls.ca, domain },
        token,
        lazy: true,
        retry: { deadlineMs: 3_000 },
      });
      await assert.rejects(noCertificate.getState(session), UnavailableError);
    }),

  cancel_propagation_latency: (scenario) =>
    scoped(async (scope) => {
      const rounds = numberParam(scenario, "rounds");
      const warmup = numberParam(scenario, "warmup_rounds");
      const sessions = numberParam(scenario, "sessions");
      const server = await fixture(scope);
      const a = await scope.client(server.addresses.grpc);
      const b = await scope.client(server.addresses.grpc);
      // As a gateway serving these sessions does: their watches open ahead (and linger between rounds).
      for (let i = 0; i < sessions; i += 1) a.session(`latency-${i}`).openWatch();
      await until("A's watches are open", () => a.watchStatus().opened === sessions);
      const millis: number[] = [];
      for (let round = 0; round < warmup + rounds; round += 1) {
        const session = `latency-${round % sessions}`;
        const fence = deferred<Fence>();
        const run = a.session(session).run("client", endless(fence));
        const id = (await within("A's body starts", fence.promise)).id;
        const began = performance.now();
        const call =
          round % 2 === 0
            ? b.session(session).cancel({ ifResponseId: id })
            : b.session(session).start("vad").then((response) => {
                response.release();
                return response.id;
              });
        const outcome = await within("A's run returns", run);
        millis.push(performance.now() - began);
        await call;
        assert.equal(outcome.kind, "stopped", `round ${round}`);
      }
      const status = a.watchStatus();
      assert.equal(status.opened, sessions, `every later round reused its session's watch: ${JSON.stringify(status)}`);
      console.log(
        `cancel propagation (typescript, B's call to A's run returning): first ${rounds} rounds ${summary(millis.slice(0, rounds))}; ` +
          `last ${rounds} of ${warmup + rounds} ${summary(millis.slice(-rounds))}`,
      );
    }),

  session_watch_follows_live_responses: (scenario) =>
    scoped(async (scope) => {
      const server = await fixture(scope);
      const a = await scope.client(server.addresses.grpc, lingering(scenario));
      const b = await scope.client(server.addresses.grpc);
      const [x, y] = [a.session("follow-x"), a.session("follow-y")];
      const status = a.watchStatus();
      assert.deepEqual([status.open, status.opened], [0, 0], `handles alone: ${JSON.stringify(status)}`);
      const onX = await x.start("client");
      assert.equal(a.watchStatus().open, 1);
      const onY = await y.start("client");
      assert.equal(a.watchStatus().open, 2);
      await until("both watches are open", () => a.watchStatus().opened === 2);
      assert.equal((await onX.finish("completed")).kind, "applied");
      await b.session("follow-y").start("vad");
      assert.equal(await within("Y's response is superseded", onY.stopped()), "superseded");
      const lingeringStatus = a.watchStatus();
      assert.deepEqual(
        [lingeringStatus.open, lingeringStatus.opened],
        [2, 2],
        `both watches linger: ${JSON.stringify(lingeringStatus)}`,
      );
      // Traffic on a session A has nothing live in reaches A not at all.
      const z = b.session("follow-z");
      for (let i = 0; i < 5; i += 1) await z.start("vad");
      assert.equal(a.watchStatus().opened, 2, "no watch of Z, nor of everything");
      await until("no watch once the linger is over", () => a.watchStatus().open === 0);
      assert.equal(a.watchStatus().opened, 2, "still 2 opened");
    }),

  watch_lingers_across_responses: (scenario) =>
    scoped(async (scope) => {
      const server = await fixture(scope);
      const a = await scope.client(server.addresses.grpc, lingering(scenario));
      const b = await scope.client(server.addresses.grpc);
      const session = a.session("linger-l");
      const first = await session.start("client");
      await until("the watch is open", () => a.watchStatus().opened === 1);
      assert.equal((await first.finish("completed")).kind, "applied");
      let status = a.watchStatus();
      assert.deepEqual([status.open, status.opened], [1, 1], `after the first Finish: ${JSON.stringify(status)}`);
      const second = await session.start("client");
      status = a.watchStatus();
      assert.deepEqual([status.open, status.opened], [1, 1], `after the second Start, no Watch call: ${JSON.stringify(status)}`);
      await b.session("linger-l").start("vad");
      assert.equal(await within("the second response is superseded", second.stopped()), "superseded");
      status = a.watchStatus();
      assert.deepEqual([status.opened, status.rereads], [1, 0], `one stream carried both: ${JSON.stringify(status)}`);
    }),

  open_watch_before_first_start: (scenario) =>
    scoped(async (scope) => {
      const server = await fixture(scope);
      const a = await scope.client(server.addresses.grpc, lingering(scenario));
      const b = await scope.client(server.addresses.grpc);
      const w = a.session("ahead-w");
      w.openWatch();
      assert.equal(a.watchStatus().open, 1, "right after openWatch");
      await until("W's watch stream is open", () => a.watchStatus().opened === 1);
      const response = await w.start("client");
      assert.equal(a.watchStatus().opened, 1, "the Start needed no Watch call");
      await b.session("ahead-w").start("vad");
      assert.equal(await within("A's response is superseded", response.stopped()), "superseded");
    }),

  stop_right_after_start_reply: (scenario) =>
    scoped(async (scope) => {
      const rounds = numberParam(scenario, "rounds");
      const server = await fixture(scope);
      const a = await scope.client(server.addresses.grpc);
      const b = await scope.client(server.addresses.grpc);
      const run = Date.now().toString(36);
      const ahead: number[] = [];
      const notAhead: number[] = [];
      for (let round = 0; round < rounds; round += 1) {
        const name = `quick-${run}-${round}`;
        const session = a.session(name);
        const openedAhead = round % 2 === 0;
        if (openedAhead) {
          const before = a.watchStatus().opened;
          session.openWatch();
          await until("the watch opened ahead is open", () => a.watchStatus().opened > before);
        }
        const response = await session.start("client");
        const began = performance.now();
        const cancel = b.session(name).cancel({ ifResponseId: response.id });
        const reason = await within("A's response is stopped", response.stopped());
        (openedAhead ? ahead : notAhead).push(performance.now() - began);
        assert.equal(await within("B's cancel returns", cancel), response.id, `round ${round}: B's cancel`);
        assert.equal(reason, "cancelled", `round ${round}`);
      }
      console.log(
        `stop after start (typescript, ${rounds} rounds, B's cancel right after A's Start reply to A's response stopped): ` +
          `watch opened ahead ${summary(ahead)}; not ahead ${summary(notAhead)}`,
      );
    }),

  stop_between_start_reply_and_watch: () =>
    scoped(async (scope) => {
      const server = await fixture(scope);
      const a = await scope.client(server.addresses.grpc);
      const b = await scope.client(server.addresses.grpc);
      await server.holdNextWatch();
      const response = await a.session("between").start("client");
      await until("A's session watch reaches the hold", async () => (await server.heldWatches()) === 1);
      await b.session("between").start("vad");
      await new Promise((r) => setTimeout(r, 50));
      assert.equal(response.isCurrent(), true, "nothing has told A yet");
      await server.releaseWatches();
      assert.equal(await within("the watch replays the supersede", response.stopped()), "superseded");
      assert.equal(a.watchStatus().rereads, 0, "replayed from the Start reply's revision, no state read");
    }),

  hundreds_of_sessions_on_one_client: (scenario) =>
    scoped(async (scope) => {
      const sessions = numberParam(scenario, "sessions");
      const server = await fixture(scope);
      const a = await scope.client(server.addresses.grpc, lingering(scenario));
      const b = await scope.client(server.addresses.grpc);
      const responses: Started[] = [];
      for (let i = 0; i < sessions; i += 1) responses.push(await a.session(`many-${i}`).start("client"));
      assert.equal(a.watchStatus().open, sessions);
      for (let i = 0; i < sessions; i += 1) await b.session(`many-${i}`).start("vad");
      for (const response of responses) {
        assert.equal(await within("every response is superseded", response.stopped()), "superseded");
      }
      await until("no watch once the linger is over", () => a.watchStatus().open === 0);
      const status = a.watchStatus();
      assert.equal(status.connections, 1, `${sessions} streams fit one pooled connection: ${JSON.stringify(status)}`);
    }),
};

const scenarios = loadScenarios();

void describe("shared scenarios", () => {
  void test("every scenario in scenarios.json has an implementation, and nothing else does", () => {
    const ids = scenarios.map((s) => s.id);
    assert.deepEqual(
      ids.filter((id) => !(id in implementations)),
      [],
      "scenarios without a TypeScript implementation",
    );
    assert.deepEqual(
      Object.keys(implementations).filter((id) => !ids.includes(id)),
      [],
      "implementations of scenarios no longer in the file",
    );
  });

  for (const scenario of scenarios) {
    const implementation = implementations[scenario.id];
    void test(`${scenario.id}: ${scenario.title}`, { timeout: 180_000 }, async () => {
      assert.ok(implementation, `no implementation for ${scenario.id}`);
      await implementation(scenario);
    });
  }
});

void describe("who asked for a cancel", () => {
  void test("a Cancel's and a Shutdown's source are on their cancel_requested events", { timeout: 60_000 }, () =>
    scoped(async (scope) => {
      const server = await fixture(scope);
      const client = await scope.client(server.addresses.grpc);
      const session = client.session("who-asked");
      const first = await session.start("client");
      assert.equal(await session.cancel({ source: "vad" }), first.id);
      const second = await session.start("vad");
      assert.equal(await session.shutdown({ source: "client" }), second.id);
      const raw = new pb.ResponseCoordinatorClient(
        server.addresses.grpc.replace(/^https?:\/\//, ""),
        credentials.createInsecure(),
      );
      scope.defer(() => {
        raw.close();
        return Promise.resolve();
      });
      const cancels: [bigint, pb.CancelReason, pb.Source][] = [];
      // The session is torn down: its watch ends after `terminated`.
      const stream = raw.watch({ sessionId: "who-asked", afterRevision: 0n, afterSeq: undefined });
      for await (const reply of stream as AsyncIterable<pb.WatchResponse>) {
        for (const event of reply.events) {
          if (event.kind?.$case === "cancelRequested") {
            const { responseId, reason, source } = event.kind.value;
            cancels.push([responseId, reason, source]);
          }
        }
      }
      assert.deepEqual(cancels, [
        [first.id, pb.CancelReason.CANCEL_REASON_REQUESTED, pb.Source.SOURCE_VAD],
        [second.id, pb.CancelReason.CANCEL_REASON_SHUTDOWN, pb.Source.SOURCE_CLIENT],
      ]);
    }),
  );
});
