package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/framing"
	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/internal/testkit/servetest"
	"github.com/pgsse/pgsse/internal/testkit/ssetest"
	"github.com/pgsse/pgsse/pglisten"
	"github.com/pgsse/pgsse/store"
)

// SIGUSR2 (SPEC §6, Upgrades no client notices) with real processes, sockets and PostgreSQL:
// the binary at the server's path is replaced, SIGUSR2 hands everything to a successor started
// from it, and the clients — counted at the clients — keep their connections and get every
// durable event exactly once, in order, while publishers publish over SQL and over keep-alive
// HTTP; the census of LISTEN sessions never shows 0. A successor that exits at once, one that
// speaks another handoff version and one that hangs leave the predecessor serving everyone.
// Channel notifications are published throughout too: every channel subscriber and every hub
// worker gets every one of them, in order (a worker at most one RESYNC, which an exact
// handoff does not need: docs/architecture.md, Handoff positions).

const handoffSecret = "handoff-secret-0123456789abcdef012345"

// hoClient is one SSE client, read on its own goroutine, checked as events come.
type hoClient struct {
	conn   net.Conn
	stream *ssetest.Stream
	multi  int // GET /streams with this many streams (composite ids); 0: one stream or a channel

	mu        sync.Mutex
	last      []int64
	note      int // a channel client's last notification (n<i>), -1 before the first
	events    int
	headRetry bool
	err       error
	prevAt    time.Time     // when the last durable event arrived
	maxGap    time.Duration // the longest wait between two durable events
}

func dialSSE(t *testing.T, addr, path, tok string) *hoClient {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	_, err = fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", path, tok)
	require.NoError(t, err)
	br := bufio.NewReaderSize(conn, 64<<10)
	_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode, path)
	_ = conn.SetReadDeadline(time.Time{})
	return &hoClient{conn: conn, stream: &ssetest.Stream{R: br, Conn: conn}}
}

func (c *hoClient) run(done <-chan struct{}) {
	k := max(c.multi, 1)
	for {
		e, err := c.stream.Next(200 * time.Millisecond)
		select {
		case <-done:
			return
		default:
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			continue
		}
		c.mu.Lock()
		switch {
		case err != nil:
			c.err = fmt.Errorf("the connection ended: %w", err)
		case e.Retry != "" && c.events == 0 && !c.headRetry:
			c.headRetry = true
		case e.Retry != "":
			c.err = errors.New("a retry field: " + e.Retry)
		case !e.IsEvent():
		case e.Type != "":
			c.err = fmt.Errorf("event %s: %s", e.Type, e.Data)
		case !e.HasID: // a channel notification: n<i>, each the previous one's i + 1
			c.events++
			i, perr := strconv.Atoi(strings.TrimPrefix(e.Data, "n"))
			if perr != nil || c.note >= 0 && i != c.note+1 {
				c.err = fmt.Errorf("channel notification %q after n%d (a duplicate or a gap)", e.Data, c.note)
			}
			c.note = i
		default:
			c.events++
			if !c.prevAt.IsZero() {
				c.maxGap = max(c.maxGap, e.At.Sub(c.prevAt))
			}
			c.prevAt = e.At
			pos, id := 0, int64(0)
			if c.multi > 0 {
				p, rest, _ := strings.Cut(e.ID, ":")
				pos, _ = strconv.Atoi(p)
				cursors := strings.Split(rest, ",")
				if len(cursors) != k || pos < 0 || pos >= k {
					c.err = errors.New("bad composite id " + e.ID)
					break
				}
				id, _ = strconv.ParseInt(cursors[pos], 10, 64)
			} else {
				id, _ = strconv.ParseInt(e.ID, 10, 64)
			}
			if c.last[pos] != 0 && id != c.last[pos]+1 {
				c.err = fmt.Errorf("stream %d: id %d after %d (a duplicate or a gap)", pos, id, c.last[pos])
			}
			c.last[pos] = id
		}
		failed := c.err != nil
		c.mu.Unlock()
		if failed {
			return
		}
	}
}

func (c *hoClient) lastNote() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.note
}

func (c *hoClient) state() ([]int64, int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int64(nil), c.last...), c.events, c.err
}

// hoFleet is the clients of one test: durable single-stream ones on h/1 or h/2, GET /streams
// ones on both, channel ones on hjobs.
type hoFleet struct {
	clients []*hoClient
	wants   []func() []int64 // each client's expected last ids (nil: a channel client)
	done    chan struct{}
	wg      sync.WaitGroup
}

