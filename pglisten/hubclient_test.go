package pglisten

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/framing"
	"github.com/pgsse/pgsse/internal/testkit"
	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

// fakeHub is a scripted hub socket: the test plays the hub's side frame by frame. (The real hub
// and these Listeners are tested together, with worker processes, in engine/hubserver_test.go.)
type fakeHub struct {
	t     *testing.T
	path  string
	ln    net.Listener
	conns chan *fakeConn
	wg    sync.WaitGroup
}

type fakeConn struct {
	t   *testing.T
	c   net.Conn
	dec framing.Decoder
	buf []byte
}

func socketPath(t *testing.T) string { return testkit.SocketPath(t, "h.sock") }

func newFakeHub(t *testing.T) *fakeHub {
	path := socketPath(t)
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	h := &fakeHub{t: t, path: path, ln: ln, conns: make(chan *fakeConn, 16)}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.conns <- &fakeConn{t: t, c: c, buf: make([]byte, 64<<10)}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		h.wg.Wait()
		close(h.conns)
		for c := range h.conns {
			c.c.Close()
		}
	})
	return h
}

// accept takes the next connection, reads HELLO and answers READY.
func (h *fakeHub) accept() *fakeConn {
	h.t.Helper()
	select {
	case c := <-h.conns:
		h.t.Cleanup(func() { c.c.Close() })
		f := c.read()
		require.Equal(h.t, framing.TypeHello, f.Type)
		require.Equal(h.t, uint32(os.Getpid()), f.PID)
		c.send(framing.AppendStatus(nil, framing.StatusReady, nil, nil))
		return c
	case <-time.After(5 * time.Second):
		h.t.Fatal("no connection to the fake hub")
		return nil
	}
}

func (c *fakeConn) read() framing.Frame {
	c.t.Helper()
	_ = c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		f, err := c.dec.Next()
		if err == nil {
			f.Channel = bytes.Clone(f.Channel)
			f.Name = bytes.Clone(f.Name)
			return f
		}
		require.ErrorIs(c.t, err, framing.ErrIncomplete)
		n, err := c.c.Read(c.buf)
		require.NoError(c.t, err)
		c.dec.Feed(c.buf[:n])
	}
}

func (c *fakeConn) send(b []byte) {
	c.t.Helper()
	_, err := c.c.Write(b)
	require.NoError(c.t, err)
}

// ackNext reads a SUB/UNSUB and answers it with code.
func (c *fakeConn) ackNext(want framing.Type, channel string, code framing.AckCode) framing.Frame {
	c.t.Helper()
	f := c.read()
	require.Equal(c.t, want, f.Type)
	require.Equal(c.t, channel, string(f.Channel))
	c.send(framing.AppendAck(nil, f.Req, code, []byte("because")))
	return f
}

func nextHubEvent(t *testing.T, l Listener) Event {
	t.Helper()
	select {
	case ev, ok := <-l.Events():
		require.True(t, ok, "Events closed")
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10s")
		return Event{}
	}
}

func listenAsync(l Listener, ch string) chan error {
	errc := make(chan error, 1)
	go func() { errc <- l.Listen(context.Background(), ch) }()
	return errc
}

