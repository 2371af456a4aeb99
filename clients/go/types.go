package respcoord

import (
	"strconv"

	pb "github.com/respcoord/respcoord/clients/go/respcoordv1"
)

// Source is which gateway path asked. The coordinator records it for
// observability only: it never changes a transition.
type Source int32

const (
	// SourceUnspecified is accepted by Start and Cancel, and recorded as such.
	SourceUnspecified Source = 0
	// SourceClient: the client read loop (response.create, a manual commit).
	SourceClient Source = 1
	// SourceVAD: voice-activity detection (end of speech, barge-in).
	SourceVAD Source = 2
)

func (s Source) String() string {
	switch s {
	case SourceClient:
		return "client"
	case SourceVAD:
		return "vad"
	case SourceUnspecified:
		return "unspecified"
	default:
		return "Source(" + strconv.FormatInt(int64(s), 10) + ")"
	}
}

func (s Source) valid() bool { return s >= SourceUnspecified && s <= SourceVAD }

func (s Source) wire() pb.Source { return pb.Source(s) }

// Phase is a session's phase in machine M3. PhaseTerminated is absorbing.
type Phase int32

const (
	// PhaseIdle: no live response.
	PhaseIdle Phase = 1
	// PhaseActive: one live response, SessionState.ResponseID.
	PhaseActive Phase = 2
	// PhaseTerminated: shut down or expired; nothing starts any more.
	PhaseTerminated Phase = 3
)

func (p Phase) String() string {
	switch p {
	case PhaseIdle:
		return "idle"
	case PhaseActive:
		return "active"
	case PhaseTerminated:
		return "terminated"
	default:
		return "Phase(" + strconv.FormatInt(int64(p), 10) + ")"
	}
}

// Terminal is the end a gateway reports for its own response.
type Terminal int32

const (
	// TerminalCompleted: the response ran to its end.
	TerminalCompleted Terminal = 1
	// TerminalFailed: the response failed (model error, tool error).
	TerminalFailed Terminal = 3
)

func (t Terminal) String() string {
	switch t {
	case TerminalCompleted:
		return "completed"
	case TerminalFailed:
		return "failed"
	default:
		return "Terminal(" + strconv.FormatInt(int64(t), 10) + ")"
	}
}

// StopReason says why a response stopped being current. The names are those
// of clients/scenarios/rules.json ("stop_reasons"); the empty StopReason
// means it has not stopped.
type StopReason string

const (
	// StopSuperseded: a newer Start on the session replaced it (from any gateway).
	StopSuperseded StopReason = "superseded"
	// StopCancelled: a Cancel call cancelled it.
	StopCancelled StopReason = "cancelled"
	// StopShutdown: the session was shut down.
	StopShutdown StopReason = "shutdown"
	// StopExpired: the session expired (no call for the idle TTL).
	StopExpired StopReason = "expired"
	// StopEnded: a Finish for this id sent by someone else (another holder
	// of the id, an operator).
	StopEnded StopReason = "ended"
	// StopGone: the coordinator no longer has it live and the watch could
	// not see how it ended: found by the state read a session watch makes
	// before it reopens (e.g. NOT_FOUND after an in-memory coordinator restarted).
	StopGone StopReason = "gone"
	// StopFinished (local): this handle reported Finish.
	StopFinished StopReason = "finished"
	// StopReleased (local): the handle was released, or the client closed,
	// without Finish; nothing can learn about its stop any more.
	StopReleased StopReason = "released"
)

// StopReasonFromCancel is the stop reason a wire CancelReason means
// (rules.json "from_cancel_reason"); UNSPECIFIED, never sent for a cancel, is
// StopGone.
func StopReasonFromCancel(reason pb.CancelReason) StopReason {
	switch reason {
	case pb.CancelReason_CANCEL_REASON_SUPERSEDED:
		return StopSuperseded
	case pb.CancelReason_CANCEL_REASON_REQUESTED:
		return StopCancelled
	case pb.CancelReason_CANCEL_REASON_SHUTDOWN:
		return StopShutdown
	case pb.CancelReason_CANCEL_REASON_EXPIRED:
		return StopExpired
	default:
		return StopGone
	}
}

