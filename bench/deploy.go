//go:build linux

package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pgsse/pgsse/internal/testkit/servetest"
)

// Scenario 17, deploy (issue 22, SPEC §6 "Upgrades no client notices"):
//
//	17 deploy  dp.Conns durable subscribers of one stream (held by client processes of at
//	           most dp.ClientConns each — 20,000 descriptors per process — that reconnect as
//	           an EventSource does: after the retry: delay, with Last-Event-ID), receiving
//	           dp.Rate events/s committed by a publisher in this process over SQL, against
//	           `pgsse serve` (--procs dp.Procs) running from a binary installed at a path of
//	           its own. In one run: a steady window (dp.Window) as the baseline; then
//	           (a) SIGTERM, and the same binary started again on the same ports once the
//	           old process has exited; then, once the new one is at steady state (a
//	           deployQuiet window without catch-up reads or lagging subscribers, every
//	           subscriber at the head), (b) the binary installed again at its path
//	           (written beside it, renamed over it) and SIGUSR2: the handoff to a successor
//	           started from it. For each: connections the server closed and reconnects
//	           (counted at the clients), the delivery pause — per subscriber, the longest wait
//	           for an event from the signal on (a wait that began before the signal counts
//	           from the signal) until the next step — p50/p99/max, catch-up reads
//	           (pgsse_replay_reads_total of the process serving afterwards, which counts from
//	           its start) and the events reopened connections caught up, the time from the
//	           signal until the old process exited and until every subscriber had an event
//	           published after it, and the RSS of the new process(es) against the old. At the
//	           end every subscriber must have had every event exactly once and in order.

// DeployParams sizes scenario 17.
type DeployParams struct {
	Conns  int           // durable subscribers in all
	Procs  int           // pgsse --procs (1: none given)
	Rate   float64       // events per second
	Warmup time.Duration // publishing before the steady window
	Window time.Duration // the steady window: the pause without a deploy, for comparison
	Settle time.Duration // after every subscriber has caught up, before the next step
	// HandoffFirst runs (b) before (a): from the steady window, and (a) restarts the successor.
	HandoffFirst bool
	ClientConns  int // at most this many subscribers per client process
}

func fullDeploy() DeployParams {
	return DeployParams{Conns: 15000, Procs: 1, Rate: 100, Warmup: 5 * time.Second, Window: 10 * time.Second,
		Settle: 5 * time.Second, ClientConns: HolderConns}
}

func smallDeploy() DeployParams {
	return DeployParams{Conns: 300, Procs: 1, Rate: 100, Warmup: time.Second, Window: 2 * time.Second,
		Settle: time.Second, ClientConns: HolderConns}
}

// The deploy scenario's windows (Client.MarkWindow) and its labels.
const (
	deploySteady  = 1
	deployRestart = 2
	deployHandoff = 3

	DeployLabelSteady  = "steady (no deploy)"
	DeployLabelRestart = "(a) SIGTERM + restart"
	DeployLabelHandoff = "(b) SIGUSR2 handoff"
	DeployLabelRun     = "whole run"
)

// deployStream is the stream the deploy scenario's subscribers follow; deployMaxSeq bounds
// its events (100/s for ten minutes).
const (
	deployStream      = "deploy"
	deployMaxSeq      = 1 << 16
	deployWaitTimeout = 3 * time.Minute
)

// DeployClientMain is a client process of scenario 17: n reconnecting subscribers of addr
// (path), "held N" once connected; then, on standard input, "mark W NS" starts window W at
// NS (UnixNano) and "wait SEQ" is answered "have SEQ 1" once every subscriber has event SEQ
// ("have SEQ 0" after deployWaitTimeout). When standard input closes it closes its
// connections and prints its DeployClientStats as one line of JSON.
func DeployClientMain(addr netip.AddrPort, path string, n, sources int) error {
	c, err := NewClient(ClientConfig{Addr: addr, Path: path, Sources: sources, MaxSeq: deployMaxSeq, Reconnect: true})
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.Connect(n, false); err != nil {
		return err
	}
	fmt.Printf("held %d\n", c.Conns())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var w int
		var v int64
		switch {
		case fmtScan(in.Text(), "mark %d %d", &w, &v):
			if w > 0 && w < MaxWindows {
				c.MarkWindow(w, v)
			}
		case fmtScan(in.Text(), "wait %d", &v):
			ok := c.WaitHave(v, c.Conns(), deployWaitTimeout)
			fmt.Printf("have %d %d\n", v, int(boolValue(ok)))
		}
	}
	c.Close()
	st := c.Stats()
	return json.NewEncoder(os.Stdout).Encode(DeployClientStats{
		Conns: st.Conns, Events: st.Events, Gaps: st.Gaps, Dups: st.Dups, ConnsWithGaps: st.ConnsWithGaps, Bad: st.Bad,
		Closed: st.ClosedW, Reopened: st.ReopenedW, DialFails: st.DialFailsW, CaughtUp: st.CaughtUpW,
		MaxGaps: st.MaxGaps, Reconnected: st.Reconnected, LastSeqs: st.LastSeqs,
	})
}

