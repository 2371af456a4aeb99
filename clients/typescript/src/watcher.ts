// The shared watch: one watch-all stream per client that stops every
// response the coordinator cancels or supersedes, whichever gateway asked.
//
// Fencing state. Per tracked session the client keeps one number,
// `deadThrough`: every response id of the session up to it is known to be
// no longer live. Each event and each re-listed state only ever RAISES it
// with a fact that is true whenever it is applied:
//
//   started(y)                         -> y - 1   (at most one live response, ids increase)
//   cancel_requested(x), ended(x)      -> x       (x is done)
//   terminated at seq q                -> q       (a later session with this id mints ids above q)
//   listed Active(z)                   -> z - 1   (as started(z))
//   listed Idle/Terminated, page seq q -> q       (every event up to q is reflected, none is live)
//   not listed (list began at seq q)   -> q       (anything it had up to q is gone)
//
// Because every update is a max of true facts, replaying events or applying
// them in another order than a listing is harmless: that is what makes
// resume and re-list simple. This is src/client/watcher.rs, in TypeScript.
//
// No missed stop: a session is tracked before its Start is sent, and the
// stream is positioned before that (Client.ensureWatcher), so every event of
// the Start's response passes through `apply` after the track exists. A
// response registered after its stop was already applied finds
// `id <= deadThrough` and is stopped on registration.
import type { ClientReadableStream, ServiceError } from "@grpc/grpc-js";
import { status as GrpcStatus } from "@grpc/grpc-js";

import { stopReasonFromCancel, type StopReason } from "./enums.js";
import { ResponseStoppedError } from "./errors.js";
import * as pb from "./gen/respcoord/v1/coordinator.js";
import { backoffMs, sleep, type RetryPolicy } from "./retry.js";

/** One started response's liveness, shared by its handle, its fences and the watch. */
export class Liveness {
  readonly id: bigint;
  readonly #controller = new AbortController();
  #reason: StopReason | undefined;
  readonly #stopped: Promise<StopReason>;
  #resolve!: (reason: StopReason) => void;

  constructor(id: bigint) {
    this.id = id;
    this.#stopped = new Promise((resolve) => {
      this.#resolve = resolve;
    });
  }

  /** Stops it (the first reason wins). True if this call stopped it. */
  stop(reason: StopReason): boolean {
    if (this.#reason !== undefined) return false;
    this.#reason = reason;
    this.#resolve(reason);
    this.#controller.abort(new ResponseStoppedError(this.id, reason));
    return true;
  }

  /** The fence check: one field read. */
  isCurrent(): boolean {
    return this.#reason === undefined;
  }

  get reason(): StopReason | undefined {
    return this.#reason;
  }

  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  /** Resolves (never rejects) with the reason once stopped. */
  get stopped(): Promise<StopReason> {
    return this.#stopped;
  }
}

interface Track {
  refs: number;
  deadThrough: bigint;
  /** Why `deadThrough` last rose (for responses registered late). */
  reason: StopReason;
  /** Live responses of this client in this session (usually one). */
  readonly responses: Set<Liveness>;
  /** The re-list epoch when the track was made: a re-list that began earlier cannot judge it absent. */
  readonly epoch: number;
}

function raise(track: Track, through: bigint, reason: StopReason): void {
  if (through > track.deadThrough) {
    track.deadThrough = through;
    track.reason = reason;
  }
  for (const response of track.responses) {
    if (response.id <= through) {
      response.stop(reason);
      track.responses.delete(response);
    }
  }
}

/** Keeps a session tracked until released (idempotent). */
export interface TrackRef {
  readonly session: string;
  release(): void;
}

/** The sessions this client tracks, shared by the handles and the watch. */
export class Tracks {
  readonly #map = new Map<string, Track>();
  #epoch = 0;

