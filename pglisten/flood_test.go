package pglisten

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

// counter is an Events that counts notifications on one channel and checks that each
// publisher's payloads arrive in order ("<publisher>-<n>").
type counter struct {
	target  int64
	n       atomic.Int64
	done    chan struct{}
	last    []int // per publisher; touched only on the session goroutine
	badSeq  atomic.Int64
	resyncs chan struct{}
}

func newCounter(target, publishers int) *counter {
	return &counter{target: int64(target), done: make(chan struct{}), last: make([]int, publishers), resyncs: make(chan struct{}, 10)}
}

func (c *counter) Notifications(b *Batch) {
	for _, nt := range b.Notes {
		c.see(nt.Payload)
	}
	b.Release()
}

func (c *counter) see(p []byte) {
	pub, seq := 0, 0
	i := 0
	for ; i < len(p) && p[i] != '-'; i++ {
		pub = pub*10 + int(p[i]-'0')
	}
	for i++; i < len(p); i++ {
		seq = seq*10 + int(p[i]-'0')
	}
	if pub < len(c.last) {
		if seq != c.last[pub]+1 {
			c.badSeq.Add(1)
		}
		c.last[pub] = seq
	}
	if c.n.Add(1) == c.target {
		close(c.done)
	}
}

func (c *counter) Down(error) {}
func (c *counter) Resynced()  { c.resyncs <- struct{}{} }

// publish sends total notifications on channel "flood" from publishers connections at once,
// each in transactions of at most perTx notifications.
func publish(dsn string, total, publishers, perTx int) error {
	var wg sync.WaitGroup
	errs := make(chan error, publishers)
	each := total / publishers
	for p := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			c, err := pgconn.Connect(ctx, dsn)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close(ctx)
			for from := 1; from <= each; from += perTx {
				to := min(from+perTx-1, each)
				sql := "SELECT count(pg_notify('flood', '" + strconv.Itoa(p) + "-'||g)) FROM generate_series(" +
					strconv.Itoa(from) + "," + strconv.Itoa(to) + ") g"
				if _, err := c.Exec(ctx, sql).ReadAll(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs // nil when closed and empty
}

// floodSession measures notifications/s through a Session: clock from the first publish to
// the last notification received.
func floodSession(tb testing.TB, dsn string, total, publishers int) (float64, *counter) {
	tb.Helper()
	c := newCounter(total, publishers)
	s := NewSession(Config{DSN: dsn, Logger: discardLogger()}, c)
	s.Start()
	defer s.Close()
	select {
	case <-c.resyncs:
	case <-time.After(15 * time.Second):
		tb.Fatal("session did not come up")
	}
	ack := make(chan error, 1)
	s.Listen("flood", func(err error) { ack <- err })
	require.NoError(tb, <-ack)
	start := time.Now()
	require.NoError(tb, publish(dsn, total, publishers, 25000))
	select {
	case <-c.done:
	case <-time.After(120 * time.Second):
		tb.Fatalf("session received %d of %d", c.n.Load(), total)
	}
	return float64(total) / time.Since(start).Seconds(), c
}

// floodPgconn is the baseline: a plain pgconn connection in a WaitForNotification loop.
func floodPgconn(tb testing.TB, dsn string, total, publishers int) float64 {
	tb.Helper()
	ctx := context.Background()
	cfg, err := pgconn.ParseConfig(dsn)
	require.NoError(tb, err)
	c := newCounter(total, publishers)
	cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) { c.see([]byte(n.Payload)) }
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	require.NoError(tb, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "LISTEN flood").ReadAll()
	require.NoError(tb, err)
	start := time.Now()
	pubErr := make(chan error, 1)
	go func() { pubErr <- publish(dsn, total, publishers, 25000) }()
	wctx, cancel := context.WithTimeout(ctx, 120*time.Second)
	defer cancel()
	for c.n.Load() < int64(total) {
		require.NoError(tb, conn.WaitForNotification(wctx))
	}
	rate := float64(total) / time.Since(start).Seconds()
	require.NoError(tb, <-pubErr)
	return rate
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestNotifyFlood: every notification of a multi-publisher flood arrives, each publisher's in
// its commit order.
func TestNotifyFlood(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	const total, publishers = 40000, 4
	rate, c := floodSession(t, dsn, total, publishers)
	assert.Equal(t, int64(total), c.n.Load())
	assert.Zero(t, c.badSeq.Load(), "per-publisher order")
	t.Logf("session: %.0f notifications/s (race detector on: %v)", rate, raceEnabled)
}

// BenchmarkNotifyFlood compares this Session with a plain pgconn WaitForNotification loop on
// the same flood (200k notifications from 4 publishers), in the same run. Run with
//
//	go test -run '^$' -bench NotifyFlood -benchtime 1x ./pglisten/
func BenchmarkNotifyFlood(b *testing.B) {
	dsn := pgtest.NewDatabase(b)
	const total, publishers = 200000, 4
	var sess, base float64
	runSession := func() {
		r, c := floodSession(b, dsn, total, publishers)
		if c.badSeq.Load() != 0 {
			b.Fatal("out of order")
		}
		sess += r
	}
	i := 0
	for b.Loop() {
		// Alternate which goes first, so neither side always runs on a warmer server.
		if i%2 == 0 {
			runSession()
			base += floodPgconn(b, dsn, total, publishers)
		} else {
			base += floodPgconn(b, dsn, total, publishers)
			runSession()
		}
		i++
	}
	b.ReportMetric(sess/float64(b.N), "session-notes/s")
	b.ReportMetric(base/float64(b.N), "pgconn-notes/s")
	b.ReportMetric(sess/base, "ratio")
}
