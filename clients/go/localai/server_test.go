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
	serverOnce   sync.Once
	serverTarget string
	serverErr    error
	serverProc   *exec.Cmd
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
		serverTarget, serverProc, serverErr = startServer(serverBinary(), "--session-history", "200000")
	})
	if serverErr != nil {
		t.Fatalf("respcoord server: %v (build it with `cargo build --locked --bin respcoord` at the repository root, or set RESPCOORD_SERVER_BIN)", serverErr)
	}
	return serverTarget
}

// startServer runs `respcoord serve` on a free loopback port and waits until
// the port accepts connections. The port is found by binding :0 and letting
// it go, so another process can take it in between; a bind failure is retried
// on a new port.
func startServer(bin string, args ...string) (string, *exec.Cmd, error) {
	if _, err := os.Stat(bin); err != nil {
		return "", nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", nil, err
		}
		addr := l.Addr().String()
		l.Close()
		cmd := exec.Command(bin, append([]string{"serve", "--listen", addr}, args...)...)
		cmd.Stdout, cmd.Stderr = nil, nil
		if err := cmd.Start(); err != nil {
			return "", nil, err
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			conn, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
			if err == nil {
				conn.Close()
				return addr, cmd, nil
			}
			select {
			case err := <-exited:
				lastErr = fmt.Errorf("%s exited before accepting: %v", bin, err)
			case <-time.After(20 * time.Millisecond):
				continue
			}
			break
		}
		if lastErr == nil {
			_ = cmd.Process.Kill()
			return "", nil, fmt.Errorf("%s did not accept on %s within 20s", bin, addr)
		}
	}
	return "", nil, lastErr
}

// ownServer starts a server for one test alone (a short idle TTL, or one the
// test kills), stopped when the test ends.
func ownServer(t *testing.T, args ...string) (string, *exec.Cmd) {
	t.Helper()
	target, cmd, err := startServer(serverBinary(), args...)
	if err != nil {
		t.Fatalf("respcoord server: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return target, cmd
}

func TestMain(m *testing.M) {
	if helperMain() {
		return
	}
	code := m.Run()
	if serverProc != nil {
		_ = serverProc.Process.Kill()
	}
	os.Exit(code)
}
