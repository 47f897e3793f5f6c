package engine

import (
	"bytes"
	"time"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/sse"
	"github.com/pgsse/pgsse/store"
)

// event is one event encoded once for every subscriber (docs/architecture.md, invariant 2).
type event struct {
	id       int64    // durable id; 0 for ephemeral events
	enc      []byte   // SSE bytes, shared by every write (and by the queues that hold them)
	audience []string // nil = everyone
	timeUS   int64    // publisher's clock (delivery-lag metric)
	queued   int32    // connection queues holding (part of) enc (outbound.go)
	// stream is set on a large event read from the table (budget.go: heldLarge): while
	// queues hold it, it is one of at most maxLargeEvents, and shared by every reader.
	stream string
}

// stream is the loop's state for one durable stream that has subscribers.
//
// ring holds the most recent events with contiguous ids ring[0].id … last, so that a
// connection finishing its catch-up close to the head bridges the rest from memory
// instead of racing the publisher with more table reads. last is the highest id the
// stream has accounted for (every id ≤ last is in the ring, was delivered to the live
// set, or is older than the ring); -1 = not known yet.
type stream struct {
	name     string
	subs     []*sseConn
	ring     []*event
	ringSize int
	last     int64
	notified int64    // highest durable id seen in a notification
	pending  []*event // durable events that arrived beyond a gap, waiting for a fetch
	fetching bool     // a stream-level table read is in flight
	out      []*event // items appended during the current loop task, flushed once
	dirty    bool
}

// Limits of the stream state (docs/architecture.md, invariant 3). The backpressure policy — how
// much a connection may have queued — is the outbound budget's (budget.go).
const (
	ringMaxEvents     = 512     // recent events a stream keeps for joining connections
	ringMaxBytes      = 1 << 20 // and their encoded bytes (a larger event is not kept)
	pendingMaxEvents  = 4096    // live events held beyond a gap while the table is read
	replayBatchEvents = 200     // events per catch-up read for one connection
	fetchBatchEvents  = 500     // events per stream-level read
)

func (s *Server) streamFor(name string) *stream {
	st := s.streams[name]
	if st == nil {
		st = &stream{name: name, last: -1}
		s.streams[name] = st
	}
	return st
}

func (s *Server) maybeDropStream(st *stream) {
	if len(st.subs) == 0 && !st.fetching && s.streams[st.name] == st {
		delete(s.streams, st.name)
	}
}

// onPayload handles one notification on the pgsse channel.
func (s *Server) onPayload(p *store.Payload) {
	st := s.streams[string(p.Stream)] // no allocation: map lookup by converted key
	if st == nil {
		return // nobody subscribed here
	}
	switch p.Kind {
	case store.KindEphemeral:
		ev := &event{enc: sse.AppendEvent(nil, 0, p.Event, p.Data), audience: payloadTags(p), timeUS: p.TimeUS}
		st.out = append(st.out, ev)
		s.markDirty(st)
	case store.KindDurable, store.KindWake:
		id := p.ID
		if id > st.notified {
			st.notified = id
		}
		if st.last < 0 {
			st.last = id - 1 // first sight of the stream: the ring starts here
		}
		if id <= st.last {
			return // already accounted for (replayed or duplicate)
		}
		if p.Kind == store.KindWake {
			s.startFetch(st) // data is only in the table
			return
		}
		ev := &event{id: id, enc: sse.AppendEvent(nil, id, p.Event, p.Data), audience: payloadTags(p), timeUS: p.TimeUS}
		if id == st.last+1 && !st.fetching {
			s.appendLive(st, ev)
			return
		}
		if len(st.pending) < pendingMaxEvents {
			st.pending = append(st.pending, ev)
		}
		s.startFetch(st)
	}
}

func payloadTags(p *store.Payload) []string {
	if p.NTags == 0 {
		return nil
	}
	tags := make([]string, 0, p.NTags)
	p.Tags(func(t []byte) bool {
		tags = append(tags, string(t))
		return true
	})
	return tags
}

