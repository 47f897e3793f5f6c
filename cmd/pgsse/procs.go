package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgsse/pgsse/engine"
)

// --procs N (docs/scaling.md, Every core of a host). The first process is an ordinary pgsse
// serve — it owns the LISTEN session, the hub and the admin endpoint — that also starts N−1
// copies of itself, its siblings, on the same --listen address (SO_REUSEPORT in every process:
// the kernel spreads new connections over them). Each sibling runs its own loop and replay pool
// and takes its notifications from the first process's hub (engine/siblingsource.go).
//
// How a sibling is told what it is, and why no outside worker can pose as one: the first
// process makes a socketpair per sibling, enrols one end in its hub as a sibling
// (engine.Server.AddSibling: the only hub connection allowed the stream channel) and hands the
// other end to the child as descriptor 3 — and a second socketpair as descriptor 4, the control
// socket over which a SIGUSR2 handoff reaches the sibling (prochandoff.go); the environment
// variable siblingEnv says which slot it fills, the address to bind (the port the first
// process actually bound, for :0) and where
// to serve its metrics. The child runs with the same arguments and environment otherwise.
//
// The rules of life and death:
//   - A sibling that exits is restarted, at once the first time and then with a doubling
//     backoff (siblingRestartMin … siblingRestartMax) that resets once it served for
//     siblingStableAfter; each exit is logged with its cause. Its clients reconnect — the
//     kernel hands them to the live processes — and resume from Last-Event-ID.
//   - SIGTERM or SIGINT to the first process drains everything: the siblings first (SIGTERM,
//     SIGKILL after siblingStopTimeout), so that none of them fails over to a session of its
//     own on the way down, then the first process itself.
//   - No sibling outlives the first process for long: it gets parentDeathSignal when the first
//     process dies (even by SIGKILL). Its hub connection ends at the same moment, so it has
//     already switched to a LISTEN session of its own and goes on delivering to the clients it
//     has; it stops accepting at once (its listening socket closed), so that a new set started
//     by a supervisor binds --listen right away; after orphanGrace it drains (its clients are
//     told to retry, and find the processes the supervisor has started meanwhile) and exits. Siblings run in their own process group, so a
//     Ctrl-C in a terminal reaches only the first process, which stops them in order.
//   - /metrics on the first process sums the pgsse_* series of every live process
//     (procsmetrics.go); pgsse_process_sse_connections{process} shows the spread.
const (
	siblingEnv           = "PGSSE_INTERNAL_SIBLING" // JSON siblingMarker; set only by the first process
	siblingHubFD         = 3                        // the sibling's end of the socketpair (ExtraFiles[0])
	siblingCtlFD         = 4                        // its end of the control socketpair (ExtraFiles[1]; prochandoff.go)
	siblingHandoffFD     = 5                        // with siblingMarker.Handoff: the predecessor's sibling's socket (ExtraFiles[2])
	siblingRestartMin    = 100 * time.Millisecond
	siblingRestartMax    = 30 * time.Second
	siblingStableAfter   = time.Minute
	siblingStopTimeout   = 12 * time.Second // drain (5 s) and stop (5 s) with room to spare
	siblingScrapeTimeout = 2 * time.Second
	orphanGrace          = 15 * time.Second
	parentDeathSignal    = syscall.SIGHUP
	selfExe              = "/proc/self/exe" // the running binary, even if the file was replaced since
)

// siblingMarker is what the first process tells a sibling (siblingEnv).
type siblingMarker struct {
	Slot    int    `json:"slot"`    // 1 … N−1 (the first process is 0)
	Listen  string `json:"listen"`  // the address to bind, with the port the first process bound
	Metrics string `json:"metrics"` // Unix socket to serve /metrics on, in the first process's private directory
	Parent  int    `json:"parent"`  // the first process's pid
	// Handoff: this sibling is the successor of the predecessor's sibling of the same slot;
	// siblingHandoffFD is the socket it hands over on (prochandoff.go).
	Handoff bool `json:"handoff,omitempty"`
}

