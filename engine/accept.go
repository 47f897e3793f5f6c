package engine

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/panjf2000/gnet/v2"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// Accepting connections (docs/operations.md, Many connections: limits and kernel settings). gnet
// v2.9.7's acceptor treats an accept error such as EMFILE as fatal (acceptor_unix.go:
// ErrAcceptSocket stops the loop and the process exits), so pgsse owns its accepts: an acceptor
// per listening socket (the SSE --listen socket, the hub's Unix socket) accepts with the net
// package on its own goroutine and hands each connection to the loop with gnet.Engine.Register —
// which dups the descriptor, closes ours and runs OnOpen on the loop — at most a window of
// connections in flight, so the loop takes on at most that many new connections per pass;
// connections accepted meanwhile wait in the acceptor's queue rather than in the kernel's
// backlog, which drops SYNs once full (the clients then retry after 1 s, 3 s, 7 s…). gnet keeps
// only a placeholder listener that accepts nothing (Register needs one).
//
// When accept fails with EMFILE or ENFILE the server keeps serving what it has: the acceptor
// closes its reserve descriptor, accepts the waiting connection and closes it at once (shed:
// the client sees the connection end rather than hang in the backlog), takes the reserve back,
// counts pgsse_accept_errors_total{reason}, backs off accepting (acceptBackoffMin doubling to
// acceptBackoffMax) and logs at most one line per acceptLogEvery. The admin endpoint's
// listener (AdminListener) follows the same policy, with a cap on its connections.
//
// The --listen socket is bound with SO_REUSEPORT so that the processes of --procs can share
// it; without Config.ShareListen an address another socket already holds is refused first.

// Accept policy.
const (
	// acceptWindow: connections being registered with gnet and not yet opened on the loop, per
	// listener — a thirty-second of the descriptor limit, between these bounds (FDBudget).
	acceptWindowMin  = 16
	acceptWindowMax  = 256
	acceptBackoffMin = 5 * time.Millisecond  // first pause after a failed accept
	acceptBackoffMax = time.Second           // longest pause
	acceptLogEvery   = 10 * time.Second      // at most one log line per listener this often
	acceptShedWait   = 10 * time.Millisecond // how long the shedding accept waits for the waiting connection
)

// origin says which listener a connection came in on; it is the connection's context when
// OnOpen runs (gnet.NewContext), so the handler knows what to make of it.
type origin uint8

const (
	originSSE     origin = iota + 1 // the --listen socket
	originHub                       // the hub's Unix socket
	originAnchor                    // the loop's own anchor connection (loop.go)
	originSibling                   // a --procs sibling's hub connection, enrolled by AddSibling (hubserver.go)
)

// Reasons of pgsse_accept_errors_total.
const (
	acceptEMFILE = iota // the process's descriptor limit
	acceptENFILE        // the system's descriptor limit
	acceptENOMEM        // ENOBUFS or ENOMEM
	acceptEnroll        // handing the connection to the loop failed
	acceptOther
	acceptReasons
)

var acceptReasonLabels = [acceptReasons]string{"emfile", "enfile", "enomem", "enroll", "other"}

// acceptReason classifies an accept (or dup) error.
func acceptReason(err error) int {
	switch {
	case errors.Is(err, syscall.EMFILE):
		return acceptEMFILE
	case errors.Is(err, syscall.ENFILE):
		return acceptENFILE
	case errors.Is(err, syscall.ENOBUFS), errors.Is(err, syscall.ENOMEM):
		return acceptENOMEM
	}
	return acceptOther
}