// appendLive records the next contiguous durable event and queues it for the live set.
func (s *Server) appendLive(st *stream, ev *event) {
	st.last = ev.id
	st.ring = append(st.ring, ev)
	st.ringSize += len(ev.enc)
	if len(st.ring) > ringMaxEvents || st.ringSize > ringMaxBytes {
		// Drop the oldest quarter (at least what it takes to fit): the ring is contiguous, so
		// an event too large for it empties it.
		drop := max(1, len(st.ring)/4)
		for _, e := range st.ring[:drop] {
			st.ringSize -= len(e.enc)
		}
		for drop < len(st.ring) && st.ringSize > ringMaxBytes {
			st.ringSize -= len(st.ring[drop].enc)
			drop++
		}
		n := copy(st.ring, st.ring[drop:])
		clear(st.ring[n:])
		st.ring = st.ring[:n]
	}
	st.out = append(st.out, ev)
	s.markDirty(st)
}

func (s *Server) markDirty(st *stream) {
	if !st.dirty {
		st.dirty = true
		s.dirtyStreams = append(s.dirtyStreams, st)
	}
}

// flushStreams writes what the current task queued: one write per connection per stream.
func (s *Server) flushStreams() {
	now := time.Now().UnixMicro()
	for _, st := range s.dirtyStreams {
		st.dirty = false
		items := st.out
		if len(items) == 0 {
			continue
		}
		var delivered int
		for _, sc := range st.subs {
			delivered += s.deliver(sc, items)
		}
		for _, ev := range items {
			if ev.timeUS > 0 {
				s.metrics.lag.Observe(float64(now-ev.timeUS) / 1e6)
			}
		}
		s.metrics.deliveries.Add(float64(delivered))
		for i := range items {
			items[i] = nil
		}
		st.out = items[:0]
	}
	s.dirtyStreams = s.dirtyStreams[:0]
}

// deliver writes the items a connection should get, in one syscall. Live connections get
// durable and ephemeral events; connections still catching up or lagging get only ephemeral
// ones (their durable events come from the table). The outbound limits of the moment apply
// (budget.go): a live connection over its high watermark is paused before the write; of what
// the socket does not take, durable events are queued only up to high + slice — the first
// one beyond (never the first the queue holds) and those after it are not sent, and the
// connection is paused with its cursor just before it (the rest comes from the ring or the
// table); an ephemeral event for a connection over the ephemeral limit closes it.
func (s *Server) deliver(sc *sseConn, items []*event) int {
	if !sc.streaming() {
		return 0
	}
	l := s.limits()
	queued := sc.pending()
	live := sc.state == stateLive
	if live && queued > l.high {
		s.pause(sc)
		live = false
	}
	evs := s.evs[:0]
	defer func() {
		clear(evs)
		s.evs = evs[:0]
	}()
	for _, ev := range items {
		if ev.id > 0 {
			if !live || ev.id <= sc.cursor {
				continue
			}
			sc.cursor = ev.id
			if !auth.InAudience(sc.tags, ev.audience) {
				continue
			}
		} else {
			if !auth.InAudience(sc.tags, ev.audience) {
				continue
			}
			if queued > l.ephemeral {
				s.metrics.droppedSlowClient.Inc()
				s.closeWithRetry(sc)
				return 0
			}
		}
		evs = append(evs, ev)
	}
	if len(evs) == 0 {
		return 0
	}
	n := sc.writeLive(s, evs, l.high+l.slice)
	if n == len(evs) {
		return n
	}
	// Durable events from evs[n] on were not sent: the connection resumes just before it.
	sc.cursor = evs[n].id - 1
	s.pause(sc)
	delivered := n
	for _, ev := range evs[n:] {
		if ev.id == 0 {
			delivered++
		}
	}
	return delivered
}

// startFetch reads the stream from the table after st.last, for the whole live set.
func (s *Server) startFetch(st *stream) {
	if st.fetching || s.replayer == nil {
		return
	}
	st.fetching = true
	after := st.last
	ok := s.replayer.Read(store.ReadRequest{Stream: st.name, After: after, AllAudiences: true, Limit: fetchBatchEvents, Encode: encodeEvent, OwnBuffers: true},
		func(res store.ReadResult) { s.tasks.push(func() { s.onFetch(st, after, res) }) })
	if !ok {
		st.fetching = false
		s.log.Warn("replay queue full; stream catch-up postponed", "stream", st.name)
	}
}

