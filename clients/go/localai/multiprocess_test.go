package respcoord

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	client "github.com/respcoord/respcoord/clients/go"
)

// The two-process test runs this test binary twice more, as two gateway
// processes on one session. A child knows it is one by LOCALAI_HELPER in its
// environment; TestMain hands it to helperMain before any test runs.

// helperReport is what a child prints last: its sink's log.
type helperReport struct {
	Effects  []loggedEffect `json:"effects"`
	Overlaps int            `json:"overlaps"`
	Err      string         `json:"err,omitempty"`
}

type loggedEffect struct {
	Kind   string `json:"kind"` // start, cancel, terminal
	ID     uint64 `json:"id"`
	Server uint64 `json:"server,omitempty"`
	Status int    `json:"status,omitempty"`
}

// helperMain runs a child's part when this process is one, and reports
// whether it was. The child talks with the parent over stdin/stdout, a line
// at a time: it prints "ready", walks on "go", prints "walked", and on "end"
// (sent after the parent shut the session down) waits until its last
// response's stop has reached its sink, then prints its report.
func helperMain() bool {
	if os.Getenv("LOCALAI_HELPER") != "walker" {
		return false
	}
	report := runHelper()
	out, _ := json.Marshal(report)
	fmt.Println(string(out))
	return true
}

func runHelper() (report helperReport) {
	seed, err := strconv.ParseUint(os.Getenv("LOCALAI_SEED"), 10, 64)
	if err != nil {
		return helperReport{Err: "LOCALAI_SEED: " + err.Error()}
	}
	steps, err := strconv.Atoi(os.Getenv("LOCALAI_STEPS"))
	if err != nil {
		return helperReport{Err: "LOCALAI_STEPS: " + err.Error()}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	cl, err := client.Connect(ctx, os.Getenv("LOCALAI_TARGET"))
	cancel()
	if err != nil {
		return helperReport{Err: err.Error()}
	}
	defer cl.Close()
	sink := &recordingSink{}
	c := NewShared(cl, os.Getenv("LOCALAI_SESSION"), sink)
	sink.coord = c
	defer c.Close()

	in := bufio.NewScanner(os.Stdin)
	expect := func(word string) error {
		if !in.Scan() {
			return fmt.Errorf("stdin closed before %q: %v", word, in.Err())
		}
		if in.Text() != word {
			return fmt.Errorf("got %q, want %q", in.Text(), word)
		}
		return nil
	}
	fmt.Println("ready")
	if err := expect("go"); err != nil {
		return helperReport{Err: err.Error()}
	}
	if _, err := walk(c, rand.New(rand.NewPCG(seed, 0xA5A5A5A5)), steps); err != nil {
		report.Err = err.Error()
	}
	fmt.Println("walked")
	if err := expect("end"); err != nil && report.Err == "" {
		report.Err = err.Error()
	}
	// The parent has shut the session down: a response of this process that
	// was still live is stopped over the watch.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if a, ok := c.State().(Active); !ok || a.ID == 0 {
			break
		}
		if time.Now().After(deadline) {
			if report.Err == "" {
				report.Err = fmt.Sprintf("still %v 10s after the session was shut down", c.State())
			}
			break
		}
		time.Sleep(time.Millisecond)
	}
	server := sink.serverIDs()
	for _, e := range sink.snapshot() {
		switch e := e.(type) {
		case StartResponse:
			report.Effects = append(report.Effects, loggedEffect{Kind: "start", ID: uint64(e.ID), Server: server[e.ID]})
		case CancelResponse:
			report.Effects = append(report.Effects, loggedEffect{Kind: "cancel", ID: uint64(e.ID)})
		case EmitTerminal:
			report.Effects = append(report.Effects, loggedEffect{Kind: "terminal", ID: uint64(e.ID), Status: int(e.Status)})
		}
	}
	report.Overlaps = sink.overlaps()
	return report
}

// helperProcess is the parent's handle on one child.
type helperProcess struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

