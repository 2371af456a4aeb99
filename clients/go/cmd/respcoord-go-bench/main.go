// Command respcoord-go-bench measures the Go client on loopback against a
// real respcoord (a benchmark, not a test: it prints, never asserts).
//
//	respcoord-go-bench [-server PATH | -target HOST:PORT] [-rounds 300] [-calls 2000]
//
// Without -target it starts `PATH serve` (default target/debug/respcoord
// from the repository root) on a free loopback port, memory backend.
//
//   - propagation: the stop in one process to the body's context cancelled
//     in another. This process (B) and a child process of the same binary
//     (A, `-follow`) are two gateways on one coordinator. Per round, on
//     session latency-{round % 16}, A runs a body that never ends by itself;
//     B, once A's body has started, cancels it (even rounds, CancelIf) or
//     supersedes it (odd rounds, Start). Measured from just before B's call
//     to the moment A's body sees its context done, on the wall clock both
//     processes share.
//   - round trips: Start, Finish and GetState, one at a time, on one client,
//     and GetState on the generated stub beside them (the client's own cost
//     is the difference).
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	respcoord "github.com/respcoord/respcoord/clients/go"
	pb "github.com/respcoord/respcoord/clients/go/respcoordv1"
)

func main() {
	server := flag.String("server", "", "the respcoord binary to start (default: target/debug/respcoord of the repository)")
	target := flag.String("target", "", "use a running coordinator at HOST:PORT instead of starting one")
	rounds := flag.Int("rounds", 300, "propagation rounds")
	calls := flag.Int("calls", 2000, "calls per round-trip measure")
	follow := flag.Bool("follow", false, "internal: run as gateway A of the propagation measure")
	flag.Parse()
	ctx := context.Background()
	var err error
	if *follow {
		err = followRounds(ctx, *target, *rounds)
	} else {
		err = run(ctx, *server, *target, *rounds, *calls)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "respcoord-go-bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, server, target string, rounds, calls int) error {
	if target == "" {
		stop, addr, err := startServer(server)
		if err != nil {
			return err
		}
		defer stop()
		target = addr
	}
	client, err := respcoord.Connect(ctx, target)
	if err != nil {
		return err
	}
	defer client.Close()
	if err := propagation(ctx, client, target, rounds); err != nil {
		return err
	}
	return roundTrips(ctx, client, calls)
}

// startServer starts `server serve` on a free loopback port and waits until
// it accepts connections.
func startServer(server string) (stop func(), target string, err error) {
	if server == "" {
		wd, _ := os.Getwd()
		server = filepath.Join(wd, "..", "..", "target", "debug", "respcoord")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	target = l.Addr().String()
	_ = l.Close()
	cmd := exec.Command(server, "serve", "--listen", target)
	if err := cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("starting %s: %w", server, err)
	}
	stop = func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(25 * time.Millisecond) {
		if conn, err := net.Dial("tcp", target); err == nil {
			_ = conn.Close()
			fmt.Printf("server: %s serve --listen %s (memory backend)\n", server, target)
			return stop, target, nil
		}
	}
	stop()
	return nil, "", fmt.Errorf("%s does not accept connections on %s", server, target)
}

// propagation is gateway B; gateway A is a child process (-follow).
func propagation(ctx context.Context, b *respcoord.Client, target string, rounds int) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	child := exec.CommandContext(ctx, self, "-follow", "-target", target, "-rounds", strconv.Itoa(rounds))
	child.Stderr = os.Stderr
	out, err := child.StdoutPipe()
	if err != nil {
		return err
	}
	if err := child.Start(); err != nil {
		return err
	}
	defer func() { _ = child.Wait() }()
	lines := bufio.NewScanner(out)
	next := func(want string) ([]string, error) {
		if !lines.Scan() {
			return nil, fmt.Errorf("gateway A ended early: %v", lines.Err())
		}
		fields := strings.Fields(lines.Text())
		if len(fields) == 0 || fields[0] != want {
			return nil, fmt.Errorf("gateway A said %q, want %s", lines.Text(), want)
		}
		return fields, nil
	}
	samples := make([]time.Duration, 0, rounds)
	for round := range rounds {
		fields, err := next("started")
		if err != nil {
			return err
		}
		id, _ := strconv.ParseUint(fields[1], 10, 64)
		session, err := b.Session(fmt.Sprintf("latency-%d", round%16))
		if err != nil {
			return err
		}
		began := time.Now().UnixNano()
		if round%2 == 0 {
			_, err = session.CancelIf(ctx, respcoord.SourceClient, id)
		} else {
			var r *respcoord.Response
			if r, err = session.Start(ctx, respcoord.SourceVAD); err == nil {
				r.Release()
			}
		}
		if err != nil {
			return err
		}
		fields, err = next("stopped")
		if err != nil {
			return err
		}
		seen, _ := strconv.ParseInt(fields[1], 10, 64)
		samples = append(samples, time.Duration(seen-began))
	}
	p50, p99, worst := summary(samples)
	fmt.Printf("propagation (go, two processes, %d rounds, B's call to A's body context done): p50 %s, p99 %s, max %s\n", rounds, ms(p50), ms(p99), ms(worst))
	return nil
}