func (s *Server) onFetch(st *stream, after int64, res store.ReadResult) {
	st.fetching = false
	if s.streams[st.name] != st || len(st.subs) == 0 {
		s.maybeDropStream(st)
		return
	}
	if res.Err != nil {
		s.log.Warn("stream catch-up read failed; retrying on the next tick", "stream", st.name, "err", res.Err)
		s.retryFetch = append(s.retryFetch, st)
		return
	}
	if res.Oldest > st.last+1 && st.last >= 0 {
		// Events were pruned while we were away: announce the gap to the live set.
		resume := res.Oldest - 1
		for _, sc := range st.subs {
			if sc.state == stateLive && sc.cursor < resume {
				sc.write(s, sse.AppendGap(s.scratch[:0], []byte(st.name), sc.cursor, resume))
				sc.cursor = resume
			}
		}
		st.last = resume
	}
	for i := range res.Events {
		e := &res.Events[i]
		if e.ID <= st.last {
			continue
		}
		if e.ID != st.last+1 {
			st.last = e.ID - 1 // ids missing inside a snapshot were pruned
		}
		ev := s.tableEvent(st.name, e)
		if ev == nil {
			// Too many large events held: read from here again later.
			s.retryFetch = append(s.retryFetch, st)
			return
		}
		s.appendLive(st, ev)
	}
	if res.Done && res.Head > st.last {
		st.last = res.Head
	}
	// Live events that were waiting beyond the gap.
	keep := st.pending[:0]
	for _, ev := range st.pending {
		switch {
		case ev.id <= st.last:
		case ev.id == st.last+1:
			s.appendLive(st, ev)
		default:
			keep = append(keep, ev)
		}
	}
	for i := len(keep); i < len(st.pending); i++ {
		st.pending[i] = nil
	}
	st.pending = keep
	if !res.Done || st.notified > st.last || len(st.pending) > 0 {
		s.startFetch(st)
	}
}

// subscribeStream registers an admitted (pending) connection on its stream and starts its
// catch-up; hasCursor tells whether the client sent Last-Event-ID/since. Without a cursor
// the connection starts at the stream's head: known (and the session up) means live at
// once, else the head is read from the table first (readHead).
func (s *Server) subscribeStream(sc *sseConn, name string, cursor int64, hasCursor bool) {
	st := s.streamFor(name)
	sc.stream = st
	sc.subIdx = int32(len(st.subs))
	st.subs = append(st.subs, sc)
	if !hasCursor {
		sc.gapChecked = true
		if st.last >= 0 && s.listenUp {
			sc.cursor = st.last
			s.respond(sc, stateLive)
			return
		}
		s.readHead(sc)
		return
	}
	sc.cursor = cursor
	sc.gapChecked = false
	s.respond(sc, stateCatchUp)
	s.replay(sc)
}

func (s *Server) readHead(sc *sseConn) {
	if s.replayer == nil {
		return
	}
	sc.replaying = true
	ok := s.replayer.Read(store.ReadRequest{Stream: sc.stream.name, HeadOnly: true},
		func(res store.ReadResult) { s.tasks.push(func() { s.onHead(sc, res) }) })
	if !ok {
		sc.replaying = false
		s.shed(sc, shedOverCapacity) // the replay queue is full
	}
}

func (s *Server) onHead(sc *sseConn, res store.ReadResult) {
	sc.replaying = false
	if sc.closed {
		return
	}
	if res.Err != nil {
		s.retryRead(sc, res.Err)
		return
	}
	sc.retries = 0
	sc.cursor = res.Head
	s.respond(sc, stateCatchUp)
	s.tryJoin(sc)
}

