//go:build linux

package chaos

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/sys/unix"
)

// Fault kinds.
const (
	FaultTermListen   = "term-listen"    // pg_terminate_backend of the LISTEN session (pgsse-listen)
	FaultTermReplay   = "term-replay"    // … of the replay pool's sessions (pgsse-replay)
	FaultTermPublish  = "term-publish"   // … of the HTTP publisher's sessions (pgsse-publish)
	FaultTermCheck    = "term-check"     // … of the schema check's session (pgsse-check), when it is open
	FaultPGRestart    = "pg-restart"     // PostgreSQL fast restart
	FaultPGCrash      = "pg-crash"       // PostgreSQL immediate stop, then start (crash recovery)
	FaultPGCrashAsync = "pg-crash-async" // the same after a few seconds of synchronous_commit=off: acknowledged commits are lost, ids reused
	FaultKillSibling  = "kill-sibling"   // SIGKILL of a --procs sibling (its supervisor restarts it)
	FaultKillFirst    = "kill-first"     // SIGKILL of the first process (the run restarts it)
	FaultClientReset  = "client-reset"   // a subscriber resets its connection (RST) in the middle of an event
	FaultStall        = "stall"          // a subscriber or hub worker stops reading for seconds
	FaultTokenExpiry  = "token-expiry"   // a subscriber reconnects with a token that expires mid-stream
	FaultFDSqueeze    = "fd-squeeze"     // a process's RLIMIT_NOFILE lowered to what it holds, while connections arrive
	FaultConnFlood    = "conn-flood"     // connections up to --max-connections, held for seconds
	FaultHandoff      = "handoff"        // SIGUSR2 to the first process (SPEC §6), once pgsse has it
)

// DefaultFaults is every fault kind but pg-crash-async and handoff (added when the server
// supports it). pg-crash-async loses acknowledged, delivered commits and reuses their ids; the
// engine announces that with a pgsse:gap back (fanout.rewind, readBack), and the processes of
// --procs tell each other of it (engine/rewinds.go): runs of it alone pass (3 min, seeds 11 and
// 12). Among the defaults it meets kill-first and kill-sibling: a process killed before its
// LISTEN session is back takes what it delivered with it, and nobody can tell a client that
// reconnects with an id it lost (seed 1, 60 s: 14 silent skips; bench/RESULTS.md,
// docs/operations.md) — so it stays out until a process's deliveries outlive it.
var DefaultFaults = []string{FaultTermListen, FaultTermReplay, FaultTermPublish, FaultTermCheck,
	FaultPGRestart, FaultPGCrash, FaultKillSibling, FaultKillFirst, FaultClientReset, FaultStall,
	FaultTokenExpiry, FaultFDSqueeze, FaultConnFlood}

type faultFunc func(ctx context.Context, w *workload, rng *rand.Rand) (detail string, applied bool, err error)

var faultTable = map[string]faultFunc{
	FaultTermListen:   terminate("pgsse-listen", 0),
	FaultTermReplay:   terminate("pgsse-replay", 3*time.Second),
	FaultTermPublish:  terminate("pgsse-publish", 3*time.Second),
	FaultTermCheck:    terminate("pgsse-check", 12*time.Second),
	FaultPGRestart:    pgRestart,
	FaultPGCrash:      pgCrash,
	FaultPGCrashAsync: pgCrashAsync,
	FaultKillSibling:  killSibling,
	FaultKillFirst:    killFirst,
	FaultClientReset:  clientReset,
	FaultStall:        stall,
	FaultTokenExpiry:  tokenExpiry,
	FaultFDSqueeze:    fdSqueeze,
	FaultConnFlood:    connFlood,
	FaultHandoff:      handoff,
}

// AllFaults names every fault kind.
func AllFaults() []string {
	return append(append([]string(nil), DefaultFaults...), FaultPGCrashAsync, FaultHandoff)
}

func faultByName(k string) faultFunc { return faultTable[k] }

