package engine

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/store"
)

// This file holds the helpers of the sse_*_test.go end-to-end tests: raw HTTP exchanges,
// SSE readers that check ids, a flat-out publisher and RSS sampling.

// httpResult is one complete, close-delimited non-streaming response.
type httpResult struct {
	Status int
	Header http.Header
	Body   string // the body as sent (for HEAD: whatever followed the head)
	Close  bool   // the response said Connection: close (net/http drops that header)
}

// exchange writes raw (a complete request, CRLFs included) to addr and reads one
// response to EOF. method tells http.ReadResponse whether a body may follow.
func exchange(t testing.TB, addr, method, raw string) httpResult {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	_, err = conn.Write([]byte(raw))
	require.NoError(t, err)
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, &http.Request{Method: method})
	require.NoError(t, err, "reading the response to %q", firstLine(raw))
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if method == http.MethodHead {
		rest, _ := io.ReadAll(r)
		body = append(body, rest...)
	}
	return httpResult{Status: resp.StatusCode, Header: resp.Header, Body: string(body)}
}

// request builds a request head: method, target, Host, then the extra header lines.
func request(method, target string, headers ...string) string {
	var b strings.Builder
	b.WriteString(method + " " + target + " HTTP/1.1\r\nHost: pgsse.test\r\n")
	for _, h := range headers {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("\r\n")
	return b.String()
}

// get is exchange for a GET request.
func get(t testing.TB, addr, target string, headers ...string) httpResult {
	t.Helper()
	return exchange(t, addr, "GET", request("GET", target, headers...))
}

// assertErrorBody checks docs/http.md's "Every error body is one text/plain line".
func assertErrorBody(t testing.TB, r httpResult) {
	t.Helper()
	assert.True(t, strings.HasPrefix(r.Header.Get("Content-Type"), "text/plain"), "Content-Type %q", r.Header.Get("Content-Type"))
	assert.True(t, strings.HasSuffix(r.Body, "\n"), "body %q ends with a line break", r.Body)
	line := strings.TrimSuffix(r.Body, "\n")
	assert.NotEmpty(t, strings.TrimSpace(line), "body says what was wrong")
	assert.NotContains(t, line, "\n", "body is one line: %q", r.Body)
	assert.NotContains(t, line, "\r", "body is one line: %q", r.Body)
}

// bearerH is an Authorization header line.
func bearerH(tok string) string { return "Authorization: Bearer " + tok }

// allStreams is a token for every stream, channel and the given tags.
func allStreams(t testing.TB, tags ...string) string {
	return token(t, auth.Claims{Streams: []string{"*"}, Channels: []string{"*"}, Tags: tags}, time.Hour)
}

// readBlock reads raw lines up to and including the next blank line.
func (c *sseClient) readBlock(timeout time.Duration) (string, error) {
	_ = c.conn.SetReadDeadline(time.Now().Add(timeout))
	defer c.conn.SetReadDeadline(time.Time{})
	var b strings.Builder
	for {
		line, err := c.r.ReadString('\n')
		b.WriteString(line)
		if err != nil {
			return b.String(), err
		}
		if line == "\n" {
			return b.String(), nil
		}
	}
}

// rawEvent reads the next raw block that is not only comments/retry.
func (c *sseClient) rawEvent(timeout time.Duration) string {
	c.t.Helper()
	for {
		blk, err := c.readBlock(timeout)
		require.NoError(c.t, err, "reading a raw event (so far %q)", blk)
		for _, l := range strings.Split(strings.TrimSuffix(blk, "\n"), "\n") {
			if l != "" && !strings.HasPrefix(l, ":") && !strings.HasPrefix(l, "retry:") {
				return blk
			}
		}
	}
}

// expectRetryEOF reads until the server closes and returns the last retry value it
// sent; it fails unless the stream ends in EOF (and not a timeout) and carries no event.
func (c *sseClient) expectRetryEOF(timeout time.Duration) int64 {
	c.t.Helper()
	return c.retryBeforeEOF(timeout, false)
}

// retryBeforeEOF is expectRetryEOF; with events, events may come before the close.
func (c *sseClient) retryBeforeEOF(timeout time.Duration, events bool) int64 {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	var retry int64 = -1
	for {
		ev, err := c.next(time.Until(deadline))
		if err != nil {
			require.ErrorIs(c.t, err, io.EOF, "the server must close the connection (last retry %d)", retry)
			return retry
		}
		if !events && (ev.Data != "" || ev.HasID || ev.Event != "") {
			c.t.Fatalf("unexpected event before close: %v", ev)
		}
		if ev.Retry != "" {
			n, perr := strconv.ParseInt(ev.Retry, 10, 64)
			require.NoError(c.t, perr)
			retry = n
		}
	}
}

// assertJitteredRetry checks docs/http.md's "retry: <2000–10000 ms, jittered>".
func assertJitteredRetry(t testing.TB, retry int64) {
	t.Helper()
	assert.GreaterOrEqual(t, retry, int64(2000), "retry field before close")
	assert.LessOrEqual(t, retry, int64(10000), "retry field before close")
}

// readIDs reads durable events until the one with id last and checks they are exactly
// from..last, in order, with no gap event. It fails on anything else.
func (c *sseClient) readIDs(from, last int64, timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	want := from
	for want <= last {
		ev, err := c.next(time.Until(deadline))
		require.NoError(c.t, err, "waiting for id %d (ids %d..%d)", want, from, last)
		if ev.Data == "" && !ev.HasID && ev.Event == "" {
			continue // retry block
		}
		require.True(c.t, ev.HasID, "want id %d, got %v", want, ev)
		require.Equal(c.t, strconv.FormatInt(want, 10), ev.IDValue, "ids must be contiguous and in order (got %v)", ev)
		want++
	}
}

// sseEvents reads events (not retry blocks) until n were read or d passed.
func (c *sseClient) events(n int, d time.Duration) []sseEvent {
	var out []sseEvent
	deadline := time.Now().Add(d)
	for len(out) < n {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		ev, err := c.next(left)
		if err != nil {
			break
		}
		if ev.Data == "" && !ev.HasID && ev.Event == "" {
			continue
		}
		out = append(out, ev)
	}
	return out
}

// eventsSoon waits up to 10 s for a first event (a loaded machine may take a while to
// commit the next one), then reads up to n in all for d more.
func (c *sseClient) eventsSoon(n int, d time.Duration) []sseEvent {
	out := c.events(1, 10*time.Second)
	if len(out) == 0 {
		return nil
	}
	return append(out, c.events(n-1, d)...)
}

// expectSilence asserts that no event arrives within d (comments and retry blocks are
// allowed).
func (c *sseClient) expectSilence(d time.Duration) {
	c.t.Helper()
	evs := c.events(1, d)
	assert.Empty(c.t, evs, "no event expected")
}

// tinyRcvBuf is a dialer whose sockets have a small SO_RCVBUF (set before connect, so
// the TCP window is small from the start).
func tinyRcvBuf(size int) *net.Dialer {
	return &net.Dialer{Timeout: 10 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, size)
		})
		if err != nil {
			return err
		}
		return serr
	}}
}