// readSiblingMarker returns the marker if this process is a sibling, nil otherwise.
func readSiblingMarker(env func(string) (string, bool)) (*siblingMarker, error) {
	v, ok := env(siblingEnv)
	if !ok || v == "" {
		return nil, nil
	}
	var m siblingMarker
	if err := json.Unmarshal([]byte(v), &m); err != nil || m.Slot < 1 || m.Listen == "" || m.Metrics == "" || m.Parent < 1 {
		return nil, fmt.Errorf("%s: not a marker set by pgsse serve --procs (it is internal): %q", siblingEnv, v)
	}
	return &m, nil
}

// asSibling turns serve's configuration into a sibling's: the first process's address, shared
// (the engine binds --listen with SO_REUSEPORT always, and refuses an address another socket
// holds unless told to share it), the hub socket it inherited as the LISTEN source, and none of
// what only the first process does (admin endpoint, hub socket, retention).
func (s *serveSetup) asSibling(m *siblingMarker) error {
	f := os.NewFile(siblingHubFD, "pgsse-sibling-hub")
	if f == nil {
		return fmt.Errorf("%s: descriptor %d (the hub socket) is not open", siblingEnv, siblingHubFD)
	}
	c, err := net.FileConn(f)
	_ = f.Close()
	if err != nil {
		return fmt.Errorf("%s: descriptor %d is not the hub socket: %v", siblingEnv, siblingHubFD, err)
	}
	if _, ok := c.(*net.UnixConn); !ok {
		_ = c.Close()
		return fmt.Errorf("%s: descriptor %d is not a Unix socket", siblingEnv, siblingHubFD)
	}
	// The child was started as /proc/self/exe, which the kernel names "exe": take the
	// first process's name back for ps and top (best effort; Linux only).
	_ = os.WriteFile("/proc/self/comm", []byte(filepath.Base(os.Args[0])), 0)
	if s.siblingCtl, err = siblingCtl(); err != nil {
		_ = c.Close()
		return err
	}
	s.sibling = m
	s.procs = 1
	s.adminListen, s.pprof = "", false
	s.logger = s.logger.With("proc", m.Slot)
	s.cfg.Logger = s.logger
	s.cfg.Listen = m.Listen
	s.cfg.ShareListen = true // the first process holds --listen; a sibling joins it (SO_REUSEPORT)
	s.cfg.HubSocket = ""
	s.cfg.Retention = 0
	s.cfg.SiblingHub = c
	s.cfg.PresenceIndex = m.Slot // its own presence key and lease (docs/architecture.md, Presence)
	return nil
}

// siblingListen is the address a sibling binds: --listen as given, with the port the first
// process bound (which differs only for port 0).
func siblingListen(listen string, bound net.Addr) string {
	host, _, err := net.SplitHostPort(listen)
	ta, ok := bound.(*net.TCPAddr)
	if err != nil || !ok || ta.Port == 0 {
		return listen
	}
	return net.JoinHostPort(host, strconv.Itoa(ta.Port))
}

// --- the first process's side ------------------------------------------------------------

// supervisor starts, restarts and stops the siblings. All process starts happen on one
// goroutine locked to its OS thread: Linux sends the parent-death signal when the thread
// that forked the child exits, not the process, so the siblings' parent thread must live as
// long as the first process does.
type supervisor struct {
	log            *slog.Logger
	srv            *engine.Server
	args, env      []string
	stdout, stderr io.Writer
	dir            string // private (0700) directory of the siblings' metrics sockets

	listen string // set by start
	slots  []*siblingSlot
	exits  chan siblingExit
	due    chan int // slots whose restart backoff has passed
	stopC  chan struct{}
	done   chan struct{}
	once   sync.Once

	// hold, if set (a successor whose siblings take over: setHandoffs), delays restarts until
	// releaseRestarts: a sibling that could not take over is not replaced by one that accepts
	// on its own while the predecessor may still call the handoff off.
	hold     chan struct{}
	holdOnce sync.Once

	mu       sync.Mutex // guards slots' pid (read by the metrics gatherer)
	procs    prometheus.Gauge
	restarts prometheus.Counter
}

