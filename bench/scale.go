//go:build linux

package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Scenarios 14 and 15, connections at scale (issue 25):
//
//	14 floor   p.Conns idle connections on a fresh server each: pgsse following one stream,
//	           pgsse following p.MultiStreams streams (GET /streams?stream=…), and the floor —
//	           bench/gnetrelay, gnet's own connection and nothing else — in the same run → RSS
//	           per idle connection (RSS p.IdleWindow after they connected − RSS before) and
//	           its ratio to the floor's.
//	15 scale   p.ScaleConns SSE connections to `pgsse serve --procs p.ScaleProcs`, opened by
//	           holder processes (at most p.HolderConns each: 20,000 descriptors per process)
//	           from p.Sources loopback source addresses, held p.ScaleHold → connect rate,
//	           pgsse's RSS per connection (the process tree's) and the kernel's socket memory
//	           per connection (/proc/meminfo Slab and /proc/net/sockstat TCP mem deltas: both
//	           ends of each loopback connection are this host's), CPU of every pgsse process
//	           while idle, every connection alive at the end; then p.ScaleEvents durable
//	           events one at a time, each to every connection → time to last p50/p99 and
//	           every subscriber gap-free. The same run does it again with p.Conns connections
//	           on one process, for the per-connection ratio.

// GnetRelay names the floor's target (bench/gnetrelay).
const GnetRelay = "gnetrelay"

// Floor is scenario 14: pgsse (one stream, then p.MultiStreams) and relay (the gnetrelay
// target), p.Conns idle connections each, one server after the other.
func Floor(ctx context.Context, e *Env, pgsse, relay Target, p Params) ([]*Result, error) {
	k := max(p.MultiStreams, 2)
	sides := []struct {
		t     Target
		label string
		cfg   ClientConfig
	}{
		{relay, "floor (gnetrelay)", ClientConfig{Path: "/streams/idle"}},
		{pgsse, "pgsse, 1 stream", ClientConfig{Path: "/streams/idle"}},
		{pgsse, "pgsse, " + strconv.Itoa(k) + " streams", ClientConfig{Paths: multiPaths(k)}},
	}
	var out []*Result
	var floor float64
	for i, side := range sides {
		rss, conns, err := idleRSS(ctx, e, side.t, p, side.cfg, p.Conns, p.IdleWindow)
		if err != nil {
			return out, fmt.Errorf("%s: %w", side.label, err)
		}
		res := &Result{Scenario: "14 floor", Target: side.label}
		res.add("connections", "", float64(conns), false)
		res.add("RSS per idle connection", "B", rss, true)
		if i == 0 {
			floor = rss
		}
		res.add("÷ the floor's", "×", rss/floor, true)
		e.logf("scenario 14: %s: %.0f B per idle connection (%.2f× the floor)", side.label, rss, rss/floor)
		out = append(out, res)
	}
	return out, nil
}

// idleRSS opens n idle connections of cfg to a fresh t and returns (RSS settle after they
// connected − RSS before) ÷ connections.
func idleRSS(ctx context.Context, e *Env, t Target, p Params, cfg ClientConfig, n int, settle time.Duration) (float64, int, error) {
	r, err := e.start(ctx, t, p)
	if err != nil {
		return 0, 0, err
	}
	defer r.stop()
	time.Sleep(500 * time.Millisecond)
	rss0, err := r.srv.RSS()
	if err != nil {
		return 0, 0, err
	}
	cfg.Addr, cfg.Sources, cfg.Readers, cfg.MaxSeq = r.srv.SSE, p.Sources, p.Readers, 16
	c, err := NewClient(cfg)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	if err := c.Connect(n, false); err != nil {
		return 0, 0, fmt.Errorf("connect %d idle subscribers: %w", n, err)
	}
	time.Sleep(settle)
	rss1, err := r.srv.RSS()
	if err != nil {
		return 0, 0, err
	}
	if err := r.alive(); err != nil {
		return 0, 0, err
	}
	conns := c.Conns()
	return float64(rss1-rss0) / float64(conns), conns, nil
}

// ScaleParams sizes scenario 15.
type ScaleParams struct {
	Conns  int           // connections held (100,000)
	Procs  int           // pgsse --procs
	Hold   time.Duration // held this long, idle, before the events
	Events int           // durable events to every connection, one at a time
	// OneConns: the same run's single-process comparison (0 = none).
	OneConns int
}

