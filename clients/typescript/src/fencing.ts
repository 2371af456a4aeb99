// The fencing table: per tracked session, which of this client's responses
// are known to be no longer live. Pure (no I/O, no clock, no timers): the
// session watches (watch.ts) feed it events and re-read states, and carry out
// what it asks for: open a session's watch, or wait out a watch's linger and
// hand the notice back. This is clients/rust/src/fencing.rs in TypeScript.
//
// The table. Per tracked session the client keeps `deadThrough`: every
// response id of the session up to it is known to be no longer live. Each
// event and each re-read state only ever RAISES it, or stops registered
// responses, with a fact that is true whenever it is applied:
//
//   started(y)                       -> raise to y - 1  (at most one live response, ids increase)
//   cancel_requested(x), ended(x)    -> raise to x      (x is done)
//   terminated                       -> stop every registered response (nothing of this session
//                                       lives after teardown, and none starts); the watch is over
//   state Active(z)                  -> raise to z - 1  (as started(z))
//   state Idle or Terminated         -> stop every response the read covered (none of them is live)
//   NOT_FOUND, or a lower revision   -> stop every response registered before the read was sent,
//   than the watch had reached          as gone (the session they belong to no longer exists)
//
// A read covers the responses registered before it was sent (a client-wide
// ticket) and those whose Start reply's revision it reached (a Start answered
// after the read was sent but registered before its answer). The last read
// applied while the watch lives is kept (`read`): a response registering
// later whose Start reply's revision it reached was judged by it too.
//
// Because every update is a max of true facts or stops responses the read
// already covered, replaying events, or applying a state read while events
// arrive, is harmless: that is what makes resume simple.
//
// Which sessions are watched. A session's watch opens when its first
// response registers (from the Start reply's revision, so a stop that lands
// between the reply and the watch is replayed) or when the gateway opens it
// ahead (`openWatch`: from a state read). It stays open while a response is
// registered; when the last one goes, the table does not close it but hands
// the shell an idle notice `(session, generation)`. The shell waits out the
// linger and calls `lingerOver`: unless a response registered or the watch
// was opened ahead since (the generation moved), the watch closes, and the
// track goes if no handle holds it. A Start inside the linger reuses the open
// watch: no Watch call. The table never reads a clock.
//
// No missed stop. A response registers right after its Start reply; its
// session's watch either replays from the reply's revision or was already
// open before the Start, so every event after the Start passes through
// `apply`. A response registered after its stop was already applied finds
// `id <= deadThrough`, or a kept read that judged it, and is stopped at once.
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
  /** The revision its Start reply carried: a state read at or past it judged the response. */
  readonly revision: bigint;
}

/** The last state read applied while the current watch lives: a true fact about the session at `revision`. */
interface Read {
  readonly revision: bigint;
  readonly phase: pb.Phase;
  readonly activeResponseId: bigint;
}

interface Track {
  readonly session: string;
  /** Session handles' references holding this track (a Start in flight, a live response). */
  refs: number;
  deadThrough: bigint;
  /** Why `deadThrough` last rose (for responses registered late). */
  reason: StopReason;
  /** Live responses of this client in this session (usually one). */
  responses: Registered[];
  /**
   * The session's watch: open while `responses` is not empty, opened ahead,
   * or lingering after the last response. Aborting it closes the watch.
   */
  watch: AbortController | undefined;
  /** Moved by every registration and every open-ahead: a linger that began before either is stale. */
  generation: number;
  read: Read | undefined;
}

/** x - 1, or 0 for 0 (response ids are at least 1). */
function below(x: bigint): bigint {
  return x > 0n ? x - 1n : 0n;
}

/** Stops the registered responses `which` selects, raising `deadThrough` over them. Whether the track became idle. */
function stopWhere(track: Track, reason: StopReason, which: (registered: Registered) => boolean): boolean {
  const before = track.responses.length;
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
  return before > 0 && kept.length === 0;
}

function raise(track: Track, through: bigint, reason: StopReason): boolean {
  if (through > track.deadThrough) {
    track.deadThrough = through;
    track.reason = reason;
  }
  return stopWhere(track, reason, (r) => r.liveness.id <= through);
}

/** The session emits nothing more on this watch (terminated), or the linger is over: it ends. */
function endWatch(track: Track): void {
  track.watch?.abort();
  track.watch = undefined;
  track.read = undefined;
}

/** A session whose last response ended while its watch is open: wait out the linger, then call `Tracks.lingerOver`. */
export interface IdleNotice {
  readonly session: string;
  readonly generation: number;
}

