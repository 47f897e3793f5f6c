//go:build linux

package bench

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

// The scenario benchmarks: each op is one complete run of the scenario against a fresh server
// process and database, reported as custom metrics (go test -bench prints them per op; with
// several ops they are averaged). Small scale unless PGSSE_BENCH_FULL=1:
//
//	go test -run '^$' -bench . ./bench/                                        # seconds
//	PGSSE_BENCH_FULL=1 go test -run '^$' -bench . -benchtime 1x -timeout 30m ./bench/

var (
	buildOnce sync.Once
	buildDir  string
	pgsseBin  string
	baseBin   string
	buildErr  error
)

func servers(b testing.TB) []Target {
	b.Helper()
	buildOnce.Do(func() {
		if buildDir, buildErr = os.MkdirTemp("", "pgsse-bench-bin."); buildErr != nil {
			return
		}
		pgsseBin, baseBin, buildErr = Build(context.Background(), "..", buildDir)
	})
	require.NoError(b, buildErr)
	return []Target{{Name: "pgsse", Bin: pgsseBin}, {Name: "baseline", Bin: baseBin}}
}

func params() Params {
	if os.Getenv("PGSSE_BENCH_FULL") == "1" {
		return Full()
	}
	return Small()
}

func runScenario(b *testing.B, id int) {
	targets := servers(b)
	env := &Env{Cluster: UseCluster(pgtest.URL(b)), Dir: b.TempDir(), Logf: b.Logf}
	p := params()
	for _, t := range targets {
		b.Run(t.Name, func(b *testing.B) {
			reportMeans(b, false, func() []*Result {
				r, err := Scenario(context.Background(), env, t, p, id)
				require.NoError(b, err)
				return []*Result{r}
			})
		})
	}
}

// reportMeans runs a scenario b.N times and reports each metric's mean (named after its
// target too with byTarget, for runs that measure several) and logs the notes.
func reportMeans(b *testing.B, byTarget bool, run func() []*Result) {
	sums := map[string]float64{}
	var order []string
	for range b.N {
		for _, r := range run() {
			for _, m := range r.Metrics {
				u := metricUnit(m)
				if byTarget {
					u = strings.ReplaceAll(r.Target, " ", "") + "-" + u
				}
				if _, ok := sums[u]; !ok {
					order = append(order, u)
				}
				sums[u] += m.Value
			}
			for _, n := range r.Notes {
				b.Logf("%s: %s", r.Target, n)
			}
		}
	}
	for _, u := range order {
		b.ReportMetric(sums[u]/float64(b.N), u)
	}
}