func TestHubClientFrames(t *testing.T) {
	hub := newFakeHub(t)
	var l Listener
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		l, err = NewHub(HubConfig{Socket: hub.path, Name: "unit", PingInterval: 50 * time.Millisecond, Mode: framing.ModeWake})
	}()
	c := hub.accept()
	<-done
	require.NoError(t, err)
	defer l.Close()

	errc := listenAsync(l, "a")
	f := c.ackNext(framing.TypeSub, "a", framing.AckOK)
	assert.Equal(t, framing.ModeWake, f.Mode)
	require.NoError(t, <-errc)
	require.NoError(t, l.Listen(context.Background(), "a"), "idempotent: no second SUB needed")

	c.send(framing.AppendNotify(nil, 77, []byte("a"), []byte("pay\x00load")))
	c.send(framing.AppendNotify(nil, 77, []byte("zzz"), []byte("not mine")))
	c.send(framing.AppendStatus(nil, framing.StatusListenerDown, nil, nil))
	c.send(framing.AppendStatus(nil, framing.StatusResync, []byte("a"), nil))
	c.send(framing.AppendStatus(nil, framing.StatusResync, nil, nil))
	assert.Equal(t, Event{Kind: KindNotification, Channel: "a", PID: 77, Payload: []byte("pay\x00load")}, nextHubEvent(t, l))
	assert.Equal(t, Event{Kind: KindDown}, nextHubEvent(t, l), "notification for an unsubscribed channel dropped")
	assert.Equal(t, Event{Kind: KindResync, Channel: "a"}, nextHubEvent(t, l))
	assert.Equal(t, Event{Kind: KindResync}, nextHubEvent(t, l))

	// Keepalive: PING answered with PONG keeps the client up.
	for range 3 {
		p := c.read()
		require.Equal(t, framing.TypePing, p.Type)
		c.send(framing.AppendPong(nil, p.Token))
	}

	errc = listenAsync(l, "b")
	for {
		f := c.read()
		if f.Type == framing.TypePing {
			c.send(framing.AppendPong(nil, f.Token))
			continue
		}
		require.Equal(t, framing.TypeSub, f.Type)
		c.send(framing.AppendAck(nil, f.Req, framing.AckLimit, []byte("too many")))
		break
	}
	err = <-errc
	var ae *AckError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, framing.AckLimit, ae.Code)
	assert.Equal(t, "too many", ae.Message)
	assert.False(t, isHubFailure(err), "a refused SUB does not fail the client")

	errc = make(chan error, 1)
	go func() { errc <- l.Unlisten(context.Background(), "a") }()
	for {
		f := c.read()
		if f.Type == framing.TypePing {
			c.send(framing.AppendPong(nil, f.Token))
			continue
		}
		require.Equal(t, framing.TypeUnsub, f.Type)
		c.send(framing.AppendAck(nil, f.Req, framing.AckOK, nil))
		break
	}
	require.NoError(t, <-errc)
	assert.ErrorIs(t, l.Unlisten(context.Background(), "a"), ErrNotListening)

	require.NoError(t, l.Close())
	_, open := <-l.Events()
	assert.False(t, open, "Events closed by Close")
	assert.ErrorIs(t, l.(*hubClient).Err(), ErrClosed)
}

func TestHubClientFailures(t *testing.T) {
	cases := []struct {
		name string
		cfg  HubConfig
		act  func(c *fakeConn, l Listener) error // returns Listen's error, if it ran one
		want error
	}{
		{"ACK timeout", HubConfig{AckTimeout: 100 * time.Millisecond}, func(c *fakeConn, l Listener) error {
			return l.Listen(context.Background(), "x")
		}, ErrHubAckTimeout},
		{"no PONG", HubConfig{PingInterval: 30 * time.Millisecond}, func(c *fakeConn, l Listener) error {
			return nil
		}, ErrHubTimeout},
		{"EOF", HubConfig{}, func(c *fakeConn, l Listener) error { c.c.Close(); return nil }, ErrHubClosed},
		{"evicted", HubConfig{}, func(c *fakeConn, l Listener) error {
			c.send(framing.AppendStatus(nil, framing.StatusEvicted, nil, []byte("slow")))
			return nil
		}, ErrHubEvicted},
		{"shutdown", HubConfig{}, func(c *fakeConn, l Listener) error {
			c.send(framing.AppendStatus(nil, framing.StatusShutdown, nil, nil))
			return nil
		}, ErrHubShutdown},
		{"protocol error status", HubConfig{}, func(c *fakeConn, l Listener) error {
			c.send(framing.AppendStatus(nil, framing.StatusProtocolError, nil, []byte("you")))
			return nil
		}, ErrHubProtocol},
		{"garbage from the hub", HubConfig{}, func(c *fakeConn, l Listener) error {
			c.send([]byte{0, 0, 0, 1, 0x42})
			return nil
		}, ErrHubProtocol},
		{"worker frame from the hub", HubConfig{}, func(c *fakeConn, l Listener) error {
			c.send(framing.AppendPing(nil, 1))
			return nil
		}, ErrHubProtocol},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hub := newFakeHub(t)
			tc.cfg.Socket = hub.path
			if tc.cfg.PingInterval == 0 {
				tc.cfg.PingInterval = -1
			}
			var l Listener
			var err error
			done := make(chan struct{})
			go func() { defer close(done); l, err = NewHub(tc.cfg) }()
			c := hub.accept()
			<-done
			require.NoError(t, err)
			defer l.Close()
			lerr := tc.act(c, l)
			for range l.Events() {
			}
			assert.ErrorIs(t, l.(*hubClient).Err(), tc.want)
			if lerr != nil {
				assert.ErrorIs(t, lerr, tc.want)
			}
			assert.ErrorIs(t, l.Listen(context.Background(), "later"), tc.want, "a failed client stays failed")
		})
	}
}

