package engine

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/panjf2000/gnet/v2/pkg/socket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The admin endpoint's listener stops accepting at --admin-max-connections (the rest wait in
// the kernel's backlog) instead of accepting and closing; a closed connection frees its slot.
func TestAdminListenerCap(t *testing.T) {
	s, err := New(Config{AdminMaxConnections: 2, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ln := s.AdminListener(raw)
	defer ln.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	var clients []net.Conn
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", raw.Addr().String())
		require.NoError(t, err, "the kernel completes the handshake; the backlog holds the third")
		defer c.Close()
		clients = append(clients, c)
	}
	first, second := <-accepted, <-accepted
	select {
	case c := <-accepted:
		t.Fatalf("a third connection was accepted over the cap: %v", c.RemoteAddr())
	case <-time.After(200 * time.Millisecond):
	}
	require.NoError(t, first.Close())
	_ = first.Close() // closing twice gives back one slot, not two
	select {
	case third := <-accepted:
		defer third.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("a freed slot did not let the third connection in")
	}
	fourth, err := net.Dial("tcp", raw.Addr().String())
	require.NoError(t, err)
	defer fourth.Close()
	select {
	case c := <-accepted:
		t.Fatalf("a fourth connection was accepted over the cap: %v", c.RemoteAddr())
	case <-time.After(200 * time.Millisecond):
	}
	second.Close()
	select {
	case c := <-accepted:
		defer c.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("the fourth connection did not get the freed slot")
	}
	require.NoError(t, ln.Close())
	_, open := <-accepted
	assert.False(t, open, "Accept returns once the listener is closed")
	_ = clients
}

// Accept errors are classified for pgsse_accept_errors_total.
func TestAcceptReason(t *testing.T) {
	for err, want := range map[error]int{
		&net.OpError{Op: "accept", Err: os.NewSyscallError("accept4", syscall.EMFILE)}:  acceptEMFILE,
		&net.OpError{Op: "accept", Err: os.NewSyscallError("accept4", syscall.ENFILE)}:  acceptENFILE,
		&net.OpError{Op: "accept", Err: os.NewSyscallError("accept4", syscall.ENOBUFS)}: acceptENOMEM,
		os.NewSyscallError("dup", syscall.EMFILE):                                       acceptEMFILE,
		io.ErrUnexpectedEOF: acceptOther,
	} {
		assert.Equal(t, want, acceptReason(err), "%v", err)
	}
}

// countingHandler signals each connection gnet opens, and closes it at once.
type countingHandler struct {
	gnet.BuiltinEventEngine
	eng    gnet.Engine
	booted chan struct{}
	ready  chan struct{}
	once   bool
	opened chan struct{}
}

func (h *countingHandler) OnBoot(eng gnet.Engine) gnet.Action {
	h.eng = eng
	close(h.booted)
	return gnet.None
}
func (h *countingHandler) OnOpen(gnet.Conn) ([]byte, gnet.Action) {
	h.opened <- struct{}{}
	return nil, gnet.Close
}
func (h *countingHandler) OnTick() (time.Duration, gnet.Action) {
	if !h.once {
		h.once = true
		close(h.ready)
	}
	return time.Hour, gnet.None
}

// acceptDialers is how many clients BenchmarkAccept connects with at once.
const acceptDialers = 16

// BenchmarkAccept compares the cost of one accepted connection through gnet's own acceptor
// with pgsse's (accept.go: net.Listener, then Engine.Register, which dups the descriptor and
// opens it on the loop): the process's CPU per connection (clients included, the same in
// both) while 16 clients connect at once, until OnOpen has run for every connection; the
// loop closes each at once.
func BenchmarkAccept(b *testing.B) {
	run := func(b *testing.B, own bool) {
		h := &countingHandler{booted: make(chan struct{}), ready: make(chan struct{}), opened: make(chan struct{}, 1024)}
		probe, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(b, err)
		addr := probe.Addr().String()
		probe.Close()
		var gnetAddr string
		var placeholder *placeholderListener
		if own {
			placeholder, err = newPlaceholder()
			require.NoError(b, err)
			gnetAddr = placeholder.addr()
		} else {
			gnetAddr = "tcp://" + addr
		}
		done := make(chan error, 1)
		go func() {
			done <- gnet.Run(h, gnetAddr, gnet.WithNumEventLoop(1), gnet.WithTicker(true),
				gnet.WithLoadBalancing(gnet.LeastConnections), gnet.WithLogger(gnetLogger{slog.New(slog.NewTextHandler(io.Discard, nil))}))
		}()
		<-h.ready
		if own {
			s, err := New(Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			require.NoError(b, err)
			s.eng = h.eng
			require.NoError(b, placeholder.seal(h.eng))
			ln, err := listenSSE(addr, false, DefaultSSESendBuffer)
			require.NoError(b, err)
			var open atomic.Int64
			a := s.newAcceptor("bench", ln, originSSE, &open, func() int64 { return 1 << 30 })
			a.start()
			defer a.close()
		}
		cpu0 := processCPU()
		b.ResetTimer()
		// acceptDialers clients connect at once, as in a reconnect storm (one at a time, every
		// hand-over between goroutines would be a wake-up of its own).
		work := make(chan struct{}, b.N)
		for range b.N {
			work <- struct{}{}
		}
		close(work)
		var wg sync.WaitGroup
		for range acceptDialers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range work {
					c, err := net.Dial("tcp", addr)
					if err != nil {
						b.Error(err)
						return
					}
					c.Close()
				}
			}()
		}
		for range b.N {
			<-h.opened
		}
		wg.Wait()
		b.StopTimer()
		b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		require.NoError(b, h.eng.Stop(context.Background()))
		<-done
	}
	b.Run("gnet", func(b *testing.B) { run(b, false) })
	b.Run("pgsse", func(b *testing.B) { run(b, true) })
}

