//go:build linux

package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgsse/pgsse/auth"
)

// Scenarios 12 and 13, presence (issue 21, SPEC §3d):
//
//	12 presence churn  p.PresenceChurn connections, each with a subject of its own, join the
//	                   presence stream "churn" as fast as they can, then all leave, while
//	                   p.PresenceOthers subscribers of another stream take p.PresenceRate events
//	                   per second; once with presence kept for "churn" and once without (the
//	                   same churn), each on a fresh server → join-to-visible and
//	                   leave-to-visible on a presence=1 watcher (p50, p99, in intervals),
//	                   PostgreSQL statements per interval from the server's own
//	                   pgsse_presence_writes_total, and the others' delivery p99 before and
//	                   during the churn (SPEC: ≤ 2× before + 10 ms; presence off for the ratio).
//	13 presence hold   p.PresenceHoldSubjects connections, each following p.PresenceHoldStreams
//	                   presence streams (GET /streams?stream=…) under a subject of its own,
//	                   held p.PresenceHold → rows in pgsse.presence_entries, RSS and
//	                   statements per interval at the start and the end (flat: no growth after
//	                   the first interval).

const presenceSecret = "bench-presence-secret-0123456789abcdef"

// PresenceLabel and NoPresenceLabel name scenario 12's columns: the table's pgsse and
// baseline, the baseline being pgsse without presence for the stream (the same churn).
const (
	PresenceLabel   = "pgsse"
	NoPresenceLabel = "baseline"
)

// PresenceParams are scenarios 12 and 13's.
type PresenceParams struct {
	Interval     time.Duration // --presence-interval
	Churn        int           // 12: connections joining and leaving
	Others       int           // 12: subscribers of another stream meanwhile
	Rate         float64       // 12: their events per second
	HoldSubjects int           // 13: connections (one subject each)
	HoldStreams  int           // 13: presence streams each follows
	Hold         time.Duration // 13: how long they are held
}

func presenceTarget(t Target, p PresenceParams, on bool) Target {
	t.ExtraArgs = append(append([]string(nil), t.ExtraArgs...), "--jwt-secret", presenceSecret,
		"--max-streams-per-connection", strconv.Itoa(max(p.HoldStreams, 1)))
	if on {
		t.ExtraArgs = append(t.ExtraArgs, "--presence-streams", "churn,hold/*", "--presence-interval", p.Interval.String())
	}
	return t
}

func presenceTokens(n int, prefix string) ([]string, error) {
	out := make([]string, n)
	now := time.Now()
	for i := range out {
		tok, err := auth.Mint(auth.MintKey{Secret: []byte(presenceSecret)},
			auth.Claims{Streams: []string{"*"}, Subject: prefix + strconv.Itoa(i)}, 2*time.Hour, "", "", now)
		if err != nil {
			return nil, err
		}
		out[i] = tok
	}
	return out, nil
}

// rawJoin opens n connections of path(i) from the loopback sources, 32 at a time, each
// until its 200 response head: the connections and when each head arrived.
func rawJoin(addr string, sources, n int, path func(i int) string) ([]net.Conn, []time.Time, error) {
	conns := make([]net.Conn, n)
	heads := make([]time.Time, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for w := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := net.Dialer{Timeout: 10 * time.Second,
				LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+w%max(sources, 1)))}}
			buf := make([]byte, 4096)
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				c, err := d.Dial("tcp", addr)
				if err != nil {
					errs <- err
					return
				}
				if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: bench\r\n\r\n", path(i)); err != nil {
					errs <- err
					return
				}
				_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
				got := 0
				for !bytes.Contains(buf[:got], []byte("\r\n\r\n")) && got < len(buf) {
					k, err := c.Read(buf[got:])
					if err != nil {
						errs <- fmt.Errorf("connection %d: %w", i, err)
						return
					}
					got += k
				}
				heads[i] = time.Now()
				if !bytes.HasPrefix(buf[:got], []byte("HTTP/1.1 200")) {
					errs <- fmt.Errorf("connection %d: %q", i, buf[:min(got, 200)])
					return
				}
				_ = c.SetReadDeadline(time.Time{})
				conns[i] = c
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
		return nil, nil, err
	}
	return conns, heads, nil
}

// presenceWatch reads a presence=1 connection's pgsse:presence events: when each subject was
// first seen joining and leaving.
type presenceWatch struct {
	conn   net.Conn
	mu     sync.Mutex
	joined map[string]time.Time
	left   map[string]time.Time
	events int
}

