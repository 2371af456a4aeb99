// Command localai-barge-in is two LocalAI-style gateway processes on one
// realtime session, coordinated by respcoord through the drop-in coordinator
// (clients/go/localai): gateway A speaks a response, gateway B hears the user
// barge in and starts its own, and A must stop speaking.
//
// Each process runs the session the way LocalAI's realtime_respcoord.go does:
// a sink that spawns a response body on StartResponse, cancels its context on
// CancelResponse and emits response.done on EmitTerminal. Only the
// constructor differs (NewShared instead of New). A's body produces an audio
// frame every -frame; frames go through a queue to A's speaker, which plays a
// frame only while its response has not been cancelled (the gate closes in
// the sink's CancelResponse, under the gate's lock).
//
// It prints, over -rounds barge-ins:
//
//   - frames of a stopped response played after A's sink performed its
//     CancelResponse (goal 0), frames the gate dropped, and frames played
//     between B's barge-in returning and A learning of it;
//   - stop to CancelResponse: from B calling Apply(Start) to A's sink
//     performing CancelResponse (wall clock, same host), p50/p99/max;
//   - Apply round trips, p50/p99: A's Starts, B's Starts (the barge-ins)
//     and B's Finisheds. (A's Finisheds are all stale, answered without a
//     call.)
//
// Run it against a server (memory backend, loopback):
//
//	cargo build --locked --bin respcoord
//	target/debug/respcoord serve --listen 127.0.0.1:50151 &
//	cd clients/go && go run ./examples/localai-barge-in -target 127.0.0.1:50151
//
// It exits non-zero if any frame of a stopped response was played after its
// stop. Process B is this program again, started by A with -role b; the two
// talk over B's stdin and stdout.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	client "github.com/respcoord/respcoord/clients/go"
	respcoord "github.com/respcoord/respcoord/clients/go/localai"
)

func main() {
	target := flag.String("target", "127.0.0.1:50051", "respcoord server")
	session := flag.String("session", "", "session id (default: a fresh one)")
	rounds := flag.Int("rounds", 300, "barge-in rounds")
	frame := flag.Duration("frame", 2*time.Millisecond, "interval between audio frames of A's response")
	speak := flag.Duration("speak", 30*time.Millisecond, "how long A speaks before B barges in")
	role := flag.String("role", "a", "a (runs the example) or b (started by a)")
	flag.Parse()
	if *session == "" {
		*session = fmt.Sprintf("localai-barge-in/%d", time.Now().UnixNano())
	}
	var err error
	if *role == "b" {
		err = runB(*target, *session)
	} else {
		err = runA(*target, *session, *rounds, *frame, *speak)
	}
	if err != nil {
		log.Fatalf("%s: %v", *role, err)
	}
}

func connect(target string) (*client.Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return client.Connect(ctx, target)
}

// gateway is one process's realtime session, LocalAI's responseSink in
// miniature: the coordinator, the bodies it starts, and the speaker gate.
type gateway struct {
	coord *respcoord.Coordinator
	frame time.Duration

	mu      sync.Mutex
	cancels map[respcoord.ResponseID]context.CancelFunc
	stopped map[respcoord.ResponseID]int64 // unix nanos of CancelResponse
	done    map[respcoord.ResponseID]respcoord.Status
	played  map[respcoord.ResponseID][]int64 // unix nanos of each frame played
	dropped int
	ended   chan respcoord.ResponseID
	wg      sync.WaitGroup
}

func newGateway(c *client.Client, session string, frame time.Duration) *gateway {
	g := &gateway{
		frame:   frame,
		cancels: map[respcoord.ResponseID]context.CancelFunc{},
		stopped: map[respcoord.ResponseID]int64{},
		done:    map[respcoord.ResponseID]respcoord.Status{},
		played:  map[respcoord.ResponseID][]int64{},
		ended:   make(chan respcoord.ResponseID, 1024),
	}
	g.coord = respcoord.NewShared(c, session, g) // LocalAI: respcoord.New(g)
	return g
}

