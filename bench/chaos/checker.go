package chaos

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The checker: from the table (every committed event, including those pruned during the run)
// and every client's log it decides, after the run, whether each guarantee held.
//
//   - Durable subscribers (SPEC §3, §3c): every committed event of each subscribed stream
//     that its audience lets the connection see, with id > the first cursor, was received
//     exactly once (by key: the event itself, not merely its id), in id order, across every
//     reconnection — or it lies in the range of a pgsse:gap whose ids were really pruned. A
//     gap's "after" is where the client stood, or past it only over events hidden from the
//     connection by their audience (a lagging connection's cursor moves over them). A gap
//     that moves the cursor back (the head went backwards after a crash lost commits) is
//     allowed only if a crash could lose commits.
//     An event the subscriber saw that a crash then lost, followed by a new event with the
//     same id that never arrived, is a silent skip. On a multi-stream connection each entry
//     of a composite id stands on its stream's last event received or moves on over events
//     hidden from the connection by their audience — never over one it may see, never back,
//     never beyond the stream's head.
//   - Publishers (SPEC §2, §3a): every acknowledged event is in the table with the id the
//     publisher was told (unless a crash with synchronous_commit off lost it); nothing of a
//     rolled-back or refused publish is; an unknown outcome is all or nothing; per stream, a
//     publish acknowledged before another was sent has the smaller id; a transaction's or
//     batch's events on one stream are contiguous; the table's ids have no holes.
//   - Hub workers (SPEC §5): every notification committed after a worker's ACK on a channel,
//     while it ran, was received — or a RESYNC, LISTENER_DOWN or the worker's end lies between
//     its neighbours from the same publisher; per publisher in commit order; nothing that was
//     rolled back.
//   - Ephemeral and /channels/ subscribers: no id line, nothing twice, in order per publisher
//     on a connection, nothing rolled back, nothing from another stream or channel (losses are
//     allowed: SPEC §1).

// Failure classes.
const (
	FailLost         = "durable event lost"
	FailDuplicate    = "durable event duplicated"
	FailOrder        = "durable event out of order"
	FailSilentSkip   = "silent skip (id reused after a crash, no pgsse:gap)"
	FailPhantom      = "event delivered that is not in the table"
	FailAudience     = "event delivered past its audience"
	FailLeak         = "event of another stream or channel delivered"
	FailGap          = "bad pgsse:gap"
	FailMalformed    = "malformed SSE"
	FailIDMismatch   = "event delivered with another id than stored"
	FailPubLost      = "acknowledged publish missing from the table"
	FailPubLeak      = "unacknowledged publish in the table"
	FailPubPartial   = "publish with unknown outcome partly in the table"
	FailCommitOrder  = "ids not in commit order"
	FailTable        = "table inconsistent"
	FailEphemeral    = "ephemeral or channel delivery wrong"
	FailHubMissing   = "hub notification missing without RESYNC"
	FailHubOrder     = "hub notification out of order or duplicated"
	FailHubPhantom   = "hub notification that was not committed"
	FailHTTPStatus   = "unexpected HTTP status"
	FailDrainTimeout = "subscriber not caught up at the end"
)

// Failure is one thing that did not hold.
type Failure struct {
	Class  string
	Who    string // the client or publisher
	Detail string
}

// Report is the checker's verdict and what it counted.
type Report struct {
	Failures []Failure // at most maxPerClass per class; Counts has them all
	Counts   map[string]int
	Stats    map[string]int64
	Notes    []string // things worth knowing that are not failures
}

const maxPerClass = 8

func (r *Report) fail(class, who, format string, args ...any) {
	if r.Counts == nil {
		r.Counts = map[string]int{}
	}
	r.Counts[class]++
	if r.Counts[class] <= maxPerClass {
		r.Failures = append(r.Failures, Failure{Class: class, Who: who, Detail: fmt.Sprintf(format, args...)})
	}
}

func (r *Report) stat(name string, n int64) {
	if r.Stats == nil {
		r.Stats = map[string]int64{}
	}
	r.Stats[name] += n
}

func (r *Report) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// OK reports whether nothing failed.
func (r *Report) OK() bool { return len(r.Counts) == 0 }