  track(session: string): TrackRef {
    let track = this.#map.get(session);
    if (track === undefined) {
      track = { refs: 0, deadThrough: 0n, reason: "gone", responses: new Set(), epoch: this.#epoch };
      this.#map.set(session, track);
    }
    track.refs += 1;
    let released = false;
    return {
      session,
      release: () => {
        if (released) return;
        released = true;
        const current = this.#map.get(session);
        if (current === undefined) return;
        current.refs -= 1;
        if (current.refs === 0) this.#map.delete(session);
      },
    };
  }

  /** Adds a started response; stops it at once if the watch already saw its end. */
  register(ref: TrackRef, response: Liveness): void {
    const track = this.#map.get(ref.session);
    if (track === undefined) return;
    if (response.id <= track.deadThrough) response.stop(track.reason);
    else if (response.isCurrent()) track.responses.add(response);
  }

  unregister(ref: TrackRef, response: Liveness): void {
    this.#map.get(ref.session)?.responses.delete(response);
  }

  /** Applies one WatchResponse's events; returns the highest seq seen. */
  apply(events: readonly pb.LifecycleEvent[]): bigint {
    let high = 0n;
    for (const event of events) {
      if (event.seq > high) high = event.seq;
      const track = this.#map.get(event.sessionId);
      if (track === undefined || event.kind === undefined) continue;
      const kind = event.kind;
      switch (kind.$case) {
        case "started":
          raise(track, kind.value.responseId - 1n, "superseded");
          break;
        case "cancelRequested":
          raise(track, kind.value.responseId, stopReasonFromCancel(kind.value.reason));
          break;
        case "ended":
          raise(
            track,
            kind.value.responseId,
            kind.value.status === pb.TerminalStatus.TERMINAL_STATUS_CANCELLED
              ? stopReasonFromCancel(kind.value.reason)
              : "ended",
          );
          break;
        case "terminated":
          raise(track, event.seq, stopReasonFromCancel(kind.value.reason));
          break;
      }
    }
    return high;
  }

  applyListed(pageSeq: bigint, states: readonly pb.SessionState[], seen: Set<string>): void {
    for (const state of states) {
      const track = this.#map.get(state.sessionId);
      if (track === undefined) continue;
      seen.add(state.sessionId);
      switch (state.phase) {
        case pb.Phase.PHASE_ACTIVE:
          raise(track, state.activeResponseId - 1n, "superseded");
          break;
        case pb.Phase.PHASE_TERMINATED:
          raise(track, pageSeq, "shutdown");
          break;
        default:
          raise(track, pageSeq, "gone");
      }
    }
  }

  applyAbsent(listEpoch: number, firstSeq: bigint, seen: ReadonlySet<string>): void {
    for (const [session, track] of this.#map) {
      if (track.epoch < listEpoch && !seen.has(session)) raise(track, firstSeq, "gone");
    }
  }

  beginRelist(): number {
    this.#epoch += 1;
    return this.#epoch;
  }

  /** Stops every tracked response (the client is closing: nothing can learn about stops any more). */
  releaseAll(): void {
    for (const track of this.#map.values()) {
      for (const response of track.responses) response.stop("released");
      track.responses.clear();
    }
  }

  deadThrough(session: string): bigint | undefined {
    return this.#map.get(session)?.deadThrough;
  }

  get size(): number {
    return this.#map.size;
  }
}

/** How the shared watch is doing. */
export interface WatchStatus {
  /** A stream is open. */
  readonly connected: boolean;
  /** The seq it would resume after. */
  readonly position: bigint;
  /** Streams opened after the first one. */
  readonly reconnects: number;
  /** Re-lists after OUT_OF_RANGE. */
  readonly relists: number;
}

/** What the watch needs from the client's second connection. */
export interface WatchTransport {
  openWatch(afterSeq: bigint): ClientReadableStream<pb.WatchResponse>;
  /** One ListSessions page, under the retry policy. */
  listPage(pageToken: string, signal: AbortSignal): Promise<pb.ListSessionsResponse>;
}

type Ended = { kind: "out_of_range" } | { kind: "broken"; progressed: boolean; error: ServiceError | undefined };

/** The running watch: follow, resume after a break, re-list after OUT_OF_RANGE; until stopped. */
export class Watcher {
  readonly #transport: WatchTransport;
  readonly #tracks: Tracks;
  readonly #retry: RetryPolicy;
  readonly #stop = new AbortController();
  #position: bigint;
  #connected = false;
  #opened = 0;
  #relists = 0;
  #stream: ClientReadableStream<pb.WatchResponse> | undefined;
  /** The last error the stream or a re-list ended with, for diagnostics. */
  lastError: unknown;
  readonly done: Promise<void>;

