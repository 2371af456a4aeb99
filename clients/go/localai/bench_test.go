package respcoord

import (
	"context"
	"testing"

	client "github.com/respcoord/respcoord/clients/go"
	pb "github.com/respcoord/respcoord/clients/go/respcoordv1"
)

// BenchmarkApplyStartFinished is one Apply(Start) and one Apply(Finished) of
// a shared coordinator against the server: two round trips, as a LocalAI
// response that runs to its end costs.
func BenchmarkApplyStartFinished(b *testing.B) {
	cl := connect(b, testServer(b))
	c, _ := newShared(b, cl, sessionName(b))
	b.ResetTimer()
	for i := 1; i <= b.N; i++ {
		if err := c.Apply(Start{ID: ResponseID(i), Source: SourceClient}); err != nil {
			b.Fatal(err)
		}
		if err := c.Apply(Finished{ID: ResponseID(i)}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClientStartFinish is the same two calls through the client alone,
// to show what the adapter adds.
func BenchmarkClientStartFinish(b *testing.B) {
	cl := connect(b, testServer(b))
	s, err := cl.Session(sessionName(b))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r, err := s.Start(ctx, client.SourceClient)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := r.Finish(ctx, client.TerminalCompleted); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRawGetState is one unary call on the client's connection, the
// floor under every Apply.
func BenchmarkRawGetState(b *testing.B) {
	cl := connect(b, testServer(b))
	ctx := context.Background()
	session := sessionName(b)
	s, _ := cl.Session(session)
	if _, err := s.Shutdown(ctx); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := cl.Raw().GetState(ctx, &pb.GetStateRequest{SessionId: session}); err != nil {
			b.Fatal(err)
		}
	}
}