// replay reads the next batch of history for one connection.
func (s *Server) replay(sc *sseConn) {
	if s.replayer == nil || sc.replaying {
		return
	}
	sc.replaying = true
	s.metrics.replays.Inc()
	// What the read may bring counts against the budget until it is written (outbound.reading).
	reserved := s.limits().replayBytes()
	req := store.ReadRequest{Stream: sc.stream.name, After: sc.cursor, Tags: sc.tags, Limit: replayBatchEvents,
		MaxBytes: reserved, Encode: encodeEvent}
	s.out.reading += reserved
	ok := s.replayer.Read(req, func(res store.ReadResult) {
		s.tasks.push(func() { s.out.reading -= reserved; s.onReplay(sc, res) })
	})
	if !ok {
		s.out.reading -= reserved
		sc.replaying = false
		s.log.Warn("replay queue full; client told to retry", "stream", sc.stream.name)
		s.closeWithRetry(sc)
	}
}

func (s *Server) onReplay(sc *sseConn, res store.ReadResult) {
	sc.replaying = false
	if sc.closed || sc.state == stateClosing {
		return
	}
	if res.Err != nil {
		s.retryRead(sc, res.Err)
		return
	}
	sc.retries = 0
	items := s.out.items[:0]
	c := sc.cursor
	switch {
	case !sc.gapChecked && c > res.Head:
		// The client's own cursor is newer than the head.
		items = append(items, outItem{b: sse.AppendGap(s.scratch[:0], []byte(sc.stream.name), c, res.Head), transient: true})
		sc.cursor = res.Head
	case (c > 0 || sc.gapChecked) && c+1 < res.Oldest:
		// The next events were pruned: before this client connected, or while it was
		// too slow to take live writes. A cursor of 0 the client sent asks for whatever is
		// retained; a cursor still 0 later (no events yet when it subscribed) does not.
		items = append(items, outItem{b: sse.AppendGap(s.scratch[:0], []byte(sc.stream.name), c, res.Oldest-1), transient: true})
		sc.cursor = res.Oldest - 1
	}
	sc.gapChecked = true
	n := 0
	waitLarge := false
	for i := range res.Events {
		e := &res.Events[i]
		if e.ID <= sc.cursor {
			continue
		}
		if len(e.Data) < largeEventBytes {
			items = append(items, outItem{b: e.Data}) // the encoding, this connection's alone (encodeEvent)
		} else if ev := s.tableEvent(sc.stream.name, e); ev != nil {
			items = append(items, outItem{b: ev.enc, ev: ev}) // shared with whoever else reads it
		} else {
			waitLarge = true // too many large events held: read from here again later
			break
		}
		sc.cursor = e.ID
		n++
	}
	if len(items) > 0 {
		sc.writev(s, items)
	}
	clear(items)
	s.out.items = items[:0]
	s.metrics.deliveries.Add(float64(n))
	if waitLarge {
		s.out.largeWait = append(s.out.largeWait, sc)
		return
	}
	if res.Done {
		if res.Head > sc.cursor {
			sc.cursor = res.Head
		}
		s.tryJoin(sc)
		return
	}
	if sc.pending() > s.limits().high {
		s.pause(sc)
		return
	}
	s.replay(sc)
}

// encodeEvent is the table reads' store.ReadRequest.Encode: an event's SSE encoding, made
// straight from the read buffer. Given no buffer (a large event), it allocates one of the
// encoding's size, so the event is held once.
func encodeEvent(dst []byte, id int64, event, data []byte) []byte {
	if dst == nil {
		lines := bytes.Count(data, []byte{'\n'}) + bytes.Count(data, []byte{'\r'}) + 1
		dst = make([]byte, 0, len(data)+len(event)+len("id: \nevent: \n\n")+20+lines*len("data: \n"))
	}
	return sse.AppendEvent(dst, id, event, data)
}