/** The notice for a track that just lost its last live response while its watch is open. */
function idleNotice(track: Track, emptied: boolean): IdleNotice | undefined {
  return emptied && track.watch !== undefined ? { session: track.session, generation: track.generation } : undefined;
}

/** What the caller of `Tracks.register` or `Tracks.openWatch` must do: open the session's watch, closed when `stop` aborts. */
export interface WatchOrder {
  readonly session: string;
  /**
   * Watch with `after_revision` = this; undefined: read the session's state
   * first (GetState) and watch from its revision, or from 0 if it is not
   * found (a watch opened ahead).
   */
  readonly afterRevision: bigint | undefined;
  /**
   * The response whose `started` event must come first (at `afterRevision + 1`):
   * proof that the watch follows the session the Start was applied to, not one
   * recreated since.
   */
  readonly expectStarted: bigint | undefined;
  readonly stop: AbortSignal;
}

/** What the shell must carry out after a registration or an open-ahead. */
export interface Effects {
  /** A watch to open. */
  readonly order: WatchOrder | undefined;
  /** A linger to begin. */
  readonly idle: IdleNotice | undefined;
}

/** Keeps a session tracked until released (idempotent). */
export interface TrackRef {
  readonly session: string;
  release(): void;
}

function newTrack(session: string): Track {
  return {
    session,
    refs: 0,
    deadThrough: 0n,
    reason: "gone",
    responses: [],
    watch: undefined,
    generation: 0,
    read: undefined,
  };
}

/** The sessions this client tracks, shared by the handles and the watches. */
export class Tracks {
  readonly #map = new Map<string, Track>();
  #tickets = 0;
  /** Generations are client-wide, so a notice from a track since forgotten never matches a new one of its session. */
  #generations = 0;