// Perform is the sink. It runs under the coordinator's effect lock, so it
// only spawns, cancels and records; it never blocks.
func (g *gateway) Perform(e respcoord.Effect) {
	switch eff := e.(type) {
	case respcoord.StartResponse:
		ctx, cancel := context.WithCancel(context.Background())
		g.mu.Lock()
		g.cancels[eff.ID] = cancel
		g.mu.Unlock()
		g.wg.Add(1)
		go g.body(ctx, eff.ID)
	case respcoord.CancelResponse:
		g.mu.Lock()
		// Read under the lock play takes, so the time is when the gate
		// closed: read before it, a frame played while this waited for
		// the lock would count as played after the stop.
		g.stopped[eff.ID] = time.Now().UnixNano() // closes the gate: the speaker plays nothing more of eff.ID
		cancel := g.cancels[eff.ID]
		g.mu.Unlock()
		if cancel != nil {
			cancel()
		}
	case respcoord.EmitTerminal:
		g.mu.Lock()
		g.done[eff.ID] = eff.Status
		cancel := g.cancels[eff.ID]
		delete(g.cancels, eff.ID)
		g.mu.Unlock()
		if cancel != nil {
			cancel() // release the body's context once response.done is out
		}
		// Told last: by now the response's CancelResponse (if any) and its
		// terminal are both recorded.
		select {
		case g.ended <- eff.ID:
		default:
		}
	}
}

// body is a response: frames every g.frame into a queue that the speaker
// drains, until its context is cancelled or 5000 frames are out.
func (g *gateway) body(ctx context.Context, id respcoord.ResponseID) {
	defer g.wg.Done()
	queue := make(chan struct{}, 8)
	speaker := make(chan struct{})
	go func() {
		defer close(speaker)
		for range queue {
			time.Sleep(g.frame / 4) // the frame's way to the wire
			g.play(id)
		}
	}()
	// As in LocalAI, the body reports Finished however it ended: after a
	// stop the id is stale and the coordinator ignores it.
	defer func() {
		close(queue)
		<-speaker
		if err := g.coord.Apply(respcoord.Finished{ID: id}); err != nil {
			log.Printf("Finished(%d): %v", id, err)
		}
	}()
	tick := time.NewTicker(g.frame)
	defer tick.Stop()
	for n := 0; n < 5000; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			select {
			case queue <- struct{}{}:
			default:
			}
		}
	}
}

// play is the gate: a frame leaves only while its response has not been
// cancelled, checked under the lock the sink's CancelResponse takes.
func (g *gateway) play(id respcoord.ResponseID) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, stopped := g.stopped[id]; stopped {
		g.dropped++
		return
	}
	g.played[id] = append(g.played[id], time.Now().UnixNano())
}

// timings collects Apply round trips by event kind.
type timings map[string][]time.Duration

func (t timings) apply(c *respcoord.Coordinator, e respcoord.Event) error {
	began := time.Now()
	err := c.Apply(e)
	kind := strings.SplitN(e.String(), "(", 2)[0]
	t[kind] = append(t[kind], time.Since(began))
	return err
}

