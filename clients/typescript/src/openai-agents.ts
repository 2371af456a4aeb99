// respcoord/openai-agents: the responses of an OpenAI Agents SDK realtime
// session (`@openai/agents-realtime`, `RealtimeSession`) under the
// coordinator, as clients/python/src/respcoord/openai_agents.py does for the
// Python SDK. It reuses the client's sessions, responses and fences; it has
// no fencing logic of its own. The SDK is an optional peer dependency: this
// file imports its types only, the core entry (`respcoord`) never imports it.
// See docs/openai-agents.md ("TypeScript").
import type {
  RealtimeTransportLayer,
  TransportLayerAudio,
  TransportLayerResponseCompleted,
  TransportLayerResponseStarted,
  TransportToolCallEvent,
} from "@openai/agents-realtime";

import type { CallSignal, Response, Session } from "./client.js";
import { Source, Terminal, type StopReason } from "./enums.js";
import { CancelledError, SessionTerminatedError } from "./errors.js";

/** What the gate needs of a `RealtimeSession` (any `RealtimeSession<TContext>` has it). */
export interface RealtimeSessionLike {
  readonly transport: RealtimeTransportLayer;
  interrupt(): void;
}

export interface ResponseGateOptions {
  /** The source of each response's Start (default `client`). */
  readonly source?: Source;
  /** The source of the Cancel an interruption here sends (default `vad`). */
  readonly interruptionSource?: Source;
  /** Aborting it closes the gate (as `close()`). */
  readonly signal?: AbortSignal;
}

/** Counters, updated in place. */
export interface GateStats {
  audioPassed: number;
  audioDropped: number;
  responsesStarted: number;
  responsesFinished: number;
  /** Stopped by the coordinator (a superseding Start, a Cancel, a Shutdown, expiry), from any process. */
  responsesStopped: number;
  /** Ended by an interruption here (`audio_interrupted` of the live response, or `bargeIn()`). */
  responsesInterrupted: number;
  responsesReleased: number;
  /** Follow-up model responses (after a tool call or handoff) that joined the respcoord response of the model response that called the tool. */
  modelResponsesJoined: number;
  startFailures: number;
  finishFailures: number;
  interruptionsDetected: number;
  falseInterruptions: number;
  bargeIns: number;
  bargeInsApplied: number;
  /** Scoped `response.cancel` events sent to the model for a stopped response. */
  modelInterrupts: number;
}

export interface StopRecord {
  readonly responseId: bigint;
  readonly reason: StopReason;
  /** `performance.now()` when this gate saw the stop. */
  readonly at: number;
}

export interface ResponseGateEvents {
  /** Audio of a response whose fence is current at this instant: play it. */
  audio: [event: TransportLayerAudio, responseId: bigint];
  /** The model's `audio_interrupted` (passed on always): flush the player. */
  audio_interrupted: [modelResponseId: string | undefined, responseId: bigint | undefined];
  /** A response of this gate was stopped by the coordinator: flush the player. */
  stop: [modelResponseId: string, responseId: bigint, reason: StopReason];
  /** A call to the coordinator failed (the gate goes on; the response's audio is dropped). */
  error: [error: unknown];
}

type Listener<K extends keyof ResponseGateEvents> = (...args: ResponseGateEvents[K]) => void;

type EntryState = "starting" | "live" | "ended" | "stopped" | "interrupted" | "failed" | "released";

/**
 * One respcoord response: one model response, or several when tool calls or
 * handoffs chain them (the follow-up model response joins it).
 */
interface Entry {
  /** The latest model response (provider response id) of this response. */
  modelId: string;
  /** Every model response of this response, in order. */
  readonly modelIds: string[];
  state: EntryState;
  response: Response | undefined;
  /** Audio that arrived while the Start was in flight, in order. */
  buffer: TransportLayerAudio[];
  /** The model ended its latest model response (`turn_done`). */
  modelDone: boolean;
  /** Function calls (tools or handoffs) of the latest model response. */
  pendingTools: number;
  /**
   * Its latest model response ended with a function call: the SDK runs the
   * tool and starts a follow-up model response, which joins this one (and is
   * dropped and cancelled if this one was stopped meanwhile).
   */
  awaitingFollowUp: boolean;
}

function stateOf(entry: Entry): EntryState {
  return entry.state;
}

