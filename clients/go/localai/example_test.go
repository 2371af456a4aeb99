package respcoord_test

import (
	"context"
	"log"
	"sync"

	client "github.com/respcoord/respcoord/clients/go"
	respcoord "github.com/respcoord/respcoord/clients/go/localai"
)

// sessionSink is a realtime session's sink, as LocalAI's responseSink: it
// spawns a body on StartResponse and cancels it on CancelResponse. Nothing in
// it knows whether the coordinator is in-process or shared.
type sessionSink struct {
	mu      sync.Mutex
	cancels map[respcoord.ResponseID]context.CancelFunc
	coord   *respcoord.Coordinator
}

func (s *sessionSink) Perform(e respcoord.Effect) {
	switch eff := e.(type) {
	case respcoord.StartResponse:
		ctx, cancel := context.WithCancel(context.Background())
		s.mu.Lock()
		s.cancels[eff.ID] = cancel
		s.mu.Unlock()
		go func() {
			<-ctx.Done() // the response body: generate, checking ctx
			// Reported however the body ended; stale after a stop, and ignored.
			if err := s.coord.Apply(respcoord.Finished{ID: eff.ID}); err != nil {
				log.Print(err)
			}
		}()
	case respcoord.CancelResponse:
		s.mu.Lock()
		cancel := s.cancels[eff.ID]
		s.mu.Unlock()
		if cancel != nil {
			cancel()
		}
	case respcoord.EmitTerminal:
		// send response.done for eff.ID with eff.Status
	}
}

// A gateway process connects one client at start-up; each realtime session
// makes its coordinator with NewShared where LocalAI calls New. A second
// process doing the same with the same session id shares the machine: its
// Start supersedes this process's response, which is cancelled here.
func ExampleNewShared() {
	ctx := context.Background()
	c, err := client.Connect(ctx, "coordinator:50051")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	sink := &sessionSink{cancels: map[respcoord.ResponseID]context.CancelFunc{}}
	sink.coord = respcoord.NewShared(c, "call-42", sink) // was respcoord.New(sink)
	defer sink.coord.Close()

	if err := sink.coord.Apply(respcoord.Start{ID: 1, Source: respcoord.SourceClient}); err != nil {
		log.Print(err) // the coordinator could not decide within its timeout
	}
	if err := sink.coord.Apply(respcoord.Cancel{Source: respcoord.SourceVAD}); err != nil {
		log.Print(err)
	}
	if err := sink.coord.Apply(respcoord.Shutdown{}); err != nil {
		log.Print(err)
	}
}
