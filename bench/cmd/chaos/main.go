//go:build linux

// Command chaos runs pgsse's randomized fault run and its exactly-once checker, or the soak
// (bench/chaos; bench/README.md and docs/operations.md say how to read the result):
//
//	go run ./bench/cmd/chaos --duration 60s --seed 1            # what make test runs
//	go run ./bench/cmd/chaos --duration 30m --seed 1            # make chaos (and seeds 2, 3)
//	go run ./bench/cmd/chaos --duration 30m --soak              # make soak
//	go run ./bench/cmd/chaos --faults pg-crash-async,kill-first # only these fault kinds
//
// --seed 0 picks a random seed (printed). It exits 1 when a check fails, printing every
// failure, the seed and a one-line reproduction; 2 when the run itself could not be made.
package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/pgsse/pgsse/bench/chaos"
)

func main() {
	var cfg chaos.Config
	var faults string
	flag.DurationVar(&cfg.Duration, "duration", 60*time.Second, "how long the workload runs with faults (or the soak), before the drain")
	flag.Uint64Var(&cfg.Seed, "seed", 0, "the run's seed: the faults, their moments and the workload's choices (0 = a random one, printed)")
	flag.BoolVar(&cfg.Soak, "soak", false, "steady load with churn and no faults; fail if RSS, heap, goroutines, descriptors, backends or the NOTIFY queue grow")
	flag.StringVar(&faults, "faults", strings.Join(chaos.DefaultFaults, ","), "fault kinds, comma-separated, of: "+strings.Join(chaos.AllFaults(), ", ")+" (\"none\" for none)")
	flag.DurationVar(&cfg.FaultEvery, "fault-every", 6*time.Second, "mean time between faults")
	flag.StringVar(&cfg.Multi, "multi", "auto", "multi-stream subscribers (SPEC §3c): auto (if pgsse serve --help lists --max-streams-per-connection), on, off")
	flag.StringVar(&cfg.Handoff, "handoff", "auto", "SIGUSR2 handoff faults (SPEC §6): auto (if pgsse serve --help mentions SIGUSR2), on, off")
	flag.Float64Var(&cfg.Scale, "scale", 1, "multiplies the clients and the publishing rates")
	flag.DurationVar(&cfg.SampleEvery, "sample-every", 10*time.Second, "soak: time between resource samples")
	flag.StringVar(&cfg.Root, "root", ".", "the module root (scripts/pg.sh; pgsse is built from it unless --bin)")
	flag.StringVar(&cfg.Bin, "bin", "", "test this pgsse binary instead of building one")
	flag.StringVar(&cfg.Dir, "dir", "", "keep logs and the cluster's files here (default: a temporary directory, removed if the run passes)")
	flag.Parse()
	if faults != "none" && faults != "" {
		cfg.Faults = strings.Split(faults, ",")
	} else {
		cfg.Faults = []string{}
	}
	if cfg.Seed == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		cfg.Seed = binary.LittleEndian.Uint64(b[:]) % 1_000_000_000
	}
	if root, err := filepath.Abs(cfg.Root); err == nil {
		cfg.Root = root
	}
	raiseFDLimit()
	fmt.Fprintf(os.Stderr, "chaos: seed %d (reproduce: %s)\n", cfg.Seed, chaos.Repro(cfg))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := chaos.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: the run could not be made: %v\nseed %d; reproduce: %s\n", err, cfg.Seed, chaos.Repro(cfg))
		os.Exit(2)
	}
	res.Print(os.Stdout, cfg)
	if !res.OK() {
		os.Exit(1)
	}
}

// raiseFDLimit: the connection flood holds one descriptor per connection.
func raiseFDLimit() {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err == nil && l.Cur < l.Max {
		l.Cur = l.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
}
