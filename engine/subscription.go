package engine

import (
	"cmp"
	"slices"
	"unsafe"

	"github.com/pgsse/pgsse/framing"
)

// Subscriptions (docs/http.md, Cursors and gaps): what a connection follows. A connection holds
// a small set of them (sseConn.sub); each subscription owns its stream (or raw channel), its
// cursor, its view of the audience, and where it is in catching up:
//
//	starting ─► catch-up ◄─► live
//	               ▲    ╲     │
//	               │     ▼    ▼
//	               └──── lagging
//
//   - starting: registered on its stream or channel, waiting to know where it starts — its
//     stream's head read from the table (a request without a cursor, before the stream's
//     head is known), or its channel's LISTEN;
//   - catch-up: it knows its cursor; history after it is read from the table (catchup.go)
//     once the connection's response head is out, and live durable events are not written to
//     it (ephemeral ones are);
//   - live: it takes live writes;
//   - lagging: its connection's queue went over the high watermark (budget.go); it waits for
//     the queue to drain below the low one, then catches up.
//
// The connection's response head goes out (connTable.respond) once none of its subscriptions
// is starting; a connection's queue, timers and token stay the connection's. Replay, lag and
// gap handling are per subscription: the fan-out (fanout.go) indexes subscriptions, not
// connections, and deliver decides for one subscription what of a loop pass's events it takes.
//
// Several streams on one connection (GET /streams?stream=…: docs/http.md, Several streams on
// one connection) are a connection with a subSet. Its durable events carry a composite id —
// the event's position and every stream's cursor — built per delivery into scratch that lives
// until the write (leadID), in front of the event's shared encoding without its own id line.
// What a loop pass brings it on its streams leaves in one write, in the order the events
// arrived (deliverMulti), and its table reads take turns, one at a time (catchup.go: mayRead),
// so catching up K streams holds no more than catching up one.
//
// subscription.to is the one assignment of a subscription's state, called only by the
// transition helpers here and in catchup.go (parts_test.go: TestStateAssignedOnlyByItsHelper).

// subState is where a subscription is in catching up.
type subState uint8

const (
	subNone     subState = iota // not subscribed (yet, or any more)
	subStarting                 // registered; waiting for its stream's head or its channel's LISTEN
	subCatchUp                  // reading history from the table
	subLive                     // taking live writes
	subLagging                  // its connection is over the high watermark; waiting to drain
)

// subSet is the rest of a connection's subscriptions when it has more than one, or follows
// streams through GET /streams (composite ids, even for one): made once, at subscribe.
type subSet struct {
	subs      []subscription // the second and later subscriptions, in request order; never reallocated
	composite bool           // durable events carry the composite id (docs/http.md)
	pass      uint32         // the flush pass (subscriptions.pass+1) that listed the connection in multi
	reading   *subscription  // the subscription whose table read is in flight (catchup.go: mayRead)
	waiting   []*subscription
}

// subscription is one thing a connection follows: a durable stream or a raw channel, its
// source. It lives inside its connection (sseConn.first, or its subSet) for as long as the
// connection does, so the fan-out's pointers to it stay valid until the connection is removed.
// 32 B (TestIdleConnSize): the source is one pointer, a *stream or (subOnChannel) a *channel,
// set and read only through onStream, onChannel, stream and channel.
type subscription struct {
	conn   *sseConn
	src    unsafe.Pointer // its *stream, or with subOnChannel its *channel; nil while it has none
	cursor int64          // last durable id written (or skipped) on this subscription
	idx    int32          // in its stream's or channel's subscriber list (fanout.go)
	state  subState
	flags  subFlags
	// gapChecked is set once the client's cursor has been checked against the table.
	gapChecked bool
	retries    uint8 // consecutive failed history reads
}

// subFlags are a subscription's bits.
type subFlags uint8

const (
	subOnChannel subFlags = 1 << iota // its source is a channel
	subReplaying                      // a table read for it is in flight
)

// stream is a stream subscription's stream (nil: a channel's, or none).
func (sub *subscription) stream() *stream {
	if sub.flags&subOnChannel != 0 {
		return nil
	}
	return (*stream)(sub.src)
}

// channel is a channel subscription's channel (nil: a stream's, or none).
func (sub *subscription) channel() *channel {
	if sub.flags&subOnChannel == 0 {
		return nil
	}
	return (*channel)(sub.src)
}

// onStream makes st its source.
func (sub *subscription) onStream(st *stream) {
	sub.src, sub.flags = unsafe.Pointer(st), sub.flags&^subOnChannel
}

