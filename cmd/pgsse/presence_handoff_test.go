package main

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit"
)

// Presence across a SIGUSR2 handoff between real processes (docs/operations.md, Upgrading
// without disconnects, step 5): pgsse.presence says the same before, during and after it —
// the predecessor's entries count the moved connections until the successor registers, which
// replaces them with its own counts before it says it serves — a watcher on another process
// hears nothing, and the successor's own exit (SIGTERM) announces the moved subjects' leaves.
func TestHandoffSIGUSR2KeepsPresence(t *testing.T) {
	dsn := migrated(t)
	a := servePresence(t, dsn, "", 1, presenceInterval)
	other := servePresence(t, dsn, "", 1, presenceInterval)
	watcher := openPresence(t, other.Listen, "room/1", "user:o", true)
	require.NotNil(t, watcher.next(t, 5*time.Second).Present)
	moved := openPresence(t, a.Listen, "room/1", "user:w", true)
	for _, sub := range []string{"user:a", "user:b", "user:b"} {
		openPresence(t, a.Listen, "room/1", sub, false)
	}
	const want = "user:a:1,user:b:2,user:o:1,user:w:1"
	testkit.WaitFor(t, 10*time.Second, "everyone present", func() bool { return sqlPresence(t, dsn, "room/1") == want })
	joined := map[string]bool{}
	for len(joined) < 3 {
		ev := watcher.next(t, 10*time.Second)
		require.Empty(t, ev.Leave)
		for _, s := range ev.Join {
			joined[s] = true
		}
	}
	for drained := false; !drained; { // the moved watcher's own events so far
		select {
		case <-moved.events:
		case <-time.After(3 * presenceInterval):
			drained = true
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgconn.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var mu sync.Mutex
	var wrong []string
	polls := 0
	stop := make(chan struct{})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			res := conn.ExecParams(ctx, `SELECT coalesce(string_agg(sub || ':' || connections, ',' ORDER BY sub COLLATE "C"), '') FROM pgsse.presence('room/1')`,
				nil, nil, nil, nil).Read()
			mu.Lock()
			polls++
			if res.Err == nil && string(res.Rows[0][0]) != want && len(wrong) < 10 {
				wrong = append(wrong, time.Now().Format("15:04:05.000")+" "+string(res.Rows[0][0]))
			}
			mu.Unlock()
		}
	}()

	pred := a.Process()
	a.Signal(syscall.SIGUSR2)
	line, err := pred.WaitLine(ctxFor(t, 45*time.Second), func(l []byte) bool {
		return bytes.Contains(l, []byte("handed everything over to the successor"))
	})
	require.NoError(t, err, "the predecessor hands over")
	var m struct{ Successor, Connections int }
	require.NoError(t, json.Unmarshal(line, &m))
	require.NotZero(t, m.Successor)
	t.Cleanup(func() { stopPID(t, m.Successor) })
	assert.Equal(t, 4, m.Connections)
	assert.Equal(t, 0, a.WaitExit(20*time.Second), "the predecessor exits 0")
	time.Sleep(5 * presenceInterval) // and well after
	close(stop)
	<-polled
	mu.Lock()
	assert.Empty(t, wrong, "pgsse.presence before, during and after the handoff (%d reads)", polls)
	mu.Unlock()
	assert.Contains(t, pred.Output(), "leaving this process's entries to its successor")

	select {
	case ev := <-watcher.events:
		t.Errorf("the other process's watcher was told of a change: %+v", ev)
	default:
	}
	for drained := false; !drained; { // the moved watcher: at most a full event, naming everyone
		select {
		case ev := <-moved.events:
			require.NotNil(t, ev.Present, "the moved watcher gets no change: %+v", ev)
			assert.ElementsMatch(t, []string{"user:a", "user:b", "user:o", "user:w"}, *ev.Present)
		case <-time.After(presenceInterval):
			drained = true
		}
	}

	// The successor counts them as its own: they leave when it stops for good.
	stopPID(t, m.Successor)
	left := map[string]bool{}
	for len(left) < 3 {
		ev := watcher.next(t, 10*time.Second)
		assert.Empty(t, ev.Join)
		for _, s := range ev.Leave {
			left[s] = true
		}
	}
	assert.Equal(t, map[string]bool{"user:a": true, "user:b": true, "user:w": true}, left)
	assert.Equal(t, "user:o:1", sqlPresence(t, dsn, "room/1"))
}
