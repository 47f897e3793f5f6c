//go:build linux

package bench

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pgsse/pgsse/internal/testkit/ssetest"
)

// maxLine bounds a line of an event stream at the load client: the benchmark's events are
// small, so a longer line is a fault, counted in ClientStats.Bad.
const maxLine = 64 << 10

// ClientConfig configures a Client: N SSE subscribers of one server.
type ClientConfig struct {
	Addr    netip.AddrPort // the server's SSE address (loopback)
	Path    string         // request target, e.g. "/streams/bench"
	Sources int            // loopback source addresses 127.0.0.2 … 127.0.0.(1+Sources); default 8
	Readers int            // epoll goroutines; default 1 (on 2 cores one loop costs less CPU: it reads more sockets per epoll_wait)
	MaxSeq  int            // events tracked per sequence number (seq 1 … MaxSeq); default 1<<16
	Dialers int            // concurrent connects; default 16
	// SlowRcvBuf is SO_RCVBUF for connections opened with slow=true (they never read);
	// 0 = the kernel default.
	SlowRcvBuf int
	// RcvBuf is SO_RCVBUF for the reading connections (0 = the kernel default): a small one
	// keeps the server's kernel buffer for them small too, so that what they cannot take yet
	// waits in the server.
	RcvBuf int
	// Paths, when set, are request targets taken in turn instead of Path: the k-th connection
	// opened asks for Paths[k mod len(Paths)] (scenario 11: the published stream at varying
	// positions of a connection's streams).
	Paths []string
	// ByID: an event's sequence number is its SSE id (each subscriber must see 1, 2, 3, … of
	// its stream, once each), not the number in its data — for concurrent publishers, whose
	// own numbering cannot follow the commit order (scenario 16). The data's send time is
	// still read.
	ByID bool
	// Reconnect: a connection the server closes (or that breaks) is opened again as an
	// EventSource does: after the last retry: delay it was given (DefaultRetryMS before any),
	// with Last-Event-ID set to the last id it received; a failed attempt (refused, no 200,
	// no response head) is tried again after the same delay. The connection keeps its
	// sequence checks across reconnects: it must see every event once, in order (the deploy
	// scenario).
	Reconnect bool
}

// reconnectDialers bounds a Reconnect client's connects in progress at once: browsers come
// back independently, so more than the initial Dialers — a few handfuls of blocking connects
// could not follow a storm of thousands, and one the server does not answer blocks a slot
// for the 30 s head timeout.
const reconnectDialers = 512

// DefaultRetryMS is the reconnection delay of a Reconnect client before the server sent a
// retry: field (the WHATWG standard leaves it to the browser; they use 3 s).
const DefaultRetryMS = 3000

func (c *ClientConfig) defaults() {
	if c.Sources <= 0 {
		c.Sources = 8
	}
	if c.Readers <= 0 {
		c.Readers = 1
	}
	if c.MaxSeq <= 0 {
		c.MaxSeq = 1 << 16
	}
	if c.Dialers <= 0 {
		c.Dialers = 16
	}
}

// Client holds SSE connections and reads them on a few epoll loops with raw syscalls (no
// goroutine per connection, so the load generator costs as little CPU as we can make it). For
// every event it records, per sequence number, how many subscribers have it and the first
// and last receive time, and per delivery the send→receive latency from the data's timestamp.
type Client struct {
	cfg    ClientConfig
	reqs   [][]byte       // one request head per path
	counts []atomic.Int32 // per seq: subscribers that have it
	refs   []atomic.Int64 // per seq: reference time (commit) in UnixNano, set by the publisher
	loops  []*pollLoop
	next   atomic.Uint32 // round robin over loops and sources
	// phaseFrom[i] is the first sequence number of phase i (SetPhase); phase 0 starts at 1.
	// Per-delivery latency is also recorded per phase (ClientStats.Phases).
	phaseFrom [MaxPhases]atomic.Int64
	// windows[i] is when time window i began (UnixNano; MarkWindow); window 0 is before any.
	// Pauses, closes and reconnects are counted per window.
	windows   [MaxWindows]atomic.Int64
	anomalies atomic.Int64

	mu      sync.Mutex
	slow    []*sseConn // connected, never read
	conns   int
	redial  map[*sseConn]*time.Timer // Reconnect: connections waiting for their retry delay
	dialWG  sync.WaitGroup           // Reconnect: redials scheduled or in progress
	dialSem chan struct{}            // Reconnect: at most cfg.Dialers connects at a time

	stop chan struct{}
	wg   sync.WaitGroup
}

