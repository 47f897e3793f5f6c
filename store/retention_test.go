package store

import (
	"bytes"
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

// logBuffer is a goroutine-safe log sink.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestRetentionInterval(t *testing.T) {
	for _, tc := range []struct{ retention, want time.Duration }{
		{24 * time.Hour, time.Hour},
		{time.Hour, 150 * time.Second},
		{time.Minute, time.Minute},
		{1000 * time.Hour, time.Hour},
	} {
		assert.Equal(t, tc.want, RetentionInterval(tc.retention), tc.retention.String())
	}
}

func TestRunRetention(t *testing.T) {
	dsn := migrated(t)
	pgtest.Exec(t, dsn, `SELECT pgsse.publish('r', 'x') FROM generate_series(1, 5);
		UPDATE pgsse.events SET created_at = now() - interval '2 hours' WHERE id <= 3`)
	var logs logBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(context.Background())
	returned := make(chan struct{})
	go func() {
		runRetention(ctx, dsn, time.Hour, 20*time.Millisecond, logger)
		close(returned)
	}()
	require.Eventually(t, func() bool {
		return pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.events") == "2"
	}, 10*time.Second, 10*time.Millisecond)

	// Later passes find nothing and stay quiet; the newer events survive.
	pgtest.Exec(t, dsn, "UPDATE pgsse.events SET created_at = now() - interval '2 hours' WHERE id = 4")
	require.Eventually(t, func() bool {
		return pgtest.QueryValue(t, dsn, "SELECT string_agg(id::text, ',') FROM pgsse.events") == "5"
	}, 10*time.Second, 10*time.Millisecond)
	cancel()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("RunRetention did not return after ctx was cancelled")
	}
	out := logs.String()
	assert.Equal(t, 1, strings.Count(out, "rows=3"), out)
	assert.Equal(t, 1, strings.Count(out, "rows=1"), out)
	assert.Equal(t, 2, strings.Count(out, "level=INFO"), "only passes that delete log: %s", out)
	assert.NotContains(t, out, "level=WARN")
}

func TestRunRetentionFailuresAreLogged(t *testing.T) {
	dsn := pgtest.NewDatabase(t) // not migrated: pgsse.prune does not exist
	var logs logBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	ctx, cancel := context.WithCancel(context.Background())
	returned := make(chan struct{})
	go func() {
		runRetention(ctx, dsn, time.Hour, 10*time.Millisecond, logger)
		close(returned)
	}()
	require.Eventually(t, func() bool { return strings.Count(logs.String(), "level=WARN") >= 2 },
		10*time.Second, 10*time.Millisecond, "keeps going after a failure")
	cancel()
	<-returned
	assert.Contains(t, logs.String(), "pgsse.prune")

	// keep forever: returns at once
	done := make(chan struct{})
	go func() { RunRetention(context.Background(), dsn, 0, logger); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("retention 0 must return at once")
	}
}

// prunedIn returns how long pgsse.prune('0 seconds', 3) takes on a fresh database with
// one stream of n events and 14 of 10 (the setup of issue 11).
func prunedIn(t *testing.T, n int, migrations []Migration) time.Duration {
	dsn := pgtest.NewDatabase(t)
	c := connect(t, dsn)
	_, _, err := migrate(context.Background(), c, migrations)
	require.NoError(t, err)
	pgtest.Exec(t, dsn, `SELECT count(pgsse.publish('big', 'x')) FROM generate_series(1, `+strconv.Itoa(n)+`);
		SELECT count(pgsse.publish('small/' || s, 'x')) FROM generate_series(1, 14) s, generate_series(1, 10)`)
	start := time.Now()
	deleted, err := Prune(context.Background(), c, 0, 3)
	elapsed := time.Since(start)
	require.NoError(t, err)
	require.EqualValues(t, n-3+14*7, deleted)
	require.Equal(t, strconv.Itoa(n-2)+"-"+strconv.Itoa(n), pgtest.QueryValue(t, dsn,
		"SELECT min(id) || '-' || max(id) FROM pgsse.events WHERE stream = 'big'"))
	return elapsed
}

// Issue 11: retention was quadratic in a stream's length (the per-stream cut ran as a
// join filter once per event row). Four times the events may take about four times as
// long, never the sixteen a quadratic prune takes: the bound, 8×, sits between the two so
// that a busy machine's noise cannot cross it either way. N and 4N are measured in turn,
// three times each, and the fastest of each kept, so a burst of load hits both sizes.
func TestPruneScalesLinearly(t *testing.T) {
	const n = 5000
	t1, t4 := time.Duration(1<<63-1), time.Duration(1<<63-1)
	for range 3 {
		t1 = min(t1, prunedIn(t, n, Migrations))
		t4 = min(t4, prunedIn(t, 4*n, Migrations))
	}
	t.Logf("prune %d events: %v; %d events: %v (ratio %.2f)", n, t1, 4*n, t4, float64(t4)/float64(t1))
	assert.LessOrEqual(t, t4, 8*t1, "prune of 4N events must take at most 8× prune of N (linear: 4×, quadratic: 16×)")
}

// Issue 20: pgsse.events has no index but its primary key, and pgsse.prune passes over a
// stream it emptied (pgsse.pruned_streams) only until the stream is published to again:
// events published after a full prune are pruned by the next one, and a stream whose
// cache row says "empty" but which holds events again (published meanwhile) is probed.
func TestPruneAfterEmptiedStream(t *testing.T) {
	dsn := migrated(t)
	ctx := context.Background()
	c := connect(t, dsn)
	assert.Equal(t, "events_pkey", pgtest.QueryValue(t, dsn,
		"SELECT string_agg(indexname, ',' ORDER BY indexname) FROM pg_indexes WHERE schemaname = 'pgsse' AND tablename = 'events'"))

	pgtest.Exec(t, dsn, `SELECT pgsse.publish('e/a', 'x') FROM generate_series(1, 3);
		SELECT pgsse.publish('e/b', 'x') FROM generate_series(1, 2)`)
	n, err := Prune(ctx, c, 0, 0)
	require.NoError(t, err)
	assert.EqualValues(t, 5, n)
	assert.Equal(t, "e/a:4,e/b:3", pgtest.QueryValue(t, dsn,
		"SELECT string_agg(stream || ':' || next_id, ',' ORDER BY stream) FROM pgsse.pruned_streams"))

	// Nothing to do: both streams are passed over.
	n, err = Prune(ctx, c, 0, 0)
	require.NoError(t, err)
	assert.Zero(t, n)

	// e/a gets events again: the next prune finds them; e/b stays passed over.
	pgtest.Exec(t, dsn, `SELECT pgsse.publish('e/a', 'y') FROM generate_series(1, 4)`)
	n, err = Prune(ctx, c, 0, 1)
	require.NoError(t, err)
	assert.EqualValues(t, 3, n, "ids 4-6 of e/a go, 7 is kept")
	assert.Equal(t, "7-7", pgtest.QueryValue(t, dsn,
		"SELECT min(id) || '-' || max(id) FROM pgsse.events WHERE stream = 'e/a'"))
	n, err = Prune(ctx, c, 0, 0)
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)

	// A stale row (the cache is only a hint: a crash or a copy may leave one behind)
	// never hides events: a head past next_id means "probe".
	pgtest.Exec(t, dsn, `SELECT pgsse.publish('e/b', 'z');
		UPDATE pgsse.pruned_streams SET next_id = 1 WHERE stream = 'e/b'`)
	n, err = Prune(ctx, c, 0, 0)
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)
	assert.Equal(t, "0", pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.events"))
}
