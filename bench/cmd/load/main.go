//go:build linux

// Command load runs pgsse's benchmark scenarios (issue 7) against `pgsse serve` and the
// baseline (bench/baseline) in one invocation and prints a Markdown table with the ratio
// pgsse/baseline. Run it from the repository root:
//
//	go run ./bench/cmd/load                      # full scale, every scenario, both servers
//	go run ./bench/cmd/load --scale small        # seconds
//	go run ./bench/cmd/load --scenarios 3,4 --profile-dir /tmp/prof
//	go run ./bench/cmd/load --scenarios 4,7,8 --servers pgsse,pgsse-old --pgsse-old-bin /tmp/pgsse-main \
//	    --conns 10000 --outbound-budget 64MiB     # memory against the budget, before/after
//	go run ./bench/cmd/load --scenarios 9         # publishing: HTTP (group commit) vs pgsse.publish
//	go run ./bench/cmd/load --scenarios 10        # --procs: 30,000 connections, fan-out with 1 and 2 processes
//	go run ./bench/cmd/load --scenarios 11        # 10,000 connections following 8 streams each against 10,000 following one
//	go run ./bench/cmd/load --scenarios 14        # idle RSS per connection: pgsse (1 and 8 streams) against the floor, bench/gnetrelay
//	go run ./bench/cmd/load --scenarios 15        # 100,000 connections to --procs 7, and 15,000 to one process
//	go run ./bench/cmd/load --scenarios 16        # 10,000 subscribers: 2 and 64 closed-loop publishers over HTTP against the same over SQL
//	go run ./bench/cmd/load --scenarios 17        # deploy: 15,000 subscribers, SIGTERM + restart against SIGUSR2 (--deploy-procs 2: 30,000)
//	go run ./bench/cmd/load --scenarios 12,13     # presence: 10,000 joining and leaving one stream (on and off); 100 streams × 1,000 subjects held
//
// PostgreSQL: --database-url (a superuser DSN; default $PGSSE_TEST_DATABASE_URL), else a
// throwaway cluster started with scripts/pg.sh and stopped at exit. Each scenario and server
// gets a fresh database and a fresh server process, stopped before the next one starts.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pgsse/pgsse/bench"
)

