package respcoord

import "fmt"

// ResponseID identifies one response attempt, as LocalAI's realtime session
// mints it: fresh and increasing for every Start, never reused. The
// coordinator server mints ids of its own (fencing tokens); the Coordinator
// maps between the two, so callers keep minting theirs exactly as before.
//
// ID 0 is reserved: LocalAI's sessions count from 1, and State reports a
// response that another process runs as Active{ID: 0}, because such a
// response has no id of this process's. A Start with ID 0 is refused.
type ResponseID uint64

// Source records which path of the gateway drove an event. It is carried to
// the server for observability only and never changes a decision.
type Source int

const (
	// SourceClient is the client read loop: response.create or a manual
	// input_audio_buffer.commit.
	SourceClient Source = iota
	// SourceVAD is turn detection: end of speech or a barge-in.
	SourceVAD
)

func (s Source) String() string {
	switch s {
	case SourceClient:
		return "client"
	case SourceVAD:
		return "vad"
	default:
		return fmt.Sprintf("Source(%d)", int(s))
	}
}

// Status is the terminal status an EmitTerminal reports (response.done).
type Status int

const (
	// StatusCompleted: the response finished on its own (its Finished was
	// the one the coordinator applied).
	StatusCompleted Status = iota
	// StatusCancelled: the response was cut short, by a barge-in, an explicit
	// cancel, a newer response (in this process or another), or the end of
	// the session.
	StatusCancelled
)

func (s Status) String() string {
	switch s {
	case StatusCompleted:
		return "completed"
	case StatusCancelled:
		return "cancelled"
	default:
		return fmt.Sprintf("Status(%d)", int(s))
	}
}

// State is the sealed sum type of coordinator states: Idle | Active |
// Terminated. Only this package can implement it, so no caller can fabricate
// a fourth state.
type State interface {
	isState()
	String() string
}

// Idle: no response is live, as far as this coordinator knows.
type Idle struct{}

// Active: one response is live. ID is this process's id for it, or 0 when
// the live response was started by another process on the same session (it
// has no id here; see the package documentation).
type Active struct{ ID ResponseID }

// Terminated: the session is over (Shutdown here or in another process, or
// idle expiry on the server). Absorbing: nothing starts afterwards.
type Terminated struct{}

func (Idle) isState()       {}
func (Active) isState()     {}
func (Terminated) isState() {}

func (Idle) String() string       { return "Idle" }
func (a Active) String() string   { return fmt.Sprintf("Active(%d)", a.ID) }
func (Terminated) String() string { return "Terminated" }

// Event is the sealed sum type of inputs: Start | Finished | Cancel |
// Shutdown.
type Event interface {
	isEvent()
	String() string
}

// Start asks for a new response with a fresh caller-minted ID. It supersedes
// whatever response is live in the session, in whichever process it runs.
type Start struct {
	ID     ResponseID
	Source Source
}

// Finished reports that the response body for ID returned on its own. It is
// ignored unless ID is this process's live response: a stale, unknown or not
// yet started id changes nothing.
type Finished struct{ ID ResponseID }

// Cancel stops the session's live response, whichever process runs it. It is
// a no-op when nothing is live.
type Cancel struct{ Source Source }

// Shutdown ends the session for every process: the live response is
// cancelled and no response starts afterwards.
type Shutdown struct{}

func (Start) isEvent()    {}
func (Finished) isEvent() {}
func (Cancel) isEvent()   {}
func (Shutdown) isEvent() {}

func (e Start) String() string    { return fmt.Sprintf("Start(%d,%s)", e.ID, e.Source) }
func (e Finished) String() string { return fmt.Sprintf("Finished(%d)", e.ID) }
func (e Cancel) String() string   { return fmt.Sprintf("Cancel(%s)", e.Source) }
func (Shutdown) String() string   { return "Shutdown" }

// Effect is the sealed sum type of what the coordinator asks the sink to do:
// CancelResponse | StartResponse | EmitTerminal. Returning effects as data,
// rather than calling back into the session, keeps the decision separate from
// the I/O that carries it out.
type Effect interface {
	isEffect()
	String() string
}

// CancelResponse: cancel the context of the running response ID.
type CancelResponse struct{ ID ResponseID }

// StartResponse: spawn the response body for ID.
type StartResponse struct{ ID ResponseID }

// EmitTerminal: send response.done for ID with Status. Exactly one per
// StartResponse.
type EmitTerminal struct {
	ID     ResponseID
	Status Status
}

func (CancelResponse) isEffect() {}
func (StartResponse) isEffect()  {}
func (EmitTerminal) isEffect()   {}

func (e CancelResponse) String() string { return fmt.Sprintf("CancelResponse(%d)", e.ID) }
func (e StartResponse) String() string  { return fmt.Sprintf("StartResponse(%d)", e.ID) }
func (e EmitTerminal) String() string {
	return fmt.Sprintf("EmitTerminal(%d,%s)", e.ID, e.Status)
}

// EffectSink performs effects. Perform is called with the coordinator's
// effect lock held, from Apply or, for a stop decided elsewhere, from the
// respcoord client's session watch goroutine (the response's stop hook), so
// it must not block and must not call Apply or State on the same coordinator
// (LocalAI's contract, unchanged; State takes the same lock in both), nor
// close the respcoord client (Close delivers the stops of the responses it
// releases on its own goroutine, which waits for that lock): spawn a
// goroutine, call a cancel func, or make a non-blocking send. ServerID is
// safe to call from Perform. A Perform that blocks also holds up the
// session's watch in this process.
//
// It is a plain interface rather than LocalAI's alias of its generic
// coordinator.Sink[Effect]; both have the single method Perform(Effect), so
// any sink written for one satisfies the other.
type EffectSink interface {
	Perform(Effect)
}
