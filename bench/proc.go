//go:build linux

package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pgsse/pgsse/internal/testkit/metricstest"
	"github.com/pgsse/pgsse/internal/testkit/servetest"
)

// Target says how to start one server under test.
type Target struct {
	Name      string        // "pgsse" or "baseline": decides the command line
	Bin       string        // path to the binary
	Heartbeat time.Duration // --heartbeat of both servers
	Pprof     bool          // serve /debug/pprof on the admin address
	ExtraArgs []string
	// Label names the target in results when it is not Name (e.g. "pgsse-old" for an older
	// pgsse build run beside the current one).
	Label string
	// Old marks a pgsse build from before --max-outbound-memory: the flag is not passed.
	Old bool
	// Procs is pgsse's --procs (0 = not given); StartServer waits until every process serves.
	Procs int
	// SSEPort and AdminPort fix the server's ports (0: free ones), so that a server can be
	// started again where its clients reconnect (the deploy scenario).
	SSEPort, AdminPort int
	// LogLevel is pgsse's --log-level (default warn).
	LogLevel string
	// MaxConns is pgsse's --max-connections (default 16000).
	MaxConns int
}

func (t Target) label() string {
	if t.Label != "" {
		return t.Label
	}
	return t.Name
}

// Server is a running server process under test.
type Server struct {
	Name    string
	PID     int
	SSE     netip.AddrPort // where GET /streams/… is served
	Admin   string         // host:port of the admin (pgsse) or pprof (baseline) listener
	LogPath string

	proc    *servetest.Process // internal/testkit/servetest: the tests' harness of processes
	out     *servetest.Output
	stopped bool
}

// StartServer starts t against the database at dsn, logging to a file in dir, and waits
// until it answers GET /streams/… with 200.
func StartServer(ctx context.Context, t Target, dsn, dir string) (*Server, error) {
	ssePort, adminPort := t.SSEPort, t.AdminPort
	var err error
	if ssePort == 0 {
		if ssePort, err = freePort(); err != nil {
			return nil, err
		}
	}
	if adminPort == 0 {
		if adminPort, err = freePort(); err != nil {
			return nil, err
		}
	}
	sse := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(ssePort))
	admin := "127.0.0.1:" + strconv.Itoa(adminPort)
	hb := t.Heartbeat
	if hb <= 0 {
		hb = 15 * time.Second
	}
	var args []string
	switch t.Name {
	case "pgsse":
		args = []string{"serve",
			"--database-url", dsn,
			"--listen", sse.String(),
			"--admin-listen", admin,
			"--heartbeat", hb.String(),
			"--public-streams", "*",
			"--max-connections", strconv.Itoa(cmp.Or(t.MaxConns, 16000)),
			"--retention", "0",
			"--log-level", cmp.Or(t.LogLevel, "warn"),
		}
		if t.Pprof {
			args = append(args, "--pprof")
		}
		if t.Procs > 0 {
			args = append(args, "--procs", strconv.Itoa(t.Procs))
		}
	case "baseline":
		args = []string{
			"--database-url", dsn,
			"--listen", sse.String(),
			"--heartbeat", hb.String(),
		}
		if t.Pprof {
			args = append(args, "--pprof", admin)
		}
	case GnetRelay:
		args = []string{
			"--database-url", dsn,
			"--listen", sse.String(),
			"--heartbeat", hb.String(),
		}
	default:
		return nil, fmt.Errorf("unknown target %q (want pgsse, baseline or %s)", t.Name, GnetRelay)
	}
	args = append(args, t.ExtraArgs...)
	logPath := filepath.Join(dir, t.Name+"-"+randHex(3)+".log")
	out, err := servetest.NewOutput(logPath)
	if err != nil {
		return nil, err
	}
	// The server dies with us even if we are killed: never leave one running.
	p, err := servetest.StartProcess(servetest.ProcessOptions{Path: t.Bin, Args: args, Output: out, DieWithParent: true,
		Env: append(os.Environ(), "GODEBUG=")}) // nothing inherited that changes the runtime
	if err != nil {
		out.Close()
		return nil, err
	}
	s := &Server{Name: t.Name, PID: p.PID(), SSE: sse, Admin: admin, LogPath: logPath, proc: p, out: out}
	if err := s.waitReady(ctx, 30*time.Second); err != nil {
		s.Stop()
		return nil, fmt.Errorf("%s did not become ready: %w\n%s", t.Name, err, tail(logPath, 20))
	}
	if t.Procs > 1 {
		if err := s.waitProcs(ctx, t.Procs, 30*time.Second); err != nil {
			s.Stop()
			return nil, fmt.Errorf("%s --procs %d: %w\n%s", t.Name, t.Procs, err, tail(logPath, 20))
		}
	}
	return s, nil
}

