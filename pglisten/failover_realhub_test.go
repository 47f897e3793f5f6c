package pglisten

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/scripts/pgtest"
)

// TestFailoverRealHubOneResync: a Failover on the hub of a real `pgsse serve` process; the
// server stops (SIGTERM: the hub sends SHUTDOWN), the Listener switches to its own session and
// reports exactly one KindResync for that one switch — the next event after it is the next
// notification, not a second resync from the direct session's first connect.
func TestFailoverRealHubOneResync(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "pgsse")
	build := exec.Command("go", "build", "-o", bin, "../cmd/pgsse")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build ./cmd/pgsse: %s", out)
	out, err = exec.Command(bin, "migrate", "--database-url", dsn).CombinedOutput()
	require.NoError(t, err, "pgsse migrate: %s", out)

	sock := socketPath(t)
	logs := &pgtest.SyncBuffer{}
	serve := exec.Command(bin, "serve", "--database-url", dsn, "--listen", "127.0.0.1:0", "--admin-listen", "",
		"--hub-socket", sock, "--jwt-secret", "0123456789abcdef0123456789abcdef", "--retention", "0")
	serve.Stdout, serve.Stderr = logs, logs
	require.NoError(t, serve.Start())
	exited := make(chan struct{})
	go func() { _ = serve.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = serve.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("pgsse serve log:\n%s", logs.String())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			break
		}
		select {
		case <-exited:
			t.Fatalf("pgsse serve exited:\n%s", logs.String())
		default:
		}
		require.True(t, time.Now().Before(deadline), "the hub socket does not answer after 30 s")
		time.Sleep(20 * time.Millisecond) // polling: the socket answering is the signal
	}

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

	require.NoError(t, serve.Process.Signal(syscall.SIGTERM))
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
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		t.Error("pgsse serve did not exit within 20 s of SIGTERM")
	}
	_, err = os.Lstat(sock)
	assert.ErrorIs(t, err, os.ErrNotExist)
}
