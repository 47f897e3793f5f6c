package engine

import (
	"slices"

	"github.com/pgsse/pgsse/store"
)

// Catching a subscription up (docs/http.md, Cursors and gaps; durable delivery guarantee): its
// stream's head read for a subscription without a cursor, its history read from the table in
// batches after its cursor, the gap announced when the next events were pruned (or the
// cursor is newer than the head), then the join into the live set — from the stream's ring
// when the live set is ahead by no more than the ring holds. Each read is the
// subscription's own; results come back as loop tasks and find the connection perhaps gone
// (closed) or sent away (closing). Part of the subscriptions type (subscription.go).

// maxReadRetries bounds how long (× sweepIntervalMS, about 15 s) a streaming connection
// waits for the table to become readable again before it is told to reconnect later; one
// that has no response head yet (its subscription starting) waits maxPendingReadRetries
// (about 1 s) and is then told the database is unavailable, instead of waiting silently.
const (
	maxReadRetries        = 60
	maxPendingReadRetries = 4
)

// --- one read at a time per connection -----------------------------------------------------

// A connection following several streams reads the table for one of them at a time: the
// others wait their turn in its subSet (waiting), in order, and a subscription that needs
// another batch goes behind those waiting. So catching up K streams holds one batch (and one
// replay pool slot) at a time, like catching up one (docs/http.md, Several streams on one
// connection); a connection with one subscription has no turns to take.

// mayRead reports whether sub may start a table read now; if not, it waits its turn (and
// when none is in flight, the first one waiting starts).
func (s *subscriptions) mayRead(sub *subscription) bool {
	set := sub.conn.moreSubs()
	switch {
	case set == nil, set.reading == sub:
		return true
	case set.reading != nil:
		s.waitRead(set, sub)
		return false
	case len(set.waiting) > 0 && set.waiting[0] != sub:
		s.waitRead(set, sub)
		s.nextRead(sub.conn)
		return false
	}
	if len(set.waiting) > 0 { // sub is first in line
		set.waiting = slices.Delete(set.waiting, 0, 1)
	}
	set.reading = sub
	return true
}

func (s *subscriptions) waitRead(set *subSet, sub *subscription) {
	if !slices.Contains(set.waiting, sub) {
		set.waiting = append(set.waiting, sub)
	}
}

// readDone gives sub's turn back once its read has come back (or could not be queued).
func (s *subscriptions) readDone(sub *subscription) {
	if set := sub.conn.moreSubs(); set != nil && set.reading == sub {
		set.reading = nil
	}
}

// nextRead starts the read of the first subscription waiting for its turn, if none is in
// flight; one that no longer needs a read (it joined the live set, or was paused) is dropped
// from the line.
func (s *subscriptions) nextRead(sc *sseConn) {
	set := sc.moreSubs()
	if set == nil || sc.ending() {
		return
	}
	for set.reading == nil && len(set.waiting) > 0 && !sc.ending() {
		next := set.waiting[0]
		switch next.state {
		case subStarting:
			s.readHead(next)
		case subCatchUp:
			s.replay(next)
		}
		if set.reading == nil && len(set.waiting) > 0 && set.waiting[0] == next {
			set.waiting = slices.Delete(set.waiting, 0, 1) // it did not start
		}
	}
}

// readHead reads the head of a starting subscription's stream: where it starts.
func (s *subscriptions) readHead(sub *subscription) {
	if s.replayer == nil || sub.replaying() || !s.mayRead(sub) {
		return
	}
	sub.setReplaying(true)
	ok := s.replayer.Read(store.ReadRequest{Stream: sub.stream().name, HeadOnly: true},
		func(res store.ReadResult) { s.tasks.push(func() { s.onHead(sub, res) }) })
	if !ok {
		sub.setReplaying(false)
		s.readDone(sub)
		s.conns.shed(sub.conn, shedOverCapacity) // the replay queue is full
	}
}

func (s *subscriptions) onHead(sub *subscription, res store.ReadResult) {
	sub.setReplaying(false)
	s.readDone(sub)
	defer s.nextRead(sub.conn)
	if sub.conn.closed {
		return
	}
	if res.Err != nil {
		s.retryRead(sub, res.Err)
		return
	}
	sub.retries = 0
	sub.cursor = res.Head
	sub.to(subCatchUp)
	s.started(sub.conn)
}

