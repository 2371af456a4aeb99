// Session watches: one Watch stream per session where this client has a live
// response, or that the gateway opened ahead, or whose linger after its last
// response is not over; opened when the fencing table asks (fencing.ts) and
// closed when it says so. The linger's timer lives here (`Linger`), not in
// the table. A gateway's cost follows its own sessions, not the deployment's
// traffic. This is clients/rust/src/watch.rs in TypeScript.
//
// One stream's life:
// - Opened for a Start with `after_revision` just below the Start reply's
//   revision, so the first event is the response's own `started`: proof that
//   the stream follows the session the Start was applied to. Anything else
//   first (the session was recreated since, say after a coordinator
//   restart), or nothing within an attempt timeout, sends it to a state read.
// - Opened ahead (`session.openWatch()`): the session's state is read first
//   and applied, as on a resume, and the stream follows from its revision
//   (from 0 when the session does not exist yet). No proof is expected.
// - Every event goes through `Tracks.apply` as it arrives (no queue between
//   the socket and the table); the position is the highest revision seen.
// - After `terminated` the stream ends and so does the watch.
// - Broken (transport, server shutdown, fell behind) or OUT_OF_RANGE: the
//   session's state is read (GetState) before the stream is reopened, from
//   the state's revision. A session not found, or at a revision below the
//   position (recreated), means the responses the read covered are gone; so
//   does any state that no longer has them active.
//
// Connections: streams share a small pool of channels of their own (not the
// calls' channel), at most STREAMS_PER_CONNECTION each: the server allows
// 1024 concurrent streams per connection by default, and a gateway with
// thousands of calls must not queue watches behind that limit.
import { NotFoundError } from "./errors.js";
import type { Effects, IdleNotice, Tracks, WatchOrder } from "./fencing.js";
import * as pb from "./gen/respcoord/v1/coordinator.js";
import { backoffMs, sleep, type RetryPolicy } from "./retry.js";

/** Watch streams one pooled connection carries at most. */
export const STREAMS_PER_CONNECTION = 500;

/** An open Watch stream as grpc-js gives it (a ClientReadableStream), reduced to what a session watch uses. */
export interface WatchStream {
  /** `metadata`: the response headers came, the stream is established; `end`: it ended with OK. */
  on(event: "metadata" | "end", listener: () => void): unknown;
  on(event: "data", listener: (message: pb.WatchResponse) => void): unknown;
  on(event: "error", listener: (error: Error) => void): unknown;
  cancel(): void;
}

/**
 * What a session watch needs from the wire: the seam that lets the watch's
 * reactions be tested against a scripted server.
 */
export interface WatchTransport {
  /** Watch(session_id, after_revision). */
  openWatch(sessionId: string, afterRevision: bigint): WatchStream;
  /**
   * GetState under the client's retry policy. Rejects with the mapped error
   * (NotFoundError for NOT_FOUND), or CancelledError once `signal` aborts.
   */
  getState(sessionId: string, signal: AbortSignal): Promise<pb.SessionState>;
}

/** How this client's session watches are doing. */
export interface WatchStatus {
  /** Session watches running now: one per session with a live response, opened ahead, or lingering. */
  readonly open: number;
  /** Watch streams opened so far, reopenings included. */
  readonly opened: number;
  /** Streams reopened after a break, OUT_OF_RANGE or a failed check. */
  readonly reconnects: number;
  /** Session states read (GetState) to resume a watch, or to begin one opened ahead. */
  readonly rereads: number;
  /** Connections in the watch pool. */
  readonly connections: number;
}

/** @internal The counters behind WatchStatus, shared by the watches. */
export interface Cells {
  open: number;
  opened: number;
  reconnects: number;
  rereads: number;
}

export function newCells(): Cells {
  return { open: 0, opened: 0, reconnects: 0, rereads: 0 };
}

