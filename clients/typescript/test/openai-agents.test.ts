// respcoord/openai-agents: the real @openai/agents-realtime RealtimeSession on
// the SDK's scripted transport (no network), the gate on the real respcoord
// service (the scenario fixture, which counts Finish calls), a second gate in
// a child process on the same session, and a raw watch-all recording what the
// coordinator saw. Every wait is for a condition; no timing is asserted.
import assert from "node:assert/strict";
import { spawn, type ChildProcessByStdio } from "node:child_process";
import type { Readable, Writable } from "node:stream";
import { createInterface, type Interface } from "node:readline";
import { fileURLToPath } from "node:url";
import { after, before, describe, test } from "node:test";

import { RealtimeAgent, tool, type RealtimeAgentConfiguration } from "@openai/agents-realtime";
import { credentials, status as GrpcStatus, type ClientReadableStream, type ServiceError } from "@grpc/grpc-js";

import * as pb from "../src/gen/respcoord/v1/coordinator.js";
import { Client, type Session } from "../src/index.js";
import { ResponseGate } from "../src/openai-agents.js";
import { agent, type Agent } from "./openai-agents-model.js";
import { Fixture, until, within } from "./harness.js";

/** Every started/ended event of the coordinator, per session. */
class Recording {
  readonly #raw: pb.ResponseCoordinatorClient;
  readonly #stream: ClientReadableStream<pb.WatchResponse>;
  readonly events = new Map<string, pb.LifecycleEvent[]>();
  failed: Error | undefined;