// FailureCount is the number of failures of every class.
func (r *Report) FailureCount() int {
	n := 0
	for _, c := range r.Counts {
		n += c
	}
	return n
}

type truthEv struct {
	stream string
	id     int64
	key    Key
	pruned bool
}

type lostEv struct {
	stream string
	id     int64
}

type checker struct {
	rec      *Record
	r        *Report
	byKey    map[Key]*truthEv
	byStream map[string][]*truthEv      // by id
	lost     map[Key]lostEv             // acknowledged, not in the table, lost in a crash window
	lostAt   map[string]map[int64][]Key // the same by stream and the id they were told
	pubOf    map[Key]*PubRecord         // every event's and notification's publish
	notes    map[string][]noteRec       // per channel, committed notifications
}

type noteRec struct {
	key   Key
	sent  time.Duration
	acked time.Duration
}

// Check runs every check over rec.
func Check(rec *Record) *Report {
	c := &checker{rec: rec, r: &Report{Counts: map[string]int{}, Stats: map[string]int64{}},
		byKey: map[Key]*truthEv{}, byStream: map[string][]*truthEv{}, lost: map[Key]lostEv{}, lostAt: map[string]map[int64][]Key{},
		pubOf: map[Key]*PubRecord{}, notes: map[string][]noteRec{}}
	c.table()
	c.publishes()
	for _, s := range rec.Subs {
		c.durable(s)
		c.r.stat("durable subscriber connections (200)", int64(len(s.HeadAt)))
		c.r.stat("durable subscriber connections reset by the client (RST, mostly mid-event)", int64(s.Resets))
		for code, n := range s.Statuses {
			c.r.stat(fmt.Sprintf("durable subscriber answers %d", code), int64(n))
		}
	}
	for _, e := range rec.Ephs {
		c.ephemeral(e.Name, e.Target, e.Channel, e.Items)
	}
	for _, s := range rec.Subs {
		if len(s.Ephemeral) > 0 {
			c.ephemeralMulti(s)
		}
	}
	for _, w := range rec.Workers {
		c.worker(w)
	}
	return c.r
}

func (c *checker) table() {
	for i := range c.rec.Table {
		row := &c.rec.Table[i]
		if row.Bad != "" {
			c.r.fail(FailTable, row.Stream, "id %d: %s", row.ID, row.Bad)
			continue
		}
		if prev, dup := c.byKey[row.Key]; dup {
			c.r.fail(FailTable, row.Stream, "event %v stored twice (ids %d and %d)", row.Key, prev.id, row.ID)
			continue
		}
		t := &truthEv{stream: row.Stream, id: row.ID, key: row.Key, pruned: row.Pruned}
		c.byKey[row.Key] = t
		c.byStream[row.Stream] = append(c.byStream[row.Stream], t)
	}
	for stream, evs := range c.byStream {
		sort.Slice(evs, func(i, j int) bool { return evs[i].id < evs[j].id })
		for i, e := range evs {
			if e.id != int64(i+1) {
				if i > 0 && e.id == evs[i-1].id {
					c.r.fail(FailTable, stream, "id %d stored twice (events %v and %v)", e.id, evs[i-1].key, e.key)
				} else {
					c.r.fail(FailTable, stream, "ids are not 1…head without holes: id %d at position %d", e.id, i+1)
				}
				break
			}
		}
		c.r.stat("durable events committed", int64(len(evs)))
		for _, e := range evs {
			if e.pruned {
				c.r.stat("durable events pruned during the run", 1)
			}
		}
	}
}

// inCrashWindow reports whether a commit that happened between sent and acked may have been
// lost: it overlaps a window with synchronous_commit off that ended in a crash. (The answer
// may be read after the crash: the commit itself came before it.)
func (c *checker) inCrashWindow(sent, acked time.Duration) bool {
	for _, w := range c.rec.Crashes {
		if sent <= w.To && acked >= w.From {
			return true
		}
	}
	return false
}

// crashBetween reports whether a crash that could lose commits lies between a and b.
func (c *checker) crashBetween(a, b time.Duration) bool {
	for _, w := range c.rec.Crashes {
		if w.To >= a && w.To <= b {
			return true
		}
	}
	return false
}

