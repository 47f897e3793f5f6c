//go:build linux

package chaos

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgsse/pgsse/auth"
)

// Config is one run.
type Config struct {
	Duration time.Duration // the workload with faults (or the soak), before the drain
	Seed     uint64
	Soak     bool   // steady load with churn and no faults; samples resources (soak.go)
	Root     string // module root: scripts/pg.sh, and the tree pgsse is built from
	Bin      string // a pgsse binary to test instead of building Root's
	Dir      string // logs and the cluster ("" = a new temporary directory, removed if the run passes)
	// Faults are the fault kinds injected (nil: DefaultFaults); FaultEvery the mean time
	// between two (exponential, from the seed).
	Faults     []string
	FaultEvery time.Duration
	// Multi: multi-stream subscribers (SPEC §3c) — "auto" (when serve --help lists
	// --max-streams-per-connection), "on", "off". Handoff: the SIGUSR2 fault (SPEC §6) —
	// "auto" (when serve --help mentions SIGUSR2), "on", "off".
	Multi, Handoff string
	Scale          float64       // multiplies clients and rates (default 1)
	SampleEvery    time.Duration // soak: resource samples (default 10s)
	Log            io.Writer     // progress lines (default os.Stderr)
}

// Result is what a run found.
type Result struct {
	Seed     uint64
	Report   *Report
	Faults   map[string]int // injected, by kind
	Skipped  map[string]int // drawn but not applicable at that moment (no session of that kind, …)
	Features []string       // the workload and fault kinds the server under test supports
	Soak     *SoakResult
	// Counters are some of the first process's pgsse_ counters at the end of the run (summed
	// over its siblings; since its last start): evidence of what the faults did.
	Counters []string
	Dir      string
	Elapsed  time.Duration
}

// OK reports whether every check passed (and, for a soak, nothing grew).
func (r *Result) OK() bool {
	return r.Report.OK() && (r.Soak == nil || r.Soak.OK())
}

type workload struct {
	cfg       Config
	runCtx    context.Context
	t0        time.Time
	logw      io.Writer
	logMu     sync.Mutex
	addr      string
	hubSocket string
	secret    []byte
	db        *database
	cl        *cluster
	srv       *server

	publishToken string
	durable      []string // durable streams
	ephTargets   []string // where broadcasts go: ephemeral streams and some durable ones
	ephStreams   []string // the ephemeral-only streams
	hubChannels  []string
	sseChannels  []string
	multi        bool
	handoff      bool

	mu       sync.Mutex
	pubs     []*PubRecord
	subs     []*durableSub
	ephs     []*ephSub
	workers  []*hubWorker
	crashes  []CrashWindow
	extra    Report // failures seen by clients as they ran (unexpected statuses)
	nextPub  int
	pruneMu  sync.Mutex // held by pg-crash-async: no synchronous commit may flush its window
	faults   map[string]int
	skipped  map[string]int
	clientWG sync.WaitGroup
}

func (w *workload) now() time.Duration { return time.Since(w.t0) }

func (w *workload) logf(format string, args ...any) {
	w.logMu.Lock()
	defer w.logMu.Unlock()
	fmt.Fprintf(w.logw, "chaos [%7.1fs] %s\n", w.now().Seconds(), fmt.Sprintf(format, args...))
}

func (w *workload) addPub(r *PubRecord) {
	w.mu.Lock()
	w.pubs = append(w.pubs, r)
	w.mu.Unlock()
}

func (w *workload) fail(class, who, format string, args ...any) {
	w.mu.Lock()
	w.extra.fail(class, who, format, args...)
	w.mu.Unlock()
}

// unexpectedStatus: a subscriber got a non-200 answer. 401 is expected only for a token that
// may have expired on the way (a short one); anything else is a failure (SPEC §3: shedding
// is a 200).
func (w *workload) unexpectedStatus(who string, resp response) {
	if resp.status == 401 && strings.Contains(resp.reason, "expired") {
		return
	}
	w.fail(FailHTTPStatus, who, "GET answered %d: %s", resp.status, resp.reason)
}

