package respcoord

// A session watch against a scripted coordinator (an in-process gRPC server
// whose Watch and GetState the test writes): the reactions the real servers
// rarely show on demand.

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/respcoord/respcoord/clients/go/respcoordv1"
)

type scripted struct {
	pb.UnimplementedResponseCoordinatorServer
	watch    func(req *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.WatchResponse]) error
	getState func(req *pb.GetStateRequest) (*pb.GetStateResponse, error)
	watches  atomic.Int32
}

func (s *scripted) Watch(req *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.WatchResponse]) error {
	s.watches.Add(1)
	if err := stream.SendHeader(metadata.MD{}); err != nil {
		return err
	}
	return s.watch(req, stream)
}

func (s *scripted) GetState(_ context.Context, req *pb.GetStateRequest) (*pb.GetStateResponse, error) {
	return s.getState(req)
}

// scriptedClient is a client of a scripted coordinator, and a response of
// it registered on session "s" as if its Start had replied (id, revision).
func scriptedClient(t *testing.T, server *scripted, id, revision uint64) (*Client, *liveness) {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	pb.RegisterResponseCoordinatorServer(g, server)
	go func() { _ = g.Serve(listener) }()
	t.Cleanup(g.Stop)
	c, err := Connect(context.Background(), listener.Addr().String(),
		WithRetryPolicy(RetryPolicy{AttemptTimeout: 200 * time.Millisecond, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	c.tracks.track("s")
	l := newLiveness(id)
	if order := c.tracks.register("s", l, revision, true); order != nil {
		c.pool.openWatch(order)
	}
	return c, l
}

func waitStopped(t *testing.T, l *liveness) StopReason {
	t.Helper()
	select {
	case <-l.done:
		return l.stopReason()
	case <-time.After(10 * time.Second):
		t.Fatalf("response %d never stopped", l.id)
		return ""
	}
}

func TestAStopReplayedAfterTheProofStopsTheResponse(t *testing.T) {
	server := &scripted{watch: func(req *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.WatchResponse]) error {
		if req.GetAfterRevision() != 2 {
			return status.Errorf(codes.InvalidArgument, "after_revision %d", req.GetAfterRevision())
		}
		_ = stream.Send(&pb.WatchResponse{Events: []*pb.LifecycleEvent{started("s", 3, 5)}})
		_ = stream.Send(&pb.WatchResponse{Events: []*pb.LifecycleEvent{started("s", 4, 6)}})
		<-stream.Context().Done()
		return nil
	}}
	c, l := scriptedClient(t, server, 5, 3)
	if reason := waitStopped(t, l); reason != StopSuperseded {
		t.Fatalf("%q", reason)
	}
	if st := c.WatchStatus(); st.Rereads != 0 {
		t.Fatalf("%+v; the proof held, no state read", st)
	}
}

func TestAFirstEventThatIsNotTheStartMeansARecreatedSession(t *testing.T) {
	server := &scripted{
		watch: func(_ *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.WatchResponse]) error {
			// Revision 3 is someone else's start: the session was recreated.
			_ = stream.Send(&pb.WatchResponse{Events: []*pb.LifecycleEvent{started("s", 3, 1)}})
			<-stream.Context().Done()
			return nil
		},
		getState: func(*pb.GetStateRequest) (*pb.GetStateResponse, error) {
			return nil, status.Error(codes.NotFound, "no session s")
		},
	}
	c, l := scriptedClient(t, server, 5, 3)
	if reason := waitStopped(t, l); reason != StopGone {
		t.Fatalf("%q", reason)
	}
	if st := c.WatchStatus(); st.Rereads < 1 {
		t.Fatalf("%+v", st)
	}
}

func TestNoProofWithinTheAttemptTimeoutIsCheckedByAStateRead(t *testing.T) {
	server := &scripted{
		watch: func(_ *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.WatchResponse]) error {
			<-stream.Context().Done() // established, then silent
			return nil
		},
		getState: func(*pb.GetStateRequest) (*pb.GetStateResponse, error) {
			return &pb.GetStateResponse{State: &pb.SessionState{SessionId: "s", Phase: pb.Phase_PHASE_IDLE, Revision: 4}}, nil
		},
	}
	c, l := scriptedClient(t, server, 5, 3)
	if reason := waitStopped(t, l); reason != StopGone {
		t.Fatalf("%q", reason)
	}
	if st := c.WatchStatus(); st.Rereads != 1 || st.Opened < 1 {
		t.Fatalf("%+v", st)
	}
}

func TestABrokenStreamResumesFromTheStateItRead(t *testing.T) {
	var mu sync.Mutex
	var afters []uint64
	server := &scripted{
		getState: func(*pb.GetStateRequest) (*pb.GetStateResponse, error) {
			return &pb.GetStateResponse{State: &pb.SessionState{SessionId: "s", Phase: pb.Phase_PHASE_ACTIVE, ActiveResponseId: 5, Revision: 7}}, nil
		},
	}
	server.watch = func(req *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.WatchResponse]) error {
		mu.Lock()
		afters = append(afters, req.GetAfterRevision())
		mu.Unlock()
		if server.watches.Load() == 1 {
			_ = stream.Send(&pb.WatchResponse{Events: []*pb.LifecycleEvent{started("s", 3, 5)}})
			return status.Error(codes.Unavailable, "the connection broke")
		}
		_ = stream.Send(&pb.WatchResponse{Events: []*pb.LifecycleEvent{terminatedEvent("s", 9, pb.CancelReason_CANCEL_REASON_EXPIRED)}})
		return nil
	}
	c, l := scriptedClient(t, server, 5, 3)
	if reason := waitStopped(t, l); reason != StopExpired {
		t.Fatalf("%q", reason)
	}
	deadline := time.Now().Add(10 * time.Second)
	for c.WatchStatus().Open != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	st := c.WatchStatus()
	mu.Lock()
	defer mu.Unlock()
	if st.Open != 0 || st.Rereads != 1 || st.Reconnects != 1 || len(afters) != 2 || afters[0] != 2 || afters[1] != 7 {
		t.Fatalf("%+v, watches after %v; want one re-read and a reopening from revision 7", st, afters)
	}
}
