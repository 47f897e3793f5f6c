//go:build linux

package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Scenario 11, several streams on one connection (issue 19, SPEC §3c "Cost"):
//
//	11 streams idle     p.MultiConns idle connections that each follow p.MultiStreams streams
//	                    (GET /streams?stream=…), then as many that follow one
//	                    (/streams/{stream}), each on a fresh server → RSS per idle connection.
//	11 streams fan-out  on one server, in rounds that alternate: p.MultiConns connections
//	                    following p.MultiStreams streams — the published one among them, at
//	                    position k mod p.MultiStreams for the k-th connection — then as many
//	                    following that stream alone; p.FanoutEvents events per round, each
//	                    published once the previous one reached everybody (as scenario 3) →
//	                    time to last subscriber and server CPU per delivery. SPEC §3c: at
//	                    most 1.5× the single-stream fan-out.
//
// The results' targets are MultiLabel(p.MultiStreams) and SingleLabel (the table's two
// columns).

// SingleLabel names scenario 11's single-stream column.
const SingleLabel = "1 stream per connection"

// MultiLabel names scenario 11's column of connections that follow k streams.
func MultiLabel(k int) string { return strconv.Itoa(max(k, 2)) + " streams per connection" }

// multiPaths are the request targets of connections that follow k streams, "fanout" at each
// position in turn, the others idle streams every connection shares.
func multiPaths(k int) []string {
	var paths []string
	for pos := range k {
		var b strings.Builder
		b.WriteString("/streams")
		for i := range k {
			b.WriteString([]string{"?", "&"}[min(i, 1)])
			if i == pos {
				b.WriteString("stream=fanout")
			} else {
				b.WriteString("stream=idle/" + strconv.Itoa(i))
			}
		}
		paths = append(paths, b.String())
	}
	return paths
}

// MultiStream runs scenario 11 against t (pgsse): its idle and fan-out parts.
func MultiStream(ctx context.Context, e *Env, t Target, p Params) ([]*Result, error) {
	k := max(p.MultiStreams, 2)
	multi := &Result{Scenario: "11 streams per connection", Target: MultiLabel(k)}
	single := &Result{Scenario: "11 streams per connection", Target: SingleLabel}
	singleCfg := ClientConfig{Path: "/streams/fanout"}
	multiCfg := ClientConfig{Paths: multiPaths(k)}
	multi.add("streams per connection", "", float64(k), false)
	single.add("streams per connection", "", 1, false)

	// Idle: each kind on a fresh server.
	for _, side := range []struct {
		res *Result
		cfg ClientConfig
	}{{multi, multiCfg}, {single, singleCfg}} {
		rss, err := multiIdle(ctx, e, t, p, side.cfg)
		if err != nil {
			return nil, err
		}
		side.res.add("RSS per idle connection", "B", rss, true)
	}

	// Fan-out: alternating rounds on one server.
	r, err := e.start(ctx, t, p)
	if err != nil {
		return nil, err
	}
	defer r.stop()
	type tally struct {
		ttl        []time.Duration
		cpu        time.Duration
		deliveries int64
		missing    int64
		timeouts   int
	}
	var tallies [2]tally // 0 multi, 1 single
	rounds := max(p.MultiRounds, 1)
	for round := range 2 * rounds {
		side := round % 2
		cfg := []ClientConfig{multiCfg, singleCfg}[side]
		n := p.FanoutEvents
		cfg.Addr, cfg.Sources, cfg.Readers, cfg.MaxSeq, cfg.RcvBuf = r.srv.SSE, p.Sources, p.Readers, n+1, p.RcvBuf
		c, err := NewClient(cfg)
		if err != nil {
			return nil, err
		}
		t0 := time.Now()
		if err := c.Connect(p.MultiConns, false); err != nil {
			c.Close()
			return nil, fmt.Errorf("round %d: connect %d subscribers: %w", round, p.MultiConns, err)
		}
		e.logf("scenario 11 round %d (%s): %d subscribers connected in %v", round, []string{multi.Target, single.Target}[side],
			p.MultiConns, time.Since(t0).Round(time.Millisecond))
		pub, err := NewPublisher(ctx, r.db.URL, "fanout", p.FanoutData, n+1)
		if err != nil {
			c.Close()
			return nil, err
		}
		pub.Mark = c.SetRef
		time.Sleep(500 * time.Millisecond)
		cpu0, _ := r.srv.CPU()
		ta := &tallies[side]
		for range n {
			seq, err := pub.PublishTx(ctx)
			if err != nil {
				pub.Close()
				c.Close()
				return nil, err
			}
			if !c.WaitHave(seq, p.MultiConns, 10*time.Second) {
				ta.timeouts++
				if err := r.alive(); err != nil {
					pub.Close()
					c.Close()
					return nil, err
				}
			}
			time.Sleep(p.FanoutGap)
		}
		cpu1, _ := r.srv.CPU()
		pub.Close()
		c.Close()
		st := c.Stats()
		for seq := 1; seq <= n; seq++ {
			if st.Last[seq] != 0 {
				ta.ttl = append(ta.ttl, time.Duration(st.Last[seq]-pub.Ref[seq]))
			}
		}
		ta.cpu += cpu1 - cpu0
		ta.deliveries += st.Events
		ta.missing += int64(n)*int64(p.MultiConns) - st.Events
		if st.Closed > 0 {
			[]*Result{multi, single}[side].note("round %d: %d subscribers closed by the server", round, st.Closed)
		}
	}
	if err := r.alive(); err != nil {
		return nil, err
	}
	for side, res := range []*Result{multi, single} {
		ta := tallies[side]
		q := Quantiles(ta.ttl, 0.5, 0.99, 1)
		res.add("subscribers", "", float64(p.MultiConns), false)
		res.add("time to last subscriber p50", "ms", ms(q[0]), true)
		res.add("time to last subscriber p99", "ms", ms(q[1]), true)
		res.add("time to last subscriber max", "ms", ms(q[2]), true)
		res.add("server CPU per delivery", "µs", float64(ta.cpu)/1e3/max(float64(ta.deliveries), 1), true)
		res.add("deliveries missing", "", float64(ta.missing), true)
		if ta.timeouts > 0 {
			res.note("%d events had not reached every subscriber after 10 s", ta.timeouts)
		}
	}
	return []*Result{multi, single}, nil
}

// multiIdle is p.MultiConns idle connections of cfg on a fresh server: RSS per connection.
func multiIdle(ctx context.Context, e *Env, t Target, p Params, cfg ClientConfig) (float64, error) {
	r, err := e.start(ctx, t, p)
	if err != nil {
		return 0, err
	}
	defer r.stop()
	time.Sleep(500 * time.Millisecond)
	rss0, err := r.srv.RSS()
	if err != nil {
		return 0, err
	}
	cfg.Addr, cfg.Sources, cfg.Readers, cfg.MaxSeq = r.srv.SSE, p.Sources, p.Readers, 16
	c, err := NewClient(cfg)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if err := c.Connect(p.MultiConns, false); err != nil {
		return 0, fmt.Errorf("connect %d idle subscribers: %w", p.MultiConns, err)
	}
	time.Sleep(time.Second)
	rss1, err := r.srv.RSS()
	if err != nil {
		return 0, err
	}
	if err := r.alive(); err != nil {
		return 0, err
	}
	return float64(rss1-rss0) / float64(c.Conns()), nil
}