// --- at most so many reads in the replay pool's queue --------------------------------------

// A read in flight reserves what it may bring against the outbound budget (outbound.reading),
// from the moment it is queued: thousands of subscribers catching up at once (a restart's
// reconnects, a handoff's moved connections behind the head) queued as many reads behind the
// pool's few connections, whose reservations squeezed every connection's watermark to its
// floor (2.4 KiB at 15,000: bench/RESULTS.md, scenario 17, task deployscale) — live
// subscribers were paused and each join from the ring wrote a few dozen events a round. So at
// most readsInFlightPerConn reads per pool connection are queued at once; the others wait
// here, in order, taking no memory, and a subscriber reading on (its next batch) goes before
// those that have not started: the ones that started finish and join.
const readsInFlightPerConn = 8

// readGate is the subscriptions' reads in the replay pool's queue and those waiting for
// room there.
type readGate struct {
	inFlight int
	waiting  []*subscription
	queued   map[*subscription]bool // in waiting
}

// max is how many reads may be queued at once: readsInFlightPerConn per pool connection, and
// no more than reserve an eighth of the outbound budget between them (half of what squeezes
// the watermarks), but one per pool connection at least.
func (g *readGate) max(poolSize, budget int) int {
	pool := max(poolSize, 1)
	return max(pool, min(readsInFlightPerConn*pool, budget/8/(durableHighBytes+durableSliceBytes)))
}

// wait puts sub in line (once).
func (g *readGate) wait(sub *subscription) {
	if g.queued[sub] {
		return
	}
	if g.queued == nil {
		g.queued = make(map[*subscription]bool)
	}
	g.queued[sub] = true
	g.waiting = append(g.waiting, sub)
}

// fill starts the reads waiting for room (after a read returned, and on the sweep): replay
// (subscriptions.replay) for each, in order, while there is room.
func (g *readGate) fill(max int, replay func(*subscription)) {
	for g.inFlight < max && len(g.waiting) > 0 {
		sub := g.waiting[0]
		g.waiting[0] = nil
		g.waiting = g.waiting[1:]
		delete(g.queued, sub)
		if sub.state == subCatchUp && !sub.conn.ending() {
			replay(sub)
		}
	}
	if len(g.waiting) == 0 {
		g.waiting = nil // let the backing array go after a storm
	}
}

// replay reads the next batch of history for one subscription.
func (s *subscriptions) replay(sub *subscription) {
	if s.replayer == nil || sub.replaying() || sub.conn.ending() || sub.stream().holdRead(sub, s.lsn.settling()) {
		return
	}
	if s.reads.inFlight >= s.reads.max(s.cfg.ReplayPoolSize, s.cfg.MaxOutboundMemory) {
		s.reads.wait(sub) // replay(sub) again once a read returns
		return
	}
	if !s.mayRead(sub) {
		return
	}
	s.reads.inFlight++
	sub.setReplaying(true)
	s.metrics.replays.Inc()
	// What the read may bring counts against the budget until it is written (outbound.reading).
	reserved := s.out.limits().replayBytes()
	after := sub.cursor
	req := store.ReadRequest{Stream: sub.stream().name, After: after, Tags: sub.conn.tags(), Limit: replayBatchEvents,
		MaxBytes: reserved, Encode: s.tr.replayEncoder()}
	s.out.reserveRead(reserved)
	ok := s.replayer.Read(req, func(res store.ReadResult) {
		s.tasks.push(func() { s.out.releaseRead(reserved); s.onReplay(sub, after, res) })
	})
	if !ok {
		s.out.releaseRead(reserved)
		sub.setReplaying(false)
		s.readDone(sub)
		s.reads.inFlight-- // those waiting start on the next return or sweep
		s.log.Warn("replay queue full; client told to retry", "stream", sub.stream().name)
		s.conns.closeWithRetry(sub.conn)
	}
}

