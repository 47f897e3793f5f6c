package pglisten

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/names"
)

func nextEvent(t *testing.T, l Listener, timeout time.Duration) Event {
	t.Helper()
	select {
	case e, ok := <-l.Events():
		require.True(t, ok, "Events closed")
		return e
	case <-time.After(timeout):
		t.Fatalf("no event within %v", timeout)
		return Event{}
	}
}

func nextNotification(t *testing.T, l Listener, timeout time.Duration) Event {
	t.Helper()
	for {
		e := nextEvent(t, l, timeout)
		if e.Kind == KindNotification {
			return e
		}
	}
}

func TestDirectListener(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	l, err := NewDirect(Config{DSN: dsn, Logger: testLogger(t)})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	n := newNotifier(t, dsn)

	assert.Equal(t, KindResync, nextEvent(t, l, 10*time.Second).Kind, "first connect reports a resync")
	require.NoError(t, l.Listen(ctx, "jobs"))
	require.NoError(t, l.Listen(ctx, "jobs"), "idempotent")
	assert.ErrorIs(t, l.Listen(ctx, ""), names.ErrChannelEmpty)

	pid := n.notify("jobs", "héllo")
	e := nextNotification(t, l, 5*time.Second)
	assert.Equal(t, Event{Kind: KindNotification, Channel: "jobs", PID: pid, Payload: []byte("héllo")}, e)

	require.NoError(t, l.Unlisten(ctx, "jobs"))
	assert.ErrorIs(t, l.Unlisten(ctx, "jobs"), ErrNotListening)
	require.NoError(t, l.Listen(ctx, "other"))
	n.exec(`BEGIN; SELECT pg_notify('jobs', 'x'); SELECT pg_notify('other', 'y'); COMMIT`)
	e = nextNotification(t, l, 5*time.Second)
	assert.Equal(t, "other", e.Channel, "an unlistened channel delivers nothing")

	// Session loss: KindDown, then KindResync once every channel is LISTENed again.
	n.exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgsse-listen' AND datname = current_database()")
	assert.Equal(t, KindDown, nextEvent(t, l, 5*time.Second).Kind)
	assert.Equal(t, KindResync, nextEvent(t, l, 5*time.Second).Kind)
	n.notify("other", "after")
	assert.Equal(t, "after", string(nextNotification(t, l, 5*time.Second).Payload))

	require.NoError(t, l.Close())
	_, ok := <-l.Events()
	assert.False(t, ok, "Close closes Events")
	assert.ErrorIs(t, l.Listen(ctx, "late"), ErrClosed)
}

func TestDirectListenContext(t *testing.T) {
	// No server: Listen waits for the session and gives up with its context.
	l, err := NewDirect(Config{DSN: "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable", Logger: testLogger(t)})
	require.NoError(t, err)
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, l.Listen(ctx, "never"), context.DeadlineExceeded)
	assert.ErrorIs(t, l.Unlisten(context.Background(), "never"), ErrNotListening, "an abandoned Listen leaves nothing behind")

	_, err = NewDirect(Config{DSN: "postgres://[bad"})
	assert.Error(t, err, "a DSN that cannot parse is refused up front")
}

// TestDirectOverflow: an application that does not read gets the queue's worth of
// notifications, then one KindResync in place of everything dropped.
func TestDirectOverflow(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	l, err := NewDirect(Config{DSN: dsn, EventBuffer: 10, Logger: testLogger(t)})
	require.NoError(t, err)
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	require.Equal(t, KindResync, nextEvent(t, l, 10*time.Second).Kind)
	require.NoError(t, l.Listen(ctx, "flood"))
	n := newNotifier(t, dsn)
	n.exec("SELECT count(pg_notify('flood', g::text)) FROM generate_series(1, 200) g")

	d := l.(*direct)
	require.Eventually(t, func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.overflow
	}, 5*time.Second, 5*time.Millisecond)

	var got []string
	for {
		e := nextEvent(t, l, 5*time.Second)
		if e.Kind == KindResync {
			assert.Empty(t, e.Channel, "resync for all")
			break
		}
		require.Equal(t, KindNotification, e.Kind)
		got = append(got, string(e.Payload))
	}
	assert.NotEmpty(t, got)
	assert.LessOrEqual(t, len(got), 2*10+1, "bounded by EventBuffer (queue + batch in hand)")
	for i, p := range got {
		assert.Equal(t, strconv.Itoa(i+1), p, "what is delivered is a prefix, in order")
	}
	// After the resync, delivery resumes normally.
	n.notify("flood", "fresh")
	assert.Equal(t, "fresh", string(nextNotification(t, l, 5*time.Second).Payload))
}