func fmtScan(s, format string, args ...any) bool {
	n, err := fmt.Sscanf(s, format, args...)
	return err == nil && n == len(args)
}

// DeployClientStats is what a client process of scenario 17 saw (DeployClientMain).
type DeployClientStats struct {
	Conns                       int
	Events                      int64
	Gaps, Dups                  int64 // sequence numbers skipped, seen again (across reconnects)
	ConnsWithGaps               int
	Bad                         int64
	Closed, Reopened, DialFails [MaxWindows]int64 // per window
	CaughtUp                    [MaxWindows]int64
	MaxGaps                     [MaxWindows][]int64 // per window, per subscriber (ns)
	Reconnected                 int                 // subscribers reopened at least once
	LastSeqs                    []int64             // per subscriber
}

// Mark starts window w at ns in the client process (DeployClientMain).
func (h *Holder) Mark(w int, ns int64) error {
	_, err := fmt.Fprintf(h.stdin, "mark %d %d\n", w, ns)
	return err
}

// FinishDeploy closes a deploy client process's connections and returns what it saw.
func (h *Holder) FinishDeploy() (*DeployClientStats, error) {
	st := &DeployClientStats{}
	if err := h.finish("client process", st); err != nil {
		return nil, err
	}
	return st, nil
}

// orphans are successors started by a handoff: no process of ours is their parent, so nothing
// kills them when this one dies (KillOrphans, from the load command's interrupt).
var orphans sync.Map // pid → struct{}

// KillOrphans kills the successors a deploy scenario left running.
func KillOrphans() {
	orphans.Range(func(k, _ any) bool {
		_ = syscall.Kill(k.(int), syscall.SIGKILL)
		return true
	})
}