func (s *subscriptions) onReplay(sub *subscription, after int64, res store.ReadResult) {
	sub.setReplaying(false)
	s.readDone(sub)
	s.reads.inFlight--
	defer s.reads.fill(s.reads.max(s.cfg.ReplayPoolSize, s.cfg.MaxOutboundMemory), s.replay) // after sub's own next read, if any: it goes first
	sc := sub.conn
	defer s.nextRead(sc)
	if sc.ending() {
		return
	}
	if res.Err != nil {
		s.retryRead(sub, res.Err)
		return
	}
	sub.retries = 0
	if sub.cursor < after { // its stream went back meanwhile (wentBack): read from the new cursor
		s.replay(sub)
		return
	}
	items := s.items[:0]
	s.ids = s.ids[:0]
	c := sub.cursor
	resume, lost := sub.stream().lostCursor(c)
	switch {
	case !sub.gapChecked && lost && resume <= res.Head:
		// The client's cursor is from history the stream lost (fanout.rewind): its ids were
		// given to other events since, which are read next — also when it is past the new
		// head (a gap to the head would skip the new events below it).
		s.conns.write(sc, s.tr.gap([]byte(sub.stream().name), c, resume))
		sub.cursor, sub.gapChecked = resume, true
		if !sc.ending() {
			s.replay(sub)
		}
		return
	case !sub.gapChecked && c > res.Head:
		// The client's own cursor is newer than the head.
		items = append(items, transientItem(s.tr.gap([]byte(sub.stream().name), c, res.Head)))
		sub.cursor = res.Head
	case (c > 0 || sub.gapChecked) && c+1 < res.Oldest:
		// The next events were pruned: before this client connected, or while it was
		// too slow to take live writes. A cursor of 0 the client sent asks for whatever is
		// retained; a cursor still 0 later (no events yet when it subscribed) does not.
		items = append(items, transientItem(s.tr.gap([]byte(sub.stream().name), c, res.Oldest-1)))
		sub.cursor = res.Oldest - 1
	}
	sub.gapChecked = true
	n := 0
	waitLarge := false
	for i := range res.Events {
		e := &res.Events[i]
		if e.ID <= sub.cursor {
			continue
		}
		if len(e.Data) < largeEventBytes {
			sub.cursor = e.ID
			items = s.appendTableEvent(items, sub, e.Data) // the encoding, this connection's alone (the transport's replay encoder)
		} else if ev := s.out.tableEvent(sub.stream().name, e); ev != nil {
			sub.cursor = e.ID
			items = s.appendEvent(items, sub, ev) // shared with whoever else reads it
		} else {
			waitLarge = true // too many large events held: read from here again later
			break
		}
		sub.stream().sawPublished(e.ID, e.TimeUS)
		n++
	}
	if len(items) > 0 {
		s.conns.writev(sc, items)
	}
	clear(items)
	s.items = items[:0]
	s.idsWritten()
	s.metrics.deliveries.Add(float64(n))
	if waitLarge {
		s.largeWait = append(s.largeWait, sub)
		return
	}
	if res.Done {
		if res.Head > sub.cursor {
			sub.cursor = res.Head
		}
		s.tryJoin(sub)
		return
	}
	if sc.pending() > s.out.limits().high {
		s.pause(sub)
		return
	}
	if sub.stream().inRing(sub.cursor) {
		// The rest is in the stream's ring: one write from it, not more reads of the table
		// (each waits its turn in the replay pool behind every other subscriber catching up).
		s.tryJoin(sub)
		return
	}
	s.replay(sub)
}

// wentBack tells a subscription whose stream's history went back to id to (fanout.rewind:
// acknowledged events lost, their ids reused) that what it delivered after to is not the
// stream's any more: one pgsse:gap from its cursor back to to (docs/http.md, Cursors and
// gaps), then the events after to, under their reused ids. One whose connection has no
// response head yet has been sent nothing: it starts at to instead, or, when its cursor is
// the client's and not checked yet, its first read compares it with the head.
func (s *subscriptions) wentBack(sub *subscription, to int64) {
	if sub.cursor <= to || !sub.gapChecked || sub.conn.ending() {
		return
	}
	switch sub.state {
	case subLive, subCatchUp, subLagging:
		if sub.conn.streaming() {
			s.conns.write(sub.conn, s.tr.gap([]byte(sub.stream().name), sub.cursor, to))
		}
		sub.cursor = to
	}
}

