//go:build linux

package chaos

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// The soak (--soak): the same workload and churn with no faults, and every SampleEvery a
// sample of what could leak — per process and summed over the process tree: RSS, the Go heap
// live after the last GC, goroutines, open descriptors; and PostgreSQL's backends on the run's database and the
// NOTIFY queue's usage.
//
// The growth rule, per series: take the samples of the second half of the run (the first
// half is warm-up: caches, pools and the table's working set fill), fit a least-squares line,
// and project its slope over the whole run. The series grew if that projection exceeds both
// GrowthFraction of the series' mean over the second half and the series' absolute
// threshold (Thresholds: noise that a flat series shows on this machine). Needs at least 6
// samples in the second half.

// Series sampled by the soak.
const (
	SeriesRSS        = "RSS (bytes)"
	SeriesHeap       = "Go heap live after the last GC (bytes)"
	SeriesGoroutines = "goroutines"
	SeriesFDs        = "descriptors"
	SeriesBackends   = "PostgreSQL backends"
	SeriesNotify     = "NOTIFY queue usage"
)

// GrowthFraction is the growth, relative to the mean, a projected slope must exceed.
const GrowthFraction = 0.10

// Thresholds are the absolute growth over the run a projected slope must also exceed.
var Thresholds = map[string]float64{
	SeriesRSS:        16 << 20,
	SeriesHeap:       8 << 20,
	SeriesGoroutines: 10,
	SeriesFDs:        10,
	SeriesBackends:   2,
	SeriesNotify:     0.001,
}

// SoakSeries lists the series in the order reports show them.
var SoakSeries = []string{SeriesRSS, SeriesHeap, SeriesGoroutines, SeriesFDs, SeriesBackends, SeriesNotify}

// Sample is one moment of the soak.
type Sample struct {
	At     time.Duration
	Values map[string]float64 // summed over the processes
	Procs  int                // processes sampled
	Detail string             // what could not be read
}

// Growth is one series' verdict.
type Growth struct {
	Series     string
	Mean       float64 // over the second half
	Slope      float64 // per second, least squares over the second half
	Projected  float64 // Slope × the run's duration
	Limit      float64 // max(GrowthFraction × Mean, the threshold)
	Grew       bool
	First, End float64 // the second half's first and last sample
}

// SoakResult is the soak's samples and verdicts.
type SoakResult struct {
	Samples  []Sample
	Growth   []Growth
	Duration time.Duration
	Problem  string // not enough samples
}

// OK reports whether no series grew.
func (s *SoakResult) OK() bool {
	if s.Problem != "" {
		return false
	}
	for _, g := range s.Growth {
		if g.Grew {
			return false
		}
	}
	return true
}

type soakSampler struct {
	w       *workload
	samples []Sample
	t0      time.Duration
}

func (w *workload) newSoakSampler() *soakSampler { return &soakSampler{w: w, t0: w.now()} }

func (s *soakSampler) run(ctx context.Context) {
	t := time.NewTicker(s.w.cfg.SampleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			smp := s.sample(ctx)
			s.samples = append(s.samples, smp)
			s.w.logf("soak: rss %.1f MiB, heap %.1f MiB, goroutines %.0f, fds %.0f, backends %.0f, notify queue %.4f%s",
				smp.Values[SeriesRSS]/(1<<20), smp.Values[SeriesHeap]/(1<<20), smp.Values[SeriesGoroutines],
				smp.Values[SeriesFDs], smp.Values[SeriesBackends], smp.Values[SeriesNotify], detailSuffix(smp.Detail))
		}
	}
}

func detailSuffix(d string) string {
	if d == "" {
		return ""
	}
	return " (" + d + ")"
}

