//go:build linux

// Command storm runs the reconnect-storm scenario (issue 11) against two pgsse builds in one
// invocation — this tree and another (main's code, for the ratio) — and prints a Markdown table:
//
//	git worktree add /tmp/pgsse-main main
//	go run ./bench/cmd/storm --other-root /tmp/pgsse-main          # 5,000 + 10,000, ES256
//	go run ./bench/cmd/storm --other-root /tmp/pgsse-main --scale small
//	go run ./bench/cmd/storm --other-root /tmp/pgsse-main --scale quiet --runs 3   # issue 24: 500 + 2,000
//
// Each run: Subs subscribers receive events at Rate; after Before, Conns connections with
// distinct ES256 tokens are opened at once. Reported: the subscribers' per-delivery latency
// before and during the storm, the time until every new connection has its response, and
// one ES256 verification measured in the same run (the goals of issue 11). --runs alternates
// the two builds that many times. PostgreSQL: --database-url, else a throwaway cluster.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"

	"github.com/pgsse/pgsse/bench"
)

func main() {
	log.SetFlags(log.Ltime)
	var (
		dbURL     = flag.String("database-url", os.Getenv("PGSSE_TEST_DATABASE_URL"), "superuser DSN of a PostgreSQL cluster (default: a throwaway one via --pg-script)")
		pgScript  = flag.String("pg-script", "scripts/pg.sh", "script that starts a throwaway cluster")
		root      = flag.String("root", ".", "this tree, built as the first server")
		otherRoot = flag.String("other-root", "", "another tree (e.g. a worktree of main), built as the second server; empty = only this tree")
		otherName = flag.String("other-name", "main", "how the table names the second server")
		scale     = flag.String("scale", "full", "full (issue 11: 5,000 + 10,000), quiet (issue 24: 500 + 2,000) or small (seconds)")
		runs      = flag.Int("runs", 1, "runs per server, alternating")
		out       = flag.String("out", "", "also write the table to this file")
		profDir   = flag.String("profile-dir", "", "write a CPU profile of each server (10 s from the storm's start) here")
	)
	sp := bench.FullStorm()
	flag.IntVar(&sp.Subs, "subs", sp.Subs, "subscribers receiving events")
	flag.IntVar(&sp.Conns, "conns", sp.Conns, "connections opened at once")
	flag.Float64Var(&sp.Rate, "rate", sp.Rate, "events per second")
	flag.Parse()
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch *scale {
	case "full":
	case "quiet":
		q := bench.QuietStorm()
		if !set["subs"] {
			sp.Subs = q.Subs
		}
		if !set["conns"] {
			sp.Conns = q.Conns
		}
		sp.Timeout = q.Timeout
	case "small":
		small := bench.SmallStorm()
		if !set["subs"] {
			sp.Subs = small.Subs
		}
		if !set["conns"] {
			sp.Conns = small.Conns
		}
		sp.Before, sp.After = small.Before, small.After
	default:
		log.Fatalf("storm: --scale %q: want full, quiet or small", *scale)
	}
	if limit := bench.RaiseFDLimit(); uint64(sp.Subs+sp.Conns+200) > limit {
		log.Fatalf("storm: %d subscribers + %d connections need more descriptors than RLIMIT_NOFILE %d", sp.Subs, sp.Conns, limit)
	}

	ctx := context.Background()
	dir, err := os.MkdirTemp("", "pgsse-storm.")
	if err != nil {
		log.Fatal(err)
	}
	targets := []bench.Target{}
	for _, tr := range []struct{ root, label string }{{*root, "pgsse"}, {*otherRoot, *otherName}} {
		if tr.root == "" {
			continue
		}
		bdir := filepath.Join(dir, tr.label)
		if err := os.MkdirAll(bdir, 0o755); err != nil {
			log.Fatal(err)
		}
		bin, _, err := bench.Build(ctx, tr.root, bdir)
		if err != nil {
			log.Fatal(err)
		}
		targets = append(targets, bench.Target{Name: "pgsse", Bin: bin, Label: tr.label})
	}
	var cluster *bench.Cluster
	if *dbURL != "" {
		cluster = bench.UseCluster(*dbURL)
	} else {
		log.Printf("storm: starting a throwaway PostgreSQL")
		if cluster, err = bench.StartCluster(ctx, *pgScript); err != nil {
			log.Fatal(err)
		}
	}
	defer cluster.Stop()
	env := &bench.Env{Cluster: cluster, Dir: dir, ProfileDir: *profDir, Logf: log.Printf}
	load := bench.LoadAvg()
	var results []*bench.Result
	for run := 0; run < *runs; run++ {
		for _, t := range targets {
			log.Printf("storm: run %d against %s (load average %s)", run+1, t.Label, bench.LoadAvg())
			r, err := bench.Storm(ctx, env, t, sp)
			if err != nil {
				log.Fatalf("storm: %s: %v", t.Label, err)
			}
			for _, m := range r.Metrics {
				log.Printf("  %-70s %12s %s", m.Name, bench.FormatValue(m.Value), m.Unit)
			}
			for _, n := range r.Notes {
				log.Printf("  %s", n)
			}
			results = append(results, r)
		}
	}
	var names []string
	for _, t := range targets {
		names = append(names, t.Label)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "storm: %d subscribers at %.0f events/s, %d ES256 connections at once; %d run(s) per server, means; load average %s at start, %s at end\n\n",
		sp.Subs, sp.Rate, sp.Conns, *runs, load, bench.LoadAvg())
	bench.WriteTable(&b, names, mean(results))
	fmt.Print(b.String())
	if *out != "" {
		if err := os.WriteFile(*out, []byte(b.String()), 0o644); err != nil {
			log.Fatal(err)
		}
	}
}

// mean averages each metric over the runs of each server (notes are kept).
func mean(results []*bench.Result) []*bench.Result {
	byTarget := map[string]*bench.Result{}
	counts := map[string]int{}
	var out []*bench.Result
	for _, r := range results {
		m, ok := byTarget[r.Target]
		if !ok {
			m = &bench.Result{Scenario: r.Scenario, Target: r.Target, Metrics: append([]bench.Metric(nil), r.Metrics...)}
			byTarget[r.Target] = m
			out = append(out, m)
		} else {
			for i := range m.Metrics {
				m.Metrics[i].Value += r.Get(m.Metrics[i].Name)
			}
		}
		m.Notes = append(m.Notes, r.Notes...)
		counts[r.Target]++
	}
	for t, m := range byTarget {
		for i := range m.Metrics {
			m.Metrics[i].Value /= float64(counts[t])
		}
	}
	return out
}
