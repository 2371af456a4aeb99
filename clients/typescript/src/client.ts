// Client, Session and Response: the Rust client's API (clients/rust/src/lib.rs,
// clients/rust/src/response.rs) in TypeScript's idiom.
import { readFileSync } from "node:fs";
import { randomBytes } from "node:crypto";

import {
  credentials,
  Metadata,
  type CallOptions,
  type ChannelCredentials,
  type ChannelOptions,
  type ClientUnaryCall,
  type ServiceError,
} from "@grpc/grpc-js";

import {
  isSource,
  isTerminal,
  sourceToWire,
  stateFromWire,
  terminalToWire,
  Source,
  type SessionState,
  type StopReason,
  type Terminal,
} from "./enums.js";
import {
  abortError,
  AlreadyFinishedError,
  ClientClosedError,
  ConfigError,
  InvalidArgumentError,
  RespcoordError,
  toRespcoordError,
} from "./errors.js";
import * as pb from "./gen/respcoord/v1/coordinator.js";
import { defaultRetryPolicy, withRetry, type RetryPolicy } from "./retry.js";
import { Liveness, Tracks, type Effects, type IdleNotice } from "./fencing.js";
import { DEFAULT_WATCH_LINGER_MS, Watches, type WatchChannel, type WatchStatus } from "./watch.js";

/** Longest session id the contract accepts, in UTF-8 bytes. */
export const MAX_SESSION_ID_BYTES = 256;
/** Longest request id the contract accepts, in UTF-8 bytes. */
export const MAX_REQUEST_ID_BYTES = 128;

/** TLS settings; any of them, or an `https://` target, turns TLS on. */
export interface TlsOptions {
  /** PEM file of the CA(s) to trust; without it Node's default roots. */
  readonly ca?: string;
  /** PEM client certificate chain and key, for mutual TLS (both or neither). */
  readonly cert?: string;
  readonly key?: string;
  /** The name to verify the server's certificate against, when it is not the target's host. */
  readonly domain?: string;
}

export interface ConnectOptions {
  /** Sent as `authorization: Bearer <token>` on every call, the session watches included. */
  readonly token?: string;
  readonly tls?: TlsOptions;
  /** Retries and deadlines of calls (defaults: defaultRetryPolicy). */
  readonly retry?: Partial<RetryPolicy>;
  /** How long `connect` waits for the connection (default 5 s); ignored when lazy. */
  readonly connectTimeoutMs?: number;
  /** Do not wait for the connection: the first calls connect, retried like any call. */
  readonly lazy?: boolean;
  /** Aborts the wait for the connection. */
  readonly signal?: AbortSignal;
  /**
   * How long a session's watch stays open after this client's last response
   * there ends, or after `session.openWatch()` (default 30 000 ms). A Start
   * within it needs no Watch call. 0: the watch closes with the last response,
   * and `openWatch` does nothing.
   */
  readonly watchLingerMs?: number;
}

/** The longest linger a timer can wait (setTimeout's limit, about 24.8 days). */
const MAX_WATCH_LINGER_MS = 2 ** 31 - 1;

function validateWatchLinger(value: unknown): number {
  if (value === undefined) return DEFAULT_WATCH_LINGER_MS;
  if (typeof value !== "number" || Number.isNaN(value)) throw new ConfigError("watchLingerMs", "must be a number of milliseconds");
  if (value < 0) throw new ConfigError("watchLingerMs", `is ${value}: must not be negative`);
  if (value > MAX_WATCH_LINGER_MS) throw new ConfigError("watchLingerMs", `is ${value}: must be at most ${MAX_WATCH_LINGER_MS}`);
  return value;
}

/** Options every call takes. */
export interface CallSignal {
  /** Aborting it cancels the call: it rejects with CancelledError (cause: the signal's reason). */
  readonly signal?: AbortSignal;
}

export interface StartOptions extends CallSignal {
  /**
   * The idempotency key (1 to 128 bytes). Without it a fresh one is
   * generated, which still makes this call's own retries safe; give one to
   * make a repeat of the whole operation (after a gateway restart) safe too.
   */
  readonly requestId?: string;
}

