// Quickstart: connect, start a response, barge in, finish. Start a
// coordinator (`respcoord serve --listen 127.0.0.1:50051`), then
// `go run .` (or `go run . host:port`). scripts/test-go.sh runs this file
// from a throw-away module that requires the client.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	respcoord "github.com/respcoord/respcoord/clients/go"
)

func main() {
	target := "127.0.0.1:50051"
	if len(os.Args) > 1 {
		target = os.Args[1]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	client, err := respcoord.Connect(ctx, target) // respcoord.ErrUnavailable if nothing answers
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	session, err := client.Session(fmt.Sprintf("quickstart-%d-%d", os.Getpid(), time.Now().UnixNano()))
	if err != nil {
		log.Fatal(err)
	}

	// The assistant starts answering: the session's one live response.
	first, err := session.Start(ctx, respcoord.SourceClient)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("response %d started\n", first.ID())

	// The user barges in (on this gateway process or any other): a second
	// Start supersedes the first.
	second, err := session.Start(ctx, respcoord.SourceVAD)
	if err != nil {
		log.Fatal(err)
	}
	if second.Superseded() != first.ID() {
		log.Fatalf("response %d superseded %d, not %d", second.ID(), second.Superseded(), first.ID())
	}
	fmt.Printf("response %d started, superseding %d\n", second.ID(), first.ID())

	// The first response's fence turns false: stop sending its audio.
	// (Check first.IsCurrent() before every chunk, or select on first.Done().)
	select {
	case <-first.Done():
	case <-ctx.Done():
		log.Fatal("the supersede never reached the first response")
	}
	if reason := first.StopReason(); reason != respcoord.StopSuperseded || first.IsCurrent() {
		log.Fatalf("response %d: stopped %q, current %v", first.ID(), reason, first.IsCurrent())
	}
	fmt.Printf("response %d stopped (%s); its fence is closed\n", first.ID(), first.StopReason())

	// The second response runs to its end: report its terminal, exactly once.
	finished, err := second.Finish(ctx, respcoord.TerminalCompleted)
	if err != nil {
		log.Fatal(err)
	}
	if finished.Outcome != respcoord.FinishApplied {
		log.Fatalf("response %d: Finish %s", second.ID(), finished.Outcome)
	}
	fmt.Printf("response %d finished: %s\n", second.ID(), finished.Outcome)
}
