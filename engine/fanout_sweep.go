package engine

import "time"

// The fan-out's sweep (docs/architecture.md, The fan-out sweep): what the loop entries queue on the
// streams is written by a sweep over the dirty streams' subscriptions that stops after a
// slice (sweepSlice, looked at every flushSliceSubs subscriptions) and resumes where it
// stopped, so that a round of 10,000 writes no longer holds the loop: between slices gnet
// reads the sockets that became ready — publishers' next requests among them — and the tasks
// queued meanwhile run. Events queued while a sweep is in progress join it: they are appended
// to their stream's out, so the subscriptions not reached yet take them in the same write as
// the rest, and only the events a stream held when the sweep reached it are trimmed at its
// end; the later ones keep it dirty for the next sweep, whose writes carry every event that
// came meanwhile — with closed-loop publishers, many per write instead of one.
//
// What keeps it exact: a subscription's durable events are filtered by its cursor (deliver),
// so one visited before an event arrived takes it in the next sweep and one visited after
// does not take it twice. An ephemeral event has no id to filter by: one that arrives while
// the sweep is visiting its stream is not handed out by that visit — nor is anything queued
// after it, to keep the stream's order — so the ephemeral events a sweep hands out are those
// its stream held when the sweep reached it, to every subscription once, and trimmed at the
// end (sweepable). A queue of durable events alone, carried from sweep to sweep, costs a
// subscription only its share: deliver finds its cursor by a binary search. A subscription
// removed from a stream whose sweep is paused leaves by swapRemoveKeeping, which keeps every
// subscription before the sweep's position one that was visited — the last one, moved into
// its place, would otherwise be skipped. A subscription that joins mid-sweep is appended,
// after the position.
// The sweep runs on the loop, in the loop entries' leave, so every connection keeps its one
// owner; the writes of a slice are a loop entry's, and connections closed meanwhile are
// removed on its way out (Server.leave), never during a slice.
//
// Who runs a slice (Server.leave): any loop entry starts a sweep; a paused one is continued
// by the task drain (Server.admitRound: the drain yields to gnet after it), and by other
// entries only once its last slice ended hurryAfter ago — so that a storm of callbacks (issue
// 21's closes, 64 publishers' requests in one epoll batch) does not run a slice each, yet
// the sweep is never held behind them for long.

// sweepSlice is how long a slice of a sweep writes before it lets the loop go.
const sweepSlice = 500 * time.Microsecond

// streamSweep is the sweep in progress over fanout.dirtyStreams.
type streamSweep struct {
	active  bool
	next    int       // the dirty stream being written
	endedAt time.Time // when the last slice ended
	sweeps  int       // sweeps begun (read by the tests)
	slices  int       // slices run (read by the tests)
}

// sweepState is a stream's part in the sweep in progress.
type sweepState struct {
	visiting bool // the sweep has reached the stream
	pos      int  // its subscriptions before pos were written (while visiting)
	had      int  // the events out held when the sweep reached it: trimmed at the end
	frozen   bool // an ephemeral event arrived during the visit: out[limit:] waits for the next sweep
	limit    int
	at       time.Time // when the sweep reached it (stageWritten)
}

// pausedAt is where a sweep paused on the stream's subscriptions (0 when none is).
func (st *stream) pausedAt() int {
	if !st.sw.visiting {
		return 0
	}
	return st.sw.pos
}

// queued notes an event appended to out: an ephemeral one that arrives while the sweep is
// visiting the stream ends what the visit hands out (sweepable).
func (st *stream) queued(ev *event) {
	if ev.id != 0 {
		return
	}
	st.ephemera++
	if st.sw.visiting && !st.sw.frozen {
		st.sw.frozen, st.sw.limit = true, len(st.out)-1
	}
}

// sweepable is what of out the sweep in progress hands out: all of it, or what came before
// an ephemeral event that arrived during the stream's visit.
func (st *stream) sweepable() []*event {
	if st.sw.frozen {
		return st.out[:st.sw.limit]
	}
	return st.out
}

// onlyDurable reports whether the stream's queue holds durable events alone.
func (st *stream) onlyDurable() bool { return st.ephemera == 0 }

// sweepOn runs one slice of the sweep, starting one if none is in progress; budget 0 runs
// it to its end. drive says the task drain is continuing it (otherwise a paused sweep is
// continued only once its last slice ended hurryAfter ago). It reports whether a sweep is
// left to do.
func (sw *streamSweep) sweepOn(f *fanout, budget time.Duration, drive bool) bool {
	if !sw.active {
		if len(f.dirtyStreams) == 0 {
			return false
		}
		sw.active, sw.next = true, 0
		sw.sweeps++
	} else if !drive && budget > 0 && time.Since(sw.endedAt) < hurryAfter {
		return true
	}
	sw.slices++
	start := time.Now()
	delivered, n := 0, 0
	for sw.next < len(f.dirtyStreams) { // (a stream made dirty meanwhile is appended: it joins)
		st := f.dirtyStreams[sw.next]
		if !st.sw.visiting {
			st.sw = sweepState{visiting: true, had: len(st.out), at: start}
		}
		for st.sw.pos < len(st.subs) {
			delivered += f.subs.deliver(st.subs[st.sw.pos], st.sweepable())
			st.sw.pos++
			if n++; n%f.sliceSubs == 0 {
				f.between()
				if budget > 0 && time.Since(start) >= budget {
					f.metrics.deliveries.Add(float64(delivered))
					sw.endedAt = time.Now()
					return true
				}
			}
		}
		st.sw.pos = 0 // written to every one (visiting stays set until the end)
		sw.next++
	}
	// Connections following several of these streams: one write each, now that every
	// stream's events are known.
	delivered += f.subs.flushMulti(f.sliceSubs, f.between)
	f.metrics.deliveries.Add(float64(delivered))
	sw.end(f)
	sw.endedAt = time.Now()
	return len(f.dirtyStreams) > 0
}

// end trims what every subscription of each stream was handed — the events a stream held
// when the sweep reached it — and keeps the streams with later events dirty for the next
// sweep.
func (sw *streamSweep) end(f *fanout) {
	at := time.Now()
	now := at.UnixMicro()
	keep := f.dirtyStreams[:0]
	for _, st := range f.dirtyStreams {
		had, reached := 0, st.sw.at
		if st.sw.visiting {
			had = st.sw.had
		}
		st.sw = sweepState{}
		items := st.out[:had]
		for _, ev := range items {
			if ev.id == 0 {
				st.ephemera--
			}
			if ev.timeUS > 0 {
				f.metrics.lag.Observe(float64(now-ev.timeUS) / 1e6)
			}
		}
		if len(st.subs) > 0 && had > 0 {
			f.stages.written(items, reached) // (the first writes of them)
		}
		rest := copy(st.out, st.out[had:])
		clear(st.out[rest:])
		st.out = st.out[:rest]
		if rest > 0 {
			keep = append(keep, st)
		} else {
			st.dirty = false
		}
	}
	clear(f.dirtyStreams[len(keep):])
	f.dirtyStreams = keep
	sw.active = false
}
