// The fencing table: per tracked session, which of this client's responses
// are known to be no longer live. Pure (no I/O): the session watches
// (watch.ts) feed it events and re-read states, and carry out the one effect
// it asks for, opening or closing a session's watch. This is
// clients/rust/src/fencing.rs in TypeScript.
//
// The table. Per tracked session the client keeps `deadThrough`: every
// response id of the session up to it is known to be no longer live. Each
// event and each re-read state only ever RAISES it, or stops registered
// responses, with a fact that is true whenever it is applied:
//
//   started(y)                       -> raise to y - 1  (at most one live response, ids increase)
//   cancel_requested(x), ended(x)    -> raise to x      (x is done)
//   terminated                       -> stop every registered response (nothing of this session
//                                       lives after teardown, and none starts)
//   state Active(z)                  -> raise to z - 1  (as started(z))
//   state Idle or Terminated         -> stop every response registered before the read was sent
//                                       (the read saw their Starts, and none of them is live)
//   NOT_FOUND, or a lower revision   -> stop every response registered before the read was sent,
//   than the watch had reached          as gone (the session they belong to no longer exists)
//
// Because every update is a max of true facts or stops responses the read
// already covered, replaying events, or applying a state read while events
// arrive, is harmless: that is what makes resume simple.
//
// Which sessions are watched. A session's events reach this client only
// while it has a live response there: `register` asks for the session's
// watch when the first one registers (from the Start reply's revision, so a
// stop that lands between the reply and the watch is replayed), and the
// watch is closed when the last one stops or is released.
//
// No missed stop. A response registers right after its Start reply, and its
// session's watch replays from the reply's revision, so every event after
// the Start passes through `apply`. A response registered after its stop was
// already applied finds `id <= deadThrough` and is stopped at once.
import { stopReasonFromCancel, type StopReason } from "./enums.js";
import { ResponseStoppedError } from "./errors.js";
import * as pb from "./gen/respcoord/v1/coordinator.js";

/** One started response's liveness, shared by its handle, its fences and the watch. Once stopped, it stays stopped. */
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

/** A live response of this client, with when it registered. */
interface Registered {
  readonly liveness: Liveness;
  /** The client-wide registration ticket (`Tracks.ticket`). */
  readonly ticket: number;
}

interface Track {
  /** Session handles' references holding this track (a Start in flight, a live response). */
  refs: number;
  deadThrough: bigint;
  /** Why `deadThrough` last rose (for responses registered late). */
  reason: StopReason;
  /** Live responses of this client in this session (usually one). */
  responses: Registered[];
  /** The session's watch, open while `responses` is not empty: aborting it closes the watch. */
  watch: AbortController | undefined;
}

/** x - 1, or 0 for 0 (response ids are at least 1). */
function below(x: bigint): bigint {
  return x > 0n ? x - 1n : 0n;
}

function closeWatchWhenIdle(track: Track): void {
  if (track.responses.length === 0 && track.watch !== undefined) {
    track.watch.abort();
    track.watch = undefined;
  }
}

/** Stops the registered responses `which` selects, raising `deadThrough` over them. */
function stopWhere(track: Track, reason: StopReason, which: (registered: Registered) => boolean): void {
  let highest: bigint | undefined;
  const kept: Registered[] = [];
  for (const registered of track.responses) {
    if (which(registered)) {
      registered.liveness.stop(reason);
      if (highest === undefined || registered.liveness.id > highest) highest = registered.liveness.id;
    } else {
      kept.push(registered);
    }
  }
  track.responses = kept;
  if (highest !== undefined && highest > track.deadThrough) {
    track.deadThrough = highest;
    track.reason = reason;
  }
  closeWatchWhenIdle(track);
}

function raise(track: Track, through: bigint, reason: StopReason): void {
  if (through > track.deadThrough) {
    track.deadThrough = through;
    track.reason = reason;
  }
  stopWhere(track, reason, (r) => r.liveness.id <= through);
}

/** What the caller of `Tracks.register` must do: open the session's watch, closed when `stop` aborts. */
export interface WatchOrder {
  readonly session: string;
  /** Watch with `after_revision` = this. */
  readonly afterRevision: bigint;
  /**
   * The response whose `started` event must come first (at `afterRevision + 1`):
   * proof that the watch follows the session the Start was applied to, not one
   * recreated since.
   */
  readonly expectStarted: bigint | undefined;
  readonly stop: AbortSignal;
}