// runFaults injects faults until ctx ends: the time to the next one is exponential with mean
// FaultEvery (at least 500 ms), its kind uniform over the enabled ones, all from the seed.
func (w *workload) runFaults(ctx, clientCtx context.Context) {
	rng := w.rng(1)
	kinds := w.cfg.Faults
	if len(kinds) == 0 {
		<-ctx.Done()
		return
	}
	for {
		wait := time.Duration(-math.Log(1-rng.Float64()) * float64(w.cfg.FaultEvery))
		if sleepCtx(ctx, max(wait, 500*time.Millisecond)) != nil {
			return
		}
		kind := kinds[rng.IntN(len(kinds))]
		frng := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
		t0 := time.Now()
		// A fault runs to its end even if the run's time is up (a PostgreSQL left stopped
		// would be no drain), but not beyond the run itself.
		detail, applied, err := faultTable[kind](clientCtx, w, frng)
		w.mu.Lock()
		if applied {
			w.faults[kind]++
		} else {
			w.skipped[kind]++
		}
		w.mu.Unlock()
		switch {
		case err != nil:
			w.logf("fault %s: %s: error: %v (%v)", kind, detail, err, time.Since(t0).Round(time.Millisecond))
		case !applied:
			w.logf("fault %s: not applicable now: %s", kind, detail)
		default:
			w.logf("fault %s: %s (%v)", kind, detail, time.Since(t0).Round(time.Millisecond))
		}
	}
}

func terminate(app string, wait time.Duration) faultFunc {
	return func(ctx context.Context, w *workload, _ *rand.Rand) (string, bool, error) {
		n, err := w.terminateBackends(ctx, app, wait)
		if err != nil {
			return "pg_terminate_backend", false, err
		}
		if n == 0 {
			return fmt.Sprintf("no %s session open within %v", app, wait), false, nil
		}
		return fmt.Sprintf("terminated %d %s session(s)", n, app), true, nil
	}
}

// terminateSQL terminates the sessions of one application_name on one database, polling
// every 2 ms for up to a number of seconds until there is one: the schema check's session
// lives a few milliseconds every 10 s. (pg_stat_activity is a per-transaction snapshot:
// cleared before each look.)
const terminateSQL = `CREATE OR REPLACE FUNCTION pg_temp.chaos_terminate(db text, app text, secs float8) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    n  int := 0;
    t0 timestamptz := clock_timestamp();
BEGIN
    LOOP
        PERFORM pg_stat_clear_snapshot();
        SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) INTO n
          FROM pg_stat_activity WHERE datname = db AND application_name = app;
        EXIT WHEN n > 0 OR clock_timestamp() > t0 + make_interval(secs => secs);
        PERFORM pg_sleep(0.002);
    END LOOP;
    RETURN n;
END $$`

func (w *workload) terminateBackends(ctx context.Context, app string, wait time.Duration) (int, error) {
	cctx, cancel := context.WithTimeout(ctx, wait+10*time.Second)
	defer cancel()
	conn, err := pgconn.Connect(cctx, w.cl.admin)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(cctx, terminateSQL).ReadAll(); err != nil {
		return 0, err
	}
	r := conn.ExecParams(cctx, "SELECT pg_temp.chaos_terminate($1, $2, $3)",
		[][]byte{[]byte(w.db.Name), []byte(app), []byte(strconv.FormatFloat(wait.Seconds(), 'f', 3, 64))}, nil, nil, nil).Read()
	if r.Err != nil {
		return 0, r.Err
	}
	n, _ := strconv.Atoi(string(r.Rows[0][0]))
	return n, nil
}

func pgRestart(ctx context.Context, w *workload, _ *rand.Rand) (string, bool, error) {
	return "pg_ctl restart -m fast", true, w.cl.restartFast(ctx)
}

func pgCrash(ctx context.Context, w *workload, rng *rand.Rand) (string, bool, error) {
	down := time.Duration(rng.IntN(3000)) * time.Millisecond
	return fmt.Sprintf("pg_ctl stop -m immediate, down %v, start", down), true, w.cl.crash(ctx, down)
}