type sseConn struct {
	fd      int
	s       ssetest.Decoder // Eager (heartbeats count when they arrive), lines ≤ 64 KiB
	lastSeq int64
	events  int64
	gaps    int64 // sequence numbers skipped
	dups    int64 // sequence numbers seen again or out of order
	closed  bool

	// Reconnect (ClientConfig.Reconnect): guarded by its loop's mu while it is away from the
	// loop (between the close and the new connection's epoll registration).
	loop       *pollLoop
	idx        int               // its place in loop.conns (the epoll data)
	k          uint32            // its number among the client's connections (source address, path)
	lastID     []byte            // the last event id received, sent as Last-Event-ID
	retryMS    int64             // the last retry: received (0: none yet)
	headAt     int64             // when the current connection's response head arrived, if it is a reconnect
	prevAt     int64             // when the last event arrived
	maxGap     [MaxWindows]int64 // the longest wait for an event within each window (see pause)
	reconnects int64
	headWindow int    // the window headAt fell in
	closedAt   int64  // when the server last closed it
	sentID     []byte // the Last-Event-ID of the current connection
}

type pollLoop struct {
	c      *Client
	epfd   int
	mu     sync.Mutex // guards conns against Add while the loop runs
	conns  []*sseConn
	first  []int64 // per seq: earliest receive time (UnixNano), 0 = none
	last   []int64 // per seq: latest receive time
	hist   Histogram
	phases [MaxPhases]Histogram
	bytes  int64
	reads  int64
	events atomic.Int64
	bad    int64
	closed int64
	// per window (Client.MarkWindow): connections closed by the server, reopened, failed
	// attempts to reopen, and events received by reopened connections that were sent before
	// the connection's response head (caught up: from the server's ring or its table)
	closedW, reopenedW, dialFailsW, caughtUpW [MaxWindows]atomic.Int64
}

// NewClient starts the client's epoll loops; it opens no connection yet.
func NewClient(cfg ClientConfig) (*Client, error) {
	cfg.defaults()
	paths := cfg.Paths
	if len(paths) == 0 {
		paths = []string{cfg.Path}
	}
	c := &Client{
		cfg:    cfg,
		counts: make([]atomic.Int32, cfg.MaxSeq+1),
		refs:   make([]atomic.Int64, cfg.MaxSeq+1),
		stop:   make(chan struct{}),
	}
	for _, path := range paths {
		c.reqs = append(c.reqs, fmt.Appendf(nil, "GET %s HTTP/1.1\r\nHost: %s\r\nAccept: text/event-stream\r\n\r\n", path, cfg.Addr))
	}
	if cfg.Reconnect {
		c.redial = map[*sseConn]*time.Timer{}
		c.dialSem = make(chan struct{}, reconnectDialers)
	}
	for range cfg.Readers {
		epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("epoll_create1: %w", err)
		}
		l := &pollLoop{c: c, epfd: epfd, first: make([]int64, cfg.MaxSeq+1), last: make([]int64, cfg.MaxSeq+1)}
		c.loops = append(c.loops, l)
	}
	for _, l := range c.loops {
		c.wg.Add(1)
		go l.run()
	}
	return c, nil
}