// acceptGuard is what every listener does when accept fails: shed with the reserve
// descriptor on EMFILE/ENFILE, count, log at most once per acceptLogEvery, back off. The
// accepting goroutine alone uses the reserve and the back-off; report may also be called by
// the goroutine that hands connections to the loop.
type acceptGuard struct {
	name    string // the flag and address, for the log: "--listen 127.0.0.1:8080"
	spare   int    // the reserve descriptor (/dev/null), -1 while not held
	backoff time.Duration
	log     *slog.Logger
	errors  *[acceptReasons]prometheus.Counter
	mu      sync.Mutex // report is called by the accepting and the enrolling goroutine
	logged  time.Time  // when the last line was logged
	quiet   int        // failures since then, not logged
}

func newAcceptGuard(name string, log *slog.Logger, errs *[acceptReasons]prometheus.Counter) *acceptGuard {
	g := &acceptGuard{name: name, spare: -1, log: log, errors: errs}
	g.takeSpare()
	return g
}

func (g *acceptGuard) takeSpare() {
	if g.spare >= 0 {
		return
	}
	if fd, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
		g.spare = fd
	}
}

func (g *acceptGuard) close() {
	if g.spare >= 0 {
		_ = unix.Close(g.spare)
		g.spare = -1
	}
}

// accepted resets the back-off after a successful accept.
func (g *acceptGuard) accepted() {
	g.backoff = 0
	g.takeSpare()
}

// failed handles an accept error on ln: false when ln is closed (stop accepting). Otherwise
// it counts the error, sheds one waiting connection on EMFILE/ENFILE, logs (rate-limited)
// and pauses; stop cuts the pause short.
func (g *acceptGuard) failed(ln net.Listener, err error, stop <-chan struct{}) bool {
	if errors.Is(err, net.ErrClosed) {
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true // a deadline we set (shedding)
	}
	reason := acceptReason(err)
	g.errors[reason].Inc()
	shed := false
	if reason == acceptEMFILE || reason == acceptENFILE {
		shed = g.shed(ln)
	}
	g.backoff = min(max(2*g.backoff, acceptBackoffMin), acceptBackoffMax)
	g.report(err, reason, shed)
	t := time.NewTimer(g.backoff)
	defer t.Stop()
	select {
	case <-stop:
		return false
	case <-t.C:
	}
	return true
}