// onChannel makes ch its source.
func (sub *subscription) onChannel(ch *channel) {
	sub.src, sub.flags = unsafe.Pointer(ch), sub.flags|subOnChannel
}

// leaveSource forgets its source.
func (sub *subscription) leaveSource() { sub.src, sub.flags = nil, sub.flags&^subOnChannel }

// replaying reports whether a table read for it is in flight.
func (sub *subscription) replaying() bool { return sub.flags&subReplaying != 0 }

// setReplaying records whether a table read for it is in flight.
func (sub *subscription) setReplaying(on bool) {
	if on {
		sub.flags |= subReplaying
	} else {
		sub.flags &^= subReplaying
	}
}

// to is the one assignment of a subscription's state.
func (sub *subscription) to(state subState) { sub.state = state }

// sees reports whether the subscription's audience view lets ev through: the connection's
// token tags against the event's audience (docs/http.md, Audience), for live writes and
// replay alike.
func (sub *subscription) sees(ev *event) bool { return sub.conn.sees(ev.audience) }

// subIndex is sub's position in its stream's or channel's subscriber list.
func subIndex(sub *subscription) *int32 { return &sub.idx }

// subCount is how many subscriptions the connection holds.
func (sc *sseConn) subCount() int { return int(sc.nsub) }

// sub is the connection's i-th subscription, in request order.
func (sc *sseConn) sub(i int) *subscription {
	if i == 0 {
		return &sc.first
	}
	return &sc.moreSubs().subs[i-1]
}

// composite reports whether the connection's durable events carry composite ids (it came
// through GET /streams).
func (sc *sseConn) composite() bool { return sc.moreSubs() != nil && sc.moreSubs().composite }

// position is sub's place in its connection's subscriptions (the k of a composite id).
func (sub *subscription) position() int {
	sc := sub.conn
	for i := range sc.subCount() {
		if sc.sub(i) == sub {
			return i
		}
	}
	return 0
}

// subscriptions is the loop's part for subscriptions: their transitions, what each takes of
// a loop pass's events (deliver), and their catch-up (catchup.go): table reads per
// subscription, the ones lagging, the failed reads to retry and those waiting for a large
// event to leave.
type subscriptions struct {
	*loopEnv
	conns *connTable
	out   *outbound
	fan   *fanout
	chans *channelTable
	lsn   *listenState
	tr    transport

	lagging      []*subscription
	laggingSpare []*subscription
	retry        []*subscription // failed history reads, retried on the sweep
	largeWait    []*subscription // catch-ups waiting for a large event to leave (budget.go)
	reads        readGate        // catch-up reads in the replay pool's queue, and those waiting (catchup.go)
	items        []outItem       // scratch: one connection's write
	evs          []*event        // scratch: a ring's events one subscription bridges

	// Several streams on one connection: the connections a flush pass owes a write (multi,
	// listed once per pass), and scratch for one connection's write — what it takes in arrival
	// order (pairs), whose each item is (owners), the composite id lines (ids) and the cursors
	// they are made of (cursors).
	multi   []*sseConn
	pass    uint32 // flush passes done
	pairs   []delivery
	owners  []*subscription
	ids     []byte
	cursors []int64
}

// delivery is one event of a loop pass for one subscription of a connection with several.
type delivery struct {
	sub *subscription
	ev  *event
	k   int // sub's position
}

// idScratchKeep is how much id-line scratch is kept between writes; a write that needed more
// (a large catch-up batch of a connection with many streams) gives it back.
const idScratchKeep = 256 << 10

// anyLagging reports whether a subscription waits for its connection's queue to drain (the
// ticker ticks fast then).
func (s *subscriptions) anyLagging() bool { return len(s.lagging) > 0 }

// --- subscribing --------------------------------------------------------------------------

// subscribe gives an admitted (pending) connection its subscriptions, as its request asked,
// and starts each: registered on its stream or channel before any history is read
// (docs/architecture.md, invariant 4). The connection is answered once none is starting.
func (s *subscriptions) subscribe(sc *sseConn, req *subRequest) {
	if req.streams != nil { // GET /streams?stream=…
		s.hold(sc, len(req.streams), true)
		for i, ask := range req.streams {
			s.subscribeStream(sc.sub(i), ask.name, ask.cursor, ask.hasCursor)
		}
		s.started(sc)
		return
	}
	s.hold(sc, 1, false)
	sub := sc.sub(0)
	if req.isChan {
		s.subscribeChannel(sub, req.name)
	} else {
		s.subscribeStream(sub, req.name, req.cursor, req.hasCursor)
	}
	s.started(sc)
}

