//go:build linux

package chaos

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// SubKind is how a durable subscriber behaves.
type SubKind uint8

const (
	Steady   SubKind = iota // reads as fast as it can; reconnects only when the server ends it
	Slow                    // reads a few KiB per second through a small receive buffer
	Flaky                   // drops its connection at random moments (FIN or RST) and resumes
	Expiring                // holds tokens of a few seconds: the server ends it at exp
)

func (k SubKind) String() string {
	return [...]string{"steady", "slow", "flaky", "expiring"}[k]
}

const (
	slowRate   = 3 << 10 // bytes per second a slow subscriber reads
	slowRcvBuf = 4 << 10
)

// durableSub is one durable subscriber (SPEC §3, or §3c with several streams): it connects,
// reads, and whenever its connection ends connects again with Last-Event-ID — as a browser's
// EventSource does — logging everything it reads.
type durableSub struct {
	w    *workload
	kind SubKind
	rng  *rand.Rand // owned by the subscriber's goroutine
	log  *SubLog
	mu   sync.Mutex // guards log (the drain reads progress)

	multi    bool
	since    string // the first connection's since (the URL keeps it, as a browser's does)
	lastID   string // the last id received: Last-Event-ID
	progress []atomic.Int64

	rate, stall atomic.Int64
	resetReq    atomic.Bool  // the next block in progress ends in an RST (fault: client reset)
	shortToken  atomic.Int64 // ms: the next connection's token lives this long (fault: token expiry)
	cur         atomic.Pointer[sseConn]
	conns       int32
	done        chan struct{}
	retired     atomic.Bool        // churn ended it before the run's end
	cancel      context.CancelFunc // ends it (churn)
	caughtUp    atomic.Bool        // drain: set once it holds the final event of every stream
	finalIDs    []atomic.Int64
}

func (w *workload) newDurableSub(name string, kind SubKind, streams, tags []string, start []int64, rng *rand.Rand) *durableSub {
	s := &durableSub{w: w, kind: kind, rng: rng, multi: len(streams) > 1,
		log:      &SubLog{Name: name, Streams: streams, Tags: tags, Start: start, Statuses: map[int]int{}},
		progress: make([]atomic.Int64, len(streams)), finalIDs: make([]atomic.Int64, len(streams)),
		done: make(chan struct{})}
	for i := range s.progress {
		s.progress[i].Store(start[i])
	}
	if s.multi {
		parts := make([]string, len(start))
		some := false
		for i, c := range start {
			if c >= 0 {
				parts[i] = strconv.FormatInt(c, 10)
				some = true
			}
		}
		if some {
			s.since = strings.Join(parts, ",")
		}
	} else if start[0] >= 0 {
		s.since = strconv.FormatInt(start[0], 10)
	}
	if kind == Slow {
		s.rate.Store(slowRate)
	}
	return s
}

func (s *durableSub) target() string {
	if !s.multi {
		t := "/streams/" + s.log.Streams[0]
		if s.since != "" {
			t += "?since=" + s.since
		}
		return t
	}
	q := url.Values{}
	for _, st := range s.log.Streams {
		q.Add("stream", st)
	}
	if s.since != "" {
		q.Set("since", s.since)
	}
	return "/streams?" + q.Encode()
}