// Connect opens n subscribers (in parallel, cfg.Dialers at a time), each having read the
// response head before Connect returns. slow subscribers are never read after the head.
func (c *Client) Connect(n int, slow bool) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		left  atomic.Int64
	)
	left.Store(int64(n))
	for range min(c.cfg.Dialers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Add(-1) >= 0 {
				k := c.next.Add(1)
				sc, err := c.dial(k, slow, nil)
				if err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
				if slow {
					c.mu.Lock()
					c.slow = append(c.slow, sc)
					c.conns++
					c.mu.Unlock()
					continue
				}
				l := c.loops[int(k)%len(c.loops)]
				if err := l.add(sc); err != nil {
					syscall.Close(sc.fd)
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
				c.mu.Lock()
				c.conns++
				c.mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

// dial opens one connection from source address 127.0.0.(2 + k mod Sources) and reads the
// response head with a 30 s timeout; lastID, when not nil, is sent as Last-Event-ID.
func (c *Client) dial(k uint32, slow bool, lastID []byte) (*sseConn, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			syscall.Close(fd)
		}
	}()
	const ipBindAddressNoPort = 24 // IP_BIND_ADDRESS_NO_PORT: the port is picked at connect, per 4-tuple
	_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_IP, ipBindAddressNoPort, 1)
	if slow && c.cfg.SlowRcvBuf > 0 {
		_ = syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_RCVBUF, c.cfg.SlowRcvBuf)
	}
	if !slow && c.cfg.RcvBuf > 0 {
		_ = syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_RCVBUF, c.cfg.RcvBuf)
	}
	src := [4]byte{127, 0, 0, byte(2 + int(k)%c.cfg.Sources)}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: src}); err != nil {
		return nil, fmt.Errorf("bind %v: %w", src, err)
	}
	dst := &syscall.SockaddrInet4{Port: int(c.cfg.Addr.Port()), Addr: c.cfg.Addr.Addr().As4()}
	// Go's preemption signal interrupts blocking syscalls: retry (a connect interrupted
	// midway goes on in the kernel: EALREADY until done, then EISCONN).
	for {
		err := syscall.Connect(fd, dst)
		if err == nil || err == syscall.EISCONN {
			break
		}
		if err == syscall.EINTR || err == syscall.EALREADY {
			time.Sleep(100 * time.Microsecond)
			continue
		}
		return nil, fmt.Errorf("connect %s from %v: %w", c.cfg.Addr, src, err)
	}
	tv := syscall.NsecToTimeval(int64(30 * time.Second))
	_ = syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv)
	req := c.reqs[int(k)%len(c.reqs)]
	if lastID != nil {
		head := req[:len(req)-2] // without the blank line
		req = append(append(append(append([]byte(nil), head...), "Last-Event-ID: "...), lastID...), "\r\n\r\n"...)
	}
	for {
		_, err := syscall.Write(fd, req) // a few hundred bytes into an empty buffer: all or nothing
		if err == nil {
			break
		}
		if err != syscall.EINTR {
			return nil, fmt.Errorf("write request: %w", err)
		}
	}
	// The head alone is read: what follows it (the preamble, and events a reconnect's
	// catch-up may have sent with it) is the loop's to decode, so the socket is peeked at
	// and only the head's bytes are taken from it.
	var buf [4096]byte
	var headBuf []byte
	end := -1
	for end < 0 {
		if len(headBuf) >= len(buf) {
			return nil, errors.New("response head over 4 KiB")
		}
		m, _, err := syscall.Recvfrom(fd, buf[:], syscall.MSG_PEEK)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read response head: %w", err)
		}
		if m == 0 {
			return nil, fmt.Errorf("server closed before the response head (%q)", headBuf)
		}
		take := m
		if i := bytes.Index(append(headBuf, buf[:m]...), []byte("\r\n\r\n")); i >= 0 {
			end = i
			take = i + 4 - len(headBuf)
		}
		for got := 0; got < take; {
			r, err := syscall.Read(fd, buf[got:take])
			if err == syscall.EINTR {
				continue
			}
			if err != nil || r <= 0 {
				return nil, fmt.Errorf("read response head: %v", err)
			}
			got += r
		}
		headBuf = append(headBuf, buf[:take]...)
	}
	head := headBuf[:end]
	if !bytes.HasPrefix(head, []byte("HTTP/1.1 200 ")) {
		line, _, _ := bytes.Cut(head, []byte("\r\n"))
		return nil, fmt.Errorf("response: %q", line)
	}
	sc := &sseConn{fd: fd, s: ssetest.Decoder{Eager: true, MaxLine: maxLine}, k: k}
	sc.s.Chunked = bytes.Contains(bytes.ToLower(head), []byte("\r\ntransfer-encoding: chunked"))
	tv = syscall.Timeval{}
	_ = syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv)
	if err := syscall.SetNonblock(fd, true); err != nil {
		return nil, err
	}
	ok = true
	return sc, nil
}