func (c *checker) publishes() {
	type ordered struct {
		sent, acked time.Duration
		id          int64
		who         string
	}
	perStream := map[string][]ordered{}
	for _, p := range c.rec.Pubs {
		for _, e := range p.Events {
			c.pubOf[e.Key] = p
		}
		for _, n := range p.Notes {
			c.pubOf[n.Key] = p
			if p.Outcome == Committed {
				c.notes[n.Channel] = append(c.notes[n.Channel], noteRec{key: n.Key, sent: p.Sent, acked: p.Acked})
			}
		}
		c.r.stat("publishes "+p.Via+" "+p.Outcome.String(), 1)
		var durable []PubEvent
		for _, e := range p.Events {
			if !e.Ephemeral {
				durable = append(durable, e)
			}
		}
		if len(durable) == 0 {
			continue
		}
		present := 0
		for _, e := range durable {
			if _, ok := c.byKey[e.Key]; ok {
				present++
			}
		}
		who := p.Via + " publish sent at " + fmtDur(p.Sent)
		switch p.Outcome {
		case Committed:
			lastID := map[string]int64{}
			for _, e := range durable {
				t, ok := c.byKey[e.Key]
				if !ok {
					if c.inCrashWindow(p.Sent, p.Acked) {
						c.noteLost(e)
						c.r.stat("acknowledged events lost in a crash with synchronous_commit off", 1)
						continue
					}
					c.r.fail(FailPubLost, who, "event %v on %s (told id %d): %s", e.Key, e.Stream, e.ID, p.Detail)
					continue
				}
				if t.stream != e.Stream {
					c.r.fail(FailPubLost, who, "event %v published on %s is stored on %s", e.Key, e.Stream, t.stream)
				}
				if e.ID != 0 && t.id != e.ID {
					if c.crashBetween(p.Acked, c.rec.RunEnd) {
						c.noteLost(e)
					} else {
						c.r.fail(FailIDMismatch, who, "event %v on %s: told id %d, stored as %d", e.Key, e.Stream, e.ID, t.id)
					}
				}
				if prev, ok := lastID[e.Stream]; ok && t.id != prev+1 {
					c.r.fail(FailCommitOrder, who, "a transaction's events on %s are not contiguous: %d after %d", e.Stream, t.id, prev)
				}
				lastID[e.Stream] = t.id
				perStream[e.Stream] = append(perStream[e.Stream], ordered{sent: p.Sent, acked: p.Acked, id: t.id, who: who})
			}
		case NotCommitted:
			if present > 0 {
				c.r.fail(FailPubLeak, who, "%d of %d events are in the table (%s)", present, len(durable), p.Detail)
			}
		case Unknown, NoAnswer:
			c.r.stat("publishes with unknown outcome found in the table", int64(min(present, 1)))
			acked := p.Acked
			if acked == 0 {
				acked = c.rec.RunEnd // no answer: the commit may have come at any time after
			}
			if present == 0 && c.inCrashWindow(p.Sent, acked) {
				// Perhaps committed — and notified, so delivered — then lost by the crash.
				for _, e := range durable {
					c.noteLost(e)
				}
			}
			if present != 0 && present != len(durable) {
				c.r.fail(FailPubPartial, who, "%d of %d events are in the table (%s)", present, len(durable), p.Detail)
			}
		}
	}
	// Commit order: a publish acknowledged before another was sent has the smaller id,
	// unless a crash that lost commits lies between them (ids are then reused).
	for stream, evs := range perStream {
		bySent := append([]ordered(nil), evs...)
		sort.Slice(bySent, func(i, j int) bool { return bySent[i].sent < bySent[j].sent })
		byAck := append([]ordered(nil), evs...)
		sort.Slice(byAck, func(i, j int) bool { return byAck[i].acked < byAck[j].acked })
		j := 0
		var best ordered
		haveBest := false
		for _, b := range bySent {
			for j < len(byAck) && byAck[j].acked < b.sent {
				if !haveBest || byAck[j].id > best.id {
					best, haveBest = byAck[j], true
				}
				j++
			}
			if haveBest && best.id >= b.id && !c.crashBetween(best.acked, b.sent) {
				c.r.fail(FailCommitOrder, stream, "id %d (%s, acknowledged at %s) is not below id %d (%s, sent at %s)",
					best.id, best.who, fmtDur(best.acked), b.id, b.who, fmtDur(b.sent))
			}
		}
	}
}

