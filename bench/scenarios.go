//go:build linux

package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgsse/pgsse/internal/testkit/metricstest"
	"github.com/pgsse/pgsse/store"
)

// Params sizes the scenarios. Full() is issue 7's scale; Small() is the CI smoke scale.
type Params struct {
	Conns int // subscribers in scenarios 1, 3, 4, 6 (≤ 15,000 per server process)

	Heartbeat  time.Duration // --heartbeat of both servers
	IdleWindow time.Duration // scenario 1: CPU measured over this window

	LatencyEvents int     // scenario 2
	LatencyRate   float64 // events/s

	FanoutEvents int           // scenarios 3 and 6
	FanoutGap    time.Duration // pause after the last subscriber has an event
	FanoutData   int           // bytes of data per event in 3 and 6

	ThroughputDuration time.Duration // scenario 4: publish flat out this long
	ThroughputBatch    int           // scenario 4: events per transaction (≤ 1: one pgsse.publish per statement)
	Data               int           // bytes of data per event in 2 and 4

	SlowPercent   float64 // scenario 6: share of subscribers that stopped reading
	SlowRcvBuf    int     // their SO_RCVBUF
	RcvBuf        int     // SO_RCVBUF of the reading subscribers (0 = the kernel default)
	PrefillEvents int     // scenario 6: events published to them alone before the others connect (600 × 7,000 B: more than the ≈3 MB loopback socket buffers hold)
	PrefillData   int     // bytes of data per prefill event (inline in NOTIFY below 7,900)

	Hub     HubParams     // scenario 5
	Publish PublishParams // scenario 9

	ProcsConns  int // scenario 10: idle connections through one port with --procs 2
	HolderConns int // scenario 10: at most this many per load process holding them (0 = HolderConns)

	MultiConns   int            // scenario 11: connections of each kind (several streams each, one stream each)
	MultiStreams int            // scenario 11: streams per connection of the first kind
	MultiRounds  int            // scenario 11: fan-out rounds of each kind, alternating
	Presence     PresenceParams // scenarios 12 and 13 (presence.go)
	// OutboundBudget is pgsse's --max-outbound-memory in scenarios 4, 7 and 8 (0 = the
	// server's default); RSS is reported against it.
	OutboundBudget int64
	Memory         MemoryParams // scenarios 7 and 8

	Scale ScaleParams // scenario 15 (scale.go)

	PubFanout PubFanoutParams // scenario 16 (pubfanout.go)

	Deploy DeployParams // scenario 17 (deploy.go)

	Sources int // loopback source addresses
	Readers int // client epoll loops
}

// Full is the scale of issue 7.
func Full() Params {
	return Params{
		Conns: 15000, Heartbeat: 15 * time.Second, IdleWindow: 30 * time.Second,
		LatencyEvents: 1000, LatencyRate: 50,
		FanoutEvents: 50, FanoutGap: 50 * time.Millisecond, FanoutData: 256,
		ThroughputDuration: 10 * time.Second, Data: 64,
		SlowPercent: 1, SlowRcvBuf: 4096, PrefillEvents: 600, PrefillData: 7000,
		Hub:     HubParams{Workers: 64, Rate: 5000, Duration: 10 * time.Second},
		Publish: fullPublish(),
		Sources: 8, Readers: 1,
		Memory: MemoryParams{StalledConns: 200, StalledDuration: 10 * time.Second, StalledData: 1024,
			LargeBytes: 50 << 20, LargeSubscribers: 10},
		ProcsConns: 30000,
		MultiConns: 10000, MultiStreams: 8, MultiRounds: 2,
		Scale: ScaleParams{Conns: 100000, Procs: 7, Hold: 60 * time.Second, Events: 20, OneConns: 15000},
		Presence: PresenceParams{Interval: time.Second, Churn: 10000, Others: 1000, Rate: 50,
			HoldSubjects: 1000, HoldStreams: 100, Hold: 60 * time.Second},
		PubFanout: fullPubFanout(),
		Deploy:    fullDeploy(),
	}
}

