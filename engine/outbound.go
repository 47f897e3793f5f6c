package engine

import (
	"slices"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The write path to SSE clients (docs/architecture.md, invariants 2 and 3). Every byte for an SSE
// connection leaves through Server.send, in one writev per connection per call, straight to
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
}

// outQueue is what a connection's socket has not taken yet, in order.
type outQueue struct {
	items   []outItem // items[head:] are unsent
	head    int
	bytes   int   // unsent bytes
	begun   bool  // the socket has taken part of items[head]
	triedMS int64 // when a write from the queue was last tried
}

// outbound is the loop's state of the write path: the queues' total, the writability set and
// scratch space. A field of Server (loop-owned).
type outbound struct {
	total  int // bytes held in queues: private bytes, each shared encoding once, outItemBytes per piece
	queued int // connections with a non-empty queue
	// reading is what the catch-up reads in flight may bring (their MaxBytes): the limits
	// count it with total, so that a thousand reads at once cannot bring a thousand batches.
	reading int
	epfd    int // edge-triggered EPOLLOUT set of the connections that ever queued; -1 = none
	stopFD  int // an eventfd in that set: written to end watchWritable
	byFD    map[int32]*sseConn
	// ready holds the sockets watchWritable found with room; the loop reads it in flushTask,
	// then signals readyDone (watchWritable does not touch it in between).
	ready     []int32
	readyDone chan struct{}
	flushTask func()
	iovecs    []unix.Iovec
	items     []outItem // scratch for building one connection's write
	free      []*outQueue
	large     []*event   // large events read from the table that queues hold (budget.go)
	largeWait []*sseConn // connections whose catch-up waits for one of them to leave
	pressed   bool       // the limits shrank (budget.go); cleared, and the heap returned, once the queues are low again
}

// pending is the number of bytes sc's socket has not taken yet.
func (sc *sseConn) pending() int {
	if sc.q == nil {
		return 0
	}
	return sc.q.bytes
}

// send writes items to sc in one writev (up to maxIOV pieces per syscall) and keeps what the
// socket does not take. Behind bytes already queued, items are queued without a syscall.
func (s *Server) send(sc *sseConn, items []outItem) {
	if sc.q != nil && sc.q.bytes > 0 {
		s.keep(sc, items, 0)
		return
	}
	if sc.c.OutboundBuffered() > 0 {
		// Bytes reached gnet's buffer around these helpers: stay behind them, in gnet.
		s.gnetWrite(sc, items)
		return
	}
	sent, total, err := s.writeSocket(sc, items)
	if err != nil {
		_ = sc.c.Close() // the peer is gone: gnet closes it (OnClose) and we drop the rest
		return
	}
	if sent < total {
		s.keep(sc, items, sent)
	}
}