export interface CancelOptions extends CallSignal {
  readonly source?: Source;
  /** Cancel only if this is the live response. Without it the call is not retried. */
  readonly ifResponseId?: bigint;
}

/** What became of a Finish that was sent, or why it was not. */
export type FinishResult =
  | { readonly kind: "applied"; readonly state: SessionState }
  | { readonly kind: "stale"; readonly state: SessionState }
  | { readonly kind: "not_sent"; readonly reason: StopReason };

/** A Finish in `run` whose call failed after its retries: whether it applied is unknown. */
export interface FinishFailed {
  readonly kind: "error";
  readonly error: RespcoordError;
}

/** How `session.run` ended. */
export type RunOutcome<T> =
  | {
      readonly kind: "completed";
      readonly responseId: bigint;
      readonly value: T;
      readonly finished: FinishResult | FinishFailed;
    }
  | {
      readonly kind: "failed";
      readonly responseId: bigint;
      readonly error: unknown;
      readonly finished: FinishResult | FinishFailed;
    }
  | { readonly kind: "stopped"; readonly responseId: bigint; readonly reason: StopReason };

/** The output path's fence: cheap to pass around and to check. */
export interface Fence {
  readonly id: bigint;
  /** False once the coordinator stopped the response, it was finished, or released: drop the output. */
  isCurrent(): boolean;
  stopReason(): StopReason | undefined;
}

/** What `run` gives its body. */
export interface ResponseContext {
  readonly responseId: bigint;
  /** Aborted (with ResponseStoppedError) the moment the response stops. */
  readonly signal: AbortSignal;
  /** The fence check: call before emitting each chunk. */
  isCurrent(): boolean;
  fence(): Fence;
  /** Resolves (never rejects) with the reason once the response stops. */
  stopped(): Promise<StopReason>;
}

function utf8Length(value: string): number {
  return Buffer.byteLength(value, "utf8");
}

// Unicode Cc: C0, DEL and C1.
// eslint-disable-next-line no-control-regex
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/u;

/** Refuses a session id the coordinator would refuse, naming the field. */
export function validateSessionId(sessionId: unknown): string {
  if (typeof sessionId !== "string") throw new InvalidArgumentError("session_id", "must be a string");
  if (sessionId.length === 0) throw new InvalidArgumentError("session_id", "must not be empty");
  const bytes = utf8Length(sessionId);
  if (bytes > MAX_SESSION_ID_BYTES) {
    throw new InvalidArgumentError("session_id", `is ${bytes} bytes, longer than the limit of ${MAX_SESSION_ID_BYTES}`);
  }
  const control = CONTROL.exec(sessionId);
  if (control) {
    const code = control[0].codePointAt(0) ?? 0;
    throw new InvalidArgumentError(
      "session_id",
      `contains the control character U+${code.toString(16).toUpperCase().padStart(4, "0")}`,
    );
  }
  return sessionId;
}

/**
 * @internal Refuses a caller-given request id the coordinator would refuse,
 * naming the field (`Session.start`; exported for the rules test, not from
 * the package's index).
 */
export function validateRequestId(requestId: unknown): string {
  if (typeof requestId !== "string") throw new InvalidArgumentError("request_id", "must be a string");
  if (requestId.length === 0) {
    throw new InvalidArgumentError("request_id", "must not be empty (omit it to have one generated)");
  }
  const bytes = utf8Length(requestId);
  if (bytes > MAX_REQUEST_ID_BYTES) {
    throw new InvalidArgumentError("request_id", `is ${bytes} bytes, longer than the limit of ${MAX_REQUEST_ID_BYTES}`);
  }
  return requestId;
}

function validateSource(source: unknown): Source {
  if (!isSource(source)) throw new InvalidArgumentError("source", `must be one of ${Object.values(Source).join(", ")}`);
  return source;
}

function validateResponseId(field: string, id: unknown): bigint {
  if (typeof id !== "bigint" || id <= 0n || id >= 1n << 64n) {
    throw new InvalidArgumentError(field, "must be a bigint in [1, 2^64)");
  }
  return id;
}

/** A fresh request id: 128 random bits, hex. */
export function newRequestId(): string {
  return `rc-${randomBytes(16).toString("hex")}`;
}

