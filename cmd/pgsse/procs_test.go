package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/engine"
	"github.com/pgsse/pgsse/scripts/pgtest"
	"github.com/pgsse/pgsse/scripts/ssetest"
)

const procsSecret = "procs-secret-0123456789abcdef0123456789"

// procsServer is `pgsse serve --procs N` as the real process tree: the first process, started
// here, and the siblings it starts, all logging JSON lines into one buffer.
type procsServer struct {
	t      *testing.T
	dsn    string
	cmd    *exec.Cmd
	log    logFile // every process's output: a file, not a pipe, so that a sibling holding it does not keep cmd.Wait waiting
	exited chan struct{}
	listen string // host:port every process serves
	admin  string
}

// startProcs starts `pgsse serve --procs n` and waits until the first process and n−1
// siblings say they serve and /readyz answers 200. When the test ends it stops the tree with
// SIGTERM and fails the test if any process of it is left.
func startProcs(t *testing.T, dsn string, n int, extra ...string) *procsServer {
	t.Helper()
	// O_APPEND: every process writes at the end, none over another's line.
	f, err := os.OpenFile(filepath.Join(t.TempDir(), "procs.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	p := &procsServer{t: t, dsn: dsn, log: logFile{f}, exited: make(chan struct{})}
	args := append([]string{"serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--log-format", "json", "--retention", "0", "--procs", strconv.Itoa(n)}, extra...)
	p.cmd = exec.Command(binary, args...)
	p.cmd.Env = append(cleanEnv(), "DATABASE_URL="+dsn, "PGSSE_JWT_SECRET="+procsSecret)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	require.NoError(t, p.cmd.Start())
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		pids := p.siblingPIDs()
		p.stop()
		for slot, pid := range pids {
			if !processGone(pid) {
				t.Errorf("sibling %d (pid %d) outlived the first process", slot, pid)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if t.Failed() {
			t.Logf("pgsse serve --procs %d log:\n%s", n, tail(p.log.String(), 12000))
		}
	})
	waitFor(t, "the first process to serve", 30*time.Second, func() bool {
		select {
		case <-p.exited:
			t.Fatalf("pgsse serve exited at start:\n%s", p.log.String())
		default:
		}
		for _, l := range p.lines() {
			if l["msg"] == "pgsse serving" && l["proc"] == nil {
				p.listen, _ = l["listen"].(string)
				p.admin, _ = l["admin"].(string)
				return true
			}
		}
		return false
	})
	waitFor(t, "every sibling to serve", 30*time.Second, func() bool { return len(p.siblingPIDs()) == n-1 })
	waitFor(t, "/readyz 200", 30*time.Second, func() bool { c, _ := p.get("/readyz"); return c == 200 })
	return p
}

// logFile is the processes' shared output file.
type logFile struct{ f *os.File }

func (l logFile) String() string {
	b, _ := os.ReadFile(l.f.Name())
	return string(b)
}

// stop sends SIGTERM to the first process and waits for it (SIGKILL after 30 s).
func (p *procsServer) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		p.t.Errorf("the first process did not exit within 30 s of SIGTERM")
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// lines parses the JSON log lines so far.
func (p *procsServer) lines() []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(p.log.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// siblingPIDs maps each slot to the pid of the latest sibling that said it serves there.
func (p *procsServer) siblingPIDs() map[int]int {
	out := map[int]int{}
	for _, l := range p.lines() {
		if l["msg"] == "pgsse serving" && l["proc"] != nil {
			out[int(l["proc"].(float64))] = int(l["pid"].(float64))
		}
	}
	return out
}

func (p *procsServer) get(path string) (int, string) {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get("http://" + p.admin + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metric is one sample of the first process's /metrics (0 if absent).
func (p *procsServer) metric(sample string) float64 {
	p.t.Helper()
	code, body := p.get("/metrics")
	require.Equal(p.t, 200, code, body)
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			require.NoError(p.t, err, line)
			return f
		}
	}
	return 0
}

// processGone reports whether pid has exited (no such process, or a zombie nobody reaped).
func processGone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// "pid (comm) S ...": the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

func listenSessions(t *testing.T, dsn string) int {
	t.Helper()
	n, err := strconv.Atoi(pgtest.QueryValue(t, dsn,
		"SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgsse-listen' AND datname = current_database()"))
	require.NoError(t, err)
	return n
}

// readers runs n resuming subscribers of stream (from its first event) until the test ends.
func readers(t *testing.T, p *procsServer, stream string, n int) []*ssetest.Reader {
	t.Helper()
	tok := strings.TrimSpace(pgsse(t, []string{"PGSSE_JWT_SECRET=" + procsSecret}, "token", "--stream", "*", "--ttl", "1h").stdout)
	require.NotEmpty(t, tok)
	return ssetest.Start(t, "http://"+p.listen+"/streams/"+stream+"?since=0", tok, n, 30*time.Second)
}

func migrated(t *testing.T) string {
	t.Helper()
	dsn := pgtest.NewDatabase(t)
	requireOK(t, pgsse(t, nil, "migrate", "--database-url", dsn))
	return dsn
}

// TestProcsShareOneListenSession: --procs 2 (with a hub socket for outside workers) holds
// exactly one pgsse-listen session; the kernel spreads subscribers over both processes (per-process metrics), the first process's
// /metrics sums them, and each subscriber gets every durable event once, in order. SIGTERM to
// the first process drains both: clients get retry: and the whole tree exits 0.
func TestProcsShareOneListenSession(t *testing.T) {
	dsn := migrated(t)
	sock := filepath.Join(t.TempDir(), "hub.sock")
	if len(sock) > 100 {
		dir, err := os.MkdirTemp("", "hub")
		require.NoError(t, err)
		t.Cleanup(func() { os.RemoveAll(dir) })
		sock = filepath.Join(dir, "hub.sock")
	}
	p := startProcs(t, dsn, 2, "--hub-socket", sock)
	assert.Equal(t, 1, listenSessions(t, dsn), "one LISTEN session for the host")
	fi, err := os.Stat(sock)
	require.NoError(t, err, "the first process serves --hub-socket")
	assert.Equal(t, os.ModeSocket, fi.Mode().Type())
	assert.Equal(t, 0.0, p.metric("pgsse_hub_workers"), "a sibling is no hub worker")
	// Only its own siblings join the port: another server, --procs or not, is refused.
	other := pgsse(t, []string{"DATABASE_URL=" + dsn, "PGSSE_JWT_SECRET=" + procsSecret},
		"serve", "--listen", p.listen, "--admin-listen", "", "--procs", "2")
	assert.Equal(t, 1, other.code, "a second server on the port: %s", other.stderr)
	assert.Contains(t, other.stderr, "address already in use")

	rs := readers(t, p, "spread", 40)
	waitFor(t, "the summed connection count", 15*time.Second, func() bool { return p.metric("pgsse_sse_connections") == 40 })
	first, second := p.metric(`pgsse_process_sse_connections{process="0"}`), p.metric(`pgsse_process_sse_connections{process="1"}`)
	assert.Equal(t, 40.0, first+second)
	assert.Positive(t, first, "the first process has subscribers")
	assert.Positive(t, second, "the sibling has subscribers")
	assert.Equal(t, 2.0, p.metric("pgsse_procs"))
	// The state series are the first process's alone (a sibling exports none), so a ready
	// host reads 1, not 2; each process's outbound budget is summed like its queued bytes.
	assert.Equal(t, 1.0, p.metric("pgsse_ready"))
	assert.Equal(t, 1.0, p.metric("pgsse_listen_up"))
	assert.Equal(t, 1.0, p.metric("pgsse_schema_ok"))
	waitFor(t, "both processes' outbound budgets", 15*time.Second, func() bool {
		return p.metric("pgsse_outbound_budget_bytes") == float64(2*engine.DefaultMaxOutboundMemory)
	})

	ssetest.PublishRange(t, dsn, "spread", 1, 50, nil)
	ssetest.RequireAll(t, rs, 50, 30*time.Second)
	assert.Equal(t, 1, listenSessions(t, dsn), "still one LISTEN session")

	// SIGTERM: everything drains, exit 0, no process left (startProcs' cleanup checks).
	siblings := p.siblingPIDs()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the first process did not exit within 30 s of SIGTERM")
	}
	assert.Equal(t, 0, p.cmd.ProcessState.ExitCode())
	for _, pid := range siblings {
		assert.True(t, processGone(pid), "sibling %d stopped with the first process", pid)
	}
	log := p.log.String()
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
	waitFor(t, "subscribers on the sibling", 15*time.Second, func() bool {
		return p.metric(`pgsse_process_sse_connections{process="1"}`) > 0 && p.metric("pgsse_sse_connections") == 40
	})
	victim := p.siblingPIDs()[1]
	var killedAt time.Time
	ssetest.PublishRange(t, dsn, "killed", 1, 1000, func(id int) {
		if id == 300 {
			require.NoError(t, syscall.Kill(victim, syscall.SIGKILL))
			killedAt = time.Now()
		}
	})
	waitFor(t, "a replacement sibling serving", 10*time.Second, func() bool {
		pid := p.siblingPIDs()[1]
		return pid != 0 && pid != victim
	})
	var servedAt time.Time
	for _, l := range p.lines() {
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
	assert.Equal(t, 1.0, p.metric("pgsse_proc_restarts_total"))
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
	sibling := p.siblingPIDs()[1]
	ssetest.PublishRange(t, dsn, "orphan", 1, 100, nil)
	ssetest.RequireAll(t, rs, 100, 30*time.Second)

	require.NoError(t, p.cmd.Process.Kill())
	<-p.exited
	killedAt := time.Now()
	next := startProcs(t, dsn, 2, "--listen", p.listen) // at once, as a supervisor would
	var servedAt time.Time
	for _, l := range next.lines() {
		if l["msg"] == "pgsse serving" && l["proc"] == nil {
			ts, err := time.Parse(time.RFC3339Nano, l["time"].(string))
			require.NoError(t, err)
			servedAt = ts
		}
	}
	assert.Less(t, servedAt.Sub(killedAt), 3*time.Second, "the new set serves within seconds of the kill")
	assert.Contains(t, p.log.String(), "no longer accepting on --listen")
	assert.Equal(t, next.listen, p.listen)

	// Events published after the kill reach everyone: the first process's clients have
	// reconnected to the new set for them; the orphan's got them on their first connection.
	ssetest.PublishRange(t, dsn, "orphan", 101, 200, nil)
	ssetest.RequireAll(t, rs, 200, 30*time.Second)
	assert.False(t, processGone(sibling), "the orphan serves on during the grace period")
	var orphans []*ssetest.Reader
	for _, r := range rs {
		if r.Connects() == 1 {
			orphans = append(orphans, r)
		}
	}
	require.NotEmpty(t, orphans, "the kernel gave the sibling some of the 30 clients, and it kept serving them")
	require.Less(t, len(orphans), len(rs), "and the first process some, which reconnected")

	waitFor(t, "the orphaned sibling to drain and exit", orphanGrace+20*time.Second, func() bool { return processGone(sibling) })
	assert.GreaterOrEqual(t, time.Since(killedAt), orphanGrace-time.Second, "not before the grace period")
	assert.Contains(t, p.log.String(), "the first process is gone")
	ssetest.PublishRange(t, dsn, "orphan", 201, 250, nil)
	ssetest.RequireAll(t, rs, 250, 30*time.Second)
	for _, r := range orphans {
		assert.Equal(t, 2, r.Connects(), "the orphan's clients moved to the new set once it drained")
	}
	assert.Equal(t, 1, listenSessions(t, dsn), "the new set's one LISTEN session")
	var dir string
	for _, l := range p.lines() {
		if l["msg"] == "started a sibling process" {
			dir, _ = l["dir"].(string)
		}
	}
	require.NotEmpty(t, dir)
	_, err := os.Stat(dir)
	assert.ErrorIs(t, err, os.ErrNotExist, "the last sibling removed the private directory the dead first process left")
}

// tail is at most the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
