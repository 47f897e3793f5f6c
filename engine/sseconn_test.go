package engine

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// recordConn is a gnet.Conn over one end of a socket pair, recording what reaches the other
// end and whether it was closed (only what the state machine calls is implemented).
type recordConn struct {
	gnet.Conn
	ctx     any
	fd      int // ours: the engine writes here (outbound.go writes to the descriptor)
	peer    int // the other end: what arrived is read from here
	written strings.Builder
	closed  bool
}

func newRecordConn(t *testing.T) *recordConn {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	return &recordConn{fd: fds[0], peer: fds[1]}
}

func (c *recordConn) Fd() int                  { return c.fd }
func (c *recordConn) OutboundBuffered() int    { return 0 }
func (c *recordConn) Close() error             { c.closed = true; return nil }
func (c *recordConn) SetContext(v any)         { c.ctx = v }
func (c *recordConn) Context() any             { return c.ctx }
func (c *recordConn) Discard(int) (int, error) { return 0, nil }

// text is everything written so far.
func (c *recordConn) text() string {
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(c.peer, buf)
		if n <= 0 || err != nil {
			return c.written.String()
		}
		c.written.Write(buf[:n])
	}
}

// openAt opens one SSE connection at nowMS on a Server that is not running.
func openAt(t *testing.T, nowMS int64) (*Server, *recordConn, *sseConn) {
	t.Helper()
	s, err := New(Config{Heartbeat: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	s.nowMS = nowMS
	c := newRecordConn(t)
	return s, c, s.conns.open(c)
}

// queueFor puts an opened connection in the admission FIFO as if its request req had been
// authorised with a token that expires at expiresMS (0 = never).
func queueFor(s *Server, sc *sseConn, req *subRequest, expiresMS int64) {
	s.conns.asked(sc, req)
	s.conns.queueAdmission(sc, nil, expiresMS)
}

// admitNow takes an opened connection through the admission FIFO at once, with a token
// that expires at expiresMS (0 = never).
func admitNow(s *Server, sc *sseConn, expiresMS int64) {
	queueFor(s, sc, &subRequest{name: "s"}, expiresMS)
	if s.adm.q.pop() != sc {
		panic("admission FIFO lost the connection")
	}
	s.conns.admit(sc)
}

// Each state's time rule, on the loop clock (nowMS): the head deadline, the pending
// timeout, the heartbeat and the token's exp.
func TestSweepConnsTimeRules(t *testing.T) {
	const t0 = 1_000_000

	t.Run("head", func(t *testing.T) {
		s, c, sc := openAt(t, t0)
		s.nowMS = t0 + headTimeoutMS - 1
		s.conns.sweep()
		assert.Equal(t, stateHead, sc.state)
		s.nowMS = t0 + headTimeoutMS
		s.conns.sweep()
		assert.Equal(t, stateClosing, sc.state)
		assert.True(t, c.closed)
		assert.Empty(t, c.text(), "a connection that sent no head gets no answer")
	})

	t.Run("pending", func(t *testing.T) {
		s, c, sc := openAt(t, t0)
		s.nowMS = t0 + 5_000 // the head took a while: the pending time counts from admission
		s.lsn.up = true
		admitNow(s, sc, 0)
		s.nowMS += pendingTimeoutMS
		s.conns.sweep()
		assert.Equal(t, statePending, sc.state)
		s.nowMS++
		s.conns.sweep()
		assert.Equal(t, stateClosing, sc.state)
		assert.True(t, c.closed)
		assert.True(t, strings.HasPrefix(c.text(), "HTTP/1.1 200 "), "shed with 200: %q", c.text())
		assert.Contains(t, c.text(), "\nretry: ")
		assert.Contains(t, c.text(), "\n:over capacity\n")
	})

	t.Run("verifying", func(t *testing.T) {
		s, c, sc := openAt(t, t0)
		s.conns.asked(sc, &subRequest{name: "s"})
		s.conns.verify(sc)
		s.nowMS = t0 + verifyTimeoutMS
		s.conns.sweep()
		assert.Equal(t, stateVerifying, sc.state)
		s.nowMS++
		s.conns.sweep()
		assert.Equal(t, stateClosing, sc.state)
		assert.Contains(t, c.text(), "\n:over capacity\n")
	})

	t.Run("pending while the database is unavailable", func(t *testing.T) {
		s, c, sc := openAt(t, t0)
		s.lsn.up = true
		admitNow(s, sc, 0)
		s.lsn.up, s.lsn.downSinceMS = false, t0 // the LISTEN session went down
		s.nowMS = t0 + dbUnavailableAfterMS - 1
		s.conns.sweep()
		assert.Equal(t, statePending, sc.state, "a short outage costs nobody their connection")
		s.nowMS++
		s.conns.sweep()
		assert.Equal(t, stateClosing, sc.state)
		assert.Contains(t, c.text(), "\n:database unavailable\n")
	})

	t.Run("heartbeat and token expiry", func(t *testing.T) {
		s, c, sc := openAt(t, t0)
		admitNow(s, sc, t0+5_000)
		s.conns.respond(sc)
		assert.Equal(t, int64(t0+5_000), sc.expiresMS())
		head := len(c.text())
		s.nowMS = t0 + s.cfg.Heartbeat.Milliseconds() - 1
		s.conns.sweep()
		assert.Equal(t, head, len(c.text()), "no heartbeat before --heartbeat")
		s.nowMS++
		s.conns.sweep()
		assert.Equal(t, ":\n", c.text()[head:], "a comment line after --heartbeat without writes")
		s.nowMS = t0 + 5_000 - 1
		s.conns.sweep()
		assert.Equal(t, stateStreaming, sc.state)
		s.nowMS++
		s.conns.sweep()
		assert.Equal(t, stateClosing, sc.state, "closed once the token's exp passes")
		assert.True(t, c.closed)
		tail := strings.TrimLeft(c.text()[head:], ":\n") // heartbeats meanwhile
		assert.True(t, strings.HasPrefix(tail, "retry: ") && strings.HasSuffix(tail, "\n\n"), "a retry field last: %q", tail)
	})
}

// The publisher states' time rules: a body not complete within publishBodyTimeoutMS is
// answered 408 and closed; a keep-alive connection idle for keepAliveIdleMS is closed.
func TestSweepConnsPublisherTimeRules(t *testing.T) {
	const t0 = 1_000_000
	t.Run("body", func(t *testing.T) {
		s, c, sc := openAt(t, t0)
		sc.setPublisher(&publishConn{keepAlive: true})
		s.conns.beginPublish(sc)
		s.nowMS = t0 + s.pub.publishBodyTimeoutMS - 1
		s.conns.sweep()
		assert.Equal(t, statePublishBody, sc.state)
		s.nowMS++
		s.conns.sweep()
		assert.Equal(t, stateLinger, sc.state, "answered, write side shut, waiting for the client's EOF")
		assert.True(t, strings.HasPrefix(c.text(), "HTTP/1.1 408 "), "got %q", c.text())
		assert.Contains(t, c.text(), "Connection: close")
		s.nowMS += lingerTimeoutMS
		s.conns.sweep()
		assert.True(t, c.closed, "closed after lingerTimeoutMS without the client's EOF")
	})
	t.Run("idle", func(t *testing.T) {
		s, c, sc := openAt(t, t0)
		sc.setPublisher(&publishConn{keepAlive: true})
		s.conns.beginPublish(sc)
		s.conns.answerPublish(sc, []byte("HTTP/1.1 200 OK\r\n\r\n"), true, false)
		require.Equal(t, stateIdle, sc.state)
		s.nowMS = t0 + keepAliveIdleMS - 1
		s.conns.sweep()
		assert.Equal(t, stateIdle, sc.state)
		assert.False(t, c.closed)
		s.nowMS++
		s.conns.sweep()
		assert.Equal(t, stateClosing, sc.state)
		assert.True(t, c.closed)
	})
}

// An idle server's sweep costs what is due, not a pass over every connection (issue 25):
// streaming connections leave the timed list at the first sweep and wait in the heartbeat
// wheel's slot of their next heartbeat; a sweep before it looks at none of them, the one at
// it gives each one heartbeat and places it --heartbeat later; one that closes leaves the
// wheel at once. A public stream's connection
// holds no extension (connExt): nothing a token would bring.
func TestIdleSweepTouchesOnlyWhatIsDue(t *testing.T) {
	const t0, n = 1_000_000, 200
	s, err := New(Config{Heartbeat: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	s.nowMS = t0
	conns := make([]*recordConn, n)
	for i := range conns {
		conns[i] = newRecordConn(t)
		sc := s.conns.open(conns[i])
		admitNow(s, sc, 0)
		s.conns.respond(sc)
		require.Nil(t, sc.ext, "a public connection holds no extension")
	}
	heads := len(conns[0].text())
	inWheel := func() (slots, entries int) {
		for _, slot := range s.conns.beats {
			if len(slot) > 0 {
				slots++
				entries += len(slot)
			}
		}
		return slots, entries
	}
	s.nowMS = t0 + 500
	s.conns.sweep()
	assert.Empty(t, s.conns.timed, "streaming connections leave the timed list")
	slots, entries := inWheel()
	assert.Equal(t, 1, slots, "all due in one slot")
	assert.Equal(t, n, entries)
	due := &s.conns.beats[(t0+1000)/sweepIntervalMS%beatSlots]
	assert.Len(t, *due, n, "in the slot of their heartbeat")

	s.nowMS = t0 + 1000
	s.conns.sweep()
	for i, c := range conns {
		require.Equal(t, ":\n", c.text()[heads:], "connection %d: one heartbeat", i)
	}
	_, entries = inWheel()
	assert.Equal(t, n, entries, "each placed again, once")
	assert.Len(t, s.conns.beats[(t0+2000)/sweepIntervalMS%beatSlots], n, "--heartbeat later")

	// A connection that closes leaves the wheel at once, not when its slot comes round.
	closing := append([]*sseConn(nil), s.conns.all()[:n/4]...)
	for _, sc := range closing {
		s.conns.closed(sc)
	}
	s.conns.reapClosed()
	_, entries = inWheel()
	assert.Equal(t, n-n/4, entries)
	for _, slot := range s.conns.beats {
		for i, sc := range slot {
			require.Equal(t, int32(i+1), sc.beatPos, "its place in the slot")
		}
	}

	// A token's exp is kept beside the connection, not in it.
	c := newRecordConn(t)
	sc := s.conns.open(c)
	admitNow(s, sc, t0+1500)
	require.NotNil(t, sc.ext)
	assert.Equal(t, int64(t0+1500), sc.expiresMS())
}
