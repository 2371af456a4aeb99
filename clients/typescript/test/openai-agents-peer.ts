// The second process of the openai-agents gate tests: its own respcoord
// Client, RealtimeSession on a scripted model and ResponseGate, on the
// session the test names. Commands come as JSON lines on stdin, one at a time;
// each gets one JSON line on stdout (bigints as decimal strings).
//   node build/test/openai-agents-peer.js TARGET SESSION
// (`node --test build/test/` loads every file there: without arguments this
// one does nothing.)
import { createInterface } from "node:readline";

import { Client, type Session } from "../src/index.js";
import { agent, type Agent } from "./openai-agents-model.js";

interface Command {
  readonly op: "answer" | "hold" | "end" | "barge" | "cancel" | "shutdown" | "exit";
  readonly id?: string;
  readonly chunks?: number;
}

async function until(done: () => boolean): Promise<void> {
  while (!done()) await new Promise((r) => setTimeout(r, 1));
}

function modelId(command: Command): string {
  if (command.id === undefined) throw new Error(`${command.op}: no id`);
  return command.id;
}

async function run(client: Client, session: Session, b: Agent, command: Command): Promise<Record<string, unknown>> {
  switch (command.op) {
    case "answer":
    case "hold": {
      const id = modelId(command);
      b.model.begin(id);
      for (let i = 0; i < (command.chunks ?? 3); i++) b.model.audio(id);
      await until(() => b.gate.responseIdOf(id) !== undefined || b.gate.stats.startFailures > 0);
      const responseId = b.gate.responseIdOf(id);
      if (command.op === "hold") return { responseId: responseId?.toString() };
      const finished = b.gate.stats.responsesFinished;
      b.model.end(id);
      await until(() => b.gate.stats.responsesFinished > finished);
      return { responseId: responseId?.toString(), played: b.played.get(id) ?? 0 };
    }
    case "end": {
      const id = modelId(command);
      const finished = b.gate.stats.responsesFinished;
      b.model.end(id);
      await until(() => b.gate.stats.responsesFinished > finished);
      return { played: b.played.get(id) ?? 0 };
    }
    case "barge":
      return { cancelled: (await b.gate.bargeIn())?.toString() };
    case "cancel":
      return { cancelled: (await session.cancel())?.toString() };
    case "shutdown":
      return { shutdown: (await session.shutdown())?.toString() };
    case "exit":
      await b.gate.close();
      b.realtime.close();
      client.close();
      return { leaks: b.leaks };
  }
}

async function serve(target: string, sessionId: string): Promise<void> {
  const client = await Client.connect(target);
  const session = client.session(sessionId);
  const b = await agent(session, "B");
  const lines = createInterface({ input: process.stdin });
  console.log(JSON.stringify({ ready: true }));
  for await (const line of lines) {
    const command = JSON.parse(line) as Command;
    let reply: Record<string, unknown>;
    try {
      reply = await run(client, session, b, command);
    } catch (error) {
      reply = { error: String(error) };
    }
    console.log(JSON.stringify(reply));
    if (command.op === "exit") break;
  }
  lines.close();
}

const [target, sessionId] = process.argv.slice(2);
if (target !== undefined && sessionId !== undefined) await serve(target, sessionId);