// SoakTokenTTL is how long a subscriber's token is valid in the soak: less than its warm-up
// (the first half), so that pgsse's token cache — which keeps every verified token until its
// exp, by design — is at its steady state when the growth rule looks, and what still grows is
// a leak. (A fault run's tokens outlive it: a subscriber is ended at exp only on purpose.)
// Each connection presents a fresh token, as a client that renews its token does.
const SoakTokenTTL = 10 * time.Minute

// tokenTTL is the lifetime of a subscriber's token (the Expiring kind and the token-expiry
// fault choose shorter ones).
func (w *workload) tokenTTL() time.Duration {
	if w.cfg.Soak {
		return SoakTokenTTL
	}
	return time.Hour + w.cfg.Duration
}

func (w *workload) subscriberToken(sub string, tags []string, ttl time.Duration) string {
	tok, err := auth.Mint(auth.MintKey{Secret: w.secret},
		auth.Claims{Streams: []string{"chaos/*"}, Channels: []string{"chaos_*"}, Tags: tags, Subject: sub},
		ttl, "", "", time.Now())
	if err != nil {
		panic(err)
	}
	return tok
}

func (w *workload) newPublisher(rate float64) publisher {
	w.mu.Lock()
	w.nextPub++
	n := w.nextPub
	w.mu.Unlock()
	return publisher{w: w, pub: n, rng: w.rng(uint64(n) + 1000), rate: rate * w.cfg.Scale, op: w.runCtx}
}

// rng is a generator for one actor, from the run's seed: the same seed gives every actor
// the same choices.
func (w *workload) rng(actor uint64) *rand.Rand {
	return rand.New(rand.NewPCG(w.cfg.Seed, mix(actor)))
}

func (c *Config) defaults() {
	if c.Duration <= 0 {
		c.Duration = 60 * time.Second
	}
	if c.FaultEvery <= 0 {
		c.FaultEvery = 6 * time.Second
	}
	if c.Scale <= 0 {
		c.Scale = 1
	}
	if c.SampleEvery <= 0 {
		c.SampleEvery = 10 * time.Second
	}
	if c.Log == nil {
		c.Log = os.Stderr
	}
	if c.Multi == "" {
		c.Multi = "auto"
	}
	if c.Handoff == "" {
		c.Handoff = "auto"
	}
	if c.Faults == nil {
		c.Faults = DefaultFaults
	}
}

