package engine

import (
	"context"
	"math"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"time"

	"github.com/pgsse/pgsse/store"
)

// The outbound memory budget (docs/operations.md, Memory): --max-outbound-memory bounds the
// bytes queued for all SSE connections together (outbound.total, kept exact by outbound.go;
// with it, what the catch-up reads in flight may bring, outbound.reading: "used" below).
// Nothing is refused while used is under a quarter of the budget: a durable subscriber takes
// live writes until it has durableHighBytes queued, an ephemeral or channel subscriber is
// closed over ephemeralLimitBytes. Between a quarter and half of the budget the limits shrink
// in proportion, down to floors derived from the connection's share of the budget (budget ÷
// connections), so that whatever the number of connections the queues settle below half the
// budget — the other half is for the garbage collector, which lets the heap grow to twice
// what is live before it collects:
//
//	durable high watermark   durableHighBytes … share ÷ 8
//	slice over it            durableSliceBytes, never more than the high watermark
//	durable low watermark    a quarter of the high one
//	ephemeral limit          ephemeralLimitBytes … share ÷ 2
//
// A durable subscriber over its high watermark stops taking live writes (lagging) and is
// caught up from the ring or the table once it has drained below the low one; of a write to
// it, durable events are queued only up to high + slice (its cursor is the last event queued;
// the rest comes from the ring or the table). An ephemeral or channel subscriber over its
// limit is closed with retry:.
//
// Memory the queues gave back is returned to the operating system once the pressure has
// passed, and so is the garbage a burst of accepts left once it is over (accept.go:
// acceptBurst) — debug.FreeOSMemory, at most every freeOSMemoryEvery — and unless the operator set
// GOMEMLIMIT, the Go runtime's soft memory limit follows the budget (Config.GoMemoryLimit):
// the runtime's own memory, plus the live heap that is not queued bytes, plus the budget (or
// half that live heap, if more) — so the garbage drained queues leave is collected before it
// adds more than the budget, instead of when the heap has doubled on top of full queues.
const (
	durableHighBytes    = 256 << 10 // a live durable subscriber queuing more is paused (lagging), without pressure
	durableSliceBytes   = 64 << 10  // what one write may add over the high watermark
	ephemeralLimitBytes = 4 << 20   // an ephemeral or channel subscriber queuing more is closed, without pressure (see below)
	minWatermarkBytes   = 1 << 10   // the high watermark never shrinks below this
	minEphemeralBytes   = 4 << 10   // nor the ephemeral limit below this
	replayMinBytes      = 16 << 10  // a catch-up read asks for at least this many bytes

	// ephemeralLimitBytes is 4 MiB, not the 1 MiB it was, because the kernel no longer holds
	// tcp_wmem's maximum (4 MiB) for a fast reader's socket besides it, only
	// Config.SSESendBuffer: a burst a reader takes a moment to read waits here instead —
	// counted, and held once however many subscribers wait for it.

	// docs/operations.md, Memory: the server never holds more than a bounded number of large
	// events at once. An event of largeEventBytes or more read from the table is shared by every
	// connection that reads it while any queue holds it, and at most maxLargeEvents distinct ones
	// are held: a read that would bring another one is repeated once one has left.
	largeEventBytes = 1 << 20
	maxLargeEvents  = 4

	freeOSMemoryEvery = 10 * time.Second // debug.FreeOSMemory at most this often
	memoryLimitEvery  = time.Second      // how often the soft memory limit is recomputed
)

// outLimits are the write limits of the moment (see the table above), in bytes.
type outLimits struct {
	high, slice, low, ephemeral int
}

// limits computes the write limits for the current total and connection count. Called once
// per connection per write pass (a few integer operations), never per delivery.
func (o *outbound) limits() outLimits {
	budget := o.cfg.MaxOutboundMemory
	quarter := budget / 4
	over := o.total + o.reading - quarter
	if over <= 0 {
		return outLimits{high: durableHighBytes, slice: durableSliceBytes, low: durableHighBytes / 4, ephemeral: ephemeralLimitBytes}
	}
	share := budget / max(1, o.conns.subscribers())
	floorHigh := min(max(share/8, minWatermarkBytes), durableHighBytes)
	floorEph := min(max(share/2, minEphemeralBytes), ephemeralLimitBytes)
	over = min(over, quarter)
	l := outLimits{
		high:      durableHighBytes - (durableHighBytes-floorHigh)*over/quarter,
		ephemeral: ephemeralLimitBytes - (ephemeralLimitBytes-floorEph)*over/quarter,
	}
	l.slice = min(durableSliceBytes, l.high)
	l.low = l.high / 4
	return l
}