// tryJoin moves a catching-up connection that has read the table up to its cursor into the
// live set, bridging from the ring when the live set is ahead; otherwise it reads on.
func (s *Server) tryJoin(sc *sseConn) {
	st := sc.stream
	c := sc.cursor
	switch {
	case st.last < 0:
		st.last = c
		if c > st.notified {
			st.notified = c
		}
	case len(st.ring) > 0 && c >= st.ring[0].id-1, len(st.ring) == 0 && c >= st.last:
		// Bridge from the ring, queuing at most what deliver would.
		evs := s.evs[:0]
		for _, ev := range st.ring {
			if ev.id > c && auth.InAudience(sc.tags, ev.audience) {
				evs = append(evs, ev)
			}
		}
		n := len(evs)
		if n > 0 {
			l := s.limits()
			n = sc.writeLive(s, evs, l.high+l.slice)
		}
		cut := n < len(evs)
		if cut {
			sc.cursor = evs[n].id - 1
		}
		clear(evs)
		s.evs = evs[:0]
		if cut {
			s.pause(sc) // the rest once it has drained
			return
		}
		if st.last > sc.cursor {
			sc.cursor = st.last
		}
	default:
		s.replay(sc)
		return
	}
	s.goLive(sc)
}

// resumeLagging is called from the tick for connections whose buffers have drained.
func (s *Server) resumeLagging() {
	if len(s.lagging) == 0 {
		return
	}
	// A connection resumed here may be paused again (tryJoin): it then joins the new list.
	list := s.lagging
	s.lagging = s.laggingSpare[:0]
	low := s.limits().low
	for _, sc := range list {
		if sc.closed || sc.state != stateLagging {
			s.metrics.lagging.Dec()
			continue
		}
		if sc.pending() > low {
			s.lagging = append(s.lagging, sc)
			continue
		}
		s.metrics.lagging.Dec()
		s.resume(sc)
		st := sc.stream // only durable subscribers lag; channel ones are closed instead
		if len(st.ring) > 0 && sc.cursor >= st.ring[0].id-1 {
			s.tryJoin(sc)
		} else {
			s.replay(sc)
		}
	}
	clear(list)
	s.laggingSpare = list[:0]
}

// resyncStreams catches every active stream up from the table after the LISTEN session
// came back: events committed during the outage were never notified.
func (s *Server) resyncStreams() {
	for _, st := range s.streams {
		if st.last >= 0 {
			s.startFetch(st)
		}
	}
}

// maxReadRetries bounds how long (× sweepIntervalMS, about 15 s) a streaming connection
// waits for the table to become readable again before it is told to reconnect later; one
// that has no response head yet (pending) waits maxPendingReadRetries (about 1 s) and is
// then told the database is unavailable, instead of waiting silently.
const (
	maxReadRetries        = 60
	maxPendingReadRetries = 4
)

// retryRead schedules a failed history read again on a later tick: a PostgreSQL restart
// should not cost connected clients their connection.
func (s *Server) retryRead(sc *sseConn, err error) {
	sc.retries++
	limit := uint8(maxReadRetries)
	if sc.state == statePending {
		limit = maxPendingReadRetries
	}
	if sc.retries > limit {
		s.log.Warn("history read keeps failing; client told to retry later", "stream", sc.stream.name, "err", err)
		switch {
		case !schemaMissing(err):
		case sc.state == statePending: // not migrated: say so
			s.shedSaying(sc, shedDatabaseUnavailable, schemaMissingComment)
			return
		case sc.state >= stateCatchUp:
			s.closeWithRetrySaying(sc, shedComments[shedDatabaseUnavailable], schemaMissingComment)
			return
		}
		s.retryLater(sc, shedDatabaseUnavailable)
		return
	}
	if sc.retries == 1 {
		s.log.Warn("history read failed; retrying", "stream", sc.stream.name, "err", err)
	}
	s.retryConns = append(s.retryConns, sc)
}

// retryStreamFetches restarts the stream-level reads that failed (from the tick).
func (s *Server) retryStreamFetches() {
	if len(s.retryFetch) == 0 {
		return
	}
	retry := s.retryFetch
	s.retryFetch = nil
	for _, st := range retry {
		if s.streams[st.name] == st {
			s.startFetch(st)
		}
	}
}

// runReadRetries reissues the connections' failed history reads (from the tick).
func (s *Server) runReadRetries() {
	if len(s.retryConns) == 0 {
		return
	}
	retry := s.retryConns
	s.retryConns = nil
	for _, sc := range retry {
		switch {
		case sc.closed || sc.state == stateClosing:
		case sc.state == statePending:
			s.readHead(sc)
		default:
			s.replay(sc)
		}
	}
}
