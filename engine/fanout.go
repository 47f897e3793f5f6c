package engine

import (
	"slices"
	"time"

	"github.com/pgsse/pgsse/store"
)

// The fan-out (docs/architecture.md, invariant 2): the live side of every durable stream and
// raw channel that has subscriptions here. A notification becomes an event encoded once (by
// the transport); events of one loop pass are queued on their stream or channel and flushed on
// the way out of the loop entry, one write per subscription for all of them (the
// subscriptions decide what each takes: subscription.go, deliver). A stream keeps a small ring
// of its most recent events, so that a subscription that finished reading history close to the
// head joins the live set from memory rather than racing a fast publisher with more table
// reads, and reads the table itself when a notification was only a wake or came beyond a gap.

// event is one event encoded once for every subscriber (docs/architecture.md, invariant 2).
type event struct {
	id       int64    // durable id; 0 for ephemeral events
	enc      []byte   // the transport's bytes, shared by every write (and by the queues that hold them)
	audience []string // nil = everyone
	timeUS   int64    // publisher's clock (delivery-lag metric)
	received int64    // a live durable event: when its notification was received, unix ns (stageWritten); 0 = not measured
	seq      uint64   // arrival order among the events of all streams (fanout.queue)
	queued   int32    // connection queues holding (part of) enc (outbound.go)
	// stream is set on a large event read from the table (budget.go: heldLarge): while
	// queues hold it, it is one of at most maxLargeEvents, and shared by every reader.
	stream string
}

// stream is the loop's state for one durable stream that has subscriptions.
//
// ring holds the most recent events with contiguous ids ring[0].id … last, so that a
// subscription finishing its catch-up close to the head bridges the rest from memory
// instead of racing the publisher with more table reads. last is the highest id the
// stream has accounted for (every id ≤ last is in the ring, was delivered to the live
// set, or is older than the ring); -1 = not known yet.
type stream struct {
	name     string
	subs     []*subscription
	ring     []*event
	ringSize int
	last     int64
	notified int64    // highest durable id seen in a notification
	pending  []*event // durable events that arrived beyond a gap, waiting for a fetch
	fetching bool     // a stream-level table read is in flight
	out      []*event // events queued for the live set, written by the sweep (fanout_sweep.go)
	dirty    bool
	sw       sweepState // its part in the sweep in progress
	ephemera int        // ephemeral events in out

	// Ids reused after a crash (rewind): maxTimeUS is the latest publish time (PostgreSQL's
	// clock) of the events accounted for — a table event with an id ≤ last but a later time is
	// another event under a reused id; check asks the next read to verify that last is still
	// the event delivered (the LISTEN session came back); rewindHi is the top of the range a
	// rewinding read searches (0 = not rewinding); backFrom/backTo is the last rewind (a
	// reconnecting client's cursor in (backTo, backFrom] is from the lost history).
	// lastTimeUS is the publish time of the event at last when the stream delivered it, 0
	// when last was set without reading that event (a subscriber's cursor, the table's head,
	// pruned or lost ids): only a known one can be compared with what the table now holds
	// under that id — the newest event is the one published last, so an unread one would
	// look like another event under a reused id.
	maxTimeUS        int64
	lastTimeUS       int64
	readID           int64 // the newest event a subscription's catch-up read (sawPublished)
	readTimeUS       int64 // and its publish time
	check            bool
	rewindHi         int64
	backFrom, backTo int64
	// heldReads are catching-up subscriptions whose next table read waits for the check
	// (unchecked): until it, the table may hold another history than what was delivered.
	heldReads []*subscription
	// ghost: the stream is here without subscribers only to check what it delivered before
	// its last one left (rewinds.go, ghosts); dropped once checked.
	ghost bool
}

// channelSubs is a raw channel's SSE side (channel.sse): its subscriptions, in a compact
// slice for the fan-out, and the notifications of this loop pass, each encoded once.
type channelSubs struct {
	subs  []*subscription
	out   []*event
	dirty bool
}

