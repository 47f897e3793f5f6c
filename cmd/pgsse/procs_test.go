package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/engine"
	"github.com/pgsse/pgsse/internal/testkit"
	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/internal/testkit/servetest"
	"github.com/pgsse/pgsse/internal/testkit/ssetest"
	"github.com/pgsse/pgsse/store"
)

const procsSecret = "procs-secret-0123456789abcdef0123456789"

// startProcs starts `pgsse serve --procs n` as the real process tree (internal/testkit/servetest:
// the first process, started here, and the siblings it starts, all logging JSON lines into
// one pipe) and waits until the first process and n−1 siblings say they serve and /readyz
// answers 200. When the test ends it stops the tree with SIGTERM and fails the test if any
// process of it is left.
func startProcs(t *testing.T, dsn string, n int, extra ...string) *servetest.Server {
	t.Helper()
	return startProcsOn(t, dsn, n, "", extra...)
}

// startProcsOn is startProcs on --listen listen (a free port when "").
func startProcsOn(t *testing.T, dsn string, n int, listen string, extra ...string) *servetest.Server {
	t.Helper()
	return servetest.Start(t, servetest.Options{Bin: binary(t), Procs: n, Listen: listen,
		Env:  []string{"DATABASE_URL=" + dsn, "PGSSE_JWT_SECRET=" + procsSecret},
		Args: append([]string{"--retention", "0", "--procs", strconv.Itoa(n)}, extra...)})
}

func listenSessions(t *testing.T, dsn string) int {
	t.Helper()
	n, err := strconv.Atoi(pgtest.QueryValue(t, dsn,
		"SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgsse-listen' AND datname = current_database()"))
	require.NoError(t, err)
	return n
}

// readers runs n resuming subscribers of stream (from its first event) until the test ends.
func readers(t *testing.T, p *servetest.Server, stream string, n int) []*ssetest.ResumingReader {
	t.Helper()
	tok := strings.TrimSpace(pgsse(t, []string{"PGSSE_JWT_SECRET=" + procsSecret}, "token", "--stream", "*", "--ttl", "1h").stdout)
	require.NotEmpty(t, tok)
	return ssetest.StartResuming(t, p.URL("/streams/"+stream+"?since=0"), tok, n, 30*time.Second)
}

func migrated(t *testing.T) string {
	t.Helper()
	return pgtest.Migrated(t, store.Migrate)
}

// TestProcsShareOneListenSession: --procs 2 (with a hub socket for outside workers) holds
// exactly one pgsse-listen session; the kernel spreads subscribers over both processes (per-process metrics), the first process's
// /metrics sums them, and each subscriber gets every durable event once, in order. SIGTERM to
// the first process drains both: clients get retry: and the whole tree exits 0.
func TestProcsShareOneListenSession(t *testing.T) {
	dsn := migrated(t)
	sock := testkit.SocketPath(t, "hub.sock")
	p := startProcs(t, dsn, 2, "--hub-socket", sock)
	assert.Equal(t, 1, listenSessions(t, dsn), "one LISTEN session for the host")
	fi, err := os.Stat(sock)
	require.NoError(t, err, "the first process serves --hub-socket")
	assert.Equal(t, os.ModeSocket, fi.Mode().Type())
	// Before, a missing series read as 0 and this could not fail (internal/testkit/metricstest).
	assert.Equal(t, 0.0, p.Metric("pgsse_hub_workers"), "a sibling is no hub worker")
	// Only its own siblings join the port: another server, --procs or not, is refused.
	other := pgsse(t, []string{"DATABASE_URL=" + dsn, "PGSSE_JWT_SECRET=" + procsSecret},
		"serve", "--listen", p.Listen, "--admin-listen", "", "--procs", "2")
	assert.Equal(t, 1, other.code, "a second server on the port: %s", other.stderr)
	assert.Contains(t, other.stderr, "address already in use")

	rs := readers(t, p, "spread", 40)
	waitFor(t, 15*time.Second, "the summed connection count", func() bool { return p.Metric("pgsse_sse_connections") == 40 })
	first, second := p.Metric(`pgsse_process_sse_connections{process="0"}`), p.Metric(`pgsse_process_sse_connections{process="1"}`)
	assert.Equal(t, 40.0, first+second)
	assert.Positive(t, first, "the first process has subscribers")
	assert.Positive(t, second, "the sibling has subscribers")
	assert.Equal(t, 2.0, p.Metric("pgsse_procs"))
	// The state series are the first process's alone (a sibling exports none), so a ready
	// host reads 1, not 2; each process's outbound budget is summed like its queued bytes.
	assert.Equal(t, 1.0, p.Metric("pgsse_ready"))
	assert.Equal(t, 1.0, p.Metric("pgsse_listen_up"))
	assert.Equal(t, 1.0, p.Metric("pgsse_schema_ok"))
	waitFor(t, 15*time.Second, "both processes' outbound budgets", func() bool {
		return p.Metric("pgsse_outbound_budget_bytes") == float64(2*engine.DefaultMaxOutboundMemory)
	})

	ssetest.PublishRange(t, dsn, "spread", 1, 50, nil)
	ssetest.RequireAll(t, rs, 50, 30*time.Second)
	assert.Equal(t, 1, listenSessions(t, dsn), "still one LISTEN session")

	// SIGTERM: everything drains, exit 0, no process left (startProcs' cleanup checks).
	siblings := p.SiblingPIDs()
	p.Signal(syscall.SIGTERM)
	assert.Equal(t, 0, p.WaitExit(30*time.Second))
	for _, pid := range siblings {
		assert.True(t, servetest.Gone(pid), "sibling %d stopped with the first process", pid)
	}
	log := p.Log()
	assert.NotContains(t, log, "switching to an own LISTEN session", "no sibling fails over on the way down")
	assert.NotContains(t, log, `"level":"ERROR"`)
}