// streamHead is the stream's committed head (0 if never published).
func streamHead(t testing.TB, dsn, stream string) int64 {
	t.Helper()
	v := pgtest.QueryValue(t, dsn, "SELECT coalesce((SELECT head FROM pgsse.streams WHERE stream = '"+stream+"'), 0)")
	n, err := strconv.ParseInt(v, 10, 64)
	require.NoError(t, err)
	return n
}

// publishN publishes data "<prefix><i>" for i in 1..n, one transaction each.
func publishN(t testing.TB, conn *pgconn.PgConn, stream, prefix string, n int) {
	t.Helper()
	for i := 1; i <= n; i++ {
		publish(t, conn, stream, prefix+strconv.Itoa(i), "", nil)
	}
}

// publisher publishes to stream as fast as it can (or every interval) until stopped.
// On an error it reconnects (a PostgreSQL restart); it never fails the test by itself.
type publisher struct {
	last     atomic.Int64 // last id returned by a successful publish
	errors   atomic.Int64
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

func startPublisher(t testing.TB, dsn, stream string, interval time.Duration) *publisher {
	t.Helper()
	p := &publisher{stop: make(chan struct{}), done: make(chan struct{})}
	conn := connectPlain(dsn)
	go func() {
		defer close(p.done)
		defer func() {
			if conn != nil {
				conn.Close(context.Background())
			}
		}()
		i := 0
		for {
			select {
			case <-p.stop:
				return
			default:
			}
			if conn == nil || conn.IsClosed() {
				if conn != nil {
					conn.Close(context.Background())
				}
				conn = connectPlain(dsn)
				if conn == nil {
					select {
					case <-p.stop:
						return
					case <-time.After(50 * time.Millisecond):
					}
					continue
				}
			}
			i++
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			id, err := store.Publish(ctx, conn, stream, "e"+strconv.Itoa(i), "", nil)
			cancel()
			if err != nil {
				p.errors.Add(1)
				conn.Close(context.Background())
				conn = nil
				continue
			}
			p.last.Store(id)
			if interval > 0 {
				select {
				case <-p.stop:
					return
				case <-time.After(interval):
				}
			}
		}
	}()
	t.Cleanup(p.Stop)
	return p
}

func (p *publisher) Stop() {
	p.stopOnce.Do(func() { close(p.stop) })
	<-p.done
}

func connectPlain(dsn string) *pgconn.PgConn {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		return nil
	}
	return c
}

// vmRSS is this process's resident set size in bytes (the server runs in-process).
func vmRSS(t testing.TB) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	for _, line := range bytes.Split(b, []byte("\n")) {
		if rest, ok := bytes.CutPrefix(line, []byte("VmRSS:")); ok {
			f := strings.Fields(string(rest))
			require.Len(t, f, 2)
			n, err := strconv.ParseInt(f[0], 10, 64)
			require.NoError(t, err)
			return n << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// onLoop runs f on the server's loop goroutine and waits for it (white-box sampling of
// loop-owned state, e.g. outbound buffer sizes).
func (ts *testServer) onLoop(t testing.TB, f func()) {
	t.Helper()
	done := make(chan struct{})
	require.True(t, ts.tasks.push(func() { f(); close(done) }), "loop task queue closed")
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("loop task did not run within 10s")
	}
}

// isEOF reports whether err is a clean close by the peer.
func isEOF(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// streamSub is the connection's subscription to stream name, or nil (on the loop).
func (sc *sseConn) streamSub(name string) *subscription {
	for i := range sc.subCount() {
		if sub := sc.sub(i); sub.stream() != nil && sub.stream().name == name {
			return sub
		}
	}
	return nil
}