// processCPU is the process's user and system CPU time so far, in nanoseconds.
func processCPU() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// The placeholder's socket, once sealed, receives nothing anybody else sends it: gnet's
// listener never has anything to act on.
func TestPlaceholderSealed(t *testing.T) {
	p, err := newPlaceholder()
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(p.addr(), "udp://127.0.0.1:"), p.addr())
	pc, err := net.ListenPacket("udp4", p.hostPort) // stands in for gnet's listener
	require.NoError(t, err)
	defer pc.Close()
	raw, err := pc.(*net.UDPConn).SyscallConn()
	require.NoError(t, err)
	var serr error
	require.NoError(t, raw.Control(func(fd uintptr) { serr = connectToSelf(int(fd)) }))
	require.NoError(t, serr)
	sender, err := net.Dial("udp4", p.hostPort)
	require.NoError(t, err)
	defer sender.Close()
	_, _ = sender.Write([]byte("anyone there?"))
	require.NoError(t, pc.SetReadDeadline(time.Now().Add(200*time.Millisecond)))
	_, _, err = pc.ReadFrom(make([]byte, 64))
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	assert.True(t, ne.Timeout(), "nothing arrives: %v", err)
}

// The connections accepted on one address report one *net.TCPAddr for their local address and
// a 6-byte peerAddr4 for an IPv4 peer's — the addresses gnet keeps for as long as they are
// open (issue 25: two 48-byte TCPAddrs and two 32-byte sockaddrs per connection otherwise) —
// and both read as before.
func TestConnAddrsAreSmall(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	var addrs connAddrs
	var accepted []net.Conn
	for range 3 {
		d, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		defer d.Close()
		c, err := ln.Accept()
		require.NoError(t, err)
		defer c.Close()
		local, remote := c.LocalAddr().String(), c.RemoteAddr().String()
		addrs.share(c)
		assert.Equal(t, local, c.LocalAddr().String())
		assert.Equal(t, remote, c.RemoteAddr().String())
		assert.Equal(t, d.LocalAddr().String(), c.RemoteAddr().String())
		assert.Equal(t, "tcp", c.RemoteAddr().Network())
		accepted = append(accepted, c)
	}
	require.True(t, addrsOK, "this Go's net.TCPConn has no conn.fd.laddr and raddr: the addresses are no longer made small")
	assert.Same(t, accepted[0].LocalAddr(), accepted[1].LocalAddr(), "one address object for every connection")
	assert.Same(t, accepted[0].LocalAddr(), accepted[2].LocalAddr())
	assert.Len(t, accepted[0].LocalAddr().(*net.TCPAddr).IP, net.IPv4len)
	assert.IsType(t, peerAddr4{}, accepted[0].RemoteAddr())
	sa, _, _, _, err := socket.GetTCPSockAddr(accepted[0].RemoteAddr().Network(), accepted[0].RemoteAddr().String())
	require.NoError(t, err, "what gnet's Register makes of the peer's address")
	assert.Equal(t, accepted[0].RemoteAddr().String(), socket.SockaddrToTCPOrUnixAddr(sa).String())

	// A connection handed over (net.FileConn, as Adopt makes them) gets them too.
	f, err := accepted[0].(*net.TCPConn).File()
	require.NoError(t, err)
	fc, err := net.FileConn(f)
	require.NoError(t, err)
	_ = f.Close()
	defer fc.Close()
	addrs.share(fc)
	assert.Same(t, accepted[0].LocalAddr(), fc.LocalAddr())
	assert.Equal(t, accepted[0].RemoteAddr(), fc.RemoteAddr())
}

// An IPv6 peer keeps its TCPAddr, its IP copied out of the accept's sockaddr.
func TestConnAddrsIPv6Peer(t *testing.T) {
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skip("no IPv6 loopback:", err)
	}
	defer ln.Close()
	d, err := net.Dial("tcp6", ln.Addr().String())
	require.NoError(t, err)
	defer d.Close()
	c, err := ln.Accept()
	require.NoError(t, err)
	defer c.Close()
	remote := c.RemoteAddr().String()
	var addrs connAddrs
	addrs.share(c)
	assert.Equal(t, remote, c.RemoteAddr().String())
	assert.IsType(t, &net.TCPAddr{}, c.RemoteAddr())
}
