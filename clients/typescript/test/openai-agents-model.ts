// A scripted realtime model for the openai-agents gate tests: the SDK's own
// in-memory transport (`@openai/agents-realtime/testing`), subclassed only to
// answer the way the OpenAI transport does (an `interrupt()`: audio_interrupted
// and the response ending; a `response.cancel` with a response id: that
// response ending) and to record the tool outputs the session sends. A real
// `RealtimeSession` runs on it with no network.
import {
  RealtimeAgent,
  RealtimeSession,
  type RealtimeAgentConfiguration,
  type RealtimeClientMessage,
  type TransportToolCallEvent,
} from "@openai/agents-realtime";
import { ScriptedRealtimeTransport } from "@openai/agents-realtime/testing";

import type { Session } from "../src/index.js";
import { ResponseGate } from "../src/openai-agents.js";

export class ScriptedModel extends ScriptedRealtimeTransport {
  /** The model response being generated (between `begin` and its end). */
  active: string | undefined;
  /** The response ids of `response.cancel` events the model received. */
  readonly cancels: string[] = [];
  interrupts = 0;
  /** The tool outputs the session sent (`sendFunctionCallOutput`), in order. */
  readonly toolOutputs: { readonly callId: string; readonly output: string; readonly startResponse: boolean }[] = [];

  /** The model starts a response (`response.created`). */
  begin(id: string): void {
    this.active = id;
    this.emit("turn_started", { type: "response_started", providerData: { type: "response.created", response: { id } } });
  }

  /** One audio chunk of a response. */
  audio(id: string, bytes = 480): void {
    this.emit("audio", { type: "audio", data: new ArrayBuffer(bytes), responseId: id });
  }

  /**
   * The response calls a function (a tool, or a handoff's `transfer_to_...`):
   * what the OpenAI transport emits on `response.output_item.done`. The
   * session runs it and sends its output.
   */
  call(id: string, name: string, callId: string, args = "{}"): void {
    const event: TransportToolCallEvent = { id: `item-${callId}`, type: "function_call", name, callId, arguments: args, responseId: id };
    this.emit("function_call", event);
  }

  /** The response ends (`response.done`), its output naming the function calls it made. */
  end(id: string, calls: readonly string[] = []): void {
    if (this.active === id) this.active = undefined;
    this.emit("turn_done", {
      type: "response_done",
      response: {
        id,
        output: calls.map((callId) => ({ type: "function_call", id: `item-${callId}`, call_id: callId, status: "completed" })),
        usage: {
          inputTokens: 0,
          inputTokensDetails: {},
          outputTokens: 0,
          outputTokensDetails: {},
          totalTokens: 0,
          requests: 1,
        },
      },
    } as never);
  }

  /** The server VAD heard the user: what the OpenAI transport does on `input_audio_buffer.speech_started`. */
  speechStarted(): void {
    this.emit("audio_interrupted");
  }

  override sendEvent(event: RealtimeClientMessage): void {
    super.sendEvent(event);
    if (event.type === "response.cancel") {
      const id = typeof event.response_id === "string" ? event.response_id : this.active;
      if (id !== undefined) this.cancels.push(id);
      // The server's answer comes later, as on a socket.
      setImmediate(() => {
        if (id !== undefined && this.active === id && this.status === "connected") this.end(id);
      });
    }
  }

  override sendFunctionCallOutput(toolCall: TransportToolCallEvent, output: string, startResponse: boolean): void {
    super.sendFunctionCallOutput(toolCall, output, startResponse);
    this.toolOutputs.push({ callId: toolCall.callId, output, startResponse });
  }

  override interrupt(): void {
    super.interrupt();
    this.interrupts += 1;
    const id = this.active;
    if (id === undefined) return;
    this.emit("audio_interrupted");
    setImmediate(() => {
      if (this.active === id && this.status === "connected") this.end(id);
    });
  }
}

export interface Agent {
  readonly model: ScriptedModel;
  readonly realtime: RealtimeSession;
  readonly gate: ResponseGate;
  /** Audio the application received, per model response id. */
  readonly played: Map<string, number>;
  /** Audio of a model response the application received after the gate had seen its stop. */
  leaks: number;
  readonly interrupted: (string | undefined)[];
}

/** A real RealtimeSession on a scripted model, and a gate on `session`; the application records what it gets. */
export async function agent(
  session: Session,
  name: string,
  config: Omit<RealtimeAgentConfiguration, "name" | "instructions"> = {},
): Promise<Agent> {
  const model = new ScriptedModel();
  const realtime = new RealtimeSession(new RealtimeAgent({ ...config, name, instructions: "test" }), { transport: model });
  await realtime.connect({ apiKey: "test-key-not-used" });
  const gate = new ResponseGate(realtime, session);
  const result: Agent = { model, realtime, gate, played: new Map(), leaks: 0, interrupted: [] };
  gate.on("audio", (event) => {
    if (gate.stopRecord(event.responseId) !== undefined) result.leaks += 1;
    result.played.set(event.responseId, (result.played.get(event.responseId) ?? 0) + 1);
  });
  gate.on("audio_interrupted", (modelId) => {
    result.interrupted.push(modelId);
  });
  return result;
}
