package engine

import (
	"bytes"
	"io"
	"log/slog"
	"strconv"
	"testing"

	"github.com/panjf2000/gnet/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/framing"
)

// sinkConn is a gnet.Conn whose socket takes everything at once (only what the hub calls is
// implemented; anything else panics through the nil embedded interface).
type sinkConn struct {
	gnet.Conn
	ctx     any
	written int
}

func (c *sinkConn) Write(b []byte) (int, error) { c.written += len(b); return len(b), nil }
func (c *sinkConn) Writev(bs [][]byte) (int, error) {
	n := 0
	for _, b := range bs {
		n += len(b)
	}
	c.written += n
	return n, nil
}
func (c *sinkConn) OutboundBuffered() int { return 0 }
func (c *sinkConn) SetContext(v any)      { c.ctx = v }
func (c *sinkConn) Context() any          { return c.ctx }

// hubFanout builds a server (not running) with n subscribed workers on one channel.
func hubFanout(tb testing.TB, n int) (*Server, *channel, []*sinkConn) {
	s, err := New(Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(tb, err)
	s.lsn.up = true
	conns := make([]*sinkConn, n)
	for i := range conns {
		conns[i] = &sinkConn{}
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
	s, ch, conns := hubFanout(t, 8)
	payload := bytes.Repeat([]byte("p"), 200)
	before := conns[0].written
	allocs := testing.AllocsPerRun(200, func() {
		s.hub.notify(ch, 42, payload)
		s.hub.notify(ch, 42, payload)
		s.hub.flush()
	})
	assert.Zero(t, allocs, "allocations per batch of two notifications to 8 workers")
	frame := framing.AppendNotify(nil, 42, []byte("fanout"), payload)
	assert.Equal(t, 201*2*len(frame), conns[0].written-before, "every notification reached the socket")
}

func BenchmarkHubNotify(b *testing.B) {
	for _, n := range []int{1, 64} {
		b.Run("workers="+strconv.Itoa(n), func(b *testing.B) {
			s, ch, _ := hubFanout(b, n)
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