type streamState struct {
	start    int64 // first cursor, -1 = absent
	lastID   int64 // the last event id received (what Last-Event-ID says); -1 = none yet
	pos      int64 // where delivery stands (a gap moves it to resume)
	firstID  int64 // the first event id received, 0 = none
	firstAt  int32 // the connection of the first item
	gaps     [][2]int64
	seenLost map[int64]Key // ids at which it saw an event a crash then lost
	got      map[int64]Key // the event last received under each id
	conn     int32         // the connection of the last item of this stream
}

func (c *checker) durable(sl *SubLog) {
	who := sl.Name
	st := make([]*streamState, len(sl.Streams))
	for i := range sl.Streams {
		st[i] = &streamState{start: sl.Start[i], lastID: sl.Start[i], pos: sl.Start[i], seenLost: map[int64]Key{}, got: map[int64]Key{}}
	}
	index := map[string]int{}
	for i, s := range sl.Streams {
		index[s] = i
	}
	seen := map[Key]bool{}
	for _, it := range sl.Items {
		switch it.Kind {
		case ItemBad:
			c.r.fail(FailMalformed, who, "connection %d: %s", it.Conn, it.Detail)
		case ItemGap:
			s := st[it.Stream]
			c.r.stat("pgsse:gap received", 1)
			switch {
			case s.lastID < 0 && it.Resume < it.ID && len(c.rec.Crashes) > 0:
				// Live only, nothing received yet: the head it started at was from history a
				// crash then lost, and the rewind tells it so (docs/http.md: every subscriber
				// past the point where the histories part). Everything after resume is owed.
				c.r.stat("pgsse:gap announcing a head that went back, before a live-only subscriber's first event", 1)
				s.lastID, s.firstAt, s.firstID = it.Resume, it.Conn, it.Resume+1
			case s.lastID < 0:
				c.r.fail(FailGap, who, "%s: a gap (after %d, resume %d) without a cursor", sl.Streams[it.Stream], it.ID, it.Resume)
			case it.ID != s.lastID && it.ID != s.pos && (it.ID < s.pos || c.visibleBetween(sl, int(it.Stream), s.pos, it.ID, seen) > 0):
				c.r.fail(FailGap, who, "%s: a gap after %d but the client stood at %d", sl.Streams[it.Stream], it.ID, s.lastID)
			case it.Resume > it.ID:
				if it.ID > s.pos {
					// The server's cursor had moved over events hidden from the connection by
					// their audience; SPEC §3 names the client's cursor (the last id written).
					c.r.stat("pgsse:gap after an id hidden from the connection (not the client's last id)", 1)
				}
				for _, t := range c.byStream[sl.Streams[it.Stream]] {
					if t.id > it.ID && t.id <= it.Resume && !t.pruned && Visible(ShapeOf(t.key).Audience, sl.Tags) {
						c.r.fail(FailGap, who, "%s: gap (after %d, resume %d) over id %d, which was never pruned", sl.Streams[it.Stream], it.ID, it.Resume, t.id)
						break
					}
				}
				s.gaps = append(s.gaps, [2]int64{it.ID, it.Resume})
			case it.Resume < it.ID:
				if len(c.rec.Crashes) == 0 {
					c.r.fail(FailGap, who, "%s: a gap moves the cursor back from %d to %d without a crash that lost commits", sl.Streams[it.Stream], it.ID, it.Resume)
				}
				c.r.stat("pgsse:gap announcing a head that went back", 1)
				if it.Conn != s.conn {
					// A reconnection's Last-Event-ID in the ids the rewind reused is from the lost
					// events or from the new ones under the same ids — the server cannot tell, and
					// treats it as lost (docs/http.md, When the stream went back): the client drops
					// what it holds after resume and gets the events after resume, perhaps again.
					for id := it.Resume + 1; id <= it.ID; id++ {
						if k, ok := s.got[id]; ok && seen[k] {
							delete(seen, k)
							c.r.stat("events received again after a reconnection's gap back (its cursor among the reused ids)", 1)
						}
					}
				}
			default:
				c.r.fail(FailGap, who, "%s: a gap with after = resume = %d", sl.Streams[it.Stream], it.ID)
			}
			s.pos = it.Resume
			s.conn = it.Conn
		case ItemEvent:
			s := st[it.Stream]
			stream := sl.Streams[it.Stream]
			c.r.stat("durable deliveries checked", 1)
			if len(it.Cursors) > 0 {
				for i, cur := range it.Cursors {
					if i == int(it.Stream) {
						continue
					}
					o := st[i]
					switch {
					case o.lastID < 0:
						// absent at subscribe: the entry tells where the subscription started
						o.lastID, o.pos, o.firstAt = cur, cur, it.Conn
						o.firstID = cur + 1
					case cur == o.lastID || cur == o.pos:
					case cur < o.pos:
						c.r.fail(FailMalformed, who, "connection %d: composite id entry %d is %d, back from the client's cursor for %s, %d", it.Conn, i, cur, sl.Streams[i], o.pos)
					default:
						// Moved on over events skipped on this connection: each must be hidden
						// from it by its audience (docs/http.md, The composite id); a pruned
						// one is announced by a gap, which moves pos itself.
						skipped := true
						if head := c.everHead(sl.Streams[i]); cur > head {
							c.r.fail(FailMalformed, who, "connection %d: composite id entry %d is %d, beyond the last id %s ever had, %d", it.Conn, i, cur, sl.Streams[i], head)
							skipped = false
						} else if id := c.visibleBetween(sl, i, o.pos, cur, seen); id > 0 {
							c.r.fail(FailMalformed, who, "connection %d: composite id entry %d is %d, over id %d of %s, which the client may see and has not received (its cursor is %d)", it.Conn, i, cur, id, sl.Streams[i], o.pos)
							skipped = false
						}
						if skipped {
							c.r.stat("composite id entries moved over hidden events", 1)
							o.lastID, o.pos = cur, cur
						}
					}
				}
			}
			if seen[it.Key] {
				c.r.fail(FailDuplicate, who, "%s: event %v (id %d) received again on connection %d", stream, it.Key, it.ID, it.Conn)
				continue
			}
			seen[it.Key] = true
			s.got[it.ID] = it.Key
			s.conn = it.Conn
			if s.lastID < 0 {
				s.lastID, s.pos = it.ID-1, it.ID-1
				s.firstAt = it.Conn
			}
			if s.firstID == 0 {
				s.firstID = it.ID
			}
			if it.ID <= s.pos {
				c.r.fail(FailOrder, who, "%s: id %d after %d (connection %d)", stream, it.ID, s.pos, it.Conn)
			}
			t, inTable := c.byKey[it.Key]
			switch {
			case inTable && t.stream != stream:
				c.r.fail(FailLeak, who, "an event of %s on the subscription of %s", t.stream, stream)
			case inTable && t.id != it.ID:
				if _, lost := c.lost[it.Key]; !lost {
					c.r.fail(FailIDMismatch, who, "%s: event %v delivered as id %d, stored as %d", stream, it.Key, it.ID, t.id)
				}
			case !inTable:
				if l, lost := c.lost[it.Key]; lost && l.stream == stream {
					s.seenLost[it.ID] = it.Key
					c.r.stat("deliveries of events a crash then lost", 1)
				} else if p := c.pubOf[it.Key]; p != nil {
					c.r.fail(FailPhantom, who, "%s: id %d is event %v of a publish that is not in the table (%s, %s)", stream, it.ID, it.Key, p.Via, p.Outcome)
				} else {
					c.r.fail(FailPhantom, who, "%s: id %d is event %v, which nobody published", stream, it.ID, it.Key)
				}
			}
			if !Visible(ShapeOf(it.Key).Audience, sl.Tags) {
				c.r.fail(FailAudience, who, "%s: id %d has audience %v, the connection's tags are %v", stream, it.ID, ShapeOf(it.Key).Audience, sl.Tags)
			}
			s.lastID, s.pos = it.ID, it.ID
		}
	}
	for i, stream := range sl.Streams {
		c.completeness(sl, stream, st[i], seen)
	}
}