const LOCAL_REASONS: ReadonlySet<StopReason> = new Set<StopReason>(["finished", "released"]);

/** Function calls among a finished response's output items (the raw `response.done` output). */
function functionCalls(output: unknown): number {
  if (!Array.isArray(output)) return 0;
  let calls = 0;
  for (const item of output as unknown[]) {
    if (typeof item === "object" && item !== null && (item as Record<string, unknown>).type === "function_call") calls += 1;
  }
  return calls;
}

function startedModelId(event: TransportLayerResponseStarted): string | undefined {
  const response: unknown = (event.providerData as Record<string, unknown> | undefined)?.response;
  if (typeof response !== "object" || response === null) return undefined;
  const id: unknown = (response as Record<string, unknown>).id;
  return typeof id === "string" && id.length > 0 ? id : undefined;
}

/**
 * Puts a `RealtimeSession`'s model responses under the coordinator. Listen to
 * the gate's `audio` instead of the session's; one gate per agent session, on
 * the call's respcoord session. Create it after `realtime.connect()`.
 */
export class ResponseGate {
  readonly stats: GateStats = {
    audioPassed: 0,
    audioDropped: 0,
    responsesStarted: 0,
    responsesFinished: 0,
    responsesStopped: 0,
    responsesInterrupted: 0,
    responsesReleased: 0,
    modelResponsesJoined: 0,
    startFailures: 0,
    finishFailures: 0,
    interruptionsDetected: 0,
    falseInterruptions: 0,
    bargeIns: 0,
    bargeInsApplied: 0,
    modelInterrupts: 0,
  };
  readonly #realtime: RealtimeSessionLike;
  readonly #transport: RealtimeTransportLayer;
  readonly #session: Session;
  readonly #source: Source;
  readonly #interruptionSource: Source;
  readonly #entries = new Map<string, Entry>();
  readonly #stops = new Map<string, StopRecord>();
  readonly #listeners: { [K in keyof ResponseGateEvents]: Set<Listener<K>> } = {
    audio: new Set(),
    audio_interrupted: new Set(),
    stop: new Set(),
    error: new Set(),
  };
  readonly #abort = new AbortController();
  readonly #unsubscribe: (() => void)[] = [];
  /** Every coordinator call of this gate, one after another (a Start never overtakes the previous Finish). */
  #chain: Promise<void> = Promise.resolve();
  /** The model response of the latest audio (what an `audio_interrupted` refers to). */
  #lastAudio: string | undefined;
  /** The latest model response this gate opened. */
  #current: Entry | undefined;
  #selfInterrupt = false;
  #terminated = false;
  #closed = false;

  constructor(realtime: RealtimeSessionLike, session: Session, options: ResponseGateOptions = {}) {
    this.#realtime = realtime;
    this.#transport = realtime.transport;
    this.#session = session;
    this.#source = options.source ?? Source.Client;
    this.#interruptionSource = options.interruptionSource ?? Source.Vad;
    const transport = this.#transport;
    const subscribe = (event: string, listener: (...args: never[]) => void): void => {
      const on = transport.on.bind(transport) as (e: string, l: (...args: never[]) => void) => unknown;
      const off = transport.off.bind(transport) as (e: string, l: (...args: never[]) => void) => unknown;
      on(event, listener);
      this.#unsubscribe.push(() => off(event, listener));
    };
    subscribe("turn_started", (event: TransportLayerResponseStarted) => {
      this.#onTurnStarted(event);
    });
    subscribe("audio", (event: TransportLayerAudio) => {
      this.#onAudio(event);
    });
    subscribe("function_call", (event: TransportToolCallEvent) => {
      this.#onFunctionCall(event);
    });
    subscribe("turn_done", (event: TransportLayerResponseCompleted) => {
      this.#onTurnDone(event);
    });
    subscribe("audio_interrupted", () => {
      this.#onAudioInterrupted();
    });
    subscribe("connection_change", (status: string) => {
      if (status === "disconnected") void this.close();
    });
    const signal = options.signal;
    if (signal !== undefined) {
      if (signal.aborted) void this.close();
      else signal.addEventListener("abort", () => void this.close(), { once: true });
    }
    // The gate serves this session from now on: its watch opens ahead, so a
    // barge-in right after the first Start needs no Watch set-up.
    if (!this.#closed && !session.client.closed) session.openWatch();
  }

  on<K extends keyof ResponseGateEvents>(event: K, listener: Listener<K>): this {
    this.#listeners[event].add(listener);
    return this;
  }

  off<K extends keyof ResponseGateEvents>(event: K, listener: Listener<K>): this {
    this.#listeners[event].delete(listener);
    return this;
  }

  /** True once a Shutdown or expiry of the session was seen, or a Start was refused as terminated. */
  get terminated(): boolean {
    return this.#terminated;
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** The respcoord id of this gate's live response, if any. */
  get liveResponseId(): bigint | undefined {
    const entry = this.#current;
    return entry?.state === "live" && entry.response?.isCurrent() === true ? entry.response.id : undefined;
  }

  /** The respcoord response id of a model response id (`event.responseId` of an audio event). */
  responseIdOf(modelResponseId: string): bigint | undefined {
    return this.#entries.get(modelResponseId)?.response?.id;
  }

  /** The fence check for audio the application held back before playing it. */
  isCurrent(modelResponseId: string): boolean {
    const entry = this.#entries.get(modelResponseId);
    return !this.#closed && entry?.state === "live" && entry.response?.isCurrent() === true;
  }

  /** Why and when this gate saw the coordinator stop a model response's respcoord response. */
  stopRecord(modelResponseId: string): StopRecord | undefined {
    return this.#stops.get(modelResponseId);
  }

  /**
   * The application's own VAD heard the user: ends this gate's live response
   * (and interrupts the model), or else the response the coordinator has live
   * on the session wherever it runs, with a Cancel fenced by its id. Returns
   * the cancelled response id, or undefined if nothing was cancelled.
   */
  bargeIn(options: CallSignal = {}): Promise<bigint | undefined> {
    if (this.#closed) return Promise.reject(new CancelledError("the response gate was closed"));
    this.stats.bargeIns += 1;
    const entry = this.#current;
    if (entry !== undefined && (entry.state === "live" || entry.state === "starting")) {
      this.#interruptHere(entry);
      this.#selfInterrupt = true;
      try {
        this.#realtime.interrupt();
      } finally {
        this.#selfInterrupt = false;
      }
      return this.#enqueue(async () => {
        const cancelled = await this.#cancelInterrupted(entry, options);
        if (cancelled !== undefined) this.stats.bargeInsApplied += 1;
        return cancelled;
      });
    }
    return this.#enqueue(async () => {
      const state = await this.#session.state(this.#callOptions(options));
      if (state.phase !== "active" || state.responseId === undefined) return undefined;
      const cancelled = await this.#session.cancel({
        ...this.#callOptions(options),
        source: this.#interruptionSource,
        ifResponseId: state.responseId,
      });
      if (cancelled !== undefined) this.stats.bargeInsApplied += 1;
      return cancelled;
    });
  }

  /**
   * Stops listening and releases a response still live (nothing is sent: the
   * coordinator keeps it until it is superseded, cancelled or expires).
   * Resolves once the gate's calls in flight have settled.
   */
  async close(): Promise<void> {
    if (!this.#closed) {
      this.#closed = true;
      for (const unsubscribe of this.#unsubscribe) unsubscribe();
      for (const entry of this.#entries.values()) {
        if (entry.state === "live" || entry.state === "starting") {
          entry.state = "released";
          entry.buffer = [];
          if (entry.response !== undefined) {
            entry.response.release();
            this.stats.responsesReleased += 1;
          }
        }
      }
      this.#abort.abort(new CancelledError("the response gate was closed"));
    }
    await this.#chain;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  #callOptions(options: CallSignal): CallSignal {
    const signal = options.signal === undefined ? this.#abort.signal : AbortSignal.any([options.signal, this.#abort.signal]);
    return { signal };
  }

  #emit<K extends keyof ResponseGateEvents>(event: K, ...args: ResponseGateEvents[K]): void {
    for (const listener of this.#listeners[event]) listener(...args);
  }

  #reportError(error: unknown): void {
    if (this.#closed) return;
    if (this.#listeners.error.size === 0) {
      process.emitWarning(`respcoord/openai-agents: ${String(error)}`);
      return;
    }
    this.#emit("error", error);
  }

  /** Runs `job` after every earlier coordinator call of this gate; the chain itself never rejects. */
  #enqueue<T>(job: () => Promise<T>): Promise<T> {
    const result = this.#chain.then(job);
    this.#chain = result.then(
      () => undefined,
      () => undefined,
    );
    return result;
  }

  /** Runs `job` on the chain, reporting (never throwing) its failure. */
  #background(job: () => Promise<void>): void {
    this.#enqueue(job).catch((error: unknown) => {
      this.#reportError(error);
    });
  }

  /** A model response this gate has not seen: the follow-up of the current response, or a new one. */
  #begin(modelId: string): Entry {
    const current = this.#current;
    if (
      current !== undefined &&
      current.state !== "released" &&
      (current.awaitingFollowUp || (current.pendingTools > 0 && !current.modelDone))
    ) {
      return this.#join(current, modelId);
    }
    return this.#open(modelId);
  }

  /**
   * The SDK started this model response to go on after a tool call or
   * handoff: the same respcoord response. If that one was stopped (or
   * interrupted, or its Start failed) meanwhile, the follow-up's audio is
   * dropped and the model is told to cancel it: it must not supersede
   * whoever stopped it.
   */
  #join(entry: Entry, modelId: string): Entry {
    entry.awaitingFollowUp = false;
    entry.pendingTools = 0;
    entry.modelId = modelId;
    entry.modelIds.push(modelId);
    entry.modelDone = false;
    this.#entries.set(modelId, entry);
    this.stats.modelResponsesJoined += 1;
    const stop = entry.modelIds[0] === undefined ? undefined : this.#stops.get(entry.modelIds[0]);
    if (stop !== undefined) this.#stops.set(modelId, stop);
    if (entry.state !== "starting" && entry.state !== "live") this.#cancelModel(entry);
    return entry;
  }

  #open(modelId: string): Entry {
    const entry: Entry = {
      modelId,
      modelIds: [modelId],
      state: "starting",
      response: undefined,
      buffer: [],
      modelDone: false,
      pendingTools: 0,
      awaitingFollowUp: false,
    };
    this.#entries.set(modelId, entry);
    this.#current = entry;
    this.#background(() => this.#start(entry));
    return entry;
  }

  async #start(entry: Entry): Promise<void> {
    if (entry.state !== "starting" && entry.state !== "interrupted") return;
    let response: Response;
    try {
      response = await this.#session.start(this.#source, { signal: this.#abort.signal });
    } catch (error) {
      if (this.#closed) return;
      this.stats.startFailures += 1;
      if (error instanceof SessionTerminatedError) this.#terminated = true;
      this.stats.audioDropped += entry.buffer.length;
      entry.buffer = [];
      if (entry.state === "starting") entry.state = "failed";
      this.#cancelModel(entry);
      if (!(error instanceof SessionTerminatedError)) this.#reportError(error);
      return;
    }
    entry.response = response;
    const state = stateOf(entry); // changed while the Start was in flight?
    if (this.#closed || state !== "starting") {
      // Closed meanwhile, or interrupted here before the reply: the
      // interruption's Cancel (queued after this) fences it by its id.
      response.release();
      if (state === "released") this.stats.responsesReleased += 1;
      return;
    }
    entry.state = "live";
    this.stats.responsesStarted += 1;
    void response.stopped().then((reason) => {
      this.#onStopped(entry, reason);
    });
    const buffered = entry.buffer;
    entry.buffer = [];
    for (const audio of buffered) this.#deliver(entry, audio);
    if (entry.modelDone && !entry.awaitingFollowUp) await this.#finish(entry);
  }

  async #finish(entry: Entry): Promise<void> {
    const response = entry.response;
    if (entry.state !== "live" || entry.awaitingFollowUp || response === undefined) return;
    entry.state = "ended";
    try {
      const result = await response.finish(Terminal.Completed, { signal: this.#abort.signal });
      if (result.kind !== "not_sent") this.stats.responsesFinished += 1;
    } catch (error) {
      this.stats.finishFailures += 1;
      this.#reportError(error);
    }
  }

  #onStopped(entry: Entry, reason: StopReason): void {
    if (LOCAL_REASONS.has(reason) || entry.state !== "live" || entry.response === undefined) return;
    entry.state = "stopped";
    this.stats.responsesStopped += 1;
    if (reason === "shutdown" || reason === "expired") this.#terminated = true;
    const record: StopRecord = { responseId: entry.response.id, reason, at: performance.now() };
    for (const modelId of entry.modelIds) this.#stops.set(modelId, record);
    this.#cancelModel(entry);
    this.#emit("stop", entry.modelId, entry.response.id, reason);
  }

  /**
   * Interrupts the model for this response only: `response.cancel` with its
   * id (the SDK's unscoped `interrupt()` would cut whatever the model has
   * current when it lands, possibly the next response).
   */
  #cancelModel(entry: Entry): void {
    if (entry.modelDone || this.#closed || this.#transport.status !== "connected") return;
    this.stats.modelInterrupts += 1;
    try {
      this.#transport.sendEvent({ type: "response.cancel", response_id: entry.modelId });
    } catch (error) {
      this.#reportError(error);
    }
  }

  #deliver(entry: Entry, audio: TransportLayerAudio): void {
    const response = entry.response;
    // The fence check and the emit are one synchronous step: nothing can stop
    // the response between them.
    if (!this.#closed && entry.state === "live" && response?.isCurrent() === true) {
      this.stats.audioPassed += 1;
      this.#emit("audio", audio, response.id);
    } else {
      this.stats.audioDropped += 1;
    }
  }

  #onTurnStarted(event: TransportLayerResponseStarted): void {
    const modelId = startedModelId(event);
    if (modelId === undefined || this.#entries.has(modelId)) return;
    this.#begin(modelId);
  }

  #onAudio(audio: TransportLayerAudio): void {
    const modelId = audio.responseId;
    this.#lastAudio = modelId;
    // Audio of a response without a turn_started opens one.
    const entry = this.#entries.get(modelId) ?? this.#begin(modelId);
    if (entry.state === "starting") entry.buffer.push(audio);
    else this.#deliver(entry, audio);
  }

  /** The model called a tool (or a handoff) in this model response: its `turn_done` is not the end. */
  #onFunctionCall(event: TransportToolCallEvent): void {
    const entry = this.#entries.get(event.responseId);
    if (entry?.modelId !== event.responseId || entry.modelDone) return;
    entry.pendingTools += 1;
  }

  #onTurnDone(event: TransportLayerResponseCompleted): void {
    const modelId = event.response.id;
    const entry = this.#entries.get(modelId);
    // Unknown, or an earlier step of a joined response (its follow-up began first).
    if (entry?.modelId !== modelId) return;
    entry.modelDone = true;
    const calls = Math.max(entry.pendingTools, functionCalls(event.response.output));
    entry.pendingTools = 0;
    if (calls > 0 && entry.state !== "released") {
      // A tool call or handoff: the SDK sends its output and starts the
      // follow-up model response, which is still this response. No Finish.
      entry.awaitingFollowUp = true;
      return;
    }
    if (entry.state === "live") this.#background(() => this.#finish(entry));
    // "starting": #start finishes it once the reply is in.
  }

  #onAudioInterrupted(): void {
    const modelId = this.#lastAudio;
    const entry = modelId === undefined ? undefined : this.#entries.get(modelId);
    this.#emit("audio_interrupted", modelId, entry?.response?.id);
    if (this.#selfInterrupt || this.#closed) return;
    const live =
      entry !== undefined &&
      (entry.state === "starting" || (entry.state === "live" && entry.response?.isCurrent() === true));
    if (!live) {
      // Audio of a response no longer live here (finished, or stopped and
      // this is the model answering): another process's response goes on.
      this.stats.falseInterruptions += 1;
      return;
    }
    this.stats.interruptionsDetected += 1;
    this.#interruptHere(entry);
    this.#background(async () => {
      await this.#cancelInterrupted(entry, {});
    });
  }

  /** Ends this gate's response at once: no more of its audio; the Cancel follows. */
  #interruptHere(entry: Entry): void {
    entry.state = "interrupted";
    this.stats.responsesInterrupted += 1;
    this.stats.audioDropped += entry.buffer.length;
    entry.buffer = [];
  }

  async #cancelInterrupted(entry: Entry, options: CallSignal): Promise<bigint | undefined> {
    const response = entry.response;
    if (response === undefined) return undefined; // the Start failed
    try {
      return await this.#session.cancel({
        ...this.#callOptions(options),
        source: this.#interruptionSource,
        ifResponseId: response.id,
      });
    } finally {
      response.release();
    }
  }
}