// writeSocket writes items to sc's socket until the socket is full, at most maxIOV pieces per
// writev; it returns the bytes taken and the bytes offered. EAGAIN is not an error.
func (s *Server) writeSocket(sc *sseConn, items []outItem) (sent, total int, err error) {
	fd := sc.c.Fd()
	for len(items) > 0 {
		k := min(len(items), maxIOV)
		iov := s.out.iovecs[:0]
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
			s.out.iovecs = iov[:0]
			continue
		}
		w, _, errno := syscall.Syscall(syscall.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
		for errno == syscall.EINTR {
			w, _, errno = syscall.Syscall(syscall.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
		}
		clear(iov) // no stale pointers into event encodings
		s.out.iovecs = iov[:0]
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
func (s *Server) keep(sc *sseConn, items []outItem, skip int) {
	for _, it := range items {
		if skip >= len(it.b) {
			skip -= len(it.b)
			continue
		}
		s.enqueue(sc, it, it.b[skip:], skip > 0)
		skip = 0
	}
}

// sendLive writes live events (shared encodings) like send, but lets sc's queue grow with
// durable events only up to limit bytes: once the queue holds something, the first durable
// event that would take it past limit is not sent, nor is any durable event after it
// (ephemeral ones still are). So a connection always takes at least one event, and the
// kernel takes whatever it can first. It returns the index in evs of the first durable event
// not sent, len(evs) if all were.
func (s *Server) sendLive(sc *sseConn, evs []*event, limit int) int {
	items := s.out.items[:0]
	for _, ev := range evs {
		items = append(items, outItem{b: ev.enc, ev: ev})
	}
	defer func() {
		clear(items)
		s.out.items = items[:0]
	}()
	sent := 0
	switch {
	case sc.q != nil && sc.q.bytes > 0:
	case sc.c.OutboundBuffered() > 0:
		s.gnetWrite(sc, items)
		return len(evs)
	default:
		n, total, err := s.writeSocket(sc, items)
		if err != nil {
			_ = sc.c.Close()
			return len(evs)
		}
		if n == total {
			return len(evs)
		}
		sent = n
	}
	cut := len(evs)
	for i, it := range items {
		if sent >= len(it.b) {
			sent -= len(it.b)
			continue
		}
		b := it.b[sent:]
		partial := sent > 0
		sent = 0
		if evs[i].id > 0 && !partial {
			if cut < len(evs) {
				continue
			}
			if q := sc.pending(); q > 0 && q+len(b) > limit {
				cut = i
				continue
			}
		}
		s.enqueue(sc, it, b, partial)
	}
	return cut
}

// enqueue appends b — all of it.b, or the unsent part when begun (the socket took the rest)
// — to sc's queue and counts it.
func (s *Server) enqueue(sc *sseConn, it outItem, b []byte, begun bool) {
	q := sc.q
	if q == nil {
		q = s.newQueue()
		sc.q = q
	}
	if q.bytes == 0 {
		s.out.queued++
		q.triedMS = s.nowMS
		q.begun = begun // b is the queue's head: finish must not drop it
		s.watch(sc)
	}
	if it.transient {
		b = append([]byte(nil), b...)
	}
	if it.ev != nil {
		if it.ev.queued == 0 {
			s.out.total += len(it.ev.enc)
			if it.ev.stream != "" {
				s.out.large = append(s.out.large, it.ev)
			}
		}
		it.ev.queued++
	} else {
		s.out.total += len(b)
	}
	s.out.total += outItemBytes
	q.bytes += len(b)
	q.items = append(q.items, outItem{b: b, ev: it.ev})
}

// dropItem releases a queued item (sent or abandoned) and its share of the total.
func (s *Server) dropItem(it *outItem) {
	if it.ev != nil {
		it.ev.queued--
		if it.ev.queued == 0 {
			s.out.total -= len(it.ev.enc)
			if it.ev.stream != "" {
				s.out.large = slices.DeleteFunc(s.out.large, func(e *event) bool { return e == it.ev })
			}
		}
	} else {
		s.out.total -= len(it.b)
	}
	s.out.total -= outItemBytes
	*it = outItem{}
}

// consume removes n sent bytes from the front of q.
func (s *Server) consume(q *outQueue, n int) {
	q.bytes -= n
	for n > 0 && q.head < len(q.items) {
		it := &q.items[q.head]
		if n < len(it.b) {
			it.b = it.b[n:]
			if it.ev == nil {
				s.out.total -= n
			}
			q.begun = true
			return
		}
		n -= len(it.b)
		s.dropItem(it)
		q.head++
		q.begun = false
	}
}

// flushQueue writes from sc's queue until the queue is empty or the socket is full.
func (s *Server) flushQueue(sc *sseConn) {
	q := sc.q
	if q == nil || q.bytes == 0 || sc.c == nil {
		return
	}
	q.triedMS = s.nowMS
	for q.bytes > 0 {
		sent, total, err := s.writeSocket(sc, q.items[q.head:])
		if err != nil {
			_ = sc.c.Close()
			return
		}
		s.consume(q, sent)
		if sent < total {
			break // full: the socket is reported again once it has room
		}
	}
	sc.lastWriteMS = s.nowMS
	if q.bytes == 0 {
		s.emptied(sc)
		if sc.state == stateClosing && !sc.closed {
			s.closeSent(sc) // its last bytes have left (finish)
		}
	}
}

// trimQueue drops what sc has queued except a piece the socket has begun (finish: the
// connection's last bytes go right after it).
func (s *Server) trimQueue(sc *sseConn) {
	q := sc.q
	if q == nil || q.bytes == 0 {
		return
	}
	keep := q.head
	if q.begun {
		keep++
	}
	for i := keep; i < len(q.items); i++ {
		q.bytes -= len(q.items[i].b)
		s.dropItem(&q.items[i])
	}
	q.items = q.items[:keep]
	if q.bytes == 0 {
		s.emptied(sc)
	}
}

// emptied returns an empty queue for reuse.
func (s *Server) emptied(sc *sseConn) {
	q := sc.q
	sc.q = nil
	s.out.queued--
	clear(q.items[q.head:])
	q.items, q.head, q.bytes, q.begun = q.items[:0], 0, 0, false
	if cap(q.items) > queueKeepItems {
		q.items = nil
	}
	if len(s.out.free) < queueFreeListLen {
		s.out.free = append(s.out.free, q)
	}
}

func (s *Server) newQueue() *outQueue {
	if n := len(s.out.free); n > 0 {
		q := s.out.free[n-1]
		s.out.free[n-1] = nil
		s.out.free = s.out.free[:n-1]
		return q
	}
	return &outQueue{}
}

// dropQueue abandons whatever sc still has queued (the connection is gone).
func (s *Server) dropQueue(sc *sseConn) {
	q := sc.q
	if q == nil {
		return
	}
	for i := q.head; i < len(q.items); i++ {
		s.dropItem(&q.items[i])
	}
	q.head = len(q.items)
	if q.bytes > 0 {
		q.bytes = 0
		s.out.queued--
	}
	q.begun = false
	sc.q = nil
}

// retryQueues tries every queue that has not been tried for olderThanMS: from the sweep
// (queueRetryMS), a safety net under the writability set; from every tick where there is no
// such set (pollQueues, 0).
func (s *Server) retryQueues(olderThanMS int64) {
	if s.out.queued == 0 {
		return
	}
	for _, sc := range s.conns {
		if sc.q != nil && sc.q.bytes > 0 && !sc.closed && s.nowMS-sc.q.triedMS >= olderThanMS {
			s.flushQueue(sc)
		}
	}
}

// gnetWrite hands items to gnet (which copies them) — only when gnet already holds bytes
// for the connection, so that order is kept.
func (s *Server) gnetWrite(sc *sseConn, items []outItem) {
	for _, it := range items {
		if len(it.b) > 0 {
			_, _ = sc.c.Write(it.b)
		}
	}
}
