//go:build linux

package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Scenario 10, every core of a host (issue 14): `pgsse serve --procs N`.
//
//	10 procs idle     p.ProcsConns idle connections through one port with --procs 2, held by
//	                 several load processes (p.HolderConns each: one process may hold at
//	                 most 20,000 descriptors) → RSS per connection over the whole process tree,
//	                 how the kernel spread them, CPU while idle.
//	10 procs fan-out  scenario 3 (p.Conns subscribers, one event at a time) against --procs 1
//	                 and --procs 2 in the same run → time to last p50/p99, server CPU per
//	                 delivery (the tree's), and the client's CPU share beside each: the load
//	                 generator shares the cores the server processes would have.
//
// Server CPU and RSS are always the process tree's (Server.CPU, Server.RSS): the first process
// and its siblings.

// HolderConns is the most connections one holder process opens by default (its own
// descriptor limit is 20,000 on the machines we run on).
const HolderConns = 15000

// Holder is a load-generator process holding idle subscribers: the load command run with
// --hold (HoldMain), so that one benchmark can hold more connections than one process may.
type Holder struct {
	PID   int
	Conns int

	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

// HolderCommand makes the command of one holder process for n connections to addr: a
// program that calls HoldMain (the load command with --hold, the bench test binary with
// PGSSE_BENCH_HOLD).
type HolderCommand func(addr netip.AddrPort, n, sources int) *exec.Cmd

// StartHolder runs cmd — which must call HoldMain — and waits until it holds its connections
// (it prints "held N").
func StartHolder(cmd *exec.Cmd, timeout time.Duration) (*Holder, error) {
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	h := &Holder{PID: cmd.Process.Pid, cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	line := make(chan string, 1)
	go func() {
		l, _ := h.out.ReadString('\n')
		line <- l
	}()
	select {
	case l := <-line:
		n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(l, "held ")))
		if err != nil {
			h.Close()
			return nil, fmt.Errorf("holder: %q", l)
		}
		h.Conns = n
		return h, nil
	case <-time.After(timeout):
		h.Close()
		return nil, fmt.Errorf("holder did not connect within %v", timeout)
	}
}

// CPU is the holder's CPU time so far.
func (h *Holder) CPU() time.Duration {
	c, _ := procCPU(h.PID)
	return c
}

// Close tells the holder to close its connections and waits for it.
func (h *Holder) Close() {
	_ = h.stdin.Close()
	done := make(chan struct{})
	go func() { _ = h.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = h.cmd.Process.Kill()
		<-done
	}
}

// HoldMain is a holder process's work: open n idle subscribers of addr (path), print
// "held N", and hold them until standard input closes. Meanwhile, each line "wait SEQ" on
// standard input is answered "have SEQ 1" once every connection has event SEQ (sequence
// numbers 1 … holdMaxSeq, as Publisher numbers them), "have SEQ 0" after holdWaitTimeout. At
// the end it closes its connections and prints one line of JSON, its HoldStats.
func HoldMain(addr netip.AddrPort, path string, n, sources int) error {
	c, err := NewClient(ClientConfig{Addr: addr, Path: path, Sources: sources, MaxSeq: holdMaxSeq})
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
		var seq int64
		if _, err := fmt.Sscanf(in.Text(), "wait %d", &seq); err == nil {
			ok := c.WaitHave(seq, c.Conns(), holdWaitTimeout)
			fmt.Printf("have %d %d\n", seq, int(boolValue(ok)))
		}
	}
	c.Close()
	st := c.Stats()
	return json.NewEncoder(os.Stdout).Encode(HoldStats{
		Conns: st.Conns, Events: st.Events, Gaps: st.Gaps, Dups: st.Dups, ConnsWithGaps: st.ConnsWithGaps,
		Closed: st.Closed, Bad: st.Bad, Last: st.Last,
	})
}

// A holder's events: sequence numbers up to holdMaxSeq, each awaited at most holdWaitTimeout.
const (
	holdMaxSeq      = 64
	holdWaitTimeout = 30 * time.Second
)

// HoldStats is what a holder process saw, printed when it ends (HoldMain).
type HoldStats struct {
	Conns         int
	Events        int64 // deliveries received
	Gaps, Dups    int64 // sequence numbers skipped, seen again
	ConnsWithGaps int
	Closed        int64   // connections the server closed
	Bad           int64   // unparsable events or lines
	Last          []int64 // per seq: the latest receive time (UnixNano) over its connections
}

// Await asks the holder to report once every one of its connections has event seq; it
// reports whether they all had it within holdWaitTimeout.
func (h *Holder) Await(seq int64) (bool, error) {
	if _, err := fmt.Fprintf(h.stdin, "wait %d\n", seq); err != nil {
		return false, err
	}
	line, err := h.out.ReadString('\n')
	if err != nil {
		return false, fmt.Errorf("holder %d: %w", h.PID, err)
	}
	var got int64
	var ok int
	if _, err := fmt.Sscanf(line, "have %d %d", &got, &ok); err != nil || got != seq {
		return false, fmt.Errorf("holder %d: %q to wait %d", h.PID, strings.TrimSpace(line), seq)
	}
	return ok == 1, nil
}

// Finish closes the holder's connections and returns what it saw.
func (h *Holder) Finish() (*HoldStats, error) {
	st := &HoldStats{}
	if err := h.finish("holder", st); err != nil {
		return nil, err
	}
	return st, nil
}