func main() {
	log.SetFlags(log.Ltime)
	var (
		dbURL      = flag.String("database-url", os.Getenv("PGSSE_TEST_DATABASE_URL"), "superuser DSN of a PostgreSQL cluster (default: a throwaway one via --pg-script)")
		pgScript   = flag.String("pg-script", "scripts/pg.sh", "script that starts a throwaway cluster")
		root       = flag.String("root", ".", "module root, for building the servers")
		pgsseBin   = flag.String("pgsse-bin", "", "pgsse binary (default: go build ./cmd/pgsse)")
		baseBin    = flag.String("baseline-bin", "", "baseline binary (default: go build ./bench/baseline)")
		oldBin     = flag.String("pgsse-old-bin", "", "an older pgsse build (server pgsse-old), e.g. main's, for before/after")
		servers    = flag.String("servers", "pgsse,baseline", "servers to compare, in table order: pgsse, baseline, pgsse-old")
		scenarios  = flag.String("scenarios", "1,2,3,4,5,6,9", "scenarios to run (7 stalled and 8 large event: pgsse builds only; 9 publishing and 16 publishers under fan-out measure their own baseline; 10 --procs and 11 streams per connection: pgsse against itself)")
		budget     = flag.String("outbound-budget", "", "pgsse --max-outbound-memory in 4, 7, 8 (e.g. 64MiB; default: the server's)")
		scale      = flag.String("scale", "full", "full (issue 7) or small (seconds)")
		profileDir = flag.String("profile-dir", "", "write CPU profiles of the servers under 3, 4, 6, 12 and 16 here")
		out        = flag.String("out", "", "also write the table to this file")
		hold       = flag.String("hold", "", "internal (scenario 10): hold --hold-conns idle subscribers of this address until stdin closes")
		holdConns  = flag.Int("hold-conns", bench.HolderConns, "internal (scenarios 10, 15, 17): connections for --hold and --deploy-client")
		deployCl   = flag.String("deploy-client", "", "internal (scenario 17): hold --hold-conns reconnecting subscribers of this address (bench.DeployClientMain)")
		durable    = flag.Bool("pg-durable", false, "turn fsync, synchronous_commit and full_page_writes on in the throwaway cluster (PostgreSQL's defaults; scripts/pg.sh turns them off)")
	)
	p := bench.Full()
	flag.IntVar(&p.Conns, "conns", p.Conns, "subscribers in 1, 3, 4, 6 (at most 15000)")
	flag.DurationVar(&p.Heartbeat, "heartbeat", p.Heartbeat, "--heartbeat of both servers")
	flag.DurationVar(&p.IdleWindow, "idle-window", p.IdleWindow, "1: CPU measured over this window")
	flag.IntVar(&p.LatencyEvents, "latency-events", p.LatencyEvents, "2: events")
	flag.Float64Var(&p.LatencyRate, "latency-rate", p.LatencyRate, "2: events per second")
	flag.StringVar(&p.Publish.Phases, "publish-phases", "", "9: run only these of its phases, e.g. e (default: abcde)")
	flag.IntVar(&p.Publish.LatencyEvents, "publish-latency-events", p.Publish.LatencyEvents, "9: events POSTed in phase (e)")
	flag.IntVar(&p.FanoutEvents, "fanout-events", p.FanoutEvents, "3, 6: events")
	flag.DurationVar(&p.FanoutGap, "fanout-gap", p.FanoutGap, "3, 6: pause after an event reached everybody")
	flag.IntVar(&p.FanoutData, "fanout-data", p.FanoutData, "3, 6: bytes of data per event")
	flag.DurationVar(&p.ThroughputDuration, "throughput-duration", p.ThroughputDuration, "4: publish flat out this long")
	flag.IntVar(&p.Data, "data", p.Data, "2, 4: bytes of data per event")
	flag.IntVar(&p.ThroughputBatch, "throughput-batch", p.ThroughputBatch, "4: events per transaction (1: one pgsse.publish per statement)")
	flag.Float64Var(&p.SlowPercent, "slow-percent", p.SlowPercent, "6: percent of subscribers that never read")
	flag.IntVar(&p.SlowRcvBuf, "slow-rcvbuf", p.SlowRcvBuf, "6: SO_RCVBUF of the subscribers that never read")
	flag.IntVar(&p.RcvBuf, "rcvbuf", p.RcvBuf, "SO_RCVBUF of the reading subscribers (0: the kernel's default)")
	flag.IntVar(&p.Hub.Workers, "hub-workers", p.Hub.Workers, "5: worker connections (one channel each)")
	flag.Float64Var(&p.Hub.Rate, "hub-rate", p.Hub.Rate, "5: notifications per second")
	flag.DurationVar(&p.Hub.Duration, "hub-duration", p.Hub.Duration, "5: per phase")
	flag.IntVar(&p.Sources, "sources", p.Sources, "loopback source addresses (127.0.0.2 …)")
	flag.IntVar(&p.Readers, "readers", p.Readers, "client epoll loops")
	flag.IntVar(&p.Memory.StalledConns, "stalled-conns", p.Memory.StalledConns, "7: subscribers that never read")
	flag.DurationVar(&p.Memory.StalledDuration, "stalled-duration", p.Memory.StalledDuration, "7: publish flat out this long")
	flag.IntVar(&p.Memory.StalledData, "stalled-data", p.Memory.StalledData, "7: bytes of data per event")
	flag.IntVar(&p.Memory.LargeBytes, "large-bytes", p.Memory.LargeBytes, "8: bytes of data of the large event")
	flag.IntVar(&p.Memory.LargeSubscribers, "large-subscribers", p.Memory.LargeSubscribers, "8: subscribers")
	flag.IntVar(&p.ProcsConns, "procs-conns", p.ProcsConns, "10: idle connections through one port with --procs 2")
	flag.IntVar(&p.HolderConns, "holder-conns", bench.HolderConns, "10: at most this many per load process holding them")
	flag.IntVar(&p.MultiConns, "multi-conns", p.MultiConns, "11: connections of each kind (at most 15000)")
	flag.IntVar(&p.MultiStreams, "multi-streams", p.MultiStreams, "11: streams per connection of the several-streams kind")
	flag.IntVar(&p.Scale.Conns, "scale-conns", p.Scale.Conns, "15: connections to --procs --scale-procs")
	flag.IntVar(&p.Scale.Procs, "scale-procs", p.Scale.Procs, "15: pgsse --procs")
	flag.DurationVar(&p.Scale.Hold, "scale-hold", p.Scale.Hold, "15: how long they are held idle")
	flag.IntVar(&p.Scale.Events, "scale-events", p.Scale.Events, "15: durable events to every connection (at most 63)")
	flag.IntVar(&p.Scale.OneConns, "scale-one-conns", p.Scale.OneConns, "15: connections of the same run's single-process comparison (0: none)")
	flag.IntVar(&p.MultiRounds, "multi-rounds", p.MultiRounds, "11: fan-out rounds of each kind, alternating")
	flag.DurationVar(&p.Presence.Interval, "presence-interval", p.Presence.Interval, "12, 13: --presence-interval")
	flag.IntVar(&p.Presence.Churn, "presence-churn", p.Presence.Churn, "12: connections joining one presence stream, then leaving")
	flag.IntVar(&p.Presence.Others, "presence-others", p.Presence.Others, "12: subscribers of another stream meanwhile")
	flag.IntVar(&p.Presence.HoldSubjects, "presence-hold-subjects", p.Presence.HoldSubjects, "13: connections, one subject each")
	flag.IntVar(&p.Presence.HoldStreams, "presence-hold-streams", p.Presence.HoldStreams, "13: presence streams each follows")
	flag.DurationVar(&p.Presence.Hold, "presence-hold", p.Presence.Hold, "13: how long they are held")
	flag.IntVar(&p.PubFanout.Conns, "pubfanout-conns", p.PubFanout.Conns, "16: subscribers of the published stream (at most 15000)")
	flag.DurationVar(&p.PubFanout.Duration, "pubfanout-duration", p.PubFanout.Duration, "16: each phase publishes this long")
	flag.DurationVar(&p.PubFanout.Drain, "pubfanout-drain", p.PubFanout.Drain, "16: then waits at most this long for every subscriber to have every event (--scale small: on while they still receive events, up to 90 s)")
	flag.IntVar(&p.Deploy.Conns, "deploy-conns", p.Deploy.Conns, "17: durable subscribers (default 15,000 per pgsse process: 30,000 with --deploy-procs 2)")
	flag.IntVar(&p.Deploy.Procs, "deploy-procs", p.Deploy.Procs, "17: pgsse --procs")
	flag.Float64Var(&p.Deploy.Rate, "deploy-rate", p.Deploy.Rate, "17: events per second")
	flag.DurationVar(&p.Deploy.Window, "deploy-window", p.Deploy.Window, "17: the steady window before the deploys")
	flag.DurationVar(&p.Deploy.Settle, "deploy-settle", p.Deploy.Settle, "17: after every subscriber caught up, before the next step")
	flag.BoolVar(&p.Deploy.HandoffFirst, "deploy-handoff-first", false, "17: (b) SIGUSR2 before (a) SIGTERM + restart (from the steady window; (a) restarts the successor)")
	flag.Parse()
	if *deployCl != "" {
		raiseFDLimit()
		addr, err := netip.ParseAddrPort(*deployCl)
		if err != nil {
			log.Fatalf("load: --deploy-client: %v", err)
		}
		if err := bench.DeployClientMain(addr, "/streams/deploy", *holdConns, p.Sources); err != nil {
			log.Fatalf("load: --deploy-client: %v", err)
		}
		return
	}
	if *hold != "" {
		raiseFDLimit()
		addr, err := netip.ParseAddrPort(*hold)
		if err != nil {
			log.Fatalf("load: --hold: %v", err)
		}
		if err := bench.HoldMain(addr, "/streams/idle", *holdConns, p.Sources); err != nil {
			log.Fatalf("load: --hold: %v", err)
		}
		return
	}
	switch *scale {
	case "full":
	case "small":
		// Small scale for every parameter not given explicitly.
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		explicit := p
		p = bench.Small()
		for name, field := range map[string]func(*bench.Params) any{
			"conns": func(q *bench.Params) any { return &q.Conns }, "heartbeat": func(q *bench.Params) any { return &q.Heartbeat },
			"idle-window": func(q *bench.Params) any { return &q.IdleWindow }, "latency-events": func(q *bench.Params) any { return &q.LatencyEvents },
			"latency-rate": func(q *bench.Params) any { return &q.LatencyRate }, "fanout-events": func(q *bench.Params) any { return &q.FanoutEvents },
			"fanout-gap": func(q *bench.Params) any { return &q.FanoutGap }, "fanout-data": func(q *bench.Params) any { return &q.FanoutData },
			"throughput-duration": func(q *bench.Params) any { return &q.ThroughputDuration }, "data": func(q *bench.Params) any { return &q.Data },
			"throughput-batch": func(q *bench.Params) any { return &q.ThroughputBatch },
			"publish-phases":   func(q *bench.Params) any { return &q.Publish.Phases }, "publish-latency-events": func(q *bench.Params) any { return &q.Publish.LatencyEvents },
			"slow-percent": func(q *bench.Params) any { return &q.SlowPercent }, "slow-rcvbuf": func(q *bench.Params) any { return &q.SlowRcvBuf },
			"rcvbuf":  func(q *bench.Params) any { return &q.RcvBuf },
			"sources": func(q *bench.Params) any { return &q.Sources }, "readers": func(q *bench.Params) any { return &q.Readers },
			"hub-workers": func(q *bench.Params) any { return &q.Hub.Workers }, "hub-rate": func(q *bench.Params) any { return &q.Hub.Rate },
			"hub-duration":  func(q *bench.Params) any { return &q.Hub.Duration },
			"stalled-conns": func(q *bench.Params) any { return &q.Memory.StalledConns }, "stalled-duration": func(q *bench.Params) any { return &q.Memory.StalledDuration },
			"stalled-data": func(q *bench.Params) any { return &q.Memory.StalledData }, "large-bytes": func(q *bench.Params) any { return &q.Memory.LargeBytes },
			"large-subscribers":      func(q *bench.Params) any { return &q.Memory.LargeSubscribers },
			"procs-conns":            func(q *bench.Params) any { return &q.ProcsConns },
			"holder-conns":           func(q *bench.Params) any { return &q.HolderConns },
			"multi-conns":            func(q *bench.Params) any { return &q.MultiConns },
			"multi-streams":          func(q *bench.Params) any { return &q.MultiStreams },
			"multi-rounds":           func(q *bench.Params) any { return &q.MultiRounds },
			"scale-conns":            func(q *bench.Params) any { return &q.Scale.Conns },
			"scale-procs":            func(q *bench.Params) any { return &q.Scale.Procs },
			"scale-hold":             func(q *bench.Params) any { return &q.Scale.Hold },
			"scale-events":           func(q *bench.Params) any { return &q.Scale.Events },
			"scale-one-conns":        func(q *bench.Params) any { return &q.Scale.OneConns },
			"presence-interval":      func(q *bench.Params) any { return &q.Presence.Interval },
			"presence-churn":         func(q *bench.Params) any { return &q.Presence.Churn },
			"presence-others":        func(q *bench.Params) any { return &q.Presence.Others },
			"presence-hold-subjects": func(q *bench.Params) any { return &q.Presence.HoldSubjects },
			"presence-hold-streams":  func(q *bench.Params) any { return &q.Presence.HoldStreams },
			"presence-hold":          func(q *bench.Params) any { return &q.Presence.Hold },
			"pubfanout-conns":        func(q *bench.Params) any { return &q.PubFanout.Conns },
			"pubfanout-duration":     func(q *bench.Params) any { return &q.PubFanout.Duration },
			"pubfanout-drain":        func(q *bench.Params) any { return &q.PubFanout.Drain },
			"deploy-conns":           func(q *bench.Params) any { return &q.Deploy.Conns },
			"deploy-procs":           func(q *bench.Params) any { return &q.Deploy.Procs },
			"deploy-rate":            func(q *bench.Params) any { return &q.Deploy.Rate },
			"deploy-window":          func(q *bench.Params) any { return &q.Deploy.Window },
			"deploy-settle":          func(q *bench.Params) any { return &q.Deploy.Settle },
		} {
			if set[name] {
				copyField(field(&p), field(&explicit))
			}
		}
	default:
		log.Fatalf("load: --scale must be full or small, not %q", *scale)
	}
	deploySet := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { deploySet[f.Name] = true })
	if deploySet["deploy-procs"] && !deploySet["deploy-conns"] {
		p.Deploy.Conns *= max(p.Deploy.Procs, 1) // 15,000 per process (issue 22: 30,000 with --procs 2)
	}
	if p.Conns < 1 || p.Conns > 15000 {
		log.Fatalf("load: --conns must be 1-15000 (the 20,000-fd limit per process), not %d", p.Conns)
	}
	if p.PubFanout.Conns < 1 || p.PubFanout.Conns > 15000 {
		log.Fatalf("load: --pubfanout-conns must be 1-15000 (the 20,000-fd limit per process), not %d", p.PubFanout.Conns)
	}
	var ids []int
	for _, s := range strings.Split(*scenarios, ",") {
		id, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || id < 1 || id > 17 {
			log.Fatalf("load: --scenarios: %q is not one of 1-17", s)
		}
		ids = append(ids, id)
	}
	if *budget != "" {
		var err error
		if p.OutboundBudget, err = parseSize(*budget); err != nil {
			log.Fatalf("load: --outbound-budget: %v", err)
		}
	}
	names := strings.Split(*servers, ",")
	raiseFDLimit()

	ctx := context.Background()
	dir, err := os.MkdirTemp("", "pgsse-load.")
	if err != nil {
		log.Fatal(err)
	}
	var cluster *bench.Cluster
	var built []string
	cleanup := func() {
		bench.KillOrphans() // successors of scenario 17's handoff: nothing else kills them
		cluster.Stop()
		for _, b := range built {
			os.Remove(b) // the logs stay in dir
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		log.Printf("load: interrupted; stopping (servers die with this process)")
		cleanup()
		os.Exit(130)
	}()
	defer cleanup()

	if *pgsseBin == "" || *baseBin == "" {
		log.Printf("load: building the servers")
		pb, bb, err := bench.Build(ctx, *root, dir)
		if err != nil {
			log.Fatal(err)
		}
		built = []string{pb, bb}
		if *pgsseBin == "" {
			*pgsseBin = pb
		}
		if *baseBin == "" {
			*baseBin = bb
		}
	}
	if *dbURL != "" {
		if *durable {
			log.Fatal("load: --pg-durable changes the settings of the throwaway cluster only; set them on your own cluster yourself")
		}
		cluster = bench.UseCluster(*dbURL)
	} else {
		log.Printf("load: starting a throwaway PostgreSQL")
		if cluster, err = bench.StartCluster(ctx, *pgScript); err != nil {
			log.Fatal(err)
		}
		if *durable {
			if err := cluster.MakeDurable(ctx); err != nil {
				log.Fatal(err)
			}
			log.Printf("load: fsync, synchronous_commit and full_page_writes are on")
		}
	}
	if *profileDir != "" {
		if err := os.MkdirAll(*profileDir, 0o755); err != nil {
			log.Fatal(err)
		}
	}
	env := &bench.Env{Cluster: cluster, Dir: dir, ProfileDir: *profileDir, Logf: log.Printf}
	var targets []bench.Target
	for _, n := range names {
		switch n {
		case "pgsse":
			targets = append(targets, bench.Target{Name: n, Bin: *pgsseBin})
		case "baseline":
			targets = append(targets, bench.Target{Name: n, Bin: *baseBin})
		case "pgsse-old":
			if *oldBin == "" {
				log.Fatal("load: --servers pgsse-old needs --pgsse-old-bin")
			}
			targets = append(targets, bench.Target{Name: "pgsse", Label: n, Bin: *oldBin, Old: true})
		default:
			log.Fatalf("load: --servers: unknown server %q", n)
		}
	}
	started := time.Now()
	loadStart := loadAvg()
	if p.MultiConns < 1 || p.MultiConns > 15000 {
		log.Fatalf("load: --multi-conns must be 1-15000 (the 20,000-fd limit per process), not %d", p.MultiConns)
	}
	var results, procsResults, multiResults, floorResults, scaleResults, deployResults []*bench.Result
	failed := false
	for _, id := range ids {
		if id == 10 {
			// --procs exists only in pgsse; its baseline is pgsse with one process, in the
			// same run.
			log.Printf("load: scenario 10 (--procs)")
			rs, err := procsScenario(ctx, env, bench.Target{Name: "pgsse", Bin: *pgsseBin}, p)
			for _, r := range rs {
				for _, m := range r.Metrics {
					log.Printf("  %-16s %-44s %12s %s", r.Target, m.Name, bench.FormatValue(m.Value), m.Unit)
				}
			}
			procsResults = append(procsResults, rs...)
			if err != nil {
				log.Printf("load: scenario 10: %v", err)
				failed = true
			}
			continue
		}
		if id == 14 || id == 15 {
			var rs []*bench.Result
			var err error
			if id == 14 {
				log.Printf("load: scenario 14 (idle RSS per connection against the floor, bench/gnetrelay)")
				var relayBin string
				if relayBin, err = bench.BuildRelay(ctx, *root, dir); err == nil {
					built = append(built, relayBin)
					rs, err = bench.Floor(ctx, env, bench.Target{Name: "pgsse", Bin: *pgsseBin}, bench.Target{Name: bench.GnetRelay, Bin: relayBin}, p)
				}
				floorResults = append(floorResults, rs...)
			} else {
				log.Printf("load: scenario 15 (%d connections to --procs %d, %d to one process)", p.Scale.Conns, p.Scale.Procs, p.Scale.OneConns)
				rs, err = bench.Scale(ctx, env, bench.Target{Name: "pgsse", Bin: *pgsseBin}, p, p.Scale, holderCommand(ctx))
				scaleResults = append(scaleResults, rs...)
			}
			for _, r := range rs {
				for _, m := range r.Metrics {
					log.Printf("  %-34s %-66s %12s %s", r.Target, m.Name, bench.FormatValue(m.Value), m.Unit)
				}
				for _, n := range r.Notes {
					log.Printf("  %-34s note: %s", r.Target, n)
				}
			}
			if err != nil {
				log.Printf("load: scenario %d: %v", id, err)
				failed = true
			}
			continue
		}
		if id == 17 {
			log.Printf("load: scenario 17 (deploy: %d subscribers, --procs %d, SIGTERM + restart, then SIGUSR2)", p.Deploy.Conns, p.Deploy.Procs)
			rs, err := bench.Deploy(ctx, env, bench.Target{Name: "pgsse", Bin: *pgsseBin}, p.Deploy, p, deployClientCommand(ctx))
			for _, r := range rs {
				for _, m := range r.Metrics {
					log.Printf("  %-22s %-66s %12s %s", r.Target, m.Name, bench.FormatValue(m.Value), m.Unit)
				}
				for _, n := range r.Notes {
					log.Printf("  %-22s note: %s", r.Target, n)
				}
			}
			deployResults = append(deployResults, rs...)
			if err != nil {
				log.Printf("load: scenario 17: %v", err)
				failed = true
			}
			continue
		}
		if id == 11 {
			// Several streams per connection against one, on pgsse, in the same run.
			log.Printf("load: scenario 11 (streams per connection)")
			rs, err := bench.MultiStream(ctx, env, bench.Target{Name: "pgsse", Bin: *pgsseBin}, p)
			for _, r := range rs {
				for _, m := range r.Metrics {
					log.Printf("  %-26s %-44s %12s %s", r.Target, m.Name, bench.FormatValue(m.Value), m.Unit)
				}
			}
			multiResults = append(multiResults, rs...)
			if err != nil {
				log.Printf("load: scenario 11: %v", err)
				failed = true
			}
			continue
		}
		// Scenarios 5 (the hub), 9 (publishing) and 16 (publishers under fan-out) run on pgsse only: each measures its own
		// baseline (workers' own LISTEN sessions; pgsse.publish over SQL) in the same run.
		var paired func() ([]*bench.Result, error)
		pgsseTarget := bench.Target{Name: "pgsse", Bin: *pgsseBin}
		switch id {
		case 5:
			paired = func() ([]*bench.Result, error) { return bench.HubLoad(ctx, env, pgsseTarget, p, p.Hub) }
		case 9:
			paired = func() ([]*bench.Result, error) { return bench.Publish(ctx, env, pgsseTarget, p.Publish, p) }
		case 12:
			paired = func() ([]*bench.Result, error) { return bench.PresenceChurn(ctx, env, pgsseTarget, p) }
		case 16:
			paired = func() ([]*bench.Result, error) { return bench.PubFanout(ctx, env, pgsseTarget, p.PubFanout, p) }
		case 13:
			paired = func() ([]*bench.Result, error) {
				r, err := bench.PresenceHold(ctx, env, pgsseTarget, p)
				if err != nil {
					return nil, err
				}
				return []*bench.Result{r}, nil
			}
		}
		if paired != nil {
			log.Printf("load: scenario %d (pgsse and its baseline in one run)", id)
			rs, err := paired()
			if err != nil {
				log.Printf("load: scenario %d: %v", id, err)
				failed = true
				continue
			}
			for _, r := range rs {
				for _, m := range r.Metrics {
					log.Printf("  %-10s %-70s %12s %s", r.Target, m.Name, bench.FormatValue(m.Value), m.Unit)
				}
			}
			results = append(results, rs...)
			continue
		}
		for _, t := range targets {
			if id >= 7 && t.Name != "pgsse" {
				continue // the memory scenarios compare pgsse builds
			}
			log.Printf("load: scenario %d against %s", id, t.Label+" "+t.Name)
			r, err := bench.Scenario(ctx, env, t, p, id)
			if err != nil {
				log.Printf("load: scenario %d, %s: %v", id, t.Name, err)
				failed = true
				continue
			}
			for _, m := range r.Metrics {
				log.Printf("  %-40s %12s %s", m.Name, bench.FormatValue(m.Value), m.Unit)
			}
			results = append(results, r)
		}
	}
	bench.CompareIsolation(results)
	var b strings.Builder
	fmt.Fprintf(&b, "- run: %s, %v, commit %s, scale %s, scenarios %s\n", started.UTC().Format("2006-01-02 15:04 MST"),
		time.Since(started).Round(time.Second), gitDescribe(*root), *scale, *scenarios)
	if *durable {
		fmt.Fprintf(&b, "- PostgreSQL with fsync, synchronous_commit and full_page_writes on (--pg-durable)\n")
	}
	fmt.Fprintf(&b, "- machine: %d CPUs (%s), %s memory, kernel %s, %s\n", runtime.NumCPU(), cpuModel(), memTotal(), kernel(), runtime.Version())
	fmt.Fprintf(&b, "- load average (1 min) at start %s, at end %s (other work on the machine shows here)\n\n", loadStart, loadAvg())
	if len(results) > 0 {
		bench.WriteTable(&b, names, results)
	}
	if len(procsResults) > 0 {
		if len(results) > 0 {
			fmt.Fprintln(&b)
		}
		bench.WriteTable(&b, []string{"pgsse --procs 2", "pgsse --procs 1"}, procsResults)
	}
	if len(multiResults) > 0 {
		if b.Len() > 0 && (len(results) > 0 || len(procsResults) > 0) {
			fmt.Fprintln(&b)
		}
		bench.WriteTable(&b, []string{bench.MultiLabel(p.MultiStreams), bench.SingleLabel}, multiResults)
	}
	for _, rs := range [][]*bench.Result{floorResults, scaleResults, deployResults} {
		if len(rs) == 0 {
			continue
		}
		var labels []string
		for _, r := range rs {
			labels = append(labels, r.Target)
		}
		fmt.Fprintln(&b)
		bench.WriteTable(&b, labels, rs) // with the results' notes
	}
	fmt.Print(b.String())
	if *out != "" {
		if err := os.WriteFile(*out, []byte(b.String()), 0o644); err != nil {
			log.Print(err)
		}
	}
	log.Printf("load: done in %v; server logs in %s", time.Since(started).Round(time.Second), dir)
	if failed {
		cleanup()
		os.Exit(1)
	}
}

