//go:build linux

package chaos

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// Repro is the one-line command that runs cfg again.
func Repro(cfg Config) string {
	cfg.defaults()
	var b strings.Builder
	fmt.Fprintf(&b, "go run ./bench/cmd/chaos --duration %s --seed %d", cfg.Duration, cfg.Seed)
	if cfg.Soak {
		b.WriteString(" --soak")
	} else if len(cfg.Faults) == 0 {
		b.WriteString(" --faults none")
	} else if strings.Join(cfg.Faults, ",") != strings.Join(DefaultFaults, ",") {
		fmt.Fprintf(&b, " --faults %s", strings.Join(cfg.Faults, ","))
	}
	if cfg.FaultEvery != 6e9 {
		fmt.Fprintf(&b, " --fault-every %s", cfg.FaultEvery)
	}
	if cfg.Scale != 1 {
		fmt.Fprintf(&b, " --scale %g", cfg.Scale)
	}
	if cfg.Multi != "auto" {
		fmt.Fprintf(&b, " --multi %s", cfg.Multi)
	}
	if cfg.Handoff != "auto" {
		fmt.Fprintf(&b, " --handoff %s", cfg.Handoff)
	}
	return b.String()
}

// Print writes the result: faults by kind, what was checked, the verdict and, on failure,
// every failure (up to a few per class) and the reproduction.
func (r *Result) Print(w io.Writer, cfg Config) {
	fmt.Fprintf(w, "\n== chaos result: seed %d, %s of workload, %s in all\n", r.Seed, cfg.Duration, r.Elapsed.Round(1e9))
	if len(r.Features) > 0 {
		fmt.Fprintf(w, "server supports: %s\n", strings.Join(r.Features, ", "))
	}
	if !cfg.Soak {
		fmt.Fprintf(w, "faults injected (kind: count):\n")
		total := 0
		for _, k := range AllFaults() {
			if n, ok := r.Faults[k]; ok || contains(cfg.Faults, k) {
				skip := ""
				if s := r.Skipped[k]; s > 0 {
					skip = fmt.Sprintf(" (drawn %d more times when not applicable)", s)
				}
				fmt.Fprintf(w, "  %-15s %4d%s\n", k, n, skip)
				total += n
			}
		}
		fmt.Fprintf(w, "  %-15s %4d\n", "total", total)
	}
	fmt.Fprintf(w, "checked:\n")
	var names []string
	for k := range r.Report.Stats {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(w, "  %-70s %d\n", k, r.Report.Stats[k])
	}
	if len(r.Counters) > 0 {
		fmt.Fprintf(w, "server counters at the end (the first process and its siblings, since the first process's last start):\n")
		for _, c := range r.Counters {
			fmt.Fprintf(w, "  %s\n", c)
		}
	}
	if r.Soak != nil {
		r.Soak.Print(w)
	}
	if r.OK() {
		fmt.Fprintf(w, "PASS: no durable delivery lost, duplicated or out of order; no lossless hub notification missing without a RESYNC; every publish's outcome as answered")
		if r.Soak != nil {
			fmt.Fprintf(w, "; nothing grew")
		}
		fmt.Fprintln(w)
		return
	}
	fmt.Fprintf(w, "FAIL: %d failures\n", r.Report.FailureCount())
	var classes []string
	for c := range r.Report.Counts {
		classes = append(classes, c)
	}
	sort.Strings(classes)
	for _, c := range classes {
		fmt.Fprintf(w, "  %s: %d\n", c, r.Report.Counts[c])
	}
	for _, f := range r.Report.Failures {
		fmt.Fprintf(w, "  [%s] %s: %s\n", f.Class, f.Who, f.Detail)
	}
	fmt.Fprintf(w, "logs: %s (pgsse.log, pg-server.log)\n", r.Dir)
	fmt.Fprintf(w, "seed %d; reproduce: %s\n", r.Seed, Repro(cfg))
}

// Print writes the soak's samples and verdicts.
func (s *SoakResult) Print(w io.Writer) {
	fmt.Fprintf(w, "soak samples (summed over the processes):\n  %8s %10s %10s %10s %6s %8s %10s\n", "t", "RSS MiB", "live heap", "goroutines", "fds", "backends", "notify q")
	for _, smp := range s.Samples {
		v := smp.Values
		fmt.Fprintf(w, "  %7.0fs %10.1f %10.1f %10.0f %6.0f %8.0f %10.5f%s\n", smp.At.Seconds(), v[SeriesRSS]/(1<<20), v[SeriesHeap]/(1<<20),
			v[SeriesGoroutines], v[SeriesFDs], v[SeriesBackends], v[SeriesNotify], detailSuffix(smp.Detail))
	}
	if s.Problem != "" {
		fmt.Fprintf(w, "soak: %s\n", s.Problem)
		return
	}
	fmt.Fprintf(w, "growth over the second half (least squares, projected over %s; grows if above max(%.0f%% of the mean, threshold)):\n", s.Duration, 100*GrowthFraction)
	for _, g := range s.Growth {
		verdict := "flat"
		if g.Grew {
			verdict = "GREW"
		}
		fmt.Fprintf(w, "  %-24s mean %12.4g  slope %10.4g/s  projected %12.4g  limit %12.4g  %s\n", g.Series, g.Mean, g.Slope, g.Projected, g.Limit, verdict)
	}
}