// waitReady waits until the server answers GET /streams/… with 200 (both targets do; the
// baseline has no /readyz), or exits.
func (s *Server) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return s.proc.Poll(ctx, 50*time.Millisecond, func() error { return probe(s.SSE.String()) })
}

// probe opens one stream and checks for a 200 head.
func probe(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, "GET /streams/bench-probe HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "HTTP/1.1 200 ") {
		return fmt.Errorf("probe: %q", strings.TrimSpace(line))
	}
	return nil
}

// Stop sends SIGTERM, waits up to 5 s, then SIGKILLs. Safe to call twice.
func (s *Server) Stop() {
	if s == nil || s.proc == nil || s.stopped {
		return
	}
	s.stopped = true
	s.proc.Stop(5 * time.Second)
	s.proc.CloseOutput(5 * time.Second) // --procs siblings hold the output until they are gone
	s.out.Close()
}

// Exited reports whether the process has ended (and how).
func (s *Server) Exited() (bool, error) {
	select {
	case <-s.proc.Exited():
		return true, s.proc.ExitErr()
	default:
		return false, nil
	}
}

// RSS is the resident set size (VmRSS) in bytes of the server's process tree (Tree: with
// --procs, the first process and its siblings).
func (s *Server) RSS() (int64, error) { return treeSum(s, procRSS) }

// CPU is the user+system CPU time so far of the server's process tree (10 ms resolution).
func (s *Server) CPU() (time.Duration, error) { return treeSum(s, procCPU) }

// treeSum adds up read over the server's process tree; only the first process must be
// readable (a sibling may be restarting).
func treeSum[T int64 | time.Duration](s *Server, read func(pid int) (T, error)) (T, error) {
	var sum T
	for i, pid := range s.Tree() {
		v, err := read(pid)
		if err != nil && i == 0 {
			return 0, err
		}
		sum += v
	}
	return sum, nil
}

// Metrics scrapes the admin listener's /metrics (internal/testkit/metricstest).
func (s *Server) Metrics(ctx context.Context) (*metricstest.Scrape, error) {
	return metricstest.Get(ctx, "http://"+s.Admin+"/metrics")
}

// Get fetches a path from the admin listener (pprof).
func (s *Server) Get(ctx context.Context, path string, w io.Writer) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.Admin+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	_, err = io.Copy(w, resp.Body)
	return err
}

func procRSS(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for ln := range bytes.Lines(b) {
		if v, ok := bytes.CutPrefix(ln, []byte("VmRSS:")); ok {
			f := strings.Fields(string(v)) // "12345 kB"
			if len(f) == 2 && f[1] == "kB" {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				return kb << 10, err
			}
		}
	}
	return 0, errors.New("no VmRSS in /proc/pid/status")
}

// clockTick is USER_HZ, 100 on every Linux we run on.
const clockTick = 10 * time.Millisecond

func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may contain spaces: fields count from after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc/pid/stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("short /proc/pid/stat")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64) // field 14 utime
	st, err2 := strconv.ParseInt(f[12], 10, 64) // field 15 stime
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * clockTick, nil
}

// SelfCPU is this process's user+system CPU time (microsecond resolution).
func SelfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// LoadAvg is the 1-minute load average, as /proc/loadavg says it ("?" if unreadable): every
// reported figure says what the machine was doing.
func LoadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// RaiseFDLimit raises the soft RLIMIT_NOFILE to the hard limit and returns it: a load
// generator holds one descriptor per connection.
func RaiseFDLimit() uint64 {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err == nil && l.Cur < l.Max {
		l.Cur = l.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
	return l.Cur
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Build compiles the pgsse command and the baseline into dir and returns their paths. root
// is the module root (where go.mod is).
func Build(ctx context.Context, root, dir string) (pgsse, baseline string, err error) {
	pgsse = filepath.Join(dir, "pgsse")
	baseline = filepath.Join(dir, "baseline")
	if err := servetest.Build(ctx, root, pgsse, false); err != nil {
		return "", "", err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", baseline, "./bench/baseline")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("go build ./bench/baseline: %v\n%s", err, out)
	}
	return pgsse, baseline, nil
}

// BuildRelay builds bench/gnetrelay (scenario 14's floor) into dir.
func BuildRelay(ctx context.Context, root, dir string) (string, error) {
	bin := filepath.Join(dir, GnetRelay)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./bench/gnetrelay")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./bench/gnetrelay: %v\n%s", err, out)
	}
	return bin, nil
}
