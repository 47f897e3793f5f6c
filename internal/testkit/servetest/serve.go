// Package servetest is the one subprocess harness of pgsse's tests: the pgsse binary built
// once per test binary (Binary), `pgsse serve` started on free ports against a test's
// database (Start), ready on a signal — its start-up log line, then /readyz — never after a
// sleep, stopped with SIGTERM (its --procs siblings checked gone), its log shown when the
// test fails. bench/ starts its servers with the same Process.
package servetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pgsse/pgsse/internal/testkit"
	"github.com/pgsse/pgsse/internal/testkit/metricstest"
)

// Wait says when Start returns.
type Wait int

const (
	// WaitReady: every process logged "pgsse serving" and /readyz answers 200 (the LISTEN
	// session is up, the schema is current).
	WaitReady Wait = iota
	// WaitServing: every process logged "pgsse serving" (for a server whose database is
	// unreachable or not migrated yet, or without an admin listener).
	WaitServing
)

// Options say how to run `pgsse serve`. The harness adds --listen and --admin-listen on free
// ports and --log-format json (its log lines are how it knows a process serves).
type Options struct {
	Bin  string   // the pgsse binary (default Binary(t, false))
	DSN  string   // --database-url, when not ""
	Env  []string // "K=V" entries on top of CleanEnv()
	Args []string // more flags (after the harness's own, so they win)
	// ListenHost is --listen's host (default 127.0.0.1; AllAddresses for ":port").
	ListenHost   string
	AllAddresses bool
	// Listen is --listen exactly (host:port), for a server that must take over another's
	// port; empty: a free port.
	Listen      string
	NoAdmin     bool // --admin-listen "" (then Wait must be WaitServing)
	Procs       int  // --procs (0: not given); Start waits for every process
	NoFile      int  // RLIMIT_NOFILE soft limit of the server (0: the test's)
	Wait        Wait
	StopTimeout time.Duration // how long SIGTERM may take (default 30 s)
}

// Server is `pgsse serve` running for one test. Stop and Start reuse its ports, so that
// clients see a restart of the same server.
type Server struct {
	t    testing.TB
	opts Options
	args []string
	out  *Output

	Listen string // --listen as given (host:port)
	Admin  string // 127.0.0.1:port of the admin listener ("" with NoAdmin)
	port   int

	mu   sync.Mutex
	proc *Process
	pids map[int]bool // every process that said it serves
}

// Start runs `pgsse serve` with o, waits as o.Wait says and stops it when the test ends
// (failing the test if SIGTERM did not end it, or a sibling outlived it). The log is shown
// when the test fails (or with PGSSE_TEST_LOGS set), and a data race the race detector
// reports in it fails the test.
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	if o.Bin == "" {
		o.Bin = Binary(t, false)
	}
	if o.StopTimeout == 0 {
		o.StopTimeout = 30 * time.Second
	}
	if o.NoAdmin && o.Wait == WaitReady {
		t.Fatal("servetest: WaitReady needs the admin listener")
	}
	out, err := NewOutput("")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{t: t, opts: o, out: out, pids: map[int]bool{}}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() || os.Getenv("PGSSE_TEST_LOGS") != "" {
			t.Logf("pgsse serve log (%s):\n%s", strings.Join(s.args, " "), testkit.Tail(out.String(), 12000))
		}
	})
	// A free port can be taken by another process before pgsse binds it: then new ports
	// (only here; a restart keeps its ports).
	for attempt := 1; ; attempt++ {
		if o.Listen != "" {
			_, port, _ := strings.Cut(o.Listen, ":")
			if s.port, err = strconv.Atoi(port); err != nil {
				t.Fatalf("servetest: Listen %q: want host:port", o.Listen)
			}
			s.Listen = o.Listen
		} else {
			s.port = testkit.FreePort(t)
			host := o.ListenHost
			if host == "" {
				host = "127.0.0.1"
			}
			if o.AllAddresses {
				host = ""
			}
			s.Listen = host + ":" + strconv.Itoa(s.port)
		}
		admin := ""
		if !o.NoAdmin {
			s.Admin = "127.0.0.1:" + strconv.Itoa(testkit.FreePort(t))
			admin = s.Admin
		}
		s.args = append([]string{"serve", "--listen", s.Listen, "--admin-listen", admin, "--log-format", "json"}, o.Args...)
		if o.DSN != "" {
			s.args = append(s.args[:1], append([]string{"--database-url", o.DSN}, s.args[1:]...)...)
		}
		err := s.start()
		if err == nil {
			return s
		}
		if !strings.Contains(err.Error(), "address already in use") || attempt == 3 {
			t.Fatal(err)
		}
		out.Printf("a port was taken meanwhile; again on new ports")
	}
}