func watchPresence(addr, stream, token string) (*presenceWatch, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	if _, err := fmt.Fprintf(c, "GET /streams/%s?presence=1&token=%s HTTP/1.1\r\nHost: bench\r\n\r\n", stream, token); err != nil {
		c.Close()
		return nil, err
	}
	w := &presenceWatch{conn: c, joined: map[string]time.Time{}, left: map[string]time.Time{}}
	go func() {
		r := bufio.NewReaderSize(c, 1<<20)
		presence := false
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimSuffix(line, "\n")
			switch {
			case line == "event: pgsse:presence":
				presence = true
			case presence && strings.HasPrefix(line, "data: "):
				now := time.Now()
				var d struct{ Join, Leave []string }
				if json.Unmarshal([]byte(line[len("data: "):]), &d) == nil {
					w.mu.Lock()
					w.events++
					for _, s := range d.Join {
						if _, ok := w.joined[s]; !ok {
							w.joined[s] = now
						}
					}
					for _, s := range d.Leave {
						if _, ok := w.left[s]; !ok {
							w.left[s] = now
						}
					}
					w.mu.Unlock()
				}
			case line == "":
				presence = false
			}
		}
	}()
	return w, nil
}

// wait waits until n subjects have joined (or left) or timeout passes.
func (w *presenceWatch) wait(n int, leaves bool, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		w.mu.Lock()
		got := len(w.joined)
		if leaves {
			got = len(w.left)
		}
		w.mu.Unlock()
		if got >= n {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// visible is, per subject i (prefix+i) with a reference time, how long after it the watcher
// saw it in seen.
func visible(seen map[string]time.Time, prefix string, refs []time.Time) (lat []time.Duration, missing int) {
	for i, ref := range refs {
		if at, ok := seen[prefix+strconv.Itoa(i)]; ok {
			lat = append(lat, max(at.Sub(ref), 0))
		} else {
			missing++
		}
	}
	return lat, missing
}

// metric reads one unlabelled sample of the server's /metrics (0 if absent).
func (r *run) metric(ctx context.Context, name string) float64 {
	var b bytes.Buffer
	if err := r.srv.Get(ctx, "/metrics", &b); err != nil {
		return 0
	}
	for ln := range strings.Lines(b.String()) {
		if v, ok := strings.CutPrefix(ln, name+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return 0
}

// buckets reads a histogram of the server's /metrics (labels: its other labels, as the
// server writes them before le, e.g. `stage="written",`): cumulative counts by upper bound
// (seconds), in the order the server lists them (ascending; +Inf last).
func (r *run) buckets(ctx context.Context, name, labels string) (les []float64, counts []float64) {
	var b bytes.Buffer
	if err := r.srv.Get(ctx, "/metrics", &b); err != nil {
		return nil, nil
	}
	for ln := range strings.Lines(b.String()) {
		rest, ok := strings.CutPrefix(ln, name+`_bucket{`+labels+`le="`)
		if !ok {
			continue
		}
		le, v, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		bound, err := strconv.ParseFloat(le, 64) // "+Inf" parses as +Inf
		if err != nil {
			continue
		}
		n, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
		les, counts = append(les, bound), append(counts, n)
	}
	return les, counts
}

// bucketQuantile is the q-quantile of what a histogram counted between two readings (the
// upper bound of the bucket it falls in: a bound, not an estimate), in seconds; 0 when
// nothing was counted.
func bucketQuantile(les, before, after []float64, q float64) float64 {
	if len(les) == 0 || len(after) != len(les) {
		return 0
	}
	base := func(i int) float64 {
		if len(before) == len(les) {
			return before[i]
		}
		return 0
	}
	total := after[len(les)-1] - base(len(les)-1)
	if total <= 0 {
		return 0
	}
	for i, le := range les {
		if after[i]-base(i) >= q*total {
			return le
		}
	}
	return les[len(les)-1]
}

// PresenceChurn runs scenario 12 against t (pgsse): presence on, then off.
func PresenceChurn(ctx context.Context, e *Env, t Target, p Params) ([]*Result, error) {
	pp := p.Presence
	var out []*Result
	for _, on := range []bool{true, false} {
		res, err := presenceChurnOnce(ctx, e, presenceTarget(t, pp, on), p, on)
		if err != nil {
			return out, err
		}
		out = append(out, res)
	}
	off := out[1]
	out[0].note("12's baseline column is pgsse with presence off (no --presence-streams), the same churn")
	for _, res := range out {
		res.add("others' delivery p99 during ÷ presence off during", "×",
			res.Get("others' delivery p99 during churn")/max(off.Get("others' delivery p99 during churn"), 0.001), true)
	}
	return out, nil
}

func presenceChurnOnce(ctx context.Context, e *Env, t Target, p Params, on bool) (*Result, error) {
	pp := p.Presence
	res := &Result{Scenario: "12 presence churn", Target: NoPresenceLabel}
	if on {
		res.Target = PresenceLabel
	}
	r, err := e.start(ctx, t, p)
	if err != nil {
		return nil, err
	}
	defer r.stop()
	tokens, err := presenceTokens(pp.Churn, "churner:")
	if err != nil {
		return nil, err
	}
	others, err := r.client("others", pp.Others, p, 1<<16)
	if err != nil {
		return nil, err
	}
	defer others.Close()
	pub, err := NewPublisher(ctx, r.db.URL, "others", 64, 1<<16)
	if err != nil {
		return nil, err
	}
	defer pub.Close()
	pub.Mark = others.SetRef
	var phase atomic.Int32
	pubCtx, stopPub := context.WithCancel(ctx)
	defer stopPub()
	pubDone := make(chan error, 1)
	go func() {
		tick := time.NewTicker(time.Duration(float64(time.Second) / max(pp.Rate, 1)))
		defer tick.Stop()
		cur := int32(0)
		for {
			select {
			case <-pubCtx.Done():
				pubDone <- nil
				return
			case <-tick.C:
			}
			if ph := phase.Load(); ph != cur {
				cur = ph
				others.SetPhase(int(ph), pub.Seq+1)
			}
			if _, err := pub.Publish(pubCtx); err != nil && pubCtx.Err() == nil {
				pubDone <- err
				return
			}
		}
	}()
	var watch *presenceWatch
	if on {
		wt, err := presenceTokens(1, "watcher:")
		if err != nil {
			return nil, err
		}
		if watch, err = watchPresence(r.srv.SSE.String(), "churn", wt[0]); err != nil {
			return nil, err
		}
		defer watch.conn.Close()
	}
	lag := func() (commit, written []float64) {
		_, commit = r.buckets(ctx, "pgsse_delivery_lag_seconds", "")
		_, written = r.buckets(ctx, "pgsse_publish_stage_seconds", `stage="written",`)
		return commit, written
	}
	les, _ := r.buckets(ctx, "pgsse_delivery_lag_seconds", "")
	wles, _ := r.buckets(ctx, "pgsse_publish_stage_seconds", `stage="written",`)
	lag0, wr0 := lag()
	time.Sleep(3 * time.Second) // phase 0: before
	lag1, wr1 := lag()
	writes0, t0 := r.metric(ctx, "pgsse_presence_writes_total"), time.Now()
	phase.Store(1)
	waitProfile := r.profile(ctx, "12-churn", 8*time.Second)
	defer waitProfile()
	conns, heads, err := rawJoin(r.srv.SSE.String(), p.Sources, pp.Churn, func(i int) string {
		return "/streams/churn?token=" + tokens[i]
	})
	if err != nil {
		stopPub()
		return nil, fmt.Errorf("join %d: %w", pp.Churn, err)
	}
	joinTook := time.Since(t0)
	e.logf("scenario 12 (%s): %d joined in %v", res.Target, pp.Churn, joinTook.Round(time.Millisecond))
	if on && !watch.wait(pp.Churn, false, 30*time.Second) {
		res.note("not every join was visible within 30 s")
	}
	left := make([]time.Time, len(conns))
	for i, c := range conns {
		left[i] = time.Now()
		c.Close()
	}
	if on && !watch.wait(pp.Churn, true, 30*time.Second) {
		res.note("not every leave was visible within 30 s")
	}
	if !on {
		time.Sleep(3 * pp.Interval) // the same time as presence on, about
	}
	writes1, t1 := r.metric(ctx, "pgsse_presence_writes_total"), time.Now()
	lag2, wr2 := lag()
	phase.Store(2)
	time.Sleep(time.Second)
	stopPub()
	if err := <-pubDone; err != nil {
		return nil, err
	}
	if err := r.alive(); err != nil {
		return nil, err
	}
	others.Close()
	st := others.Stats()
	intervals := float64(t1.Sub(t0)) / float64(pp.Interval)
	res.add("churn connections", "", float64(pp.Churn), false)
	res.add("joined in", "ms", ms(joinTook), true)
	if on {
		watch.mu.Lock()
		jl, jm := visible(watch.joined, "churner:", heads)
		ll, lm := visible(watch.left, "churner:", left)
		watch.mu.Unlock()
		jq, lq := Quantiles(jl, 0.5, 0.99), Quantiles(ll, 0.5, 0.99)
		iv := float64(pp.Interval)
		res.add("join-to-visible p50", "ms", ms(jq[0]), true)
		res.add("join-to-visible p99", "ms", ms(jq[1]), true)
		res.add("join-to-visible p99 in intervals", "", float64(jq[1])/iv, true)
		res.add("leave-to-visible p99", "ms", ms(lq[1]), true)
		res.add("leave-to-visible p99 in intervals", "", float64(lq[1])/iv, true)
		res.add("joins / leaves not seen", "", float64(jm+lm), true)
		res.add("presence statements per interval", "", (writes1-writes0)/max(intervals, 1), true)
		res.add("presence statements", "", writes1-writes0, true)
	}
	before, during := st.Phases[0].Quantile(0.99), st.Phases[1].Quantile(0.99)
	res.add("others", "", float64(pp.Others), false)
	res.add("others' delivery p99 before churn", "ms", ms(before), true)
	res.add("others' delivery p99 during churn", "ms", ms(during), true)
	res.add("SPEC bound (2× before + 10 ms)", "ms", 2*ms(before)+10, false)
	// The server's share: commit to the start of the loop's write (pgsse_delivery_lag_seconds,
	// the bucket bound the p99 falls in), before and during the churn.
	res.add("server commit→write p99 before churn (bucket bound)", "ms", 1000*bucketQuantile(les, lag0, lag1, 0.99), true)
	res.add("server commit→write p99 during churn (bucket bound)", "ms", 1000*bucketQuantile(les, lag1, lag2, 0.99), true)
	res.add("server received→written p99 before churn (bucket bound)", "ms", 1000*bucketQuantile(wles, wr0, wr1, 0.99), true)
	res.add("server received→written p99 during churn (bucket bound)", "ms", 1000*bucketQuantile(wles, wr1, wr2, 0.99), true)
	return res, nil
}

// PresenceHold runs scenario 13 against t (pgsse).
func PresenceHold(ctx context.Context, e *Env, t Target, p Params) (*Result, error) {
	pp := p.Presence
	res := &Result{Scenario: "13 presence hold", Target: PresenceLabel}
	r, err := e.start(ctx, presenceTarget(t, pp, true), p)
	if err != nil {
		return nil, err
	}
	defer r.stop()
	tokens, err := presenceTokens(pp.HoldSubjects, "holder:")
	if err != nil {
		return nil, err
	}
	var streams strings.Builder
	for i := range pp.HoldStreams {
		streams.WriteString([]string{"?", "&"}[min(i, 1)] + "stream=hold/" + strconv.Itoa(i))
	}
	t0 := time.Now()
	conns, _, err := rawJoin(r.srv.SSE.String(), p.Sources, pp.HoldSubjects, func(i int) string {
		return "/streams" + streams.String() + "&token=" + tokens[i]
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	want := int64(pp.HoldSubjects) * int64(pp.HoldStreams)
	conn, err := pgconn.Connect(ctx, r.db.URL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	rows := func() int64 {
		rr := conn.ExecParams(ctx, "SELECT count(*) FROM pgsse.presence_entries", nil, nil, nil, nil).Read()
		if rr.Err != nil || len(rr.Rows) == 0 {
			return -1
		}
		n, _ := strconv.ParseInt(string(rr.Rows[0][0]), 10, 64)
		return n
	}
	for rows() < want && time.Since(t0) < 60*time.Second {
		time.Sleep(pp.Interval / 4)
	}
	e.logf("scenario 13: %d rows after %v", rows(), time.Since(t0).Round(time.Millisecond))
	time.Sleep(pp.Interval) // past the first interval
	type sample struct {
		rows, rss int64
		writes    float64
		at        time.Time
	}
	take := func() sample {
		rss, _ := r.srv.RSS()
		return sample{rows: rows(), rss: rss, writes: r.metric(ctx, "pgsse_presence_writes_total"), at: time.Now()}
	}
	first := take()
	prev := first
	var perInterval []float64
	maxRSS := first.rss
	for time.Since(first.at) < pp.Hold {
		time.Sleep(pp.Interval * 5)
		s := take()
		perInterval = append(perInterval, (s.writes-prev.writes)/(float64(s.at.Sub(prev.at))/float64(pp.Interval)))
		maxRSS = max(maxRSS, s.rss)
		prev = s
	}
	last := prev
	if err := r.alive(); err != nil {
		return nil, err
	}
	lo, hi := 1e9, 0.0
	for _, v := range perInterval {
		lo, hi = min(lo, v), max(hi, v)
	}
	res.add("connections (one subject each)", "", float64(pp.HoldSubjects), false)
	res.add("presence streams per connection", "", float64(pp.HoldStreams), false)
	res.add("held", "s", pp.Hold.Seconds(), false)
	res.add("rows at start", "", float64(first.rows), false)
	res.add("rows at end", "", float64(last.rows), false)
	res.add("RSS at start", "MiB", float64(first.rss)/(1<<20), true)
	res.add("RSS at end", "MiB", float64(last.rss)/(1<<20), true)
	res.add("RSS max", "MiB", float64(maxRSS)/(1<<20), true)
	res.add("statements per interval min", "", lo, true)
	res.add("statements per interval max", "", hi, true)
	return res, nil
}