func (l *pollLoop) add(sc *sseConn) error {
	l.mu.Lock()
	idx := len(l.conns)
	sc.loop, sc.idx = l, idx
	fd := sc.fd // once registered, the loop owns sc (a Reconnect close changes fd)
	l.conns = append(l.conns, sc)
	l.mu.Unlock()
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: int32(idx)}
	if err := syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("epoll_ctl: %w", err)
	}
	return nil
}

func (l *pollLoop) run() {
	defer l.c.wg.Done()
	events := make([]syscall.EpollEvent, 256)
	buf := make([]byte, 256<<10)
	for {
		select {
		case <-l.c.stop:
			return
		default:
		}
		n, err := syscall.EpollWait(l.epfd, events, 50)
		if err != nil {
			if err == syscall.EINTR {
				continue
			}
			return
		}
		for _, ev := range events[:n] {
			l.mu.Lock()
			sc := l.conns[ev.Fd]
			l.mu.Unlock()
			l.readConn(sc, buf)
		}
	}
}

func (l *pollLoop) readConn(sc *sseConn, buf []byte) {
	if sc.closed {
		return
	}
	for {
		m, err := syscall.Read(sc.fd, buf)
		if err == syscall.EAGAIN {
			return
		}
		if err == syscall.EINTR {
			continue
		}
		if m <= 0 {
			sc.closed = true
			l.closed++
			_ = syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_DEL, sc.fd, nil)
			if l.c.cfg.Reconnect {
				l.closedW[l.c.windowOf(time.Now().UnixNano())].Add(1)
				l.c.reopenLater(sc)
			}
			return
		}
		now := time.Now().UnixNano()
		l.reads++
		l.bytes += int64(m)
		sc.s.Feed(buf[:m], func(b *ssetest.Block) {
			if b.HasRetry {
				sc.retryMS, _ = strconv.ParseInt(string(b.Retry), 10, 64)
			}
			if b.HasData {
				l.event(sc, b, now)
			}
		})
		if m < len(buf) {
			return
		}
	}
}

func (l *pollLoop) event(sc *sseConn, b *ssetest.Block, now int64) {
	seq, sent, ok := ParseData(b.Data)
	if ok && l.c.cfg.ByID {
		var end int
		seq, end, ok = parseDigits(b.ID, 0)
		ok = ok && b.HasID && end == len(b.ID)
	}
	if !ok {
		l.bad++
		if l.c.cfg.Reconnect && l.c.anomalies.Add(1) <= 20 {
			fmt.Fprintf(os.Stderr, "bench client: connection %d: an event not of the benchmark (window %d, now %s): event %q id %q data %q\n",
				sc.k, l.c.windowOf(now), clock(now), b.Type, b.ID, b.Data)
		}
		return
	}
	l.events.Add(1)
	sc.events++
	switch {
	case seq == sc.lastSeq+1:
	case seq > sc.lastSeq:
		sc.gaps += seq - sc.lastSeq - 1
		if l.c.cfg.Reconnect {
			l.c.anomaly(sc, "skipped", seq, now)
		}
	default:
		sc.dups++
		if l.c.cfg.Reconnect {
			l.c.anomaly(sc, "repeated", seq, now)
		}
	}
	sc.lastSeq = max(sc.lastSeq, seq)
	if seq > 0 && seq < int64(len(l.first)) {
		if ref := l.c.refs[seq].Load(); ref != 0 {
			sent = ref
		}
	}
	if w := l.c.windowOf(now); w > 0 {
		// The pause: how long this subscriber waited for this event, counted from the window's
		// start at the earliest (a pause that began after the signal that opened it).
		from := max(sc.prevAt, l.c.windows[w].Load())
		sc.maxGap[w] = max(sc.maxGap[w], now-from)
		if sc.headAt != 0 && sent < sc.headAt && w == sc.headWindow {
			l.caughtUpW[w].Add(1)
		}
	}
	sc.prevAt = now
	l.hist.Add(now - sent)
	l.phases[l.c.phaseOf(seq)].Add(now - sent)
	if seq > 0 && seq < int64(len(l.first)) {
		if l.first[seq] == 0 || now < l.first[seq] {
			l.first[seq] = now
		}
		l.last[seq] = max(l.last[seq], now)
		l.c.counts[seq].Add(1)
	}
}