// Run runs the workload against `pgsse serve --procs 2` on a PostgreSQL of its own, with
// faults at moments drawn from the seed (or, for a soak, steady churn), drains, and checks.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg.defaults()
	w := &workload{cfg: cfg, runCtx: ctx, t0: time.Now(), logw: cfg.Log, faults: map[string]int{}, skipped: map[string]int{}}
	res := &Result{Seed: cfg.Seed}
	dir := cfg.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "pgsse-chaos-")
		if err != nil {
			return nil, err
		}
		dir = d
	}
	res.Dir = dir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	for _, k := range cfg.Faults {
		if faultByName(k) == nil {
			return nil, fmt.Errorf("unknown fault kind %q (known: %s)", k, strings.Join(AllFaults(), ", "))
		}
	}
	bin := cfg.Bin
	if bin == "" {
		bin = filepath.Join(dir, "pgsse")
		w.logf("building pgsse from %s", cfg.Root)
		cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/pgsse")
		cmd.Dir = cfg.Root
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build ./cmd/pgsse: %v\n%s", err, out)
		}
	}
	w.multi = cfg.Multi == "on" || (cfg.Multi == "auto" && helpHas(bin, "--max-streams-per-connection"))
	w.handoff = cfg.Handoff == "on" || (cfg.Handoff == "auto" && helpHas(bin, "SIGUSR2"))
	if w.multi {
		res.Features = append(res.Features, "multi-stream subscribers")
	}
	if w.handoff && !cfg.Soak {
		res.Features = append(res.Features, "SIGUSR2 handoffs")
		if !containsFault(cfg.Faults, FaultHandoff) {
			cfg.Faults = append(append([]string(nil), cfg.Faults...), FaultHandoff)
			w.cfg.Faults = cfg.Faults
		}
	}

	pgDir := filepath.Join(dir, "pg")
	w.logf("starting PostgreSQL in %s", pgDir)
	cl, err := startCluster(ctx, filepath.Join(cfg.Root, "scripts", "pg.sh"), pgDir)
	if err != nil {
		return nil, err
	}
	w.cl = cl
	defer cl.stop()
	if w.db, err = cl.newDatabase(ctx); err != nil {
		return nil, err
	}
	w.setup()
	if err := w.startServer(ctx, bin, dir); err != nil {
		return nil, err
	}
	defer w.srv.stop()
	w.t0 = time.Now()
	clientCtx, stopClients := context.WithCancel(ctx)
	defer stopClients()
	pubCtx, stopPubs := context.WithCancel(ctx)
	defer stopPubs()
	var pubWG sync.WaitGroup
	w.startClients(clientCtx)
	w.startPublishers(pubCtx, &pubWG)
	faults := strings.Join(cfg.Faults, ",")
	if cfg.Soak {
		faults = "none (soak: churn only)"
	}
	w.logf("seed %d, %s, %d durable subscribers, %d hub workers, faults: %s", cfg.Seed, cfg.Duration,
		len(w.subs), len(w.workers), faults)
	faultCtx, stopFaults := context.WithCancel(ctx)
	faultDone := make(chan struct{})
	var sampler *soakSampler
	if cfg.Soak {
		sampler = w.newSoakSampler()
		go func() { defer close(faultDone); sampler.run(faultCtx) }()
	} else {
		go func() { defer close(faultDone); w.runFaults(faultCtx, clientCtx) }()
	}
	churnDone := make(chan struct{})
	go func() { defer close(churnDone); w.churn(faultCtx, clientCtx) }()
	select {
	case <-time.After(cfg.Duration):
	case <-ctx.Done():
	}
	stopFaults()
	<-faultDone
	<-churnDone
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	w.drain(ctx, stopPubs, &pubWG, stopClients)
	res.Counters = w.counters(ctx)
	rec, err := w.record(ctx)
	if err != nil {
		return nil, err
	}
	res.Report = Check(rec)
	mergeReport(res.Report, &w.extra)
	if !res.Report.OK() {
		names := map[string]bool{}
		for _, f := range res.Report.Failures {
			names[f.Who] = true
		}
		_ = rec.Dump(dir, names)
	}
	res.Faults, res.Skipped = w.faults, w.skipped
	if sampler != nil {
		res.Soak = sampler.verdict()
	}
	res.Elapsed = w.now()
	if res.OK() && cfg.Dir == "" {
		defer os.RemoveAll(dir)
	}
	return res, nil
}

func containsFault(list []string, k string) bool {
	for _, f := range list {
		if f == k {
			return true
		}
	}
	return false
}

func mergeReport(dst, src *Report) {
	for class, n := range src.Counts {
		dst.Counts[class] += n
	}
	dst.Failures = append(dst.Failures, src.Failures...)
}

// setup names the streams and channels and mints the publishers' token.
func (w *workload) setup() {
	w.secret = []byte("chaos-secret-" + strconv.FormatUint(w.cfg.Seed, 16) + "-0123456789abcdefghijklmnopqrstuvwxyz")
	for i := range 6 {
		w.durable = append(w.durable, "chaos/d"+strconv.Itoa(i))
	}
	w.ephStreams = []string{"chaos/e0", "chaos/e1"}
	w.ephTargets = append(append([]string(nil), w.ephStreams...), w.durable[0], w.durable[1])
	w.hubChannels = []string{"chaos_h0", "chaos_h1", "chaos_h2", "chaos_h3"}
	w.sseChannels = []string{"chaos_c0", "chaos_c1"}
	tok, err := auth.Mint(auth.MintKey{Secret: w.secret}, auth.Claims{Publish: []string{"chaos/*"}},
		w.cfg.Duration+2*time.Hour, "", "", time.Now())
	if err != nil {
		panic(err)
	}
	w.publishToken = tok
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port), nil
}

// maxConnections is the server's --max-connections: well above the workload's clients, so
// that only the connection flood reaches it.
const maxConnections = 600