// stopSuccessor drains a successor (SIGTERM) and waits until it is gone; after 20 s it is
// killed.
func stopSuccessor(pid int) error {
	defer orphans.Delete(pid)
	_ = syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(20 * time.Second)
	for !servetest.Gone(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			return fmt.Errorf("successor %d did not exit within 20 s of SIGTERM; killed", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// installBinary puts a copy of src at dst as a package manager does: written beside it, then
// renamed over it (a running process keeps the old file).
func installBinary(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	tmp := dst + ".new"
	if err := os.WriteFile(tmp, b, 0o755); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// deployPublisher commits dp.Rate events a second until stopped.
type deployPublisher struct {
	pub  *Publisher
	head atomic.Int64 // the last sequence number committed
	err  error
	stop chan struct{}
	done chan struct{}
}

func startDeployPublisher(ctx context.Context, dsn string, rate float64) (*deployPublisher, error) {
	pub, err := NewPublisher(ctx, dsn, deployStream, 64, deployMaxSeq)
	if err != nil {
		return nil, err
	}
	d := &deployPublisher{pub: pub, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(d.done)
		interval := time.Duration(float64(time.Second) / rate)
		next := time.Now()
		for {
			select {
			case <-d.stop:
				return
			case <-time.After(time.Until(next)):
			}
			next = next.Add(interval)
			if now := time.Now(); next.Before(now.Add(-time.Second)) {
				next = now // a stall of this process: no burst to catch up
			}
			if d.pub.Seq+1 >= deployMaxSeq {
				d.err = errors.New("publisher: deployMaxSeq events published; the run is too long")
				return
			}
			seq, err := d.pub.PublishTx(ctx)
			if err != nil {
				d.err = fmt.Errorf("publisher: %w", err)
				return
			}
			d.head.Store(seq)
		}
	}()
	return d, nil
}

// Stop stops publishing and returns the last sequence number committed.
func (d *deployPublisher) Stop() (int64, error) {
	select {
	case <-d.stop:
	default:
		close(d.stop)
	}
	<-d.done
	d.pub.Close()
	return d.head.Load(), d.err
}

// deployRun is one run of scenario 17 while it goes.
type deployRun struct {
	e       *Env
	dp      DeployParams
	clients []*Holder
	pub     *deployPublisher
}

func (d *deployRun) mark(w int) (int64, error) {
	ns := time.Now().UnixNano()
	for _, h := range d.clients {
		if err := h.Mark(w, ns); err != nil {
			return 0, err
		}
	}
	return ns, nil
}

// caughtUp waits until every subscriber has an event committed now or later.
func (d *deployRun) caughtUp() error {
	seq := d.pub.head.Load() + 1
	// The next event, once committed: the subscribers cannot have it before.
	for d.pub.head.Load() < seq {
		select {
		case <-d.pub.done:
			return d.pub.err
		case <-time.After(time.Millisecond):
		}
	}
	for _, h := range d.clients {
		ok, err := h.Await(seq)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("client process %d: not every subscriber had event %d within %v", h.PID, seq, deployWaitTimeout)
		}
	}
	return nil
}

// waitLogLine waits for a line of srv's output (from its start) that match accepts. srv must
// be a process this one started.
func waitLogLine(ctx context.Context, srv *Server, _ int64, match func(string) bool) (string, error) {
	if srv.proc == nil {
		return "", errors.New("not a process of ours")
	}
	b, err := srv.proc.WaitLine(ctx, func(l []byte) bool { return match(string(l)) })
	return string(b), err
}

// waitGone waits up to d for srv to exit (a process of ours, or a successor: by its pid).
func waitGone(srv *Server, d time.Duration) bool {
	if srv.proc != nil {
		select {
		case <-srv.proc.Exited():
			return true
		case <-time.After(d):
			return false
		}
	}
	deadline := time.Now().Add(d)
	for !servetest.Gone(srv.PID) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// stopServing sends srv SIGTERM and waits (60 s) for it to exit.
func stopServing(srv *Server) error {
	if srv.proc != nil {
		_ = srv.proc.Signal(syscall.SIGTERM)
	} else {
		_ = syscall.Kill(srv.PID, syscall.SIGTERM)
	}
	if !waitGone(srv, 60*time.Second) {
		return errors.New("the server did not exit within 60 s of SIGTERM")
	}
	orphans.Delete(srv.PID)
	return nil
}

// deployQuiet is the window without catch-up reads (pgsse_replay_reads_total unchanged) or
// lagging subscribers (pgsse_lagging_connections 0), every subscriber having had an event
// committed at its start, that (b) waits for: steady state.
const deployQuiet = 2 * time.Second

// steady waits (deployWaitTimeout at most) until srv has served deployQuiet with no catch-up
// read and no lagging subscriber, every subscriber having had the event committed as that
// window began; it returns how long ago the window began, or -1 if it did not come in time.
func (d *deployRun) steady(ctx context.Context, srv *Server) (time.Duration, error) {
	deadline := time.Now().Add(deployWaitTimeout)
	for time.Now().Before(deadline) {
		began := time.Now()
		reads := replayReads(ctx, srv)
		if err := d.caughtUp(); err != nil {
			return -1, err
		}
		if left := deployQuiet - time.Since(began); left > 0 {
			time.Sleep(left)
		}
		if replayReads(ctx, srv) == reads && serverMetric(ctx, srv, "pgsse_lagging_connections") == 0 {
			return time.Since(began), nil
		}
	}
	return -1, nil
}

// Deploy is scenario 17 against t (pgsse); client makes its client processes (each calling
// DeployClientMain). It returns the steady, (a) and (b) results and the whole run's checks.
func Deploy(ctx context.Context, e *Env, t Target, dp DeployParams, p Params, client HolderCommand) ([]*Result, error) {
	db, err := e.Cluster.NewDatabase(ctx)
	if err != nil {
		return nil, err
	}
	defer db.Drop()
	binDir, err := os.MkdirTemp(e.Dir, "deploy-bin.")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(binDir)
	bin := filepath.Join(binDir, "pgsse")
	if err := installBinary(t.Bin, bin); err != nil {
		return nil, err
	}
	ssePort, err := freePort()
	if err != nil {
		return nil, err
	}
	adminPort, err := freePort()
	if err != nil {
		return nil, err
	}
	t.Bin, t.SSEPort, t.AdminPort, t.LogLevel = bin, ssePort, adminPort, "info"
	t.Heartbeat = p.Heartbeat
	t.Pprof = t.Pprof || e.ProfileDir != ""
	if dp.Procs > 1 {
		t.Procs = dp.Procs
	}
	// The kernel's spread over --procs processes is uneven: room for a quarter more, within
	// the 20,000 descriptors a process may have.
	t.MaxConns = min(19000, max(16000, dp.Conns/max(dp.Procs, 1)*5/4))
	label := fmt.Sprintf("pgsse --procs %d", max(dp.Procs, 1))

	srv, err := StartServer(ctx, t, db.URL, e.Dir)
	if err != nil {
		return nil, err
	}
	var servers []*Server // stopped at the end, after the successor (they share its output)
	servers = append(servers, srv)
	successor := 0
	defer func() {
		if successor != 0 {
			_ = stopSuccessor(successor)
		}
		for _, s := range servers {
			s.Stop()
		}
	}()

	d := &deployRun{e: e, dp: dp}
	defer func() {
		for _, h := range d.clients {
			h.Close()
		}
	}()
	t0 := time.Now()
	per := max(dp.ClientConns, 1)
	for left := dp.Conns; left > 0; left -= per {
		h, err := StartHolder(client(srv.SSE, min(left, per), p.Sources), 5*time.Minute)
		if err != nil {
			return nil, err
		}
		d.clients = append(d.clients, h)
	}
	e.logf("%s: %d subscribers in %d client processes connected in %v", label, dp.Conns, len(d.clients), time.Since(t0).Round(time.Millisecond))
	if d.pub, err = startDeployPublisher(ctx, db.URL, dp.Rate); err != nil {
		return nil, err
	}
	defer d.pub.Stop()
	if err := d.caughtUp(); err != nil {
		return nil, fmt.Errorf("before the deploys: %w", err)
	}
	time.Sleep(dp.Warmup)

	steady := &Result{Scenario: "17 deploy", Target: DeployLabelSteady}
	restart := &Result{Scenario: "17 deploy", Target: DeployLabelRestart}
	handoff := &Result{Scenario: "17 deploy", Target: DeployLabelHandoff}
	whole := &Result{Scenario: "17 deploy", Target: DeployLabelRun}
	results := []*Result{steady, restart, handoff, whole}

	// The steps, as far as they go: a step that fails (a server that does not come back, or
	// subscribers that do not catch up in time) ends them, and what was measured until then
	// is reported with the clients' counts.
	// A client's window is the last one marked, so the windows go in the order of the steps.
	wRestart, wHandoff := deployRestart, deployHandoff
	if dp.HandoffFirst {
		wRestart, wHandoff = deployHandoff, deployRestart
	}
	phases := func() error {
		// The steady window: the pauses of a server that nobody deploys.
		replays0, deliv0 := replayReads(ctx, srv), serverMetric(ctx, srv, "pgsse_deliveries_total")
		w0 := time.Now()
		if _, err := d.mark(deploySteady); err != nil {
			return err
		}
		time.Sleep(dp.Window)
		steady.add("catch-up reads (pgsse_replay_reads_total) during the window", "", replayReads(ctx, srv)-replays0, true)
		steady.add("server deliveries ÷ (subscribers × rate) during the window", "×",
			(serverMetric(ctx, srv, "pgsse_deliveries_total")-deliv0)/(float64(dp.Conns)*dp.Rate*time.Since(w0).Seconds()), false)
		rssOld, _ := srv.RSS()
		steady.add("server RSS", "MiB", float64(rssOld)/(1<<20), true)

		cur := srv // the server the next step deploys
		// (a) SIGTERM, and the same binary again on the same ports once the old one has gone.
		stepRestart := func() error {
			e.logf("%s: (a) SIGTERM + restart", label)
			rssOld, _ := cur.RSS()
			signalAt, err := d.mark(wRestart)
			if err != nil {
				return err
			}
			if err := stopServing(cur); err != nil {
				return fmt.Errorf("(a): %w", err)
			}
			if cur.PID == successor {
				successor = 0 // (b) ran first: it was the successor, and it is gone
			}
			exited := time.Since(time.Unix(0, signalAt))
			srv2, err := StartServer(ctx, t, db.URL, e.Dir)
			if err != nil {
				return fmt.Errorf("(a): restart: %w", err)
			}
			servers = append(servers, srv2)
			cur = srv2
			serving := time.Since(time.Unix(0, signalAt))
			if err := d.caughtUp(); err != nil {
				return fmt.Errorf("(a): %w", err)
			}
			recovered := time.Since(time.Unix(0, signalAt))
			restart.add("time from the signal until the old process exited", "ms", ms(exited), true)
			restart.add("time from the signal until the new process serves", "ms", ms(serving), true)
			restart.add("time from the signal until every subscriber has a new event", "ms", ms(recovered), true)
			time.Sleep(dp.Settle)
			restart.add("catch-up reads (pgsse_replay_reads_total of the new process)", "", replayReads(ctx, srv2), true)
			rssNew, _ := srv2.RSS()
			restart.add("server RSS", "MiB", float64(rssNew)/(1<<20), true)
			restart.add("new process's RSS ÷ the old's", "×", float64(rssNew)/float64(max(rssOld, 1)), true)
			// The next step starts from steady state: every subscriber of (a) having had a new
			// event does not mean they are live — a server still catching reconnected
			// subscribers up from the table serves each a little behind the head, and those
			// subscribers would be handed over with cursors its successor has no memory of
			// (issue 22, task deployscale).
			if dp.HandoffFirst {
				return nil // nothing follows
			}
			quiet, err := d.steady(ctx, srv2)
			if err != nil {
				return fmt.Errorf("(a): %w", err)
			}
			if quiet < 0 {
				restart.note("no %v without catch-up reads within %v of the signal: the next step starts from a server still catching subscribers up", deployQuiet, deployWaitTimeout)
			} else {
				restart.add("time from the signal until a "+deployQuiet.String()+" window without catch-up reads or lagging subscribers", "ms", ms(time.Since(time.Unix(0, signalAt))-quiet), true)
			}
			return nil
		}

		// (b) SIGUSR2: the handoff to the binary at the same path.
		stepHandoff := func() error {
			// The next binary, installed now: copying it stalls this process (the publisher)
			// for a moment, which must not fall into (b)'s window.
			if err := installBinary(t.Bin, bin); err != nil {
				return err
			}
			time.Sleep(dp.Settle)
			pred := cur
			e.logf("%s: (b) SIGUSR2", label)
			waitProfile := func() {}
			if e.ProfileDir != "" {
				waitSucc := profileSuccessor(ctx, e, pred, label)
				// The predecessor's side of the move: 4 s from the signal (it serves the admin
				// endpoint alone until then; a profile in progress keeps it up to 5 s longer).
				waitPred := (&run{e: e, t: Target{Name: "pgsse", Label: scenarioFile(label) + "-predecessor"}, srv: pred}).profile(ctx, "17-deploy", 4*time.Second)
				waitProfile = func() { waitSucc(); waitPred() }
			}
			rssPred, _ := pred.RSS()
			signalAt, err := d.mark(wHandoff)
			if err != nil {
				return err
			}
			_ = syscall.Kill(pred.PID, syscall.SIGUSR2)
			lctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			line, err := waitLogLine(lctx, pred, signalAt, func(l string) bool {
				return strings.Contains(l, "handed everything over to the successor") || strings.Contains(l, "handoff failed")
			})
			cancel()
			if err != nil {
				return fmt.Errorf("(b): no word of the handoff: %w\n%s", err, tail(pred.LogPath, 20))
			}
			// A text log line: key=value pairs (slog's TextHandler).
			var m struct {
				Successor, Connections int
				Took                   string
			}
			for _, kv := range logfmtRE.FindAllStringSubmatch(line, -1) {
				switch kv[1] {
				case "successor":
					m.Successor, _ = strconv.Atoi(kv[2])
				case "connections":
					m.Connections, _ = strconv.Atoi(kv[2])
				case "took":
					m.Took = strings.Trim(kv[2], `"`)
				}
			}
			if m.Successor == 0 {
				return fmt.Errorf("(b): %s", line)
			}
			successor = m.Successor
			orphans.Store(successor, struct{}{})
			if !waitGone(pred, 60*time.Second) {
				return errors.New("(b): the predecessor did not exit within 60 s of SIGUSR2")
			}
			exited := time.Since(time.Unix(0, signalAt))
			took, _ := time.ParseDuration(m.Took)
			handoff.add("time from the signal until the old process exited", "ms", ms(exited), true)
			handoff.add("time from the signal until the handover was done (its log line)", "ms", ms(took), true)
			handoff.add("connections handed over (its log line)", "", float64(m.Connections), false)
			// (A binary from before that line has none: the wait is short.)
			pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
			ph, err := waitLogLine(pctx, pred, signalAt, func(l string) bool { return strings.Contains(l, "handoff: connections moved") })
			pcancel()
			if err == nil {
				for _, kv := range logfmtRE.FindAllStringSubmatch(ph, -1) {
					if d, err := time.ParseDuration(strings.Trim(kv[2], `"`)); err == nil {
						handoff.add("the move's "+kv[1]+" (its log line: handoff: connections moved)", "ms", ms(d), true)
					}
				}
			}
			if err := d.caughtUp(); err != nil {
				return fmt.Errorf("(b): %w", err)
			}
			recovered := time.Since(time.Unix(0, signalAt))
			handoff.add("time from the signal until every subscriber has a new event", "ms", ms(recovered), true)
			time.Sleep(dp.Settle)
			succ := &Server{Name: t.Name, PID: successor, SSE: pred.SSE, Admin: pred.Admin, LogPath: pred.LogPath}
			cur = succ
			waitProfile()
			handoff.add("catch-up reads (pgsse_replay_reads_total of the new process)", "", replayReads(ctx, succ), true)
			rssSucc, _ := succ.RSS()
			handoff.add("server RSS", "MiB", float64(rssSucc)/(1<<20), true)
			handoff.add("new process's RSS ÷ the old's", "×", float64(rssSucc)/float64(max(rssPred, 1)), true)
			if exe, err := os.Readlink("/proc/" + strconv.Itoa(successor) + "/exe"); err != nil || exe != bin {
				handoff.note("the successor runs %q, not the installed %s (%v)", exe, bin, err)
			}
			return nil
		}
		steps := []func() error{stepRestart, stepHandoff}
		if dp.HandoffFirst {
			steps = []func() error{stepHandoff, stepRestart}
			handoff.note("(b) ran first, from the steady window; (a) then restarted the successor")
		}
		for _, step := range steps {
			if err := step(); err != nil {
				return err
			}
		}
		return nil
	}
	phaseErr := phases()
	if phaseErr != nil {
		e.logf("%s: %v; collecting what the clients saw", label, phaseErr)
	}

	// The end: every event to every subscriber, once, in order.
	last, err := d.pub.Stop()
	if err != nil {
		phaseErr = errors.Join(phaseErr, err)
	}
	for _, h := range d.clients {
		if phaseErr != nil {
			break // the clients are counted as they are
		}
		if ok, err := h.Await(last); err != nil || !ok {
			whole.note("client process %d: not every subscriber had the last event %d (%v)", h.PID, last, err)
		}
	}
	var sts []*DeployClientStats
	for _, h := range d.clients {
		st, err := h.FinishDeploy()
		if err != nil {
			return results, errors.Join(phaseErr, err)
		}
		sts = append(sts, st)
	}
	d.clients = nil
	var total DeployClientStats
	var gaps [MaxWindows][]int64
	notAtEnd := 0
	for _, st := range sts {
		total.Conns += st.Conns
		total.Events += st.Events
		total.Gaps += st.Gaps
		total.Dups += st.Dups
		total.ConnsWithGaps += st.ConnsWithGaps
		total.Bad += st.Bad
		total.Reconnected += st.Reconnected
		for w := range MaxWindows {
			total.Closed[w] += st.Closed[w]
			total.Reopened[w] += st.Reopened[w]
			total.DialFails[w] += st.DialFails[w]
			total.CaughtUp[w] += st.CaughtUp[w]
			gaps[w] = append(gaps[w], st.MaxGaps[w]...)
		}
		for _, s := range st.LastSeqs {
			if s != last {
				notAtEnd++
			}
		}
	}
	for _, x := range []struct {
		r *Result
		w int
	}{{steady, deploySteady}, {restart, wRestart}, {handoff, wHandoff}} {
		r, w := x.r, x.w
		r.add("subscribers", "", float64(total.Conns), false)
		r.add("connections closed by the server (counted at the clients)", "", float64(total.Closed[w]), true)
		r.add("reconnects (connections reopened)", "", float64(total.Reopened[w]), true)
		r.add("failed reconnect attempts (tried again)", "", float64(total.DialFails[w]), true)
		q := Quantiles(nsDurations(gaps[w]), 0.5, 0.99, 1)
		r.add("delivery pause p50 (longest wait per subscriber)", "ms", ms(q[0]), true)
		r.add("delivery pause p99", "ms", ms(q[1]), true)
		r.add("delivery pause max", "ms", ms(q[2]), true)
		r.add("events caught up by reopened connections", "", float64(total.CaughtUp[w]), true)
	}
	whole.add("subscribers", "", float64(total.Conns), false)
	whole.add("events published", "", float64(last), false)
	whole.add("deliveries", "", float64(total.Events), false)
	whole.add("deliveries missing (subscribers × events − deliveries)", "", float64(int64(total.Conns)*last-total.Events), true)
	whole.add("sequence numbers skipped (gaps)", "", float64(total.Gaps), true)
	whole.add("sequence numbers repeated or out of order", "", float64(total.Dups), true)
	whole.add("subscribers not at the last event", "", float64(notAtEnd), true)
	whole.add("subscribers reconnected at least once", "", float64(total.Reconnected), false)
	whole.add("unparsable events", "", float64(total.Bad), true)
	whole.note("load average (1 min) at the end %s", LoadAvg())
	if phaseErr != nil {
		return results, phaseErr
	}
	if total.Gaps+total.Dups > 0 || notAtEnd > 0 || int64(total.Conns)*last != total.Events || total.Bad > 0 {
		return results, fmt.Errorf("not every subscriber had every event exactly once and in order: %d skipped, %d repeated, %d not at the last event %d, %d deliveries of %d",
			total.Gaps, total.Dups, notAtEnd, last, total.Events, int64(total.Conns)*last)
	}
	return results, nil
}

var logfmtRE = regexp.MustCompile(`(\w+)=("[^"]*"|\S+)`)

// replayReads is the server's pgsse_replay_reads_total (-1 if unreadable).
func replayReads(ctx context.Context, s *Server) float64 {
	return serverMetric(ctx, s, "pgsse_replay_reads_total")
}

// serverMetric is one of the server's metrics (-1 if unreadable).
func serverMetric(ctx context.Context, s *Server, name string) float64 {
	m, err := s.Metrics(ctx)
	if err != nil {
		return -1
	}
	v, err := m.Lookup(name)
	if err != nil {
		return -1
	}
	return v
}

// profileSuccessor captures a CPU profile of the successor across the handoff (5 s from as
// soon as it answers): the admin endpoint is one socket that both processes accept on until
// the predecessor lets go, so each attempt asks /metrics first and keeps the connection
// (keep-alive) for the profile only if process_start_time_seconds is not the predecessor's.
func profileSuccessor(ctx context.Context, e *Env, pred *Server, label string) (wait func()) {
	done := make(chan struct{})
	path := filepath.Join(e.ProfileDir, scenarioFile(label)+"-17-deploy-successor.pprof")
	tr := &http.Transport{MaxIdleConnsPerHost: 1, MaxConnsPerHost: 1}
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	get := func(path string) ([]byte, error) {
		resp, err := hc.Get("http://" + pred.Admin + path)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("GET %s: %s", path, resp.Status)
		}
		return b, err
	}
	startTime := func() string {
		b, err := get("/metrics")
		if err != nil {
			return ""
		}
		for ln := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(ln, "process_start_time_seconds "); ok {
				return strings.TrimSpace(v)
			}
		}
		return ""
	}
	predStart := startTime()
	tr.CloseIdleConnections()
	go func() {
		defer close(done)
		defer tr.CloseIdleConnections()
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			if st := startTime(); st != "" && st != predStart {
				b, err := get("/debug/pprof/profile?seconds=5")
				if err != nil {
					e.logf("profile of the successor: %v", err)
					return
				}
				if err := os.WriteFile(path, b, 0o644); err != nil {
					e.logf("profile: %v", err)
					return
				}
				e.logf("the successor's CPU profile (5 s from its first answer) in %s", path)
				return
			}
			tr.CloseIdleConnections()
			time.Sleep(20 * time.Millisecond) // each /metrics costs the predecessor too
		}
		e.logf("profile of the successor: it never answered on the admin endpoint")
	}()
	return func() { <-done }
}

func nsDurations(v []int64) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x)
	}
	return out
}