func (s *durableSub) run(ctx context.Context) {
	defer close(s.done)
	backoff := 20 * time.Millisecond
	for ctx.Err() == nil {
		ttl := s.w.tokenTTL()
		if s.kind == Expiring {
			ttl = time.Duration(3000+s.rng.IntN(15000)) * time.Millisecond
		}
		if ms := s.shortToken.Swap(0); ms > 0 {
			ttl = time.Duration(ms) * time.Millisecond
		}
		tok := s.w.subscriberToken(s.log.Name, s.log.Tags, ttl)
		header := []string{"Authorization: Bearer " + tok}
		if s.lastID != "" {
			header = append(header, "Last-Event-ID: "+s.lastID)
		}
		rcv := 0
		if s.kind == Slow {
			rcv = slowRcvBuf
		}
		c, resp, err := dialSSE(ctx, s.w.addr, s.target(), header, rcv, &s.rate, &s.stall)
		if err != nil || resp.status != 200 {
			if err == nil {
				s.mu.Lock()
				s.log.Statuses[resp.status]++
				s.mu.Unlock()
				s.w.unexpectedStatus(s.log.Name, resp)
			}
			if sleepCtx(ctx, backoff+time.Duration(s.rng.IntN(100))*time.Millisecond) != nil {
				return
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 20 * time.Millisecond
		s.conns++
		s.mu.Lock()
		s.log.HeadAt = append(s.log.HeadAt, s.w.now())
		s.mu.Unlock()
		s.cur.Store(c)
		s.read(ctx, c)
		s.cur.Store(nil)
		c.close()
		if sleepCtx(ctx, time.Duration(10+s.rng.IntN(200))*time.Millisecond) != nil {
			return
		}
	}
}

// read reads one connection until it ends (or the subscriber ends it).
func (s *durableSub) read(ctx context.Context, c *sseConn) {
	var dropAt time.Time
	if s.kind == Flaky {
		dropAt = time.Now().Add(time.Duration(500+s.rng.IntN(12000)) * time.Millisecond)
	}
	resetMid := func() bool {
		if s.resetReq.CompareAndSwap(true, false) {
			s.mu.Lock()
			s.log.Resets++
			s.mu.Unlock()
			return true
		}
		if !dropAt.IsZero() && time.Now().After(dropAt) && s.rng.IntN(2) == 0 {
			dropAt = time.Time{}
			s.mu.Lock()
			s.log.Resets++
			s.mu.Unlock()
			return true
		}
		return false
	}
	for ctx.Err() == nil {
		b, err := c.next(resetMid)
		if err != nil {
			return
		}
		s.block(b)
		if !dropAt.IsZero() && time.Now().After(dropAt) {
			return // a clean close between events
		}
	}
}

// block logs one block.
func (s *durableSub) block(b block) {
	now := s.w.now()
	conn := s.conns
	s.mu.Lock()
	defer s.mu.Unlock()
	bad := func(detail string) {
		s.log.Items = append(s.log.Items, SubItem{Kind: ItemBad, Conn: conn, Detail: detail, At: now})
	}
	switch {
	case b.event == "pgsse:gap":
		var g struct {
			Stream string `json:"stream"`
			After  *int64 `json:"after"`
			Resume *int64 `json:"resume"`
		}
		if err := json.Unmarshal([]byte(b.data), &g); err != nil || g.After == nil || g.Resume == nil {
			bad("pgsse:gap with data " + clip(b.data))
			return
		}
		if b.hasID {
			bad("pgsse:gap with an id line " + b.id)
		}
		i := indexOf(s.log.Streams, g.Stream)
		if i < 0 {
			bad("pgsse:gap for stream " + g.Stream + ", which is not subscribed")
			return
		}
		s.log.Items = append(s.log.Items, SubItem{Kind: ItemGap, Conn: conn, Stream: int16(i), ID: *g.After, Resume: *g.Resume, At: now})
		s.progress[i].Store(*g.Resume)
	case b.event == "pgsse:presence":
	case b.hasID:
		p, ok := ParseData(b.data)
		if !ok || p.Kind != kindDurable {
			bad("event id " + b.id + " with data " + clip(b.data))
			return
		}
		it := SubItem{Kind: ItemEvent, Conn: conn, Key: p.Key, At: now}
		if s.multi {
			k, cursors, ok := parseComposite(b.id, len(s.log.Streams))
			if !ok {
				bad("composite id " + b.id)
				return
			}
			it.Stream, it.ID, it.Cursors = int16(k), cursors[k], cursors
		} else {
			id, err := strconv.ParseInt(b.id, 10, 64)
			if err != nil || id <= 0 {
				bad("id " + b.id)
				return
			}
			it.ID = id
		}
		if s.log.Streams[it.Stream] != p.Target {
			// still logged: the checker names the leak
			s.log.Items = append(s.log.Items, it)
			bad("event of " + p.Target + " delivered as one of " + s.log.Streams[it.Stream])
			return
		}
		if ShapeOf(p.Key).Event != b.event {
			bad("event " + p.Key.String() + " named " + b.event + ", published as " + ShapeOf(p.Key).Event)
		}
		s.log.Items = append(s.log.Items, it)
		s.lastID = b.id
		s.progress[it.Stream].Store(it.ID)
	case b.hasData:
		p, ok := ParseData(b.data)
		it := EphItem{Conn: conn, Key: p.Key, Target: p.Target}
		if !ok || p.Kind != kindEphemeral {
			it.Bad = "an event without id with data " + clip(b.data)
		}
		s.log.Ephemeral = append(s.log.Ephemeral, it)
	}
}

// parseComposite reads a multi-stream id "k:c0,c1,…" with n entries (SPEC §3c).
func parseComposite(id string, n int) (int, []int64, bool) {
	ks, rest, ok := strings.Cut(id, ":")
	if !ok {
		return 0, nil, false
	}
	k, err := strconv.Atoi(ks)
	if err != nil || k < 0 || k >= n {
		return 0, nil, false
	}
	parts := strings.Split(rest, ",")
	if len(parts) != n {
		return 0, nil, false
	}
	out := make([]int64, n)
	for i, p := range parts {
		v, err := strconv.ParseInt(p, 10, 64)
		if err != nil || v < 0 {
			return 0, nil, false
		}
		out[i] = v
	}
	return k, out, true
}

func indexOf(list []string, s string) int {
	for i, x := range list {
		if x == s {
			return i
		}
	}
	return -1
}

// ephSub subscribes to an ephemeral stream or a raw channel and logs what it reads.
type ephSub struct {
	w   *workload
	rng *rand.Rand
	log *EphLog
	mu  sync.Mutex
}

func (s *ephSub) run(ctx context.Context) {
	target := "/streams/" + s.log.Target
	if s.log.Channel {
		target = "/channels/" + s.log.Target
	}
	var zero, noStall atomic.Int64
	for ctx.Err() == nil {
		tok := s.w.subscriberToken(s.log.Name, nil, s.w.tokenTTL())
		c, resp, err := dialSSE(ctx, s.w.addr, target, []string{"Authorization: Bearer " + tok}, 0, &zero, &noStall)
		if err == nil && resp.status == 200 {
			s.mu.Lock()
			s.log.Conns++
			conn := int32(s.log.Conns)
			s.mu.Unlock()
			var dropAt time.Time
			if s.rng.IntN(3) == 0 {
				dropAt = time.Now().Add(time.Duration(1000+s.rng.IntN(20000)) * time.Millisecond)
			}
			for ctx.Err() == nil {
				b, err := c.next(nil)
				if err != nil {
					break
				}
				if !b.hasData || b.event == "pgsse:presence" {
					continue
				}
				p, ok := ParseData(b.data)
				it := EphItem{Conn: conn, Key: p.Key, Target: p.Target, HasID: b.hasID}
				want := kindEphemeral
				if s.log.Channel {
					want = kindNotify
				}
				if !ok || p.Kind != want {
					it.Bad = "data " + clip(b.data)
				}
				s.mu.Lock()
				s.log.Items = append(s.log.Items, it)
				s.mu.Unlock()
				if !dropAt.IsZero() && time.Now().After(dropAt) {
					break
				}
			}
			c.close()
		} else if err == nil {
			s.mu.Lock()
			s.log.Statuses[resp.status]++
			s.mu.Unlock()
			s.w.unexpectedStatus(s.log.Name, resp)
		}
		if sleepCtx(ctx, time.Duration(20+s.rng.IntN(300))*time.Millisecond) != nil {
			return
		}
	}
}
