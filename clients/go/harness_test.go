package respcoord_test

// Real servers on loopback for the tests: the scenario fixture and the
// respcoord binary, found through RESPCOORD_FIXTURE_BIN / RESPCOORD_SERVER_BIN
// (default: target/debug under the repository root; build them with
// `cargo build --locked --bin respcoord --example scenario_fixture`).
// RESPCOORD_TEST_BACKEND=nats runs the fixture on the NATS JetStream backend
// at RESPCOORD_TEST_NATS_URL.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// repoRoot is the repository root: the tests run in clients/go.
func repoRoot(t testing.TB) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Clean(filepath.Join(wd, "..", ".."))
}

func binPath(t testing.TB, env, rel string) string {
	t.Helper()
	path := os.Getenv(env)
	if path == "" {
		path = filepath.Join(repoRoot(t), rel)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%s is missing (%s, or cargo build --locked --bin respcoord --example scenario_fixture): %v", path, env, err)
	}
	return path
}

func fixtureBin(t testing.TB) string {
	return binPath(t, "RESPCOORD_FIXTURE_BIN", "target/debug/examples/scenario_fixture")
}

func serverBin(t testing.TB) string {
	return binPath(t, "RESPCOORD_SERVER_BIN", "target/debug/respcoord")
}

// onNATS: the fixture runs on the NATS backend.
func onNATS() bool { return os.Getenv("RESPCOORD_TEST_BACKEND") == "nats" }

// patience bounds every "did it happen at all" wait; never a timing assertion.
const patience = 20 * time.Second

// within waits for ch, failing the test after d.
func within[T any](t testing.TB, what string, ch <-chan T, d time.Duration) T {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("%s: did not happen within %s", what, d)
		panic("unreachable")
	}
}

// until polls done until it holds, failing the test after the patience bound.
func until(t testing.TB, what string, done func() bool) {
	t.Helper()
	end := time.Now().Add(patience)
	for !done() {
		if time.Now().After(end) {
			t.Fatalf("%s: did not happen within %s", what, patience)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// fixture is a running scenario_fixture; it exits when its stdin closes.
type fixture struct {
	Grpc    string `json:"grpc"`
	Proxy   string `json:"proxy"`
	Control string `json:"control"`
	cmd     *exec.Cmd
	stdin   io.WriteCloser
}

// startFixture starts `scenario_fixture serve ARGS` (on NATS when the
// backend says so) and stops it when the test ends.
func startFixture(t testing.TB, args ...string) *fixture {
	t.Helper()
	if onNATS() {
		url := os.Getenv("RESPCOORD_TEST_NATS_URL")
		if url == "" {
			url = "nats://127.0.0.1:4222"
		}
		args = append(args, "--backend", "nats", "--nats-url", url)
	}
	cmd := exec.Command(fixtureBin(t), append([]string{"serve"}, args...)...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f := &fixture{cmd: cmd, stdin: stdin}
	t.Cleanup(f.stop)
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- line
		_, _ = io.Copy(io.Discard, stdout)
	}()
	line := within(t, "the fixture prints its addresses", lines, patience)
	if err := json.Unmarshal([]byte(line), f); err != nil {
		t.Fatalf("the fixture's first line %q: %v", line, err)
	}
	return f
}

func (f *fixture) stop() {
	_ = f.stdin.Close()
	_ = f.cmd.Process.Signal(syscall.SIGTERM)
	_ = f.cmd.Wait()
}

func (f *fixture) control(t testing.TB, method, path string) []byte {
	t.Helper()
	req, err := http.NewRequest(method, f.Control+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	reply, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer reply.Body.Close()
	body, err := io.ReadAll(reply.Body)
	if err != nil || reply.StatusCode/100 != 2 {
		t.Fatalf("%s %s: HTTP %d %v", method, path, reply.StatusCode, err)
	}
	return body
}

func (f *fixture) count(t testing.TB, path string) int {
	t.Helper()
	var reply struct {
		Count int `json:"count"`
	}
	if err := json.Unmarshal(f.control(t, http.MethodGet, path), &reply); err != nil {
		t.Fatal(err)
	}
	return reply.Count
}

func (f *fixture) finishes(t testing.TB, id uint64) int {
	return f.count(t, "/finishes/"+strconv.FormatUint(id, 10))
}
func (f *fixture) starts(t testing.TB) int      { return f.count(t, "/starts") }
func (f *fixture) heldWatches(t testing.TB) int { return f.count(t, "/held-watches") }
func (f *fixture) loseNextStartReply(t testing.TB) {
	f.control(t, http.MethodPost, "/lose-next-start-reply")
}
func (f *fixture) cut(t testing.TB)            { f.control(t, http.MethodPost, "/cut") }
func (f *fixture) holdNextWatch(t testing.TB)  { f.control(t, http.MethodPost, "/hold-next-watch") }
func (f *fixture) releaseWatches(t testing.TB) { f.control(t, http.MethodPost, "/release-watches") }

// certs runs `scenario_fixture certs DIR`.
func certs(t testing.TB, dir string) {
	t.Helper()
	out, err := exec.Command(fixtureBin(t), "certs", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("scenario_fixture certs: %v: %s", err, out)
	}
}

// freePort is a free loopback port (bound, then released).
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// binary is the real respcoord binary on a fixed port.
type binary struct {
	port int
	cmd  *exec.Cmd
	done chan struct{}
}

func startBinary(t testing.TB, port int, args ...string) *binary {
	t.Helper()
	cmd := exec.Command(serverBin(t), append([]string{"serve", "--listen", fmt.Sprintf("127.0.0.1:%d", port)}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	b := &binary{port: port, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(b.done)
	}()
	t.Cleanup(b.kill)
	end := time.Now().Add(patience)
	for {
		select {
		case <-b.done:
			t.Fatalf("respcoord exited: %v", cmd.ProcessState)
		default:
		}
		conn, err := net.DialTimeout("tcp", b.target(), time.Second)
		if err == nil {
			_ = conn.Close()
			return b
		}
		if time.Now().After(end) {
			t.Fatalf("respcoord does not accept connections on %s", b.target())
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func (b *binary) target() string { return fmt.Sprintf("127.0.0.1:%d", b.port) }

// kill sends SIGKILL and waits for the exit; safe to call twice.
func (b *binary) kill() {
	_ = b.cmd.Process.Kill()
	<-b.done
}

// percentile of sorted values (nearest rank).
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(float64(len(sorted))*p/100+0.999999) - 1
	return sorted[min(max(rank, 0), len(sorted)-1)]
}

// latencySummary is p50, p99 and max of samples, as the latency scenarios
// print them; samples is left as it was.
func latencySummary(samples []time.Duration) string {
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	return fmt.Sprintf("p50 %s, p99 %s, max %s", ms(percentile(sorted, 50)), ms(percentile(sorted, 99)), ms(sorted[len(sorted)-1]))
}

// rng is a deterministic xorshift generator (as the TypeScript suite's), so
// a failing round can be replayed.
type rng uint32

func (r *rng) below(n uint32) uint32 {
	x := uint32(*r)
	x ^= x << 13
	x ^= x >> 17
	x ^= x << 5
	*r = rng(x)
	return x % n
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

var _ = context.Background
