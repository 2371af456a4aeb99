package respcoord

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	pb "github.com/respcoord/respcoord/clients/go/respcoordv1"
)

// TLS are the TLS settings of Connect; any of them, or an https:// target,
// turns TLS on.
type TLS struct {
	// CAFile is a PEM file of the CA(s) to trust; empty: the system roots.
	CAFile string
	// CertFile and KeyFile are the client's PEM certificate chain and key,
	// for mutual TLS: both or neither.
	CertFile string
	KeyFile  string
	// ServerName is the name to verify the server's certificate against,
	// when it is not the target's host.
	ServerName string
}

func (t TLS) set() bool { return t != TLS{} }

// Option configures Connect.
type Option func(*options)

type options struct {
	token          string
	tokenSet       bool
	tls            TLS
	tlsConfig      *tls.Config
	retry          RetryPolicy
	lazy           bool
	connectTimeout time.Duration
	dialOptions    []grpc.DialOption
	streamsPerConn int
	watchLinger    time.Duration
}

// WithToken sends `authorization: Bearer <token>` on every call, the
// session watches included.
func WithToken(token string) Option {
	return func(o *options) { o.token, o.tokenSet = token, true }
}

// WithTLS turns TLS on with these files (mutual TLS with CertFile and KeyFile).
func WithTLS(t TLS) Option {
	return func(o *options) { o.tls = t }
}

// WithTLSConfig turns TLS on with a tls.Config of the caller's (certificates
// from memory, a custom verifier). It wins over WithTLS.
func WithTLSConfig(c *tls.Config) Option {
	return func(o *options) { o.tlsConfig = c }
}

// WithRetryPolicy sets how calls are retried; zero fields take the defaults
// (DefaultRetryPolicy).
func WithRetryPolicy(p RetryPolicy) Option {
	return func(o *options) { o.retry = p }
}

// WithLazyConnect makes Connect return without waiting for the connection:
// the first calls connect, retried like any call. A gateway that must start
// while the coordinator is down uses it.
func WithLazyConnect() Option {
	return func(o *options) { o.lazy = true }
}

// WithConnectTimeout bounds how long Connect waits for the connection
// (default 5 s); ignored with WithLazyConnect.
func WithConnectTimeout(d time.Duration) Option {
	return func(o *options) { o.connectTimeout = d }
}

// WithDialOptions adds grpc.DialOptions to every connection the client
// makes (the calls' and the watch pool's), after its own.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOptions = append(o.dialOptions, opts...) }
}

// DefaultWatchLinger is how long a session's watch stays open after the
// session's last live response of this client ends (or after OpenWatch):
// long enough to span the gaps between a conversation's turns.
const DefaultWatchLinger = 30 * time.Second

// WithWatchLinger sets how long a session's watch stays open after the
// session's last live response of this client ends, or after
// Session.OpenWatch, whichever is later (default DefaultWatchLinger). A
// Start within the linger reuses the open watch: no Watch call, no set-up
// on the stop's path. 0 closes a watch the moment its last response ends
// (and makes OpenWatch do nothing). Negative is refused by Connect with a
// *ConfigError naming watch_linger.
func WithWatchLinger(d time.Duration) Option {
	return func(o *options) { o.watchLinger = d }
}

// StreamsPerConnection is how many session watch streams one pooled watch
// connection carries at most: the server allows 1024 concurrent streams per
// connection by default, and a gateway with thousands of calls must not
// queue watches behind that limit.
const StreamsPerConnection = 500

// withStreamsPerConnection lowers the pool's per-connection cap (tests).
func withStreamsPerConnection(n int) Option {
	return func(o *options) { o.streamsPerConn = n }
}

// Client is a connection to respcoord: one connection for calls, and a pool
// of connections of its own for the session watches (one Watch stream per
// session where this client has a live response, has called OpenWatch, or
// lingers after the last one). Safe for concurrent use; Close it when done.
type Client struct {
	conn        *grpc.ClientConn
	raw         pb.ResponseCoordinatorClient
	retry       RetryPolicy
	tracks      *tracks
	pool        *watchPool
	watchLinger time.Duration

	// lingers are the armed linger timers, at most one per session (a
	// newer notice replaces the older, whose end would be stale anyway).
	lingerMu sync.Mutex
	lingers  map[string]*time.Timer

	closeOnce sync.Once
	closed    chan struct{}
}

// bearer is the token as per-RPC credentials: on every call, streams included.
type bearer struct {
	header string
	secure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": b.header}, nil
}