// Limits of the stream state (docs/architecture.md, invariant 3). The backpressure policy — how
// much a connection may have queued — is the outbound budget's (budget.go).
const (
	ringMaxEvents     = 4096    // recent events a stream keeps for joining subscriptions: 41 s at 100/s (catchup.go, onReplay)
	ringMaxBytes      = 1 << 20 // and their encoded bytes (a larger event is not kept)
	pendingMaxEvents  = 4096    // live events held beyond a gap while the table is read
	replayBatchEvents = 200     // events per catch-up read for one subscription
	fetchBatchEvents  = 500     // events per stream-level read
	rewindBatchEvents = 500     // events per read looking for where a stream's history was rewound
)

// fanout is the loop's part for the live side of streams and channels.
type fanout struct {
	*loopEnv
	subs  *subscriptions
	chans *channelTable
	out   *outbound
	tr    transport
	lsn   *listenState // tells the host's other processes of a rewind (rewinds.go)

	streams       map[string]*stream
	rewinds       rewindBook // rewinds found here or told, per stream (rewinds.go)
	ghosts        ghostBook  // what streams nobody follows any more delivered (rewinds.go)
	settled       bool       // the LISTEN session came back: release the held reads once settled (retryFetches)
	seq           uint64     // the last event.seq given
	dirtyStreams  []*stream
	dirtyChannels []*channel
	retryFetch    []*stream // stream-level reads that failed, retried on the sweep
	received      time.Time // when the notifications being routed were received (receiving); zero = unknown
	// between runs every flushSliceSubs subscriptions written during a flush: the publish
	// answers committed meanwhile are written there (publishing.answerQueued), so that no
	// publisher waits for a round to end. It must not change what the flush iterates.
	between   func()
	sliceSubs int         // flushSliceSubs; tests raise it to measure rounds without slices
	keep      streamKeep  // a successor's events of streams nobody here follows yet (fanout_keep.go)
	fetches   int         // stream-level table reads started (read by the tests)
	sweep     streamSweep // the sweep writing the dirty streams (fanout_sweep.go)
}

// flushSliceSubs is how many subscriptions a flush writes between two looks for publish
// answers to write (at ≈ 5 µs a write, well under a millisecond).
const flushSliceSubs = 64

// receiving says when the notifications routed next (onPayload) were received.
func (f *fanout) receiving(at time.Time) { f.received = at }

// head is the highest id the stream has accounted for; -1 when not known yet.
func (st *stream) head() int64 { return st.last }

// inRing reports whether a subscription at cursor c can join from the ring.
func (st *stream) inRing(c int64) bool { return len(st.ring) > 0 && c >= st.ring[0].id-1 }

// bridge is what a subscription that has read the table up to c needs to join the live
// set: the ring's events (those after c are its), or none when the stream starts at c (its
// head was not known yet); ok is false when the ring does not reach back to c (read on).
func (st *stream) bridge(c int64) (ring []*event, ok bool) {
	switch {
	case st.last < 0:
		st.last, st.lastTimeUS = c, 0
		if st.readID == c {
			st.lastTimeUS = st.readTimeUS // the subscription's catch-up read the event at c
		}
		if c > st.notified {
			st.notified = c
		}
		return nil, true
	case st.inRing(c), len(st.ring) == 0 && c >= st.last:
		return st.ring, true
	}
	return nil, false
}

// count is the number of streams with subscriptions here.
func (f *fanout) count() int { return len(f.streams) }

// join registers a subscription on its stream (made on first use) and returns the stream.
func (f *fanout) join(name string, sub *subscription) *stream {
	st := f.streams[name]
	if st == nil {
		st = &stream{name: name, last: -1}
		if m, ok := f.rewinds.known(name, f.nowMS); ok {
			st.knowBack(m) // a cursor from the history it lost is told (lostCursor)
		}
		f.streams[name] = st
		f.haunt(st)
		st.seed(f.keep.take(name)) // a successor: from what it kept since before the handoff
	}
	st.ghost = false
	st.subs = appendIndexed(st.subs, sub, subIndex)
	return st
}

