//go:build linux

package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pgsse/pgsse/internal/testkit/metricstest"
)

// server is `pgsse serve --procs N` under test. The run restarts its first process after a
// SIGKILL, as a supervisor (systemd's Restart=always) would: with the same arguments, retried
// every second until it serves (an orphaned sibling may hold the port while it drains).
type server struct {
	bin     string
	args    []string
	procs   int
	logPath string
	admin   string // host:port of /metrics, /readyz
	client  *http.Client

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	starts  int
	exitErr error
	// adopted is the first process after a SIGUSR2 handoff: a successor the run did not
	// start (0 = the one it started is the first process).
	adopted int

	restarting atomic.Bool    // a restart after kill-first is under way
	restartWG  sync.WaitGroup // that restart
}

func (s *server) start(ctx context.Context) error {
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	s.mu.Lock()
	s.starts++
	fmt.Fprintf(logf, "=== chaos: start %d of pgsse %s\n", s.starts, strings.Join(s.args, " "))
	s.mu.Unlock()
	cmd := exec.Command(s.bin, s.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "GODEBUG=")
	// The first process dies with the run; its siblings follow it (they drain on its death).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	s.mu.Lock()
	s.cmd, s.done, s.adopted = cmd, done, 0
	s.mu.Unlock()
	go func() {
		err := cmd.Wait()
		s.mu.Lock()
		s.exitErr = err
		s.mu.Unlock()
		close(done)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-done:
			return fmt.Errorf("pgsse serve exited: %v", s.exitErr)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if s.ready(ctx) {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("pgsse serve not ready with every process within 60 s")
		}
		_ = sleepCtx(ctx, 100*time.Millisecond)
	}
}

// ready reports whether /readyz answers 200 and every process serves (pgsse_procs).
func (s *server) ready(ctx context.Context) bool {
	if code, _ := s.get(ctx, "/readyz"); code != 200 {
		return false
	}
	if s.procs <= 1 {
		return true
	}
	_, body := s.get(ctx, "/metrics")
	return metricValue(body, "pgsse_procs") == float64(s.procs)
}

func (s *server) get(ctx context.Context, path string) (int, string) {
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(cctx, "GET", "http://"+s.admin+path, nil)
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return resp.StatusCode, string(b)
}

// metricValue is the value of an unlabelled series in a Prometheus text exposition, read by
// the test kit's parser (NaN-free: -1 when absent or unreadable).
func metricValue(body, name string) float64 {
	sc, err := metricstest.Parse(strings.NewReader(body), "pgsse /metrics")
	if err != nil {
		return -1
	}
	v, err := sc.Lookup(name)
	if err != nil {
		return -1
	}
	return v
}

// restart starts the first process again until it serves or ctx ends; it returns the
// attempts it took.
func (s *server) restart(ctx context.Context) (int, error) {
	for n := 1; ; n++ {
		err := s.start(ctx)
		if err == nil {
			return n, nil
		}
		if ctx.Err() != nil {
			return n, err
		}
		s.killFirst() // not ready in time: make way for the next attempt
		if sleepCtx(ctx, time.Second) != nil {
			return n, ctx.Err()
		}
	}
}

// first is the first process's pid (0 if it is not running).
func (s *server) first() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.adopted != 0 {
		if alive(s.adopted) {
			return s.adopted
		}
		return 0
	}
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	select {
	case <-s.done:
		return 0
	default:
	}
	return s.cmd.Process.Pid
}

// siblings are the first process's children (its --procs siblings).
func (s *server) siblings() []int { return children(s.first()) }

func children(pid int) []int {
	if pid <= 0 {
		return nil
	}
	var out []int
	tasks, _ := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	for _, t := range tasks {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + t.Name() + "/children")
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// killFirst SIGKILLs the first process and waits for it.
func (s *server) killFirst() {
	s.mu.Lock()
	cmd, done, adopted := s.cmd, s.done, s.adopted
	s.mu.Unlock()
	if adopted != 0 {
		_ = syscall.Kill(adopted, syscall.SIGKILL)
		waitGone(adopted, 30*time.Second)
		return
	}
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// stop drains the server (SIGTERM), SIGKILL after 30 s.
func (s *server) stop() {
	s.mu.Lock()
	cmd, done, adopted := s.cmd, s.done, s.adopted
	s.mu.Unlock()
	if adopted != 0 {
		_ = syscall.Kill(adopted, syscall.SIGTERM)
		if !waitGone(adopted, 30*time.Second) {
			_ = syscall.Kill(adopted, syscall.SIGKILL)
		}
		return
	}
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// helpHas reports whether `pgsse serve --help` mentions s (auto-detecting features).
func helpHas(bin, s string) bool {
	out, _ := exec.Command(bin, "serve", "--help").CombinedOutput()
	return strings.Contains(string(out), s)
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// waitGone waits until pid has exited (it is not our child: polled).
func waitGone(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if !alive(pid) {
			return true
		}
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && strings.HasPrefix(string(b[i+1:]), " Z") {
			return true // a zombie nobody reaps yet: gone as far as serving goes
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// followHandoff waits, after a SIGUSR2, until the predecessor the run knows has exited and
// a successor serves, and adopts the successor as the first process: the process whose
// command line carries this server's --admin-listen and that is not a sibling.
func (s *server) followHandoff(ctx context.Context) error {
	s.mu.Lock()
	done, prev := s.done, s.adopted
	s.mu.Unlock()
	deadline := time.Now().Add(45 * time.Second)
	if prev == 0 {
		select {
		case <-done:
		case <-time.After(time.Until(deadline)):
			return errors.New("the predecessor did not exit within 45 s of SIGUSR2")
		case <-ctx.Done():
			return ctx.Err()
		}
	} else if !waitGone(prev, time.Until(deadline)) {
		return errors.New("the predecessor did not exit within 45 s of SIGUSR2")
	}
	for time.Now().Before(deadline) {
		if pid := s.findFirst(); pid != 0 && pid != prev {
			s.mu.Lock()
			s.adopted = pid
			s.mu.Unlock()
			if s.ready(ctx) {
				return nil
			}
		}
		if sleepCtx(ctx, 100*time.Millisecond) != nil {
			return ctx.Err()
		}
	}
	return errors.New("no successor serving within 45 s of SIGUSR2")
}

func (s *server) findFirst() int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if !strings.Contains(string(cmdline), "\x00"+s.admin+"\x00") {
			continue
		}
		env, _ := os.ReadFile("/proc/" + e.Name() + "/environ")
		if strings.Contains(string(env), "PGSSE_INTERNAL_SIBLING=") {
			continue
		}
		return pid
	}
	return 0
}
