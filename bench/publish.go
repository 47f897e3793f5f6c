//go:build linux

package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/store"
)

// PublishParams sizes scenario 9, publishing (issue 13).
type PublishParams struct {
	Duration   time.Duration // each throughput phase
	SQLConns   int           // (a) connections calling pgsse.publish
	HTTPConns  int           // (b) keep-alive POST /streams publishers
	BatchConns int           // (c) keep-alive POST /publish publishers
	BatchSize  int           // (c) events per batch
	Streams    int           // events spread over this many streams
	Stream     string        // when set, every event goes to this one stream instead (scenario 16)
	Data       int           // bytes of data per event
	SteadyRate float64       // (d) events/s offered by the HTTPConns publishers together
	// (e) one subscriber: LatencyEvents events POSTed at LatencyRate per second.
	LatencyEvents int
	LatencyRate   float64
	Phases        string // the phases to run, by letter ("" = all); a skipped one's figures are 0
}

func fullPublish() PublishParams {
	return PublishParams{
		Duration: 10 * time.Second, SQLConns: 8, HTTPConns: 64, BatchConns: 8, BatchSize: 100,
		Streams: 100, Data: 64, SteadyRate: 5000, LatencyEvents: 1000, LatencyRate: 50,
	}
}

func smallPublish() PublishParams {
	p := fullPublish()
	p.Duration = 2 * time.Second
	p.LatencyEvents = 100
	return p
}

// benchSecret is the HS256 key of the server under test in scenario 9 (publishing needs a
// token with a publish grant).
const benchSecret = "bench-secret-0123456789-abcdefghijklmn"

// startPublishing starts the server with the bench's JWT secret and mints a token that may
// publish to every stream (scenarios 9 and 16).
func (e *Env) startPublishing(ctx context.Context, t Target, p Params) (*run, string, error) {
	t.ExtraArgs = append(append([]string(nil), t.ExtraArgs...), "--jwt-secret", benchSecret)
	r, err := e.start(ctx, t, p)
	if err != nil {
		return nil, "", err
	}
	tok, err := auth.Mint(auth.MintKey{Secret: []byte(benchSecret)}, auth.Claims{Publish: []string{"*"}}, time.Hour, "", "", time.Now())
	if err != nil {
		r.stop()
		return nil, "", err
	}
	return r, tok, nil
}

