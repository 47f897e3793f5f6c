//go:build linux

package bench

import (
	"context"
	"fmt"
	"time"
)

// PubFanoutParams sizes scenario 16, publishers under a fan-out (issue 20): closed-loop
// publishers of one stream that p.Conns subscribers follow, over HTTP and over SQL in one run.
type PubFanoutParams struct {
	Conns      int           // subscribers of the stream (≤ 15,000)
	Publishers []int         // closed-loop publishers of each pair of phases (SQL, then HTTP)
	Duration   time.Duration // each phase publishes this long
	Drain      time.Duration // after it, wait at most this long for every subscriber to have every event
	// SlowDrain, when set, waits on past Drain, up to SlowDrain in all, as long as the
	// subscribers still receive events (none for drainStall: short). The small run's drain
	// is bound by the load client's CPU (≈ 10 µs a delivery under -race, one epoll loop):
	// 64 publishers commit 1,000–4,500 events in its second, 0.2–0.9 million deliveries,
	// 2–9 s of a core that a shared machine does not always give it; this tells a slow
	// client from subscribers that will never have every event. The drain figure and a note
	// say when it went past Drain.
	SlowDrain time.Duration
	Data      int // bytes of data per event
}

// drainStall is how long a SlowDrain waits without a delivery before it calls the
// subscribers short.
const drainStall = 5 * time.Second

func fullPubFanout() PubFanoutParams {
	return PubFanoutParams{Conns: 10000, Publishers: []int{2, 64}, Duration: 10 * time.Second, Drain: 20 * time.Second, Data: 64}
}

func smallPubFanout() PubFanoutParams {
	return PubFanoutParams{Conns: 200, Publishers: []int{2, 64}, Duration: time.Second, Drain: 10 * time.Second,
		SlowDrain: 90 * time.Second, Data: 64}
}

// PubFanout is scenario 16 against pgsse: for each count n of fp.Publishers, two phases on one
// server — n connections calling SELECT pgsse.publish (autocommit), then n keep-alive
// connections POSTing to /streams/{stream} — each publishing flat out (closed loop: a
// publisher sends its next event when it has the answer to the previous) for fp.Duration to a
// stream of its own that fp.Conns subscribers connected to beforehand follow. Reported per
// phase: durable events/s, the publisher's answer latency while the fan-out runs, the
// deliveries in the window and the server's CPU per million of them; then, after a drain of at
// most fp.Drain, whether every subscriber has every event: the client checks SSE ids (each
// subscriber must see 1, 2, 3, … of its stream, once each), since the publishers' own numbers
// in the data are not in commit order once several publish at once. The pgsse column is HTTP,
// the baseline column SQL, so the ratio reads HTTP ÷ SQL.
func PubFanout(ctx context.Context, e *Env, t Target, fp PubFanoutParams, p Params) ([]*Result, error) {
	r, tok, err := e.startPublishing(ctx, t, p)
	if err != nil {
		return nil, err
	}
	defer r.stop()
	const scenario = "16 publishers under fan-out"
	res := &Result{Scenario: scenario, Target: "pgsse"}
	sql := &Result{Scenario: scenario, Target: "baseline"}
	for _, n := range fp.Publishers {
		for _, x := range []struct {
			over string
			res  *Result
		}{{"SQL", sql}, {"HTTP", res}} {
			stream := fmt.Sprintf("fanout-%s-%d", x.over, n)
			e.logf("publishers under fan-out: %d %s publishers, %d subscribers", n, x.over, fp.Conns)
			ph, err := pubFanoutPhase(ctx, r, tok, fp, p, x.over == "HTTP", n, stream)
			if err != nil {
				return nil, fmt.Errorf("%d %s publishers: %w", n, x.over, err)
			}
			ph.report(x.res, fmt.Sprintf("%d publishers", n))
		}
	}
	res.note("the pgsse column is closed-loop keep-alive POST /streams/… publishers, the baseline column the same number of SQL connections calling pgsse.publish, %d subscribers of the stream, on one server in one run", fp.Conns)
	return []*Result{res, sql}, nil
}

// fanPhase is what one phase of scenario 16 measured.
type fanPhase struct {
	st                          *phaseStats
	subscribers                 int
	deliveries                  int64         // received in the publishing window
	cpu                         time.Duration // server CPU in the window
	caughtUp                    int           // subscribers that had the last event at the end of the drain
	drain                       time.Duration // end of the window → every subscriber had the last event (or fp.Drain)
	allCaughtUp                 bool
	pastDrain                   time.Duration // fp.Drain when the drain went past it (fp.SlowDrain), else 0
	gaps, dups, bad             int64
	connsWithGaps               int
	closed                      int64
	serverCPU, pgCPU, clientCPU float64 // % of the 2 cores in the window
}