// leave removes a subscription from its stream; a stream nobody follows is dropped. A sweep
// paused on the stream keeps its position: every subscription before it was written.
func (f *fanout) leave(st *stream, sub *subscription) {
	st.subs, st.sw.pos = swapRemoveKeeping(st.subs, sub, subIndex, st.pausedAt())
	if len(st.heldReads) > 0 {
		st.heldReads = slices.DeleteFunc(st.heldReads, func(s *subscription) bool { return s == sub })
	}
	f.maybeDropStream(st)
}

func (f *fanout) maybeDropStream(st *stream) {
	if len(st.subs) == 0 && !st.fetching && f.streams[st.name] == st && !st.ghost {
		delete(f.streams, st.name)
		f.keepGhost(st)
	}
}

// onPayload handles one notification on the pgsse channel.
func (f *fanout) onPayload(p *store.Payload) {
	if p.Kind == store.KindDurable || p.Kind == store.KindWake {
		f.stages.notified(p.Stream, p.ID, f.received) // subscribed here or not
	}
	st := f.streams[string(p.Stream)] // no allocation: map lookup by converted key
	if st == nil {
		f.keepUnfollowed(p) // nobody subscribed here: a successor keeps it for those to come
		return
	}
	switch p.Kind {
	case store.KindEphemeral:
		ev := &event{enc: f.tr.event(nil, 0, p.Event, p.Data), audience: payloadTags(p), timeUS: p.TimeUS}
		f.queue(st, ev)
	case store.KindDurable, store.KindWake:
		id := p.ID
		if id > st.notified {
			st.notified = id
		}
		if st.last < 0 {
			st.last, st.lastTimeUS = id-1, 0 // first sight of the stream: the ring starts here
		}
		if id <= st.last {
			if p.TimeUS > st.maxTimeUS && st.maxTimeUS > 0 && st.rewindHi == 0 {
				// Published after everything accounted for, yet under an id already used: a
				// duplicate of an event read from the table, or ids reused after a crash —
				// the next read checks st.last (rewind).
				st.check = true
				f.startFetch(st)
			}
			return // already accounted for (replayed or duplicate)
		}
		if p.Kind == store.KindWake {
			f.startFetch(st) // data is only in the table
			return
		}
		ev := &event{id: id, enc: f.tr.event(nil, id, p.Event, p.Data), audience: payloadTags(p), timeUS: p.TimeUS}
		if !f.received.IsZero() {
			ev.received = f.received.UnixNano()
		}
		if id == st.last+1 && !st.fetching && !st.unchecked() {
			f.appendLive(st, ev)
			return
		}
		if len(st.pending) < pendingMaxEvents {
			st.pending = append(st.pending, ev)
		}
		f.startFetch(st)
	}
}

// earlyEvent and committed deliver a durable event that this process's Publisher has just
// committed (an HTTP publish: publishing.answerCommitted) to the stream's subscribers here at
// once, without waiting for its notification's round trip through PostgreSQL — when that
// keeps the stream's order: the stream has subscriptions, its head is known, and the event is
// the very next id the loop expects with no table read or check under way. Otherwise
// (concurrent publishers whose commits were answered out of id order, a notification that
// came first, a catch-up in flight) the notification delivers it as before. Either way the
// notification is still routed (onPayload), and dropped as accounted for (id ≤ st.last):
// timeUS, PostgreSQL's clock after the transaction's events were stored
// (store.PublishResult.TimeUS), is at or after the notification's own time, so it is not taken
// for another event under a reused id. Other processes (--procs siblings, other hosts) get the
// event from its notification alone.
//
// earlyEvent encodes it (nil when it cannot be delivered early: nobody follows the stream
// here, it is large, its time is unknown); it only reads the fan-out's state, so it may run
// between slices of a round (between). at is when its commit was answered (stageWritten).
func (f *fanout) earlyEvent(name string, id int64, evName string, data []byte, audience []string, timeUS int64, at time.Time) *event {
	if f.streams[name] == nil || timeUS <= 0 || len(data) >= largeEventBytes {
		return nil
	}
	var tags []string
	if len(audience) > 0 {
		tags = append(tags, audience...) // the request's slice is the connection's, reused
	}
	return &event{id: id, enc: f.tr.event(nil, id, []byte(evName), data), audience: tags, timeUS: timeUS, received: at.UnixNano()}
}