  constructor(transport: WatchTransport, tracks: Tracks, retry: RetryPolicy, position: bigint) {
    this.#transport = transport;
    this.#tracks = tracks;
    this.#retry = retry;
    this.#position = position;
    // The loop catches everything itself; the catch only makes that certain.
    this.done = this.#run().catch((error: unknown) => {
      this.lastError = error;
    });
  }

  status(): WatchStatus {
    return {
      connected: this.#connected,
      position: this.#position,
      reconnects: Math.max(this.#opened - 1, 0),
      relists: this.#relists,
    };
  }

  stop(): void {
    this.#stop.abort();
    this.#stream?.cancel();
  }

  #stopping(): boolean {
    return this.#stop.signal.aborted;
  }

  async #run(): Promise<void> {
    let failures = 0;
    const stop = this.#stop.signal;
    for (;;) {
      if (this.#stopping()) return;
      const ended = await this.#follow();
      this.#connected = false;
      if (this.#stopping()) return;
      if (ended.kind === "out_of_range") {
        try {
          await this.#relist();
          failures = 0;
          continue;
        } catch (error) {
          this.lastError = error;
        }
      } else {
        if (ended.progressed) failures = 0;
        if (ended.error !== undefined) this.lastError = ended.error;
      }
      failures += 1;
      await sleep(backoffMs(this.#retry, failures), stop);
    }
  }

  /** Opens a watch-all from the position and applies it until it ends. */
  #follow(): Promise<Ended> {
    return new Promise((resolve) => {
      let progressed = false;
      let settled = false;
      const finish = (ended: Ended): void => {
        if (settled) return;
        settled = true;
        this.#stream = undefined;
        resolve(ended);
      };
      const stream = this.#transport.openWatch(this.#position);
      this.#stream = stream;
      // grpc-js has no "stream open" event; the response headers are the first sign.
      stream.on("metadata", () => {
        this.#opened += 1;
        this.#connected = true;
      });
      // Applied synchronously as it arrives: no queue between the socket and the tracks.
      stream.on("data", (message: pb.WatchResponse) => {
        progressed = true;
        let high = this.#tracks.apply(message.events);
        if (message.progressSeq > high) high = message.progressSeq;
        if (high > this.#position) this.#position = high;
      });
      stream.on("error", (error: ServiceError) => {
        if (error.code === GrpcStatus.OUT_OF_RANGE) finish({ kind: "out_of_range" });
        else finish({ kind: "broken", progressed, error });
      });
      stream.on("end", () => {
        finish({ kind: "broken", progressed, error: undefined });
      });
    });
  }

  /** Lists every session, raises the tracked ones, and moves the position to the first page's seq. */
  async #relist(): Promise<void> {
    this.#relists += 1;
    const epoch = this.#tracks.beginRelist();
    const seen = new Set<string>();
    let firstSeq: bigint | undefined;
    let pageToken = "";
    for (;;) {
      const page = await this.#transport.listPage(pageToken, this.#stop.signal);
      firstSeq ??= page.seq;
      this.#tracks.applyListed(page.seq, page.sessions, seen);
      if (page.nextPageToken === "") break;
      pageToken = page.nextPageToken;
    }
    this.#tracks.applyAbsent(epoch, firstSeq, seen);
    this.#position = firstSeq;
  }
}