func (w *workload) startServer(ctx context.Context, bin, dir string) error {
	sse, err := freePort()
	if err != nil {
		return err
	}
	admin, err := freePort()
	if err != nil {
		return err
	}
	w.addr = "127.0.0.1:" + sse
	w.hubSocket = filepath.Join(dir, "hub.sock")
	if err := os.Setenv("PGSSE_JWT_SECRET", string(w.secret)); err != nil {
		return err
	}
	w.srv = &server{bin: bin, procs: 2, logPath: filepath.Join(dir, "pgsse.log"), admin: "127.0.0.1:" + admin,
		client: &http.Client{Timeout: 5 * time.Second},
		args: []string{"serve",
			"--database-url", w.db.URL,
			"--listen", w.addr,
			"--admin-listen", "127.0.0.1:" + admin,
			"--hub-socket", w.hubSocket,
			"--procs", "2",
			"--retention", "0", // the run prunes (pruner), with its audit trigger
			"--heartbeat", "5s",
			"--retry", "1s",
			"--max-connections", strconv.Itoa(maxConnections),
			"--hub-worker-buffer", "256KiB", // small enough that a stalled worker meets the ring's policy
			"--pprof",
			"--log-level", "info",
		}}
	w.logf("starting %s %s (log %s)", bin, strings.Join(w.srv.args, " "), w.srv.logPath)
	return w.srv.start(ctx)
}

// The workload's size at Scale 1.
const (
	durableSubs = 24
	multiSubs   = 6
	ephSubs     = 4
	chanSubs    = 4
)

func (w *workload) startClients(ctx context.Context) {
	kinds := []SubKind{Steady, Slow, Flaky, Expiring}
	tagSets := [][]string{nil, {"grp:a"}, {"grp:a", "grp:b"}}
	n := int(float64(durableSubs) * w.cfg.Scale)
	for i := range n {
		stream := w.durable[i%len(w.durable)]
		kind := kinds[(i/len(w.durable))%len(kinds)]
		start := int64(0)
		if i%5 == 4 {
			start = -1 // live only
		}
		name := fmt.Sprintf("sub%02d-%s-%s", i, kind, strings.ReplaceAll(stream, "/", "."))
		w.addSub(ctx, w.newDurableSub(name, kind, []string{stream}, tagSets[i%len(tagSets)], []int64{start}, w.rng(uint64(100+i))))
	}
	if w.multi {
		for i := range int(float64(multiSubs) * w.cfg.Scale) {
			rng := w.rng(uint64(200 + i))
			perm := rng.Perm(len(w.durable))
			k := 2 + rng.IntN(3)
			var streams []string
			var start []int64
			for j := range k {
				streams = append(streams, w.durable[perm[j]])
				if rng.IntN(4) == 0 {
					start = append(start, -1)
				} else {
					start = append(start, 0)
				}
			}
			kind := kinds[i%len(kinds)]
			w.addSub(ctx, w.newDurableSub(fmt.Sprintf("multi%02d-%s-k%d", i, kind, k), kind, streams, tagSets[i%len(tagSets)], start, rng))
		}
	}
	for i := range ephSubs {
		s := &ephSub{w: w, rng: w.rng(uint64(300 + i)), log: &EphLog{Name: fmt.Sprintf("eph%02d", i), Target: w.ephStreams[i%len(w.ephStreams)], Statuses: map[int]int{}}}
		w.addEph(ctx, s)
	}
	for i := range chanSubs {
		s := &ephSub{w: w, rng: w.rng(uint64(400 + i)), log: &EphLog{Name: fmt.Sprintf("chan%02d", i), Target: w.sseChannels[i%len(w.sseChannels)], Channel: true, Statuses: map[int]int{}}}
		w.addEph(ctx, s)
	}
	workers := []struct {
		mode           string
		failover, slow bool
	}{{"lossless", false, false}, {"lossless", false, true}, {"lossless", true, false}, {"wake", false, false}, {"wake", false, true}, {"wake", true, false}}
	for i, k := range workers {
		h := &hubWorker{w: w, rng: w.rng(uint64(500 + i)),
			log: &WorkerLog{Name: fmt.Sprintf("worker%d", i), Mode: k.mode, Failover: k.failover,
				Channels: []string{w.hubChannels[i%len(w.hubChannels)], w.hubChannels[(i+1)%len(w.hubChannels)]}}}
		h.slow.Store(k.slow)
		w.mu.Lock()
		w.workers = append(w.workers, h)
		w.mu.Unlock()
		w.clientWG.Add(1)
		go func() { defer w.clientWG.Done(); h.run(ctx) }()
	}
}