// Scale is scenario 15: sp.Conns connections to --procs sp.Procs, then sp.OneConns to one
// process, each as the comment above says. holder makes the holder processes.
func Scale(ctx context.Context, e *Env, t Target, p Params, sp ScaleParams, holder HolderCommand) ([]*Result, error) {
	var out []*Result
	runs := []struct{ conns, procs int }{{sp.Conns, sp.Procs}}
	if sp.OneConns > 0 {
		runs = append(runs, struct{ conns, procs int }{sp.OneConns, 1})
	}
	for _, rn := range runs {
		res, err := scaleRun(ctx, e, t, p, sp, rn.conns, rn.procs, holder)
		if res != nil {
			out = append(out, res)
		}
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

func scaleRun(ctx context.Context, e *Env, t Target, p Params, sp ScaleParams, conns, procs int, holder HolderCommand) (*Result, error) {
	t.Procs, t.Label = procs, t.Name+" --procs "+strconv.Itoa(procs)
	if procs <= 1 {
		t.Procs = 0
	}
	label := t.Label + ", " + strconv.Itoa(conns) + " connections"
	res := &Result{Scenario: "15 scale", Target: label}
	res.note("load average at the start: %s", LoadAvg())
	r, err := e.start(ctx, t, p)
	if err != nil {
		return nil, err
	}
	defer r.stop()
	time.Sleep(time.Second)
	rss0, err := r.srv.RSS()
	if err != nil {
		return nil, err
	}
	k0, err := readKernelMem()
	if err != nil {
		return nil, err
	}
	per := p.HolderConns
	if per <= 0 {
		per = HolderConns
	}
	nh := (conns + per - 1) / per
	holders := make([]*Holder, nh)
	defer func() {
		for _, h := range holders {
			if h != nil {
				h.Close()
			}
		}
	}()
	t0 := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, nh)
	for i := range nh {
		n := conns / nh
		if i < conns%nh {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			holders[i], errs[i] = StartHolder(holder(r.srv.SSE, n, p.Sources), 5*time.Minute)
		}()
	}
	wg.Wait()
	connectTime := time.Since(t0)
	held := 0
	for i, h := range holders {
		if errs[i] != nil {
			return nil, fmt.Errorf("holder %d: %w", i, errs[i])
		}
		held += h.Conns
	}
	e.logf("%s: %d connections held by %d processes, connected in %v", label, held, nh, connectTime.Round(time.Millisecond))
	time.Sleep(time.Second)
	cpu0, _ := r.srv.CPU()
	tree0 := r.srv.TreeCPU()
	var hc0 time.Duration
	for _, h := range holders {
		hc0 += h.CPU()
	}
	w0 := time.Now()
	waitProfile := r.profile(ctx, "15-scale-idle-"+strconv.Itoa(conns), min(sp.Hold, 30*time.Second))
	time.Sleep(sp.Hold)
	waitProfile()
	window := time.Since(w0)
	cpu1, _ := r.srv.CPU()
	tree1 := r.srv.TreeCPU()
	var hc1 time.Duration
	for _, h := range holders {
		hc1 += h.CPU()
	}
	rss1, err := r.srv.RSS()
	if err != nil {
		return nil, err
	}
	k1, err := readKernelMem()
	if err != nil {
		return nil, err
	}
	if err := r.alive(); err != nil {
		return nil, err
	}
	open := -1.0
	if m, err := r.srv.Metrics(ctx); err == nil {
		if v, err := m.Lookup("pgsse_sse_connections"); err == nil {
			open = v
		}
	}

	// The events, one at a time, each awaited by every holder.
	pub, err := NewPublisher(ctx, r.db.URL, "idle", p.FanoutData, holdMaxSeq)
	if err != nil {
		return nil, err
	}
	defer pub.Close()
	timeouts := 0
	n := min(sp.Events, holdMaxSeq-1)
	ecpu0, _ := r.srv.CPU()
	for range n {
		seq, err := pub.PublishTx(ctx)
		if err != nil {
			return nil, err
		}
		oks := make([]bool, nh)
		for i, h := range holders {
			wg.Add(1)
			go func() { defer wg.Done(); oks[i], errs[i] = h.Await(seq) }()
		}
		wg.Wait()
		for i := range holders {
			if errs[i] != nil {
				return nil, errs[i]
			}
			if !oks[i] {
				timeouts++
			}
		}
		time.Sleep(p.FanoutGap)
	}
	ecpu1, _ := r.srv.CPU()
	var total HoldStats
	last := make([]int64, holdMaxSeq+1)
	for i, h := range holders {
		st, err := h.Finish()
		holders[i] = nil
		if err != nil {
			return nil, err
		}
		total.Conns += st.Conns
		total.Events += st.Events
		total.Gaps += st.Gaps
		total.Dups += st.Dups
		total.ConnsWithGaps += st.ConnsWithGaps
		total.Closed += st.Closed
		total.Bad += st.Bad
		for seq, v := range st.Last {
			if seq < len(last) {
				last[seq] = max(last[seq], v)
			}
		}
	}
	var ttl []time.Duration
	for seq := 1; seq <= n; seq++ {
		if last[seq] != 0 && pub.Ref[seq] != 0 {
			ttl = append(ttl, time.Duration(last[seq]-pub.Ref[seq]))
		}
	}
	q := Quantiles(ttl, 0.5, 0.99, 1)

	res.add("connections held", "", float64(held), false)
	res.add("pgsse processes", "", float64(len(tree1)), false)
	res.add("load processes holding them", "", float64(nh), false)
	res.add("connections open on the server at the end of the hold (pgsse_sse_connections)", "", open, false)
	res.add("connections the server closed", "", float64(total.Closed), true)
	res.add("connect rate", "conn/s", float64(held)/connectTime.Seconds(), false)
	res.add("pgsse RSS per connection (every process)", "B", float64(rss1-rss0)/float64(held), true)
	res.add("pgsse RSS total", "MiB", float64(rss1)/(1<<20), true)
	res.add("kernel Slab per connection (both ends)", "B", float64(k1.slab-k0.slab)/float64(held), true)
	res.add("kernel TCP buffer memory per connection (sockstat mem, both ends)", "B", float64(k1.tcpMem-k0.tcpMem)/float64(held), true)
	res.add("TCP sockets in use, delta", "", float64(k1.tcpInuse-k0.tcpInuse), false)
	res.add("pgsse CPU while idle (every process)", "ms/s", ms(cpu1-cpu0)/window.Seconds(), true)
	res.add("pgsse CPU while idle, busiest process", "ms/s", ms(busiest(tree0, tree1))/window.Seconds(), true)
	res.add("pgsse CPU while idle per 1,000 connections", "µs/s", float64(cpu1-cpu0)/1e3/window.Seconds()/float64(held)*1000, true)
	res.add("load processes' CPU while idle", "ms/s", ms(hc1-hc0)/window.Seconds(), true)
	res.add("held for", "s", window.Seconds(), false)
	res.add("events", "", float64(n), false)
	res.add("time to last subscriber p50", "ms", ms(q[0]), true)
	res.add("time to last subscriber p99", "ms", ms(q[1]), true)
	res.add("time to last subscriber max", "ms", ms(q[2]), true)
	res.add("pgsse CPU per delivery", "µs", float64(ecpu1-ecpu0)/1e3/float64(max(total.Events, 1)), true)
	res.add("deliveries missing", "", float64(int64(n)*int64(held)-total.Events), true)
	res.add("sequence numbers skipped (gaps)", "", float64(total.Gaps), true)
	res.add("connections with a gap", "", float64(total.ConnsWithGaps), true)
	if timeouts > 0 {
		res.note("%d holder answers: not every connection had the event within %v", timeouts, holdWaitTimeout)
	}
	if total.Dups+total.Bad > 0 {
		res.note("%d repeated sequence numbers, %d unparsable events", total.Dups, total.Bad)
	}
	res.note("load average at the end: %s", LoadAvg())
	return res, nil
}

// kernelMem is the host's socket memory of the moment.
type kernelMem struct {
	slab     int64 // /proc/meminfo Slab, bytes
	tcpMem   int64 // /proc/net/sockstat TCP mem, bytes (pages × page size)
	tcpInuse int64
}

func readKernelMem() (kernelMem, error) {
	var k kernelMem
	mi, err := os.Open("/proc/meminfo")
	if err != nil {
		return k, err
	}
	defer mi.Close()
	s := bufio.NewScanner(mi)
	for s.Scan() {
		if f := strings.Fields(s.Text()); len(f) >= 2 && f[0] == "Slab:" {
			v, _ := strconv.ParseInt(f[1], 10, 64)
			k.slab = v << 10
		}
	}
	ss, err := os.ReadFile("/proc/net/sockstat")
	if err != nil {
		return k, err
	}
	for _, line := range strings.Split(string(ss), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "TCP:" {
			continue
		}
		for i := 1; i+1 < len(f); i += 2 {
			v, _ := strconv.ParseInt(f[i+1], 10, 64)
			switch f[i] {
			case "mem":
				k.tcpMem = v * int64(os.Getpagesize())
			case "inuse":
				k.tcpInuse = v
			}
		}
	}
	return k, nil
}