// procsScenario runs scenario 10: 30,000 idle connections held by this program started again
// as holder processes (--hold), then the fan-out with --procs 1 and 2.
func procsScenario(ctx context.Context, env *bench.Env, t bench.Target, p bench.Params) ([]*bench.Result, error) {
	idle, err := bench.ProcsIdle(ctx, env, t, p, holderCommand(ctx))
	if err != nil {
		return nil, err
	}
	fan, err := bench.ProcsFanOut(ctx, env, t, p)
	return append([]*bench.Result{idle}, fan...), err
}

// holderCommand makes holder processes (scenarios 10 and 15): this program again, with --hold.
func holderCommand(ctx context.Context) bench.HolderCommand {
	exe, err := os.Executable()
	if err != nil {
		log.Fatal(err)
	}
	return func(addr netip.AddrPort, n, sources int) *exec.Cmd {
		return exec.CommandContext(ctx, exe, "--hold", addr.String(), "--hold-conns", strconv.Itoa(n), "--sources", strconv.Itoa(sources))
	}
}

// deployClientCommand makes scenario 17's client processes: this program again, with
// --deploy-client.
func deployClientCommand(ctx context.Context) bench.HolderCommand {
	exe, err := os.Executable()
	if err != nil {
		log.Fatal(err)
	}
	return func(addr netip.AddrPort, n, sources int) *exec.Cmd {
		return exec.CommandContext(ctx, exe, "--deploy-client", addr.String(), "--hold-conns", strconv.Itoa(n), "--sources", strconv.Itoa(sources))
	}
}