// tryJoin moves a catching-up subscription that has read the table up to its cursor into
// the live set, bridging from its stream's ring when the live set is ahead; otherwise it
// reads on.
func (s *subscriptions) tryJoin(sub *subscription) {
	if sub.conn.ending() {
		return
	}
	st := sub.stream()
	c := sub.cursor
	ring, ok := st.bridge(c)
	if !ok {
		s.replay(sub)
		return
	}
	// Bridge from the ring, queuing at most what deliver would.
	items := s.items[:0]
	s.ids = s.ids[:0]
	n := 0
	for _, ev := range ring {
		if ev.id <= c {
			continue
		}
		sub.cursor = ev.id // written or skipped: the composite ids that follow say so
		if sub.sees(ev) {
			items = s.appendEvent(items, sub, ev)
			n++
		}
	}
	cut := len(items)
	if n > 0 {
		l := s.out.limits()
		cut = s.conns.writeLive(sub.conn, items, l.high+l.slice)
	}
	if cut < len(items) {
		sub.cursor = cutEvent(items, cut).id - 1
	}
	clear(items)
	s.items = items[:0]
	s.idsWritten()
	if cut < len(items) {
		s.pause(sub) // the rest once it has drained
		return
	}
	if h := st.head(); h > sub.cursor {
		sub.cursor = h
	}
	s.goLive(sub)
}

// resumeLagging is called from the tick for subscriptions whose connections' queues have
// drained.
func (s *subscriptions) resumeLagging() {
	if len(s.lagging) == 0 {
		return
	}
	// A subscription resumed here may be paused again (tryJoin): it then joins the new list.
	list := s.lagging
	s.lagging = s.laggingSpare[:0]
	low := s.out.limits().low
	for _, sub := range list {
		if sub.conn.ending() || sub.state != subLagging {
			// A closing connection (sent away, its queue trimmed: connTable.finish) takes
			// nothing more: catching it up would put events after its last bytes.
			s.metrics.lagging.Dec()
			continue
		}
		if sub.conn.pending() > low {
			s.lagging = append(s.lagging, sub)
			continue
		}
		s.metrics.lagging.Dec()
		s.resume(sub)
		if sub.stream().inRing(sub.cursor) { // only stream subscriptions lag; channel ones are closed instead
			s.tryJoin(sub)
		} else {
			s.replay(sub)
		}
	}
	clear(list)
	s.laggingSpare = list[:0]
}

// retryRead schedules a failed history read again on a later tick: a PostgreSQL restart
// should not cost connected clients their connection.
func (s *subscriptions) retryRead(sub *subscription, err error) {
	sub.retries++
	limit := uint8(maxReadRetries)
	if sub.state == subStarting {
		limit = maxPendingReadRetries
	}
	if sub.retries > limit {
		s.log.Warn("history read keeps failing; client told to retry later", "stream", sub.stream().name, "err", err)
		switch sc := sub.conn; {
		case !schemaMissing(err):
		case sc.state == statePending: // not migrated: say so
			s.conns.shedSaying(sc, shedDatabaseUnavailable, schemaMissingComment)
			return
		case sc.state == stateStreaming:
			s.conns.closeWithRetrySaying(sc, shedComments[shedDatabaseUnavailable], schemaMissingComment)
			return
		}
		s.conns.retryLater(sub.conn, shedDatabaseUnavailable)
		return
	}
	if sub.retries == 1 {
		s.log.Warn("history read failed; retrying", "stream", sub.stream().name, "err", err)
	}
	s.retry = append(s.retry, sub)
}

// runReadRetries reissues the subscriptions' failed history reads (from the tick).
func (s *subscriptions) runReadRetries() {
	s.reads.fill(s.reads.max(s.cfg.ReplayPoolSize, s.cfg.MaxOutboundMemory), s.replay) // none may be in flight to start them (replay: the pool's queue was full)
	if len(s.retry) == 0 {
		return
	}
	retry := s.retry
	s.retry = nil
	for _, sub := range retry {
		switch {
		case sub.conn.ending():
		case sub.state == subStarting:
			s.readHead(sub)
		default:
			s.replay(sub)
		}
	}
}

// retryLarge reissues the reads that waited for a large event to leave (from the sweep).
func (s *subscriptions) retryLarge() {
	if len(s.largeWait) == 0 {
		return
	}
	keep := s.largeWait[:0]
	for _, sub := range s.largeWait {
		if !sub.conn.closed && sub.state == subCatchUp {
			keep = append(keep, sub)
		}
	}
	clear(s.largeWait[len(keep):])
	s.largeWait = keep
	if s.out.largeFull() {
		return
	}
	waiting := s.largeWait
	s.largeWait = nil
	for _, sub := range waiting {
		s.replay(sub)
	}
}