func startFleet(t *testing.T, addr, tok string, single, multi, channel int, heads func() []int64) *hoFleet {
	t.Helper()
	f := &hoFleet{done: make(chan struct{})}
	add := func(c *hoClient, k int, want func() []int64) {
		c.last = make([]int64, max(k, 1))
		c.note = -1
		c.multi = k
		f.clients = append(f.clients, c)
		f.wants = append(f.wants, want)
	}
	for i := range single {
		if i%3 == 0 {
			add(dialSSE(t, addr, "/streams/h/2", tok), 0, func() []int64 { return heads()[1:] })
		} else {
			add(dialSSE(t, addr, "/streams/h/1", tok), 0, func() []int64 { return heads()[:1] })
		}
	}
	for range multi {
		add(dialSSE(t, addr, "/streams?stream=h/1&stream=h/2", tok), 2, heads)
	}
	for range channel {
		add(dialSSE(t, addr, "/channels/hjobs", tok), 0, nil)
	}
	for _, c := range f.clients {
		f.wg.Add(1)
		go func() { defer f.wg.Done(); c.run(f.done) }()
	}
	t.Cleanup(func() { close(f.done); f.wg.Wait() })
	waitFor(t, 20*time.Second, "every client has an event", func() bool {
		for i, c := range f.clients {
			_, n, err := c.state()
			require.NoError(t, err, "client %d", i)
			if n == 0 {
				return false
			}
		}
		return true
	})
	return f
}

// resetGaps forgets the pauses seen so far and the last event's time: each client's longest
// pause is then one that began after this (not the fleet's start, nor the test process's own
// stall as it installs the new binary).
func (f *hoFleet) resetGaps() {
	for _, c := range f.clients {
		c.mu.Lock()
		c.maxGap, c.prevAt = 0, time.Time{}
		c.mu.Unlock()
	}
}

func (f *hoFleet) events() []int {
	n := make([]int, len(f.clients))
	for i, c := range f.clients {
		_, n[i], _ = c.state()
	}
	return n
}

// check waits until every durable client has the heads and every channel client the last
// notification, and asserts that none lost its connection, saw an id or a notification twice
// or missed one, and that every client got events after before.
func (f *hoFleet) check(t *testing.T, before []int, lastNote int) {
	t.Helper()
	// Until then, or 30 s: the assertions below then name each client that lags.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && !f.caughtUp(lastNote) {
		time.Sleep(20 * time.Millisecond) // polling: the clients' states have no signal
	}
	closed := 0
	for i, c := range f.clients {
		last, n, err := c.state()
		if err != nil {
			closed++
			t.Errorf("client %d (%d events, last %v): %v", i, n, last, err)
			continue
		}
		if f.wants[i] != nil {
			assert.Equal(t, f.wants[i](), last, "client %d has every event of its streams", i)
		} else {
			assert.Equal(t, lastNote, c.lastNote(), "channel client %d has every notification", i)
		}
		assert.Greater(t, n, before[i], "client %d got events after the signal", i)
	}
	assert.Zero(t, closed, "client connections closed or broken")
}

// logGaps logs each client's longest pause between two durable events since resetGaps:
// p50, p99 and the longest, with how long the handover took.
func (f *hoFleet) logGaps(t *testing.T, took string) {
	var gaps []time.Duration
	for _, c := range f.clients {
		c.mu.Lock()
		if c.maxGap > 0 {
			gaps = append(gaps, c.maxGap)
		}
		c.mu.Unlock()
	}
	slices.Sort(gaps)
	if len(gaps) > 0 {
		t.Logf("%d clients: the longest pause between two durable events at a client, p50 %v, p99 %v, max %v; handover took %s",
			len(f.clients), gaps[len(gaps)/2], gaps[len(gaps)*99/100], gaps[len(gaps)-1], took)
	}
}

func (f *hoFleet) caughtUp(lastNote int) bool {
	for i, c := range f.clients {
		last, _, err := c.state()
		if err == nil && f.wants[i] != nil && !assert.ObjectsAreEqual(f.wants[i](), last) {
			return false
		}
		if err == nil && f.wants[i] == nil && c.lastNote() != lastNote {
			return false
		}
	}
	return true
}