func startHelper(t *testing.T, target, session string, seed uint64, steps int) *helperProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		"LOCALAI_HELPER=walker",
		"LOCALAI_TARGET="+target,
		"LOCALAI_SESSION="+session,
		"LOCALAI_SEED="+strconv.FormatUint(seed, 10),
		"LOCALAI_STEPS="+strconv.Itoa(steps),
	)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	out := bufio.NewScanner(stdout)
	out.Buffer(make([]byte, 1<<20), 64<<20)
	return &helperProcess{cmd: cmd, stdin: stdin, out: out}
}

func (h *helperProcess) expect(t *testing.T, word string) {
	t.Helper()
	if !h.out.Scan() {
		t.Fatalf("helper %d: output ended before %q: %v", h.cmd.Process.Pid, word, h.out.Err())
	}
	if h.out.Text() != word {
		t.Fatalf("helper %d: %q, want %q", h.cmd.Process.Pid, h.out.Text(), word)
	}
}

func (h *helperProcess) send(t *testing.T, word string) {
	t.Helper()
	if _, err := fmt.Fprintln(h.stdin, word); err != nil {
		t.Fatalf("helper %d: %v", h.cmd.Process.Pid, err)
	}
}

func (h *helperProcess) report(t *testing.T) processLog {
	t.Helper()
	if !h.out.Scan() {
		t.Fatalf("helper %d: no report: %v", h.cmd.Process.Pid, h.out.Err())
	}
	var r helperReport
	if err := json.Unmarshal(h.out.Bytes(), &r); err != nil {
		t.Fatalf("helper %d: report %q: %v", h.cmd.Process.Pid, h.out.Text(), err)
	}
	if r.Err != "" {
		t.Fatalf("helper %d: %s", h.cmd.Process.Pid, r.Err)
	}
	if r.Overlaps > 0 {
		t.Fatalf("helper %d: %d overlapping effects", h.cmd.Process.Pid, r.Overlaps)
	}
	l := processLog{server: map[ResponseID]uint64{}}
	for _, e := range r.Effects {
		id := ResponseID(e.ID)
		switch e.Kind {
		case "start":
			l.effects = append(l.effects, StartResponse{ID: id})
			l.server[id] = e.Server
		case "cancel":
			l.effects = append(l.effects, CancelResponse{ID: id})
		case "terminal":
			l.effects = append(l.effects, EmitTerminal{ID: id, Status: Status(e.Status)})
		default:
			t.Fatalf("helper %d: effect kind %q", h.cmd.Process.Pid, e.Kind)
		}
	}
	if err := h.cmd.Wait(); err != nil {
		t.Fatalf("helper %d: %v", h.cmd.Process.Pid, err)
	}
	return l
}

// TestTwoProcesses: two gateway processes (this test binary, run twice) walk
// one session at once, each with its own client and connections, then the
// session is shut down from a third client. Each process's sink must hold
// LocalAI's invariants, and so must the union of both, laid out in the
// server's order, with every start and terminal matching the server's record.
func TestTwoProcesses(t *testing.T) {
	target := testServer(t)
	const steps = 2000
	for _, seed := range []uint64{7, 1337} {
		session := sessionName(t) + fmt.Sprint("/", seed)
		helpers := []*helperProcess{
			startHelper(t, target, session, seed, steps),
			startHelper(t, target, session, seed+1, steps),
		}
		for _, h := range helpers {
			h.expect(t, "ready")
		}
		for _, h := range helpers {
			h.send(t, "go")
		}
		for _, h := range helpers {
			h.expect(t, "walked")
		}
		cl := connect(t, target)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		s, err := cl.Session(session)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		var logs []processLog
		for _, h := range helpers {
			h.send(t, "end")
			logs = append(logs, h.report(t))
		}
		events, err := serverRecord(ctx, cl, session)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		unstarted, err := checkAgainstServer(events, logs)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		startsA, _ := countEffects(logs[0].effects)
		startsB, _ := countEffects(logs[1].effects)
		if startsA < steps/4 || startsB < steps/4 {
			t.Fatalf("seed %d: %d and %d starts in %d steps each", seed, startsA, startsB, steps)
		}
		if unstarted != 0 {
			t.Fatalf("seed %d: %d responses started at the server and in no sink", seed, unstarted)
		}
		t.Logf("seed %d: %d + %d responses started, %d events", seed, startsA, startsB, len(events))
	}
}