// shed frees the reserve descriptor, accepts one waiting connection and closes it, then takes
// the reserve back. It reports whether a connection was shed.
func (g *acceptGuard) shed(ln net.Listener) bool {
	if g.spare < 0 {
		g.takeSpare() // another goroutine took the number last time; try to hold one again
		return false
	}
	_ = unix.Close(g.spare)
	g.spare = -1
	defer g.takeSpare()
	dl, ok := ln.(interface{ SetDeadline(time.Time) error })
	if !ok {
		return false
	}
	_ = dl.SetDeadline(time.Now().Add(acceptShedWait))
	defer dl.SetDeadline(time.Time{})
	c, err := ln.Accept()
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// report logs an accept failure at most once per acceptLogEvery, saying what happened and
// what pgsse does about it.
func (g *acceptGuard) report(err error, reason int, shed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	if now.Sub(g.logged) < acceptLogEvery {
		g.quiet++
		return
	}
	what := "accept failed; backing off"
	switch reason {
	case acceptEMFILE:
		what = "out of file descriptors (RLIMIT_NOFILE " + strconv.FormatUint(FDLimit(), 10) +
			"): serving the connections already open, shedding new ones and backing off; raise the limit (ulimit -n, LimitNOFILE=) or lower --max-connections"
	case acceptENFILE:
		what = "the system is out of file descriptors (fs.file-max): serving the connections already open, shedding new ones and backing off"
	}
	g.log.Error("cannot accept on "+g.name+": "+what, "err", err, "shed", shed,
		"backoff", g.backoff.String(), "failures_not_logged", g.quiet)
	g.logged, g.quiet = now, 0
}

// acceptor accepts on one listener and hands connections to the loop: one goroutine accepts
// as fast as the kernel gives connections (so its backlog never overflows into dropped SYNs
// and clients retrying a second later) into a queue of at most acceptQueue; another takes them
// from the queue and registers them with gnet, window in flight.
type acceptor struct {
	srv    *Server
	ln     net.Listener
	origin origin
	guard  *acceptGuard
	ctx    context.Context // carries origin for OnOpen
	// open and limit: connections of this kind open on the loop, and how many may be open,
	// queued and in flight together; beyond it a new connection is closed at once, unread.
	open    *atomic.Int64
	limit   func() int64
	pending atomic.Int64 // accepted, not yet opened on the loop (queued or in flight)
	window  int          // Register calls in flight at most (Config.acceptWindow)
	queue   chan net.Conn
	stop    chan struct{}
	done    sync.WaitGroup
	// inflight: Register results not yet received, oldest first (enroll goroutine only).
	inflight []<-chan gnet.RegisteredResult
	burst    acceptBurst
}

// acceptBurst tells keepMemory (budget.go) when a burst of accepts is over: once at least
// burstConns connections were accepted and none for burstQuiet, the garbage their setup left
// (request heads, token checks, gnet's hand-over) is collected and given back to the
// operating system (rate-limited there), instead of staying resident beside the idle
// connections — up to twice their live heap with GOGC=100 (issue 25).
type acceptBurst struct {
	n      atomic.Int64 // accepted since the last notice
	last   atomic.Int64 // when the last one was accepted, unix ns
	timer  *time.Timer  // armed once n reaches burstConns (the accepting goroutine, then the timer's)
	notify func()
}

const (
	burstConns = 1000
	burstQuiet = time.Second
)

// accepted counts one accepted connection (the accepting goroutine).
func (b *acceptBurst) accepted() {
	if b.notify == nil {
		return
	}
	b.last.Store(time.Now().UnixNano())
	if b.n.Add(1) == burstConns {
		if b.timer == nil {
			b.timer = time.AfterFunc(burstQuiet, b.check)
		} else {
			b.timer.Reset(burstQuiet)
		}
	}
}

// check runs on the timer: the burst is over once nothing was accepted for burstQuiet.
func (b *acceptBurst) check() {
	if wait := burstQuiet - time.Since(time.Unix(0, b.last.Load())); wait > 0 {
		b.timer.Reset(wait)
		return
	}
	b.n.Store(0)
	b.notify()
}

// acceptQueue bounds the accepted connections waiting to be handed to the loop, per listener
// (they also count against the listener's limit, which the descriptor budget covers).
const acceptQueue = 4096

func (s *Server) newAcceptor(name string, ln net.Listener, o origin, open *atomic.Int64, limit func() int64) *acceptor {
	return &acceptor{
		srv: s, ln: ln, origin: o, open: open, limit: limit, window: s.cfg.acceptWindow,
		guard: newAcceptGuard(name, s.log, &s.metrics.acceptErrors),
		ctx:   gnet.NewContext(context.Background(), o),
		queue: make(chan net.Conn, acceptQueue),
		stop:  make(chan struct{}),
		burst: acceptBurst{notify: s.out.heapToGiveBack},
	}
}

// start runs the two goroutines until close.
func (a *acceptor) start() {
	a.done.Add(2)
	go a.accept()
	go a.enroll()
}

// accept accepts until the listener is closed.
func (a *acceptor) accept() {
	defer a.done.Done()
	defer close(a.queue)
	defer a.guard.close()
	for {
		c, err := a.ln.Accept()
		if err != nil {
			if !a.guard.failed(a.ln, err, a.stop) {
				return
			}
			continue
		}
		a.guard.accepted()
		a.burst.accepted()
		if a.open.Load()+a.pending.Load() >= a.limit() {
			// Far over the limit: do not even read the request; keep descriptors for others.
			a.srv.metrics.shed[shedOverCapacity].Inc()
			_ = c.Close()
			continue
		}
		a.pending.Add(1)
		select {
		case a.queue <- c:
		case <-a.stop:
			_ = c.Close()
			return
		}
	}
}

// enroll hands queued connections to the loop, window at a time; once stopping, it
// closes what is left.
func (a *acceptor) enroll() {
	defer a.done.Done()
	for c := range a.queue {
		if !a.collect(len(a.inflight) >= a.window) {
			_ = c.Close()
			a.pending.Add(-1)
			continue // stopping: close the rest
		}
		a.srv.sseAddrs.share(c) // not a hub socket's: share takes TCP connections only
		res, err := a.srv.eng.Register(gnet.NewNetConnContext(a.ctx, c))
		if err != nil {
			_ = c.Close()
			a.pending.Add(-1)
			a.enrollFailed(err)
			continue
		}
		a.inflight = append(a.inflight, res)
		a.collect(false)
	}
}

// collect receives the Register results that are in, oldest first; with wait it blocks for
// the oldest. It reports false if stop came first.
func (a *acceptor) collect(wait bool) bool {
	for len(a.inflight) > 0 {
		var r gnet.RegisteredResult
		select {
		case r = <-a.inflight[0]:
		default:
			if !wait {
				return true
			}
			select {
			case r = <-a.inflight[0]:
			case <-a.stop:
				return false
			}
		}
		wait = false
		a.inflight[0] = nil
		a.inflight = a.inflight[1:]
		a.pending.Add(-1) // opened on the loop (counted in open now), or failed
		if r.Err != nil {
			a.enrollFailed(r.Err) // gnet has closed the connection
		}
	}
	a.inflight = a.inflight[:0:0]
	return true
}

// enrollFailed counts a connection gnet could not take (its dup failed, or the engine is
// stopping) — the connection is closed — and logs like a failed accept.
func (a *acceptor) enrollFailed(err error) {
	reason := acceptReason(err)
	if reason == acceptOther {
		reason = acceptEnroll
	}
	a.srv.metrics.acceptErrors[reason].Inc()
	a.guard.report(err, reason, true)
}

// close stops accepting and waits for the goroutines.
func (a *acceptor) close() {
	close(a.stop)
	_ = a.ln.Close()
	a.done.Wait()
	if a.burst.timer != nil {
		a.burst.timer.Stop()
	}
}

// listenSSE binds --listen: TCP with SO_REUSEPORT (for --procs). Unless share, an address
// another socket already holds is refused first (SO_REUSEPORT would quietly share it).
// sendBuffer, unless NoLimit, is Config.SSESendBuffer: the listener's SO_SNDBUF is set to half
// of it (Linux doubles it), which every accepted socket inherits — fixed, so the kernel never
// grows it — at no cost per accept.
func listenSSE(addr string, share bool, sendBuffer int) (net.Listener, error) {
	if _, port, _ := net.SplitHostPort(addr); !share && port != "0" {
		probe, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, err
		}
		_ = probe.Close()
	}
	lc := net.ListenConfig{
		KeepAlive: -1, // heartbeat writes find dead peers; no keep-alive syscalls per accept
		Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
				if serr == nil && sendBuffer != NoLimit {
					serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, sendBuffer/2)
				}
			})
			return errors.Join(err, serr)
		},
	}
	return lc.Listen(context.Background(), "tcp", addr)
}