func TestHubClientConnectFailures(t *testing.T) {
	_, err := NewHub(HubConfig{Socket: filepath.Join(t.TempDir(), "none.sock")})
	assert.ErrorIs(t, err, ErrHubUnavailable)

	// A hub that answers HELLO with SHUTDOWN (full, or draining).
	hub := newFakeHub(t)
	go func() {
		c := <-hub.conns
		c.read()
		c.send(framing.AppendStatus(nil, framing.StatusShutdown, nil, []byte("too many workers")))
	}()
	_, err = NewHub(HubConfig{Socket: hub.path})
	assert.ErrorIs(t, err, ErrHubShutdown)
	assert.Contains(t, err.Error(), "too many workers")
}

// TestHubClientInheritedConn: given an already-connected socket (one end of a socketpair, as
// pgsse hands its --procs siblings), the client speaks over it and never dials Socket; when
// the other end goes away, a Failover over it switches like one that dialled.
func TestHubClientInheritedConn(t *testing.T) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		require.NoError(t, err)
		return c
	}
	hubEnd := &fakeConn{t: t, c: conn(fds[0]), buf: make([]byte, 64<<10)}
	defer hubEnd.c.Close()
	dsn := pgtest.NewDatabase(t)

	var l Listener
	done := make(chan struct{})
	go func() {
		defer close(done)
		l, err = NewFailover(FailoverConfig{
			Hub:    HubConfig{Conn: conn(fds[1]), Socket: filepath.Join(t.TempDir(), "never-dialled.sock"), PingInterval: -1},
			Direct: Config{DSN: dsn},
		})
	}()
	hello := hubEnd.read()
	require.Equal(t, framing.TypeHello, hello.Type)
	hubEnd.send(framing.AppendStatus(nil, framing.StatusReady, nil, nil))
	<-done
	require.NoError(t, err)
	defer l.Close()
	f := l.(*Failover)

	errc := listenAsync(l, "inh")
	hubEnd.ackNext(framing.TypeSub, "inh", framing.AckOK)
	require.NoError(t, <-errc)
	require.Equal(t, SourceHub, f.Source())
	hubEnd.send(framing.AppendNotify(nil, 9, []byte("inh"), []byte("over the pair")))
	assert.Equal(t, Event{Kind: KindNotification, Channel: "inh", PID: 9, Payload: []byte("over the pair")}, nextHubEvent(t, l))

	hubEnd.c.Close() // the process that held the other end died
	assert.Equal(t, Event{Kind: KindDown}, nextHubEvent(t, l))
	assert.Equal(t, Event{Kind: KindResync}, nextHubEvent(t, l))
	assert.Equal(t, SourceDirect, f.Source())
	assert.ErrorIs(t, f.Reason(), ErrHubClosed)
	pgExec(t, dsn, "NOTIFY inh, 'direct'")
	ev := nextHubEvent(t, l)
	assert.Equal(t, Event{Kind: KindNotification, Channel: "inh", PID: ev.PID, Payload: []byte("direct")}, ev)
}

