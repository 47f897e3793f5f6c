package pglisten

import (
	"log/slog"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

// flowsAgain asserts that a notification sent now arrives, within the time left until deadline.
func flowsAgain(t *testing.T, rec *recorder, n *notifier, channel string, since time.Time, within time.Duration) {
	t.Helper()
	payload := "again-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	n.notify(channel, payload)
	for {
		got := rec.waitNote(t, channel, within)
		if got.payload == payload {
			break
		}
	}
	elapsed := time.Since(since)
	assert.Less(t, elapsed, within, "notifications must flow again within %v of the fault (took %v)", within, elapsed)
}

func TestFaultTerminateBackend(t *testing.T) {
	t.Parallel()
	c := pgtest.StartCluster(t, pgtest.ClusterOptions{})
	dsn := c.URL("disable")
	s, rec := startSession(t, Config{DSN: dsn, BackoffMax: time.Second})
	require.NoError(t, listen(t, s, "fault"))
	n := newNotifier(t, dsn)
	oldPID := s.PID()

	start := time.Now()
	assert.Equal(t, "t", n.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgsse-listen'"))
	err := rec.waitDown(t, 2*time.Second)
	assert.Contains(t, err.Error(), "57P01", "Down should say PostgreSQL terminated the session")
	rec.waitResync(t, 2*time.Second)
	assert.NotEqual(t, oldPID, s.PID())
	assert.True(t, s.Up())
	flowsAgain(t, rec, n, "fault", start, 2*time.Second)
	assert.Equal(t, uint64(2), s.Connects())
}

func TestFaultRestart(t *testing.T) {
	t.Parallel()
	c := pgtest.StartCluster(t, pgtest.ClusterOptions{})
	dsn := c.URL("disable")
	s, rec := startSession(t, Config{DSN: dsn, BackoffMax: time.Second})
	require.NoError(t, listen(t, s, "fault"))

	c.Restart() // pg_ctl restart -m fast; returns once the server accepts connections
	restarted := time.Now()
	rec.waitDown(t, 5*time.Second)
	rec.waitResync(t, 2*time.Second)
	n := newNotifier(t, dsn)
	flowsAgain(t, rec, n, "fault", restarted, 2*time.Second)
}

func TestFaultStoppedTenSeconds(t *testing.T) {
	t.Parallel()
	c := pgtest.StartCluster(t, pgtest.ClusterOptions{})
	dsn := c.URL("disable")
	logs := &logCapture{}
	s, rec := startSession(t, Config{DSN: dsn, BackoffMax: 2 * time.Second, Logger: slog.New(logs)})
	require.NoError(t, listen(t, s, "fault"))

	c.Stop()
	rec.waitDown(t, 5*time.Second)
	before := s.ConnectFailures()
	time.Sleep(10 * time.Second) // the outage itself, not synchronisation
	attempts := s.ConnectFailures() - before
	t.Logf("connection attempts during a 10 s outage with BackoffMax 2s: %d", attempts)
	assert.GreaterOrEqual(t, attempts, uint64(4), "must keep retrying")
	assert.LessOrEqual(t, attempts, uint64(30), "no busy loop")
	assert.Equal(t, int(s.ConnectFailures()), logs.count("pglisten: connect failed"), "each failure is logged at warn")
	assert.False(t, s.Up())

	// A Listen while down waits for the session and completes after re-LISTEN.
	pending := make(chan error, 1)
	s.Listen("while-down", func(err error) { pending <- err })

	c.Start()
	back := time.Now()
	rec.waitResync(t, 5*time.Second)
	select {
	case err := <-pending:
		require.NoError(t, err)
	default:
		t.Fatal("a Listen made while down must complete before Resynced")
	}
	n := newNotifier(t, dsn)
	flowsAgain(t, rec, n, "fault", back, 3*time.Second)
	n.notify("while-down", "w")
	assert.Equal(t, "w", rec.waitNote(t, "while-down", 5*time.Second).payload)
}

// TestFaultHalfOpen: a backend that stops answering (SIGSTOP) is detected by the ping.
func TestFaultHalfOpen(t *testing.T) {
	t.Parallel()
	c := pgtest.StartCluster(t, pgtest.ClusterOptions{})
	dsn := c.URL("disable")
	s, rec := startSession(t, Config{DSN: dsn, PingInterval: 300 * time.Millisecond, PingTimeout: time.Second, BackoffMax: time.Second})
	require.NoError(t, listen(t, s, "fault"))
	pid := int(s.PID())
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })

	stopped := time.Now()
	err := rec.waitDown(t, 5*time.Second)
	assert.Contains(t, err.Error(), "ping")
	assert.Less(t, time.Since(stopped), 3*time.Second, "detected within PingInterval+PingTimeout+tick")
	rec.waitResync(t, 5*time.Second)
	assert.NotEqual(t, uint32(pid), s.PID())
	n := newNotifier(t, dsn)
	flowsAgain(t, rec, n, "fault", stopped, 5*time.Second)
}

// TestTransports: TLS (sslmode=require) and a Unix socket run the same session code.
func TestTransports(t *testing.T) {
	t.Parallel()
	c := pgtest.StartCluster(t, pgtest.ClusterOptions{SSL: true})
	tests := []struct {
		name, dsn, check, want string
	}{
		{"tls", c.URL("require"), "SELECT ssl FROM pg_stat_ssl WHERE pid = %d", "t"},
		{"unix socket", c.SocketURL(), "SELECT coalesce(client_addr::text, 'local') FROM pg_stat_activity WHERE pid = %d", "local"},
		{"tcp", c.URL("disable"), "SELECT ssl FROM pg_stat_ssl WHERE pid = %d", "f"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, rec := startSession(t, Config{DSN: tc.dsn})
			require.NoError(t, listen(t, s, "transport"))
			n := newNotifier(t, c.URL("disable"))
			q := tc.check[:len(tc.check)-2] + strconv.FormatUint(uint64(s.PID()), 10)
			assert.Equal(t, tc.want, n.query(q))
			assert.Equal(t, "pgsse-listen", n.query("SELECT application_name FROM pg_stat_activity WHERE pid = "+strconv.FormatUint(uint64(s.PID()), 10)))
			pid := n.notify("transport", "over "+tc.name)
			got := rec.waitNote(t, "transport", 5*time.Second)
			assert.Equal(t, "over "+tc.name, got.payload)
			assert.Equal(t, pid, got.pid)
		})
	}
}