func (w *workload) addSub(ctx context.Context, s *durableSub) {
	ctx, s.cancel = context.WithCancel(ctx)
	w.mu.Lock()
	w.subs = append(w.subs, s)
	w.mu.Unlock()
	w.clientWG.Add(1)
	go func() { defer w.clientWG.Done(); s.run(ctx) }()
}

// churn keeps subscribers coming and going: every few seconds one joins — from cursor 0
// (everything retained), from a recent cursor (which may have been pruned: a gap), or live —
// and, once there are enough of them, the oldest one leaves.
func (w *workload) churn(ctx, clientCtx context.Context) {
	rng := w.rng(700)
	kinds := []SubKind{Steady, Flaky, Slow}
	tagSets := [][]string{nil, {"grp:b"}, {"grp:a", "grp:b"}}
	var mine []*durableSub
	for n := 0; sleepCtx(ctx, time.Duration(2000+rng.IntN(6000))*time.Millisecond) == nil; n++ {
		if len(mine) >= int(8*w.cfg.Scale) {
			old := mine[0]
			mine = mine[1:]
			old.retired.Store(true)
			old.cancel()
		}
		stream := w.durable[rng.IntN(len(w.durable))]
		start := int64(0)
		switch rng.IntN(3) {
		case 0:
			start = -1
		case 1:
			if h := w.headOf(stream); h > 0 {
				start = max(0, h-int64(rng.IntN(800)))
			}
		}
		kind := kinds[rng.IntN(len(kinds))]
		s := w.newDurableSub(fmt.Sprintf("churn%03d-%s-%s-from%d", n, kind, strings.ReplaceAll(stream, "/", "."), start),
			kind, []string{stream}, tagSets[rng.IntN(len(tagSets))], []int64{start}, w.rng(uint64(10000+n)))
		mine = append(mine, s)
		w.addSub(clientCtx, s)
	}
}

// headOf is the furthest any subscriber has read of stream (a recent cursor for churn).
func (w *workload) headOf(stream string) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	h := int64(0)
	for _, s := range w.subs {
		for i, st := range s.log.Streams {
			if st == stream {
				h = max(h, s.progress[i].Load())
			}
		}
	}
	return h
}

func (w *workload) addEph(ctx context.Context, s *ephSub) {
	w.mu.Lock()
	w.ephs = append(w.ephs, s)
	w.mu.Unlock()
	w.clientWG.Add(1)
	go func() { defer w.clientWG.Done(); s.run(ctx) }()
}

func (w *workload) startPublishers(ctx context.Context, wg *sync.WaitGroup) {
	start := func(f func(context.Context)) {
		wg.Add(1)
		go func() { defer wg.Done(); f(ctx) }()
	}
	for range 2 {
		p := &sqlPublisher{publisher: w.newPublisher(12)}
		start(p.run)
	}
	for range 3 {
		p := &httpPublisher{publisher: w.newPublisher(12)}
		start(p.run)
	}
	b := &httpPublisher{publisher: w.newPublisher(4), batch: true}
	start(b.run)
	bh := &httpPublisher{publisher: w.newPublisher(5), ephemeral: true}
	start(bh.run)
	bs := &sqlBroadcaster{publisher: w.newPublisher(5)}
	start(bs.run)
	n := &notifier{publisher: w.newPublisher(25)}
	start(n.run)
	pr := w.rng(900)
	start(func(ctx context.Context) { w.prune(ctx, pr) })
}