// visibleBetween is the first id in (from, to] of subscriber sl's stream i that the
// subscriber may see and has not received, or 0. An id that a crash's lost history gave to an
// event hidden from the subscriber is not counted: the server's cursor moved over it before
// the crash was noticed (the event the table now holds under that id is still owed, and
// completeness asks for it).
func (c *checker) visibleBetween(sl *SubLog, i int, from, to int64, seen map[Key]bool) int64 {
	evs := c.byStream[sl.Streams[i]]
	for j := sort.Search(len(evs), func(j int) bool { return evs[j].id > from }); j < len(evs) && evs[j].id <= to; j++ {
		if t := evs[j]; Visible(ShapeOf(t.key).Audience, sl.Tags) && !seen[t.key] && !c.lostHidden(t.stream, t.id, sl.Tags) {
			return t.id
		}
	}
	return 0
}

// lostHidden reports whether an acknowledged event a crash then lost had id on stream and an
// audience that tags do not see.
func (c *checker) lostHidden(stream string, id int64, tags []string) bool {
	for _, k := range c.lostAt[stream][id] {
		if !Visible(ShapeOf(k).Audience, tags) {
			return true
		}
	}
	return false
}

// noteLost records an acknowledged event a crash lost.
func (c *checker) noteLost(e PubEvent) {
	c.lost[e.Key] = lostEv{stream: e.Stream, id: e.ID}
	if c.lostAt[e.Stream] == nil {
		c.lostAt[e.Stream] = map[int64][]Key{}
	}
	c.lostAt[e.Stream][e.ID] = append(c.lostAt[e.Stream][e.ID], e.Key)
}