// MaxPhases is how many phases a run can split its per-delivery latency into.
const MaxPhases = 4

// MaxWindows is how many time windows (MarkWindow) a run can split its pauses, closes and
// reconnects into; window 0 is the time before the first mark.
const MaxWindows = 4

// MarkWindow starts time window i (1 ≤ i < MaxWindows) at ns (UnixNano): from then on each
// subscriber's longest wait for an event (ClientStats.MaxGaps[i], counted from ns at the
// earliest), the server's closes and the reconnects are counted in window i, until the next
// window starts.
func (c *Client) MarkWindow(i int, ns int64) { c.windows[i].Store(ns) }

func (c *Client) windowOf(ns int64) int {
	w := 0
	for i := 1; i < MaxWindows; i++ {
		if from := c.windows[i].Load(); from > 0 && ns >= from {
			w = i
		}
	}
	return w
}

// anomaly reports (Reconnect clients: the deploy scenario's processes) one of the first
// sequence anomalies on standard error, with what the connection had been through.
func (c *Client) anomaly(sc *sseConn, what string, seq, now int64) {
	if c.anomalies.Add(1) > 20 {
		return
	}
	fmt.Fprintf(os.Stderr, "bench client: connection %d %s: event %d after %d (window %d, %d reconnects; the last close at %s, the current connection's head at %s with Last-Event-ID %q; now %s)\n",
		sc.k, what, seq, sc.lastSeq, c.windowOf(now), sc.reconnects, clock(sc.closedAt), clock(sc.headAt), sc.sentID, clock(now))
}

func clock(ns int64) string {
	if ns == 0 {
		return "-"
	}
	return time.Unix(0, ns).UTC().Format("15:04:05.000")
}

// reopenLater (Reconnect) opens sc again after its retry delay; its loop no longer polls it.
func (c *Client) reopenLater(sc *sseConn) {
	l := sc.loop
	l.mu.Lock()
	if id := sc.s.LastEventID(); len(id) > 0 {
		sc.lastID = append(sc.lastID[:0], id...)
	}
	delay, fd := sc.retryMS, sc.fd
	sc.fd, sc.closedAt = -1, time.Now().UnixNano()
	l.mu.Unlock()
	if delay <= 0 {
		delay = DefaultRetryMS
	}
	closeAbort(fd)
	c.schedule(sc, time.Duration(delay)*time.Millisecond)
}

func (c *Client) schedule(sc *sseConn, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.stop:
		return
	default:
	}
	c.dialWG.Add(1)
	c.redial[sc] = time.AfterFunc(d, func() {
		defer c.dialWG.Done()
		c.mu.Lock()
		delete(c.redial, sc)
		c.mu.Unlock()
		c.reopen(sc)
	})
}