// hoLoad publishes to h/1 over SQL, to h/2 over keep-alive HTTP (pubs publishers), and to the
// channel hjobs, until stopped; heads are the last ids each stream's publishers got back.
type hoLoad struct {
	heads   [2]atomic.Int64
	note    atomic.Int64 // the last notification on hjobs (n<i>)
	httpErr atomic.Int64
	stop    chan struct{}
	wg      sync.WaitGroup
}

func startLoad(t *testing.T, dsn, base, pubTok string, pubs int) *hoLoad {
	t.Helper()
	l := &hoLoad{stop: make(chan struct{})}
	l.note.Store(-1)
	conn := pgtest.Connect(t, dsn)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for i := 0; ; i++ {
			select {
			case <-l.stop:
				return
			case <-time.After(4 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			id, err := store.Publish(ctx, conn, "h/1", "s"+strconv.Itoa(i), "", nil)
			if err == nil {
				l.heads[0].Store(id)
				err = conn.Exec(ctx, "SELECT pg_notify('hjobs', 'n"+strconv.Itoa(i)+"')").Close()
				if err == nil {
					l.note.Store(int64(i))
				}
			}
			cancel()
			if err != nil {
				t.Errorf("publishing over SQL: %v", err)
				return
			}
		}
	}()
	var mu sync.Mutex
	for p := range pubs {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			client := &http.Client{Timeout: 10 * time.Second}
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				req, _ := http.NewRequest("POST", base+"/streams/h/2", strings.NewReader("p"+strconv.Itoa(p)+"-"+strconv.Itoa(i)))
				req.Header.Set("Authorization", "Bearer "+pubTok)
				req.Header["Idempotency-Key"] = nil // replayable: an idle connection closed between requests is retried
				resp, err := client.Do(req)
				if err != nil {
					l.httpErr.Add(1)
					continue
				}
				var ans struct{ ID int64 }
				err = json.NewDecoder(resp.Body).Decode(&ans)
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 {
					l.httpErr.Add(1)
					continue
				}
				mu.Lock()
				if ans.ID > l.heads[1].Load() {
					l.heads[1].Store(ans.ID)
				}
				mu.Unlock()
			}
		}()
	}
	t.Cleanup(l.Stop)
	return l
}

func (l *hoLoad) Stop() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

func (l *hoLoad) Heads() []int64 { return []int64{l.heads[0].Load(), l.heads[1].Load()} }

func mintHandoff(t *testing.T, c auth.Claims) string {
	t.Helper()
	tok, err := auth.Mint(auth.MintKey{Secret: []byte(handoffSecret)}, c, time.Hour, "", "", time.Now())
	require.NoError(t, err)
	return tok
}

// installBinary puts a copy of src at dst the way a package manager does: written beside it,
// then renamed over it (the running process keeps the old file).
func installBinary(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	require.NoError(t, err)
	tmp := dst + ".new"
	require.NoError(t, os.WriteFile(tmp, b, 0o755))
	require.NoError(t, os.Rename(tmp, dst))
}

// installScript puts a shell script at dst (a "successor" that misbehaves).
func installScript(t *testing.T, dst, script string) {
	t.Helper()
	tmp := dst + ".new"
	require.NoError(t, os.WriteFile(tmp, []byte("#!/bin/sh\n"+script+"\n"), 0o755))
	require.NoError(t, os.Rename(tmp, dst))
}