// finish closes the process's stdin (it then closes its connections), reads the one JSON
// line of what it saw into st, and closes the holder; what names the process in errors.
func (h *Holder) finish(what string, st any) error {
	_ = h.stdin.Close()
	line, err := h.out.ReadString('\n')
	h.Close()
	if err != nil {
		return fmt.Errorf("%s %d: no stats: %w", what, h.PID, err)
	}
	if err := json.Unmarshal([]byte(line), st); err != nil {
		return fmt.Errorf("%s %d: %w", what, h.PID, err)
	}
	return nil
}

// ProcsIdle is scenario 10's first part: p.ProcsConns idle connections to `pgsse serve
// --procs 2`, opened by holder processes (at most p.HolderConns each) that holder makes.
func ProcsIdle(ctx context.Context, e *Env, t Target, p Params, holder HolderCommand) (*Result, error) {
	t.Procs, t.Label = 2, t.Name+" --procs 2"
	r, err := e.start(ctx, t, p)
	if err != nil {
		return nil, err
	}
	defer r.stop()
	time.Sleep(500 * time.Millisecond)
	pids := r.srv.Tree()
	if len(pids) != 2 {
		return nil, fmt.Errorf("%s --procs 2: %d processes (%v)", t.Name, len(pids), pids)
	}
	rss0, err := r.srv.RSS()
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	var holders []*Holder
	defer func() {
		for _, h := range holders {
			h.Close()
		}
	}()
	per := p.HolderConns
	if per <= 0 {
		per = HolderConns
	}
	for left := p.ProcsConns; left > 0; left -= per {
		h, err := StartHolder(holder(r.srv.SSE, min(left, per), p.Sources), 5*time.Minute)
		if err != nil {
			return nil, err
		}
		holders = append(holders, h)
		e.logf("%s --procs 2: a holder (pid %d) holds %d connections", t.Name, h.PID, h.Conns)
	}
	connectTime := time.Since(t0)
	held := 0
	for _, h := range holders {
		held += h.Conns
	}
	time.Sleep(time.Second)
	cpu0, _ := r.srv.CPU()
	var hc0 time.Duration
	for _, h := range holders {
		hc0 += h.CPU()
	}
	w0 := time.Now()
	time.Sleep(p.IdleWindow)
	cpu1, _ := r.srv.CPU()
	var hc1 time.Duration
	for _, h := range holders {
		hc1 += h.CPU()
	}
	window := time.Since(w0)
	rss1, err := r.srv.RSS()
	if err != nil {
		return nil, err
	}
	if err := r.alive(); err != nil {
		return nil, err
	}
	res := &Result{Scenario: "10 procs idle", Target: t.label()}
	res.add("connections through one port", "", float64(held), false)
	res.add("load processes holding them", "", float64(len(holders)), false)
	if m, err := r.srv.Metrics(ctx); err == nil {
		for _, se := range m.Series("pgsse_process_sse_connections") {
			res.add("connections on process "+se.Labels["process"], "", se.Value, false)
		}
		if v, err := m.Lookup("pgsse_sse_connections"); err == nil {
			res.add("connections in the summed metric", "", v, false)
		} else {
			res.note("%v", err)
		}
	} else {
		res.note("server metrics: %v", err)
	}
	res.add("RSS per idle connection (both processes)", "B", float64(rss1-rss0)/float64(held), true)
	res.add("RSS total (both processes)", "MiB", float64(rss1)/(1<<20), true)
	res.add("connect rate", "conn/s", float64(held)/connectTime.Seconds(), false)
	res.add("server CPU while idle (both processes)", "ms/s", ms(cpu1-cpu0)/window.Seconds(), true)
	res.add("load processes' CPU while idle", "ms/s", ms(hc1-hc0)/window.Seconds(), true)
	return res, nil
}

// ProcsFanOut is scenario 10's second part: scenario 3 against t with --procs 1 and with
// --procs 2, one after the other in the same run.
func ProcsFanOut(ctx context.Context, e *Env, t Target, p Params) ([]*Result, error) {
	var out []*Result
	for _, n := range []int{1, 2} {
		tn := t
		tn.Procs, tn.Label = n, t.Name+" --procs "+strconv.Itoa(n)
		r, err := FanOut(ctx, e, tn, p, 0)
		if err != nil {
			return out, err
		}
		r.Scenario = "10 procs fan-out"
		out = append(out, r)
	}
	return out, nil
}

// waitProcs waits until the first process's /metrics shows n serving processes (a sibling
// appears there once it serves).
func (s *Server) waitProcs(ctx context.Context, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if m, err := s.Metrics(ctx); err == nil && len(m.Series("pgsse_process_sse_connections")) == n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not %d processes serving after %v", n, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Tree is the server's process and its children (--procs siblings), as /proc lists them.
func (s *Server) Tree() []int {
	pids := []int{s.PID}
	tasks, _ := os.ReadDir("/proc/" + strconv.Itoa(s.PID) + "/task")
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(s.PID) + "/task/" + task.Name() + "/children")
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// TreeCPU is the CPU time so far of each process of the server's tree.
func (s *Server) TreeCPU() map[int]time.Duration {
	m := map[int]time.Duration{}
	for _, pid := range s.Tree() {
		if c, err := procCPU(pid); err == nil {
			m[pid] = c
		}
	}
	return m
}

// busiest is the largest CPU time one process spent between two TreeCPU readings: with the
// work spread over processes on cores of their own, the wall time it takes.
func busiest(before, after map[int]time.Duration) time.Duration {
	var top time.Duration
	for pid, c := range after {
		top = max(top, c-before[pid])
	}
	return top
}
