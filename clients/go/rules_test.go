package respcoord

// The rules written once for every client (clients/scenarios/rules.json):
// this client's id validation, retry classification and stop reasons must
// say what the file says. The Rust, Python and TypeScript clients have the
// same test; a rule changed in one place fails until all of them agree.

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/respcoord/respcoord/clients/go/respcoordv1"
)

type rulesFile struct {
	Version int `json:"version"`
	IDs     struct {
		SessionID struct {
			MaxBytes int `json:"max_bytes"`
		} `json:"session_id"`
		RequestID struct {
			MaxBytes int `json:"max_bytes"`
		} `json:"request_id"`
		Cases []struct {
			Field  string  `json:"field"`
			Value  *string `json:"value"`
			Repeat string  `json:"repeat"`
			Times  int     `json:"times"`
			Valid  bool    `json:"valid"`
		} `json:"cases"`
	} `json:"ids"`
	Retry struct {
		Retryable                []string `json:"retryable"`
		Final                    []string `json:"final"`
		InternalFromTheTransport string   `json:"internal_from_the_transport"`
	} `json:"retry"`
	StopReasons struct {
		Names            []string          `json:"names"`
		FromCancelReason map[string]string `json:"from_cancel_reason"`
	} `json:"stop_reasons"`
}

func loadRules(t *testing.T) rulesFile {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "scenarios", "rules.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rules rulesFile
	if err := json.Unmarshal(raw, &rules); err != nil {
		t.Fatal(err)
	}
	return rules
}

// codeByName is the canonical name of every status code but OK.
func codeByName() map[string]codes.Code {
	names := map[string]codes.Code{}
	for c := codes.Canceled; c <= codes.Unauthenticated; c++ {
		// codes.Code.String is "Canceled", "InvalidArgument", ...; the
		// rules use the canonical upper-case names.
		names[canonicalName(c)] = c
	}
	return names
}

func canonicalName(c codes.Code) string {
	if c == codes.Canceled {
		return "CANCELLED"
	}
	var b strings.Builder
	for i, r := range c.String() {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return strings.ToUpper(b.String())
}

func TestRulesFileVersion(t *testing.T) {
	if v := loadRules(t).Version; v != 1 {
		t.Fatalf("rules.json version %d; this test reads version 1", v)
	}
}

func TestRulesIDLimits(t *testing.T) {
	rules := loadRules(t)
	if rules.IDs.SessionID.MaxBytes != MaxSessionIDBytes || rules.IDs.RequestID.MaxBytes != MaxRequestIDBytes {
		t.Fatalf("limits %d/%d; the rules say %d/%d", MaxSessionIDBytes, MaxRequestIDBytes, rules.IDs.SessionID.MaxBytes, rules.IDs.RequestID.MaxBytes)
	}
	if len(rules.IDs.Cases) <= 10 {
		t.Fatalf("only %d id cases", len(rules.IDs.Cases))
	}
}

func TestRulesIDCases(t *testing.T) {
	validate := map[string]func(string) error{"session_id": ValidateSessionID, "request_id": ValidateRequestID}
	for _, c := range loadRules(t).IDs.Cases {
		value := strings.Repeat(c.Repeat, c.Times)
		if c.Value != nil {
			value = *c.Value
		}
		check, ok := validate[c.Field]
		if !ok {
			t.Fatalf("a case for %s, which this client does not validate", c.Field)
		}
		err := check(value)
		if c.Valid {
			if err != nil {
				t.Errorf("%s %q: refused (%v), the rules accept it", c.Field, value, err)
			}
			continue
		}
		var e *Error
		if !errors.As(err, &e) || e.Field != c.Field || e.Code != codes.InvalidArgument || !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s %q: %v; the rules refuse it as INVALID_ARGUMENT naming the field", c.Field, value, err)
		}
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s %q: the status of the refusal is %s", c.Field, value, status.Code(err))
		}
	}
}

func TestRulesClassifyEveryStatusCodeOnce(t *testing.T) {
	rules := loadRules(t)
	names := codeByName()
	if len(names) != 16 {
		t.Fatalf("%d codes", len(names))
	}
	all := append(slices.Clone(rules.Retry.Retryable), rules.Retry.Final...)
	slices.Sort(all)
	var want []string
	for name := range names {
		want = append(want, name)
	}
	slices.Sort(want)
	if !slices.Equal(all, want) {
		t.Fatalf("the rules classify %v; the codes are %v", all, want)
	}
}

func TestRulesRetryClassOfEveryCodeTheServerSends(t *testing.T) {
	rules := loadRules(t)
	names := codeByName()
	for _, name := range rules.Retry.Retryable {
		sent := status.Error(names[name], "from the server")
		if !Retryable(sent) || !RetryableCode(names[name]) {
			t.Errorf("%s: the rules retry it, this client does not", name)
		}
	}
	for _, name := range rules.Retry.Final {
		sent := status.Error(names[name], "from the server")
		if Retryable(sent) || RetryableCode(names[name]) {
			t.Errorf("%s: the rules call it final, this client retries it", name)
		}
	}
}