// placeholderListener is the gnet engine's listener: gnet needs one for Engine.Register, and
// pgsse's own acceptors do the accepting. It is a UDP socket on a free loopback port (nothing
// to accept, so nothing for gnet's acceptor to fail on; no file, so it works in a read-only
// image without /tmp), connected to itself once gnet has started (seal), after which the
// kernel drops every datagram anyone else sends it. The port makes the address unique, which
// gnet's process-wide map of engines needs (Run deletes its entry).
type placeholderListener struct{ hostPort string }

func newPlaceholder() (*placeholderListener, error) {
	c, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return &placeholderListener{hostPort: c.LocalAddr().String()}, nil
}

func (p *placeholderListener) addr() string { return "udp://" + p.hostPort }

// seal connects the socket to itself: from then on it receives nothing.
func (p *placeholderListener) seal(eng gnet.Engine) error {
	fd, err := eng.DupListener("udp", p.hostPort)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return connectToSelf(fd)
}

// connectToSelf connects a UDP socket to its own address: it then receives only what it sends
// itself.
func connectToSelf(fd int) error {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return err
	}
	return unix.Connect(fd, sa)
}

// AdminListener wraps the admin endpoint's listener (cmd/pgsse) with the accept policy of the
// other listeners: at most Config.AdminMaxConnections connections open at once — at the cap
// it stops accepting (the kernel's backlog holds the rest) rather than accept and close — and
// EMFILE/ENFILE are contained, counted and logged as for the SSE port.
func (s *Server) AdminListener(ln net.Listener) net.Listener {
	return &adminListener{
		Listener: ln,
		slots:    make(chan struct{}, s.cfg.AdminMaxConnections),
		guard:    newAcceptGuard("--admin-listen "+ln.Addr().String(), s.log, &s.metrics.acceptErrors),
		stop:     make(chan struct{}),
	}
}