// hold sizes the connection's set of subscriptions: the first inline, the others in one
// array of their own (a subSet, which a composite connection has even for one stream).
func (s *subscriptions) hold(sc *sseConn, k int, composite bool) {
	if k > 1 || composite {
		sc.setMoreSubs(&subSet{subs: make([]subscription, k-1), composite: composite})
	}
	sc.nsub = uint8(k)
	for i := range k {
		sc.sub(i).conn = sc
	}
}

// subscribeStream registers a subscription on its stream; hasCursor tells whether the client
// sent Last-Event-ID/since. Without a cursor the subscription starts at the stream's head:
// known (and the session up) means at once, else the head is read from the table first
// (readHead). With one, its history is read once the connection has its response head.
func (s *subscriptions) subscribeStream(sub *subscription, name string, cursor int64, hasCursor bool) {
	sub.onStream(s.fan.join(name, sub))
	switch {
	case hasCursor:
		sub.cursor = cursor
		sub.gapChecked = false
		sub.to(subCatchUp)
	case sub.stream().head() >= 0 && s.lsn.isUp():
		sub.cursor = sub.stream().head()
		sub.gapChecked = true
		sub.to(subCatchUp)
	default:
		sub.gapChecked = true
		sub.to(subStarting)
		s.readHead(sub)
	}
}

// subscribeChannel registers a subscription on its raw channel; it is live once the LISTEN
// has completed (here, or in channelStarted). Over the SSE side's share of channels
// (channels.go, channelShares) its connection is shed, saying so: 200 and retry (docs/http.md,
// Responses and errors), as for any capacity — a limit of the server that frees up as others
// leave, not an error of the request, which EventSource would take as final.
func (s *subscriptions) subscribeChannel(sub *subscription, name string) {
	if s.chans.sseShareFull([]byte(name)) {
		s.chans.logLimit("SSE clients", s.chans.sseShare())
		s.conns.shed(sub.conn, shedChannelLimit)
		return
	}
	sub.onChannel(s.fan.joinChannel(name, sub))
	if s.chans.isLive(sub.channel()) {
		sub.to(subLive)
		return
	}
	sub.to(subStarting)
}

// started answers a pending connection once none of its subscriptions is starting: the
// response head goes out (docs/http.md: only once the subscription is live), then each
// stream subscription catches up — from the table when its cursor has not been checked yet,
// else from its stream's ring if it can.
func (s *subscriptions) started(sc *sseConn) {
	if sc.closed || sc.state != statePending {
		return
	}
	n := sc.subCount()
	for i := range n {
		if sc.sub(i).state == subStarting {
			return
		}
	}
	s.conns.respond(sc)
	s.catchUp(sc)
}

// catchUp starts each of a streaming connection's catching-up stream subscriptions: from the
// table when its cursor has not been checked yet, else from its stream's ring if it can.
func (s *subscriptions) catchUp(sc *sseConn) {
	for i := range sc.subCount() {
		sub := sc.sub(i)
		switch {
		case sc.ending():
			return
		case sub.state != subCatchUp:
		case !sub.gapChecked:
			s.replay(sub)
		default:
			s.tryJoin(sub)
		}
	}
}

// channelStarted: the subscription's channel LISTEN has completed (fanout.channelLive).
func (s *subscriptions) channelStarted(sub *subscription) {
	if sub.state != subStarting || sub.conn.closed {
		return
	}
	sub.to(subLive)
	s.started(sub.conn)
}

// channelFailed: the subscription's channel could not be LISTENed; a connection still
// waiting for it is shed for why.
func (s *subscriptions) channelFailed(sub *subscription, why shedReason) {
	if sub.state == subStarting && sub.conn.state == statePending {
		s.conns.shed(sub.conn, why)
	}
}

// unsubscribeAll drops a closed connection's subscriptions from their streams and channels
// (connTable.remove). Lists that still name them (lagging, retries) skip them: their
// connection is closed.
func (s *subscriptions) unsubscribeAll(sc *sseConn) {
	for i := range sc.subCount() {
		sub := sc.sub(i)
		switch {
		case sub.stream() != nil:
			s.fan.leave(sub.stream(), sub)
			sub.leaveSource()
		case sub.channel() != nil:
			s.fan.leaveChannel(sub.channel(), sub)
			sub.leaveSource()
		}
		sub.to(subNone)
	}
}

