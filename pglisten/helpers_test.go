package pglisten

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/internal/testkit/servetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		servetest.RemoveBinaries()
		os.Exit(code)
	}))
}

type note struct {
	pid     uint32
	channel string
	payload string
}

// recorder is an Events that records everything on buffered channels (never blocks: the
// buffers are far larger than any test sends).
type recorder struct {
	notes   chan note
	downs   chan error
	resyncs chan struct{}
}

func newRecorder() *recorder {
	return &recorder{notes: make(chan note, 10000), downs: make(chan error, 100), resyncs: make(chan struct{}, 100)}
}

func (r *recorder) Notifications(b *Batch) {
	for _, n := range b.Notes {
		r.notes <- note{n.PID, string(n.Channel), string(n.Payload)}
	}
	b.Release()
}
func (r *recorder) Down(err error) { r.downs <- err }
func (r *recorder) Resynced()      { r.resyncs <- struct{}{} }

// waitNote waits for the next notification on channel, skipping others.
func (r *recorder) waitNote(t *testing.T, channel string, timeout time.Duration) note {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case n := <-r.notes:
			if n.channel == channel {
				return n
			}
		case <-deadline:
			t.Fatalf("no notification on %q within %v", channel, timeout)
		}
	}
}

func (r *recorder) waitResync(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-r.resyncs:
	case <-time.After(timeout):
		t.Fatalf("no Resynced within %v", timeout)
	}
}

func (r *recorder) waitDown(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-r.downs:
		return err
	case <-time.After(timeout):
		t.Fatalf("no Down within %v", timeout)
		return nil
	}
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// startSession starts a session on dsn and waits for its first Resynced.
func startSession(t *testing.T, cfg Config) (*Session, *recorder) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	rec := newRecorder()
	s := NewSession(cfg, rec)
	s.Start()
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	rec.waitResync(t, 15*time.Second)
	require.True(t, s.Up())
	require.NotZero(t, s.PID())
	return s, rec
}

// listen calls s.Listen and waits for done.
func listen(t *testing.T, s *Session, channel string) error {
	t.Helper()
	done := make(chan error, 1)
	s.Listen(channel, func(err error) { done <- err })
	select {
	case err := <-done:
		return err
	case <-time.After(15 * time.Second):
		t.Fatalf("Listen(%q) did not complete", channel)
		return nil
	}
}

// notifier is an ordinary connection that sends NOTIFYs.
type notifier struct {
	t *testing.T
	c *pgconn.PgConn
}

func newNotifier(t *testing.T, dsn string) *notifier {
	t.Helper()
	return &notifier{t: t, c: pgtest.Connect(t, dsn)}
}

// notify sends pg_notify(channel, payload) with both as bound parameters; returns the pid of
// the notifying backend.
func (n *notifier) notify(channel, payload string) uint32 {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	res := n.c.ExecParams(ctx, "SELECT pg_notify($1, $2)", [][]byte{[]byte(channel), []byte(payload)}, nil, nil, nil).Read()
	require.NoError(n.t, res.Err)
	return n.c.PID()
}

func (n *notifier) exec(sql string) {
	n.t.Helper()
	pgtest.ExecOn(n.t, n.c, sql)
}

// query returns the one value of a one-row result (no row fails the test).
func (n *notifier) query(sql string) string {
	n.t.Helper()
	return pgtest.QueryValueOn(n.t, n.c, sql)
}

// logCapture is a slog handler that keeps records at or above warn.
type logCapture struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logCapture) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelWarn }
func (l *logCapture) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.recs = append(l.recs, r.Clone())
	l.mu.Unlock()
	return nil
}
func (l *logCapture) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCapture) WithGroup(string) slog.Handler      { return l }

func (l *logCapture) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.recs {
		if r.Message == msg {
			n++
		}
	}
	return n
}