// RequireTransportSecurity is false so a token also works over plaintext on
// loopback or inside a mesh; with TLS on it is sent only over TLS anyway.
func (b bearer) RequireTransportSecurity() bool { return b.secure }

// Connect connects to a coordinator at target: "host:port",
// "http://host:port" (plaintext) or "https://host:port" (TLS); "host:port"
// means TLS when TLS options are given. Unless WithLazyConnect, it waits for
// the connection until ctx ends or the connect timeout passes, and fails with
// an *Error of code UNAVAILABLE.
func Connect(ctx context.Context, target string, opts ...Option) (*Client, error) {
	o := options{retry: DefaultRetryPolicy(), connectTimeout: 5 * time.Second, streamsPerConn: StreamsPerConnection, watchLinger: DefaultWatchLinger}
	for _, opt := range opts {
		opt(&o)
	}
	o.retry = o.retry.withDefaults()
	if o.watchLinger < 0 {
		return nil, &ConfigError{Option: "watch_linger", Reason: fmt.Sprintf("must not be negative (got %s)", o.watchLinger)}
	}
	address, useTLS, err := parseTarget(target, o.tls.set() || o.tlsConfig != nil)
	if err != nil {
		return nil, err
	}
	dial, err := dialOptions(&o, useTLS)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(address, dial...)
	if err != nil {
		return nil, &ConfigError{Option: "target", Reason: err.Error(), Err: err}
	}
	c := &Client{
		conn:        conn,
		raw:         pb.NewResponseCoordinatorClient(conn),
		retry:       o.retry,
		tracks:      newTracks(),
		watchLinger: o.watchLinger,
		lingers:     map[string]*time.Timer{},
		closed:      make(chan struct{}),
	}
	c.pool = newWatchPool(c, func() (*grpc.ClientConn, error) { return grpc.NewClient(address, dial...) }, o.streamsPerConn)
	if o.lazy {
		return c, nil
	}
	if err := waitReady(ctx, conn, o.connectTimeout); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("connecting to %s: %w", address, err)
	}
	return c, nil
}

// waitReady waits until the connection is ready; the wait ends as
// UNAVAILABLE at the timeout, or as the caller's context error.
func waitReady(ctx context.Context, conn *grpc.ClientConn, timeout time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn.Connect()
	for {
		state := conn.GetState()
		if state == connectivity.Ready {
			return nil
		}
		if !conn.WaitForStateChange(wctx, state) {
			if ctx.Err() != nil {
				return contextError(ctx, 0)
			}
			return &Error{Code: codes.Unavailable, Message: fmt.Sprintf("not connected within %s (last state %s)", timeout, state), cause: wctx.Err()}
		}
	}
}

func parseTarget(target string, tlsOptions bool) (address string, useTLS bool, err error) {
	raw := strings.TrimSpace(target)
	switch {
	case raw == "":
		return "", false, &ConfigError{Option: "target", Reason: "must not be empty"}
	case strings.HasPrefix(raw, "http://"):
		if tlsOptions {
			return "", false, &ConfigError{Option: "target", Reason: raw + " is plaintext but TLS options are set; use https://"}
		}
		return strings.TrimPrefix(raw, "http://"), false, nil
	case strings.HasPrefix(raw, "https://"):
		return strings.TrimPrefix(raw, "https://"), true, nil
	case strings.Contains(raw, "://"):
		return "", false, &ConfigError{Option: "target", Reason: raw + ": the scheme must be http or https"}
	default:
		return raw, tlsOptions, nil
	}
}