// tableEvent is the event to write for e, read from stream's table rows: for a large one, the
// event already held for the same id (shared: no new memory), or a new one counted against
// maxLargeEvents — or nil when that many are held (the caller reads it again later).
func (o *outbound) tableEvent(stream string, e *store.Event) *event {
	if len(e.Data) < largeEventBytes {
		return &event{id: e.ID, enc: e.Data, audience: e.Audience, timeUS: e.TimeUS} // Data is the encoding (encodeEvent)
	}
	for _, ev := range o.large {
		if ev.id == e.ID && ev.stream == stream {
			return ev
		}
	}
	if len(o.large) >= maxLargeEvents {
		return nil
	}
	return &event{id: e.ID, enc: e.Data, audience: e.Audience, timeUS: e.TimeUS, stream: stream}
}

// largeFull reports whether maxLargeEvents large events are held: a read that would bring
// another waits (subscriptions.retryLarge).
func (o *outbound) largeFull() bool { return len(o.large) >= maxLargeEvents }

// replayBytes is how many bytes one catch-up read for a connection asks for: what the
// connection may queue now.
func (l outLimits) replayBytes() int { return max(l.high+l.slice, replayMinBytes) }

// observe updates the gauges and, once the pressure has passed, asks for the heap to be
// given back (from the tick).
func (o *outbound) observe() {
	l := o.limits()
	o.metrics.outboundBytes.Set(float64(o.total))
	o.metrics.outboundWatermark.Set(float64(l.high))
	o.totalSeen.Store(int64(o.total))
	switch used := o.total + o.reading; {
	case used > o.cfg.MaxOutboundMemory/4:
		o.pressed = true
	case o.pressed && used < o.cfg.MaxOutboundMemory/16:
		o.pressed = false
		select {
		case o.relieved <- struct{}{}:
		default:
		}
	}
}

// heapToGiveBack tells keepMemory that garbage is worth giving back now (any goroutine: a
// burst of accepts is over, accept.go).
func (o *outbound) heapToGiveBack() {
	select {
	case o.relieved <- struct{}{}:
	default:
	}
}

// keepMemory runs beside the loop (Run): it returns freed heap to the operating system when
// the loop says the pressure has passed (rate-limited), and keeps the soft memory limit in
// step with the budget when Config.GoMemoryLimit is set. It restores the previous limit when
// ctx ends.
func (o *outbound) keepMemory(ctx context.Context) {
	var lastFree time.Time
	prevLimit := debug.SetMemoryLimit(-1)
	var limiter *memoryLimiter
	if o.cfg.GoMemoryLimit {
		limiter = newMemoryLimiter(int64(o.cfg.MaxOutboundMemory))
		defer debug.SetMemoryLimit(prevLimit)
	}
	var tick <-chan time.Time // only with a limit to keep: an idle server wakes no one
	if limiter != nil {
		t := time.NewTicker(memoryLimitEvery)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-o.relieved:
			if time.Since(lastFree) >= freeOSMemoryEvery {
				lastFree = time.Now()
				debug.FreeOSMemory()
			}
		case <-tick:
			limiter.update(o.totalSeen.Load())
		}
	}
}

// memoryLimiter sets the runtime's soft memory limit from the budget (see the top of this file).
type memoryLimiter struct {
	budget  int64
	set     int64
	samples []rtmetrics.Sample
}

const (
	metricHeapLive     = "/gc/heap/live:bytes"
	metricTotal        = "/memory/classes/total:bytes"
	metricHeapObjects  = "/memory/classes/heap/objects:bytes"
	metricHeapUnused   = "/memory/classes/heap/unused:bytes"
	metricHeapFree     = "/memory/classes/heap/free:bytes"
	metricHeapReleased = "/memory/classes/heap/released:bytes"
)

func newMemoryLimiter(budget int64) *memoryLimiter {
	m := &memoryLimiter{budget: budget}
	for _, name := range []string{metricHeapLive, metricTotal, metricHeapObjects, metricHeapUnused, metricHeapFree, metricHeapReleased} {
		m.samples = append(m.samples, rtmetrics.Sample{Name: name})
	}
	return m
}

// limitFor is the soft limit for these runtime figures and queued bytes.
func (m *memoryLimiter) limitFor(heapLive, total, heapObjects, heapUnused, heapFree, heapReleased, queued int64) int64 {
	nonHeap := max(0, total-heapObjects-heapUnused-heapFree-heapReleased)
	liveOther := max(0, heapLive-queued)
	return nonHeap + liveOther + max(m.budget, liveOther/2)
}

func (m *memoryLimiter) update(queued int64) {
	rtmetrics.Read(m.samples)
	v := make([]int64, len(m.samples))
	for i, s := range m.samples {
		if s.Value.Kind() != rtmetrics.KindUint64 {
			return // a runtime without these figures: leave the limit alone
		}
		u := s.Value.Uint64()
		if u > math.MaxInt64 {
			return
		}
		v[i] = int64(u)
	}
	limit := m.limitFor(v[0], v[1], v[2], v[3], v[4], v[5], queued)
	// Move it only when it changed by more than an eighth: each change makes the GC replan.
	if d := limit - m.set; d > m.set/8 || -d > m.set/8 {
		m.set = limit
		debug.SetMemoryLimit(limit)
	}
}