// SessionState is a session's state as the coordinator reported it.
type SessionState struct {
	SessionID string
	Phase     Phase
	// ResponseID is the active response, 0 unless Phase is PhaseActive.
	ResponseID uint64
	// ActiveSource is the active response's source, SourceUnspecified
	// unless Phase is PhaseActive.
	ActiveSource Source
	// Revision of the session's last event; 0 if it has none.
	Revision         uint64
	ResponsesStarted uint64
}

func stateFromWire(s *pb.SessionState) SessionState {
	phase := Phase(s.GetPhase())
	if phase != PhaseActive && phase != PhaseTerminated {
		phase = PhaseIdle
	}
	return SessionState{
		SessionID:        s.GetSessionId(),
		Phase:            phase,
		ResponseID:       s.GetActiveResponseId(),
		ActiveSource:     Source(s.GetActiveSource()),
		Revision:         s.GetRevision(),
		ResponsesStarted: s.GetResponsesStarted(),
	}
}

// FinishOutcome is what became of a Finish.
type FinishOutcome int

const (
	// FinishApplied: the coordinator ended the response with this terminal.
	FinishApplied FinishOutcome = iota + 1
	// FinishStale: the response was no longer active when the Finish
	// arrived; nothing changed. After a retried Finish this may be the
	// answer to our own earlier attempt, which applied.
	FinishStale
	// FinishNotSent: not sent, because the coordinator had already stopped
	// the response (FinishResult.Reason says how).
	FinishNotSent
)

func (f FinishOutcome) String() string {
	switch f {
	case FinishApplied:
		return "applied"
	case FinishStale:
		return "stale"
	case FinishNotSent:
		return "not_sent"
	default:
		return "FinishOutcome(" + strconv.FormatInt(int64(f), 10) + ")"
	}
}

// FinishResult is what became of a Finish that was sent, or why it was not.
type FinishResult struct {
	Outcome FinishOutcome
	// State is the session's state in the reply (Applied and Stale).
	State SessionState
	// Reason is why it was not sent (NotSent).
	Reason StopReason
}

// CancelResult is what a Cancel, CancelIf or Shutdown did.
type CancelResult struct {
	// CancelledID is the response it cancelled, 0 if none: nothing was
	// live, CancelIf's response was not the live one, or the session was
	// already terminated.
	CancelledID uint64
	// State is the session's state in the reply: PhaseTerminated after a
	// Shutdown, and after a Cancel or CancelIf on a session already shut
	// down or expired (which cancels nothing and is not an error).
	State SessionState
}

// RunKind is how Session.Run ended.
type RunKind int

const (
	// RunCompleted: the body returned nil while the response was current;
	// Finish(COMPLETED) was attempted (RunResult.Finish, FinishErr).
	RunCompleted RunKind = iota + 1
	// RunFailed: the body returned an error while the response was current;
	// Finish(FAILED) was attempted.
	RunFailed
	// RunStopped: the coordinator stopped the response (RunResult.Reason)
	// before the body returned; no Finish was sent.
	RunStopped
)

func (k RunKind) String() string {
	switch k {
	case RunCompleted:
		return "completed"
	case RunFailed:
		return "failed"
	case RunStopped:
		return "stopped"
	default:
		return "RunKind(" + strconv.FormatInt(int64(k), 10) + ")"
	}
}

// RunResult is how Session.Run ended.
type RunResult struct {
	Kind       RunKind
	ResponseID uint64
	// Reason is why the response stopped (RunStopped).
	Reason StopReason
	// BodyErr is the body's error (RunFailed).
	BodyErr error
	// Finish is what became of the Finish (RunCompleted, RunFailed), unless
	// FinishErr is set: then the Finish call failed after its retries and
	// whether it applied is unknown.
	Finish    FinishResult
	FinishErr error
}