// Start starts the stopped server again, on the same ports, and waits as before.
func (s *Server) Start() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatal(err)
	}
}

func (s *Server) start() error {
	s.t.Helper()
	s.mu.Lock()
	if s.proc != nil {
		s.mu.Unlock()
		return errors.New("servetest: the server is running")
	}
	s.mu.Unlock()
	s.out.Printf("start %s", time.Now().Format(time.TimeOnly+".000")) // not the arguments: the log holds no secret
	p, err := StartProcess(ProcessOptions{Path: s.opts.Bin, Args: s.args, Env: append(CleanEnv(), s.opts.Env...),
		NoFile: s.opts.NoFile, Output: s.out})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	fail := func(what string, err error) error {
		s.stopProcess(p)
		return fmt.Errorf("servetest: pgsse serve %s: %v (%v):\n%s", what, err, p.State(), testkit.Tail(p.Output(), 6000))
	}
	siblings := map[float64]bool{}
	_, err = p.WaitLine(ctx, func(line []byte) bool {
		m := jsonLine(line)
		if m == nil || m["msg"] != "pgsse serving" {
			return false
		}
		s.sawServing(m)
		if slot, ok := m["proc"].(float64); ok {
			siblings[slot] = true
		} else {
			siblings[-1] = true
		}
		return siblings[-1] && len(siblings) >= max(s.opts.Procs, 1)
	})
	if err != nil {
		return fail("did not serve", err)
	}
	if s.opts.Wait == WaitReady {
		client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		err := p.Poll(ctx, 20*time.Millisecond, func() error {
			code, body, err := get(client, "http://"+s.Admin+"/readyz")
			if err == nil && code != http.StatusOK {
				err = fmt.Errorf("/readyz %d %s", code, strings.TrimSpace(body))
			}
			return err
		})
		if err != nil {
			return fail("not ready", err)
		}
	}
	return nil
}

func (s *Server) sawServing(m map[string]any) {
	if pid, ok := m["pid"].(float64); ok {
		s.mu.Lock()
		s.pids[int(pid)] = true
		s.mu.Unlock()
	}
}