func (s *soakSampler) sample(ctx context.Context) Sample {
	smp := Sample{At: s.w.now(), Values: map[string]float64{}}
	var missing []string
	first := s.w.srv.first()
	pids := append([]int{first}, s.w.srv.siblings()...)
	for i, pid := range pids {
		if pid == 0 {
			missing = append(missing, "first process not running")
			continue
		}
		smp.Procs++
		if rss, err := procRSS(pid); err == nil {
			smp.Values[SeriesRSS] += float64(rss)
		} else {
			missing = append(missing, fmt.Sprintf("rss of %d", pid))
		}
		if ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd"); err == nil {
			smp.Values[SeriesFDs] += float64(len(ents))
		}
		var body string
		if i == 0 {
			_, body = s.w.srv.get(ctx, "/metrics")
		} else {
			body = siblingMetrics(ctx, pid)
		}
		heap, gor := liveHeap(body), metricValue(body, "go_goroutines")
		if heap < 0 || gor < 0 {
			missing = append(missing, fmt.Sprintf("go metrics of %d", pid))
		} else {
			smp.Values[SeriesHeap] += heap
			smp.Values[SeriesGoroutines] += gor
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if conn, err := pgconn.Connect(cctx, s.w.cl.admin); err == nil {
		r := conn.ExecParams(cctx, `SELECT (SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name LIKE 'pgsse%'),
			pg_notification_queue_usage()`, [][]byte{[]byte(s.w.db.Name)}, nil, nil, nil).Read()
		if r.Err == nil && len(r.Rows) == 1 {
			b, _ := strconv.ParseFloat(string(r.Rows[0][0]), 64)
			q, _ := strconv.ParseFloat(string(r.Rows[0][1]), 64)
			smp.Values[SeriesBackends], smp.Values[SeriesNotify] = b, q
		}
		conn.Close(context.Background())
	} else {
		missing = append(missing, "PostgreSQL")
	}
	smp.Detail = strings.Join(missing, ", ")
	return smp
}

// liveHeap is the Go heap that survived the last GC, from the heap goal the runtime set then
// (go_memstats_next_gc_bytes = live × (1 + GOGC/100)), or -1. The heap in use
// (go_memstats_heap_inuse_bytes) also holds the garbage of the current cycle, so a sample
// lands anywhere between the live heap and the goal: a swing of up to GOGC % that the slope
// would read as growth or shrinkage depending on where samples fall.
func liveHeap(metrics string) float64 {
	goal, gogc := metricValue(metrics, "go_memstats_next_gc_bytes"), metricValue(metrics, "go_gc_gogc_percent")
	if goal < 0 || gogc < 0 {
		return -1
	}
	return goal / (1 + gogc/100)
}

// siblingMetrics reads a sibling's own /metrics from the private socket its first process
// gave it (named in its environment): the first process's /metrics sums only pgsse_ series.
func siblingMetrics(ctx context.Context, pid int) string {
	env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return ""
	}
	var sock string
	for _, kv := range strings.Split(string(env), "\x00") {
		if v, ok := strings.CutPrefix(kv, "PGSSE_INTERNAL_SIBLING="); ok {
			if _, rest, ok := strings.Cut(v, `"metrics":"`); ok {
				sock, _, _ = strings.Cut(rest, `"`)
			}
		}
	}
	if sock == "" {
		return ""
	}
	c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
	defer c.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://sibling/metrics", nil)
	resp, err := c.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return string(b)
}

func procRSS(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, ln := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(ln, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) == 2 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				return kb << 10, err
			}
		}
	}
	return 0, fmt.Errorf("no VmRSS for %d", pid)
}

func (s *soakSampler) verdict() *SoakResult {
	return SoakVerdict(s.samples, s.w.cfg.Duration)
}

// SoakVerdict applies the growth rule to samples of a run of duration d.
func SoakVerdict(samples []Sample, d time.Duration) *SoakResult {
	res := &SoakResult{Samples: samples, Duration: d}
	if len(samples) == 0 {
		res.Problem = "no samples"
		return res
	}
	half := samples[0].At + (samples[len(samples)-1].At-samples[0].At)/2
	var second []Sample
	for _, s := range samples {
		if s.At >= half {
			second = append(second, s)
		}
	}
	if len(second) < 6 {
		res.Problem = fmt.Sprintf("%d samples in the second half; the rule needs 6 (run longer or sample more often)", len(second))
		return res
	}
	for _, name := range SoakSeries {
		xs := make([]float64, len(second))
		ys := make([]float64, len(second))
		for i, s := range second {
			xs[i], ys[i] = s.At.Seconds(), s.Values[name]
		}
		slope, mean := leastSquares(xs, ys)
		g := Growth{Series: name, Mean: mean, Slope: slope, Projected: slope * d.Seconds(),
			First: ys[0], End: ys[len(ys)-1]}
		g.Limit = max(GrowthFraction*mean, Thresholds[name])
		g.Grew = g.Projected > g.Limit
		res.Growth = append(res.Growth, g)
	}
	return res
}

// leastSquares fits y = a + b·x and returns b and the mean of y.
func leastSquares(xs, ys []float64) (slope, mean float64) {
	n := float64(len(xs))
	var sx, sy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
	}
	mx, my := sx/n, sy/n
	var num, den float64
	for i := range xs {
		num += (xs[i] - mx) * (ys[i] - my)
		den += (xs[i] - mx) * (xs[i] - mx)
	}
	if den == 0 {
		return 0, my
	}
	return num / den, my
}