// reopen connects sc again (Last-Event-ID: its last id) and gives it back to its loop; a
// failed attempt is tried again after the retry delay.
func (c *Client) reopen(sc *sseConn) {
	select {
	case c.dialSem <- struct{}{}:
	case <-c.stop:
		return
	}
	l := sc.loop
	l.mu.Lock()
	lastID := sc.lastID
	delay := sc.retryMS
	l.mu.Unlock()
	if delay <= 0 {
		delay = DefaultRetryMS
	}
	nc, err := c.dial(sc.k, false, lastID)
	<-c.dialSem
	now := time.Now().UnixNano()
	if err != nil {
		l.dialFailsW[c.windowOf(now)].Add(1)
		c.schedule(sc, time.Duration(delay)*time.Millisecond)
		return
	}
	l.mu.Lock()
	sc.fd, sc.s, sc.closed, sc.headAt = nc.fd, nc.s, false, now
	sc.sentID = append(sc.sentID[:0], lastID...)
	sc.headWindow = c.windowOf(now)
	if nc.retryMS > 0 {
		sc.retryMS = nc.retryMS
	}
	sc.reconnects++
	l.mu.Unlock()
	select {
	case <-c.stop:
		// Close may have passed this connection already: it is ours to close.
		l.mu.Lock()
		closeAbort(sc.fd)
		sc.fd = -1
		l.mu.Unlock()
		return
	default:
	}
	l.reopenedW[c.windowOf(now)].Add(1)
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: int32(sc.idx)}
	if err := syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_ADD, nc.fd, &ev); err != nil {
		l.dialFailsW[c.windowOf(now)].Add(1)
		l.mu.Lock()
		closeAbort(sc.fd)
		sc.fd = -1
		l.mu.Unlock()
		c.schedule(sc, time.Duration(delay)*time.Millisecond)
	}
}

// SetPhase starts phase i (1 ≤ i < MaxPhases) at sequence number firstSeq: deliveries of
// events from firstSeq on (until the next phase) are recorded in ClientStats.Phases[i].
func (c *Client) SetPhase(i int, firstSeq int64) { c.phaseFrom[i].Store(firstSeq) }

func (c *Client) phaseOf(seq int64) int {
	p := 0
	for i := 1; i < MaxPhases; i++ {
		if from := c.phaseFrom[i].Load(); from > 0 && seq >= from {
			p = i
		}
	}
	return p
}

// SetRef records event seq's reference time (UnixNano): per-delivery latency is measured from
// it (from the data's send timestamp when unset). Publisher.Mark.
func (c *Client) SetRef(seq, ns int64) {
	if seq > 0 && seq < int64(len(c.refs)) {
		c.refs[seq].Store(ns)
	}
}

// Have returns how many subscribers have received event seq so far.
func (c *Client) Have(seq int64) int {
	if seq <= 0 || seq >= int64(len(c.counts)) {
		return 0
	}
	return int(c.counts[seq].Load())
}

// WaitHave polls until want subscribers have seq or timeout passes; it reports success.
func (c *Client) WaitHave(seq int64, want int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for c.Have(seq) < want {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(200 * time.Microsecond)
	}
	return true
}

// WaitHaveProgress is WaitHave for a client that may be slow rather than short: it waits
// for want subscribers to have seq as long as deliveries go on, and gives up once stall
// passes without a delivery to any of its subscribers, or limit in all. Heartbeats are not
// deliveries: a stream that stops sending events stalls however alive its connections are.
func (c *Client) WaitHaveProgress(seq int64, want int, stall, limit time.Duration) bool {
	start := time.Now()
	seen, seenAt := c.Delivered(), start
	for c.Have(seq) < want {
		now := time.Now()
		if d := c.Delivered(); d != seen {
			seen, seenAt = d, now
		} else if now.Sub(seenAt) > stall {
			return false
		}
		if now.Sub(start) > limit {
			return false
		}
		time.Sleep(200 * time.Microsecond)
	}
	return true
}

// Conns is the number of open subscribers (reading and slow).
func (c *Client) Conns() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conns
}

// Delivered is the number of events received so far by all reading subscribers.
func (c *Client) Delivered() int64 {
	var n int64
	for _, l := range c.loops {
		n += l.events.Load()
	}
	return n
}