// Publish is scenario 9 against pgsse, all phases in one run on one server and database:
//
//	(a) p.SQLConns connections calling SELECT pgsse.publish($1, $2), one transaction each
//	(b) p.HTTPConns keep-alive connections POSTing one event each to /streams/{stream}
//	(c) p.BatchConns keep-alive connections POSTing NDJSON batches of p.BatchSize to /publish
//	(d) (b) at a steady p.SteadyRate events/s in all: the publish latency then
//	(e) one subscriber, one publisher POSTing p.LatencyRate events/s: POST sent → event
//	    received by the subscriber
//
// (a)–(c) run flat out for p.Duration each over p.Streams streams; an event counts once its
// answer (its COMMIT) is back. The result's "baseline" column is (a), so that the ratio
// column reads HTTP (group commit) ÷ pgsse.publish.
func Publish(ctx context.Context, e *Env, t Target, pp PublishParams, p Params) ([]*Result, error) {
	r, tok, err := e.startPublishing(ctx, t, p)
	if err != nil {
		return nil, err
	}
	defer r.stop()
	res := &Result{Scenario: "9 publish", Target: "pgsse"}
	sql := &Result{Scenario: "9 publish", Target: "baseline"}

	// phase runs one publishing phase: run sets up its connections, calls window to start
	// the measured window (which ends when the returned context is done) and calls done
	// before it tears its connections down, so that CPU is sampled while they exist.
	phase := func(name string, run func(window func() context.Context, done func()) (*phaseStats, error)) (*phaseStats, error) {
		if pp.Phases != "" && !strings.Contains(pp.Phases, name[1:2]) {
			return &phaseStats{wall: time.Nanosecond}, nil
		}
		e.logf("publish: %s", name)
		var (
			pg0, pg1     map[int]time.Duration
			cpu0, cpu1   time.Duration
			self0, self1 time.Duration
			m0, m1       publishTotals
			mErr0, mErr1 error
			wait         func()
			cancel       context.CancelFunc = func() {}
		)
		window := func() context.Context {
			wait = r.profile(ctx, "9-publish-"+strings.Trim(strings.Fields(name)[0], "()"), pp.Duration)
			pg0, cpu0, self0 = r.pgCPU(ctx), must(r.srv.CPU()), SelfCPU()
			m0, mErr0 = publishCounters(ctx, r)
			var wctx context.Context
			wctx, cancel = context.WithTimeout(ctx, pp.Duration)
			return wctx
		}
		done := func() {
			pg1, cpu1, self1 = r.pgCPU(ctx), must(r.srv.CPU()), SelfCPU()
			m1, mErr1 = publishCounters(ctx, r)
		}
		st, err := run(window, done)
		cancel()
		if wait != nil {
			wait()
		}
		if err == nil {
			err = errors.Join(mErr0, mErr1) // the transactions per phase come from the server's metrics
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		wall := st.wall.Seconds()
		st.serverCPU = 100 * (cpu1 - cpu0).Seconds() / (2 * wall)
		st.pgCPU = 100 * pgCPUDelta(pg0, pg1).Seconds() / (2 * wall)
		st.clientCPU = 100 * (self1 - self0).Seconds() / (2 * wall)
		if tx := m1.transactions - m0.transactions; tx > 0 {
			st.perTx = (m1.events - m0.events) / tx
			st.txTime = time.Duration((m1.commitSeconds - m0.commitSeconds) / tx * 1e9)
			st.txRate = tx / wall
		}
		return st, r.alive()
	}

	a, err := phase("(a) pgsse.publish", func(window func() context.Context, done func()) (*phaseStats, error) {
		return publishSQL(ctx, r.db.URL, pp, window, done)
	})
	if err != nil {
		return nil, err
	}
	b, err := phase("(b) POST /streams", func(window func() context.Context, done func()) (*phaseStats, error) {
		return publishHTTP(r.srv.SSE.String(), tok, pp, pp.HTTPConns, 1, 0, window, done)
	})
	if err != nil {
		return nil, err
	}
	c, err := phase("(c) POST /publish", func(window func() context.Context, done func()) (*phaseStats, error) {
		return publishHTTP(r.srv.SSE.String(), tok, pp, pp.BatchConns, pp.BatchSize, 0, window, done)
	})
	if err != nil {
		return nil, err
	}
	d, err := phase("(d) steady POST /streams", func(window func() context.Context, done func()) (*phaseStats, error) {
		return publishHTTP(r.srv.SSE.String(), tok, pp, pp.HTTPConns, 1, pp.SteadyRate, window, done)
	})
	if err != nil {
		return nil, err
	}
	lat, err := publishLatency(ctx, r, tok, pp, p)
	if err != nil {
		return nil, err
	}

	a.perTx = 1 // one pgsse.publish per transaction
	for _, x := range []struct {
		res *Result
		st  *phaseStats
	}{{sql, a}, {res, b}} {
		label := "(a)/(b) flat out"
		x.res.add(label+": durable events", "events/s", x.st.events/x.st.wall.Seconds(), false)
		x.res.add(label+": publish latency p50", "ms", ms(x.st.lat.Quantile(0.5)), true)
		x.res.add(label+": publish latency p99", "ms", ms(x.st.lat.Quantile(0.99)), true)
		x.res.add(label+": events per transaction", "", x.st.perTx, false)
		if x.st.txTime > 0 {
			x.res.add(label+": transaction time (mean) / transactions per s", "ms", ms(x.st.txTime), true)
			x.res.add(label+": transactions per s", "tx/s", x.st.txRate, false)
		}
		x.res.add(label+": server CPU share (2 cores)", "%", x.st.serverCPU, false)
		x.res.add(label+": PostgreSQL CPU share (2 cores)", "%", x.st.pgCPU, false)
		x.res.add(label+": client CPU share (2 cores)", "%", x.st.clientCPU, false)
	}
	res.note("(a)/(b): the baseline column is %d SQL connections calling pgsse.publish, the pgsse column %d keep-alive connections POSTing to /streams/…", pp.SQLConns, pp.HTTPConns)
	label := fmt.Sprintf("(c) POST /publish, %d connections, batches of %d", pp.BatchConns, pp.BatchSize)
	res.add(label+": durable events", "events/s", c.events/c.wall.Seconds(), false)
	res.add(label+": batch latency p50", "ms", ms(c.lat.Quantile(0.5)), true)
	res.add(label+": batch latency p99", "ms", ms(c.lat.Quantile(0.99)), true)
	res.add(label+": events per transaction", "", c.perTx, false)
	res.add(label+": server CPU share (2 cores)", "%", c.serverCPU, false)
	res.add(label+": PostgreSQL CPU share (2 cores)", "%", c.pgCPU, false)
	label = fmt.Sprintf("(d) POST /streams at a steady %.0f events/s", pp.SteadyRate)
	res.add(label+": achieved", "events/s", d.events/d.wall.Seconds(), false)
	res.add(label+": publish latency p50", "ms", ms(d.lat.Quantile(0.5)), true)
	res.add(label+": publish latency p99", "ms", ms(d.lat.Quantile(0.99)), true)
	res.add(label+": events per transaction", "", d.perTx, false)
	label = fmt.Sprintf("(e) one subscriber, POST /streams at %.0f/s", pp.LatencyRate)
	res.add(label+": POST sent → event received p50", "ms", ms(lat.received.Quantile(0.5)), true)
	res.add(label+": POST sent → event received p99", "ms", ms(lat.received.Quantile(0.99)), true)
	res.add(label+": POST sent → answer p50", "ms", ms(lat.answered.Quantile(0.5)), true)
	res.add(label+": events missing", "", float64(lat.missing), true)
	if len(lat.stages) > 0 {
		// An event delivered at its COMMIT's answer is written from there: its notification
		// comes beside the path (written then counts from the answer).
		early := lat.early >= float64(pp.LatencyEvents)/2
		res.add(label+": delivered at the COMMIT's answer (pgsse_early_deliveries_total)", "events", lat.early, false)
		sum := 0.0
		for _, stage := range publishStages {
			res.add(label+": stage "+stage+" mean (pgsse_publish_stage_seconds)", "ms", lat.stages[stage]*1e3, true)
			if stage != "notified" || !early {
				sum += lat.stages[stage]
			}
		}
		res.add(label+": stage answered mean (commit answered → answer written)", "ms", lat.stages["answered"]*1e3, true)
		if n := lat.received.Count(); n > 0 {
			mean := float64(lat.receivedSum) / float64(n) / 1e9
			res.add(label+": POST sent → event received mean", "ms", mean*1e3, true)
			res.add(label+": stage means summed ÷ measured mean", "", sum/mean, false)
			// The stages start when the loop sees the request and end at the server's write:
			// the request's way in and the event's way out (loopback, and waking the loop
			// and the client's reader) are outside them. The answer takes the same two
			// ways, and its stages are measured too, so its mean less theirs is that time
			// in this run.
			if m := lat.answered.Count(); m > 0 {
				toAnswer := lat.stages["answered"]
				for _, stage := range publishStages[:5] { // head … committed
					toAnswer += lat.stages[stage]
				}
				amean := float64(lat.answeredSum) / float64(m) / 1e9
				outside := amean - toAnswer
				res.add(label+": POST sent → answer mean", "ms", amean*1e3, true)
				res.add(label+": outside the server (answer mean − its stages: loopback both ways, wake-ups)", "ms", outside*1e3, true)
				res.add(label+": (stage means + outside) ÷ measured mean", "", (sum+outside)/mean, false)
			}
			// The same with medians, read from the stage histogram's buckets (within 15 % of
			// each stage's true median from 10 µs to 10 ms). Medians do not add up as means
			// do, so this is a check of the breakdown, not an identity.
			medSum, medToAnswer := 0.0, lat.stageMedians["answered"]
			for i, stage := range publishStages {
				if stage != "notified" || !early {
					medSum += lat.stageMedians[stage]
				}
				if i < 5 {
					medToAnswer += lat.stageMedians[stage]
				}
			}
			if p50, a50 := lat.received.Quantile(0.5).Seconds(), lat.answered.Quantile(0.5).Seconds(); p50 > 0 && !math.IsNaN(medSum+medToAnswer) {
				for _, stage := range slices.Concat(publishStages, []string{"answered"}) {
					res.add(label+": stage "+stage+" median (pgsse_publish_stage_seconds buckets)", "ms", lat.stageMedians[stage]*1e3, true)
				}
				res.add(label+": stage medians summed (pgsse_publish_stage_seconds buckets)", "ms", medSum*1e3, true)
				res.add(label+": stage medians summed ÷ measured median", "", medSum/p50, false)
				res.add(label+": outside the server, medians (answer p50 − its stages' medians)", "ms", (a50-medToAnswer)*1e3, true)
				res.add(label+": (stage medians + outside) ÷ measured median", "", (medSum+a50-medToAnswer)/p50, false)
			}
		}
	}
	for _, st := range []*phaseStats{a, b, c, d} {
		if st.errors > 0 {
			res.note("%d requests failed in a phase (%s)", st.errors, st.firstErr)
		}
	}
	return []*Result{res, sql}, nil
}

// stream is the stream of a publisher's n-th event: pp.Stream, else one of pp.Streams.
func (pp *PublishParams) stream(n int) string {
	if pp.Stream != "" {
		return pp.Stream
	}
	return "bench/" + strconv.Itoa(n%pp.Streams)
}

func must[T any](v T, _ error) T { return v }

// phaseStats is what one publishing phase measured.
type phaseStats struct {
	events                      float64 // durable events whose COMMIT was answered
	wall                        time.Duration
	lat                         Histogram // per request: sent → answered
	errors                      int64
	firstErr                    string
	perTx                       float64
	txTime                      time.Duration // mean time of one transaction (sent → COMMIT answered)
	txRate                      float64       // transactions per second
	serverCPU, pgCPU, clientCPU float64
}

// publishSQL is phase (a): pp.SQLConns connections each calling pgsse.publish in its own
// transaction (autocommit), flat out until ctx is done.
func publishSQL(ctx context.Context, dsn string, pp PublishParams, window func() context.Context, done func()) (*phaseStats, error) {
	conns := make([]*pgconn.PgConn, pp.SQLConns)
	for i := range conns {
		c, err := pgconn.Connect(ctx, dsn)
		if err != nil {
			for _, c := range conns[:i] {
				c.Close(context.Background())
			}
			return nil, err
		}
		conns[i] = c
	}
	defer func() {
		for _, c := range conns {
			c.Close(context.Background())
		}
	}()
	data := string(AppendData(nil, 0, 0, pp.Data))
	var events, errs atomic.Int64
	hists := make([]Histogram, len(conns))
	var wg sync.WaitGroup
	ctx = window()
	start := time.Now()
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := i; ctx.Err() == nil; n += len(conns) {
				t0 := time.Now()
				if _, err := store.Publish(context.Background(), c, pp.stream(n), data, "", nil); err != nil {
					errs.Add(1)
					return
				}
				hists[i].Add(time.Since(t0).Nanoseconds())
				events.Add(1)
			}
		}()
	}
	wg.Wait()
	st := &phaseStats{events: float64(events.Load()), wall: time.Since(start), errors: errs.Load()}
	done()
	for i := range hists {
		st.lat.Merge(&hists[i])
	}
	return st, nil
}

