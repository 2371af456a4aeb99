package respcoord

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// The tests of shared coordinators run against the real server binary, as
// every client's tests in this repository do: built by
// `cargo build --locked --bin respcoord` at the repository root, or named by
// RESPCOORD_SERVER_BIN.

var (
	serverOnce sync.Once
	theServer  *server
	serverErr  error
)

func serverBinary() string {
	if bin := os.Getenv("RESPCOORD_SERVER_BIN"); bin != "" {
		return bin
	}
	return filepath.Join("..", "..", "..", "target", "debug", "respcoord")
}

// testServer returns the target of one memory-backend server shared by the
// package's tests (each test uses its own session ids). It fails the test,
// rather than skipping it, when the binary is missing: a shared coordinator
// test that silently did not run would read as a pass.
func testServer(t testing.TB) string {
	t.Helper()
	serverOnce.Do(func() {
		// Deep per-session history, so a test can read a whole session's
		// events back from revision 0 to check the sinks against the
		// server's own record.
		theServer, serverErr = startServer(serverBinary(), "--session-history", "200000")
	})
	if serverErr != nil {
		t.Fatalf("respcoord server: %v (build it with `cargo build --locked --bin respcoord` at the repository root, or set RESPCOORD_SERVER_BIN)", serverErr)
	}
	return theServer.addr
}

// server is one running `respcoord serve`.
type server struct {
	addr     string
	cmd      *exec.Cmd
	exited   chan struct{}
	err      error // how it exited, once exited is closed
	killOnce sync.Once
}

// kill stops the server and waits until it has exited (its port closed).
func (s *server) kill() {
	s.killOnce.Do(func() { _ = s.cmd.Process.Kill() })
	<-s.exited
}

// serve runs `respcoord serve` on addr and waits until the port accepts
// connections.
func serve(bin, addr string, args ...string) (*server, error) {
	cmd := exec.Command(bin, append([]string{"serve", "--listen", addr}, args...)...)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &server{addr: addr, cmd: cmd, exited: make(chan struct{})}
	go func() { s.err = cmd.Wait(); close(s.exited) }()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if conn, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			conn.Close()
			return s, nil
		}
		select {
		case <-s.exited:
			return nil, fmt.Errorf("%s exited before accepting on %s: %v", bin, addr, s.err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	s.kill()
	return nil, fmt.Errorf("%s did not accept on %s within 20s", bin, addr)
}

// startServer runs a server on a free loopback port. The port is found by
// binding :0 and letting it go, so another process can take it in between;
// a server that cannot bind exits, and is tried again on a new port.
func startServer(bin string, args ...string) (*server, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		addr := l.Addr().String()
		l.Close()
		s, err := serve(bin, addr, args...)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

// ownServer starts a server for one test alone (a short idle TTL, or one the
// test kills), stopped when the test ends.
func ownServer(t *testing.T, args ...string) *server {
	t.Helper()
	s, err := startServer(serverBinary(), args...)
	if err != nil {
		t.Fatalf("respcoord server: %v", err)
	}
	t.Cleanup(s.kill)
	return s
}

func TestMain(m *testing.M) {
	if helperMain() {
		return
	}
	code := m.Run()
	if theServer != nil {
		theServer.kill()
	}
	os.Exit(code)
}
