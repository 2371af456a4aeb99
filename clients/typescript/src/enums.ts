// The public enums: string unions, each with a same-named object of its
// values (`Source.Vad === "vad"`), and the one place they map to and from
// the wire's numbers.
import * as pb from "./gen/respcoord/v1/coordinator.js";

/** Which gateway path asked. Recorded by the coordinator for observability only. */
export const Source = { Client: "client", Vad: "vad" } as const;
export type Source = (typeof Source)[keyof typeof Source];

/** The terminal a gateway reports for its own response. */
export const Terminal = { Completed: "completed", Failed: "failed" } as const;
export type Terminal = (typeof Terminal)[keyof typeof Terminal];

/** A session's phase (machine M3). `terminated` is absorbing. */
export const Phase = { Idle: "idle", Active: "active", Terminated: "terminated" } as const;
export type Phase = (typeof Phase)[keyof typeof Phase];

/** Why a response stopped being current. */
export const StopReason = {
  /** A newer Start on the session replaced it (from any gateway). */
  Superseded: "superseded",
  /** A Cancel call cancelled it. */
  Cancelled: "cancelled",
  /** The session was shut down. */
  Shutdown: "shutdown",
  /** The session expired (no call for the idle TTL). */
  Expired: "expired",
  /** A Finish for this id sent by someone else (another holder of the id, an operator). */
  Ended: "ended",
  /**
   * The coordinator no longer has it live and the watch could not see how it
   * ended: found by the state read (GetState) a session watch makes before it
   * reopens, e.g. NOT_FOUND after a restart of an in-memory coordinator.
   */
  Gone: "gone",
  /** Local: this handle reported Finish. */
  Finished: "finished",
  /** Local: the handle was released (or the client closed) without Finish. */
  Released: "released",
} as const;
export type StopReason = (typeof StopReason)[keyof typeof StopReason];

/** What became of a Finish. */
export const Finished = {
  /** The coordinator ended the response with this terminal. */
  Applied: "applied",
  /**
   * The response was no longer active when the Finish arrived: nothing
   * changed. After a retried Finish this may be our own earlier attempt.
   */
  Stale: "stale",
  /** Not sent: the coordinator had already stopped the response. */
  NotSent: "not_sent",
} as const;
export type Finished = (typeof Finished)[keyof typeof Finished];

const sources: readonly Source[] = Object.values(Source);
const terminals: readonly Terminal[] = Object.values(Terminal);

export function isSource(value: unknown): value is Source {
  return sources.includes(value as Source);
}

export function isTerminal(value: unknown): value is Terminal {
  return terminals.includes(value as Terminal);
}

export function sourceToWire(source: Source): pb.Source {
  return source === "vad" ? pb.Source.SOURCE_VAD : pb.Source.SOURCE_CLIENT;
}

export function sourceFromWire(source: pb.Source): Source | undefined {
  switch (source) {
    case pb.Source.SOURCE_CLIENT:
      return "client";
    case pb.Source.SOURCE_VAD:
      return "vad";
    default:
      return undefined;
  }
}

export function terminalToWire(terminal: Terminal): pb.TerminalStatus {
  return terminal === "failed" ? pb.TerminalStatus.TERMINAL_STATUS_FAILED : pb.TerminalStatus.TERMINAL_STATUS_COMPLETED;
}

export function phaseFromWire(phase: pb.Phase): Phase {
  switch (phase) {
    case pb.Phase.PHASE_ACTIVE:
      return "active";
    case pb.Phase.PHASE_TERMINATED:
      return "terminated";
    default:
      return "idle";
  }
}

/** The wire's cancel reason as a stop reason; UNSPECIFIED (never sent for a cancel) is `gone`. */
export function stopReasonFromCancel(reason: pb.CancelReason): StopReason {
  switch (reason) {
    case pb.CancelReason.CANCEL_REASON_SUPERSEDED:
      return "superseded";
    case pb.CancelReason.CANCEL_REASON_REQUESTED:
      return "cancelled";
    case pb.CancelReason.CANCEL_REASON_SHUTDOWN:
      return "shutdown";
    case pb.CancelReason.CANCEL_REASON_EXPIRED:
      return "expired";
    default:
      return "gone";
  }
}

/** A session's state as the coordinator reported it. */
export interface SessionState {
  readonly sessionId: string;
  readonly phase: Phase;
  /** The active response, undefined unless `phase` is `active`. */
  readonly responseId: bigint | undefined;
  /** The active response's source, undefined unless `phase` is `active`. */
  readonly activeSource: Source | undefined;
  /** Revision of the session's last event; 0n if it has none. */
  readonly revision: bigint;
  readonly responsesStarted: bigint;
}

export function stateFromWire(state: pb.SessionState | undefined): SessionState {
  const s = state ?? pb.SessionState.create();
  return {
    sessionId: s.sessionId,
    phase: phaseFromWire(s.phase),
    responseId: s.activeResponseId === 0n ? undefined : s.activeResponseId,
    activeSource: sourceFromWire(s.activeSource),
    revision: s.revision,
    responsesStarted: s.responsesStarted,
  };
}