func pubFanoutPhase(ctx context.Context, r *run, tok string, fp PubFanoutParams, p Params, http bool, n int, stream string) (*fanPhase, error) {
	const maxSeq = 1 << 20
	c, err := NewClient(ClientConfig{
		Addr: r.srv.SSE, Path: "/streams/" + stream, Sources: p.Sources, Readers: p.Readers,
		MaxSeq: maxSeq, RcvBuf: p.RcvBuf, ByID: true,
	})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	t0 := time.Now()
	if err := c.Connect(fp.Conns, false); err != nil {
		return nil, fmt.Errorf("connect %d subscribers: %w", fp.Conns, err)
	}
	r.e.logf("%s: %d subscribers connected in %v", r.t.label(), fp.Conns, time.Since(t0).Round(time.Millisecond))
	time.Sleep(500 * time.Millisecond)

	pp := PublishParams{Duration: fp.Duration, SQLConns: n, Stream: stream, Data: fp.Data}
	var (
		pg0, pg1     map[int]time.Duration
		cpu0, cpu1   time.Duration
		self0, self1 time.Duration
		d0, d1       int64
		w0, w1       time.Time
		cancel       context.CancelFunc = func() {}
		waitProfile                     = func() {}
	)
	over := "sql"
	if http {
		over = "http"
	}
	window := func() context.Context {
		waitProfile = r.profile(ctx, fmt.Sprintf("16-%s-%d", over, n), fp.Duration)
		pg0, cpu0, self0, d0, w0 = r.pgCPU(ctx), must(r.srv.CPU()), SelfCPU(), c.Delivered(), time.Now()
		var wctx context.Context
		wctx, cancel = context.WithTimeout(ctx, fp.Duration)
		return wctx
	}
	done := func() {
		pg1, cpu1, self1, d1, w1 = r.pgCPU(ctx), must(r.srv.CPU()), SelfCPU(), c.Delivered(), time.Now()
	}
	var st *phaseStats
	if http {
		st, err = publishHTTP(r.srv.SSE.String(), tok, pp, n, 1, 0, window, done)
	} else {
		st, err = publishSQL(ctx, r.db.URL, pp, window, done)
	}
	cancel()
	waitProfile()
	if err != nil {
		return nil, err
	}
	if st.events == 0 {
		return nil, fmt.Errorf("nothing was published (%d errors: %s)", st.errors, st.firstErr)
	}
	// On a stream of its own, the phase's events have the ids 1 … events.
	last := int64(st.events)
	if last >= maxSeq {
		return nil, fmt.Errorf("%d events: the client tracks ids up to %d", last, maxSeq-1)
	}
	ph := &fanPhase{st: st, subscribers: fp.Conns, deliveries: d1 - d0, cpu: cpu1 - cpu0}
	ph.allCaughtUp = c.WaitHave(last, fp.Conns, fp.Drain)
	if !ph.allCaughtUp && fp.SlowDrain > fp.Drain {
		ph.pastDrain = fp.Drain
		ph.allCaughtUp = c.WaitHaveProgress(last, fp.Conns, drainStall, fp.SlowDrain-time.Since(w1))
	}
	ph.drain = time.Since(w1)
	ph.caughtUp = c.Have(last)
	if err := r.alive(); err != nil {
		return nil, err
	}
	c.Close()
	cs := c.Stats()
	ph.gaps, ph.dups, ph.bad, ph.connsWithGaps, ph.closed = cs.Gaps, cs.Dups, cs.Bad, cs.ConnsWithGaps, cs.Closed
	wall := w1.Sub(w0).Seconds()
	ph.serverCPU = 100 * (cpu1 - cpu0).Seconds() / (2 * wall)
	ph.pgCPU = 100 * pgCPUDelta(pg0, pg1).Seconds() / (2 * wall)
	ph.clientCPU = 100 * (self1 - self0).Seconds() / (2 * wall)
	return ph, nil
}

func (ph *fanPhase) report(res *Result, label string) {
	st := ph.st
	wall := st.wall.Seconds()
	res.add(label+": durable events", "events/s", st.events/wall, false)
	res.add(label+": answer latency p50", "ms", ms(st.lat.Quantile(0.5)), true)
	res.add(label+": answer latency p99", "ms", ms(st.lat.Quantile(0.99)), true)
	res.add(label+": answer latency max", "ms", ms(st.lat.Quantile(1)), true)
	res.add(label+": deliveries in the window", "deliveries/s", float64(ph.deliveries)/wall, false)
	res.add(label+": server CPU per million deliveries", "CPU-s", ph.cpu.Seconds()/max(float64(ph.deliveries), 1)*1e6, true)
	res.add(label+": server CPU share (2 cores)", "%", ph.serverCPU, false)
	res.add(label+": PostgreSQL CPU share (2 cores)", "%", ph.pgCPU, false)
	res.add(label+": client CPU share (2 cores)", "%", ph.clientCPU, false)
	res.add(label+": subscribers with every event after the drain", "", float64(ph.caughtUp), false)
	if ph.allCaughtUp {
		res.add(label+": end of publishing → every subscriber had every event", "ms", ms(ph.drain), true)
	} else {
		res.note("%s: %d of %d subscribers had all %.0f events %v after publishing stopped", label, ph.caughtUp, ph.subscribers, st.events, ph.drain.Round(time.Millisecond))
	}
	if ph.pastDrain > 0 {
		res.note("%s: the drain went past its %v: the subscribers were still receiving (load average %s)", label, ph.pastDrain, LoadAvg())
	}
	res.add(label+": subscribers with an id gap", "", float64(ph.connsWithGaps), true)
	res.add(label+": ids skipped", "", float64(ph.gaps), true)
	res.add(label+": ids repeated or out of order", "", float64(ph.dups), true)
	res.add(label+": events without a numeric id or data", "", float64(ph.bad), true)
	res.add(label+": subscribers closed by the server", "", float64(ph.closed), true)
	if st.errors > 0 {
		res.note("%s: %d requests failed (%s)", label, st.errors, st.firstErr)
	}
}