// --- handoff (handoff.go) -----------------------------------------------------------------

// record appends sc's subscriptions to dst as a handoff record has them: each stream's name,
// cursor (the last durable id written or queued — the queue travels with the record) and
// state, each channel's name. ok is false if one is still starting (a streaming connection's
// never are).
func (s *subscriptions) record(sc *sseConn, dst []framing.HandoffSub) ([]framing.HandoffSub, bool) {
	for i := range sc.subCount() {
		sub := sc.sub(i)
		r := framing.HandoffSub{Checked: sub.gapChecked, Cursor: sub.cursor}
		switch sub.state {
		case subLive:
			r.State = framing.HandoffLive
		case subCatchUp:
			r.State = framing.HandoffCatchUp
		case subLagging:
			r.State = framing.HandoffLagging
		default:
			return dst, false
		}
		switch {
		case sub.stream() != nil:
			r.Kind, r.Name = framing.HandoffStream, sub.stream().name
		case sub.channel() != nil:
			r.Kind, r.Name = framing.HandoffChannel, sub.channel().name
			r.Cursor = s.chans.ssePosition(sub.channel()) // its handoff position
		default:
			return dst, false
		}
		dst = append(dst, r)
	}
	return dst, len(dst) > 0
}

// adopt gives a connection handed over by a predecessor its subscriptions as they stood
// there: each stream at its cursor, catching up from the ring or the table (exactly once, in
// order: the cursor is the last event written or queued there, and the queue came along);
// each channel at its handoff position (channelTable.resumeAt: the notifications it missed
// between the two processes first, then live; docs/architecture.md, Handoff positions), or
// live once its LISTEN here has completed if its position is not known here.
func (s *subscriptions) adopt(sc *sseConn, h *framing.HandoffConn) {
	s.hold(sc, len(h.Subs), h.Composite)
	for i, r := range h.Subs {
		sub := sc.sub(i)
		if r.Kind == framing.HandoffChannel {
			sub.onChannel(s.fan.joinChannel(r.Name, sub))
			sub.to(subStarting)
			s.chans.resumeAt(sub.channel(), r.Cursor, func(notes []heldNote, _ bool) { s.resumeChannel(sub, notes) })
			continue
		}
		sub.onStream(s.fan.join(r.Name, sub))
		sub.cursor = r.Cursor
		sub.gapChecked = r.Checked
		sub.to(subCatchUp)
	}
	s.catchUp(sc)
}

// resumeChannel starts a handed-over channel subscription (channelTable.resumeAt): the
// notifications it missed first, then live — unless its LISTEN here is not complete yet
// (channelStarted starts it then; a subscription's notifications are best effort).
func (s *subscriptions) resumeChannel(sub *subscription, notes []heldNote) {
	if sub.state != subStarting || sub.conn.closed || sub.channel() == nil || !s.chans.isLive(sub.channel()) {
		return
	}
	sub.to(subLive)
	s.fan.resumeChannel(sub, notes)
}

// --- live events --------------------------------------------------------------------------

// deliver writes the items of a loop pass that sub should get, in one syscall. A live
// subscription gets durable and ephemeral events; one catching up or lagging gets only
// ephemeral ones (its durable events come from the table). The outbound limits of the moment
// apply (budget.go): a live subscription whose connection is over its high watermark is
// paused before the write; of what the socket does not take, durable events are queued only
// up to high + slice — the first one beyond (never the first the queue holds) and those after
// it are not sent, and the subscription is paused with its cursor just before it (the rest
// comes from the ring or the table); an ephemeral event for a connection over the ephemeral
// limit closes it. It returns the events written.
func (s *subscriptions) deliver(sub *subscription, items []*event) int {
	sc := sub.conn
	if !sc.streaming() {
		return 0
	}
	if sc.nsub > 1 {
		s.queueMulti(sc) // one write for all its streams, once the pass is known (flushMulti)
		return 0
	}
	l := s.out.limits()
	queued := sc.pending()
	live := sub.state == subLive
	if live && queued > l.high {
		s.pause(sub)
		live = false
	}
	if st := sub.stream(); st != nil && st.onlyDurable() {
		// Durable events alone, in id order: a sweep's queue may carry many this subscription
		// had in the sweep before (fanout_sweep.go); its share starts after its cursor.
		if !live {
			return 0
		}
		items = after(items, sub.cursor)
	}
	out := s.items[:0]
	s.ids = s.ids[:0]
	defer func() {
		clear(out)
		s.items = out[:0]
		s.idsWritten()
	}()
	n := 0
	for _, ev := range items {
		if ev.id > 0 {
			if !live || ev.id <= sub.cursor {
				continue
			}
			sub.cursor = ev.id
			if !sub.sees(ev) {
				continue
			}
		} else {
			if !sub.sees(ev) {
				continue
			}
			if queued > l.ephemeral {
				s.conns.evictSlow(sc)
				return 0
			}
		}
		out = s.appendEvent(out, sub, ev)
		n++
	}
	if n == 0 {
		return 0
	}
	cut := s.conns.writeLive(sc, out, l.high+l.slice)
	if cut == len(out) {
		return n
	}
	// Durable events from the cut on were not sent: the subscription resumes just before it.
	sub.cursor = cutEvent(out, cut).id - 1
	s.pause(sub)
	return writtenBefore(out, cut)
}

