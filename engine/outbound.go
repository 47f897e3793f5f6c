package engine

import (
	"slices"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The write path to SSE clients (docs/architecture.md, invariants 2 and 3). Every byte for an SSE
// connection leaves through outbound.send (or sendLive), in one writev per connection per call, straight to
// the socket: gnet's outbound buffer is never used for SSE connections. Whatever the kernel
// does not take at once stays in the connection's own queue (outQueue), and it is kept by
// reference, not copied, when it is shared: a live event's encoding (event.enc) queued for a
// thousand slow subscribers is one block of memory, however many queues point into it, and a
// replayed batch is the batch the table read returned. Only bytes the caller reuses (the
// encoding scratch: response heads, gap notices, the last bytes before a close) are copied.
//
// What the queues hold is counted as it changes (outbound.total: private bytes, plus each
// shared encoding once while any queue holds it, plus outItemBytes per queued piece), so the
// budget (budget.go) is always exact and costs nothing per delivery: a connection whose socket
// takes everything — the common case — touches no queue and no counter.
//
// gnet has no writable callback, so the write path keeps its own (writable_linux.go: an
// edge-triggered epoll set watched by one goroutine; elsewhere the tick polls the queues).
// The sweep retries every queue now and then anyway, so that nothing depends on a single
// wake-up.

// maxIOV bounds one writev (Linux IOV_MAX is 1024).
const maxIOV = 1024

// outItemBytes is what one queued piece costs besides its bytes; counted in the total, so that
// a queue of many small shared events is not free.
const outItemBytes = int(unsafe.Sizeof(outItem{}))

// Queue housekeeping.
const (
	queueRetryMS      = 1000 // a queue is tried on the sweep when it has not been for this long
	queueKeepItems    = 64   // an emptied queue's item array is kept for reuse up to this capacity
	queueFreeListLen  = 256  // emptied queues kept for reuse
	writableEventsMax = 256  // sockets taken from one epoll_wait
)

// outItem is one piece of bytes on its way to a connection.
type outItem struct {
	b []byte
	// ev is the shared event whose encoding b is (a suffix of): kept by reference and
	// counted once however many queues hold it. nil: b belongs to this connection alone.
	ev *event
	// transient: b is the caller's scratch, valid only during the call; it is copied if it
	// has to be kept. Never set on a queued item.
	transient bool
	// lead: b is the connection's own bytes that belong with the next item (an id line of
	// its own in front of a shared encoding): sendLive sends or holds back the two together.
	lead bool
}

// sharedItem writes ev's encoding, shared by every connection (kept by reference).
func sharedItem(ev *event) outItem { return outItem{b: ev.enc, ev: ev} }

// sharedBodyItem writes the part body of ev's encoding (the transport's eventBody: without
// its id line), shared like sharedItem; led by a leadItem of the connection's own.
func sharedBodyItem(ev *event, body []byte) outItem { return outItem{b: body, ev: ev} }

// leadItem writes b, the connection's own bytes, in front of the next item (copied if kept).
func leadItem(b []byte) outItem { return outItem{b: b, transient: true, lead: true} }

// ownItem writes b, which belongs to this connection alone and does not change (a table
// read's encoding): kept by reference.
func ownItem(b []byte) outItem { return outItem{b: b} }

// transientItem writes b, the caller's scratch (copied if kept).
func transientItem(b []byte) outItem { return outItem{b: b, transient: true} }

// cutEvent is the event that sendLive's cut at items[cut] holds back.
func cutEvent(items []outItem, cut int) *event {
	if items[cut].lead {
		cut++
	}
	return items[cut].ev
}

// durableAt is the durable event items[i] writes (not its lead), or nil.
func durableAt(items []outItem, i int) *event {
	if it := items[i]; !it.lead && it.ev != nil && it.ev.id > 0 {
		return it.ev
	}
	return nil
}

// writtenBefore counts the events sendLive wrote when it cut at cut: those before the cut and
// the ephemeral ones after it (only durable events are held back).
func writtenBefore(items []outItem, cut int) int {
	n := 0
	for i, it := range items {
		if it.lead || it.ev == nil {
			continue
		}
		if i < cut || it.ev.id == 0 {
			n++
		}
	}
	return n
}

// outQueue is what a connection's socket has not taken yet, in order.
type outQueue struct {
	items   []outItem // items[head:] are unsent
	head    int
	bytes   int   // unsent bytes
	begun   bool  // the socket has taken part of items[head], or the whole lead before it
	triedMS int64 // when a write from the queue was last tried
}

// outbound is the loop's part for the write path: the queues' total, the writability set,
// the large events held (budget.go) and scratch space.
type outbound struct {
	*loopEnv
	conns *connTable

	total  int // bytes held in queues: private bytes, each shared encoding once, outItemBytes per piece
	queued int // connections with a non-empty queue
	// reading is what the catch-up reads in flight may bring (their MaxBytes): the limits
	// count it with total, so that a thousand reads at once cannot bring a thousand batches.
	reading int
	epfd    int // edge-triggered EPOLLOUT set of the connections that ever queued; -1 = none
	stopFD  int // an eventfd in that set: written to end watchWritable
	byFD    map[int32]*sseConn
	// others: sockets of other parts (hub workers) armed for one report each (watchOnce), and
	// what to run once each has room
	others map[int32]func()
	// ready holds the sockets watchWritable found with room; the loop reads it in flushTask,
	// then signals readyDone (watchWritable does not touch it in between).
	ready     []int32
	readyDone chan struct{}
	flushTask func()
	iovecs    []unix.Iovec
	items     []outItem // scratch for building one connection's write
	free      []*outQueue
	freeExts  []*connExt // empty connection extensions the emptied queues left (sseConn.setQueue)
	large     []*event   // large events read from the table that queues hold (budget.go)
	pressed   bool       // the limits shrank (budget.go); cleared, and the heap returned, once the queues are low again

	totalSeen atomic.Int64  // total as of the last tick, for keepMemory
	relieved  chan struct{} // the loop tells keepMemory that the outbound pressure passed
}

func newOutbound(env *loopEnv, conns *connTable) outbound {
	return outbound{loopEnv: env, conns: conns, epfd: -1, relieved: make(chan struct{}, 1)}
}

// anyQueued reports whether a connection's queue holds bytes.
func (o *outbound) anyQueued() bool { return o.queued > 0 }

// reserveRead and releaseRead count what a catch-up read in flight may bring (its
// MaxBytes) against the budget, until it is written (reading).
func (o *outbound) reserveRead(n int) { o.reading += n }
func (o *outbound) releaseRead(n int) { o.reading -= n }

// sendOne writes b, the caller's scratch (copied if the socket does not take it all now).
func (o *outbound) sendOne(sc *sseConn, b []byte) {
	items := append(o.items[:0], transientItem(b))
	o.send(sc, items)
	clear(items)
	o.items = items[:0]
}

// sendEvents writes the shared encodings of evs.
func (o *outbound) sendEvents(sc *sseConn, evs []*event) {
	items := o.items[:0]
	for _, ev := range evs {
		items = append(items, sharedItem(ev))
	}
	o.send(sc, items)
	clear(items)
	o.items = items[:0]
}

// pending is the number of bytes sc's socket has not taken yet.
func (sc *sseConn) pending() int {
	if sc.queue() == nil {
		return 0
	}
	return sc.queue().bytes
}

// send writes items to sc in one writev (up to maxIOV pieces per syscall) and keeps what the
// socket does not take. Behind bytes already queued, items are queued without a syscall.
func (o *outbound) send(sc *sseConn, items []outItem) {
	if sc.queue() != nil && sc.queue().bytes > 0 {
		o.keep(sc, items, 0)
		return
	}
	if sc.c.OutboundBuffered() > 0 {
		// Bytes reached gnet's buffer around these helpers: stay behind them, in gnet.
		o.gnetWrite(sc, items)
		return
	}
	sent, total, err := o.writeSocket(sc, items)
	if err != nil {
		_ = sc.c.Close() // the peer is gone: gnet closes it (OnClose) and we drop the rest
		return
	}
	if sent < total {
		o.keep(sc, items, sent)
	}
}

// writeSocket writes items to sc's socket until the socket is full, at most maxIOV pieces per
// writev; it returns the bytes taken and the bytes offered. EAGAIN is not an error.
func (o *outbound) writeSocket(sc *sseConn, items []outItem) (sent, total int, err error) {
	fd := sc.c.Fd()
	for len(items) > 0 {
		k := min(len(items), maxIOV)
		iov := o.iovecs[:0]
		n := 0
		for _, it := range items[:k] {
			if len(it.b) == 0 {
				continue
			}
			iov = append(iov, unix.Iovec{Base: &it.b[0], Len: uint64(len(it.b))})
			n += len(it.b)
		}
		items = items[k:]
		total += n
		if n == 0 {
			o.iovecs = iov[:0]
			continue
		}
		w, _, errno := syscall.Syscall(syscall.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
		for errno == syscall.EINTR {
			w, _, errno = syscall.Syscall(syscall.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
		}
		clear(iov) // no stale pointers into event encodings
		o.iovecs = iov[:0]
		switch {
		case errno == syscall.EAGAIN:
			w = 0
		case errno != 0:
			return sent, total, errno
		}
		sent += int(w)
		if int(w) < n {
			for _, it := range items {
				total += len(it.b)
			}
			return sent, total, nil
		}
	}
	return sent, total, nil
}

// keep queues items after their first skip bytes (which the socket took), by reference when
// they may be kept (shared or private), as a copy when transient.
func (o *outbound) keep(sc *sseConn, items []outItem, skip int) {
	leadTaken := false // the socket took the whole lead of this item: its event is begun
	for _, it := range items {
		if skip >= len(it.b) {
			skip -= len(it.b)
			leadTaken = it.lead
			continue
		}
		o.enqueue(sc, it, it.b[skip:], skip > 0 || leadTaken)
		skip, leadTaken = 0, false
	}
}

// sendLive writes live events (the subscriptions' items: shared encodings, each perhaps led
// by bytes of the connection's own) like send, but lets sc's queue grow with durable events
// only up to limit bytes: once the queue holds something, the first durable event that would
// take it past limit is not sent, nor is any durable event after it (ephemeral ones still
// are); a lead goes or stays with its event. So a connection always takes at least one
// event, and the kernel takes whatever it can first. It returns the index in items of the
// first durable event not sent (its lead, if it has one), len(items) if all were.
func (o *outbound) sendLive(sc *sseConn, items []outItem, limit int) int {
	sent := 0
	switch {
	case sc.queue() != nil && sc.queue().bytes > 0:
	case sc.c.OutboundBuffered() > 0:
		o.gnetWrite(sc, items)
		return len(items)
	default:
		n, total, err := o.writeSocket(sc, items)
		if err != nil {
			_ = sc.c.Close()
			return len(items)
		}
		if n == total {
			return len(items)
		}
		sent = n
	}
	cut := len(items)
	for i := 0; i < len(items); {
		// One event: items[i:j], a lead and the item it leads, or an item alone.
		j := i + 1
		if items[i].lead && j < len(items) {
			j++
		}
		size := 0
		for _, it := range items[i:j] {
			size += len(it.b)
		}
		if sent >= size { // the socket took it
			sent -= size
			i = j
			continue
		}
		if ev := items[j-1].ev; sent == 0 && ev != nil && ev.id > 0 {
			if cut < len(items) {
				i = j
				continue
			}
			if q := sc.pending(); q > 0 && q+size > limit {
				cut = i
				i = j
				continue
			}
		}
		leadTaken := false // the socket took the whole lead: the event is begun
		for _, it := range items[i:j] {
			if sent >= len(it.b) {
				sent -= len(it.b)
				leadTaken = it.lead
				continue
			}
			o.enqueue(sc, it, it.b[sent:], sent > 0 || leadTaken)
			sent, leadTaken = 0, false
		}
		i = j
	}
	return cut
}

// enqueue appends b — all of it.b, or the unsent part when begun (the socket took the rest)
// — to sc's queue and counts it.
func (o *outbound) enqueue(sc *sseConn, it outItem, b []byte, begun bool) {
	q := sc.queue()
	if q == nil {
		q = o.newQueue()
		var spare *connExt
		if n := len(o.freeExts); n > 0 {
			spare, o.freeExts[n-1] = o.freeExts[n-1], nil
			o.freeExts = o.freeExts[:n-1]
		}
		if back := sc.setQueue(q, spare); back != nil {
			o.freeExts = append(o.freeExts, back)
		}
	}
	if q.bytes == 0 {
		o.queued++
		q.triedMS = o.nowMS
		q.begun = begun // b is the queue's head: finish must not drop it
		o.watch(sc)
	}
	if it.transient {
		b = append([]byte(nil), b...)
	}
	if it.ev != nil {
		if it.ev.queued == 0 {
			o.total += len(it.ev.enc)
			if it.ev.stream != "" {
				o.large = append(o.large, it.ev)
			}
		}
		it.ev.queued++
	} else {
		o.total += len(b)
	}
	o.total += outItemBytes
	q.bytes += len(b)
	q.items = append(q.items, outItem{b: b, ev: it.ev, lead: it.lead})
}

// dropItem releases a queued item (sent or abandoned) and its share of the total.
func (o *outbound) dropItem(it *outItem) {
	if it.ev != nil {
		it.ev.queued--
		if it.ev.queued == 0 {
			o.total -= len(it.ev.enc)
			if it.ev.stream != "" {
				o.large = slices.DeleteFunc(o.large, func(e *event) bool { return e == it.ev })
			}
		}
	} else {
		o.total -= len(it.b)
	}
	o.total -= outItemBytes
	*it = outItem{}
}

// consume removes n sent bytes from the front of q.
func (o *outbound) consume(q *outQueue, n int) {
	q.bytes -= n
	for n > 0 && q.head < len(q.items) {
		it := &q.items[q.head]
		if n < len(it.b) {
			it.b = it.b[n:]
			if it.ev == nil {
				o.total -= n
			}
			q.begun = true
			return
		}
		n -= len(it.b)
		lead := it.lead
		o.dropItem(it)
		q.head++
		q.begun = lead // a lead written whole: its event (the next item) is begun
	}
}

// flushQueue writes from sc's queue until the queue is empty or the socket is full.
func (o *outbound) flushQueue(sc *sseConn) {
	q := sc.queue()
	if q == nil || q.bytes == 0 || sc.c == nil {
		return
	}
	q.triedMS = o.nowMS
	for q.bytes > 0 {
		sent, total, err := o.writeSocket(sc, q.items[q.head:])
		if err != nil {
			_ = sc.c.Close()
			return
		}
		o.consume(q, sent)
		if sent < total {
			break // full: the socket is reported again once it has room
		}
	}
	sc.wrote(o.nowMS)
	if q.bytes == 0 {
		o.emptied(sc)
		o.conns.finished(sc) // a closing connection's last bytes have left: it closes
	}
}

// trimQueue drops what sc has queued except the event the socket has begun — the rest of
// the item it began, or of a lead and the item it leads (finish: the connection's last bytes
// go right after it, and a composite id must not be followed by anything but its event).
func (o *outbound) trimQueue(sc *sseConn) {
	q := sc.queue()
	if q == nil || q.bytes == 0 {
		return
	}
	keep := q.head
	if q.begun {
		keep++
		if q.items[q.head].lead && keep < len(q.items) {
			keep++ // a begun lead keeps its event
		}
	}
	for i := keep; i < len(q.items); i++ {
		q.bytes -= len(q.items[i].b)
		o.dropItem(&q.items[i])
	}
	q.items = q.items[:keep]
	if q.bytes == 0 {
		o.emptied(sc)
	}
}

// emptied returns an empty queue for reuse.
func (o *outbound) emptied(sc *sseConn) {
	q := sc.queue()
	if x := sc.setQueue(nil, nil); x != nil && len(o.freeExts) < queueFreeListLen {
		o.freeExts = append(o.freeExts, x)
	}
	o.queued--
	clear(q.items[q.head:])
	q.items, q.head, q.bytes, q.begun = q.items[:0], 0, 0, false
	if cap(q.items) > queueKeepItems {
		q.items = nil
	}
	if len(o.free) < queueFreeListLen {
		o.free = append(o.free, q)
	}
}

func (o *outbound) newQueue() *outQueue {
	if n := len(o.free); n > 0 {
		q := o.free[n-1]
		o.free[n-1] = nil
		o.free = o.free[:n-1]
		return q
	}
	return &outQueue{}
}

// takeQueue appends to dst the bytes sc's socket has not taken yet, in order (a partly
// written piece's remainder first), and empties the queue (a handoff: the successor writes
// them).
func (o *outbound) takeQueue(sc *sseConn, dst []byte) []byte {
	q := sc.queue()
	if q == nil || q.bytes == 0 {
		return dst
	}
	for _, it := range q.items[q.head:] {
		dst = append(dst, it.b...)
	}
	o.dropQueue(sc)
	return dst
}

// dropQueue abandons whatever sc still has queued (the connection is gone).
func (o *outbound) dropQueue(sc *sseConn) {
	q := sc.queue()
	if q == nil {
		return
	}
	for i := q.head; i < len(q.items); i++ {
		o.dropItem(&q.items[i])
	}
	q.head = len(q.items)
	if q.bytes > 0 {
		q.bytes = 0
		o.queued--
	}
	q.begun = false
	sc.setQueue(nil, nil)
}

// retryQueues tries every queue that has not been tried for olderThanMS: from the sweep
// (queueRetryMS), a safety net under the writability set; from every tick where there is no
// such set (pollQueues, 0).
func (o *outbound) retryQueues(olderThanMS int64) {
	if o.queued == 0 {
		return
	}
	for _, sc := range o.conns.all() {
		if sc.queue() != nil && sc.queue().bytes > 0 && !sc.closed && o.nowMS-sc.queue().triedMS >= olderThanMS {
			o.flushQueue(sc)
		}
	}
}

// gnetWrite hands items to gnet (which copies them) — only when gnet already holds bytes
// for the connection, so that order is kept.
func (o *outbound) gnetWrite(sc *sseConn, items []outItem) {
	for _, it := range items {
		if len(it.b) > 0 {
			_, _ = sc.c.Write(it.b)
		}
	}
}