// prune runs pgsse.prune every 10–20 s (events older than 5 s, keeping each stream's last
// 300): subscribers that lag behind that get pgsse:gap. The audit trigger keeps what it
// deletes. synchronous_commit is on for it, so the audit survives any crash.
func (w *workload) prune(ctx context.Context, rng *rand.Rand) {
	for sleepCtx(ctx, time.Duration(10000+rng.IntN(10000))*time.Millisecond) == nil {
		w.pruneMu.Lock()
		err := execOn(ctx, w.db.URL, "BEGIN", "SET LOCAL synchronous_commit = on",
			"SELECT pgsse.prune(interval '5 seconds', 300)", "COMMIT")
		w.pruneMu.Unlock()
		if err != nil && ctx.Err() == nil {
			w.logf("prune: %v (retried later)", err)
		}
	}
}

// drain ends the run: faults are over; the server is made whole; publishers stop; every
// subscriber reads at full speed; one last event per stream is published; every subscriber
// must then reach it (it was committed after everything else); the hub settles; clients close.
func (w *workload) drain(ctx context.Context, stopPubs context.CancelFunc, pubWG *sync.WaitGroup, stopClients context.CancelFunc) {
	w.logf("drain: faults stopped")
	w.srv.restartWG.Wait()
	if w.srv.first() == 0 || !w.srv.ready(ctx) {
		w.logf("drain: waiting for the server to serve again")
		deadline := time.Now().Add(90 * time.Second)
		for !w.srv.ready(ctx) && time.Now().Before(deadline) {
			if w.srv.first() == 0 {
				if _, err := w.srv.restart(ctx); err != nil {
					w.logf("drain: restart: %v", err)
				}
			}
			_ = sleepCtx(ctx, 200*time.Millisecond)
		}
	}
	stopPubs()
	pubWG.Wait()
	w.mu.Lock()
	subs := append([]*durableSub(nil), w.subs...)
	workers := append([]*hubWorker(nil), w.workers...)
	w.mu.Unlock()
	for _, s := range subs {
		s.stall.Store(0)
		s.rate.Store(0)
	}
	for _, h := range workers {
		h.stall.Store(0)
		h.slow.Store(false)
	}
	finals, err := w.publishFinal(ctx)
	if err != nil {
		w.fail(FailDrainTimeout, "drain", "the final events could not be published: %v", err)
	}
	w.logf("drain: final events published; waiting for every subscriber to reach them")
	deadline := time.Now().Add(180 * time.Second)
	for {
		var behind []string
		for _, s := range subs {
			if s.retired.Load() {
				continue
			}
			if s.progress[0].Load() < 0 && len(s.log.Streams) == 1 {
				continue // live only and nothing yet: the checker decides what it was owed
			}
			for i, st := range s.log.Streams {
				if got := s.progress[i].Load(); got < finals[st] {
					behind = append(behind, fmt.Sprintf("%s at %d of %s (final %d)", s.log.Name, got, st, finals[st]))
				}
			}
		}
		if len(behind) == 0 {
			break
		}
		if time.Now().After(deadline) {
			for _, b := range behind {
				w.fail(FailDrainTimeout, "drain", "%s", b)
			}
			break
		}
		_ = sleepCtx(ctx, 250*time.Millisecond)
	}
	// The hub's last notifications were committed before the publishers stopped: wait until
	// every worker has read nothing for 3 s (a slow one may still be reading a burst).
	quiet := time.Now().Add(90 * time.Second)
	for time.Now().Before(quiet) {
		last := int64(0)
		for _, h := range workers {
			last = max(last, h.lastItem.Load())
		}
		if time.Since(time.Unix(0, last)) > 3*time.Second {
			break
		}
		_ = sleepCtx(ctx, 250*time.Millisecond)
	}
	for _, h := range workers {
		h.closeAll.Store(true)
	}
	stopClients()
	w.clientWG.Wait()
	w.logf("drain: done")
}

// counterNames are the series Result.Counters shows.
var counterNames = []string{"pgsse_pg_reconnects_total", "pgsse_evictions_total", "pgsse_dropped_total",
	"pgsse_accept_errors_total", "pgsse_rejected_total", "pgsse_proc_restarts_total", "pgsse_replay_reads_total",
	"pgsse_token_verifications_total"}

func (w *workload) counters(ctx context.Context) []string {
	_, body := w.srv.get(ctx, "/metrics")
	var out []string
	for _, ln := range strings.Split(body, "\n") {
		for _, n := range counterNames {
			if strings.HasPrefix(ln, n+" ") || strings.HasPrefix(ln, n+"{") {
				if f := strings.Fields(ln); len(f) == 2 && f[1] != "0" {
					out = append(out, ln)
				}
			}
		}
	}
	return out
}

