package respcoord_test

import (
	"context"
	"errors"
	"log"
	"time"

	respcoord "github.com/respcoord/respcoord/clients/go"
)

// A gateway's response: the body streams until the model ends or the
// coordinator stops the response, whichever comes first, and checks the
// fence before each frame leaves.
func ExampleSession_Run() {
	ctx := context.Background()
	client, err := respcoord.Connect(ctx, "127.0.0.1:50051", respcoord.WithToken("gateway-token"))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	session, err := client.Session("call-42")
	if err != nil {
		log.Fatal(err)
	}
	frames := make(chan []byte) // the model's audio, closed at its end
	send := func([]byte) {}     // the audio sink
	result, err := session.Run(ctx, respcoord.SourceVAD, func(ctx context.Context, fence respcoord.Fence) error {
		for {
			select {
			case <-ctx.Done(): // stopped anywhere: superseded, cancelled, shut down
				return nil
			case frame, ok := <-frames:
				if !ok {
					return nil
				}
				if !fence.IsCurrent() {
					return nil // a frame produced before the stop arrived: drop it
				}
				send(frame)
			}
		}
	})
	if err != nil {
		log.Fatal(err)
	}
	switch result.Kind {
	case respcoord.RunStopped:
		log.Printf("response %d stopped: %s (no Finish sent)", result.ResponseID, result.Reason)
	default:
		log.Printf("response %d %s: Finish %s", result.ResponseID, result.Kind, result.Finish.Outcome)
	}
}

// Errors are values: test them with errors.Is, or read the code and the
// offending field with errors.As.
func ExampleError() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	client, err := respcoord.Connect(ctx, "127.0.0.1:50051")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	session, err := client.Session("call-42")
	if err != nil {
		log.Fatal(err)
	}
	_, err = session.Start(ctx, respcoord.SourceClient)
	var e *respcoord.Error
	switch {
	case errors.Is(err, respcoord.ErrSessionTerminated):
		log.Print("the call is over: start nothing")
	case errors.Is(err, respcoord.ErrUnavailable):
		log.Print("the coordinator is unreachable (after the retries)")
	case errors.As(err, &e) && e.Field != "":
		log.Printf("refused: %s: %s", e.Field, e.Message)
	}
}