// publishHTTP runs conns keep-alive publishers until ctx is done: POST /streams/{stream}
// when batch is 1, else NDJSON batches of that many to POST /publish. rate > 0 paces them
// to rate events/s in all (each connection sends on its own schedule, or at once when its
// previous answer came late).
func publishHTTP(addr, tok string, pp PublishParams, conns, batch int, rate float64, window func() context.Context, done func()) (*phaseStats, error) {
	var events, errs atomic.Int64
	var firstErr atomic.Value
	fail := func(err error) {
		errs.Add(1)
		firstErr.CompareAndSwap(nil, err.Error())
	}
	hists := make([]Histogram, conns)
	socks := make([]net.Conn, conns)
	for i := range socks {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			for _, c := range socks[:i] {
				c.Close()
			}
			return nil, err
		}
		socks[i] = c
	}
	defer func() {
		for _, c := range socks {
			c.Close()
		}
	}()
	var wg sync.WaitGroup
	ctx := window()
	start := time.Now()
	for i, conn := range socks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rd := bufio.NewReaderSize(conn, 16<<10)
			var req, body []byte
			var interval time.Duration
			if rate > 0 {
				interval = time.Duration(float64(time.Second) * float64(conns*batch) / rate)
			}
			next := time.Now().Add(time.Duration(i) * interval / time.Duration(conns))
			for n := i; ctx.Err() == nil; n += conns {
				if interval > 0 {
					if d := time.Until(next); d > 0 {
						select {
						case <-ctx.Done():
							return
						case <-time.After(d):
						}
					}
					next = next.Add(interval)
				}
				t0 := time.Now()
				body = body[:0]
				if batch == 1 {
					body = AppendData(body, int64(n), t0.UnixNano(), pp.Data)
					req = appendPost(req[:0], "/streams/"+pp.stream(n), tok, "", body)
				} else {
					for k := range batch {
						body = append(body, `{"stream":"bench/`...)
						body = strconv.AppendInt(body, int64((n*batch+k)%pp.Streams), 10)
						body = append(body, `","data":"`...)
						body = AppendData(body, int64(n*batch+k), t0.UnixNano(), pp.Data)
						body = append(body, "\"}\n"...)
					}
					req = appendPost(req[:0], "/publish", tok, "application/x-ndjson", body)
				}
				_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
				if _, err := conn.Write(req); err != nil {
					fail(err)
					return
				}
				status, err := readAnswer(rd)
				if err != nil {
					fail(err)
					return
				}
				if status != 200 {
					fail(fmt.Errorf("status %d", status))
					continue
				}
				hists[i].Add(time.Since(t0).Nanoseconds())
				events.Add(int64(batch))
			}
		}()
	}
	wg.Wait()
	st := &phaseStats{events: float64(events.Load()), wall: time.Since(start), errors: errs.Load()}
	done()
	if v := firstErr.Load(); v != nil {
		st.firstErr = v.(string)
	}
	for i := range hists {
		st.lat.Merge(&hists[i])
	}
	if st.events == 0 {
		return nil, fmt.Errorf("nothing was published (%d errors: %s)", st.errors, st.firstErr)
	}
	return st, nil
}