// metricUnit turns "time to last subscriber p99" in ms into "time-to-last-subscriber-p99-ms".
func metricUnit(m Metric) string {
	s := strings.ToLower(m.Name + " " + m.Unit)
	s = strings.NewReplacer("→", "-to-", "µs", "us", "%", "pct", "(", "", ")", "").Replace(s)
	var b strings.Builder
	dash := false
	for _, r := range s {
		if unicode.IsLetter(r) || unicode.IsDigit(r) || r == '/' {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.TrimSuffix(b.String(), "-")
}

func BenchmarkScenario1Idle(b *testing.B)       { runScenario(b, 1) }
func BenchmarkScenario2Latency(b *testing.B)    { runScenario(b, 2) }
func BenchmarkScenario3FanOut(b *testing.B)     { runScenario(b, 3) }
func BenchmarkScenario4Throughput(b *testing.B) { runScenario(b, 4) }
func BenchmarkScenario6Isolation(b *testing.B)  { runScenario(b, 6) }

// BenchmarkScenario9Publish reports publishing over HTTP (pgsse) and pgsse.publish over SQL
// (baseline), measured on one server in one run.
func BenchmarkScenario9Publish(b *testing.B) {
	runPaired(b, func(env *Env, t Target, p Params) ([]*Result, error) {
		return Publish(context.Background(), env, t, p.Publish, p)
	})
}

// BenchmarkScenario5Hub reports the hub phase (pgsse) and the direct-LISTEN phase (baseline)
// of each run.
func BenchmarkScenario5Hub(b *testing.B) {
	runPaired(b, func(env *Env, t Target, p Params) ([]*Result, error) {
		return HubLoad(context.Background(), env, t, p, p.Hub)
	})
}

// runPaired runs a scenario that measures pgsse against its own baseline in one run, and
// reports both results' metrics prefixed with their target.
func runPaired(b *testing.B, scenario func(*Env, Target, Params) ([]*Result, error)) {
	targets := servers(b)
	env := &Env{Cluster: UseCluster(pgtest.URL(b)), Dir: b.TempDir(), Logf: b.Logf}
	p := params()
	reportMeans(b, true, func() []*Result {
		rs, err := scenario(env, targets[0], p)
		require.NoError(b, err)
		return rs
	})
}

// BenchmarkScenario11MultiStream reports connections that follow several streams each
// (GET /streams) against connections that follow one, measured on one server in one run.
func BenchmarkScenario11MultiStream(b *testing.B) {
	runPaired(b, func(env *Env, t Target, p Params) ([]*Result, error) {
		return MultiStream(context.Background(), env, t, p)
	})
}

// BenchmarkScenarioStorm runs the reconnect storm (issue 11) against this build's pgsse:
// SmallStorm, issue 24's QuietStorm with PGSSE_BENCH_STORM=quiet, FullStorm with
// PGSSE_BENCH_FULL=1; bench/cmd/storm compares two builds in one run.
func BenchmarkScenarioStorm(b *testing.B) {
	targets := servers(b)
	env := &Env{Cluster: UseCluster(pgtest.URL(b)), Dir: b.TempDir(), Logf: b.Logf}
	sp := SmallStorm()
	switch {
	case os.Getenv("PGSSE_BENCH_FULL") == "1":
		sp = FullStorm()
	case os.Getenv("PGSSE_BENCH_STORM") == "quiet":
		sp = QuietStorm()
	}
	reportMeans(b, false, func() []*Result {
		r, err := Storm(context.Background(), env, targets[0], sp)
		require.NoError(b, err)
		return []*Result{r}
	})
}

// holdEnv makes the test binary a holder process of scenario 10: "ADDR N SOURCES".
const holdEnv = "PGSSE_BENCH_HOLD"

func holdFromEnv(spec string) int {
	var addr string
	var n, sources int
	if _, err := fmt.Sscan(spec, &addr, &n, &sources); err != nil {
		fmt.Fprintln(os.Stderr, holdEnv+":", err)
		return 2
	}
	ap, err := netip.ParseAddrPort(addr)
	if err == nil {
		err = HoldMain(ap, "/streams/idle", n, sources)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "holder:", err)
		return 1
	}
	return 0
}

// BenchmarkScenario10Procs is scenario 10 (--procs): idle connections through one port held by
// holder processes (this test binary again), then the fan-out with --procs 1 and 2.
func BenchmarkScenario10Procs(b *testing.B) {
	t := servers(b)[0]
	env := &Env{Cluster: UseCluster(pgtest.URL(b)), Dir: b.TempDir(), Logf: b.Logf}
	p := params()
	holder := func(addr netip.AddrPort, n, sources int) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %d", holdEnv, addr, n, sources))
		return cmd
	}
	sums := map[string]float64{}
	var order []string
	for range b.N {
		idle, err := ProcsIdle(context.Background(), env, t, p, holder)
		require.NoError(b, err)
		fan, err := ProcsFanOut(context.Background(), env, t, p)
		require.NoError(b, err)
		for _, r := range append([]*Result{idle}, fan...) {
			for _, m := range r.Metrics {
				u := strings.ReplaceAll(r.Target, " ", "") + "-" + metricUnit(m)
				if _, ok := sums[u]; !ok {
					order = append(order, u)
				}
				sums[u] += m.Value
			}
		}
	}
	for _, u := range order {
		b.ReportMetric(sums[u]/float64(b.N), u)
	}
}
