package pglisten

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/names"
)

func TestPayloadFidelity(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s, rec := startSession(t, Config{DSN: dsn})
	require.NoError(t, listen(t, s, "fidelity"))
	n := newNotifier(t, dsn)

	max := strings.Repeat("é", 3999) + "a" // 7999 bytes of multi-byte text: PostgreSQL's limit
	require.Len(t, max, 7999)
	tests := []struct{ name, payload string }{
		{"ascii", "hello, world"},
		{"utf8", "naïve café — 日本語 🚀"},
		{"empty", ""},
		{"7999 bytes", max},
		{"7999 ascii", strings.Repeat("x", 7999)},
		{"control bytes", "tab\tnewline\nquote\"'\\"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pid := n.notify("fidelity", tc.payload)
			got := rec.waitNote(t, "fidelity", 5*time.Second)
			assert.Equal(t, tc.payload, got.payload)
			assert.Equal(t, pid, got.pid, "pid must be the notifier's pg_backend_pid()")
			assert.Equal(t, n.query("SELECT pg_backend_pid()"), strconv.FormatUint(uint64(got.pid), 10))
		})
	}
}

// TestAckOrdering: a notification sent right after Listen completed is always received.
func TestAckOrdering(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s, rec := startSession(t, Config{DSN: dsn})
	n := newNotifier(t, dsn)
	for i := range 100 {
		ch := "ack_" + strconv.Itoa(i)
		require.NoError(t, listen(t, s, ch))
		n.notify(ch, "p"+strconv.Itoa(i))
		got := rec.waitNote(t, ch, 5*time.Second)
		assert.Equal(t, "p"+strconv.Itoa(i), got.payload)
		s.Unlisten(ch)
	}
}

// TestConcurrentListensShareOneLISTEN: Listens of a channel whose LISTEN is in flight complete
// with it; one LISTEN is sent.
func TestConcurrentListensShareOneLISTEN(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s, rec := startSession(t, Config{DSN: dsn})
	n := newNotifier(t, dsn)
	done := make(chan error, 10)
	for range 10 {
		s.Listen("shared", func(err error) { done <- err })
	}
	for range 10 {
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Fatal("Listen did not complete")
		}
	}
	assert.Equal(t, 1, s.Channels())
	n.notify("shared", "x")
	assert.Equal(t, "x", rec.waitNote(t, "shared", 5*time.Second).payload)
	// All ten references are live: nine Unlistens keep it.
	for range 9 {
		s.Unlisten("shared")
	}
	require.NoError(t, listen(t, s, "marker")) // barrier: the ops above were processed
	n.notify("shared", "y")
	assert.Equal(t, "y", rec.waitNote(t, "shared", 5*time.Second).payload)
}

func TestReferenceCounting(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s, rec := startSession(t, Config{DSN: dsn})
	n := newNotifier(t, dsn)
	lastQuery := func() string {
		return n.query("SELECT query FROM pg_stat_activity WHERE application_name = 'pgsse-listen' AND datname = current_database()")
	}

	require.NoError(t, listen(t, s, "rc"))
	require.NoError(t, listen(t, s, "rc"))
	require.NoError(t, listen(t, s, "sentinel"))
	assert.Equal(t, 2, s.Channels())

	s.Unlisten("rc") // one holder leaves
	n.notify("rc", "still")
	assert.Equal(t, "still", rec.waitNote(t, "rc", 5*time.Second).payload)
	assert.Equal(t, `LISTEN "sentinel"`, lastQuery(), "no UNLISTEN while a holder remains")

	s.Unlisten("rc") // the last holder leaves → UNLISTEN
	require.Eventually(t, func() bool { return lastQuery() == `UNLISTEN "rc"` }, 5*time.Second, 10*time.Millisecond,
		"the listen backend's last command must be UNLISTEN \"rc\", got %q", lastQuery())
	assert.Equal(t, 1, s.Channels())

	// Sent in one transaction, rc before sentinel: had rc been delivered it would arrive first.
	n.exec(`BEGIN; SELECT pg_notify('rc', 'gone'); SELECT pg_notify('sentinel', 's'); COMMIT`)
	for deadline := time.After(5 * time.Second); ; {
		select {
		case got := <-rec.notes:
			require.NotEqual(t, "rc", got.channel, "notification on an UNLISTENed channel")
			if got.channel != "sentinel" {
				continue
			}
		case <-deadline:
			t.Fatal("sentinel notification not received")
		}
		break
	}
	// Listening again works (a fresh LISTEN after the UNLISTEN).
	require.NoError(t, listen(t, s, "rc"))
	n.notify("rc", "back")
	assert.Equal(t, "back", rec.waitNote(t, "rc", 5*time.Second).payload)
}