// followRounds is gateway A: per round, a Run whose body reports its start
// and the wall-clock moment its context is done.
func followRounds(ctx context.Context, target string, rounds int) error {
	a, err := respcoord.Connect(ctx, target)
	if err != nil {
		return err
	}
	defer a.Close()
	out := bufio.NewWriter(os.Stdout)
	for round := range rounds {
		session, err := a.Session(fmt.Sprintf("latency-%d", round%16))
		if err != nil {
			return err
		}
		var seen int64
		result, err := session.Run(ctx, respcoord.SourceClient, func(ctx context.Context, fence respcoord.Fence) error {
			fmt.Fprintf(out, "started %d\n", fence.ID())
			if err := out.Flush(); err != nil {
				return err
			}
			<-ctx.Done()
			seen = time.Now().UnixNano()
			return nil
		})
		if err != nil {
			return err
		}
		if result.Kind != respcoord.RunStopped {
			return fmt.Errorf("round %d: %s, want stopped", round, result.Kind)
		}
		fmt.Fprintf(out, "stopped %d %s\n", seen, result.Reason)
		if err := out.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// roundTrips measures Start, Finish and GetState one call at a time.
func roundTrips(ctx context.Context, c *respcoord.Client, calls int) error {
	session, err := c.Session(fmt.Sprintf("round-trips-%d", os.Getpid()))
	if err != nil {
		return err
	}
	var starts, finishes, states, raws []time.Duration
	for range calls {
		began := time.Now()
		r, err := session.Start(ctx, respcoord.SourceClient)
		if err != nil {
			return err
		}
		starts = append(starts, time.Since(began))
		began = time.Now()
		if _, err := r.Finish(ctx, respcoord.TerminalCompleted); err != nil {
			return err
		}
		finishes = append(finishes, time.Since(began))
		began = time.Now()
		if _, err := session.State(ctx); err != nil {
			return err
		}
		states = append(states, time.Since(began))
		// The same read on the generated stub: what the server and gRPC
		// cost without this package (no validation, no retry wrapper).
		began = time.Now()
		if _, err := c.Raw().GetState(ctx, &pb.GetStateRequest{SessionId: session.ID()}); err != nil {
			return err
		}
		raws = append(raws, time.Since(began))
	}
	for _, m := range []struct {
		name    string
		samples []time.Duration
	}{{"Start", starts}, {"Finish", finishes}, {"GetState", states}, {"raw GetState", raws}} {
		p50, p99, worst := summary(m.samples)
		fmt.Printf("round trip %-12s (go, loopback, %d calls): p50 %s, p99 %s, max %s\n", m.name, calls, ms(p50), ms(p99), ms(worst))
	}
	return nil
}

func summary(samples []time.Duration) (p50, p99, worst time.Duration) {
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	at := func(p float64) time.Duration {
		rank := int(float64(len(samples))*p/100+0.999999) - 1
		return samples[min(max(rank, 0), len(samples)-1)]
	}
	return at(50), at(99), samples[len(samples)-1]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d)/float64(time.Millisecond)) }