// everHead is the highest id stream had: in the table (pruned rows included) or given to an
// acknowledged event a crash then lost.
func (c *checker) everHead(stream string) int64 {
	var h int64
	if evs := c.byStream[stream]; len(evs) > 0 {
		h = evs[len(evs)-1].id
	}
	for _, l := range c.lost {
		if l.stream == stream {
			h = max(h, l.id)
		}
	}
	return h
}

// completeness reports every visible event of stream the subscriber should have received and
// did not.
func (c *checker) completeness(sl *SubLog, stream string, s *streamState, seen map[Key]bool) {
	visible := func(t *truthEv) bool { return Visible(ShapeOf(t.key).Audience, sl.Tags) }
	if s.lastID < 0 {
		// A live-only subscription that never received anything: everything committed after
		// its last connection's head was owed (unless churn ended it).
		if sl.Retired || len(sl.HeadAt) == 0 {
			return
		}
		headAt := sl.HeadAt[len(sl.HeadAt)-1]
		for _, t := range c.byStream[stream] {
			if p := c.pubOf[t.key]; p != nil && p.Sent > headAt && visible(t) {
				c.r.fail(FailLost, sl.Name, "%s: id %d, committed after the live-only connection's head (at %s), was never received", stream, t.id, fmtDur(headAt))
				return
			}
		}
		return
	}
	from := s.start // events with id > from are owed
	if s.start < 0 {
		from = s.firstID - 1
		// Live only: nothing committed after the head of the connection that started the
		// cursor may be older than where delivery started.
		if !sl.Retired && s.firstAt >= 1 && int(s.firstAt) <= len(sl.HeadAt) {
			headAt := sl.HeadAt[s.firstAt-1]
			for _, t := range c.byStream[stream] {
				if t.id > from {
					break
				}
				if p := c.pubOf[t.key]; p != nil && p.Sent > headAt && visible(t) {
					c.r.fail(FailLost, sl.Name, "%s: id %d was committed after the head was read (at %s) but delivery started after it, at %d", stream, t.id, fmtDur(headAt), s.firstID)
					break
				}
			}
		}
	}
	// The first of the lost events the subscriber received last, with nothing but lost events
	// after it (math.MaxInt64: its last event is the table's) — or lost events hidden from it.
	trailingLost := int64(math.MaxInt64)
	for id := s.lastID; id > 0; id-- {
		k, ok := s.got[id]
		if !ok {
			if trailingLost != math.MaxInt64 && c.lostHidden(stream, id, sl.Tags) {
				trailingLost = id // the lost history it holds had an event for others here
			}
			continue // hidden from it, or never received (a gap moved its cursor)
		}
		if _, lost := s.seenLost[id]; !lost || s.seenLost[id] != k {
			break
		}
		trailingLost = id
	}
	var missing []int64
	silent := 0
	for _, t := range c.byStream[stream] {
		if t.id <= from || seen[t.key] || !visible(t) {
			continue
		}
		if sl.Retired && t.id > s.lastID {
			break // it left: only what precedes its last event was owed
		}
		if sl.Retired && t.id >= trailingLost {
			// It left holding lost events it was never told of (nothing came after them): the
			// new events under their ids came after its last one.
			c.r.stat("retired subscribers' trailing lost events (it left before the rewind was announced)", 1)
			break
		}
		if t.pruned && coveredByGap(s.gaps, t.id) {
			continue
		}
		if t.pruned && s.start == 0 && (s.firstID == 0 || t.id < s.firstID) {
			continue // cursor 0 means what is retained when the subscription starts
		}
		if _, ok := s.seenLost[t.id]; ok {
			silent++
		}
		missing = append(missing, t.id)
	}
	if len(missing) == 0 {
		return
	}
	class := FailLost
	if silent > 0 {
		class = FailSilentSkip
	}
	c.r.stat("durable events not delivered", int64(len(missing)))
	detail := fmt.Sprintf("%s: %d events never received: ids %s (the subscriber's last id %d)", stream, len(missing), ranges(missing), s.lastID)
	if silent > 0 {
		detail += fmt.Sprintf("; at %d of these ids it had received an event a crash then lost, and no pgsse:gap announced the reuse", silent)
	}
	c.r.fail(class, sl.Name, "%s", detail)
}