/** How one stream ended. */
type Ended =
  /** The watch's stop fired. */
  | { readonly kind: "stopped" }
  /** After `terminated`: the session will emit nothing more. */
  | { readonly kind: "over" }
  /** Read the state before reopening. `progressed`: the stream delivered something first. */
  | { readonly kind: "reread"; readonly progressed: boolean; readonly error: unknown };

/** Whether `events` begin with `started(response)` at `revision`. */
function startsWith(events: readonly pb.LifecycleEvent[], response: bigint, revision: bigint): boolean {
  const first = events[0];
  return (
    first !== undefined &&
    first.revision === revision &&
    first.kind?.$case === "started" &&
    first.kind.value.responseId === response
  );
}

/** Default linger of a session's watch after its last response (`watchLingerMs`). */
export const DEFAULT_WATCH_LINGER_MS = 30_000;

/**
 * Waits out a session watch's linger after its last response, then hands the
 * notice back to the table (which closes the watch unless the session was
 * used again meanwhile). One timer a session, unref'd: a lingering watch does
 * not keep an idle process alive.
 */
export class Linger {
  readonly #tracks: Tracks;
  readonly #ms: number;
  readonly #timers = new Map<string, NodeJS.Timeout>();
  #closed = false;

  constructor(tracks: Tracks, ms: number) {
    this.#tracks = tracks;
    this.#ms = ms;
  }

  /** Whether watches close with their last response (linger 0): nothing is opened ahead. */
  get off(): boolean {
    return this.#ms === 0;
  }