// publishFinal publishes one event per durable stream, visible to every subscriber, and
// returns their ids.
func (w *workload) publishFinal(ctx context.Context) (map[string]int64, error) {
	p := w.newPublisher(1)
	out := map[string]int64{}
	var last error
	for try := 0; try < 30; try++ {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		conn, err := pgconn.Connect(cctx, w.db.URL)
		if err != nil {
			cancel()
			last = err
			_ = sleepCtx(ctx, time.Second)
			continue
		}
		rec := &PubRecord{Via: "drain"}
		ok := true
		for _, st := range w.durable {
			if _, done := out[st]; done {
				continue
			}
			k := p.next()
			for len(ShapeOf(k).Audience) > 0 || ShapeOf(k).Event != "" {
				k = p.next()
			}
			rec.Sent = w.now()
			r := conn.ExecParams(cctx, "SELECT pgsse.publish($1, $2)", [][]byte{[]byte(st), []byte(DurableData(st, k))}, nil, nil, nil).Read()
			if r.Err != nil || len(r.Rows) != 1 {
				last, ok = r.Err, false
				w.addPub(&PubRecord{Via: "drain", Events: []PubEvent{{Stream: st, Key: k}}, Outcome: Unknown, Sent: rec.Sent, Detail: fmt.Sprint(r.Err)})
				break
			}
			id, _ := strconv.ParseInt(string(r.Rows[0][0]), 10, 64)
			out[st] = id
			w.addPub(&PubRecord{Via: "drain", Events: []PubEvent{{Stream: st, Key: k, ID: id}}, Outcome: Committed, Sent: rec.Sent, Acked: w.now()})
		}
		conn.Close(context.Background())
		cancel()
		if ok {
			return out, nil
		}
		_ = sleepCtx(ctx, time.Second)
	}
	return out, last
}

// record gathers every log and reads the table.
func (w *workload) record(ctx context.Context) (*Record, error) {
	rec := &Record{Pubs: w.pubs, Crashes: w.crashes, RunEnd: w.now()}
	for _, s := range w.subs {
		s.log.Retired = s.retired.Load()
		rec.Subs = append(rec.Subs, s.log)
	}
	for _, e := range w.ephs {
		rec.Ephs = append(rec.Ephs, e.log)
	}
	for _, h := range w.workers {
		rec.Workers = append(rec.Workers, h.log)
	}
	var err error
	for try := 0; try < 20; try++ {
		if rec.Table, err = readTable(ctx, w.db.URL); err == nil {
			return rec, nil
		}
		_ = sleepCtx(ctx, time.Second)
	}
	return nil, fmt.Errorf("reading the table: %w", err)
}

func readTable(ctx context.Context, dsn string) ([]Row, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	conn, err := pgconn.Connect(cctx, dsn)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	rr := conn.ExecParams(cctx, `
SELECT stream, id, coalesce(event, ''), data, coalesce(audience, '{}')::text, false FROM pgsse.events
UNION ALL
SELECT stream, id, coalesce(event, ''), data, coalesce(audience, '{}')::text, true FROM chaos_pruned`, nil, nil, nil, nil)
	var rows []Row
	intern := map[string]string{}
	for rr.NextRow() {
		v := rr.Values()
		stream := string(v[0])
		if s, ok := intern[stream]; ok {
			stream = s
		} else {
			intern[stream] = stream
		}
		id, _ := strconv.ParseInt(string(v[1]), 10, 64)
		var aud []string
		if a := strings.Trim(string(v[4]), "{}"); a != "" {
			aud = strings.Split(a, ",")
		}
		rows = append(rows, ReadRow(stream, id, string(v[2]), string(v[3]), aud, string(v[5]) == "t"))
	}
	if _, err := rr.Close(); err != nil {
		return nil, err
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].Stream != rows[j].Stream {
			return rows[i].Stream < rows[j].Stream
		}
		return rows[i].ID < rows[j].ID
	})
	return rows, nil
}