func dialOptions(o *options, useTLS bool) ([]grpc.DialOption, error) {
	dial := []grpc.DialOption{
		// Notice a dead peer on an otherwise quiet connection (the watches').
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
		// Reconnect on the retry policy's time scale, not grpc-go's 1 s to 120 s.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  max(o.retry.InitialBackoff, 10*time.Millisecond),
				Multiplier: 2,
				Jitter:     0.2,
				MaxDelay:   max(o.retry.MaxBackoff, 10*time.Millisecond),
			},
			MinConnectTimeout: o.retry.AttemptTimeout,
		}),
	}
	if useTLS {
		cfg, err := tlsConfig(o)
		if err != nil {
			return nil, err
		}
		dial = append(dial, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	} else {
		dial = append(dial, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	if o.tokenSet {
		token := strings.TrimSpace(o.token)
		if token == "" {
			return nil, &ConfigError{Option: "token", Reason: "must not be empty"}
		}
		for _, r := range token {
			if r < 0x20 || r > 0x7e {
				return nil, &ConfigError{Option: "token", Reason: "must be printable ASCII"}
			}
		}
		dial = append(dial, grpc.WithPerRPCCredentials(bearer{header: "Bearer " + token, secure: useTLS}))
	}
	return append(dial, o.dialOptions...), nil
}

func tlsConfig(o *options) (*tls.Config, error) {
	if o.tlsConfig != nil {
		return o.tlsConfig.Clone(), nil
	}
	t := o.tls
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, &ConfigError{Option: "tls.ca", Reason: err.Error(), Err: err}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, &ConfigError{Option: "tls.ca", Reason: t.CAFile + ": no PEM certificate in it"}
		}
		cfg.RootCAs = pool
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, &ConfigError{Option: "tls.cert", Reason: "tls.cert and tls.key go together (mutual TLS needs both)"}
	}
	if t.CertFile != "" {
		pair, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, &ConfigError{Option: "tls.cert", Reason: err.Error(), Err: err}
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// RetryPolicy is the policy the client's calls follow.
func (c *Client) RetryPolicy() RetryPolicy { return c.retry }

// Raw is the generated stub on the client's call connection, for what this
// package does not wrap (ListSessions, a watch of every session). Calls on
// it carry the token; they are not retried.
func (c *Client) Raw() pb.ResponseCoordinatorClient { return c.raw }

// Session is a handle on one session. It refuses a malformed id (an *Error
// with code INVALID_ARGUMENT naming session_id) and sends nothing: a handle
// is free; the session is watched while this client has a live response
// there, and for the watch linger after (or from Session.OpenWatch on).
func (c *Client) Session(id string) (*Session, error) {
	if err := ValidateSessionID(id); err != nil {
		return nil, err
	}
	return &Session{client: c, id: id}, nil
}

// State reads a session's state (GetState). NOT_FOUND (ErrNotFound) when the
// session does not exist.
func (c *Client) State(ctx context.Context, sessionID string) (SessionState, error) {
	if err := ValidateSessionID(sessionID); err != nil {
		return SessionState{}, err
	}
	reply, err := call(ctx, c, c.raw.GetState, &pb.GetStateRequest{SessionId: sessionID}, true)
	if err != nil {
		return SessionState{}, err
	}
	return stateFromWire(reply.GetState()), nil
}

// WatchStatus says how this client's session watches are doing.
func (c *Client) WatchStatus() WatchStatus { return c.pool.status() }

// linger carries out the fencing table's idle notices: a session's watch
// closes (lingerOver) the linger after its track went idle, unless it was
// used again since; at once with a linger of 0. Called with none of the
// table's locks held.
func (c *Client) linger(idle []idleNotice) {
	for _, n := range idle {
		if c.watchLinger == 0 {
			c.tracks.lingerOver(n.session, n.generation)
			continue
		}
		c.lingerMu.Lock()
		if c.isClosed() {
			c.lingerMu.Unlock()
			return
		}
		if old := c.lingers[n.session]; old != nil {
			old.Stop()
		}
		var timer *time.Timer
		timer = time.AfterFunc(c.watchLinger, func() {
			c.lingerMu.Lock()
			if c.lingers[n.session] == timer {
				delete(c.lingers, n.session)
			}
			c.lingerMu.Unlock()
			c.tracks.lingerOver(n.session, n.generation)
		})
		c.lingers[n.session] = timer
		c.lingerMu.Unlock()
	}
}

// Close stops every session watch (lingering ones included), stops every
// live response of this client with StopReleased (nothing could learn about
// their stops any more, so their fences fail closed) and closes every
// connection. Safe to call twice; calls made afterwards fail with ErrClosed.
func (c *Client) Close() error {
	var err error
	c.closeOnce.Do(func() {
		close(c.closed)
		c.lingerMu.Lock()
		for session, timer := range c.lingers {
			timer.Stop()
			delete(c.lingers, session)
		}
		c.lingerMu.Unlock()
		c.tracks.releaseAll()
		c.pool.close()
		err = c.conn.Close()
	})
	return err
}

func (c *Client) isClosed() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

// call runs one unary call under the client's retry policy (retried only
// when idempotent).
func call[Req, Res any](ctx context.Context, c *Client, method func(context.Context, Req, ...grpc.CallOption) (Res, error), req Req, idempotent bool) (Res, error) {
	var zero Res
	if c.isClosed() {
		return zero, ErrClosed
	}
	return withRetry(ctx, c.retry, idempotent, func(actx context.Context) (Res, error) {
		return method(actx, req)
	})
}