func get(c *http.Client, url string) (int, string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// Stop sends SIGTERM (drain) and waits; a server that is still running after StopTimeout
// fails the test and is killed, and so is any process of it (a --procs sibling) that
// outlived it. Idempotent.
func (s *Server) Stop() {
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p != nil {
		s.stopProcess(p)
	}
}

func (s *Server) stopProcess(p *Process) {
	if p.Stop(s.opts.StopTimeout) {
		s.t.Errorf("pgsse serve did not exit within %s of SIGTERM; killed it", s.opts.StopTimeout)
	}
	s.out.Printf("exited %s: %v", time.Now().Format(time.TimeOnly+".000"), p.State())
	s.SiblingPIDs() // every sibling that ever served, replacements too
	s.mu.Lock()
	pids := make([]int, 0, len(s.pids))
	for pid := range s.pids {
		pids = append(pids, pid)
	}
	s.mu.Unlock()
	for _, pid := range pids {
		if pid != p.PID() && !Gone(pid) {
			s.t.Errorf("process %d of pgsse serve (a sibling) outlived the first one; killing it", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	p.CloseOutput(5 * time.Second)
	if bytes.Contains([]byte(p.Output()), []byte("WARNING: DATA RACE")) {
		s.t.Errorf("the race detector found a data race in pgsse serve (see its log)")
	}
	s.mu.Lock()
	if s.proc == p {
		s.proc = nil
	}
	s.mu.Unlock()
}

// Process is the running first process (nil once stopped).
func (s *Server) Process() *Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc
}

// PID is the first process's pid.
func (s *Server) PID() int {
	p := s.Process()
	if p == nil {
		s.t.Fatal("servetest: the server is not running")
	}
	return p.PID()
}

// Signal sends sig to the first process.
func (s *Server) Signal(sig os.Signal) {
	s.t.Helper()
	if err := s.Process().Signal(sig); err != nil {
		s.t.Fatalf("servetest: signal %v: %v", sig, err)
	}
}

// Kill sends SIGKILL to the first process and waits for it; a later Stop only tidies up.
func (s *Server) Kill() { s.Process().Kill() }

// Exited is closed once the first process has exited.
func (s *Server) Exited() <-chan struct{} { return s.Process().Exited() }

// WaitExit waits up to d for the first process to exit (failing the test otherwise) and
// returns its exit status.
func (s *Server) WaitExit(d time.Duration) int {
	s.t.Helper()
	p := s.Process()
	select {
	case <-p.Exited():
	case <-time.After(d):
		s.t.Fatalf("pgsse serve did not exit within %s", d)
	}
	return p.State().ExitCode()
}

// Alive fails the test if the first process has exited.
func (s *Server) Alive(when string) {
	s.t.Helper()
	p := s.Process()
	if p == nil {
		s.t.Fatalf("pgsse serve is stopped %s", when)
	}
	select {
	case <-p.Exited():
		s.t.Fatalf("pgsse serve exited %s (%v); log:\n%s", when, p.State(), testkit.Tail(p.Output(), 6000))
	default:
	}
}

// URL is the server's base URL on 127.0.0.1 plus path.
func (s *Server) URL(path string) string {
	return "http://127.0.0.1:" + strconv.Itoa(s.port) + path
}

// Port is the --listen port.
func (s *Server) Port() int { return s.port }

// Origin is the server's origin as a browser names it.
func (s *Server) Origin() string { return s.URL("") }

// AdminPort is the admin listener's port.
func (s *Server) AdminPort() int {
	_, port, _ := strings.Cut(s.Admin, ":")
	n, _ := strconv.Atoi(port)
	return n
}

// DSN is the database the server was started with (Options.DSN).
func (s *Server) DSN() string { return s.opts.DSN }

// AdminURL is the admin listener's URL plus path.
func (s *Server) AdminURL(path string) string { return "http://" + s.Admin + path }

// Metric is one series of the server's /metrics (see metricstest); a missing one fails the
// test.
func (s *Server) Metric(selector string) float64 {
	s.t.Helper()
	return metricstest.Metric(s.t, s.AdminURL("/metrics"), selector)
}

// MetricOrAbsent is Metric for a series that may rightly be missing.
func (s *Server) MetricOrAbsent(selector string) (float64, bool) {
	s.t.Helper()
	return metricstest.MetricOrAbsent(s.t, s.AdminURL("/metrics"), selector)
}

// Log is everything every process of the server wrote, with the harness's start and exit
// lines between runs.
func (s *Server) Log() string { return s.out.String() }

// Lines are the JSON log lines so far, parsed.
func (s *Server) Lines() []map[string]any {
	var out []map[string]any
	for _, line := range bytes.Split([]byte(s.out.String()), []byte("\n")) {
		if m := jsonLine(line); m != nil {
			out = append(out, m)
		}
	}
	return out
}

// WaitLog waits until the running server logs a JSON line for which match holds (woken by
// each write) and returns it; it fails the test after timeout or if the server ends first.
// Lines from before this start of the server count too.
func (s *Server) WaitLog(timeout time.Duration, what string, match func(line map[string]any) bool) map[string]any {
	s.t.Helper()
	p := s.Process()
	if p == nil {
		s.t.Fatalf("servetest: waiting for %s: the server is stopped", what)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// The whole log, not only this run's: a sibling's line may predate a restart.
	all := &Process{Out: s.out, readDone: p.readDone}
	var found map[string]any
	_, err := all.WaitLine(ctx, func(line []byte) bool {
		m := jsonLine(line)
		if m != nil && match(m) {
			found = m
			return true
		}
		return false
	})
	if err != nil {
		s.t.Fatalf("servetest: waiting for %s: %v", what, err)
	}
	return found
}

// SiblingPIDs maps each --procs slot to the pid of the latest sibling that said it serves
// there.
func (s *Server) SiblingPIDs() map[int]int {
	out := map[int]int{}
	for _, l := range s.Lines() {
		if l["msg"] == "pgsse serving" && l["proc"] != nil {
			out[int(l["proc"].(float64))] = int(l["pid"].(float64))
			s.sawServing(l)
		}
	}
	return out
}

// jsonLine parses a JSON log line (nil for anything else: a race report, a panic).
func jsonLine(line []byte) map[string]any {
	line = bytes.TrimSpace(line)
	if len(line) == 0 || line[0] != '{' {
		return nil
	}
	var m map[string]any
	if json.Unmarshal(line, &m) != nil {
		return nil
	}
	return m
}