type UnaryMethod<Req, Res> = (
  request: Req,
  metadata: Metadata,
  options: Partial<CallOptions>,
  callback: (error: ServiceError | null, response: Res) => void,
) => ClientUnaryCall;

/** One attempt of a unary call, cancelled when `signal` aborts. */
function unary<Req, Res>(
  method: UnaryMethod<Req, Res>,
  request: Req,
  metadata: Metadata,
  deadline: Date,
  signal: AbortSignal | undefined,
): Promise<Res> {
  return new Promise((resolve, reject) => {
    const onAbort = (): void => {
      call.cancel();
    };
    const call = method(request, metadata, { deadline }, (error, response) => {
      signal?.removeEventListener("abort", onAbort);
      if (error) reject(error);
      else resolve(response);
    });
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

interface Target {
  readonly address: string;
  readonly tls: boolean;
}

function parseTarget(target: unknown, tls: TlsOptions | undefined): Target {
  if (typeof target !== "string" || target.trim() === "") throw new ConfigError("target", "must not be empty");
  const raw = target.trim();
  const anyTls = tls !== undefined && Object.values(tls).some((v) => v !== undefined);
  if (raw.startsWith("http://")) {
    if (anyTls) throw new ConfigError("target", `${raw} is plaintext but TLS options are set; use https://`);
    return { address: raw.slice("http://".length), tls: false };
  }
  if (raw.startsWith("https://")) return { address: raw.slice("https://".length), tls: true };
  if (raw.includes("://")) throw new ConfigError("target", `${raw}: the scheme must be http or https`);
  return { address: raw, tls: anyTls };
}

function readPem(field: string, path: string | undefined): Buffer | null {
  if (path === undefined) return null;
  try {
    return readFileSync(path);
  } catch (error) {
    throw new ConfigError(field, `${path}: ${(error as Error).message}`, { cause: error });
  }
}

function channelCredentials(target: Target, tls: TlsOptions | undefined): ChannelCredentials {
  if (!target.tls) return credentials.createInsecure();
  if ((tls?.cert === undefined) !== (tls?.key === undefined)) {
    throw new ConfigError("tls.cert", "tls.cert and tls.key go together (mutual TLS needs both)");
  }
  return credentials.createSsl(readPem("tls.ca", tls?.ca), readPem("tls.key", tls?.key), readPem("tls.cert", tls?.cert));
}

function authMetadata(token: string | undefined): Metadata {
  const metadata = new Metadata();
  if (token === undefined) return metadata;
  const trimmed = token.trim();
  if (trimmed === "") throw new ConfigError("token", "must not be empty");
  if (!/^[\x20-\x7e]+$/.test(trimmed)) throw new ConfigError("token", "must be printable ASCII");
  metadata.set("authorization", `Bearer ${trimmed}`);
  return metadata;
}

/**
 * A connection to respcoord: one channel for calls, and a pool of channels of
 * its own for the session watches (one Watch stream per session with a live
 * response of this client, opened ahead, or lingering after its last one).
 */
export class Client {
  readonly #raw: pb.ResponseCoordinatorClient;
  readonly #auth: Metadata;
  readonly #retry: RetryPolicy;
  readonly #tracks = new Tracks();
  readonly #watches: Watches;
  #closed = false;

  private constructor(
    raw: pb.ResponseCoordinatorClient,
    watchChannel: () => pb.ResponseCoordinatorClient,
    auth: Metadata,
    retry: RetryPolicy,
    lingerMs: number,
  ) {
    this.#raw = raw;
    this.#auth = auth;
    this.#retry = retry;
    this.#watches = new Watches(() => this.#watchChannel(watchChannel()), this.#tracks, retry, { lingerMs });
  }

  /** One pooled watch connection: the session watches' Watch and GetState calls go on it. */
  #watchChannel(raw: pb.ResponseCoordinatorClient): WatchChannel {
    return {
      transport: {
        openWatch: (sessionId, afterRevision) =>
          raw.watch({ sessionId, afterRevision, afterSeq: undefined }, this.#auth.clone()),
        getState: async (sessionId, signal) => {
          const reply = await this.call((r) => r.getState.bind(r), { sessionId }, true, signal, raw);
          return reply.state ?? pb.SessionState.create();
        },
      },
      close: () => {
        raw.close();
      },
    };
  }

  /**
   * Connects to `target` (`host:port`, `http://host:port` or
   * `https://host:port`; `host:port` means TLS when TLS options are given).
   * Fails fast (UnavailableError) if the coordinator cannot be reached within
   * the connect timeout, unless `lazy`.
   */
  static async connect(target: string, options: ConnectOptions = {}): Promise<Client> {
    const parsed = parseTarget(target, options.tls);
    const creds = channelCredentials(parsed, options.tls);
    const auth = authMetadata(options.token);
    const lingerMs = validateWatchLinger(options.watchLingerMs);
    const retry: RetryPolicy = { ...defaultRetryPolicy, ...options.retry };
    const channelOptions: ChannelOptions = {
      // Notice a dead peer on an otherwise quiet connection (the watches').
      "grpc.keepalive_time_ms": 10_000,
      "grpc.keepalive_timeout_ms": 5_000,
      "grpc.keepalive_permit_without_calls": 1,
      // Reconnect on the retry policy's time scale, not grpc-js's 1 s to 120 s.
      "grpc.initial_reconnect_backoff_ms": Math.max(retry.initialBackoffMs, 10),
      "grpc.max_reconnect_backoff_ms": Math.max(retry.maxBackoffMs, 10),
      ...(options.tls?.domain === undefined
        ? {}
        : { "grpc.ssl_target_name_override": options.tls.domain, "grpc.default_authority": options.tls.domain }),
    };
    const raw = new pb.ResponseCoordinatorClient(parsed.address, creds, channelOptions);
    // Each watch channel is a connection of its own (not shared with the
    // calls' channel nor with another watch channel: a local subchannel pool).
    const watchChannel = (): pb.ResponseCoordinatorClient =>
      new pb.ResponseCoordinatorClient(parsed.address, creds, { ...channelOptions, "grpc.use_local_subchannel_pool": 1 });
    const client = new Client(raw, watchChannel, auth, retry, lingerMs);
    if (options.lazy === true) return client;
    const signal = options.signal;
    try {
      if (signal?.aborted) throw abortError(signal);
      await new Promise<void>((resolve, reject) => {
        const onAbort = (): void => {
          reject(abortError(signal as AbortSignal));
        };
        signal?.addEventListener("abort", onAbort, { once: true });
        raw.waitForReady(Date.now() + (options.connectTimeoutMs ?? 5_000), (error) => {
          signal?.removeEventListener("abort", onAbort);
          if (error) {
            reject(
              toRespcoordError({ code: 14, details: `cannot connect to ${parsed.address}: ${error.message}` }),
            );
          } else resolve();
        });
      });
    } catch (error) {
      client.close();
      throw error;
    }
    return client;
  }

  get retryPolicy(): RetryPolicy {
    return this.#retry;
  }

  /** A handle on one session. Throws InvalidArgumentError naming `session_id` for a malformed id. */
  session(sessionId: string): Session {
    this.#checkOpen();
    return new Session(this, validateSessionId(sessionId));
  }

  /** How this client's session watches are doing. */
  watchStatus(): WatchStatus {
    return this.#watches.status();
  }

  /**
   * Stops every session watch, fails every fence of this client closed
   * (reason `released`: nothing can learn about stops any more) and closes
   * every connection. Idempotent.
   */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#tracks.releaseAll();
    this.#raw.close();
    this.#watches.close();
  }

  /** Closes, then waits for the session watches to end. */
  async [Symbol.asyncDispose](): Promise<void> {
    this.close();
    await this.#watches.done();
  }

  // ---- internals used by Session and Response ----

  /** @internal */
  get tracks(): Tracks {
    return this.#tracks;
  }

  #checkOpen(): void {
    if (this.#closed) throw new ClientClosedError("the client is closed");
  }

  /** @internal Whether close() was called. */
  get closed(): boolean {
    return this.#closed;
  }

  /** @internal Carries out what the fencing table asked for: a session watch to open, a linger to begin. */
  carryOut(effects: Effects): void {
    this.#watches.carryOut(effects);
  }

  /** @internal Begins the linger of a session whose last response ended. */
  linger(notice: IdleNotice | undefined): void {
    this.#watches.linger.begin(notice);
  }

  /** @internal Opens a session's watch ahead (nothing with linger 0). */
  openWatchAhead(sessionId: string): void {
    this.#checkOpen();
    if (this.#watches.linger.off) return;
    this.#watches.carryOut(this.#tracks.openWatch(sessionId));
  }

  /**
   * @internal Runs one unary call under the retry policy (only idempotent
   * calls are tried again); every attempt carries the token and a deadline.
   */
  async call<Req, Res>(
    method: (raw: pb.ResponseCoordinatorClient) => UnaryMethod<Req, Res>,
    request: Req,
    idempotent: boolean,
    signal: AbortSignal | undefined,
    raw: pb.ResponseCoordinatorClient = this.#raw,
  ): Promise<Res> {
    this.#checkOpen();
    const policy = idempotent ? this.#retry : { ...this.#retry, maxAttempts: 1 };
    const bound = method(raw);
    const { value } = await withRetry(
      policy,
      (deadline) => unary(bound, request, this.#auth.clone(), deadline, signal),
      signal,
    );
    return value;
  }

  /** GetState. Idempotent: retried. */
  async getState(sessionId: string, options: CallSignal = {}): Promise<SessionState> {
    const id = validateSessionId(sessionId);
    const reply = await this.call((raw) => raw.getState.bind(raw), { sessionId: id }, true, options.signal);
    return stateFromWire(reply.state);
  }
}

/**
 * A handle on one session. Cheap: the client tracks a session while a Start
 * on it is in flight or a response of it is live, and watches it (one Watch
 * stream) while a response of it is live, and for the client's watch linger
 * after the last one ends or after `openWatch()`.
 */
export class Session {
  readonly client: Client;
  readonly id: string;

  /** @internal use client.session(id) */
  constructor(client: Client, id: string) {
    this.client = client;
    this.id = id;
  }

  /**
   * Opens the session's watch now, so that even its first Start needs no
   * Watch call: a stop that lands right after the Start's reply reaches the
   * fence at once. Call it when the gateway begins serving the session (a
   * call connects). Does not wait; the session need not exist yet. The watch
   * stays open for the client's `watchLingerMs` after the later of this call
   * and the session's last response's end (calling it again restarts that
   * linger). With `watchLingerMs: 0` it does nothing. Throws
   * ClientClosedError once the client is closed.
   */
  openWatch(): void {
    this.client.openWatchAhead(this.id);
  }

  /**
   * Starts a response, superseding the session's live one wherever it runs.
   * The handle is stopped when the coordinator cancels or supersedes it.
   * Rejects with SessionTerminatedError once the session is terminated.
   */
  async start(source: Source, options: StartOptions = {}): Promise<Response> {
    const wireSource = sourceToWire(validateSource(source));
    const requestId = options.requestId === undefined ? newRequestId() : validateRequestId(options.requestId);
    if (options.signal?.aborted) throw abortError(options.signal);
    // Tracked while the Start is in flight (what a watch of the session
    // already learns meanwhile applies to it); nothing is sent before the
    // Start: its session's watch, unless open already, opens after the reply.
    const ref = this.client.tracks.track(this.id);
    let reply: pb.StartResponse;
    try {
      reply = await this.client.call(
        (raw) => raw.start.bind(raw),
        { sessionId: this.id, source: wireSource, requestId },
        true,
        options.signal,
      );
    } catch (error) {
      ref.release();
      throw error;
    }
    const liveness = new Liveness(reply.responseId);
    const state = stateFromWire(reply.state);
    if (this.client.closed) {
      // Closed while the Start was in flight: nothing can learn about stops.
      liveness.stop("released");
    } else if (reply.replayed && state.responseId !== reply.responseId) {
      // A retry of a Start that applied earlier, whose response has since been replaced or ended.
      liveness.stop(state.phase === "terminated" ? "shutdown" : state.phase === "active" ? "superseded" : "gone");
    }
    // An open watch (opened ahead, or lingering) is reused; otherwise the
    // session's watch opens now and replays from the reply's revision: a
    // stop that lands before the watch opens is not missed.
    this.client.carryOut(this.client.tracks.register(ref, liveness, state.revision, !reply.replayed));
    // Finished, released or stopped: no longer registered (after the
    // session's last one its watch lingers), and the session no longer
    // tracked for it.
    void liveness.stopped.then(() => {
      this.client.linger(this.client.tracks.unregister(ref, liveness));
      ref.release();
    });
    return new Response(this, liveness, reply, state);
  }

  /**
   * The whole pattern: start a response, run `body(ctx)`, and
   * - if the coordinator stops the response first (superseded or cancelled
   *   by any gateway, shut down, expired, gone): abort `ctx.signal`, send no
   *   Finish, and return `{ kind: "stopped" }` at once (the body's promise is
   *   left to settle on its own; its result is ignored, never unhandled);
   * - otherwise report Finish exactly once when the body settles: COMPLETED
   *   when it resolves, FAILED when it rejects.
   * Aborting `options.signal` releases the response (nothing is sent, as a
   * dropped Rust handle) and rejects with CancelledError.
   */
  async run<T>(source: Source, body: (ctx: ResponseContext) => Promise<T> | T, options: StartOptions = {}): Promise<RunOutcome<T>> {
    const response = await this.start(source, options);
    const responseId = response.id;
    const ctx: ResponseContext = {
      responseId,
      signal: response.signal,
      isCurrent: () => response.isCurrent(),
      fence: () => response.fence(),
      stopped: () => response.stopped(),
    };
    type Settled = { kind: "value"; value: T } | { kind: "error"; error: unknown } | { kind: "stopped" } | { kind: "aborted" };
    const bodyDone: Promise<Settled> = new Promise<T>((resolve) => {
      resolve(body(ctx));
    }).then(
      (value) => ({ kind: "value", value }),
      (error: unknown) => ({ kind: "error", error }),
    );
    const callerSignal = options.signal;
    let onAbort: (() => void) | undefined;
    const aborted = new Promise<Settled>((resolve) => {
      if (callerSignal === undefined) return;
      onAbort = () => {
        resolve({ kind: "aborted" });
      };
      if (callerSignal.aborted) onAbort();
      else callerSignal.addEventListener("abort", onAbort, { once: true });
    });
    const settled = await Promise.race([
      response.stopped().then((): Settled => ({ kind: "stopped" })),
      bodyDone,
      aborted,
    ]);
    if (onAbort !== undefined) callerSignal?.removeEventListener("abort", onAbort);
    // A stop already seen when the body settled wins: the coordinator has ended the response.
    if (settled.kind === "stopped" || !response.isCurrent()) {
      return { kind: "stopped", responseId, reason: response.stopReason() ?? "gone" };
    }
    if (settled.kind === "aborted") {
      response.release();
      throw abortError(callerSignal as AbortSignal);
    }
    const finished = await response
      .finish(settled.kind === "value" ? "completed" : "failed")
      .catch((error: unknown): FinishFailed => ({ kind: "error", error: toRespcoordError(error) }));
    return settled.kind === "value"
      ? { kind: "completed", responseId, value: settled.value, finished }
      : { kind: "failed", responseId, error: settled.error, finished };
  }

  /**
   * Cancels the live response, or only `ifResponseId`. Returns the cancelled
   * id, undefined if nothing was cancelled. Retried only with `ifResponseId`
   * (a blind retry could cancel a response started in between).
   */
  async cancel(options: CancelOptions = {}): Promise<bigint | undefined> {
    const source = sourceToWire(validateSource(options.source ?? "client"));
    const ifResponseId = options.ifResponseId === undefined ? 0n : validateResponseId("if_response_id", options.ifResponseId);
    const reply = await this.client.call(
      (raw) => raw.cancel.bind(raw),
      { sessionId: this.id, source, ifResponseId },
      ifResponseId !== 0n,
      options.signal,
    );
    return reply.cancelledResponseId === 0n ? undefined : reply.cancelledResponseId;
  }

  /**
   * Tears the session down (idempotent): nothing starts on it afterwards. Returns the cancelled id. `source`
   * (default `"client"`) is recorded as who cancelled the live response.
   */
  async shutdown(options: CallSignal & { readonly source?: Source } = {}): Promise<bigint | undefined> {
    const source = sourceToWire(validateSource(options.source ?? "client"));
    const reply = await this.client.call(
      (raw) => raw.shutdown.bind(raw),
      { sessionId: this.id, source },
      true,
      options.signal,
    );
    return reply.cancelledResponseId === 0n ? undefined : reply.cancelledResponseId;
  }

  state(options: CallSignal = {}): Promise<SessionState> {
    return this.client.getState(this.id, options);
  }
}

/**
 * A started response. Finish it with `finish()` (at most once). Releasing it
 * unfinished (`release()`, `using`) sends nothing: the coordinator keeps it
 * live until it is superseded, cancelled or expires; its fence fails closed.
 */
export class Response {
  readonly session: Session;
  /** The response id: the fencing token (uint64, beyond a number's 2^53). */
  readonly id: bigint;
  /** The response this Start superseded, if any. */
  readonly superseded: bigint | undefined;
  /** True if the Start was answered as a replay of an earlier attempt. */
  readonly replayed: boolean;
  /** The session's state in the Start reply. */
  readonly startState: SessionState;
  readonly #liveness: Liveness;
  #finishCalled = false;

  /** @internal use session.start() */
  constructor(session: Session, liveness: Liveness, reply: pb.StartResponse, state: SessionState) {
    this.session = session;
    this.#liveness = liveness;
    this.id = liveness.id;
    this.superseded = reply.supersededResponseId === 0n ? undefined : reply.supersededResponseId;
    this.replayed = reply.replayed;
    this.startState = state;
  }

  /** The fence check: false once the coordinator stopped it, or it was finished or released. */
  isCurrent(): boolean {
    return this.#liveness.isCurrent();
  }

  /** A fence for the output path (audio sink, conversation append, tool calls). */
  fence(): Fence {
    const liveness = this.#liveness;
    return {
      id: liveness.id,
      isCurrent: () => liveness.isCurrent(),
      stopReason: () => liveness.reason,
    };
  }

  /** Aborted (reason: ResponseStoppedError) when the response stops. */
  get signal(): AbortSignal {
    return this.#liveness.signal;
  }

  stopReason(): StopReason | undefined {
    return this.#liveness.reason;
  }

  /** Resolves (never rejects) with why, once the response stops. */
  stopped(): Promise<StopReason> {
    return this.#liveness.stopped;
  }

  /**
   * Reports this response's own terminal, unless the coordinator already
   * stopped it (then nothing is sent: `not_sent`). The fence closes first,
   * so no output follows a Finish. A second call rejects with
   * AlreadyFinishedError.
   */
  async finish(terminal: Terminal, options: CallSignal = {}): Promise<FinishResult> {
    if (!isTerminal(terminal)) throw new InvalidArgumentError("terminal", "must be completed or failed");
    if (this.#finishCalled) throw new AlreadyFinishedError(`response ${this.id} was already finished`);
    this.#finishCalled = true;
    if (!this.#liveness.stop("finished")) return { kind: "not_sent", reason: this.#liveness.reason ?? "gone" };
    const reply = await this.session.client.call(
      (raw) => raw.finish.bind(raw),
      { sessionId: this.session.id, responseId: this.id, status: terminalToWire(terminal) },
      true,
      options.signal,
    );
    const state = stateFromWire(reply.state);
    return reply.applied ? { kind: "applied", state } : { kind: "stale", state };
  }

  /** Cancels this response (only if it is still the live one). True if the coordinator cancelled it. */
  async cancel(options: CallSignal & { readonly source?: Source } = {}): Promise<boolean> {
    const cancelled = await this.session.cancel({ ...options, ifResponseId: this.id });
    return cancelled === this.id;
  }

  /** Lets go of the handle without Finish: nothing is sent; the fence fails closed (`released`). */
  release(): void {
    this.#liveness.stop("released");
  }

  [Symbol.dispose](): void {
    this.release();
  }
}