type siblingSlot struct {
	slot      int
	metrics   string
	pid       int // 0 while not running
	startedAt time.Time
	backoff   time.Duration // the next restart's delay
	// ctl is this process's end of the running sibling's control socket (prochandoff.go);
	// handoff, if set, is the socket its first start hands over on (a successor's sibling:
	// siblingMarker.Handoff). committed: the sibling hands its connections over to a
	// successor's and then exits: not restarted, gone closed once it has.
	ctl       *net.UnixConn
	handoff   *os.File
	committed bool
	gone      chan struct{}
}

type siblingExit struct {
	slot int
	pid  int
	err  error
}

// newSupervisor prepares n−1 sibling slots (nothing runs until start) and registers
// pgsse_procs and pgsse_proc_restarts_total.
func newSupervisor(n int, args, env []string, stdout, stderr io.Writer, log *slog.Logger, reg prometheus.Registerer) (*supervisor, error) {
	dir, err := os.MkdirTemp("", "pgsse-procs-") // 0700
	if err != nil {
		return nil, fmt.Errorf("--procs: cannot create the siblings' private directory: %w", err)
	}
	sv := &supervisor{
		log: log, args: args, env: env, stdout: stdout, stderr: stderr, dir: dir,
		exits: make(chan siblingExit, n),
		due:   make(chan int, n),
		stopC: make(chan struct{}),
		done:  make(chan struct{}),
		procs: prometheus.NewGauge(prometheus.GaugeOpts{Name: "pgsse_procs", Help: "Processes serving the SSE port (--procs): the first one and its live siblings."}),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{Name: "pgsse_proc_restarts_total",
			Help: "Sibling processes (--procs) restarted after they exited."}),
	}
	for i := 1; i < n; i++ {
		sv.slots = append(sv.slots, &siblingSlot{slot: i, metrics: filepath.Join(dir, strconv.Itoa(i)+".sock"), backoff: siblingRestartMin})
	}
	sv.procs.Set(1)
	for _, c := range []prometheus.Collector{sv.procs, sv.restarts} {
		if err := reg.Register(c); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
	return sv, nil
}

// start runs the siblings of srv, which serves listen.
func (sv *supervisor) start(srv *engine.Server, listen string) {
	sv.srv, sv.listen = srv, listen
	go sv.run()
}

// stop drains every sibling (SIGTERM, SIGKILL after siblingStopTimeout), waits for them and
// removes the private directory. Safe to call more than once, and without start.
func (sv *supervisor) stop() {
	sv.once.Do(func() { close(sv.stopC) })
	if sv.srv != nil {
		<-sv.done
	}
	_ = os.RemoveAll(sv.dir)
}

func (sv *supervisor) run() {
	runtime.LockOSThread() // never unlocked: see supervisor
	defer close(sv.done)
	for _, sl := range sv.slots {
		sv.spawn(sl)
	}
	stopping := false
	var kill <-chan time.Time
	for {
		select {
		case e := <-sv.exits:
			sv.exited(e, stopping)
		case slot := <-sv.due:
			if !stopping {
				sv.spawn(sv.slots[slot-1])
			}
		case <-sv.stopC:
			if stopping {
				continue
			}
			stopping = true
			sv.signalAll(syscall.SIGTERM)
			kill = time.After(siblingStopTimeout)
		case <-kill:
			sv.log.Warn("sibling processes did not stop within the drain time; killing them", "timeout", siblingStopTimeout)
			sv.signalAll(syscall.SIGKILL)
		}
		if stopping && sv.running() == 0 {
			return
		}
	}
}

