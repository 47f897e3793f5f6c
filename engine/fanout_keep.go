package engine

import "github.com/pgsse/pgsse/store"

// What a successor keeps of the streams nobody here follows yet (issue 22; docs/architecture.md,
// Handoff positions). A stream's ring is filled by its live side, which exists only once a
// subscription here follows the stream: in a successor the first subscription of each stream
// is a handed-over one, so the durable notifications that reached this process's session
// before it — since it LISTENed the stream channel, well before it said ready — were dropped,
// and every moved subscriber whose cursor was behind the stream's head here was caught up
// from the table (bench/RESULTS.md, scenario 17: 5,600 catch-up reads, pause p99 3.3 s).
// While a handoff is being received, a successor keeps those notifications' events per stream
// instead — contiguous ids, within a ring's bounds (ringMaxEvents, ringMaxBytes) and
// handoffKeepBytes for all streams, for handoffHoldMS at most — and a stream's live side starts
// from them (join: its ring and head), so that a moved subscription whose cursor they cover
// joins from memory (tryJoin), exactly once and in order; one they do not cover reads the
// table as before.

// keptStream is one stream's kept events: ids ring[0].id … last, contiguous.
type keptStream struct {
	ring []*event
	size int
	last int64
}

// streamKeep is the fan-out's side of what a successor keeps for the streams it follows
// nobody of yet.
type streamKeep struct {
	streams map[string]*keptStream
	bytes   int   // encoded bytes kept, all streams
	untilMS int64 // loop clock; 0: handoffHoldMS from the first notification kept on
	done    bool  // the handoff was received (releaseHeld), given up, or timed out
}

// active reports whether durable events of unfollowed streams are kept now: in a successor
// (inherited: Config.Inherited), until the handoff has been received and at most
// handoffHoldMS from nowMS's first use (the loop clock is set from the first tick on).
func (k *streamKeep) active(inherited bool, nowMS int64) bool {
	if !inherited || k.done {
		return false
	}
	if k.untilMS == 0 && nowMS > 0 {
		k.untilMS = nowMS + handoffHoldMS
	}
	if k.untilMS > 0 && nowMS >= k.untilMS {
		k.end()
		return false
	}
	return true
}

// keepUntil (channelTable.holdFor) keeps on until untilMS: the predecessor's handoff began.
func (f *fanout) keepUntil(untilMS int64) {
	if !f.keep.done {
		f.keep.untilMS = max(f.keep.untilMS, untilMS)
	}
}

// endKeep lets go of what is kept and keeps no more (every connection is adopted, the
// handoff was given up or timed out, or this process hands over in turn).
func (f *fanout) endKeep() { f.keep.end() }

// end lets go of what is kept and keeps no more (endKeep).
func (k *streamKeep) end() {
	k.drop()
	k.done = true
}

// drop lets go of what is kept (and keeps on): after the LISTEN session was lost (fanout.down),
// what was kept may not be contiguous with what comes, or may be history a crash lost.
func (k *streamKeep) drop() {
	for _, ks := range k.streams {
		clear(ks.ring)
	}
	k.streams, k.bytes = nil, 0
}

// keepUnfollowed keeps a durable notification of a stream nobody here follows (onPayload).
func (f *fanout) keepUnfollowed(p *store.Payload) {
	if (p.Kind != store.KindDurable && p.Kind != store.KindWake) || !f.keep.active(f.cfg.Inherited != nil, f.nowMS) {
		return
	}
	k := f.keep.streams[string(p.Stream)]
	if k == nil {
		if f.keep.streams == nil {
			f.keep.streams = make(map[string]*keptStream)
		}
		k = &keptStream{last: -1}
		f.keep.streams[string(p.Stream)] = k
	}
	id := p.ID
	if id <= k.last {
		return // committed out of id order, or a duplicate: not kept (ids before the ring's are the table's)
	}
	if id != k.last+1 || p.Kind == store.KindWake || len(p.Data) >= largeEventBytes {
		// Not contiguous, or its data is only in the table: the kept events start after it.
		f.keep.restart(k, id)
		if p.Kind == store.KindWake || len(p.Data) >= largeEventBytes {
			return
		}
	}
	ev := &event{id: id, enc: f.tr.event(nil, id, p.Event, p.Data), audience: payloadTags(p), timeUS: p.TimeUS}
	need := len(ev.enc)
	for len(k.ring) > 0 && (len(k.ring) >= ringMaxEvents || k.size+need > ringMaxBytes || f.keep.bytes+need > handoffKeepBytes) {
		k.size -= len(k.ring[0].enc)
		f.keep.bytes -= len(k.ring[0].enc)
		k.ring[0] = nil
		k.ring = k.ring[1:]
	}
	if need > ringMaxBytes || f.keep.bytes+need > handoffKeepBytes {
		f.keep.restart(k, id)
		return
	}
	f.seq++
	ev.seq = f.seq
	k.ring = append(k.ring, ev)
	k.size += need
	f.keep.bytes += need
	k.last = id
}

// restart empties ks: what is kept next starts after id.
func (k *streamKeep) restart(ks *keptStream, id int64) {
	clear(ks.ring)
	k.bytes -= ks.size
	ks.ring, ks.size, ks.last = nil, 0, id
}

// take hands over and forgets the events kept for stream name (nil if none), when its live
// side is made for its first subscription (fanout.join, stream.seed).
func (k *streamKeep) take(name string) *keptStream {
	ks := k.streams[name]
	if ks != nil {
		delete(k.streams, name)
		k.bytes -= ks.size
	}
	return ks
}

// seed starts a stream's live side (fanout.join: made for its first subscription) from the
// events kept for it, if any: its ring and its head, as if it had been followed since. A
// stream that took over a ghost to be checked for a rewind (haunt) is not seeded: what the
// ghost delivered is what the check read compares, and the table is the truth after a loss.
func (st *stream) seed(k *keptStream) {
	if k == nil || len(k.ring) == 0 || st.check {
		return // nothing to bridge from: the stream starts as it does without (bridge, onPayload)
	}
	st.ring = append(st.ring[:0], k.ring...)
	st.ringSize = k.size
	st.last, st.notified = k.last, k.last
	for _, ev := range k.ring {
		st.maxTimeUS = max(st.maxTimeUS, ev.timeUS)
	}
	st.lastTimeUS = k.ring[len(k.ring)-1].timeUS
}
