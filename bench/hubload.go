//go:build linux

package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgsse/pgsse/pglisten"
)

// HubParams sizes scenario 5, the hub load (HubLoad).
type HubParams struct {
	Workers  int           // worker connections, one channel each (64)
	Rate     float64       // notifications per second over all channels (5,000)
	Duration time.Duration // per phase (10 s)
}

// listenerSet receives notifications "seq sendNs" on some Listeners and records, per seq, the
// receive time.
type listenerSet struct {
	ls   []pglisten.Listener
	recv []atomic.Int64
	bad  atomic.Int64
	gaps atomic.Int64 // KindDown seen: notifications may have been missed (a Resync follows)
	wg   sync.WaitGroup
}

func newListenerSet(maxSeq int) *listenerSet {
	return &listenerSet{recv: make([]atomic.Int64, maxSeq+1)}
}

func (s *listenerSet) add(l pglisten.Listener) {
	s.ls = append(s.ls, l)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for ev := range l.Events() {
			now := time.Now().UnixNano()
			if ev.Kind != pglisten.KindNotification {
				if ev.Kind == pglisten.KindDown {
					s.gaps.Add(1)
				}
				continue // a direct Listener reports Resync after its first connect too
			}
			seq, _, ok := ParseData(ev.Payload)
			if !ok || seq <= 0 || seq >= int64(len(s.recv)) {
				s.bad.Add(1)
				continue
			}
			s.recv[seq].Store(now)
		}
	}()
}

func (s *listenerSet) close() {
	for _, l := range s.ls {
		_ = l.Close()
	}
	s.wg.Wait()
}

// notifier sends pg_notify at a rate, in small batches (one statement every 2 ms), channels
// round robin, and records each notification's send time.
type notifier struct {
	conn     *pgconn.PgConn
	channels []string
	sent     []int64
	seq      int64
}

func (n *notifier) run(ctx context.Context, rate float64, d time.Duration) error {
	const tick = 2 * time.Millisecond
	perTick := rate * tick.Seconds()
	var owed float64
	var sql []byte
	start := time.Now()
	next := start
	for time.Since(start) < d {
		if w := time.Until(next); w > 0 {
			time.Sleep(w)
		}
		next = next.Add(tick)
		owed += perTick
		k := int(owed)
		if k == 0 {
			continue
		}
		owed -= float64(k)
		now := time.Now().UnixNano()
		sql = append(sql[:0], "SELECT "...)
		for i := range k {
			n.seq++
			if n.seq >= int64(len(n.sent)) {
				return fmt.Errorf("notifier: more than %d notifications", len(n.sent)-1)
			}
			n.sent[n.seq] = now
			if i > 0 {
				sql = append(sql, ',')
			}
			sql = append(sql, "pg_notify('"...)
			sql = append(sql, n.channels[int(n.seq)%len(n.channels)]...)
			sql = append(sql, "','"...)
			sql = AppendData(sql, n.seq, now, 0)
			sql = append(sql, "')"...)
		}
		if _, err := n.conn.Exec(ctx, string(sql)).ReadAll(); err != nil {
			return err
		}
	}
	return nil
}

