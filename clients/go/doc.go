// Package respcoord is the Go client of respcoord, the authoritative response
// coordinator for realtime voice/LLM gateways: per session at most one live
// response, exactly one terminal per started response, nothing started after
// shutdown, every change streamed to watchers (machine M3, proto/CONTRACT.md).
//
// It gives a Go gateway the same guarantees as the Rust, Python and
// TypeScript clients (clients/scenarios pins them):
//
//   - [Connect] dials a coordinator with a bearer token, TLS or mutual TLS and
//     a [RetryPolicy]; a [Client] is safe for concurrent use and closed with
//     [Client.Close].
//   - [Client.Session] names a session; [Session.Start] starts a response,
//     superseding the session's live one wherever it runs. Start is retried
//     safely: every Start carries a request id (generated when not given), so
//     a retry after a lost reply is answered as a replay, never a second
//     response.
//   - [Session.Run] is the whole pattern: start, run the body with a context
//     that is cancelled the moment the coordinator stops the response (a
//     newer Start from any gateway, a Cancel, a Shutdown, expiry), and report
//     exactly one Finish when the body returns on its own, none when it was
//     stopped.
//   - [Response.IsCurrent] and [Fence.IsCurrent] are the fence: check one before
//     emitting each piece of output (audio frame, conversation append, tool
//     call) and drop it when it is false.
//
// How stops are learned: while this client has a live response on a session,
// it holds one Watch stream on that session, and keeps it open for a linger
// after the last one ends ([WithWatchLinger], 30 s by default), so the
// session's next Start reuses it with no Watch call. A session's first Start
// opens it from the Start reply's revision, so that a stop landing between
// the reply and the watch is replayed, never missed; [Session.OpenWatch]
// opens it ahead, when a gateway begins serving a session, so that even the
// first Start finds it open. The streams share a small pool of connections of
// their own (at most [StreamsPerConnection] streams each), separate from the
// connection that carries calls. A broken stream re-reads the session's
// state (GetState) before reopening, so a stop is learned even across a
// coordinator restart.
//
// Errors are values: every error from a call is an [*Error] carrying its gRPC
// code and, as its cause, the gRPC status (so status.FromError works); test
// them with errors.Is against [ErrNotFound], [ErrSessionTerminated], ... or
// errors.As into [*Error]. The generated stubs are in the respcoordv1
// package.
//
// # Layout
//
//   - client.go: Connect, its options, Client, the retried unary call.
//   - session.go: Session, Response, Fence, Run.
//   - fencing.go: the fencing table, pure: which of this client's responses
//     are known to be stopped, fed events and state reads; which sessions
//     are watched (it hands out watch orders and idle notices, never reads a
//     clock).
//   - watch.go: the session watches that feed the table, on a pool of
//     connections.
//   - retry.go: RetryPolicy and the retry class of every status code.
//   - errors.go: Error, the sentinels, the one mapping from status codes.
//   - ids.go: the id rules (clients/scenarios/rules.json).
//   - types.go: Source, Phase, Terminal, StopReason, SessionState, results.
package respcoord
