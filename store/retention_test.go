package store

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/scripts/pgtest"
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
