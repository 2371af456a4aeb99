// Package respcoord is a drop-in for LocalAI's in-process response
// coordinator (core/http/endpoints/openai/respcoord, machine M3): the same
// exported names and signatures (ResponseID, Source, Status, the State, Event
// and Effect sum types, EffectSink, Next, New, Coordinator with Apply and
// State), plus NewShared, which makes a Coordinator whose decisions are the
// respcoord server's, shared by every process that names the same session.
//
// A LocalAI realtime session switches by changing one import and one
// constructor call:
//
//	import respcoord "github.com/respcoord/respcoord/clients/go/localai"
//
//	s.coord = respcoord.NewShared(client, sessionID, s)   // was respcoord.New(s)
//
// Everything else (the sink, the Apply calls, the effects it handles) stays
// as it is. docs/localai.md in the repository walks through the switch.
//
// # What holds, now across processes
//
//   - Effects are performed in order and never two at once for one
//     Coordinator, whether they come from Apply or from a stop decided
//     elsewhere; the sink's contract is LocalAI's (Perform must not block and
//     must not call Apply).
//   - A Start that supersedes this process's own response performs
//     CancelResponse(old), EmitTerminal(old, cancelled), StartResponse(new),
//     in that order with nothing between them, before Apply returns. (When
//     the supersede reached this process's watch before the Start's reply, the
//     first two may be performed by the stop hook on the client's watch
//     goroutine, still before Apply returns and before StartResponse.)
//   - A stop decided elsewhere (another process's Start, a Cancel from any
//     process, a Shutdown, idle expiry on the server) reaches the sink as
//     CancelResponse then EmitTerminal(cancelled) for this process's
//     response, performed by the response's stop hook (the client's
//     Response.OnStop) on the goroutine of the session watch the client
//     keeps for it, with no goroutine in between.
//   - Exactly one EmitTerminal per StartResponse; no StartResponse after
//     Terminated. A Start whose response another process superseded or
//     cancelled before this process handled the server's reply performs
//     StartResponse, CancelResponse, EmitTerminal(cancelled) at once, as
//     LocalAI's machine does for a Start followed by another Start; one
//     whose session ended meanwhile is absorbed (no effects, Terminated).
//   - A Finished for an id that is not this process's live response (stale,
//     unknown, another process's, not yet minted) is ignored without a call
//     to the server.
//
// # Ids
//
// LocalAI mints a ResponseID per Start; the server mints its own (fencing
// tokens). The Coordinator keeps the pair: effects always carry the caller's
// id, ServerID gives the server's for logs. A response another process
// started has no id in this process: State reports it as Active{ID: 0}, so
// ID 0 is reserved and a Start with ID 0 is refused (ErrZeroID). LocalAI's
// sessions count from 1.
//
// # State
//
// State is answered from what this process knows, with no call: Active{ID}
// while this process runs the live response (until the stop reaches its
// watch), Terminated once this process has seen the session end (its own
// Shutdown, its response stopped by a Shutdown or expiry, a Start refused
// because the session is over, or a Cancel whose reply says it is over). Active{ID: 0} means the last thing this
// process learned is that another process's response is live (its own was
// superseded by it); it is not told when that response ends, so Active{ID: 0}
// may outlive it, and a response another process starts while this process
// has nothing live is not seen at all: the session's watch (open from
// NewShared on, for as long as the client's watch linger allows) only stops
// this process's own responses. The client's Session State call reads the
// server when the authoritative answer is needed.
//
// # When the coordinator cannot decide
//
// Apply of a Coordinator made by NewShared is bounded by its timeout
// (DefaultTimeout unless WithTimeout says otherwise), the wait for an earlier
// Apply of the same Coordinator included; ApplyContext also takes a context.
// It never hangs on an unreachable server: it returns an error wrapping the
// cause (context.DeadlineExceeded, or the client's error), and:
//
//   - Start performs nothing; the response did not start. (If the server did
//     start it and only the reply was lost, the client's retries with the same
//     request id make sure it is not started twice; if every retry failed,
//     the server may hold a response nobody runs until the next Start or
//     Cancel supersedes it, or the session expires.)
//   - Finished performs nothing; the response stays live here (State says
//     Active). Applying Finished again retries the Finish, which its id
//     fences; otherwise the terminal comes with the next Start, Cancel or
//     Shutdown of this Coordinator. (The client stopped watching the
//     response when its Finish went out, so a stop from elsewhere is no
//     longer delivered for it.)
//   - Cancel performs nothing: the live response keeps running.
//   - Shutdown still cancels this process's response and makes the
//     Coordinator Terminated (the session is being torn down and must not
//     wait on the server); the error says the server did not record it, and
//     the session expires after the server's idle TTL.
//
// Events the machine absorbs are answered nil, as LocalAI's coordinator
// answers them: a Start after Terminated, a stale Finished, a Cancel with
// nothing live, a second Shutdown.
package respcoord