// TestListenUnlistenPipelined: Listen and Unlisten of one channel back to back, many times,
// without waiting: the final state follows the last operation.
func TestListenUnlistenPipelined(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s, rec := startSession(t, Config{DSN: dsn})
	n := newNotifier(t, dsn)
	errs := make(chan error, 100)
	for range 50 {
		s.Listen("flip", func(err error) {
			errs <- err
		})
		s.Unlisten("flip") // documented misuse is Unlisten before done; here each done is nil
	}
	for range 50 {
		require.NoError(t, <-errs)
	}
	require.NoError(t, listen(t, s, "flip"))
	assert.Equal(t, 1, s.Channels())
	n.notify("flip", "final")
	assert.Equal(t, "final", rec.waitNote(t, "flip", 5*time.Second).payload)
}

func TestQuoting(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s, rec := startSession(t, Config{DSN: dsn})
	n := newNotifier(t, dsn)
	n.exec("CREATE TABLE x (id int)")
	long := strings.Repeat("L", 63)
	for _, ch := range []string{`a"b`, `Robert'); DROP TABLE x;--`, long, "canal-ñ-日本", `"`, `""`, "MixedCase", "with space", `back\slash`, "semi;colon"} {
		t.Run(ch, func(t *testing.T) {
			require.NoError(t, listen(t, s, ch))
			n.notify(ch, "for "+ch)
			got := rec.waitNote(t, ch, 5*time.Second)
			assert.Equal(t, "for "+ch, got.payload)
		})
	}
	assert.Equal(t, "t", n.query("SELECT to_regclass('x') IS NOT NULL"), "table x must survive")
	assert.Equal(t, 10, s.Channels())
}

func TestListenErrors(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s, rec := startSession(t, Config{DSN: dsn, MaxChannels: 3})
	n := newNotifier(t, dsn)

	assert.ErrorIs(t, listen(t, s, ""), names.ErrChannelEmpty)
	assert.ErrorIs(t, listen(t, s, strings.Repeat("x", 64)), names.ErrChannelLength)
	assert.ErrorIs(t, listen(t, s, "a\x00b"), names.ErrChannelNUL)

	// PostgreSQL rejects a name that is not valid UTF-8: its error reaches the caller.
	err := listen(t, s, "bad\xff")
	var pe *pgconn.PgError
	require.True(t, errors.As(err, &pe), "want a *pgconn.PgError, got %v", err)
	assert.Equal(t, "22021", pe.Code)
	assert.Equal(t, 0, s.Channels(), "a failed Listen drops its reference")

	// The session still works after the error.
	require.NoError(t, listen(t, s, "a"))
	require.NoError(t, listen(t, s, "b"))
	require.NoError(t, listen(t, s, "c"))
	assert.ErrorIs(t, listen(t, s, "d"), ErrTooManyChannels)
	require.NoError(t, listen(t, s, "a"), "another reference to a live channel is not a new channel")
	n.notify("c", "ok")
	assert.Equal(t, "ok", rec.waitNote(t, "c", 5*time.Second).payload)
	assert.Equal(t, 3, s.Channels())
}

func TestCloseFailsPendingListens(t *testing.T) {
	// Nothing listens on this port: the Listen waits for a session that never comes.
	cfg := Config{DSN: "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=1", Logger: testLogger(t)}
	s := NewSession(cfg, newRecorder())
	s.Start()
	done := make(chan error, 2)
	s.Listen("pending", func(err error) { done <- err })
	require.Eventually(t, func() bool { return s.ConnectFailures() > 0 }, 5*time.Second, 5*time.Millisecond)
	assert.False(t, s.Up())
	assert.Equal(t, uint32(0), s.PID())
	require.NoError(t, s.Close())
	select {
	case err := <-done:
		assert.ErrorIs(t, err, ErrClosed)
	default:
		t.Fatal("Close must fail pending Listens before it returns")
	}
	s.Listen("after", func(err error) { done <- err })
	assert.ErrorIs(t, <-done, ErrClosed)

	// Close without Start.
	s2 := NewSession(cfg, newRecorder())
	s2.Listen("x", func(err error) { done <- err })
	require.NoError(t, s2.Close())
	assert.ErrorIs(t, <-done, ErrClosed)
}

func TestApplicationName(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s, _ := startSession(t, Config{DSN: dsn + "&application_name=other"})
	n := newNotifier(t, dsn)
	assert.Equal(t, "pgsse-listen", n.query("SELECT application_name FROM pg_stat_activity WHERE pid = "+strconv.FormatUint(uint64(s.PID()), 10)))
}