type adminListener struct {
	net.Listener
	slots    chan struct{}
	mu       sync.Mutex // one Accept at a time (the guard is not concurrent)
	guard    *acceptGuard
	stop     chan struct{}
	stopOnce sync.Once
}

func (l *adminListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.stop:
		return nil, net.ErrClosed
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			l.guard.accepted()
			return &adminConn{Conn: c, slots: l.slots}, nil
		}
		if !l.guard.failed(l.Listener, err, l.stop) {
			<-l.slots
			return nil, err
		}
	}
}

func (l *adminListener) Close() error {
	l.stopOnce.Do(func() { close(l.stop) })
	err := l.Listener.Close()
	l.mu.Lock()
	l.guard.close()
	l.mu.Unlock()
	return err
}

// adminConn gives its slot back once, when closed.
type adminConn struct {
	net.Conn
	slots chan struct{}
	once  sync.Once
}

func (c *adminConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { <-c.slots })
	return err
}

// connAddrs makes the addresses an SSE connection keeps while it is open small (issue 25: an
// idle connection's bytes). gnet v2.9.7's Register keeps both addresses of the net.TCPConn it
// is handed (eventloop_unix.go, enroll: newStreamConn(…, c.LocalAddr(), c.RemoteAddr())), and
// the net package's accept made each connection two 48-byte TCPAddrs whose IPs are slices of
// the 32-byte sockaddrs accept and getsockname returned: 160 B per connection, in the size
// classes gnet's hand-over leaves most of its garbage in (48 and 32 B), so that each one kept
// a span of that garbage resident. share, before the connection is handed to gnet, makes its
// local address the table's one for that address (every connection of a listener has the same
// one unless the listener is on a wildcard address) and an IPv4 peer's address a peerAddr4 (6
// bytes); another peer's address keeps its TCPAddr, with its IP copied out of the sockaddr.
// pgsse never asks a connection for its addresses, but they read as before.
//
// Register takes a *net.TCPConn and nothing else for TCP, and the net package has no way to
// say which address objects a connection reports, so share writes them into the connection's
// netFD while the acceptor still owns it: the fields are found by name and type once
// (addrFields), and a Go release that moves them makes share copy the IPs only
// (TestConnAddrsAreSmall fails then, so it does not go unnoticed). The shared addresses are
// never written after they are made.
type connAddrs struct {
	mu     sync.Mutex
	shared map[netip.AddrPort]*net.TCPAddr
}

// maxLocalAddrs bounds connAddrs's table (a wildcard listener on a host with many addresses:
// the connections to the others keep their own).
const maxLocalAddrs = 64