// parseSize reads a byte count with an optional KiB, MiB or GiB suffix.
func parseSize(v string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			v, mult = n, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("invalid size %q (bytes, or with a KiB, MiB or GiB suffix)", v)
	}
	return n * mult, nil
}

func gitDescribe(root string) string {
	out, err := exec.Command("git", "-C", root, "describe", "--always", "--dirty", "--abbrev=12").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

func firstField(path, prefix string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "?"
	}
	for _, ln := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(ln, prefix); ok {
			return strings.TrimSpace(strings.TrimLeft(v, " \t:"))
		}
	}
	return "?"
}

func cpuModel() string { return firstField("/proc/cpuinfo", "model name") }

func memTotal() string {
	kb, err := strconv.ParseInt(strings.TrimSuffix(firstField("/proc/meminfo", "MemTotal"), " kB"), 10, 64)
	if err != nil {
		return "?"
	}
	return strconv.FormatInt(kb>>20, 10) + " GiB"
}

func kernel() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}

func loadAvg() string { return bench.LoadAvg() }

func copyField(dst, src any) {
	switch d := dst.(type) {
	case *int:
		*d = *src.(*int)
	case *float64:
		*d = *src.(*float64)
	case *time.Duration:
		*d = *src.(*time.Duration)
	}
}

func raiseFDLimit() { bench.RaiseFDLimit() }