// after is what of items — durable events in id order — comes after id c, found by a
// binary search.
func after(items []*event, c int64) []*event {
	if len(items) == 0 || items[0].id > c {
		return items
	}
	lo, hi := 0, len(items)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if items[m].id <= c {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return items[lo:]
}

// appendEvent appends the items that write ev to sub's connection: the event's shared
// encoding. On a composite connection a durable event is led by its composite id — the
// connection's own bytes (leadID), then the shared encoding without its id line
// (tr.eventBody) — which the write path sends in the same writev without copying the shared
// bytes. sub.cursor must already be ev's id.
func (s *subscriptions) appendEvent(items []outItem, sub *subscription, ev *event) []outItem {
	if ev.id == 0 || !sub.conn.composite() {
		return append(items, sharedItem(ev))
	}
	return append(items, s.leadID(sub, sub.position()), sharedBodyItem(ev, s.tr.eventBody(ev.enc)))
}

// appendTableEvent appends the items that write enc — a table read's encoding, this
// connection's alone and immutable — led by its composite id on a composite connection (see
// appendEvent). sub.cursor must already be the event's id.
func (s *subscriptions) appendTableEvent(items []outItem, sub *subscription, enc []byte) []outItem {
	if !sub.conn.composite() {
		return append(items, ownItem(enc))
	}
	return append(items, s.leadID(sub, sub.position()), ownItem(s.tr.eventBody(enc)))
}

// leadID builds the composite id line of sub's event from its connection's cursors of the
// moment (sub at position k), in the id scratch: the write copies it if it has to keep it
// (outbound.enqueue), so the scratch lives only until the write. Whoever builds a write
// resets the scratch first (s.ids = s.ids[:0]).
func (s *subscriptions) leadID(sub *subscription, k int) outItem {
	sc := sub.conn
	cursors := s.cursors[:0]
	for i := range sc.subCount() {
		cursors = append(cursors, sc.sub(i).cursor)
	}
	s.cursors = cursors
	start := len(s.ids)
	s.ids = s.tr.compositeID(s.ids, k, cursors)
	return leadItem(s.ids[start:len(s.ids):len(s.ids)])
}

// idsWritten ends a write's use of the id scratch, giving back an unusually large one.
func (s *subscriptions) idsWritten() {
	if cap(s.ids) > idScratchKeep {
		s.ids = nil
	}
	s.ids = s.ids[:0]
}

// queueMulti lists a connection with several subscriptions for this pass's write
// (flushMulti), once.
func (s *subscriptions) queueMulti(sc *sseConn) {
	if pass := s.pass + 1; sc.moreSubs().pass != pass {
		sc.moreSubs().pass = pass
		s.multi = append(s.multi, sc)
	}
}

// flushMulti writes what this flush pass brought the connections with several subscriptions
// (fanout.flushStreams, after every stream's own subscriptions): one write each. It returns
// the events written.
func (s *subscriptions) flushMulti(slice int, between func()) int {
	n := 0
	for i, sc := range s.multi {
		n += s.deliverMulti(sc)
		s.multi[i] = nil
		if (i+1)%slice == 0 {
			between()
		}
	}
	s.multi = s.multi[:0]
	s.pass++
	return n
}

// deliverMulti is deliver for a connection with several subscriptions: what this pass's
// events on each of its streams bring it — by deliver's rules, each subscription with its own
// state and cursor — in one write, in the order the events arrived (docs/http.md: live
// events are written in the order pgsse receives them). Of what the socket does not take,
// durable events are queued up to high + slice: each subscription with an event from the
// cut on resumes just before its first one and is paused.
func (s *subscriptions) deliverMulti(sc *sseConn) int {
	if !sc.streaming() {
		return 0
	}
	l := s.out.limits()
	queued := sc.pending()
	pairs := s.pairs[:0]
	streams := 0
	for k := range sc.subCount() {
		sub := sc.sub(k)
		if sub.stream() == nil {
			continue
		}
		evs := sub.stream().sweepable()
		if len(evs) == 0 {
			continue
		}
		streams++
		if sub.state == subLive && queued > l.high {
			s.pause(sub)
		}
		for _, ev := range evs {
			pairs = append(pairs, delivery{sub: sub, ev: ev, k: k})
		}
	}
	if streams > 1 {
		slices.SortFunc(pairs, byArrival)
	}
	out, owners := s.items[:0], s.owners[:0]
	s.ids = s.ids[:0]
	defer func() {
		clear(out)
		clear(owners)
		clear(pairs)
		s.items, s.owners, s.pairs = out[:0], owners[:0], pairs[:0]
		s.idsWritten()
	}()
	n := 0
	for _, p := range pairs {
		sub, ev := p.sub, p.ev
		if ev.id > 0 {
			if sub.state != subLive || ev.id <= sub.cursor {
				continue
			}
			sub.cursor = ev.id
			if !sub.sees(ev) {
				continue
			}
			if sc.composite() {
				out = append(out, s.leadID(sub, p.k), sharedBodyItem(ev, s.tr.eventBody(ev.enc)))
				owners = append(owners, sub, sub)
			} else {
				out = append(out, sharedItem(ev))
				owners = append(owners, sub)
			}
		} else {
			if !sub.sees(ev) {
				continue
			}
			if queued > l.ephemeral {
				s.metrics.droppedSlowClient.Inc()
				s.conns.closeWithRetry(sc)
				return 0
			}
			out = append(out, sharedItem(ev))
			owners = append(owners, sub)
		}
		n++
	}
	if n == 0 {
		return 0
	}
	cut := s.conns.writeLive(sc, out, l.high+l.slice)
	if cut == len(out) {
		return n
	}
	// Durable events from the cut on were not sent: each of their subscriptions resumes just
	// before its first one (ids of one stream come in order), and is paused.
	for i := cut; i < len(out); i++ {
		if ev := durableAt(out, i); ev != nil {
			if sub := owners[i]; sub.state == subLive {
				sub.cursor = ev.id - 1
				s.pause(sub)
			}
		}
	}
	return writtenBefore(out, cut)
}

// byArrival orders a pass's deliveries as their events arrived.
func byArrival(a, b delivery) int { return cmp.Compare(a.ev.seq, b.ev.seq) }

// deliverChannel writes a loop pass's notifications to a live channel subscription, or closes
// its connection when it is over the ephemeral limit. It returns the events written.
func (s *subscriptions) deliverChannel(sub *subscription, evs []*event) int {
	sc := sub.conn
	if sc.closed || sub.state != subLive || !sc.streaming() {
		return 0
	}
	if sc.pending() > s.out.limits().ephemeral {
		s.conns.evictSlow(sc)
		return 0
	}
	s.conns.writeEvents(sc, evs)
	return len(evs)
}

// liveGap announces to a live subscription that its stream's next events were pruned while
// the stream was being read (fanout.onFetch): one pgsse:gap, and its cursor moves to resume.
func (s *subscriptions) liveGap(sub *subscription, resume int64) {
	if sub.state != subLive || !sub.conn.streaming() || sub.cursor >= resume {
		return
	}
	s.conns.write(sub.conn, s.tr.gap([]byte(sub.stream().name), sub.cursor, resume))
	sub.cursor = resume
}

// --- catching up, lagging ----------------------------------------------------------------

// goLive moves a subscription that has caught up into the live set: catch-up → live.
func (s *subscriptions) goLive(sub *subscription) { sub.to(subLive) }

// pause stops live writes to a subscription whose connection is over the high watermark:
// live or catch-up → lagging. The tick resumes it (resumeLagging) once its connection's
// queue has drained.
func (s *subscriptions) pause(sub *subscription) {
	sub.to(subLagging)
	s.lagging = append(s.lagging, sub)
	s.metrics.lagging.Inc()
}

// resume sends a subscription whose connection drained back to reading: lagging → catch-up.
func (s *subscriptions) resume(sub *subscription) { sub.to(subCatchUp) }