// pgCrashAsync: synchronous_commit off (and the WAL writer slowed to its 10 s maximum, so
// commits of the last seconds are only in PostgreSQL's memory), publishing for 1–4 s, then an
// immediate stop: acknowledged commits are lost and their ids reused after recovery (issue
// 23). Nothing else commits synchronously meanwhile (the pruner waits), which would write them.
func pgCrashAsync(ctx context.Context, w *workload, rng *rand.Rand) (string, bool, error) {
	w.pruneMu.Lock()
	defer w.pruneMu.Unlock()
	from := w.now()
	if err := w.cl.exec(ctx, "ALTER SYSTEM SET synchronous_commit = off", "ALTER SYSTEM SET wal_writer_delay = '10s'",
		"SELECT pg_reload_conf()"); err != nil {
		return "synchronous_commit off", false, err
	}
	window := time.Duration(1000+rng.IntN(3000)) * time.Millisecond
	_ = sleepCtx(ctx, window)
	err := w.cl.pgctl(ctx, "-m", "immediate", "-w", "-t", "60", "stop")
	// Everything acknowledged until PostgreSQL was gone may be lost.
	w.mu.Lock()
	w.crashes = append(w.crashes, CrashWindow{From: from, To: w.now()})
	w.mu.Unlock()
	_ = sleepCtx(ctx, time.Duration(rng.IntN(2000))*time.Millisecond)
	if e := w.cl.start(ctx); err == nil {
		err = e
	}
	if e := w.cl.exec(ctx, "ALTER SYSTEM RESET synchronous_commit", "ALTER SYSTEM RESET wal_writer_delay",
		"ALTER SYSTEM SET synchronous_commit = on", "SELECT pg_reload_conf()"); err == nil {
		err = e
	}
	return fmt.Sprintf("synchronous_commit off for %v, then pg_ctl stop -m immediate and start", window), true, err
}

func killSibling(_ context.Context, w *workload, rng *rand.Rand) (string, bool, error) {
	sib := w.srv.siblings()
	if len(sib) == 0 {
		return "no sibling running", false, nil
	}
	pid := sib[rng.IntN(len(sib))]
	return fmt.Sprintf("SIGKILL sibling %d", pid), true, syscall.Kill(pid, syscall.SIGKILL)
}

// killFirst SIGKILLs the first process; the run restarts it in the background, as a
// supervisor would (the faults go on meanwhile: its orphaned sibling serves and drains, the
// hub is gone, workers fail over).
func killFirst(ctx context.Context, w *workload, _ *rand.Rand) (string, bool, error) {
	if !w.srv.restarting.CompareAndSwap(false, true) {
		return "the first process is being restarted", false, nil
	}
	pid := w.srv.first()
	if pid == 0 {
		w.srv.restarting.Store(false)
		return "the first process is not running", false, nil
	}
	w.srv.killFirst()
	w.srv.restartWG.Add(1)
	go func() {
		defer w.srv.restartWG.Done()
		defer w.srv.restarting.Store(false)
		t0 := time.Now()
		n, err := w.srv.restart(ctx)
		if err != nil {
			w.logf("restart of the first process: %v", err)
			return
		}
		w.logf("the first process serves again after %d attempt(s) in %v", n, time.Since(t0).Round(time.Millisecond))
	}()
	return fmt.Sprintf("SIGKILL first process %d; restarting it", pid), true, nil
}

func (w *workload) pickSub(rng *rand.Rand, connected bool) *durableSub {
	w.mu.Lock()
	defer w.mu.Unlock()
	var c []*durableSub
	for _, s := range w.subs {
		if !s.retired.Load() && (!connected || s.cur.Load() != nil) {
			c = append(c, s)
		}
	}
	if len(c) == 0 {
		return nil
	}
	return c[rng.IntN(len(c))]
}

func clientReset(_ context.Context, w *workload, rng *rand.Rand) (string, bool, error) {
	s := w.pickSub(rng, true)
	if s == nil {
		return "no subscriber connected", false, nil
	}
	s.resetReq.Store(true)
	return s.log.Name + " resets its connection in the middle of the next event", true, nil
}