  track(session: string): TrackRef {
    let track = this.#map.get(session);
    if (track === undefined) {
      track = newTrack(session);
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
        // A lingering watch keeps the track (and what it knows) until the linger is over.
        this.#forgetIfUnheld(session);
      },
    };
  }

  /**
   * Adds a started response whose Start reply carried `revision`; stops it at
   * once if a watch or a kept read already saw its end. Asks for the watch to
   * open when the session has none (an open one, lingering or opened ahead,
   * is reused), or for a linger to begin again when the response was stopped
   * at once on an idle watched session. `fresh`: the reply was not a replay,
   * so the response's `started` event is at `revision`.
   */
  register(ref: TrackRef, response: Liveness, revision: bigint, fresh: boolean): Effects {
    const track = this.#map.get(ref.session);
    if (track === undefined) return { order: undefined, idle: undefined };
    this.#generations += 1;
    track.generation = this.#generations;
    // Not registered: the linger (if the watch is open and idle) begins again from this registration.
    const refused = (): Effects => ({ order: undefined, idle: idleNotice(track, track.responses.length === 0) });
    if (response.id <= track.deadThrough) {
      response.stop(track.reason);
      return refused();
    }
    const read = track.read;
    if (
      read !== undefined &&
      revision <= read.revision &&
      !(read.phase === pb.Phase.PHASE_ACTIVE && read.activeResponseId === response.id)
    ) {
      // The read already covered this Start and does not show the response live.
      response.stop("gone");
      return refused();
    }
    if (!response.isCurrent()) return refused();
    this.#tickets += 1;
    track.responses.push({ liveness: response, ticket: this.#tickets, revision });
    if (track.watch !== undefined) return { order: undefined, idle: undefined };
    const stop = new AbortController();
    track.watch = stop;
    track.read = undefined;
    return {
      order: {
        session: ref.session,
        afterRevision: fresh ? below(revision) : revision,
        expectStarted: fresh ? response.id : undefined,
        stop: stop.signal,
      },
      idle: undefined,
    };
  }

  /**
   * The gateway serves this session: its watch opens now (from a state read)
   * if it is not open, and lingers from now if no response is registered. The
   * session need not exist yet, nor be held by a handle.
   */
  openWatch(session: string): Effects {
    let track = this.#map.get(session);
    if (track === undefined) {
      track = newTrack(session);
      this.#map.set(session, track);
    }
    this.#generations += 1;
    track.generation = this.#generations;
    let order: WatchOrder | undefined;
    if (track.watch === undefined) {
      const stop = new AbortController();
      track.watch = stop;
      track.read = undefined;
      order = { session, afterRevision: undefined, expectStarted: undefined, stop: stop.signal };
    }
    const idle = track.responses.length === 0 ? { session, generation: track.generation } : undefined;
    return { order, idle };
  }

  /** A response finished, released or stopped: no longer registered. The notice when its session became idle. */
  unregister(ref: TrackRef, response: Liveness): IdleNotice | undefined {
    const track = this.#map.get(ref.session);
    if (track === undefined) return undefined;
    const before = track.responses.length;
    track.responses = track.responses.filter((r) => r.liveness !== response);
    return idleNotice(track, before > 0 && track.responses.length === 0);
  }

  /**
   * The linger that `notice` began is over: the watch closes unless a
   * response registered or the watch was opened ahead since (or one is still
   * registered); the track goes when no handle holds it.
   */
  lingerOver(notice: IdleNotice): void {
    const track = this.#map.get(notice.session);
    if (track === undefined || track.generation !== notice.generation || track.responses.length > 0) return;
    endWatch(track);
    this.#forgetIfUnheld(notice.session);
  }

  /** Every response registered so far has a ticket at or below this: take it before sending a read, and the read's answer covers them. */
  ticket(): number {
    return this.#tickets;
  }

  /** Applies one WatchResponse's events. Returns the notices of the sessions they left idle. */
  apply(events: readonly pb.LifecycleEvent[]): IdleNotice[] {
    const notices: IdleNotice[] = [];
    for (const event of events) {
      const track = this.#map.get(event.sessionId);
      if (track === undefined || event.kind === undefined) continue;
      const kind = event.kind;
      let emptied = false;
      switch (kind.$case) {
        case "started":
          emptied = raise(track, below(kind.value.responseId), "superseded");
          break;
        case "cancelRequested":
          emptied = raise(track, kind.value.responseId, stopReasonFromCancel(kind.value.reason));
          break;
        case "ended":
          emptied = raise(
            track,
            kind.value.responseId,
            kind.value.status === pb.TerminalStatus.TERMINAL_STATUS_CANCELLED
              ? stopReasonFromCancel(kind.value.reason)
              : "ended",
          );
          break;
        case "terminated":
          stopWhere(track, stopReasonFromCancel(kind.value.reason), () => true);
          endWatch(track);
          this.#forgetIfUnheld(event.sessionId);
          break;
      }
      const notice = idleNotice(track, emptied);
      if (notice !== undefined) notices.push(notice);
    }
    return notices;
  }

  /**
   * Applies a state read (GetState) of `session` sent when `ticket()` was
   * `ticket`. It judged every response registered before it was sent, and
   * every one whose Start reply's revision it reached. Returns the notice
   * when it left the session idle.
   */
  applyState(session: string, state: pb.SessionState, ticket: number): IdleNotice | undefined {
    const track = this.#map.get(session);
    if (track === undefined) return undefined;
    const covered = (r: Registered): boolean => r.ticket <= ticket || r.revision <= state.revision;
    let emptied: boolean;
    switch (state.phase) {
      case pb.Phase.PHASE_ACTIVE: {
        const active = state.activeResponseId;
        const superseded = raise(track, below(active), "superseded");
        emptied = stopWhere(track, "gone", (r) => covered(r) && r.liveness.id !== active) || superseded;
        break;
      }
      case pb.Phase.PHASE_TERMINATED:
        // Nothing more will happen on this session: what is still registered
        // belongs to no live session either, and the watch is over.
        stopWhere(track, "shutdown", () => true);
        endWatch(track);
        this.#forgetIfUnheld(session);
        return undefined;
      default:
        emptied = stopWhere(track, "gone", covered);
    }
    track.read = { revision: state.revision, phase: state.phase, activeResponseId: state.activeResponseId };
    return idleNotice(track, emptied);
  }

  /**
   * The session was not found (or was recreated) by a read sent at `ticket`:
   * the responses it covered belong to a session that is gone. Revisions of
   * a gone session judge nothing (covered: the ticket rule only).
   */
  applyGone(session: string, ticket: number): IdleNotice | undefined {
    const track = this.#map.get(session);
    if (track === undefined) return undefined;
    const emptied = stopWhere(track, "gone", (r) => r.ticket <= ticket);
    track.read = undefined;
    return idleNotice(track, emptied);
  }

  /** Stops every tracked response and closes every watch (the client is closing: nothing can learn about stops any more). */
  releaseAll(): void {
    for (const track of this.#map.values()) {
      for (const registered of track.responses) registered.liveness.stop("released");
      track.responses = [];
      endWatch(track);
    }
    for (const session of [...this.#map.keys()]) this.#forgetIfUnheld(session);
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

  /** Drops a track that no handle holds and no watch keeps. */
  #forgetIfUnheld(session: string): void {
    const track = this.#map.get(session);
    if (track !== undefined && track.refs === 0 && track.watch === undefined) this.#map.delete(session);
  }
}