// watchListenSessions samples the census until stopped; it returns the lowest count seen.
func watchListenSessions(t *testing.T, dsn string) (stop func() int) {
	conn := pgtest.Connect(t, dsn)
	quit := make(chan struct{})
	res := make(chan int, 1)
	go func() {
		low := 1 << 30
		for {
			rr := conn.ExecParams(context.Background(),
				"SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgsse-listen' AND datname = current_database()",
				nil, nil, nil, nil).Read()
			if rr.Err == nil && len(rr.Rows) == 1 {
				n, _ := strconv.Atoi(string(rr.Rows[0][0]))
				low = min(low, n)
			}
			select {
			case <-quit:
				res <- low
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return func() int { close(quit); return <-res }
}

// hoWorker is one hub worker (pglisten's hub client) on hjobs: each notification is the
// previous one's i + 1, unless a RESYNC came in between.
type hoWorker struct {
	l    pglisten.Listener
	mode framing.Mode

	mu      sync.Mutex
	note    int
	resyncs int
	err     error
}

func startWorker(t *testing.T, sock string, i int, mode framing.Mode) *hoWorker {
	t.Helper()
	l, err := pglisten.NewHub(pglisten.HubConfig{Socket: sock, Name: "hw" + strconv.Itoa(i), Mode: mode})
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	require.NoError(t, l.Listen(ctxFor(t, 10*time.Second), "hjobs"))
	w := &hoWorker{l: l, mode: mode, note: -1}
	go w.run()
	return w
}

func (w *hoWorker) run() {
	resynced := false
	for ev := range w.l.Events() {
		w.mu.Lock()
		switch ev.Kind {
		case pglisten.KindResync:
			w.resyncs++
			resynced = true
		case pglisten.KindNotification:
			i, err := strconv.Atoi(strings.TrimPrefix(string(ev.Payload), "n"))
			if w.err == nil && (err != nil || w.note >= 0 && i != w.note+1 && !(resynced && i > w.note)) {
				w.err = fmt.Errorf("notification %q after n%d without a RESYNC", ev.Payload, w.note)
			}
			w.note, resynced = i, false
		default:
			if w.err == nil {
				w.err = fmt.Errorf("event %v", ev.Kind)
			}
		}
		w.mu.Unlock()
	}
	w.mu.Lock()
	if w.err == nil {
		w.err = errors.New("the worker's listener stopped")
	}
	w.mu.Unlock()
}

func (w *hoWorker) state() (note, resyncs int, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.note, w.resyncs, w.err
}

// checkWorkers waits until every worker has the last notification and asserts that none
// lost its connection or missed one without a RESYNC, and that a lossless one needed none.
func checkWorkers(t *testing.T, workers []*hoWorker, lastNote int) {
	t.Helper()
	waitFor(t, 30*time.Second, "every worker has every notification", func() bool {
		for _, w := range workers {
			if n, _, err := w.state(); err == nil && n != lastNote {
				return false
			}
		}
		return true
	})
	for i, w := range workers {
		n, resyncs, err := w.state()
		assert.NoError(t, err, "worker %d", i)
		assert.Equal(t, lastNote, n, "worker %d has the last notification", i)
		if w.mode == framing.ModeLossless {
			assert.Zero(t, resyncs, "lossless worker %d: every notification, no RESYNC needed", i)
		}
	}
}

type hoSetup struct {
	srv     *servetest.Server
	workers []*hoWorker
	bin     string
	dsn     string
	fleet   *hoFleet
	load    *hoLoad
	subTok  string
}

func startHandoffServer(t *testing.T, single, multi, channel, workers, pubs int, extraEnv ...string) *hoSetup {
	t.Helper()
	return startHandoffProcs(t, 1, single, multi, channel, workers, pubs, extraEnv...)
}

// startHandoffProcs is startHandoffServer with --procs procs (1: not given).
func startHandoffProcs(t *testing.T, procs, single, multi, channel, workers, pubs int, extraEnv ...string) *hoSetup {
	t.Helper()
	dsn := migrated(t)
	sock := filepath.Join(t.TempDir(), "hub.sock")
	bin := filepath.Join(t.TempDir(), "pgsse")
	installBinary(t, binary(t), bin)
	args := []string{"--retention", "0", "--max-connections-per-subject", "0", "--hub-socket", sock}
	o := servetest.Options{Bin: bin, Env: append([]string{"DATABASE_URL=" + dsn, "PGSSE_JWT_SECRET=" + handoffSecret}, extraEnv...)}
	if procs > 1 {
		o.Procs = procs
		args = append(args, "--procs", strconv.Itoa(procs))
	}
	o.Args = args
	srv := servetest.Start(t, o)
	subTok := mintHandoff(t, auth.Claims{Streams: []string{"*"}, Channels: []string{"*"}})
	pubTok := mintHandoff(t, auth.Claims{Publish: []string{"*"}})
	load := startLoad(t, dsn, srv.URL(""), pubTok, pubs)
	var ws []*hoWorker
	for i := range workers {
		mode := framing.ModeLossless
		if i%4 == 3 {
			mode = framing.ModeWake
		}
		ws = append(ws, startWorker(t, sock, i, mode))
	}
	fleet := startFleet(t, srv.Listen, subTok, single, multi, channel, load.Heads)
	return &hoSetup{srv: srv, workers: ws, bin: bin, dsn: dsn, fleet: fleet, load: load, subTok: subTok}
}

// handoffScale is how many single-stream subscribers TestHandoffSIGUSR2KeepsEveryClient runs
// (PGSSE_TEST_HANDOFF_SUBSCRIBERS, default 150; multi-stream and channel clients are a fifth
// and a tenth of it more).
func handoffScale() int {
	if n, err := strconv.Atoi(os.Getenv("PGSSE_TEST_HANDOFF_SUBSCRIBERS")); err == nil && n > 0 {
		return n
	}
	return 150
}

func TestHandoffSIGUSR2KeepsEveryClient(t *testing.T) {
	n := handoffScale()
	h := startHandoffServer(t, n, n/5, n/10, 20, 8)
	pred := h.srv.Process()
	installBinary(t, binary(t), h.bin) // the new version, installed
	before := h.fleet.events()
	h.fleet.resetGaps() // the pauses measured are those of the handoff
	census := watchListenSessions(t, h.dsn)

	h.srv.Signal(syscall.SIGUSR2)
	line, err := pred.WaitLine(ctxFor(t, 45*time.Second), func(l []byte) bool {
		return bytes.Contains(l, []byte("handed everything over to the successor"))
	})
	require.NoError(t, err, "the predecessor hands over")
	var m struct {
		Successor   int
		Connections int
		Took        string
	}
	require.NoError(t, json.Unmarshal(line, &m))
	require.NotZero(t, m.Successor)
	t.Cleanup(func() { stopPID(t, m.Successor) })
	assert.Equal(t, len(h.fleet.clients)+len(h.workers), m.Connections, "every SSE client and hub worker was handed over")
	assert.Equal(t, 0, h.srv.WaitExit(20*time.Second), "the predecessor exits 0")
	exe, _ := os.Readlink("/proc/" + strconv.Itoa(m.Successor) + "/exe")
	assert.Equal(t, h.bin, exe, "the successor runs the installed binary")

	// New clients reach the successor; publishing goes on across the move and after it.
	late := dialSSE(t, h.srv.Listen, "/streams/h/1", h.subTok)
	_ = late
	time.Sleep(500 * time.Millisecond)
	h.load.Stop()
	h.fleet.check(t, before, int(h.load.note.Load()))
	checkWorkers(t, h.workers, int(h.load.note.Load()))
	assert.LessOrEqual(t, h.load.httpErr.Load(), int64(0), "keep-alive HTTP publishes that failed")
	h.fleet.logGaps(t, m.Took)
	low := census()
	assert.GreaterOrEqual(t, low, 1, "the census never showed 0 LISTEN sessions")
	waitFor(t, 10*time.Second, "one LISTEN session again", func() bool { return listenSessions(t, h.dsn) == 1 })
}

func TestHandoffFailedSuccessorKeepsServing(t *testing.T) {
	h := startHandoffServer(t, 30, 6, 6, 4, 2, "PGSSE_INTERNAL_HANDOFF_TIMEOUT=3s")
	cases := []struct {
		name, script, log string
	}{
		{"exits at once", "exit 3", "the successor exited before it was ready (exit status 3)"},
		{"another version", `printf '\000\000\000\002H\004' >&3; sleep 5`, "the successor speaks handoff version 4, this binary 3"},
		{"the previous version", `printf '\000\000\000\002H\002' >&3; sleep 5`, "the successor speaks handoff version 2, this binary 3"},
		{"hangs", "exec sleep 60", "the successor was not ready within 3s"},
	}
	for _, c := range cases {
		installScript(t, h.bin, c.script)
		before := h.fleet.events()
		started := strings.Count(h.srv.Process().Output(), "SIGUSR2: starting a successor")
		h.srv.Signal(syscall.SIGUSR2)
		if c.name == "hangs" {
			waitFor(t, 10*time.Second, "this handoff has begun", func() bool {
				return strings.Count(h.srv.Process().Output(), "SIGUSR2: starting a successor") > started
			})
			h.srv.Signal(syscall.SIGUSR2) // a second one during the handoff
			_, err := h.srv.Process().WaitLine(ctxFor(t, 10*time.Second), func(l []byte) bool {
				return bytes.Contains(l, []byte("SIGUSR2 ignored: a handoff is already in progress"))
			})
			require.NoError(t, err, "a second SIGUSR2 is ignored with a log line")
		}
		_, err := h.srv.Process().WaitLine(ctxFor(t, 20*time.Second), func(l []byte) bool {
			return bytes.Contains(l, []byte("handoff failed, still serving everything: "+c.log))
		})
		require.NoError(t, err, "%s: one line saying why", c.name)
		h.srv.Alive(c.name)
		// Everyone is still served, and new clients are accepted.
		waitFor(t, 10*time.Second, c.name+": events after the failed handoff", func() bool {
			for i, n := range h.fleet.events() {
				if n <= before[i] {
					return false
				}
			}
			return true
		})
		dialSSE(t, h.srv.Listen, "/streams/h/1", h.subTok)
	}
	h.load.Stop()
	h.fleet.check(t, make([]int, len(h.fleet.clients)), int(h.load.note.Load()))
	checkWorkers(t, h.workers, int(h.load.note.Load()))
	assert.Zero(t, h.load.httpErr.Load(), "HTTP publishes that failed")
}

// running is the processes whose executable path (argv[0]) is bin.
func running(bin string) []int {
	var pids []int
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		if err == nil && bytes.Equal(bytes.SplitN(cmd, []byte{0}, 2)[0], []byte(bin)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// stopPID drains a successor the harness did not start (SIGTERM) and waits until it is gone.
func stopPID(t *testing.T, pid int) {
	_ = syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(20 * time.Second)
	for !servetest.Gone(pid) {
		if time.Now().After(deadline) {
			t.Errorf("successor %d did not exit within 20 s of SIGTERM; killing it", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// procConns is how many SSE connections each process of --procs serves, by slot (the first
// process's /metrics: pgsse_process_sse_connections).
func procConns(s *servetest.Server, procs int) []float64 {
	out := make([]float64, procs)
	for i := range out {
		out[i] = s.Metric(`pgsse_process_sse_connections{process="` + strconv.Itoa(i) + `"}`)
	}
	return out
}

// With --procs 2 every process is replaced the same way (SPEC §6): durable, multi-stream and
// channel subscribers spread over both processes by the kernel, hub workers, publishers over
// SQL and keep-alive HTTP; SIGUSR2 to the first process → the sibling's connections move to
// the successor's sibling as the first process's move to the successor: zero client
// connections closed (no retry: either — a drained sibling would send one), every durable
// event once and in order, every channel notification once, the old processes all gone, the
// new ones serving (and new clients reaching both).
func TestHandoffSIGUSR2WithProcsKeepsEveryClient(t *testing.T) {
	n := handoffScale()
	h := startHandoffProcs(t, 2, n, n/5, n/10, 4, 4)
	total := len(h.fleet.clients)
	waitFor(t, 15*time.Second, "every client counted", func() bool { return h.srv.Metric("pgsse_sse_connections") == float64(total) })
	spread := procConns(h.srv, 2)
	require.Positive(t, spread[0], "the first process has subscribers")
	require.Positive(t, spread[1], "the sibling has subscribers")
	oldSibling := h.srv.SiblingPIDs()[1]
	require.NotZero(t, oldSibling)
	pred := h.srv.Process()
	installBinary(t, binary(t), h.bin)
	before := h.fleet.events()
	h.fleet.resetGaps()
	census := watchListenSessions(t, h.dsn)

	h.srv.Signal(syscall.SIGUSR2)
	line, err := pred.WaitLine(ctxFor(t, 90*time.Second), func(l []byte) bool {
		return bytes.Contains(l, []byte("handed everything over to the successor"))
	})
	require.NoError(t, err, "the predecessor hands over")
	var m struct {
		Successor   int
		Connections int
		Siblings    int
		Took        string
	}
	require.NoError(t, json.Unmarshal(line, &m))
	require.NotZero(t, m.Successor)
	t.Cleanup(func() { stopPID(t, m.Successor) })
	assert.Equal(t, 1, m.Siblings, "the sibling handed over and exited")
	assert.Equal(t, int(spread[0])+len(h.workers), m.Connections, "the first process handed over its SSE clients and hub workers")
	assert.Equal(t, 0, h.srv.WaitExit(20*time.Second), "the predecessor exits 0")
	assert.True(t, servetest.Gone(oldSibling), "the old sibling is gone")
	sib := h.srv.WaitLog(30*time.Second, "the successor's sibling took over", func(l map[string]any) bool {
		return l["msg"] == "handoff complete: serving everything the predecessor served" && l["proc"] != nil
	})
	assert.Equal(t, spread[1], sib["adopted"], "the sibling's successor adopted every one of its connections")
	newSibling := int(sib["pid"].(float64))
	assert.NotEqual(t, oldSibling, newSibling)
	assert.False(t, servetest.Gone(newSibling), "the successor's sibling serves")
	assert.Contains(t, h.srv.Log(), `"msg":"handed this sibling's connections over to the successor's; exiting"`)

	// The new processes serve: the connections are where they were, new clients reach them.
	waitFor(t, 15*time.Second, "the successor counts every client", func() bool {
		return h.srv.Metric("pgsse_sse_connections") == float64(total)
	})
	assert.Equal(t, spread, procConns(h.srv, 2), "each connection stayed with its slot")
	for range 8 {
		dialSSE(t, h.srv.Listen, "/streams/h/1", h.subTok)
	}
	time.Sleep(500 * time.Millisecond)
	h.load.Stop()
	h.fleet.check(t, before, int(h.load.note.Load()))
	checkWorkers(t, h.workers, int(h.load.note.Load()))
	assert.Zero(t, h.load.httpErr.Load(), "keep-alive HTTP publishes that failed")
	assert.GreaterOrEqual(t, census(), 1, "the census never showed 0 LISTEN sessions")
	waitFor(t, 10*time.Second, "one LISTEN session again", func() bool { return listenSessions(t, h.dsn) == 1 })
	assert.NotContains(t, h.srv.Log(), "switching to an own LISTEN session", "no sibling failed over to a session of its own")
	h.fleet.logGaps(t, m.Took)
}

// A successor whose sibling exits at once, or hangs and never says ready: the predecessor and
// its sibling keep serving everybody (nobody disconnected), one line says why, the successor
// and its new sibling are gone.
func TestHandoffProcsFailedSiblingKeepsServing(t *testing.T) {
	for _, c := range []struct{ name, env, why string }{
		{"exits at once", "1", "the sibling process of slot 1 could not hand over"},
		{"hangs", "hang", `the sibling process of slot 1 could not hand over","successor":`},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := startHandoffProcs(t, 2, 30, 6, 6, 2, 2, "PGSSE_INTERNAL_HANDOFF_TIMEOUT=8s")
			total := len(h.fleet.clients)
			waitFor(t, 15*time.Second, "every client counted", func() bool { return h.srv.Metric("pgsse_sse_connections") == float64(total) })
			require.Positive(t, procConns(h.srv, 2)[1], "the sibling has subscribers")
			oldSibling := h.srv.SiblingPIDs()[1]
			real := filepath.Join(t.TempDir(), "pgsse-real")
			installBinary(t, binary(t), real)
			installScript(t, h.bin, handoffSiblingExitEnv+"="+c.env+" exec "+real+` "$@"`)
			before := h.fleet.events()

			h.srv.Signal(syscall.SIGUSR2)
			line, err := h.srv.Process().WaitLine(ctxFor(t, 40*time.Second), func(l []byte) bool {
				return bytes.Contains(l, []byte("handoff failed, still serving everything: "))
			})
			require.NoError(t, err, "one line saying why")
			assert.Contains(t, string(line), c.why)
			if c.env == "hang" {
				assert.Contains(t, string(line), `"err":"not ready within 8s"`)
			}
			var m struct{ Successor int }
			require.NoError(t, json.Unmarshal(line, &m))
			waitFor(t, 10*time.Second, "the successor is gone", func() bool { return servetest.Gone(m.Successor) })
			waitFor(t, 10*time.Second, "the successor's sibling is gone", func() bool { return len(running(real)) == 0 })
			h.srv.Alive("after the failed handoff")
			assert.False(t, servetest.Gone(oldSibling), "the sibling serves on")
			assert.Equal(t, oldSibling, h.srv.SiblingPIDs()[1], "the same sibling serves slot 1")
			waitFor(t, 15*time.Second, "events after the failed handoff", func() bool {
				for i, n := range h.fleet.events() {
					if n <= before[i] {
						return false
					}
				}
				return true
			})
			for range 8 { // both processes accept again
				dialSSE(t, h.srv.Listen, "/streams/h/1", h.subTok)
			}
			h.load.Stop()
			h.fleet.check(t, before, int(h.load.note.Load()))
			checkWorkers(t, h.workers, int(h.load.note.Load()))
			assert.Zero(t, h.load.httpErr.Load(), "HTTP publishes that failed")
			assert.Equal(t, float64(total+8), h.srv.Metric("pgsse_sse_connections"))
		})
	}
}