// ClientStats is what the client saw; call Stats after Close (the loops have stopped).
type ClientStats struct {
	Conns          int
	Events         int64 // deliveries (data lines) received
	Bytes, Reads   int64
	Comments       int64 // heartbeat and preamble comments
	Gaps, Dups     int64 // per connection, sequence numbers skipped / repeated
	ConnsWithGaps  int   // reading connections that skipped a sequence number
	Closed         int64 // connections the server closed
	Bad            int64
	Latency        Histogram            // per delivery, from the reference time (SetRef)
	Phases         [MaxPhases]Histogram // Latency split by the event's phase (SetPhase)
	First, Last    []int64              // per seq, merged over loops
	MinLastSeq     int64                // lowest last sequence number over reading connections
	ReadingConns   int
	ConnsBehindMax int // reading connections whose last seq is below the highest seen
	// Per time window (MarkWindow): each reading connection's longest wait for an event
	// (UnixNano durations, in the loops' order), the server's closes, the reopened
	// connections (Reconnect), failed attempts to reopen, events caught up by reopened
	// connections.
	MaxGaps                                   [MaxWindows][]int64
	ClosedW, ReopenedW, DialFailsW, CaughtUpW [MaxWindows]int64
	Reconnected                               int // connections reopened at least once
	LastSeqs                                  []int64
}

// Close stops the loops and closes every connection.
func (c *Client) Close() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	c.wg.Wait()
	if c.cfg.Reconnect {
		c.mu.Lock()
		for sc, t := range c.redial {
			if t.Stop() {
				c.dialWG.Done() // it will not run
			}
			delete(c.redial, sc)
		}
		c.mu.Unlock()
		c.dialWG.Wait()
	}
	for _, l := range c.loops {
		for _, sc := range l.conns {
			if sc.fd > 0 {
				closeAbort(sc.fd)
				sc.fd = -1
			}
		}
		syscall.Close(l.epfd)
	}
	for _, sc := range c.slow {
		if sc.fd > 0 {
			closeAbort(sc.fd)
			sc.fd = -1
		}
	}
}

// closeAbort closes with SO_LINGER 0 (RST): no TIME_WAIT left behind on the source ports.
func closeAbort(fd int) {
	_ = syscall.SetsockoptLinger(fd, syscall.SOL_SOCKET, syscall.SO_LINGER, &syscall.Linger{Onoff: 1, Linger: 0})
	syscall.Close(fd)
}

// Stats merges what the loops recorded. Call after Close.
func (c *Client) Stats() *ClientStats {
	st := &ClientStats{Conns: c.conns, MinLastSeq: -1}
	if len(c.loops) > 0 {
		st.First = make([]int64, len(c.loops[0].first))
		st.Last = make([]int64, len(c.loops[0].last))
	}
	var maxSeq int64
	for _, l := range c.loops {
		for _, sc := range l.conns {
			maxSeq = max(maxSeq, sc.lastSeq)
		}
	}
	for _, l := range c.loops {
		st.Events += l.events.Load()
		st.Bytes += l.bytes
		st.Reads += l.reads
		st.Closed += l.closed
		st.Bad += l.bad
		st.Latency.Merge(&l.hist)
		for i := range l.phases {
			st.Phases[i].Merge(&l.phases[i])
		}
		for i, v := range l.first {
			if v != 0 && (st.First[i] == 0 || v < st.First[i]) {
				st.First[i] = v
			}
			st.Last[i] = max(st.Last[i], l.last[i])
		}
		for w := range MaxWindows {
			st.ClosedW[w] += l.closedW[w].Load()
			st.ReopenedW[w] += l.reopenedW[w].Load()
			st.DialFailsW[w] += l.dialFailsW[w].Load()
			st.CaughtUpW[w] += l.caughtUpW[w].Load()
		}
		for _, sc := range l.conns {
			for w := range MaxWindows {
				st.MaxGaps[w] = append(st.MaxGaps[w], sc.maxGap[w])
			}
			if sc.reconnects > 0 {
				st.Reconnected++
			}
			st.LastSeqs = append(st.LastSeqs, sc.lastSeq)
			st.ReadingConns++
			st.Comments += sc.s.Comments
			st.Gaps += sc.gaps
			st.Dups += sc.dups
			if sc.gaps > 0 {
				st.ConnsWithGaps++
			}
			st.Bad += sc.s.Bad
			if st.MinLastSeq < 0 || sc.lastSeq < st.MinLastSeq {
				st.MinLastSeq = sc.lastSeq
			}
			if sc.lastSeq < maxSeq {
				st.ConnsBehindMax++
			}
		}
	}
	return st
}