// Small runs every scenario in seconds (CI smoke).
func Small() Params {
	p := Full()
	p.Conns = 200
	p.Heartbeat = time.Second
	p.IdleWindow = 2 * time.Second
	p.LatencyEvents = 50
	p.FanoutEvents = 20
	p.FanoutGap = 10 * time.Millisecond
	p.ThroughputDuration = time.Second
	p.SlowPercent = 5
	p.Hub = HubParams{Workers: 8, Rate: 1000, Duration: time.Second}
	p.ProcsConns = 400
	p.MultiConns = 200
	p.Scale = ScaleParams{Conns: 1000, Procs: 2, Hold: 2 * time.Second, Events: 5, OneConns: 400}
	p.Presence = PresenceParams{Interval: 200 * time.Millisecond, Churn: 500, Others: 100, Rate: 50,
		HoldSubjects: 50, HoldStreams: 20, Hold: 5 * time.Second}
	p.Memory = MemoryParams{StalledConns: 50, StalledDuration: 2 * time.Second, StalledData: 1024,
		LargeBytes: 16 << 20, LargeSubscribers: 10}
	p.Publish = smallPublish()
	p.PubFanout = smallPubFanout()
	p.Deploy = smallDeploy()
	return p
}

// Env is what every scenario runs in.
type Env struct {
	Cluster    *Cluster
	Dir        string // server logs (and profiles)
	ProfileDir string // when set, CPU profiles of the server under 3, 4, 6, 12 and 16 are written here
	Logf       func(format string, args ...any)
}

func (e *Env) logf(format string, args ...any) {
	if e.Logf != nil {
		e.Logf(format, args...)
	}
}

// Metric is one figure of one scenario for one server.
type Metric struct {
	Name  string
	Unit  string
	Value float64
	Lower bool // lower is better (decides nothing but the reader's arrow)
}

// Result is one scenario against one server.
type Result struct {
	Scenario string
	Target   string
	Metrics  []Metric
	Notes    []string
}

func (r *Result) add(name, unit string, v float64, lower bool) {
	r.Metrics = append(r.Metrics, Metric{Name: name, Unit: unit, Value: v, Lower: lower})
}

func (r *Result) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// Get returns the named metric's value (NaN-free: 0 if absent; a test asks Lookup).
func (r *Result) Get(name string) float64 {
	v, _ := r.Lookup(name)
	return v
}

// Lookup returns the named metric's value and whether the result has it.
func (r *Result) Lookup(name string) (float64, bool) {
	for _, m := range r.Metrics {
		if m.Name == name {
			return m.Value, true
		}
	}
	return 0, false
}

// run is one server process with its own database for one scenario.
type run struct {
	e   *Env
	t   Target
	db  *Database
	srv *Server
}

func (e *Env) start(ctx context.Context, t Target, p Params) (*run, error) {
	db, err := e.Cluster.NewDatabase(ctx)
	if err != nil {
		return nil, err
	}
	t.Heartbeat = p.Heartbeat
	t.Pprof = t.Pprof || e.ProfileDir != ""
	srv, err := StartServer(ctx, t, db.URL, e.Dir)
	if err != nil {
		db.Drop()
		return nil, err
	}
	return &run{e: e, t: t, db: db, srv: srv}, nil
}

func (r *run) stop() {
	r.srv.Stop()
	r.db.Drop()
}

func (r *run) client(stream string, conns int, p Params, maxSeq int) (*Client, error) {
	c, err := NewClient(ClientConfig{
		Addr: r.srv.SSE, Path: "/streams/" + stream, Sources: p.Sources, Readers: p.Readers,
		MaxSeq: maxSeq, SlowRcvBuf: p.SlowRcvBuf, RcvBuf: p.RcvBuf,
	})
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := c.Connect(conns, false); err != nil {
		c.Close()
		return nil, fmt.Errorf("%s: connect %d subscribers: %w", r.t.Name, conns, err)
	}
	r.e.logf("%s: %d subscribers connected in %v", r.t.label(), conns, time.Since(start).Round(time.Millisecond))
	return c, nil
}

