package engine

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pgsse/pgsse/framing"
)

// sinkConn is a gnet.Conn on one end of a socketpair whose other end a goroutine reads as fast
// as it can (the hub writes to the socket itself); only what the hub calls is implemented,
// anything else panics through the nil embedded interface. With keep, what it read is kept.
type sinkConn struct {
	gnet.Conn
	ctx     any
	fd      int
	written atomic.Int64 // bytes the other end has read
	mu      sync.Mutex
	keep    bool
	got     []byte
}

func newSinkConn(tb testing.TB, keep bool) *sinkConn {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(tb, err)
	require.NoError(tb, unix.SetNonblock(fds[0], true))
	c := &sinkConn{fd: fds[0], keep: keep}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			n, err := unix.Read(fds[1], buf)
			if n <= 0 || err != nil {
				return
			}
			if c.keep {
				c.mu.Lock()
				c.got = append(c.got, buf[:n]...)
				c.mu.Unlock()
			}
			c.written.Add(int64(n))
		}
	}()
	tb.Cleanup(func() {
		_ = unix.Close(fds[0])
		<-done
		_ = unix.Close(fds[1])
	})
	return c
}

// newNullConn is a sinkConn on /dev/null: every write is taken at once, for the price of the
// syscall (benchmarks).
func newNullConn(tb testing.TB) *sinkConn {
	fd, err := unix.Open(os.DevNull, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = unix.Close(fd) })
	return &sinkConn{fd: fd}
}

func (c *sinkConn) Fd() int               { return c.fd }
func (c *sinkConn) Close() error          { return nil }
func (c *sinkConn) InboundBuffered() int  { return 0 }
func (c *sinkConn) OutboundBuffered() int { return 0 }
func (c *sinkConn) SetContext(v any)      { c.ctx = v }
func (c *sinkConn) Context() any          { return c.ctx }

// received is what the other end has read so far (keep).
func (c *sinkConn) received() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]byte(nil), c.got...)
}

// flushAll writes until every worker's ring is empty (a server that is not running has no
// ticks and no writability set).
func flushAll(tb testing.TB, s *Server) {
	tb.Helper()
	waitFor(tb, 10*time.Second, "the rings written", func() bool {
		s.hub.flush()
		for _, w := range s.hub.workers {
			if w.out.Len() > 0 {
				return false
			}
		}
		return true
	})
}

// hubFanout builds a server (not running) with n subscribed workers on one channel, on
// socketpairs read as fast as they can (null: on /dev/null).
func hubFanout(tb testing.TB, n int, null bool) (*Server, *channel, []*sinkConn) {
	s, err := New(Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(tb, err)
	s.lsn.up = true
	conns := make([]*sinkConn, n)
	for i := range conns {
		if null {
			conns[i] = newNullConn(tb)
		} else {
			conns[i] = newSinkConn(tb, false)
		}
		_, action := s.hub.accept(conns[i], false)
		require.Equal(tb, gnet.None, action)
		w := conns[i].ctx.(*worker)
		w.hello = true
		mode := framing.ModeLossless
		if i%2 == 1 {
			mode = framing.ModeWake
		}
		s.hub.sub(w, 1, mode, []byte("fanout"))
	}
	ch := s.chans.byName["fanout"]
	require.NotNil(tb, ch)
	s.chans.live(ch) // the LISTEN "completed": every SUB is ACKed
	s.hub.flush()
	return s, ch, conns
}

// TestHubNotifyAllocs pins the hub's fan-out: one encoding per notification, copied into each
// worker's ring and handed to the socket, with no allocation per notification or delivery.
func TestHubNotifyAllocs(t *testing.T) {
	s, ch, conns := hubFanout(t, 8, false)
	payload := bytes.Repeat([]byte("p"), 200)
	flushAll(t, s)
	waitFor(t, 10*time.Second, "the ACKs read", func() bool { return conns[0].written.Load() > 0 })
	before := conns[0].written.Load()
	allocs := testing.AllocsPerRun(200, func() {
		s.hub.notify(ch, 42, payload)
		s.hub.notify(ch, 42, payload)
		s.hub.flush()
	})
	assert.Zero(t, allocs, "allocations per batch of two notifications to 8 workers")
	flushAll(t, s)
	frame := framing.AppendNotify(nil, 42, []byte("fanout"), payload)
	waitFor(t, 10*time.Second, "every notification read", func() bool { return conns[0].written.Load()-before >= int64(201*2*len(frame)) })
	assert.EqualValues(t, 201*2*len(frame), conns[0].written.Load()-before, "every notification reached the socket")
}

func BenchmarkHubNotify(b *testing.B) {
	for _, n := range []int{1, 64} {
		b.Run("workers="+strconv.Itoa(n), func(b *testing.B) {
			s, ch, _ := hubFanout(b, n, true)
			payload := bytes.Repeat([]byte("p"), 200)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				s.hub.notify(ch, 42, payload)
				s.hub.flush()
			}
		})
	}
}