// spawn starts the sibling of one slot; a failure to start is retried like an exit.
func (sv *supervisor) spawn(sl *siblingSlot) {
	cmd, err := sv.command(sl)
	if err == nil {
		err = cmd.Start()
		for _, f := range cmd.ExtraFiles {
			_ = f.Close() // the child has its copy
		}
	}
	if err != nil {
		sv.log.Error("cannot start a sibling process; retrying", "slot", sl.slot, "err", err, "retry_in", sl.backoff)
		sv.retryLater(sl)
		return
	}
	sv.mu.Lock()
	sl.pid, sl.startedAt = cmd.Process.Pid, time.Now()
	sv.mu.Unlock()
	sv.procs.Set(float64(1 + sv.running()))
	sv.log.Info("started a sibling process", "slot", sl.slot, "pid", sl.pid, "listen", sv.listen, "dir", sv.dir)
	go func(pid int) {
		err := cmd.Wait()
		sv.exits <- siblingExit{slot: sl.slot, pid: pid, err: err}
	}(sl.pid)
}

// command prepares the child: the same binary, arguments and environment, the marker, and the
// hub socket as descriptor 3 (its other end enrolled in this process's hub).
func (sv *supervisor) command(sl *siblingSlot) (*exec.Cmd, error) {
	fds, err := siblingSocketpair()
	if err != nil {
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	ours := os.NewFile(uintptr(fds[0]), "pgsse-sibling-hub")
	theirs := os.NewFile(uintptr(fds[1]), "pgsse-sibling-hub")
	conn, err := net.FileConn(ours)
	_ = ours.Close()
	if err == nil {
		err = sv.srv.AddSibling(conn) // closes conn; gnet keeps its own descriptor
	}
	if err != nil {
		_ = theirs.Close()
		return nil, err
	}
	ctlFDs, err := siblingSocketpair()
	if err != nil {
		_ = theirs.Close()
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	ctlTheirs := os.NewFile(uintptr(ctlFDs[1]), "pgsse-sibling-ctl")
	ctlOurs := os.NewFile(uintptr(ctlFDs[0]), "pgsse-sibling-ctl")
	cc, err := net.FileConn(ctlOurs)
	_ = ctlOurs.Close()
	if err != nil {
		_ = theirs.Close()
		_ = ctlTheirs.Close()
		return nil, err
	}
	sv.mu.Lock()
	if sl.ctl != nil {
		_ = sl.ctl.Close()
	}
	sl.ctl = cc.(*net.UnixConn)
	sv.mu.Unlock()
	m := siblingMarker{Slot: sl.slot, Listen: sv.listen, Metrics: sl.metrics, Parent: os.Getpid()}
	files := []*os.File{theirs, ctlTheirs}
	if sl.handoff != nil { // the first start only: a restart serves afresh
		m.Handoff = true
		files = append(files, sl.handoff)
		sl.handoff = nil
	}
	marker, _ := json.Marshal(m)
	cmd := exec.Command(selfExe, append([]string{"serve"}, sv.args...)...)
	if _, err := os.Stat(selfExe); err != nil { // not Linux
		if cmd.Path, err = os.Executable(); err != nil {
			for _, f := range files {
				_ = f.Close()
			}
			return nil, err
		}
	}
	cmd.Args[0] = os.Args[0]
	cmd.Env = append(append([]string(nil), sv.env...), siblingEnv+"="+string(marker))
	cmd.Stdout, cmd.Stderr = sv.stdout, sv.stderr
	cmd.ExtraFiles = files
	cmd.SysProcAttr = siblingProcAttr()
	return cmd, nil
}

// exited handles a sibling's end: counted, logged with its cause, restarted unless stopping.
func (sv *supervisor) exited(e siblingExit, stopping bool) {
	sl := sv.slots[e.slot-1]
	sv.mu.Lock()
	ran := time.Since(sl.startedAt)
	sl.pid = 0
	committed := sl.committed
	if committed {
		sl.committed = false
		close(sl.gone)
	}
	sv.mu.Unlock()
	sv.procs.Set(float64(1 + sv.running()))
	cause := "exit status 0"
	if e.err != nil {
		cause = e.err.Error()
	}
	if committed {
		sv.log.Info("a sibling process handed its connections over to the successor's and exited", "slot", e.slot, "pid", e.pid, "status", cause)
		return
	}
	if stopping {
		sv.log.Debug("sibling process stopped", "slot", e.slot, "pid", e.pid, "status", cause)
		return
	}
	if ran >= siblingStableAfter {
		sl.backoff = siblingRestartMin
	}
	sv.log.Warn("a sibling process exited; its clients reconnect to the other processes and resume from Last-Event-ID; restarting it",
		"slot", e.slot, "pid", e.pid, "status", cause, "ran_for", ran.Round(time.Millisecond), "restart_in", sl.backoff)
	sv.restarts.Inc()
	sv.retryLater(sl)
}

// retryLater schedules the slot's next start after its backoff, and doubles the backoff.
func (sv *supervisor) retryLater(sl *siblingSlot) {
	d := sl.backoff
	sl.backoff = min(2*sl.backoff, siblingRestartMax)
	time.AfterFunc(d, func() {
		if sv.hold != nil {
			select {
			case <-sv.hold:
			case <-sv.stopC:
				return
			}
		}
		select {
		case sv.due <- sl.slot:
		case <-sv.stopC:
		}
	})
}

func (sv *supervisor) signalAll(sig syscall.Signal) {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	for _, sl := range sv.slots {
		if sl.pid > 0 {
			_ = syscall.Kill(sl.pid, sig)
		}
	}
}

// running is the number of siblings running.
func (sv *supervisor) running() int {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	n := 0
	for _, sl := range sv.slots {
		if sl.pid > 0 {
			n++
		}
	}
	return n
}

// live returns the running siblings' slots and metrics sockets.
func (sv *supervisor) live() map[int]string {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	out := make(map[int]string, len(sv.slots))
	for _, sl := range sv.slots {
		if sl.pid > 0 {
			out[sl.slot] = sl.metrics
		}
	}
	return out
}

// --- the sibling's side ------------------------------------------------------------------

// serveSiblingMetrics serves the sibling's registry on its private socket, for the first
// process's /metrics to gather. stop removes the socket — and, once the first process is
// gone, its directory (which the last sibling to leave finds empty).
func serveSiblingMetrics(m *siblingMarker, g prometheus.Gatherer, log *slog.Logger) (stop func(), err error) {
	path := m.Metrics
	_ = os.Remove(path) // a previous run of this slot
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("sibling metrics socket: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	go func() { _ = hs.Serve(ln) }()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
		_ = os.Remove(path)
		if os.Getppid() != m.Parent {
			_ = os.Remove(filepath.Dir(path))
		}
	}, nil
}

// watchParent returns a channel closed once the first process is gone: at once if it
// already is, else on parentDeathSignal (confirmed with getppid, so a stray signal from
// elsewhere changes nothing). stop ends the watch.
func watchParent(parent int, log *slog.Logger) (gone <-chan struct{}, stop func()) {
	c := make(chan struct{})
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, parentDeathSignal)
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if os.Getppid() != parent {
			close(c)
			return
		}
		for {
			select {
			case <-sig:
				if os.Getppid() != parent {
					close(c)
					return
				}
				log.Warn("ignoring a " + parentDeathSignal.String() + ": the first process is alive")
			case <-quit:
				return
			}
		}
	}()
	return c, func() {
		signal.Stop(sig)
		close(quit)
		wg.Wait()
	}
}

// errOrphan is why a sibling drains once orphanGrace has passed.
var errOrphan = errors.New("the first process is gone")
