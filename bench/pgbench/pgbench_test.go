package pgbench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/store"
)

// Rounds and seconds per run; PGSSE_PGBENCH_ROUNDS and PGSSE_PGBENCH_SECONDS override.
const (
	defaultRounds  = 7
	defaultSeconds = 2
)

var latencyRE = regexp.MustCompile(`latency average = ([0-9.]+) ms`)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkPublishVsPlainSQL runs the three scripts in interleaved rounds and reports
// their median latency (µs/call) and the ratios. b.N is ignored: one measurement per run.
func BenchmarkPublishVsPlainSQL(b *testing.B) {
	bin, err := exec.Command(pgtest.Script(), "bindir").Output()
	if err != nil {
		b.Fatalf("find PostgreSQL binaries: %v", err)
	}
	pgbench := filepath.Join(strings.TrimSpace(string(bin)), "pgbench")
	dsn := pgtest.NewDatabase(b)
	ctx := context.Background()
	conn, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	_, _, err = store.Migrate(ctx, conn)
	conn.Close(ctx)
	if err != nil {
		b.Fatal(err)
	}
	rounds, seconds := envInt("PGSSE_PGBENCH_ROUNDS", defaultRounds), envInt("PGSSE_PGBENCH_SECONDS", defaultSeconds)
	scripts := []string{"publish", "plain", "plain1"}
	lat := map[string][]float64{}
	run := func(script string, secs int) float64 {
		cmd := exec.Command(pgbench, "-n", "-c1", "-M", "prepared", "-T", strconv.Itoa(secs), "-f", script+".sql", dsn)
		out, err := cmd.CombinedOutput()
		m := latencyRE.FindSubmatch(out)
		if err != nil || m == nil {
			b.Fatalf("pgbench %s: %v\n%s", script, err, out)
		}
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		return v
	}
	for _, s := range scripts {
		run(s, 1) // warm up: streams exist, plans cached
	}
	b.ResetTimer()
	start := time.Now()
	for range rounds {
		for _, s := range scripts {
			lat[s] = append(lat[s], run(s, seconds))
		}
	}
	median := func(s string) float64 {
		v := slices.Clone(lat[s])
		slices.Sort(v)
		return v[len(v)/2]
	}
	for _, s := range scripts {
		b.ReportMetric(median(s)*1000, s+"-µs/call")
		b.Logf("%s: median %.3f ms of %v", s, median(s), lat[s])
	}
	b.ReportMetric(median("publish")/median("plain"), "publish/plain")
	b.ReportMetric(median("publish")/median("plain1"), "publish/plain1")
	b.ReportMetric(time.Since(start).Seconds(), "s-total")
}