// appendPost appends a keep-alive POST request with a Content-Length body.
func appendPost(dst []byte, target, tok, contentType string, body []byte) []byte {
	dst = append(dst, "POST "...)
	dst = append(dst, target...)
	dst = append(dst, " HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer "...)
	dst = append(dst, tok...)
	if contentType != "" {
		dst = append(dst, "\r\nContent-Type: "...)
		dst = append(dst, contentType...)
	}
	dst = append(dst, "\r\nContent-Length: "...)
	dst = strconv.AppendInt(dst, int64(len(body)), 10)
	dst = append(dst, "\r\n\r\n"...)
	return append(dst, body...)
}

var errAnswer = errors.New("malformed answer")

// readAnswer reads one response (head and Content-Length body) and returns its status.
func readAnswer(rd *bufio.Reader) (int, error) {
	line, err := rd.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) {
		return 0, errAnswer
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, errAnswer
	}
	length := -1
	for {
		h, err := rd.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		if len(h) <= 2 {
			break
		}
		if v, ok := bytes.CutPrefix(h, []byte("Content-Length: ")); ok {
			if length, err = strconv.Atoi(string(bytes.TrimSpace(v))); err != nil {
				return 0, errAnswer
			}
		}
	}
	if length < 0 {
		return 0, errAnswer
	}
	if _, err := rd.Discard(length); err != nil {
		return 0, err
	}
	return status, nil
}

