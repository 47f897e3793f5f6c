package pglisten

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/internal/testkit/servetest"
	"github.com/pgsse/pgsse/store"
)

// TestFailoverRealHubOneResync: a Failover on the hub of a real `pgsse serve` process; the
// server stops (SIGTERM: the hub sends SHUTDOWN), the Listener switches to its own session and
// reports exactly one KindResync for that one switch — the next event after it is the next
// notification, not a second resync from the direct session's first connect.
func TestFailoverRealHubOneResync(t *testing.T) {
	dsn := pgtest.Migrated(t, store.Migrate)
	sock := socketPath(t)
	serve := servetest.Start(t, servetest.Options{DSN: dsn, NoAdmin: true, Wait: servetest.WaitServing, StopTimeout: 20 * time.Second,
		Args: []string{"--hub-socket", sock, "--jwt-secret", "0123456789abcdef0123456789abcdef", "--retention", "0"}})

	l, err := NewFailover(FailoverConfig{
		Hub:    HubConfig{Socket: sock, PingInterval: -1},
		Direct: Config{DSN: dsn},
	})
	require.NoError(t, err)
	defer l.Close()
	f := l.(*Failover)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, l.Listen(ctx, "work"))
	require.Equal(t, SourceHub, f.Source())
	pgExec(t, dsn, "NOTIFY work, 'via the hub'")
	assert.Equal(t, "via the hub", string(nextHubEvent(t, l).Payload))

	serve.Signal(syscall.SIGTERM)
	var ev Event
	for ev = nextHubEvent(t, l); ev.Kind == KindDown; ev = nextHubEvent(t, l) {
		// The hub may report its own LISTEN session going down while it stops.
	}
	assert.Equal(t, Event{Kind: KindResync}, ev, "the switch is one resync of everything")
	assert.Equal(t, SourceDirect, f.Source())
	assert.ErrorIs(t, f.Reason(), ErrHubShutdown)

	pgExec(t, dsn, "NOTIFY work, 'direct'")
	ev = nextHubEvent(t, l)
	assert.Equal(t, Event{Kind: KindNotification, Channel: "work", PID: ev.PID, Payload: []byte("direct")}, ev,
		"after the switch's resync comes the notification, not a second resync")
	require.NoError(t, l.Close())
	assert.Equal(t, 0, serve.WaitExit(20*time.Second), "pgsse serve exits 0 after SIGTERM")
	_, err = os.Lstat(sock)
	assert.ErrorIs(t, err, os.ErrNotExist)
}