// committed queues an event from earlyEvent for the live set when it is the next id its
// stream expects (on the loop, not during a flush).
func (f *fanout) committed(name string, ev *event) {
	st := f.streams[name]
	if st == nil || st.last < 0 || ev.id != st.last+1 || st.fetching || st.check || st.rewindHi > 0 {
		return
	}
	st.notified = max(st.notified, ev.id)
	f.metrics.earlyDeliveries.Inc()
	f.appendLive(st, ev)
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
func (f *fanout) appendLive(st *stream, ev *event) {
	st.last, st.lastTimeUS = ev.id, ev.timeUS
	st.maxTimeUS = max(st.maxTimeUS, ev.timeUS)
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
	f.queue(st, ev)
}

// queue adds ev to what the stream's live side gets in this loop pass, numbered in arrival
// order across streams (a connection following several streams gets them in that order:
// subscriptions.deliverMulti).
func (f *fanout) queue(st *stream, ev *event) {
	f.seq++
	ev.seq = f.seq
	st.out = append(st.out, ev)
	st.queued(ev)
	f.markDirty(st)
}

func (f *fanout) markDirty(st *stream) {
	if !st.dirty {
		st.dirty = true
		f.dirtyStreams = append(f.dirtyStreams, st)
	}
}

// flush writes what the loop entries queued: a slice of the sweep over the dirty streams
// (fanout_sweep.go; drive: the task drain continues it), one write per subscription per
// stream, one per connection with several subscriptions; then the channels' notifications, at
// once. It reports whether a sweep is left to do (Server.leave). budget is a slice's length
// (sweepSlice while publishers are connected: their requests are read between slices; 0
// otherwise: nothing waits to be read that a pause would serve, and each pause costs a
// wake-up — scenario 3's 15,000-subscriber round took 1.6× as long sliced).
func (f *fanout) flush(budget time.Duration, drive bool) bool {
	left := f.flushStreams(budget, drive)
	f.flushChannels(nil)
	return left
}

// flushStreams runs a slice of the sweep (streamSweep.sweepOn); budget 0 runs it to its end.
func (f *fanout) flushStreams(budget time.Duration, drive bool) bool {
	return f.sweep.sweepOn(f, budget, drive)
}

// What a stream-level read is for.
type fetchMode uint8

const (
	fetchOn     fetchMode = iota // the events after st.last (and st.last itself, to check it)
	fetchRewind                  // where the table's history parts from what was delivered
)

// startFetch reads the stream from the table after st.last, for the whole live set — from
// st.last itself when its publish time is known, so that every read checks that the table
// still holds what was delivered (wentBack); while rewinding, the range below rewindHi. While
// check is set (the LISTEN session came back, or a notification reused a delivered id),
// live events wait for the read.
func (f *fanout) startFetch(st *stream) {
	if st.fetching || f.replayer == nil {
		return
	}
	st.fetching = true
	after, mode, limit := st.last, fetchOn, fetchBatchEvents
	switch {
	case st.rewindHi > 0:
		after, mode, limit = max(0, st.rewindHi-rewindBatchEvents), fetchRewind, rewindBatchEvents
	case st.last > 0 && st.lastTimeUS > 0:
		after = st.last - 1
	}
	checking := st.check // a read that began before check was set does not answer it
	f.fetches++
	ok := f.replayer.Read(store.ReadRequest{Stream: st.name, After: after, AllAudiences: true, Limit: limit, Encode: f.tr.replayEncoder(), OwnBuffers: true},
		func(res store.ReadResult) { f.tasks.push(func() { f.onFetch(st, after, mode, checking, res) }) })
	if !ok {
		st.fetching = false
		f.log.Warn("replay queue full; stream catch-up postponed", "stream", st.name)
	}
}

func (f *fanout) onFetch(st *stream, after int64, mode fetchMode, checking bool, res store.ReadResult) {
	st.fetching = false
	if f.streams[st.name] != st || (len(st.subs) == 0 && !st.ghost) {
		f.maybeDropStream(st) // (a ghost is kept of it while it is still unchecked)
		st.rewindHi = 0
		clear(st.heldReads)
		st.heldReads = st.heldReads[:0]
		return
	}
	if res.Err != nil {
		f.log.Warn("stream catch-up read failed; retrying on the next tick", "stream", st.name, "err", res.Err)
		f.retryFetch = append(f.retryFetch, st)
		return
	}
	if mode == fetchRewind {
		f.onRewindRead(st, after, res)
		return
	}
	if checking {
		st.check = false
	}
	if st.wentBack(res) {
		// The stream's head went back below what was delivered, or the event at st.last is
		// another one: acknowledged events were lost (a crash without synchronous_commit, a
		// failover to an asynchronous replica) and their ids given to new events. Find where.
		st.rewindHi = st.last
		f.startFetch(st)
		return
	}
	if checking {
		if to, lost := st.readLost(res); lost {
			f.readBack(st, to)
		}
	}
	if st.ghost {
		f.laid(st) // checked: what it delivered is the table's
		return
	}
	if res.Oldest > st.last+1 && st.last >= 0 {
		// Events were pruned while we were away: announce the gap to the live set.
		resume := res.Oldest - 1
		for _, sub := range st.subs {
			f.subs.liveGap(sub, resume)
		}
		st.last, st.lastTimeUS = resume, 0
	}
	for i := range res.Events {
		e := &res.Events[i]
		if e.ID <= st.last {
			continue
		}
		if e.ID != st.last+1 {
			st.last, st.lastTimeUS = e.ID-1, 0 // ids missing inside a snapshot were pruned
		}
		ev := f.out.tableEvent(st.name, e)
		if ev == nil {
			// Too many large events held: read from here again later.
			f.retryFetch = append(f.retryFetch, st)
			return
		}
		f.appendLive(st, ev)
	}
	if res.Done && res.Head > st.last {
		st.last, st.lastTimeUS = res.Head, 0
	}
	// Live events that were waiting beyond the gap.
	keep := st.pending[:0]
	for _, ev := range st.pending {
		switch {
		case ev.id <= st.last:
		case ev.id == st.last+1:
			f.appendLive(st, ev)
		default:
			keep = append(keep, ev)
		}
	}
	for i := len(keep); i < len(st.pending); i++ {
		st.pending[i] = nil
	}
	st.pending = keep
	if !res.Done || st.notified > st.last || len(st.pending) > 0 || st.check {
		f.startFetch(st)
	}
	f.releaseReads(st)
}

// wentBack reports whether a read shows the stream's history rewound below st.last: its head
// is lower, or the event with id st.last (a read starts with it when its time is known) was published
// after every event the stream has accounted for — another event under a reused id.
func (st *stream) wentBack(res store.ReadResult) bool {
	switch {
	case st.last <= 0:
		return false
	case res.Head < st.last:
		return true
	}
	return len(res.Events) > 0 && res.Events[0].ID == st.last && st.lastTimeUS > 0 && res.Events[0].TimeUS > st.maxTimeUS
}

// readLost reports whether a check read shows that events a subscription's own catch-up
// delivered beyond what the live set accounted for (readID > last: their notifications had
// not come when the LISTEN session was lost) are gone: the table ends below readID, or holds
// another event under it (another publish time). to is where the histories part: before the
// first event after last published after everything accounted for, else the table's head.
func (st *stream) readLost(res store.ReadResult) (to int64, lost bool) {
	if st.readID <= st.last || st.readTimeUS == 0 || st.last < 0 {
		return 0, false
	}
	if res.Head < st.readID {
		lost = true
	} else {
		for i := range res.Events {
			if e := &res.Events[i]; e.ID == st.readID {
				lost = e.TimeUS != st.readTimeUS
				break
			}
		}
	}
	if !lost {
		return 0, false
	}
	to = max(st.last, min(res.Head, st.readID))
	for i := range res.Events {
		if e := &res.Events[i]; e.ID > st.last && e.ID <= st.readID && e.TimeUS > st.maxTimeUS {
			to = e.ID - 1
			break
		}
	}
	return to, true
}

// readBack tells the subscriptions past to — their catch-up read events a crash then lost,
// beyond what the live set had (readLost) — with a pgsse:gap back to to (subscriptions.wentBack),
// and remembers the range for reconnecting clients (lostCursor). The live set, at st.last ≤
// to, reads on as before.
func (f *fanout) readBack(st *stream, to int64) {
	f.tellBack(st, st.readID, to)
	st.readID, st.readTimeUS = to, 0
}

// tellBack logs that the stream went back from delivered to to, remembers the range for
// reconnecting clients (lostCursor) and tells every subscription past to
// (subscriptions.wentBack: a pgsse:gap resuming at to).
func (f *fanout) tellBack(st *stream, delivered, to int64) {
	f.log.Warn("stream went back below what was delivered: acknowledged events were lost (synchronous_commit off, or a failover to an asynchronous replica) and their ids reused; subscribers are sent a pgsse:gap",
		"stream", st.name, "delivered", delivered, "resume", to)
	st.backFrom, st.backTo = max(delivered, st.backFrom), to
	// The host's other processes are told (rewinds.go): a client of this stream may
	// reconnect to one of them with a lost id.
	f.knowRewind(st.name, st.backTo, st.backFrom)
	f.lsn.tellRewind(st.name, st.backTo, st.backFrom)
	for _, sub := range st.subs {
		f.subs.wentBack(sub, to)
	}
}

// onRewindRead looks for where the table's history parts from what was delivered, in the
// ids after..rewindHi: the first event published after everything the stream accounted for
// (its ids were reused), or the head when the table simply ends lower. When that is the
// first event read, the search goes on further back.
func (f *fanout) onRewindRead(st *stream, after int64, res store.ReadResult) {
	hi := min(st.rewindHi, res.Head)
	to := hi
	for i := range res.Events {
		e := &res.Events[i]
		if e.ID > hi {
			break
		}
		if e.TimeUS > st.maxTimeUS {
			to = e.ID - 1
			break
		}
		if i == len(res.Events)-1 && !res.Done {
			to = e.ID // the batch ended before hi: what lies beyond was not compared
		}
	}
	switch {
	case hi > 0 && hi <= after:
		st.rewindHi = hi // the table ends below what was read: look below its head
		f.startFetch(st)
		return
	case to <= after && after > 0 && after >= res.Oldest:
		st.rewindHi = after // even the first event read is another one: look further back
		f.startFetch(st)
		return
	}
	f.rewind(st, max(to, 0))
}

// rewind makes the stream continue from id to, lower than what it delivered: every
// subscription past it is told (subscriptions.wentBack: a pgsse:gap resuming at to), the
// ring forgets the events after it, and the table is read on from to — the events that
// reused the lost ids are delivered under them.
func (f *fanout) rewind(st *stream, to int64) {
	f.tellBack(st, st.last, to)
	if st.ghost {
		f.laid(st) // told: nobody here follows it
		return
	}
	keep := len(st.ring)
	for keep > 0 && st.ring[keep-1].id > to {
		keep--
		st.ringSize -= len(st.ring[keep].enc)
	}
	clear(st.ring[keep:])
	st.ring = st.ring[:keep]
	st.last, st.lastTimeUS, st.notified, st.rewindHi = to, 0, to, 0
	if st.readID > to {
		st.readID, st.readTimeUS = to, 0 // what a catch-up read beyond it is lost too (told above)
	}
	f.startFetch(st)
	f.releaseReads(st)
}

// unchecked reports whether what the stream delivered is yet to be compared with the table:
// its LISTEN session was lost (down) and its check read after the session came back has not
// answered, or a rewind is being looked for. Meanwhile a crash may have given the delivered
// ids to other events: nothing is delivered early (committed), live events wait (onPayload),
// and subscriptions' catch-up reads wait (holdRead) — the new history read from the table
// would be mixed with the lost one the subscription holds, its publish times would hide the
// rewind (sawPublished), and a cursor from the lost history cannot be told apart yet
// (lostCursor).
func (st *stream) unchecked() bool { return st.check || st.rewindHi > 0 }

// holdRead holds sub's next catch-up read until the stream is checked — and, after a LISTEN
// loss, until the host's other processes have had the time to tell of a rewind they found
// (settling: listenState.settling) — and reports whether it did.
func (st *stream) holdRead(sub *subscription, settling bool) bool {
	if !st.unchecked() && !settling {
		return false
	}
	if !slices.Contains(st.heldReads, sub) {
		st.heldReads = append(st.heldReads, sub)
	}
	return true
}

// releaseReads starts the catch-up reads held while the stream was unchecked, once it is
// checked (after a rewind, the lost cursors are known: lostCursor).
func (f *fanout) releaseReads(st *stream) {
	if st.unchecked() || len(st.heldReads) == 0 || f.lsn.settling() {
		return // (still settling: retryFetches releases them)
	}
	held := st.heldReads
	st.heldReads = nil
	for _, sub := range held { // (one that left was taken off the list: leave)
		f.subs.replay(sub)
	}
}

// down marks every stream whose head is known as unchecked when the LISTEN session is lost
// (listenState.onDown): the session's loss may be a crash's, which the check read after the
// session is back (resync) finds. Until then an HTTP publish reusing the id after the last
// delivered one must not be delivered early — its publish time would make the check find
// nothing, and the new events under the other lost ids would be skipped silently.
func (f *fanout) down() {
	f.keep.drop()
	for _, st := range f.streams {
		if st.last >= 0 {
			st.check = true
		}
	}
	f.ghosts.suspect(f.nowMS)
}

// sawPublished notes the publish time of an event delivered from the stream by a
// subscription's own catch-up (catchup.go): what a rewind is told apart by (maxTimeUS), and,
// for the newest such event, what the stream knows of its last event if it starts there
// (bridge).
func (st *stream) sawPublished(id, timeUS int64) {
	st.maxTimeUS = max(st.maxTimeUS, timeUS)
	if id > st.readID {
		st.readID, st.readTimeUS = id, timeUS
	}
}

// lostCursor reports whether cursor c is from history the stream lost (the last rewind), and
// where delivery then resumes.
func (st *stream) lostCursor(c int64) (resume int64, lost bool) {
	return st.backTo, st.backFrom > 0 && c > st.backTo && c <= st.backFrom
}

// resync catches every active stream up from the table after the LISTEN session came
// back: events committed during the outage were never notified, and the table may now hold
// less than was delivered (rewind), which the first read checks.
func (f *fanout) resync() {
	for _, st := range f.streams {
		if st.last >= 0 {
			st.check = true
			f.startFetch(st)
		}
	}
	f.raiseGhosts()
	f.settled = true // the reads held meanwhile are released once settled (retryFetches)
}

// retryFetches restarts the stream-level reads that failed (from the tick).
func (f *fanout) retryFetches() {
	if f.settled && !f.lsn.settling() {
		// The time for the host's other processes to tell of a rewind is over: the reads
		// held for it go on (those of streams still unchecked wait for their check).
		f.settled = false
		for _, st := range f.streams {
			f.releaseReads(st)
		}
	}
	if len(f.retryFetch) == 0 {
		return
	}
	retry := f.retryFetch
	f.retryFetch = nil
	for _, st := range retry {
		if f.streams[st.name] == st {
			f.startFetch(st)
		}
	}
}

// --- raw channels -------------------------------------------------------------------------

// joinChannel registers a subscription on its raw channel, holding the channel (the first
// holder starts its LISTEN: channels.go), and returns the channel.
func (f *fanout) joinChannel(name string, sub *subscription) *channel {
	ch := f.chans.holdClient(name)
	ch.sse.subs = appendIndexed(ch.sse.subs, sub, subIndex)
	return ch
}

// leaveChannel removes a subscription from its channel and gives the hold back.
func (f *fanout) leaveChannel(ch *channel, sub *subscription) {
	ch.sse.subs = swapRemove(ch.sse.subs, sub, subIndex)
	f.chans.releaseClient(ch)
}

// channelNotify queues a raw notification for the channel's subscriptions, encoded once.
// payload is valid only during the call.
func (f *fanout) channelNotify(ch *channel, payload []byte) {
	if len(ch.sse.subs) == 0 {
		return
	}
	ch.sse.out = append(ch.sse.out, &event{enc: f.tr.event(nil, 0, nil, payload)})
	if !ch.sse.dirty {
		ch.sse.dirty = true
		f.dirtyChannels = append(f.dirtyChannels, ch)
	}
}

// pendingNotes is how many of the channel's notifications this loop pass has queued and not
// yet written (flushChannels): a subscription handed over now has not had them.
func (f *fanout) pendingNotes(ch *channel) int { return len(ch.sse.out) }

// resumeChannel writes to a subscription a predecessor handed over, now live, the
// notifications it missed between the two processes (channelTable.resumeAt).
func (f *fanout) resumeChannel(sub *subscription, notes []heldNote) {
	if len(notes) == 0 {
		return
	}
	evs := make([]*event, 0, len(notes))
	for _, n := range notes {
		evs = append(evs, &event{enc: f.tr.event(nil, 0, nil, n.payload)})
	}
	f.metrics.deliveries.Add(float64(f.subs.deliverChannel(sub, evs)))
}

// channelLive: the channel's LISTEN is complete on the current session; its waiting
// subscriptions start.
func (f *fanout) channelLive(ch *channel) {
	for _, sub := range ch.sse.subs {
		f.subs.channelStarted(sub)
	}
}

// channelFailed: the channel's LISTEN failed; its waiting subscriptions' connections are
// shed for why.
func (f *fanout) channelFailed(ch *channel, why shedReason) {
	for _, sub := range append([]*subscription(nil), ch.sse.subs...) {
		f.subs.channelFailed(sub, why)
	}
}

// flushChannels writes the channels' queued notifications (pendingNotes): at the pass's end
// every dirty channel's (only nil), or now one channel's to the subscriptions live on it —
// before a handed-over subscription starts there at its handoff position mid-pass
// (channelTable.resumeAt, resumeParked): it must not get them at the pass's end, they came
// before its position or it gets them from the successor's notes.
func (f *fanout) flushChannels(only *channel) {
	dirty := f.dirtyChannels
	if only != nil {
		dirty = []*channel{only} // it stays dirty: the pass's end finds its queue empty
	}
	for _, ch := range dirty {
		if only == nil {
			ch.sse.dirty = false
		}
		if len(ch.sse.out) == 0 {
			continue
		}
		n := 0
		for i, sub := range ch.sse.subs {
			n += f.subs.deliverChannel(sub, ch.sse.out)
			if only == nil && (i+1)%f.sliceSubs == 0 {
				f.between()
			}
		}
		f.metrics.deliveries.Add(float64(n))
		clear(ch.sse.out)
		ch.sse.out = ch.sse.out[:0]
	}
	if only == nil {
		f.dirtyChannels = f.dirtyChannels[:0]
	}
}