func TestRulesStopReasons(t *testing.T) {
	rules := loadRules(t)
	mine := []string{}
	for _, r := range []StopReason{StopSuperseded, StopCancelled, StopShutdown, StopExpired, StopEnded, StopGone, StopFinished, StopReleased} {
		mine = append(mine, string(r))
	}
	names := slices.Clone(rules.StopReasons.Names)
	slices.Sort(names)
	slices.Sort(mine)
	if !slices.Equal(names, mine) {
		t.Fatalf("stop reasons %v; the rules name %v", mine, names)
	}
	if len(rules.StopReasons.FromCancelReason) != len(pb.CancelReason_value) {
		t.Fatalf("the rules map %d cancel reasons; the wire has %d", len(rules.StopReasons.FromCancelReason), len(pb.CancelReason_value))
	}
	for name, want := range rules.StopReasons.FromCancelReason {
		value, ok := pb.CancelReason_value[name]
		if !ok {
			t.Fatalf("the rules map %s, which the wire does not have", name)
		}
		if got := StopReasonFromCancel(pb.CancelReason(value)); string(got) != want {
			t.Errorf("%s -> %q; the rules say %q", name, got, want)
		}
	}
}

// resettingServer is a bare HTTP/2 server (net/http, no gRPC) whose handler
// answers each stream by mode: "reset" resets it (RST_STREAM INTERNAL_ERROR,
// no headers: a replica killed mid-call); "reset-once" resets the first and
// answers the others with an empty GetStateResponse; "internal" sends a
// grpc-status INTERNAL of its own.
func resettingServer(t *testing.T, mode string) (target string, streams *atomic.Int64) {
	t.Helper()
	streams = &atomic.Int64{}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := streams.Add(1)
		if mode == "reset" || (mode == "reset-once" && n == 1) {
			// net/http resets the stream of a handler that aborts.
			panic(http.ErrAbortHandler)
		}
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Trailer", "Grpc-Status, Grpc-Message")
		w.WriteHeader(http.StatusOK)
		if mode == "internal" {
			w.Header().Set("Grpc-Status", "13")
			w.Header().Set("Grpc-Message", "a server bug")
			return
		}
		_, _ = w.Write(make([]byte, 5)) // one message of length 0
		w.Header().Set("Grpc-Status", "0")
	})
	protocols := new(http.Protocols)
	protocols.SetUnencryptedHTTP2(true)
	server := &http.Server{Handler: handler, Protocols: protocols}
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = server.Serve(listener) }()
	t.Cleanup(func() { _ = server.Close() })
	return listener.Addr().String(), streams
}

func getStateOnce(t *testing.T, target string) error {
	t.Helper()
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = pb.NewResponseCoordinatorClient(conn).GetState(ctx, &pb.GetStateRequest{SessionId: "s"})
	return err
}

func TestRulesInternalFromTheTransportIsRetried(t *testing.T) {
	if !strings.HasPrefix(loadRules(t).Retry.InternalFromTheTransport, "retryable: ") {
		t.Fatal("the rules no longer retry an INTERNAL the transport made")
	}
	target, _ := resettingServer(t, "reset")
	err := getStateOnce(t, target)
	if status.Code(err) != codes.Internal || !Retryable(err) {
		t.Fatalf("a reset stream: %v (retryable %v); want a retryable INTERNAL", err, Retryable(err))
	}
	// And the client's own call tries again and gets the next answer.
	target, streams := resettingServer(t, "reset-once")
	c, err := Connect(context.Background(), "http://"+target, WithLazyConnect())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.State(context.Background(), "s")
	if err != nil || st.Phase != PhaseIdle || streams.Load() != 2 {
		t.Fatalf("GetState after one reset: %+v, %v, %d streams", st, err, streams.Load())
	}
}

func TestRulesInternalTheServerSentIsFinal(t *testing.T) {
	target, streams := resettingServer(t, "internal")
	err := getStateOnce(t, target)
	if status.Code(err) != codes.Internal || Retryable(err) {
		t.Fatalf("a sent INTERNAL: %v (retryable %v); want a final INTERNAL", err, Retryable(err))
	}
	c, err := Connect(context.Background(), "http://"+target, WithLazyConnect(),
		WithRetryPolicy(RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	before := streams.Load()
	_, err = c.State(context.Background(), "s")
	var e *Error
	if !errors.As(err, &e) || e.Code != codes.Internal || e.Attempts != 1 || !errors.Is(err, ErrInternal) || streams.Load() != before+1 {
		t.Fatalf("GetState: %v (%d streams); want one attempt answered INTERNAL", err, streams.Load()-before)
	}
}