// TestFailoverSwitches: every failure reason switches to a direct session once, re-LISTENs the
// recorded channels, reports KindDown (a hub that was connected is gone) and KindResync after
// everything the hub delivered, and then delivers from the direct session.
func TestFailoverSwitches(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	cases := []struct {
		name string
		hub  bool              // a fake hub is there
		fail func(c *fakeConn) // what the hub does after ACKing the SUB
		want error
	}{
		{"no socket", false, nil, ErrHubUnavailable},
		{"EOF", true, func(c *fakeConn) { c.c.Close() }, ErrHubClosed},
		{"evicted", true, func(c *fakeConn) {
			c.send(framing.AppendStatus(nil, framing.StatusEvicted, nil, nil))
		}, ErrHubEvicted},
		{"shutdown", true, func(c *fakeConn) {
			c.send(framing.AppendStatus(nil, framing.StatusShutdown, nil, nil))
		}, ErrHubShutdown},
		{"protocol error", true, func(c *fakeConn) { c.send([]byte{0xff, 0xff, 0xff, 0xff}) }, ErrHubProtocol},
		{"ACK timeout", true, nil, ErrHubAckTimeout},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "none.sock")
			var hub *fakeHub
			if tc.hub {
				hub = newFakeHub(t)
				sock = hub.path
			}
			cfg := FailoverConfig{
				Hub:    HubConfig{Socket: sock, PingInterval: -1, AckTimeout: 300 * time.Millisecond},
				Direct: Config{DSN: dsn},
			}
			var l Listener
			var err error
			done := make(chan struct{})
			go func() { defer close(done); l, err = NewFailover(cfg) }()
			var c *fakeConn
			if tc.hub {
				c = hub.accept()
			}
			<-done
			require.NoError(t, err)
			defer l.Close()
			f := l.(*Failover)

			errc := listenAsync(l, "fo")
			if tc.hub && tc.fail != nil {
				c.ackNext(framing.TypeSub, "fo", framing.AckOK)
				require.NoError(t, <-errc)
				assert.Equal(t, SourceHub, f.Source())
				c.send(framing.AppendNotify(nil, 1, []byte("fo"), []byte("from the hub")))
				assert.Equal(t, "from the hub", string(nextHubEvent(t, l).Payload))
				c.send(framing.AppendNotify(nil, 1, []byte("fo"), []byte("last from the hub")))
				tc.fail(c)
				assert.Equal(t, "last from the hub", string(nextHubEvent(t, l).Payload), "hub events come before the switch")
			} else {
				require.NoError(t, <-errc, "Listen completes on the direct session")
			}
			if tc.hub {
				assert.Equal(t, Event{Kind: KindDown}, nextHubEvent(t, l), "losing a hub that was connected is a loss")
			}
			ev := nextHubEvent(t, l)
			assert.Equal(t, Event{Kind: KindResync}, ev, "the switch is reported as a resync of everything")
			assert.Equal(t, SourceDirect, f.Source())
			assert.ErrorIs(t, f.Reason(), tc.want)

			// One switch, one KindResync: the direct session's own first resync is not
			// passed on, so the next event is the notification.
			pgExec(t, dsn, "NOTIFY fo, 'direct'")
			ev = nextHubEvent(t, l)
			assert.Equal(t, Event{Kind: KindNotification, Channel: "fo", PID: ev.PID, Payload: []byte("direct")}, ev)
			require.NoError(t, l.Unlisten(context.Background(), "fo"))
			require.NoError(t, l.Close())
		})
	}
}

// TestFailoverFailedSwitch: the hub goes away and the direct session cannot connect; Listens
// wait, Close ends everything, and nothing leaks (goleak in TestMain).
func TestFailoverFailedSwitch(t *testing.T) {
	hub := newFakeHub(t)
	var l Listener
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		l, err = NewFailover(FailoverConfig{
			Hub:    HubConfig{Socket: hub.path, PingInterval: -1},
			Direct: Config{DSN: "postgres://nobody@127.0.0.1:1/none?connect_timeout=1", BackoffMax: 50 * time.Millisecond},
		})
	}()
	c := hub.accept()
	<-done
	require.NoError(t, err)
	errc := listenAsync(l, "x")
	c.ackNext(framing.TypeSub, "x", framing.AckOK)
	require.NoError(t, <-errc)
	c.c.Close()
	waitSource(t, l.(*Failover), SourceDirect)
	pending := listenAsync(l, "y") // cannot complete: no PostgreSQL there
	select {
	case err := <-pending:
		t.Fatalf("Listen returned %v without a session", err)
	case <-time.After(200 * time.Millisecond):
	}
	require.NoError(t, l.Close())
	assert.Error(t, <-pending)
	_, open := <-l.Events()
	assert.False(t, open)

	// And with no hub at all, closing at once.
	l, err = NewFailover(FailoverConfig{
		Hub:    HubConfig{Socket: filepath.Join(t.TempDir(), "none.sock")},
		Direct: Config{DSN: "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"},
	})
	require.NoError(t, err)
	require.NoError(t, l.Close())

	_, err = NewFailover(FailoverConfig{Hub: HubConfig{Socket: hub.path}, Direct: Config{DSN: "::not a dsn"}})
	assert.Error(t, err, "a DSN that cannot work is refused up front")
}

func waitSource(t *testing.T, f *Failover, want Source) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for f.Source() != want {
		if time.Now().After(deadline) {
			t.Fatalf("source still %s", f.Source())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func pgExec(t *testing.T, dsn, sql string) {
	t.Helper()
	pgtest.Exec(t, dsn, sql)
}