func coveredByGap(gaps [][2]int64, id int64) bool {
	for _, g := range gaps {
		if id > g[0] && id <= g[1] {
			return true
		}
	}
	return false
}

// ranges writes ids (sorted) as "3-7, 9, 12-13", at most 6 ranges.
func ranges(ids []int64) string {
	var b strings.Builder
	n := 0
	for i := 0; i < len(ids); {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		if n == 6 {
			b.WriteString(", …")
			break
		}
		if n > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.FormatInt(ids[i], 10))
		if j > i {
			b.WriteString("-" + strconv.FormatInt(ids[j], 10))
		}
		n++
		i = j + 1
	}
	return b.String()
}

// ephemeral checks events without an id on a stream or channel subscription.
func (c *checker) ephemeral(who, target string, channel bool, items []EphItem) {
	type cp struct {
		conn int32
		pub  int
	}
	last := map[cp]int64{}
	seen := map[Key]bool{}
	for _, it := range items {
		c.r.stat("ephemeral and channel deliveries checked", 1)
		if it.Bad != "" {
			c.r.fail(FailEphemeral, who, "connection %d: %s", it.Conn, it.Bad)
			continue
		}
		if it.HasID {
			c.r.fail(FailEphemeral, who, "connection %d: event %v came with an id line", it.Conn, it.Key)
		}
		if it.Target != target {
			c.r.fail(FailLeak, who, "connection %d: event %v of %s on the subscription of %s", it.Conn, it.Key, it.Target, target)
		}
		if seen[it.Key] {
			c.r.fail(FailEphemeral, who, "connection %d: event %v received twice", it.Conn, it.Key)
			continue
		}
		seen[it.Key] = true
		k := cp{it.Conn, it.Key.Pub()}
		if prev, ok := last[k]; ok && it.Key.Seq() <= prev {
			c.r.fail(FailEphemeral, who, "connection %d: publisher %d's %d after its %d", it.Conn, it.Key.Pub(), it.Key.Seq(), prev)
		}
		last[k] = it.Key.Seq()
		p := c.pubOf[it.Key]
		switch {
		case p == nil:
			c.r.fail(FailEphemeral, who, "connection %d: event %v, which nobody sent", it.Conn, it.Key)
		case p.Outcome == NotCommitted:
			c.r.fail(FailEphemeral, who, "connection %d: event %v of a publish that did not commit (%s)", it.Conn, it.Key, p.Detail)
		}
	}
}