// TestProcsSiblingKilled: SIGKILL the sibling while 1,000 durable events are published: its
// clients reconnect with Last-Event-ID (to the first process, or the replacement) and every
// client ends with all 1,000 exactly once, in order; a replacement serves within 5 s.
func TestProcsSiblingKilled(t *testing.T) {
	dsn := migrated(t)
	p := startProcs(t, dsn, 2)
	rs := readers(t, p, "killed", 40)
	waitFor(t, 15*time.Second, "subscribers on the sibling", func() bool {
		return p.Metric(`pgsse_process_sse_connections{process="1"}`) > 0 && p.Metric("pgsse_sse_connections") == 40
	})
	victim := p.SiblingPIDs()[1]
	var killedAt time.Time
	ssetest.PublishRange(t, dsn, "killed", 1, 1000, func(id int) {
		if id == 300 {
			require.NoError(t, syscall.Kill(victim, syscall.SIGKILL))
			killedAt = time.Now()
		}
	})
	waitFor(t, 10*time.Second, "a replacement sibling serving", func() bool {
		pid := p.SiblingPIDs()[1]
		return pid != 0 && pid != victim
	})
	var servedAt time.Time
	for _, l := range p.Lines() {
		if l["msg"] == "pgsse serving" && l["proc"] != nil && int(l["pid"].(float64)) != victim {
			ts, err := time.Parse(time.RFC3339Nano, l["time"].(string))
			require.NoError(t, err)
			servedAt = ts
		}
	}
	assert.Less(t, servedAt.Sub(killedAt), 5*time.Second, "replacement serving within 5 s of the kill")
	ssetest.RequireAll(t, rs, 1000, 60*time.Second)
	reconnected := 0
	for _, r := range rs {
		if r.Connects() > 1 {
			reconnected++
		}
	}
	assert.Positive(t, reconnected, "the killed sibling's clients reconnected")
	assert.Equal(t, 1.0, p.Metric("pgsse_proc_restarts_total"))
	assert.Equal(t, 1, listenSessions(t, dsn), "still one LISTEN session")
}

// TestProcsFirstProcessKilled: SIGKILL the first process: the sibling switches to a LISTEN
// session of its own, stops accepting at once and keeps delivering to its clients; a new
// `pgsse serve --procs 2` started at once on the same port serves within seconds (issue 23:
// the orphan held the port while it drained, and the new set exited with "bind: address already
// in use" for 15 s) and takes the first process's clients; orphanGrace later the orphan drains,
// its clients move to the new set, and every client has every event once, in order.
func TestProcsFirstProcessKilled(t *testing.T) {
	dsn := migrated(t)
	p := startProcs(t, dsn, 2)
	rs := readers(t, p, "orphan", 30)
	sibling := p.SiblingPIDs()[1]
	ssetest.PublishRange(t, dsn, "orphan", 1, 100, nil)
	ssetest.RequireAll(t, rs, 100, 30*time.Second)

	p.Kill()
	killedAt := time.Now()
	next := startProcsOn(t, dsn, 2, p.Listen) // at once, as a supervisor would
	var servedAt time.Time
	for _, l := range next.Lines() {
		if l["msg"] == "pgsse serving" && l["proc"] == nil {
			ts, err := time.Parse(time.RFC3339Nano, l["time"].(string))
			require.NoError(t, err)
			servedAt = ts
		}
	}
	assert.Less(t, servedAt.Sub(killedAt), 3*time.Second, "the new set serves within seconds of the kill")
	assert.Contains(t, p.Log(), "no longer accepting on --listen")
	assert.Equal(t, next.Listen, p.Listen)

	// Events published after the kill reach everyone: the first process's clients have
	// reconnected to the new set for them; the orphan's got them on their first connection.
	ssetest.PublishRange(t, dsn, "orphan", 101, 200, nil)
	ssetest.RequireAll(t, rs, 200, 30*time.Second)
	assert.False(t, servetest.Gone(sibling), "the orphan serves on during the grace period")
	var orphans []*ssetest.ResumingReader
	for _, r := range rs {
		if r.Connects() == 1 {
			orphans = append(orphans, r)
		}
	}
	require.NotEmpty(t, orphans, "the kernel gave the sibling some of the 30 clients, and it kept serving them")
	require.Less(t, len(orphans), len(rs), "and the first process some, which reconnected")

	waitFor(t, orphanGrace+20*time.Second, "the orphaned sibling to drain and exit", func() bool { return servetest.Gone(sibling) })
	assert.GreaterOrEqual(t, time.Since(killedAt), orphanGrace-time.Second, "not before the grace period")
	assert.Contains(t, p.Log(), "the first process is gone")
	ssetest.PublishRange(t, dsn, "orphan", 201, 250, nil)
	ssetest.RequireAll(t, rs, 250, 30*time.Second)
	for _, r := range orphans {
		assert.Equal(t, 2, r.Connects(), "the orphan's clients moved to the new set once it drained")
	}
	assert.Equal(t, 1, listenSessions(t, dsn), "the new set's one LISTEN session")
	var dir string
	for _, l := range p.Lines() {
		if l["msg"] == "started a sibling process" {
			dir, _ = l["dir"].(string)
		}
	}
	require.NotEmpty(t, dir)
	_, err := os.Stat(dir)
	assert.ErrorIs(t, err, os.ErrNotExist, "the last sibling removed the private directory the dead first process left")
}