  /** Begins the linger a notice asks for (a later notice of the session replaces it); with linger 0, it is over at once. */
  begin(notice: IdleNotice | undefined): void {
    if (notice === undefined || this.#closed) return;
    if (this.#ms === 0) {
      this.#tracks.lingerOver(notice);
      return;
    }
    const session = notice.session;
    clearTimeout(this.#timers.get(session));
    const timer = setTimeout(() => {
      if (this.#timers.get(session) === timer) this.#timers.delete(session);
      this.#tracks.lingerOver(notice);
    }, this.#ms);
    timer.unref();
    this.#timers.set(session, timer);
  }

  /** Clears every timer (the client is closing; the table closes the watches). */
  close(): void {
    this.#closed = true;
    for (const timer of this.#timers.values()) clearTimeout(timer);
    this.#timers.clear();
  }
}

export interface SessionWatchOptions {
  readonly transport: WatchTransport;
  readonly tracks: Tracks;
  readonly linger: Linger;
  readonly retry: RetryPolicy;
  readonly cells: Cells;
  readonly order: WatchOrder;
}

/** One session's watch: follows, reads the state and reopens, until its order's stop fires or the session ends. */
export class SessionWatch {
  readonly #transport: WatchTransport;
  readonly #tracks: Tracks;
  readonly #linger: Linger;
  readonly #retry: RetryPolicy;
  readonly #cells: Cells;
  readonly #session: string;
  readonly #stop: AbortSignal;
  /** The highest revision applied. */
  #position: bigint;
  /** The response whose `started` must come first on the first stream. */
  #expectStarted: bigint | undefined;
  /** Opened ahead of any Start: the first stream starts from a state read. */
  readonly #readFirst: boolean;
  /** The last error a stream or a state read ended with, for diagnostics. */
  lastError: unknown;

  constructor(options: SessionWatchOptions) {
    this.#transport = options.transport;
    this.#tracks = options.tracks;
    this.#linger = options.linger;
    this.#retry = options.retry;
    this.#cells = options.cells;
    this.#session = options.order.session;
    this.#stop = options.order.stop;
    this.#position = options.order.afterRevision ?? 0n;
    this.#readFirst = options.order.afterRevision === undefined;
    this.#expectStarted = options.order.expectStarted;
  }

  /** Runs until the stop fires or the session ends. Never rejects. */
  async run(): Promise<void> {
    const counter = { failures: 0 };
    if (this.#readFirst && !(await this.#readUntilAnswered(counter))) return;
    for (;;) {
      const ended = await this.#follow();
      if (ended.kind !== "reread" || this.#stopping()) return;
      if (ended.progressed) counter.failures = 0;
      if (ended.error !== undefined) this.lastError = ended.error;
      if (!(await this.#readUntilAnswered(counter))) return;
      if (!ended.progressed) {
        counter.failures += 1;
        await sleep(backoffMs(this.#retry, counter.failures), this.#stop);
      }
      if (this.#stopping()) return;
      this.#cells.reconnects += 1;
    }
  }

  /** Reads the session's state until a read is answered, setting the position to watch from. False once stopped. */
  async #readUntilAnswered(counter: { failures: number }): Promise<boolean> {
    for (;;) {
      if (this.#stopping()) return false;
      try {
        await this.#reread();
        return !this.#stopping();
      } catch (error) {
        this.lastError = error;
        if (this.#stopping()) return false;
        counter.failures += 1;
        await sleep(backoffMs(this.#retry, counter.failures), this.#stop);
      }
    }
  }

  #stopping(): boolean {
    return this.#stop.aborted;
  }

  /** Opens the session's watch from the position and applies it until it ends. */
  #follow(): Promise<Ended> {
    return new Promise((resolve) => {
      const stop = this.#stop;
      if (stop.aborted) {
        resolve({ kind: "stopped" });
        return;
      }
      let stream: WatchStream | undefined;
      let settled = false;
      let established = false;
      let progressed = false;
      let proof: NodeJS.Timeout | undefined;
      const finish = (ended: Ended, cancel: boolean): void => {
        if (settled) return;
        settled = true;
        clearTimeout(proof);
        stop.removeEventListener("abort", onStop);
        if (cancel) stream?.cancel();
        resolve(ended);
      };
      const onStop = (): void => {
        finish({ kind: "stopped" }, true);
      };
      const establish = (): void => {
        if (established) return;
        established = true;
        this.#cells.opened += 1;
        // The proof must come at once: it is replayed history.
        if (this.#expectStarted !== undefined) {
          proof = setTimeout(() => {
            this.#expectStarted = undefined;
            finish({ kind: "reread", progressed, error: undefined }, true);
          }, this.#retry.attemptTimeoutMs);
        }
      };
      try {
        stream = this.#transport.openWatch(this.#session, this.#position);
      } catch (error) {
        finish({ kind: "reread", progressed: false, error }, false);
        return;
      }
      stop.addEventListener("abort", onStop, { once: true });
      // grpc-js has no "stream open" event; the response headers are the first sign.
      stream.on("metadata", () => {
        if (!settled) establish();
      });
      stream.on("data", (message: pb.WatchResponse) => {
        if (settled) return;
        establish();
        const expected = this.#expectStarted;
        if (expected !== undefined) {
          this.#expectStarted = undefined;
          clearTimeout(proof);
          if (!startsWith(message.events, expected, this.#position + 1n)) {
            // Not the session the Start was applied to.
            finish({ kind: "reread", progressed, error: undefined }, true);
            return;
          }
        }
        progressed = true;
        const notices = this.#tracks.apply(message.events);
        for (const notice of notices) this.#linger.begin(notice);
        for (const event of message.events) {
          if (event.revision > this.#position) this.#position = event.revision;
          if (event.kind?.$case === "terminated") {
            finish({ kind: "over" }, true);
            return;
          }
        }
      });
      stream.on("error", (error: Error) => {
        finish({ kind: "reread", progressed, error }, false);
      });
      stream.on("end", () => {
        finish({ kind: "reread", progressed, error: undefined }, false);
      });
    });
  }

  /** GetState, applied to the fencing table; moves the position to where the next stream starts. */
  async #reread(): Promise<void> {
    this.#cells.rereads += 1;
    // The state read stands in for the proof of the Start from here on.
    this.#expectStarted = undefined;
    const ticket = this.#tracks.ticket();
    let state: pb.SessionState;
    try {
      state = await this.#transport.getState(this.#session, this.#stop);
    } catch (error) {
      if (!(error instanceof NotFoundError)) throw error;
      // Stopped while the read was answered: the table has moved on.
      if (this.#stopping()) return;
      this.#linger.begin(this.#tracks.applyGone(this.#session, ticket));
      // Responses registered after the read (a session this client created
      // anew), or a watch opened ahead, keep the watch open: from the new
      // session's first event.
      this.#position = 0n;
      return;
    }
    if (this.#stopping()) return;
    if (state.revision < this.#position) {
      // Revisions start again at 1 when a session is recreated: this is not
      // the session we watched.
      this.#linger.begin(this.#tracks.applyGone(this.#session, ticket));
    }
    this.#linger.begin(this.#tracks.applyState(this.#session, state, ticket));
    this.#position = state.revision;
  }
}

/** A pooled watch connection: the transport its watches use, and how to close it. */
export interface WatchChannel {
  readonly transport: WatchTransport;
  close(): void;
}

interface Slot {
  readonly channel: WatchChannel;
  streams: number;
}

export interface WatchesOptions {
  /** How long a session's watch stays open after its last response (default DEFAULT_WATCH_LINGER_MS; 0: closes with it). */
  readonly lingerMs?: number;
  /** Streams one pooled connection carries at most (default STREAMS_PER_CONNECTION; for tests). */
  readonly streamsPerConnection?: number;
}

/** Runs session watches on a pool of connections, and waits out their lingers. */
export class Watches {
  readonly #connect: () => WatchChannel;
  readonly #tracks: Tracks;
  readonly #retry: RetryPolicy;
  readonly #linger: Linger;
  readonly #streamsPerConnection: number;
  readonly #slots: Slot[] = [];
  readonly #cells = newCells();
  readonly #running = new Set<Promise<void>>();

  /** `connect` makes one more pooled connection. */
  constructor(connect: () => WatchChannel, tracks: Tracks, retry: RetryPolicy, options: WatchesOptions = {}) {
    this.#connect = connect;
    this.#tracks = tracks;
    this.#retry = retry;
    this.#linger = new Linger(tracks, options.lingerMs ?? DEFAULT_WATCH_LINGER_MS);
    this.#streamsPerConnection = options.streamsPerConnection ?? STREAMS_PER_CONNECTION;
  }

  /** The lingers of this pool's watches. */
  get linger(): Linger {
    return this.#linger;
  }

  /** Carries out what the table asked for: a watch to open, a linger to begin. */
  carryOut(effects: Effects): void {
    if (effects.order !== undefined) this.open(effects.order);
    this.#linger.begin(effects.idle);
  }

  status(): WatchStatus {
    return { ...this.#cells, connections: this.#slots.length };
  }

  /** Carries out a WatchOrder: the watch runs until the order's stop fires or the session ends. */
  open(order: WatchOrder): void {
    const slot = this.#acquire();
    this.#cells.open += 1;
    const watch = new SessionWatch({
      transport: slot.channel.transport,
      tracks: this.#tracks,
      linger: this.#linger,
      retry: this.#retry,
      cells: this.#cells,
      order,
    });
    const running = watch.run().finally(() => {
      this.#cells.open -= 1;
      slot.streams -= 1;
      this.#running.delete(running);
    });
    this.#running.add(running);
  }

  /** Settles once every watch running now has ended. */
  done(): Promise<void> {
    return Promise.all(this.#running).then(() => undefined);
  }

  /** Clears the lingers' timers and closes every pooled connection (the watches are stopped by the table). */
  close(): void {
    this.#linger.close();
    for (const slot of this.#slots) slot.channel.close();
  }

  /** The first pooled connection with room, or a new one. */
  #acquire(): Slot {
    let slot = this.#slots.find((s) => s.streams < this.#streamsPerConnection);
    if (slot === undefined) {
      slot = { channel: this.#connect(), streams: 0 };
      this.#slots.push(slot);
    }
    slot.streams += 1;
    return slot;
  }
}