// HubLoad is scenario 5: p.Workers hub workers (pglisten.NewHub) on as many channels against `pgsse
// serve --hub-socket`, notifications at p.Rate/s for p.Duration.
//
// Phase 1 (hub): besides the workers, one direct LISTEN session on every channel is the
// reference, so the hub hop is measured per notification: hub receive − direct receive.
// Phase 2 (direct, no pgsse): the same workers each with their own LISTEN session
// (pglisten.NewDirect), which is what they do without pgsse. The census counts PostgreSQL
// sessions and their CPU in both phases. Results: target "pgsse" (via the hub) and
// "baseline" (direct sessions).
func HubLoad(ctx context.Context, e *Env, t Target, p Params, hp HubParams) ([]*Result, error) {
	sock := filepath.Join(e.Dir, "hub-"+randHex(3)+".sock")
	t.ExtraArgs = append(append([]string(nil), t.ExtraArgs...), "--hub-socket", sock)
	r, err := e.start(ctx, t, p)
	if err != nil {
		return nil, err
	}
	defer r.stop()
	maxSeq := int(hp.Rate*hp.Duration.Seconds()*1.1) + 1000
	channels := make([]string, hp.Workers)
	for i := range channels {
		channels[i] = "bench_hub_" + strconv.Itoa(i)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	phase := func(hub bool) (*Result, error) {
		res := &Result{Scenario: "5 hub", Target: "pgsse"}
		if !hub {
			res.Target = "baseline"
		}
		workers := newListenerSet(maxSeq)
		defer workers.close()
		for i, ch := range channels {
			var l pglisten.Listener
			var err error
			if hub {
				l, err = pglisten.NewHub(pglisten.HubConfig{Socket: sock, Name: "bench-w" + strconv.Itoa(i), Logger: quiet})
			} else {
				l, err = pglisten.NewDirect(pglisten.Config{DSN: r.db.URL, AppName: "bench-direct", Logger: quiet})
			}
			if err != nil {
				return nil, err
			}
			workers.add(l)
			if err := l.Listen(ctx, ch); err != nil {
				return nil, fmt.Errorf("worker %d: LISTEN %s: %w", i, ch, err)
			}
		}
		var ref *listenerSet
		if hub {
			ref = newListenerSet(maxSeq)
			defer ref.close()
			l, err := pglisten.NewDirect(pglisten.Config{DSN: r.db.URL, AppName: "bench-reference", Logger: quiet})
			if err != nil {
				return nil, err
			}
			ref.add(l)
			for _, ch := range channels {
				if err := l.Listen(ctx, ch); err != nil {
					return nil, err
				}
			}
		}
		conn, err := pgconn.Connect(ctx, r.db.URL)
		if err != nil {
			return nil, err
		}
		defer conn.Close(context.Background())
		n := &notifier{conn: conn, channels: channels, sent: make([]int64, maxSeq+1)}
		time.Sleep(300 * time.Millisecond)
		sessions, listenPIDs := census(ctx, r, hub)
		pg0 := cpuOf(listenPIDs)
		cpu0, _ := r.srv.CPU()
		self0, w0 := SelfCPU(), time.Now()
		if err := n.run(ctx, hp.Rate, hp.Duration); err != nil {
			return nil, err
		}
		time.Sleep(500 * time.Millisecond)
		cpu1, _ := r.srv.CPU()
		self1, w1 := SelfCPU(), time.Now()
		pg1 := cpuOf(listenPIDs)
		wall := w1.Sub(w0).Seconds()
		if err := r.alive(); err != nil {
			return nil, err
		}
		var lat, hop []time.Duration
		missing := 0
		for seq := int64(1); seq <= n.seq; seq++ {
			got := workers.recv[seq].Load()
			if got == 0 {
				missing++
				continue
			}
			lat = append(lat, time.Duration(got-n.sent[seq]))
			if ref != nil {
				if d := ref.recv[seq].Load(); d != 0 {
					hop = append(hop, time.Duration(got-d))
				}
			}
		}
		lq := Quantiles(lat, 0.5, 0.99)
		res.add("notifications", "per s", float64(n.seq)/hp.Duration.Seconds(), false)
		res.add("send→worker received p50", "ms", ms(lq[0]), true)
		res.add("send→worker received p99", "ms", ms(lq[1]), true)
		if hub {
			hq := Quantiles(hop, 0.5, 0.99)
			res.add("hub hop (hub − direct receive) p50", "µs", float64(hq[0])/1e3, true)
			res.add("hub hop (hub − direct receive) p99", "µs", float64(hq[1])/1e3, true)
			res.add("server CPU share (2 cores)", "%", 100*(cpu1-cpu0).Seconds()/(2*wall), true)
		}
		res.add("PostgreSQL sessions LISTENing for the workers", "", float64(sessions), true)
		res.add("their PostgreSQL CPU share (2 cores)", "%", 100*(pg1-pg0).Seconds()/(2*wall), true)
		res.add("client CPU share (2 cores)", "%", 100*(self1-self0).Seconds()/(2*wall), false)
		res.add("notifications missing", "", float64(missing), true)
		if g := workers.gaps.Load(); g > 0 {
			res.note("%d session losses at workers", g)
		}
		if hub {
			if m, err := r.srv.Metrics(ctx); err == nil {
				for _, name := range []string{"pgsse_hub_workers", "pgsse_listen_channels", "pgsse_evictions_total"} {
					for _, se := range m.Series(name) {
						res.note("census: %s", se)
					}
				}
			} else {
				res.note("census: %v", err)
			}
		}
		return res, nil
	}

	hubRes, err := phase(true)
	if err != nil {
		return nil, fmt.Errorf("hub phase: %w", err)
	}
	directRes, err := phase(false)
	if err != nil {
		return nil, fmt.Errorf("direct phase: %w", err)
	}
	return []*Result{hubRes, directRes}, nil
}

// census returns how many PostgreSQL sessions LISTEN for the workers (pgsse's one session in
// the hub phase, one per worker in the direct phase) and their backend PIDs.
func census(ctx context.Context, r *run, hub bool) (int, []int) {
	app := "bench-direct"
	if hub {
		app = "pgsse-listen"
	}
	conn, err := pgconn.Connect(ctx, r.db.admin)
	if err != nil {
		return 0, nil
	}
	defer conn.Close(context.Background())
	res := conn.ExecParams(ctx, "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND application_name = $2",
		[][]byte{[]byte(r.db.name), []byte(app)}, nil, nil, nil).Read()
	if res.Err != nil {
		return 0, nil
	}
	var pids []int
	for _, row := range res.Rows {
		if pid, err := strconv.Atoi(string(row[0])); err == nil {
			pids = append(pids, pid)
		}
	}
	return len(pids), pids
}

func cpuOf(pids []int) time.Duration {
	var d time.Duration
	for _, pid := range pids {
		if c, err := procCPU(pid); err == nil {
			d += c
		}
	}
	return d
}