func runA(target, session string, rounds int, frame, speak time.Duration) error {
	c, err := connect(target)
	if err != nil {
		return err
	}
	defer c.Close()
	a := newGateway(c, session, frame)
	defer a.coord.Close()

	b := exec.Command(os.Args[0], "-role", "b", "-target", target, "-session", session)
	b.Stderr = os.Stderr
	toB, err := b.StdinPipe()
	if err != nil {
		return err
	}
	fromBPipe, err := b.StdoutPipe()
	if err != nil {
		return err
	}
	if err := b.Start(); err != nil {
		return err
	}
	defer func() { _ = b.Process.Kill(); _ = b.Wait() }()
	fromB := bufio.NewScanner(fromBPipe)
	ask := func(line string) ([]string, error) {
		if _, err := fmt.Fprintln(toB, line); err != nil {
			return nil, err
		}
		if !fromB.Scan() {
			return nil, fmt.Errorf("process B ended: %v", fromB.Err())
		}
		f := strings.Fields(fromB.Text())
		if len(f) == 0 || f[0] != "ok" {
			return nil, fmt.Errorf("process B: %q", fromB.Text())
		}
		return f[1:], nil
	}
	if _, err := ask("hello"); err != nil {
		return err
	}

	at := timings{}
	var stopLatency []time.Duration
	var afterStop, inWindow, played int
	for i := 1; i <= rounds; i++ {
		id := respcoord.ResponseID(i)
		if err := at.apply(a.coord, respcoord.Start{ID: id, Source: respcoord.SourceClient}); err != nil {
			return err
		}
		time.Sleep(speak)
		f, err := ask("barge " + strconv.Itoa(i))
		if err != nil {
			return err
		}
		called, _ := strconv.ParseInt(f[0], 10, 64)
		returned, _ := strconv.ParseInt(f[1], 10, 64)
		select {
		case got := <-a.ended:
			if got != id {
				return fmt.Errorf("round %d: A's sink ended response %d", i, got)
			}
		case <-time.After(5 * time.Second):
			return fmt.Errorf("round %d: A's response not ended 5s after B's barge-in", i)
		}
		a.mu.Lock()
		stoppedAt, cancelled := a.stopped[id]
		status := a.done[id]
		frames := a.played[id]
		a.mu.Unlock()
		if !cancelled || status != respcoord.StatusCancelled {
			return fmt.Errorf("round %d: A's response ended %v (CancelResponse performed: %v), want cancelled", i, status, cancelled)
		}
		stopLatency = append(stopLatency, time.Duration(stoppedAt-called))
		played += len(frames)
		for _, t := range frames {
			if t > stoppedAt {
				afterStop++
			}
			if t > returned && t <= stoppedAt {
				inWindow++
			}
		}
		if _, err := ask("finish"); err != nil {
			return err
		}
	}
	a.wg.Wait()
	a.mu.Lock()
	played, dropped := played, a.dropped
	a.mu.Unlock()
	bReport, err := ask("report")
	if err != nil {
		return err
	}
	if _, err := ask("shutdown"); err != nil {
		return err
	}
	_ = toB.Close()

	fmt.Printf("session %s, %d barge-in rounds, frames every %v, A speaks %v before each\n", session, rounds, frame, speak)
	fmt.Printf("frames of a stopped response played after A's CancelResponse: %d (of %d played; %d late frames dropped by A's gate)\n", afterStop, played, dropped)
	fmt.Printf("frames played after B's barge-in returned, before A's CancelResponse: %d\n", inWindow)
	fmt.Printf("stop (B calls Apply(Start)) to CancelResponse in A: %s\n", summary(stopLatency))
	fmt.Printf("Apply(Start) round trip in A: %s\n", summary(at["Start"]))
	fmt.Printf("in B: %s\n", strings.Join(bReport, " "))
	if afterStop > 0 {
		// The one number with a goal of its own: a smoke run in CI fails on it.
		return fmt.Errorf("%d frames of stopped responses played after their stop", afterStop)
	}
	return nil
}

// runB is process B: on "barge N" it starts response N from the VAD and
// answers with the wall-clock nanos before and after Apply; on "finish" its
// response ends on its own (Finished).
func runB(target, session string) error {
	c, err := connect(target)
	if err != nil {
		return err
	}
	defer c.Close()
	b := newGateway(c, session, time.Hour) // B's bodies produce nothing: the test is A's audio
	defer b.coord.Close()
	bt := timings{}
	in := bufio.NewScanner(os.Stdin)
	var current respcoord.ResponseID
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "hello":
			fmt.Println("ok")
		case "barge":
			n, _ := strconv.Atoi(f[1])
			current = respcoord.ResponseID(n)
			called := time.Now().UnixNano()
			err := bt.apply(b.coord, respcoord.Start{ID: current, Source: respcoord.SourceVAD})
			returned := time.Now().UnixNano()
			if err != nil {
				fmt.Println("error", err)
				continue
			}
			fmt.Println("ok", called, returned)
		case "finish":
			if err := bt.apply(b.coord, respcoord.Finished{ID: current}); err != nil {
				fmt.Println("error", err)
				continue
			}
			fmt.Println("ok")
		case "report":
			fmt.Printf("ok Apply(Start) %s; Apply(Finished) %s\n", summary(bt["Start"]), summary(bt["Finished"]))
		case "shutdown":
			if err := b.coord.Apply(respcoord.Shutdown{}); err != nil {
				fmt.Println("error", err)
				continue
			}
			fmt.Println("ok")
		default:
			fmt.Println("error unknown command", f[0])
		}
	}
	if err := in.Err(); err != nil && err != io.EOF {
		return err
	}
	return nil
}

// summary is "p50 X, p99 Y, max Z (n N)" of some durations (nearest rank).
func summary(d []time.Duration) string {
	if len(d) == 0 {
		return "no samples"
	}
	s := slices.Clone(d)
	slices.Sort(s)
	rank := func(p float64) time.Duration {
		i := int(float64(len(s))*p+0.999999) - 1
		return s[max(0, min(len(s)-1, i))]
	}
	return fmt.Sprintf("p50 %v, p99 %v, max %v (n %d)", rank(0.50).Round(time.Microsecond), rank(0.99).Round(time.Microsecond), s[len(s)-1].Round(time.Microsecond), len(s))
}