func stall(_ context.Context, w *workload, rng *rand.Rand) (string, bool, error) {
	d := time.Duration(3000+rng.IntN(22000)) * time.Millisecond
	until := time.Now().Add(d).UnixNano()
	if rng.IntN(4) == 0 {
		w.mu.Lock()
		h := w.workers[rng.IntN(len(w.workers))]
		w.mu.Unlock()
		h.stall.Store(until)
		return fmt.Sprintf("hub worker %s (%s) stops reading for %v", h.log.Name, h.log.Mode, d), true, nil
	}
	s := w.pickSub(rng, false)
	if s == nil {
		return "no subscriber", false, nil
	}
	s.stall.Store(until)
	return fmt.Sprintf("%s stops reading for %v", s.log.Name, d), true, nil
}

func tokenExpiry(_ context.Context, w *workload, rng *rand.Rand) (string, bool, error) {
	s := w.pickSub(rng, true)
	if s == nil {
		return "no subscriber connected", false, nil
	}
	ms := int64(1500 + rng.IntN(3000))
	s.shortToken.Store(ms)
	if c := s.cur.Load(); c != nil {
		_ = c.c.Close() // it reconnects at once, with the short token
	}
	return fmt.Sprintf("%s reconnects with a token that expires after %d ms", s.log.Name, ms), true, nil
}

// fdSqueeze lowers one process's soft RLIMIT_NOFILE to the descriptors it holds plus a
// couple, for 3–8 s, while a hundred connections arrive (and the run's own clients reconnect,
// replay, publish): accept, replay connections and reconnects to PostgreSQL meet EMFILE. Then
// the limit is put back.
func fdSqueeze(ctx context.Context, w *workload, rng *rand.Rand) (string, bool, error) {
	pids := append([]int{w.srv.first()}, w.srv.siblings()...)
	pid := pids[rng.IntN(len(pids))]
	if pid == 0 {
		return "the first process is not running", false, nil
	}
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		return "", false, err
	}
	var old unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &old); err != nil {
		return "prlimit", false, err
	}
	squeezed := unix.Rlimit{Cur: uint64(len(ents) + 2), Max: old.Max}
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &squeezed, nil); err != nil {
		return "prlimit", false, err
	}
	d := time.Duration(3000+rng.IntN(5000)) * time.Millisecond
	conns := w.flood(ctx, 100, d)
	restore := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &old, nil)
	return fmt.Sprintf("process %d: RLIMIT_NOFILE %d → %d for %v (%d connections opened meanwhile)", pid, old.Cur, squeezed.Cur, d, conns), true, restore
}

func connFlood(ctx context.Context, w *workload, rng *rand.Rand) (string, bool, error) {
	d := time.Duration(2000+rng.IntN(4000)) * time.Millisecond
	n := w.flood(ctx, maxConnections, d)
	return fmt.Sprintf("%d connections held for %v", n, d), true, nil
}

// flood opens up to n subscriptions (each with a token of its own), holds them for d, and
// resets them. It returns how many connected.
func (w *workload) flood(ctx context.Context, n int, d time.Duration) int {
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	deadline := time.Now().Add(d)
	sem := make(chan struct{}, 16)
	for i := range n {
		if time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := net.DialTimeout("tcp", w.addr, 2*time.Second)
			if err != nil {
				return
			}
			tok := w.subscriberToken("flood-"+strconv.Itoa(i), nil, time.Minute)
			_, _ = fmt.Fprintf(c, "GET /streams/chaos/flood HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", tok)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}()
	}
	wg.Wait()
	_ = sleepCtx(ctx, time.Until(deadline))
	for _, c := range conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}
	return len(conns)
}

// handoff sends SIGUSR2 to the first process (SPEC §6): it hands everything to a successor
// and exits 0. The successor is found as the process that serves the admin address next.
func handoff(ctx context.Context, w *workload, _ *rand.Rand) (string, bool, error) {
	if w.srv.restarting.Load() {
		return "the first process is being restarted", false, nil
	}
	pid := w.srv.first()
	if pid == 0 {
		return "the first process is not running", false, nil
	}
	if err := syscall.Kill(pid, syscall.SIGUSR2); err != nil {
		return "SIGUSR2", false, err
	}
	return fmt.Sprintf("SIGUSR2 to %d", pid), true, w.srv.followHandoff(ctx)
}