/** Keeps a session tracked until released (idempotent). */
export interface TrackRef {
  readonly session: string;
  release(): void;
}

/** The sessions this client tracks, shared by the handles and the watches. */
export class Tracks {
  readonly #map = new Map<string, Track>();
  #tickets = 0;

  track(session: string): TrackRef {
    let track = this.#map.get(session);
    if (track === undefined) {
      track = { refs: 0, deadThrough: 0n, reason: "gone", responses: [], watch: undefined };
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
        if (current.refs === 0) {
          current.watch?.abort();
          current.watch = undefined;
          this.#map.delete(session);
        }
      },
    };
  }

  /**
   * Adds a started response whose Start reply carried `revision`; stops it at
   * once if a watch already saw its end. Returns the watch to open when the
   * session has none. `fresh`: the reply was not a replay, so the response's
   * `started` event is at `revision`.
   */
  register(ref: TrackRef, response: Liveness, revision: bigint, fresh: boolean): WatchOrder | undefined {
    const track = this.#map.get(ref.session);
    if (track === undefined) return undefined;
    if (response.id <= track.deadThrough) {
      response.stop(track.reason);
      return undefined;
    }
    if (!response.isCurrent()) return undefined;
    this.#tickets += 1;
    track.responses.push({ liveness: response, ticket: this.#tickets });
    if (track.watch !== undefined) return undefined;
    const stop = new AbortController();
    track.watch = stop;
    return {
      session: ref.session,
      afterRevision: fresh ? below(revision) : revision,
      expectStarted: fresh ? response.id : undefined,
      stop: stop.signal,
    };
  }

  unregister(ref: TrackRef, response: Liveness): void {
    const track = this.#map.get(ref.session);
    if (track === undefined) return;
    track.responses = track.responses.filter((r) => r.liveness !== response);
    closeWatchWhenIdle(track);
  }

  /** Every response registered so far has a ticket at or below this: take it before sending a read, and the read's answer covers them. */
  ticket(): number {
    return this.#tickets;
  }

  /** Applies one WatchResponse's events. */
  apply(events: readonly pb.LifecycleEvent[]): void {
    for (const event of events) {
      const track = this.#map.get(event.sessionId);
      if (track === undefined || event.kind === undefined) continue;
      const kind = event.kind;
      switch (kind.$case) {
        case "started":
          raise(track, below(kind.value.responseId), "superseded");
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
          stopWhere(track, stopReasonFromCancel(kind.value.reason), () => true);
          break;
      }
    }
  }

  /** Applies a state read (GetState) of `session` sent when `ticket()` was `ticket`. */
  applyState(session: string, state: pb.SessionState, ticket: number): void {
    const track = this.#map.get(session);
    if (track === undefined) return;
    const read = (r: Registered): boolean => r.ticket <= ticket;
    switch (state.phase) {
      case pb.Phase.PHASE_ACTIVE: {
        const active = state.activeResponseId;
        raise(track, below(active), "superseded");
        stopWhere(track, "gone", (r) => read(r) && r.liveness.id !== active);
        break;
      }
      case pb.Phase.PHASE_TERMINATED:
        stopWhere(track, "shutdown", read);
        break;
      default:
        stopWhere(track, "gone", read);
    }
  }

  /** The session was not found (or was recreated) by a read sent at `ticket`: the responses it covered belong to a session that is gone. */
  applyGone(session: string, ticket: number): void {
    const track = this.#map.get(session);
    if (track !== undefined) stopWhere(track, "gone", (r) => r.ticket <= ticket);
  }

  /** Stops every tracked response and closes every watch (the client is closing: nothing can learn about stops any more). */
  releaseAll(): void {
    for (const track of this.#map.values()) {
      for (const registered of track.responses) registered.liveness.stop("released");
      track.responses = [];
      closeWatchWhenIdle(track);
    }
  }

  deadThrough(session: string): bigint | undefined {
    return this.#map.get(session)?.deadThrough;
  }

  /** Whether the session's watch is open (asked for and not closed). */
  watched(session: string): boolean {
    return this.#map.get(session)?.watch !== undefined;
  }

  get size(): number {
    return this.#map.size;
  }
}