// peerAddr4 is an IPv4 peer's address as an SSE connection reports it (connAddrs): 6 bytes,
// where a TCPAddr is 48 and keeps the sockaddr its IP points into.
type peerAddr4 struct {
	ip   [4]byte
	port uint16
}

// Network implements net.Addr, as net.TCPAddr does.
func (a peerAddr4) Network() string { return "tcp" }

// String implements net.Addr, as net.TCPAddr does (gnet resolves it once, in Register).
func (a peerAddr4) String() string {
	return netip.AddrPortFrom(netip.AddrFrom4(a.ip), a.port).String()
}

// addrFields is the offset of net.TCPConn's netFD pointer (conn.fd) and, in the netFD, of its
// local and remote addresses (laddr, raddr: net.Addr); ok is false if this Go's net package
// does not have them.
func addrFields() (fd, laddr, raddr uintptr, ok bool) {
	c, ok1 := reflect.TypeFor[net.TCPConn]().FieldByName("conn")
	if !ok1 || c.Type.Kind() != reflect.Struct {
		return 0, 0, 0, false
	}
	f, ok1 := c.Type.FieldByName("fd")
	if !ok1 || f.Type.Kind() != reflect.Pointer || f.Type.Elem().Kind() != reflect.Struct || f.Type.Elem().Name() != "netFD" {
		return 0, 0, 0, false
	}
	l, ok1 := f.Type.Elem().FieldByName("laddr")
	r, ok2 := f.Type.Elem().FieldByName("raddr")
	addr := reflect.TypeFor[net.Addr]()
	if !ok1 || !ok2 || l.Type != addr || r.Type != addr {
		return 0, 0, 0, false
	}
	return c.Offset + f.Offset, l.Offset, r.Offset, true
}

// addrFD, laddrAt, raddrAt and addrsOK are addrFields's answer, worked out once.
var addrFD, laddrAt, raddrAt, addrsOK = addrFields()

// share makes c's addresses small (connAddrs), if c is a TCP connection nobody else holds yet
// (the acceptor's, before Register). A local address with a zone keeps its own (gnet hands a
// zone's bytes back to a pool when a connection closes: a shared one would go back once per
// connection).
func (t *connAddrs) share(c net.Conn) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	var la, ra *net.Addr // the netFD's fields, if they are where LocalAddr and RemoteAddr read
	if addrsOK {
		if fd := *(*unsafe.Pointer)(unsafe.Add(unsafe.Pointer(tc), addrFD)); fd != nil {
			la, ra = (*net.Addr)(unsafe.Add(fd, laddrAt)), (*net.Addr)(unsafe.Add(fd, raddrAt))
			if *la != tc.LocalAddr() || *ra != tc.RemoteAddr() {
				la, ra = nil, nil
			}
		}
	}
	if a, ok := tc.LocalAddr().(*net.TCPAddr); ok {
		if s := t.local(a); s != nil && la != nil {
			*la = s
		} else {
			a.IP = slices.Clone(a.IP)
		}
	}
	if a, ok := tc.RemoteAddr().(*net.TCPAddr); ok {
		if ip4 := a.IP.To4(); ip4 != nil && a.Zone == "" && ra != nil {
			*ra = peerAddr4{ip: [4]byte(ip4), port: uint16(a.Port)}
		} else {
			a.IP = slices.Clone(a.IP)
		}
	}
}

// local is the table's address equal to a (nil: a has a zone, or the table is full).
func (t *connAddrs) local(a *net.TCPAddr) *net.TCPAddr {
	if a.Zone != "" {
		return nil
	}
	ap := a.AddrPort()
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.shared[ap]
	if s == nil && len(t.shared) < maxLocalAddrs {
		if t.shared == nil {
			t.shared = map[netip.AddrPort]*net.TCPAddr{}
		}
		s = &net.TCPAddr{IP: net.IP(ap.Addr().Unmap().AsSlice()), Port: a.Port}
		t.shared[ap] = s
	}
	return s
}