// ephemeralMulti checks the events without an id a durable subscriber received, per stream.
func (c *checker) ephemeralMulti(sl *SubLog) {
	by := map[string][]EphItem{}
	for _, it := range sl.Ephemeral {
		t := it.Target
		if !contains(sl.Streams, t) {
			c.r.fail(FailLeak, sl.Name, "connection %d: ephemeral event %v of %s", it.Conn, it.Key, t)
			continue
		}
		by[t] = append(by[t], it)
	}
	for t, items := range by {
		c.ephemeral(sl.Name, t, false, items)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func (c *checker) worker(w *WorkerLog) {
	for n, inst := range w.Instances {
		who := fmt.Sprintf("%s (%s, instance %d)", w.Name, w.Mode, n+1)
		for ch, ack := range inst.AckAt {
			c.workerChannel(who, ch, ack, inst)
		}
	}
}

func (c *checker) workerChannel(who, ch string, ack time.Duration, inst *WorkerInstance) {
	// The worker's view of ch: its notifications and every marker that covers ch.
	got := map[Key]int{} // key → position in inst.Items
	lastSeq := map[int]int64{}
	for i, it := range inst.Items {
		if it.Marker != "" || it.Channel != ch {
			continue
		}
		c.r.stat("hub notifications checked", 1)
		if it.Bad != "" {
			c.r.fail(FailHubPhantom, who, "%s: %s", ch, it.Bad)
			continue
		}
		if _, dup := got[it.Key]; dup {
			c.r.fail(FailHubOrder, who, "%s: notification %v received twice", ch, it.Key)
			continue
		}
		got[it.Key] = i
		if prev, ok := lastSeq[it.Key.Pub()]; ok && it.Key.Seq() <= prev {
			c.r.fail(FailHubOrder, who, "%s: publisher %d's %d after its %d", ch, it.Key.Pub(), it.Key.Seq(), prev)
		}
		lastSeq[it.Key.Pub()] = it.Key.Seq()
		p := c.pubOf[it.Key]
		switch {
		case p == nil:
			c.r.fail(FailHubPhantom, who, "%s: notification %v, which nobody sent", ch, it.Key)
		case p.Outcome == NotCommitted:
			c.r.fail(FailHubPhantom, who, "%s: notification %v of a transaction that did not commit (%s)", ch, it.Key, p.Detail)
		}
	}
	covers := func(it WorkerItem) bool {
		return it.Marker == "down" || it.Marker == "end" || (it.Marker == "resync" && (it.Channel == "" || it.Channel == ch))
	}
	// Per publisher, the notifications owed in commit order; each one missing needs a marker
	// between the received neighbours from the same publisher.
	byPub := map[int][]noteRec{}
	for _, n := range c.notes[ch] {
		if n.sent > ack && n.acked < inst.EndAt {
			byPub[n.key.Pub()] = append(byPub[n.key.Pub()], n)
		}
	}
	for _, owed := range byPub {
		sort.Slice(owed, func(i, j int) bool { return owed[i].key.Seq() < owed[j].key.Seq() })
		prevIdx := -1
		for i, n := range owed {
			if idx, ok := got[n.key]; ok {
				prevIdx = idx
				continue
			}
			nextIdx := len(inst.Items)
			for _, m := range owed[i+1:] {
				if idx, ok := got[m.key]; ok {
					nextIdx = idx
					break
				}
			}
			covered := false
			for k := prevIdx + 1; k < nextIdx; k++ {
				if covers(inst.Items[k]) {
					covered = true
					break
				}
			}
			if covered {
				c.r.stat("hub notifications missed and covered by a RESYNC", 1)
				continue
			}
			c.r.fail(FailHubMissing, who, "%s: notification %v committed at %s (after the ACK at %s) never arrived and no RESYNC/LISTENER_DOWN followed", ch, n.key, fmtDur(n.acked), fmtDur(ack))
		}
	}
}

func fmtDur(d time.Duration) string { return d.Round(time.Millisecond).String() }