// alive fails when the server has died under the load (a crash is a result, not noise).
func (r *run) alive() error {
	if done, err := r.srv.Exited(); done {
		return fmt.Errorf("%s exited during the scenario (%v); log %s:\n%s", r.t.Name, err, r.srv.LogPath, tail(r.srv.LogPath, 20))
	}
	return nil
}

// rssPeak samples the server's RSS every 50 ms until stopped.
type rssPeak struct {
	peak atomic.Int64
	stop chan struct{}
	wg   sync.WaitGroup
}

func (r *run) sampleRSS() *rssPeak {
	s := &rssPeak{stop: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			if v, err := r.srv.RSS(); err == nil && v > s.peak.Load() {
				s.peak.Store(v)
			}
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *rssPeak) done() int64 {
	close(s.stop)
	s.wg.Wait()
	return s.peak.Load()
}

// profile captures a CPU profile of the server for d, in the background; wait() blocks until
// it is written.
func (r *run) profile(ctx context.Context, scenario string, d time.Duration) (wait func()) {
	if r.e.ProfileDir == "" {
		return func() {}
	}
	secs := max(1, int(d.Round(time.Second)/time.Second))
	path := filepath.Join(r.e.ProfileDir, r.t.label()+"-"+scenario+".pprof")
	done := make(chan struct{})
	go func() {
		defer close(done)
		f, err := os.Create(path)
		if err != nil {
			r.e.logf("profile: %v", err)
			return
		}
		defer f.Close()
		if err := r.srv.Get(ctx, "/debug/pprof/profile?seconds="+strconv.Itoa(secs), f); err != nil {
			r.e.logf("profile %s: %v", path, err)
			return
		}
		r.e.logf("%s: CPU profile (%ds) in %s", r.t.Name, secs, path)
	}()
	return func() { <-done }
}

// heapProfile writes the server's heap profile (in use at this moment) when ProfileDir is set.
func (r *run) heapProfile(ctx context.Context, scenario string) {
	if r.e.ProfileDir == "" {
		return
	}
	path := filepath.Join(r.e.ProfileDir, r.t.label()+"-"+scenario+".heap.pprof")
	f, err := os.Create(path)
	if err != nil {
		r.e.logf("heap profile: %v", err)
		return
	}
	defer f.Close()
	if err := r.srv.Get(ctx, "/debug/pprof/heap", f); err != nil {
		r.e.logf("heap profile %s: %v", path, err)
		return
	}
	r.e.logf("%s: heap profile in %s", r.t.label(), path)
}

// pgCPU sums the CPU time of the database's backends (publisher, LISTEN and replay sessions).
func (r *run) pgCPU(ctx context.Context) map[int]time.Duration {
	pids, err := r.db.BackendPIDs(ctx)
	if err != nil {
		return nil
	}
	m := make(map[int]time.Duration, len(pids))
	for _, pid := range pids {
		if c, err := procCPU(pid); err == nil {
			m[pid] = c
		}
	}
	return m
}

func pgCPUDelta(before, after map[int]time.Duration) time.Duration {
	var d time.Duration
	for pid, c := range after {
		d += c - before[pid]
	}
	return d
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// Idle is scenario 1: p.Conns idle subscribers → RSS per connection and CPU while idle
// (heartbeats every p.Heartbeat included).
func Idle(ctx context.Context, e *Env, t Target, p Params) (*Result, error) {
	r, err := e.start(ctx, t, p)
	if err != nil {
		return nil, err
	}
	defer r.stop()
	time.Sleep(500 * time.Millisecond)
	rss0, err := r.srv.RSS()
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	c, err := r.client("idle", p.Conns, p, 16)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	connectTime := time.Since(t0)
	time.Sleep(time.Second)
	cpu0, _ := r.srv.CPU()
	self0, w0 := SelfCPU(), time.Now()
	time.Sleep(p.IdleWindow)
	cpu1, _ := r.srv.CPU()
	self1, w1 := SelfCPU(), time.Now()
	rss1, err := r.srv.RSS()
	if err != nil {
		return nil, err
	}
	if err := r.alive(); err != nil {
		return nil, err
	}
	c.Close()
	st := c.Stats()
	window := w1.Sub(w0)
	res := &Result{Scenario: "1 idle", Target: t.label()}
	res.add("connections", "", float64(st.Conns), false)
	res.add("RSS per idle connection", "B", float64(rss1-rss0)/float64(st.Conns), true)
	res.add("RSS total", "MiB", float64(rss1)/(1<<20), true)
	res.add("connect rate", "conn/s", float64(st.Conns)/connectTime.Seconds(), false)
	res.add("server CPU while idle", "ms/s", ms(cpu1-cpu0)/window.Seconds(), true)
	res.add("heartbeats received", "per conn", float64(st.Comments-int64(st.Conns))/float64(st.Conns), false)
	res.add("client CPU while idle", "ms/s", ms(self1-self0)/window.Seconds(), true)
	if st.Closed > 0 {
		res.note("%d connections closed by the server while idle", st.Closed)
	}
	return res, nil
}

// Latency is scenario 2: one subscriber, events committed by SQL at p.LatencyRate →
// commit-to-received and send-to-received percentiles.
func Latency(ctx context.Context, e *Env, t Target, p Params) (*Result, error) {
	r, err := e.start(ctx, t, p)
	if err != nil {
		return nil, err
	}
	defer r.stop()
	n := p.LatencyEvents
	c, err := r.client("latency", 1, p, n+1)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	pub, err := NewPublisher(ctx, r.db.URL, "latency", p.Data, n+1)
	if err != nil {
		return nil, err
	}
	defer pub.Close()
	pub.Mark = c.SetRef
	time.Sleep(200 * time.Millisecond)
	interval := time.Duration(float64(time.Second) / p.LatencyRate)
	next := time.Now()
	for range n {
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		next = next.Add(interval)
		if _, err := pub.PublishTx(ctx); err != nil {
			return nil, err
		}
	}
	c.WaitHave(int64(n), 1, 5*time.Second)
	if err := r.alive(); err != nil {
		return nil, err
	}
	c.Close()
	st := c.Stats()
	var commit []time.Duration
	for seq := 1; seq <= n; seq++ {
		if st.Last[seq] != 0 {
			commit = append(commit, time.Duration(st.Last[seq]-pub.Ref[seq]))
		}
	}
	res := &Result{Scenario: "2 latency", Target: t.label()}
	cq := Quantiles(commit, 0.5, 0.95, 0.99, 1)
	res.add("commit→received p50", "ms", ms(cq[0]), true)
	res.add("commit→received p95", "ms", ms(cq[1]), true)
	res.add("commit→received p99", "ms", ms(cq[2]), true)
	res.add("commit→received max", "ms", ms(cq[3]), true)
	res.add("events missing", "", float64(n-len(commit)), true)
	return res, nil
}

// FanOut is scenario 3 (slowPercent 0) and 6 (p.SlowPercent of the subscribers connect but
// never read): p.FanoutEvents events, each published once the previous one reached every
// reading subscriber (plus p.FanoutGap) → time until the last subscriber has it.
func FanOut(ctx context.Context, e *Env, t Target, p Params, slowPercent float64) (*Result, error) {
	r, err := e.start(ctx, t, p)
	if err != nil {
		return nil, err
	}
	defer r.stop()
	scenario := "3 fan-out"
	slow := 0
	if slowPercent > 0 {
		scenario = "6 isolation"
		slow = max(1, int(float64(p.Conns)*slowPercent/100))
	}
	reading := p.Conns - slow
	n := p.FanoutEvents
	var c *Client
	var prefillRSS int64
	if slow > 0 {
		// The slow subscribers connect first and get a backlog they never read (p.PrefillEvents
		// events of p.PrefillData bytes: more than the kernel and any sane server buffer hold),
		// then the others connect, live from the head, and scenario 3 runs as usual.
		if c, err = r.client("fanout", 0, p, n+1); err != nil {
			return nil, err
		}
		defer c.Close()
		if err := c.Connect(slow, true); err != nil {
			return nil, fmt.Errorf("connect slow subscribers: %w", err)
		}
		if err := prefill(ctx, r.db.URL, "fanout", p.PrefillEvents, p.PrefillData); err != nil {
			return nil, err
		}
		time.Sleep(time.Second)
		prefillRSS, _ = r.srv.RSS()
		if err := c.Connect(reading, false); err != nil {
			return nil, fmt.Errorf("%s: connect %d subscribers: %w", r.t.Name, reading, err)
		}
	} else {
		if c, err = r.client("fanout", reading, p, n+1); err != nil {
			return nil, err
		}
		defer c.Close()
	}
	pub, err := NewPublisher(ctx, r.db.URL, "fanout", p.FanoutData, n+1)
	if err != nil {
		return nil, err
	}
	defer pub.Close()
	pub.Mark = c.SetRef
	time.Sleep(500 * time.Millisecond)
	rss0, _ := r.srv.RSS()
	peak := r.sampleRSS()
	waitProfile := r.profile(ctx, scenarioFile(scenario), time.Duration(n)*(p.FanoutGap+150*time.Millisecond))
	cpu0, _ := r.srv.CPU()
	proc0 := r.srv.TreeCPU()
	self0, w0 := SelfCPU(), time.Now()
	timeouts := 0
	for range n {
		seq, err := pub.PublishTx(ctx)
		if err != nil {
			peak.done()
			return nil, err
		}
		if !c.WaitHave(seq, reading, 10*time.Second) {
			timeouts++
			if err := r.alive(); err != nil {
				peak.done()
				return nil, err
			}
		}
		time.Sleep(p.FanoutGap)
	}
	cpu1, _ := r.srv.CPU()
	proc1 := r.srv.TreeCPU()
	self1, w1 := SelfCPU(), time.Now()
	rssPeak := peak.done()
	rss1, _ := r.srv.RSS()
	waitProfile()
	if err := r.alive(); err != nil {
		return nil, err
	}
	slowClosed := c.drainSlow()
	c.Close()
	st := c.Stats()
	r.srv.Stop()
	var ttl, ttf []time.Duration
	for seq := 1; seq <= n; seq++ {
		if st.Last[seq] == 0 {
			continue
		}
		ttl = append(ttl, time.Duration(st.Last[seq]-pub.Ref[seq]))
		ttf = append(ttf, time.Duration(st.First[seq]-pub.Ref[seq]))
	}
	lq := Quantiles(ttl, 0.5, 0.99, 1)
	fq := Quantiles(ttf, 0.5)
	res := &Result{Scenario: scenario, Target: t.label()}
	res.add("subscribers reading", "", float64(reading), false)
	if slow > 0 {
		res.add("subscribers not reading", "", float64(slow), false)
	}
	res.add("time to last subscriber p50", "ms", ms(lq[0]), true)
	res.add("time to last subscriber p99", "ms", ms(lq[1]), true)
	res.add("time to last subscriber max", "ms", ms(lq[2]), true)
	res.add("time to first subscriber p50", "ms", ms(fq[0]), true)
	res.add("per-delivery commit→received p50", "ms", ms(st.Latency.Quantile(0.5)), true)
	res.add("per-delivery commit→received p99", "ms", ms(st.Latency.Quantile(0.99)), true)
	deliveries := float64(st.Events)
	res.add("server CPU per delivery", "µs", float64(cpu1-cpu0)/1e3/max(deliveries, 1), true)
	res.add("server CPU per event, busiest process", "ms", ms(busiest(proc0, proc1))/float64(n), true)
	res.add("server CPU share (2 cores)", "%", 100*(cpu1-cpu0).Seconds()/(2*w1.Sub(w0).Seconds()), false)
	res.add("client CPU share (2 cores)", "%", 100*(self1-self0).Seconds()/(2*w1.Sub(w0).Seconds()), false)
	if slow > 0 {
		res.add("server RSS after the slow backlog", "MiB", float64(prefillRSS)/(1<<20), true)
	}
	res.add("server RSS peak", "MiB", float64(rssPeak)/(1<<20), true)
	res.add("server RSS growth", "MiB", float64(max(rss1, rssPeak)-rss0)/(1<<20), true)
	res.add("deliveries missing", "", float64(int64(n)*int64(reading)-st.Events), true)
	if slow > 0 {
		res.add("slow subscribers closed by server", "", float64(slowClosed), false)
	}
	if d, ok := r.baselineDropped(); ok {
		res.add("events dropped by server (full queues)", "", float64(d), true)
	}
	if timeouts > 0 {
		res.note("%d of %d events had not reached every reading subscriber after 10 s", timeouts, n)
	}
	if st.Gaps+st.Dups > 0 {
		res.note("sequence anomalies at reading subscribers: %d skipped, %d repeated", st.Gaps, st.Dups)
	}
	return res, nil
}

// prefill publishes n events of size bytes to stream (data the client does not count).
func prefill(ctx context.Context, dsn, stream string, n, size int) error {
	conn, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	data := "prefill " + strings.Repeat("x", max(0, size-8))
	for range n {
		if _, err := store.Publish(ctx, conn, stream, data, "", nil); err != nil {
			return err
		}
	}
	return nil
}

// baselineDropped reads the baseline's exit line ("delivered N, dropped M") once it stopped.
func (r *run) baselineDropped() (int64, bool) {
	if r.t.Name != "baseline" {
		return 0, false
	}
	b, err := os.ReadFile(r.srv.LogPath)
	if err != nil {
		return 0, false
	}
	_, after, ok := strings.Cut(string(b), ", dropped ")
	if !ok {
		return 0, false
	}
	after, _, _ = strings.Cut(after, "\n")
	d, err := strconv.ParseInt(strings.TrimSpace(after), 10, 64)
	return d, err == nil
}

func scenarioFile(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == ' ' {
			b[i] = '-'
		}
	}
	return string(b)
}

// drainSlow reads what the slow subscribers have pending (non-blocking) and returns how many
// of them the server has closed.
func (c *Client) drainSlow() int {
	buf := make([]byte, 64<<10)
	closed := 0
	for _, sc := range c.slow {
		for {
			n, err := syscall.Read(sc.fd, buf)
			if err == syscall.EAGAIN {
				break
			}
			if n <= 0 {
				closed++
				break
			}
		}
	}
	return closed
}

// Throughput is scenario 4: p.Conns subscribers, one publisher committing flat out for
// p.ThroughputDuration → deliveries/s and server CPU-seconds per million deliveries, both
// measured over the publishing window (the publisher outruns any fan-out, so draining the
// backlog afterwards would measure the backlog, not the server).
func Throughput(ctx context.Context, e *Env, t Target, p Params) (*Result, error) {
	t.ExtraArgs = append(append([]string(nil), t.ExtraArgs...), budgetArgs(t, p)...)
	r, err := e.start(ctx, t, p)
	if err != nil {
		return nil, err
	}
	defer r.stop()
	const maxSeq = 1 << 20
	c, err := r.client("throughput", p.Conns, p, maxSeq)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	pub, err := NewPublisher(ctx, r.db.URL, "throughput", p.Data, maxSeq)
	if err != nil {
		return nil, err
	}
	defer pub.Close()
	pub.Mark = c.SetRef
	time.Sleep(500 * time.Millisecond)
	rss0, _ := r.srv.RSS()
	peak := r.sampleRSS()
	waitProfile := r.profile(ctx, "4-throughput", p.ThroughputDuration)
	pg0 := r.pgCPU(ctx)
	cpu0, _ := r.srv.CPU()
	self0, w0 := SelfCPU(), time.Now()
	for time.Since(w0) < p.ThroughputDuration {
		var err error
		if p.ThroughputBatch > 1 {
			_, err = pub.PublishBatch(ctx, p.ThroughputBatch)
		} else {
			_, err = pub.Publish(ctx)
		}
		if err != nil {
			peak.done()
			return nil, err
		}
	}
	cpu1, _ := r.srv.CPU()
	self1, w1 := SelfCPU(), time.Now()
	delivered := c.Delivered()
	pg1 := r.pgCPU(ctx)
	last := pub.Seq
	rssPeak := peak.done()
	r.heapProfile(ctx, "4-throughput")
	waitProfile()
	if err := r.alive(); err != nil {
		return nil, err
	}
	var metrics *metricstest.Scrape
	var metricsErr error
	if t.Name == "pgsse" {
		metrics, metricsErr = r.srv.Metrics(ctx)
	}
	c.Close()
	st := c.Stats()
	r.srv.Stop()
	wall := w1.Sub(w0).Seconds()
	deliveries := float64(delivered)
	serverCPU := (cpu1 - cpu0).Seconds()
	res := &Result{Scenario: "4 throughput", Target: t.label()}
	res.add("events published", "events/s", float64(last)/wall, false)
	res.add("deliveries", "deliveries/s", deliveries/wall, false)
	res.add("server CPU per million deliveries", "CPU-s", serverCPU/max(deliveries, 1)*1e6, true)
	res.add("server CPU share (2 cores)", "%", 100*serverCPU/(2*wall), false)
	res.add("client CPU share (2 cores)", "%", 100*(self1-self0).Seconds()/(2*wall), false)
	res.add("PostgreSQL CPU share (2 cores)", "%", 100*pgCPUDelta(pg0, pg1).Seconds()/(2*wall), false)
	res.add("events per subscriber behind at the end", "events", float64(last)-deliveries/float64(p.Conns), true)
	res.add("events lost (skipped in a subscriber's sequence)", "%", 100*float64(st.Gaps)/max(float64(st.Gaps)+float64(st.Events), 1), true)
	res.add("subscribers with a sequence gap", "", float64(st.ConnsWithGaps), true)
	res.add("server RSS idle (subscribers connected)", "MiB", float64(rss0)/(1<<20), true)
	res.add("server RSS peak", "MiB", float64(rssPeak)/(1<<20), true)
	res.add("server RSS growth", "MiB", float64(rssPeak-rss0)/(1<<20), true)
	if p.OutboundBudget > 0 && t.Name == "pgsse" {
		res.add("--max-outbound-memory", "MiB", float64(p.OutboundBudget)/(1<<20), false)
		res.add("server RSS growth ÷ budget", "×", float64(rssPeak-rss0)/float64(p.OutboundBudget), true)
	}
	res.add("bytes per read (client)", "B", float64(st.Bytes)/max(float64(st.Reads), 1), false)
	if d, ok := r.baselineDropped(); ok {
		res.add("events dropped by server (full queues)", "", float64(d), true)
	}
	if st.Dups > 0 {
		res.note("%d events repeated or out of order at subscribers", st.Dups)
	}
	if st.Closed > 0 {
		res.note("%d subscribers closed by the server", st.Closed)
	}
	if metricsErr != nil {
		res.note("server metrics: %v", metricsErr)
	}
	if metrics != nil {
		for _, name := range []string{"pgsse_deliveries_total", "pgsse_dropped_total", "pgsse_evictions_total", "pgsse_notifications_total"} {
			for _, se := range metrics.Series(name) {
				res.note("server metric %s", se)
			}
		}
	}
	return res, nil
}

// Scenario runs scenario id (1, 2, 3, 4, 6, 7 or 8) against t.
func Scenario(ctx context.Context, e *Env, t Target, p Params, id int) (*Result, error) {
	switch id {
	case 1:
		return Idle(ctx, e, t, p)
	case 2:
		return Latency(ctx, e, t, p)
	case 3:
		return FanOut(ctx, e, t, p, 0)
	case 4:
		return Throughput(ctx, e, t, p)
	case 6:
		return FanOut(ctx, e, t, p, p.SlowPercent)
	case 7:
		return Stalled(ctx, e, t, p)
	case 8:
		return LargeEvent(ctx, e, t, p)
	}
	return nil, errors.New("scenario must be 1, 2, 3, 4, 6, 7 or 8 (5, the hub, is Hub)")
}
