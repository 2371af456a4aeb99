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

// scriptedServe is a client of a scripted coordinator.
func scriptedServe(t *testing.T, server *scripted, opts ...Option) *Client {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	pb.RegisterResponseCoordinatorServer(g, server)
	go func() { _ = g.Serve(listener) }()
	t.Cleanup(g.Stop)
	opts = append([]Option{WithRetryPolicy(RetryPolicy{AttemptTimeout: 200 * time.Millisecond, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})}, opts...)
	c, err := Connect(context.Background(), listener.Addr().String(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// scriptedClient is a client of a scripted coordinator, and a response of
// it registered on session "s" as if its Start had replied (id, revision).
func scriptedClient(t *testing.T, server *scripted, id, revision uint64) (*Client, *liveness) {
	t.Helper()
	c := scriptedServe(t, server)
	c.tracks.track("s")
	l := newLiveness(id)
	if order, _ := c.tracks.register("s", l, revision, true); order != nil {
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

// registerOn registers a response on session as Session.Start does after a
// reply (id, revision, fresh), on client c.
func registerOn(c *Client, session string, id, revision uint64) *liveness {
	c.tracks.track(session)
	l := newLiveness(id)
	order, idle := c.tracks.register(session, l, revision, true)
	if order != nil {
		c.pool.openWatch(order)
	}
	c.linger(idle)
	return l
}

func TestAWatchOpenedAheadOfAMissingSessionStreamsFromItsFirstEvent(t *testing.T) {
	var mu sync.Mutex
	var afters []uint64
	start := make(chan struct{})
	server := &scripted{
		getState: func(*pb.GetStateRequest) (*pb.GetStateResponse, error) {
			return nil, status.Error(codes.NotFound, "no session w")
		},
	}
	server.watch = func(req *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.WatchResponse]) error {
		mu.Lock()
		afters = append(afters, req.GetAfterRevision())
		mu.Unlock()
		<-start // the session's first events, once the test's Start is in
		_ = stream.Send(&pb.WatchResponse{Events: []*pb.LifecycleEvent{started("w", 1, 5)}})
		_ = stream.Send(&pb.WatchResponse{Events: []*pb.LifecycleEvent{cancelRequested("w", 2, 5, pb.CancelReason_CANCEL_REASON_REQUESTED)}})
		<-stream.Context().Done()
		return nil
	}
	c := scriptedServe(t, server, WithWatchLinger(time.Hour))
	w, err := c.Session("w")
	if err != nil {
		t.Fatal(err)
	}
	w.OpenWatch()
	if st := c.WatchStatus(); st.Open != 1 {
		t.Fatalf("%+v; want the watch open at once", st)
	}
	until(t, func() bool { return c.WatchStatus().Opened == 1 })
	l := registerOn(c, "w", 5, 1) // reuses the open watch
	close(start)
	if reason := waitStopped(t, l); reason != StopCancelled {
		t.Fatalf("%q", reason)
	}
	st := c.WatchStatus()
	mu.Lock()
	defer mu.Unlock()
	if st.Opened != 1 || st.Rereads != 0 || st.Reconnects != 0 || len(afters) != 1 || afters[0] != 0 {
		t.Fatalf("%+v, watches after %v; want one stream from revision 0, no resume", st, afters)
	}
	if st.Open != 1 || !c.tracks.watched("w") {
		t.Fatalf("%+v; want the watch lingering", st)
	}
}

func TestAWatchOpenedAheadReadsTheStateAndStreamsFromItsRevision(t *testing.T) {
	afters := make(chan uint64, 4)
	server := &scripted{
		getState: func(*pb.GetStateRequest) (*pb.GetStateResponse, error) {
			return &pb.GetStateResponse{State: &pb.SessionState{SessionId: "w", Phase: pb.Phase_PHASE_IDLE, Revision: 7}}, nil
		},
		watch: func(req *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.WatchResponse]) error {
			afters <- req.GetAfterRevision()
			<-stream.Context().Done()
			return nil
		},
	}
	c := scriptedServe(t, server, WithWatchLinger(time.Hour))
	w, _ := c.Session("w")
	w.OpenWatch()
	select {
	case after := <-afters:
		if after != 7 {
			t.Fatalf("watch after revision %d; want 7, the state's", after)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no Watch call")
	}
	// A Start answered at revision 6 (before the read's 7): the read saw the
	// session idle after it, so it is stopped at once.
	if l := registerOn(c, "w", 6, 6); l.stopReason() != StopGone {
		t.Fatalf("%q", l.stopReason())
	}
	if st := c.WatchStatus(); st.Rereads != 0 {
		t.Fatalf("%+v; the opening read is not a resume", st)
	}
}

func TestTheLingerClosesTheWatchAndCloseStopsItEarly(t *testing.T) {
	server := &scripted{
		getState: func(*pb.GetStateRequest) (*pb.GetStateResponse, error) {
			return nil, status.Error(codes.NotFound, "no session")
		},
		watch: func(_ *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.WatchResponse]) error {
			<-stream.Context().Done()
			return nil
		},
	}
	short := scriptedServe(t, server, WithWatchLinger(50*time.Millisecond))
	s, _ := short.Session("short")
	s.OpenWatch()
	until(t, func() bool { return short.WatchStatus().Open == 0 })
	if short.tracks.size() != 0 {
		t.Fatal("the track outlived its watch")
	}

	long := scriptedServe(t, server, WithWatchLinger(time.Hour))
	l, _ := long.Session("long")
	l.OpenWatch()
	until(t, func() bool { return long.WatchStatus().Opened == 1 })
	if err := long.Close(); err != nil {
		t.Fatal(err)
	}
	if st := long.WatchStatus(); st.Open != 0 {
		t.Fatalf("%+v after Close", st)
	}
	long.lingerMu.Lock()
	armed := len(long.lingers)
	long.lingerMu.Unlock()
	if armed != 0 {
		t.Fatalf("%d linger timers armed after Close", armed)
	}
	l.OpenWatch() // closed: nothing
	if st := long.WatchStatus(); st.Open != 0 {
		t.Fatalf("%+v: OpenWatch on a closed client opened a watch", st)
	}

	none := scriptedServe(t, server, WithWatchLinger(0))
	n, _ := none.Session("none")
	n.OpenWatch()
	if st := none.WatchStatus(); st.Open != 0 || none.tracks.size() != 0 {
		t.Fatalf("%+v: OpenWatch with linger 0 opened a watch", st)
	}
	// Linger 0: the watch closes the moment the last response ends.
	r := registerOn(none, "none", 3, 3)
	r.halt(StopReleased)
	none.linger(none.tracks.unregister("none", r))
	if none.tracks.watched("none") || none.tracks.size() != 0 {
		t.Fatal("with linger 0 the watch outlived its last response")
	}
}

// until polls done, failing the test after 10 s.
func until(t *testing.T, done func() bool) {
	t.Helper()
	end := time.Now().Add(10 * time.Second)
	for !done() {
		if time.Now().After(end) {
			t.Fatal("did not happen within 10 s")
		}
		time.Sleep(time.Millisecond)
	}
}
