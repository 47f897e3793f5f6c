package engine

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/internal/testkit"
	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/internal/testkit/ssetest"
	"github.com/pgsse/pgsse/store"
)

const testSecret = "test-secret-0123456789-abcdefghij"

// testServer is a running engine on a fresh, migrated database.
type testServer struct {
	*Server
	DSN    string
	cancel context.CancelFunc
	done   chan error
}

// startServer runs a Server on 127.0.0.1:0 against dsn (a fresh migrated database when
// dsn is ""). It is stopped at the end of the test.
func startServer(t testing.TB, dsn string, tweak func(*Config)) *testServer {
	t.Helper()
	if dsn == "" {
		dsn = migratedDB(t)
	}
	cfg := Config{
		DatabaseURL: dsn,
		Listen:      "127.0.0.1:0",
		Auth:        auth.Config{Secret: []byte(testSecret)},
		Heartbeat:   15 * time.Second,
		Retention:   0,
		Logger:      slog.New(slog.NewTextHandler(testLogWriter{t}, &slog.HandlerOptions{Level: testLogLevel()})),
	}
	if tweak != nil {
		tweak(&cfg)
	}
	srv, err := New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{Server: srv, DSN: dsn, cancel: cancel, done: make(chan error, 1)}
	go func() { ts.done <- srv.Run(ctx) }()
	select {
	case <-srv.Started():
	case err := <-ts.done:
		t.Fatalf("server did not start: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("server did not start within 15s")
	}
	t.Cleanup(func() { ts.Stop(t) })
	// Wait until the LISTEN session is up so that "live" means live.
	waitFor(t, 15*time.Second, "LISTEN session up", func() bool { return srv.lsn.ok() })
	return ts
}

// Stop shuts the server down gracefully (idempotent).
func (ts *testServer) Stop(t testing.TB) {
	if ts.cancel == nil {
		return
	}
	ts.cancel()
	ts.cancel = nil
	select {
	case err := <-ts.done:
		if err != nil {
			t.Errorf("server Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Error("server did not stop within 20s")
	}
}

func (ts *testServer) url(path string) string { return "http://" + ts.Addr().String() + path }

// migratedDB is a fresh database with pgsse's schema (internal/testkit/pgtest).
func migratedDB(t testing.TB) string {
	t.Helper()
	return pgtest.Migrated(t, store.Migrate)
}

// migrated migrates the database at dsn to pgsse's schema and returns dsn.
func migrated(t testing.TB, dsn string) string {
	t.Helper()
	return pgtest.Migrate(t, dsn, store.Migrate)
}

// connect opens a connection closed at test end.
var connect = pgtest.Connect

// publish runs pgsse.publish and returns the id.
func publish(t testing.TB, conn *pgconn.PgConn, stream, data, event string, audience []string) int64 {
	t.Helper()
	id, err := store.Publish(context.Background(), conn, stream, data, event, audience)
	require.NoError(t, err)
	return id
}

func token(t testing.TB, c auth.Claims, ttl time.Duration) string {
	t.Helper()
	tok, err := auth.Mint(auth.MintKey{Secret: []byte(testSecret)}, c, ttl, "", "", time.Now())
	require.NoError(t, err)
	return tok
}

// waitFor polls cond (internal/testkit: one polling helper for every package).
var waitFor = testkit.WaitFor

// sseClient is a raw TCP client that reads a response head and then SSE events (with
// internal/testkit/ssetest's parser, reading r).
type sseClient struct {
	t      testing.TB
	conn   net.Conn
	r      *bufio.Reader
	Status int
	Header http.Header
	Body   string // for non-200 responses: the whole body

	stream *ssetest.Stream // over r, made on first use
}

type sseEvent struct {
	HasID   bool
	IDValue string
	Event   string
	Data    string
	Retry   string
}

// dial sends a raw request head (lines without CRLF; Host is added) and reads the
// response head. A non-200 response's body is read to EOF.
func dial(t testing.TB, addr string, path string, headers ...string) *sseClient {
	t.Helper()
	return dialWith(t, &net.Dialer{Timeout: 10 * time.Second}, addr, path, headers...)
}

// dialWith is dial with a custom dialer (e.g. a tiny receive buffer, tinyRcvBuf).
func dialWith(t testing.TB, d *net.Dialer, addr, path string, headers ...string) *sseClient {
	t.Helper()
	conn, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	_, err = conn.Write([]byte(request("GET", path, headers...)))
	require.NoError(t, err)
	c := &sseClient{t: t, conn: conn, r: bufio.NewReaderSize(conn, 64<<10)}
	c.readHead()
	return c
}

func (c *sseClient) readHead() {
	c.t.Helper()
	_ = c.conn.SetReadDeadline(time.Now().Add(15 * time.Second))
	resp, err := http.ReadResponse(c.r, nil)
	require.NoError(c.t, err, "reading response head")
	c.Status = resp.StatusCode
	c.Header = resp.Header
	if c.Status != 200 {
		b, _ := io.ReadAll(resp.Body)
		c.Body = string(b)
	}
	_ = c.conn.SetReadDeadline(time.Time{})
}

// next reads one dispatched event (comments skipped; a retry-only block is returned as
// an event with Retry set and no data).
func (c *sseClient) next(timeout time.Duration) (sseEvent, error) {
	if c.stream == nil {
		c.stream = &ssetest.Stream{R: c.r, Conn: c.conn}
	}
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			left = time.Nanosecond
		}
		e, err := c.stream.Next(left)
		if err != nil {
			return sseEvent{}, err
		}
		if e.IsEvent() || e.Retry != "" {
			return sseEvent{HasID: e.HasID, IDValue: e.ID, Event: e.Type, Data: e.Data, Retry: e.Retry}, nil
		}
	}
}

func (c *sseClient) mustNext(timeout time.Duration) sseEvent {
	c.t.Helper()
	ev, err := c.next(timeout)
	require.NoError(c.t, err, "waiting for an event")
	return ev
}

// mustNextData skips retry-only blocks and returns the next real event.
func (c *sseClient) mustNextData(timeout time.Duration) sseEvent {
	c.t.Helper()
	for {
		ev := c.mustNext(timeout)
		if ev.Data != "" || ev.HasID || ev.Event != "" {
			return ev
		}
	}
}

func (e sseEvent) id() int64 {
	n, _ := strconv.ParseInt(e.IDValue, 10, 64)
	return n
}

func (e sseEvent) String() string {
	return fmt.Sprintf("{id:%q event:%q data:%q}", e.IDValue, e.Event, e.Data)
}

type testLogWriter struct{ t testing.TB }

func (w testLogWriter) Write(p []byte) (int, error) {
	if os.Getenv("PGSSE_TEST_LOGS") != "" {
		w.t.Log(strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

// testLogLevel is debug with PGSSE_TEST_LOGS=debug, else info.
func testLogLevel() slog.Level {
	if os.Getenv("PGSSE_TEST_LOGS") == "debug" {
		return slog.LevelDebug
	}
	return slog.LevelInfo
}