// latencyStats is phase (e).
type latencyStats struct {
	received, answered Histogram
	receivedSum        int64 // ns, for the mean the stage means add up to
	answeredSum        int64 // ns: with the stages up to the answer, the time outside the server
	missing            int
	stages             map[string]float64 // pgsse_publish_stage_seconds over the phase: mean seconds per stage
	stageMedians       map[string]float64 // and median seconds per stage, read from its buckets
	early              float64            // of its events, delivered at their COMMIT's answer (pgsse_early_deliveries_total)
}

// publishLatency is phase (e): one subscriber, one keep-alive publisher POSTing
// pp.LatencyEvents events at pp.LatencyRate per second; latency from sending the POST to
// the subscriber reading the event, and to the publisher reading the answer.
func publishLatency(ctx context.Context, r *run, tok string, pp PublishParams, p Params) (*latencyStats, error) {
	r.e.logf("publish: (e) one subscriber")
	n := pp.LatencyEvents
	c, err := r.client("latency", 1, p, n+1)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	conn, err := net.DialTimeout("tcp", r.srv.SSE.String(), 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	rd := bufio.NewReader(conn)
	st := &latencyStats{}
	sent := make([]int64, n+1)
	answered := make([]int64, n+1)
	stages0 := publishStageTotals(ctx, r)
	interval := time.Duration(float64(time.Second) / pp.LatencyRate)
	next := time.Now()
	var req, body []byte
	for seq := 1; seq <= n; seq++ {
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		next = next.Add(interval)
		t0 := time.Now().UnixNano()
		sent[seq] = t0
		c.SetRef(int64(seq), t0)
		body = AppendData(body[:0], int64(seq), t0, p.Data)
		req = appendPost(req[:0], "/streams/latency", tok, "", body)
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := conn.Write(req); err != nil {
			return nil, err
		}
		status, err := readAnswer(rd)
		if err != nil {
			return nil, err
		}
		if status != 200 {
			return nil, fmt.Errorf("(e): status %d", status)
		}
		answered[seq] = time.Now().UnixNano()
		st.answered.Add(answered[seq] - t0)
		st.answeredSum += answered[seq] - t0
	}
	c.WaitHave(int64(n), 1, 5*time.Second)
	if err := r.alive(); err != nil {
		return nil, err
	}
	stages1 := publishStageTotals(ctx, r)
	st.stages = map[string]float64{}
	st.stageMedians = map[string]float64{}
	st.early = stages1[earlyTotal].sum - stages0[earlyTotal].sum
	for stage, t1 := range stages1 {
		if stage == earlyTotal {
			continue
		}
		if t0 := stages0[stage]; t1.count > t0.count {
			st.stages[stage] = (t1.sum - t0.sum) / (t1.count - t0.count)
			st.stageMedians[stage] = bucketMedian(t0.buckets, t1.buckets)
		}
	}
	c.Close()
	cs := c.Stats()
	for seq := 1; seq <= n; seq++ {
		if cs.Last[seq] != 0 {
			st.received.Add(cs.Last[seq] - sent[seq])
			st.receivedSum += cs.Last[seq] - sent[seq]
		} else {
			st.missing++
		}
	}
	return st, ctx.Err()
}

// publishStages are the stages of pgsse_publish_stage_seconds on the way from a POST to
// its subscriber, in order (answered is the publisher's, beside the path).
var publishStages = []string{"head", "body", "queued", "sent", "committed", "notified", "written"}

type stageTotal struct {
	sum, count float64
	buckets    map[float64]float64 // cumulative count by upper bound
}

// bucketMedian is histogram_quantile(0.5, …) over the observations between two readings of
// a histogram's cumulative buckets (linear within the bucket; NaN without observations).
func bucketMedian(b0, b1 map[float64]float64) float64 {
	les := make([]float64, 0, len(b1))
	for le := range b1 {
		les = append(les, le)
	}
	slices.Sort(les)
	if len(les) == 0 {
		return math.NaN()
	}
	total := b1[les[len(les)-1]] - b0[les[len(les)-1]]
	rank := total / 2
	lower, below := 0.0, 0.0
	for _, le := range les {
		n := b1[le] - b0[le]
		if n >= rank && n > below {
			if math.IsInf(le, 1) {
				return lower
			}
			return lower + (le-lower)*(rank-below)/(n-below)
		}
		lower, below = le, n
	}
	return math.NaN()
}

// earlyTotal is publishStageTotals' entry for pgsse_early_deliveries_total (its value in both
// fields): events delivered at their COMMIT's answer, whose path skips the notified stage.
const earlyTotal = "early deliveries"

// publishStageTotals reads pgsse_publish_stage_seconds' sums and counts by stage (none
// from a server that does not export it).
func publishStageTotals(ctx context.Context, r *run) map[string]stageTotal {
	var m bytes.Buffer
	t := map[string]stageTotal{}
	if err := r.srv.Get(ctx, "/metrics", &m); err != nil {
		return t
	}
	for ln := range strings.Lines(m.String()) {
		f := strings.Fields(ln)
		if len(f) != 2 {
			continue
		}
		if f[0] == "pgsse_early_deliveries_total" {
			v, _ := strconv.ParseFloat(f[1], 64)
			t[earlyTotal] = stageTotal{sum: v, count: v}
			continue
		}
		name, labels, ok := strings.Cut(f[0], `{stage="`)
		if !ok {
			continue
		}
		stage, _, _ := strings.Cut(labels, `"`)
		v, _ := strconv.ParseFloat(f[1], 64)
		tot := t[stage]
		switch name {
		case "pgsse_publish_stage_seconds_sum":
			tot.sum = v
		case "pgsse_publish_stage_seconds_count":
			tot.count = v
		case "pgsse_publish_stage_seconds_bucket":
			_, le, ok := strings.Cut(labels, `le="`)
			if !ok {
				continue
			}
			le, _, _ = strings.Cut(le, `"`)
			bound, err := strconv.ParseFloat(le, 64) // "+Inf" too
			if err != nil {
				continue
			}
			if tot.buckets == nil {
				tot.buckets = map[float64]float64{}
			}
			tot.buckets[bound] = v
		default:
			continue
		}
		t[stage] = tot
	}
	return t
}

// publishCounters reads the server's publish metrics (transactions and their events).
type publishTotals struct{ transactions, events, commitSeconds float64 }

func publishCounters(ctx context.Context, r *run) (publishTotals, error) {
	var t publishTotals
	m, err := r.srv.Metrics(ctx)
	if err != nil {
		return t, err
	}
	for _, f := range []struct {
		selector string
		v        *float64
	}{
		{"pgsse_publish_batch_size_count", &t.transactions},
		{"pgsse_publish_batch_size_sum", &t.events},
		{"pgsse_publish_commit_seconds_sum", &t.commitSeconds},
	} {
		if *f.v, err = m.Lookup(f.selector); err != nil {
			return t, err
		}
	}
	return t, nil
}