  private constructor(raw: pb.ResponseCoordinatorClient, afterSeq: bigint) {
    this.#raw = raw;
    this.#stream = raw.watch({ sessionId: "", afterSeq, afterRevision: undefined });
    this.#stream.on("data", (message: pb.WatchResponse) => {
      for (const event of message.events) this.events.set(event.sessionId, [...(this.events.get(event.sessionId) ?? []), event]);
    });
    this.#stream.on("error", (error: ServiceError) => {
      if ((error.code as number) !== (GrpcStatus.CANCELLED as number)) this.failed = error;
    });
  }

  static async open(target: string): Promise<Recording> {
    const raw = new pb.ResponseCoordinatorClient(target.replace(/^https?:\/\//, ""), credentials.createInsecure());
    const listed = await new Promise<pb.ListSessionsResponse>((resolve, reject) => {
      raw.listSessions({ pageSize: 1, pageToken: "" }, (error, reply) => {
        if (error) reject(error);
        else resolve(reply);
      });
    });
    return new Recording(raw, listed.seq);
  }

  lifecycle(sessionId: string): { started: Map<bigint, number>; ended: Map<bigint, pb.ResponseEnded[]> } {
    const started = new Map<bigint, number>();
    const ended = new Map<bigint, pb.ResponseEnded[]>();
    for (const event of this.events.get(sessionId) ?? []) {
      if (event.kind?.$case === "started") started.set(event.kind.value.responseId, (started.get(event.kind.value.responseId) ?? 0) + 1);
      else if (event.kind?.$case === "ended") ended.set(event.kind.value.responseId, [...(ended.get(event.kind.value.responseId) ?? []), event.kind.value]);
    }
    return { started, ended };
  }

  /** Waits until `ids` have all ended, then checks exactly one started and one ended event for each response of the session. */
  async oneEndPerStart(sessionId: string, ids: readonly bigint[]): Promise<Map<bigint, pb.ResponseEnded>> {
    await until(`every response of ${sessionId} ended`, () => {
      if (this.failed !== undefined) throw this.failed;
      const { ended } = this.lifecycle(sessionId);
      return ids.every((id) => ended.has(id));
    });
    const { started, ended } = this.lifecycle(sessionId);
    assert.deepEqual([...started.keys()].sort(), [...ids].sort(), `${sessionId}: the responses started`);
    const result = new Map<bigint, pb.ResponseEnded>();
    for (const [id, count] of started) {
      assert.equal(count, 1, `${sessionId}: one started event for ${id}`);
      const ends = ended.get(id) ?? [];
      assert.equal(ends.length, 1, `${sessionId}: exactly one ended event for ${id}`);
      if (ends[0] !== undefined) result.set(id, ends[0]);
    }
    return result;
  }

  close(): void {
    this.#stream.cancel();
    this.#raw.close();
  }
}

/** The second gate, in a child node process (test/openai-agents-peer.ts). */
class Peer {
  readonly #child: ChildProcessByStdio<Writable, Readable, null>;
  readonly #lines: AsyncIterator<string>;
  readonly #rl: Interface;

  private constructor(child: ChildProcessByStdio<Writable, Readable, null>) {
    this.#child = child;
    this.#rl = createInterface({ input: child.stdout });
    this.#lines = this.#rl[Symbol.asyncIterator]();
  }

  static async spawn(target: string, sessionId: string): Promise<Peer> {
    const script = fileURLToPath(new URL("./openai-agents-peer.js", import.meta.url));
    const child = spawn(process.execPath, ["--unhandled-rejections=strict", script, target, sessionId], { stdio: ["pipe", "pipe", "inherit"] });
    const peer = new Peer(child);
    assert.deepEqual(await peer.#next(), { ready: true });
    return peer;
  }

  async #next(): Promise<Record<string, string | number | undefined>> {
    const line = await within("the peer process answers", this.#lines.next());
    if (line.done === true) throw new Error("the peer process exited");
    const reply = JSON.parse(line.value) as Record<string, string | number | undefined>;
    if (reply.error !== undefined) throw new Error(`peer: ${String(reply.error)}`);
    return reply;
  }

  async send(command: Record<string, unknown>): Promise<Record<string, string | number | undefined>> {
    this.#child.stdin.write(`${JSON.stringify(command)}\n`);
    return this.#next();
  }

  async exit(): Promise<number> {
    const exited = new Promise<number | null>((resolve) => this.#child.once("exit", resolve));
    const reply = await this.send({ op: "exit" });
    this.#child.stdin.end();
    assert.equal(await within("the peer exits", exited), 0);
    this.#rl.close();
    return Number(reply.leaks);
  }
}

function id(value: string | number | undefined): bigint {
  assert.equal(typeof value, "string");
  return BigInt(value as string);
}

void describe("respcoord/openai-agents: ResponseGate on a RealtimeSession (scripted model, real service)", () => {
  let server: Fixture | undefined;
  let recording: Recording | undefined;
  let client: Client | undefined;
  let n = 0;
  const opened: Agent[] = [];

  before(async () => {
    server = await Fixture.start();
    recording = await Recording.open(server.addresses.grpc);
    client = await Client.connect(server.addresses.grpc);
  });

  after(async () => {
    for (const a of opened) {
      await a.gate.close();
      a.realtime.close();
    }
    client?.close();
    recording?.close();
    await server?.stop();
  });

  function env(): { server: Fixture; recording: Recording; client: Client } {
    assert.ok(server !== undefined && recording !== undefined && client !== undefined);
    return { server, recording, client };
  }

  async function fresh(
    config: Omit<RealtimeAgentConfiguration, "name" | "instructions"> = {},
  ): Promise<{ sessionId: string; session: Session; a: Agent }> {
    n += 1;
    const sessionId = `agents-${process.pid}-${n}`;
    const session = env().client.session(sessionId);
    const a = await agent(session, "A", config);
    opened.push(a);
    return { sessionId, session, a };
  }

  /** A's model starts `modelId` and streams until the gate has passed some of its audio. */
  async function speaking(a: Agent, modelId: string): Promise<bigint> {
    a.model.begin(modelId);
    await until(`A's ${modelId} plays`, () => {
      a.model.audio(modelId);
      return (a.played.get(modelId) ?? 0) >= 3;
    });
    const responseId = a.gate.responseIdOf(modelId);
    assert.ok(responseId !== undefined);
    return responseId;
  }

  /** The model goes on sending audio of `modelId` until A's gate has seen its stop, then 5 more chunks. */
  async function streamsUntilStopped(a: Agent, modelId: string): Promise<void> {
    await until(`A's gate sees the stop of ${modelId}`, () => {
      a.model.audio(modelId);
      return a.gate.stopRecord(modelId) !== undefined;
    });
    const dropped = a.gate.stats.audioDropped;
    for (let i = 0; i < 5; i++) a.model.audio(modelId);
    assert.equal(a.gate.stats.audioDropped, dropped + 5, "late audio of a stopped response is dropped");
    assert.equal(a.leaks, 0, "no audio of a stopped response reached the application after the stop was seen");
    assert.ok(a.model.cancels.includes(modelId), "the model was interrupted for that response (response.cancel with its id)");
  }

  void test("a response passes in full: one started, one ended, one Finish", async () => {
    const { server, recording } = env();
    const { sessionId, a } = await fresh();
    const responseId = await speaking(a, "r-1");
    const played = a.played.get("r-1") ?? 0;
    a.model.audio("r-1");
    a.model.end("r-1");
    await until("Finish", () => a.gate.stats.responsesFinished === 1);
    const ended = await recording.oneEndPerStart(sessionId, [responseId]);
    assert.equal(ended.get(responseId)?.status, pb.TerminalStatus.TERMINAL_STATUS_COMPLETED);
    assert.equal(await server.finishes(responseId), 1);
    assert.equal(a.played.get("r-1"), played + 1);
    assert.equal(a.gate.stats.audioDropped, 0);
  });

  void test("two gates in two processes: B barges in or answers while A speaks, A's output stops", async () => {
    const { server, recording } = env();
    const { sessionId, a } = await fresh();
    const peer = await Peer.spawn(server.addresses.grpc, sessionId);
    const aIds: bigint[] = [];
    const bIds: bigint[] = [];
    try {
      for (let round = 0; round < 6; round++) {
        const modelId = `a-${round}`;
        const aId = await speaking(a, modelId);
        aIds.push(aId);
        if (round % 2 === 0) {
          const reply = await peer.send({ op: "barge" });
          assert.equal(id(reply.cancelled), aId, "B's barge-in cancelled A's response");
          await streamsUntilStopped(a, modelId);
          assert.equal(a.gate.stopRecord(modelId)?.reason, "cancelled");
        } else {
          const reply = await peer.send({ op: "answer", id: `b-${round}`, chunks: 4 });
          bIds.push(id(reply.responseId));
          assert.equal(reply.played, 4, "B's answer played in full");
          await streamsUntilStopped(a, modelId);
          assert.equal(a.gate.stopRecord(modelId)?.reason, "superseded");
        }
      }
    } finally {
      assert.equal(await peer.exit(), 0, "no audio of a stopped response reached B's application");
    }
    const ended = await recording.oneEndPerStart(sessionId, [...aIds, ...bIds]);
    for (const aId of aIds) {
      assert.equal(ended.get(aId)?.status, pb.TerminalStatus.TERMINAL_STATUS_CANCELLED);
      assert.equal(await server.finishes(aId), 0, "no Finish for A's stopped responses");
    }
    for (const bId of bIds) {
      assert.equal(ended.get(bId)?.status, pb.TerminalStatus.TERMINAL_STATUS_COMPLETED);
      assert.equal(await server.finishes(bId), 1, "one Finish for each of B's responses");
    }
    assert.equal(a.gate.stats.responsesStopped, 6);
    assert.equal(a.gate.stats.responsesFinished, 0);
  });

  void test("another process cancels, then shuts the session down: A stops, a later response is refused and interrupted", async () => {
    const { server, recording } = env();
    const { sessionId, a } = await fresh();
    const peer = await Peer.spawn(server.addresses.grpc, sessionId);
    try {
      const first = await speaking(a, "c-1");
      assert.equal(id((await peer.send({ op: "cancel" })).cancelled), first);
      await streamsUntilStopped(a, "c-1");
      assert.equal(a.gate.stopRecord("c-1")?.reason, "cancelled");
      await recording.oneEndPerStart(sessionId, [first]);

      const second = await speaking(a, "c-2");
      await peer.send({ op: "shutdown" });
      await streamsUntilStopped(a, "c-2");
      assert.equal(a.gate.stopRecord("c-2")?.reason, "shutdown");
      assert.equal(a.gate.terminated, true);
      assert.equal(await server.finishes(first), 0);
      assert.equal(await server.finishes(second), 0);

      // After the shutdown a new model response is refused: dropped, and the model interrupted for it.
      a.model.begin("c-3");
      a.model.audio("c-3");
      await until("the refused Start", () => a.gate.stats.startFailures === 1);
      assert.equal(a.played.get("c-3"), undefined);
      assert.ok(a.model.cancels.includes("c-3"));
    } finally {
      assert.equal(await peer.exit(), 0);
    }
  });

  void test("audio_interrupted of the live response cancels it at the coordinator; a false one cancels nothing", async () => {
    const { server, recording } = env();
    const { sessionId, session, a } = await fresh();
    const peer = await Peer.spawn(server.addresses.grpc, sessionId);
    try {
      // The server VAD interrupts A's live response: a fenced Cancel.
      const first = await speaking(a, "i-1");
      const played = a.played.get("i-1");
      a.model.speechStarted();
      a.model.audio("i-1");
      assert.equal(a.played.get("i-1"), played, "nothing of an interrupted response passes");
      const ended = await recording.oneEndPerStart(sessionId, [first]);
      assert.equal(ended.get(first)?.status, pb.TerminalStatus.TERMINAL_STATUS_CANCELLED);
      assert.equal(a.gate.stats.interruptionsDetected, 1);
      assert.equal(await server.finishes(first), 0);

      // A's next response completes; B's response is live; the player's
      // late audio_interrupted for A's finished response cancels nothing.
      const second = await speaking(a, "i-2");
      a.model.end("i-2");
      await until("A's Finish", () => a.gate.stats.responsesFinished === 1);
      const held = id((await peer.send({ op: "hold", id: "b-held" })).responseId);
      a.model.speechStarted();
      assert.equal(a.gate.stats.falseInterruptions, 1);
      assert.equal(a.gate.stats.interruptionsDetected, 1);
      assert.deepEqual(a.interrupted, ["i-1", "i-2"], "the application gets every audio_interrupted");
      await a.gate.close(); // nothing in flight is left: the check below sees every call A made
      const state = await session.state();
      assert.equal(state.responseId, held, "B's response is still live");
      await peer.send({ op: "end", id: "b-held" });
      await recording.oneEndPerStart(sessionId, [first, second, held]);
      assert.equal(await server.finishes(second), 1);
      assert.equal(await server.finishes(held), 1);
    } finally {
      assert.equal(await peer.exit(), 0);
    }
  });

  /** A tool the session runs for a `function_call` of that name; it returns once `held` resolves. */
  function lookup(held: Promise<void> = Promise.resolve()): { tool: ReturnType<typeof tool>; runs: () => number } {
    let runs = 0;
    const lookupTool = tool({
      name: "lookup",
      description: "test tool",
      parameters: { type: "object", properties: {}, required: [], additionalProperties: false },
      strict: true,
      execute: async () => {
        runs += 1;
        await held;
        return "42";
      },
    });
    return { tool: lookupTool, runs: () => runs };
  }

  /**
   * `first` calls `name` and ends; the session runs it and asks for a
   * follow-up; `second` (the follow-up) streams 3 chunks and ends: one
   * respcoord response, one Finish.
   */
  async function followUp(name: string, first: string, second: string): Promise<void> {
    const { server, recording } = env();
    const handoffTarget = new RealtimeAgent({ name: "specialist", instructions: "test" });
    const looked = lookup();
    const { sessionId, a } = await fresh({ tools: [looked.tool], handoffs: [handoffTarget] });
    const responseId = await speaking(a, first);
    const firstPlayed = a.played.get(first) ?? 0;
    a.model.call(first, name, `call-${first}`);
    a.model.end(first, [`call-${first}`]);
    await until("the session sends the tool output", () => a.model.toolOutputs.length === 1);
    assert.equal(a.model.toolOutputs[0]?.startResponse, true, "the session asks for a follow-up");
    assert.equal(a.gate.stats.responsesFinished, 0, "no Finish at the turn_done of the step that called the tool");
    assert.equal(a.gate.liveResponseId, responseId, "the response is still live while the tool runs");

    a.model.begin(second);
    assert.equal(a.gate.responseIdOf(second), responseId, "the follow-up joins the response");
    for (let i = 0; i < 3; i++) a.model.audio(second);
    assert.equal(a.played.get(second), 3, "the follow-up's audio passes");
    a.model.end(second);
    await until("Finish", () => a.gate.stats.responsesFinished === 1);

    const ended = await recording.oneEndPerStart(sessionId, [responseId]);
    assert.equal(ended.get(responseId)?.status, pb.TerminalStatus.TERMINAL_STATUS_COMPLETED);
    assert.equal(await server.finishes(responseId), 1);
    assert.equal(a.played.get(first), firstPlayed);
    assert.equal(a.gate.stats.responsesStarted, 1);
    assert.equal(a.gate.stats.modelResponsesJoined, 1);
    assert.equal(a.gate.stats.audioDropped, 0);
    if (name === "lookup") assert.equal(looked.runs(), 1);
    else assert.equal(a.realtime.currentAgent.name, "specialist", "the handoff happened");
  }

  void test("a response with a follow-up step (tool call) stays one response", async () => {
    await followUp("lookup", "t-1", "t-2");
  });

  void test("a response with a follow-up step (handoff) stays one response", async () => {
    await followUp("transfer_to_specialist", "h-1", "h-2");
  });

  void test("a follow-up of a response stopped during its tool call is dropped and cancelled; no Finish", async () => {
    const { server, recording } = env();
    let release: () => void = () => undefined;
    const held = new Promise<void>((resolve) => {
      release = resolve;
    });
    const looked = lookup(held);
    const { sessionId, session, a } = await fresh({ tools: [looked.tool] });
    const responseId = await speaking(a, "s-1");
    a.model.call("s-1", "lookup", "call-s");
    a.model.end("s-1", ["call-s"]);
    await until("the tool runs", () => looked.runs() === 1);

    // Another caller cancels the response while its tool runs.
    assert.equal(await session.cancel(), responseId);
    await until("A's gate sees the stop", () => a.gate.stopRecord("s-1") !== undefined);
    assert.equal(a.gate.stopRecord("s-1")?.reason, "cancelled");
    release();
    await until("the session sends the tool output", () => a.model.toolOutputs.length === 1);

    a.model.begin("s-2");
    for (let i = 0; i < 3; i++) a.model.audio("s-2");
    assert.equal(a.played.get("s-2"), undefined, "the follow-up's audio is dropped");
    assert.ok(a.model.cancels.includes("s-2"), "the model was told to cancel the follow-up (response.cancel with its id)");
    await until("the model ends the follow-up", () => a.model.active === undefined);
    assert.equal(a.gate.stats.modelResponsesJoined, 1);
    assert.equal(a.gate.stats.responsesStarted, 1, "the follow-up started nothing");
    assert.equal(a.gate.stats.responsesFinished, 0);
    assert.equal(a.leaks, 0);
    const ended = await recording.oneEndPerStart(sessionId, [responseId]);
    assert.equal(ended.get(responseId)?.status, pb.TerminalStatus.TERMINAL_STATUS_CANCELLED);
    assert.equal(await server.finishes(responseId), 0, "no Finish");
    assert.equal((await session.state()).responseId, undefined, "the follow-up superseded nothing");
  });

  void test("a tool output without a follow-up (unknown tool): the response stays live and the model's next response joins it", async () => {
    const { server, recording } = env();
    const { sessionId, a } = await fresh();
    const errors: unknown[] = [];
    a.realtime.on("error", (error) => errors.push(error));
    const responseId = await speaking(a, "u-1");
    a.model.call("u-1", "missing", "call-u");
    a.model.end("u-1", ["call-u"]);
    await until("the session sends the tool output", () => a.model.toolOutputs.length === 1);
    assert.equal(a.model.toolOutputs[0]?.startResponse, false, "no follow-up is asked for");
    assert.equal(errors.length, 1, "the session reports the unknown tool");
    assert.equal(a.gate.liveResponseId, responseId, "the response stays live");
    assert.equal(a.gate.stats.responsesFinished, 0);

    a.model.begin("u-2");
    assert.equal(a.gate.responseIdOf("u-2"), responseId, "the model's next response joins it");
    a.model.audio("u-2");
    a.model.end("u-2");
    await until("Finish", () => a.gate.stats.responsesFinished === 1);
    const ended = await recording.oneEndPerStart(sessionId, [responseId]);
    assert.equal(ended.get(responseId)?.status, pb.TerminalStatus.TERMINAL_STATUS_COMPLETED);
    assert.equal(await server.finishes(responseId), 1);
    assert.equal(a.played.get("u-2"), 1);
  });

  void test("bargeIn() here ends A's own response and interrupts the model", async () => {
    const { server, recording } = env();
    const { sessionId, a } = await fresh();
    const responseId = await speaking(a, "g-1");
    const played = a.played.get("g-1");
    assert.equal(await a.gate.bargeIn(), responseId);
    assert.equal(a.model.interrupts, 1);
    assert.equal(a.gate.stats.falseInterruptions, 0, "the gate's own interrupt is no false interruption");
    a.model.audio("g-1");
    assert.equal(a.played.get("g-1"), played);
    const ended = await recording.oneEndPerStart(sessionId, [responseId]);
    assert.equal(ended.get(responseId)?.status, pb.TerminalStatus.TERMINAL_STATUS_CANCELLED);
    assert.equal(await server.finishes(responseId), 0);
    assert.equal(a.gate.stats.bargeInsApplied, 1);
  });

  void test("close releases a live response: nothing sent, the coordinator keeps it", async () => {
    const { server } = env();
    const { session, a } = await fresh();
    const responseId = await speaking(a, "x-1");
    const played = a.played.get("x-1");
    await a.gate.close();
    assert.equal(a.gate.stats.responsesReleased, 1);
    a.model.audio("x-1");
    a.model.end("x-1");
    assert.equal(a.played.get("x-1"), played, "nothing passes a closed gate");
    assert.equal((await session.state()).responseId, responseId);
    assert.equal(await server.finishes(responseId), 0);
    await assert.rejects(a.gate.bargeIn(), /closed/);
  });

  void test("an aborted signal closes the gate", async () => {
    const { session } = await fresh();
    const controller = new AbortController();
    const b = await agent(session, "B");
    opened.push(b);
    const gate = new ResponseGate(b.realtime, session, { signal: controller.signal });
    controller.abort();
    assert.equal(gate.closed, true);
  });
});
