package engine

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/framing"
	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/pglisten"
)

// startSibling runs a sibling of primary (--procs, in-process): a server whose LISTEN source
// is primary's hub over a socketpair, as cmd/pgsse wires a sibling process.
func startSibling(t *testing.T, primary *testServer, tweak func(*Config)) *testServer {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	fileConn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "sibling hub")
		defer f.Close()
		c, err := net.FileConn(f)
		require.NoError(t, err)
		return c
	}
	primaryEnd, siblingEnd := fileConn(fds[0]), fileConn(fds[1])
	require.NoError(t, primary.AddSibling(primaryEnd))
	return startServer(t, primary.DSN, func(c *Config) {
		c.SiblingHub = siblingEnd
		if tweak != nil {
			tweak(c)
		}
	})
}

// siblingSource is the sibling's Failover, for checks of where its notifications come from.
func (ts *testServer) siblingFailover(t *testing.T) *pglisten.Failover {
	t.Helper()
	var f *pglisten.Failover
	waitFor(t, 10*time.Second, "the sibling's Failover", func() bool {
		ts.onLoop(t, func() {})
		h := ts.lsn.src.(*siblingSource)
		h.mu.Lock()
		defer h.mu.Unlock()
		f = h.failover
		return f != nil
	})
	return f
}

// TestSiblingThroughTheHub: a sibling holds no LISTEN session of its own — the host has one —
// yet its clients get durable events live and replayed, ephemeral events, and raw channel
// notifications with the response head only after the LISTEN completed (on the first
// process's session). Only the sibling may subscribe to the stream channel on the hub.
func TestSiblingThroughTheHub(t *testing.T) {
	primary := startHub(t, nil)
	sib := startSibling(t, primary, nil)
	assert.Equal(t, pglisten.SourceHub, sib.siblingFailover(t).Source())
	assert.Equal(t, 1, listenBackends(t, primary.DSN), "one LISTEN session for the host")

	pub := connect(t, primary.DSN)
	tok := bearerH(allStreams(t))
	publish(t, pub, "orders/1", "before", "", nil)
	live := dial(t, sib.Addr().String(), "/streams/orders/1", tok)
	require.Equal(t, 200, live.Status, live.Body)
	replay := dial(t, sib.Addr().String(), "/streams/orders/1?since=0", tok)
	require.Equal(t, 200, replay.Status, replay.Body)
	assert.Equal(t, "before", replay.mustNextData(5*time.Second).Data)
	for i := 2; i <= 20; i++ {
		publish(t, pub, "orders/1", "e"+strconv.Itoa(i), "", nil)
	}
	for _, c := range []*sseClient{live, replay} {
		for i := 2; i <= 20; i++ {
			ev := c.mustNextData(5 * time.Second)
			require.Equal(t, sseEvent{HasID: true, IDValue: strconv.Itoa(i), Data: "e" + strconv.Itoa(i)}, ev)
		}
	}
	pgtest.Exec(t, primary.DSN, "SELECT pgsse.broadcast('orders/1', 'ephemeral')")
	assert.Equal(t, sseEvent{Data: "ephemeral"}, live.mustNextData(5*time.Second))

	for i := 0; i < 20; i++ {
		ch := "sib/" + strconv.Itoa(i) // a fresh channel: a fresh SUB through the hub each time
		c := dial(t, sib.Addr().String(), "/channels/"+ch, tok)
		require.Equal(t, 200, c.Status, c.Body)
		p := fmt.Sprintf("round %d", i)
		pgNotify(t, pub, ch, []byte(p))
		require.Equal(t, sseEvent{Data: p}, c.mustNextData(5*time.Second), "round %d", i)
		c.conn.Close()
	}

	// An outside worker on --hub-socket may not take the stream channel.
	w := dialHub(t, primary.cfg.HubSocket)
	w.hello("outsider")
	f := w.sub(1, framing.ModeLossless, "pgsse")
	assert.Equal(t, framing.AckBadChannel, f.Ack)
	// The sibling is no hub worker in the metrics; the stream channel no raw channel.
	assert.Equal(t, 1.0, metricValue(t, primary.metrics.hubWorkers))
	assert.Equal(t, 0.0, metricValue(t, primary.metrics.listenChannels))
	assert.Equal(t, 1, listenBackends(t, primary.DSN), "still one LISTEN session")
}

// TestSiblingFailsOver: when the first process's hub connection ends (the first process died,
// from the sibling's point of view: EOF, no SHUTDOWN), the sibling switches to a LISTEN
// session of its own and its connected clients keep getting every durable event, none twice;
// a /channels/ client connecting afterwards gets notifications from the new session.
func TestSiblingFailsOver(t *testing.T) {
	primary := startServer(t, "", nil)
	sib := startSibling(t, primary, nil)
	f := sib.siblingFailover(t)
	pub := connect(t, primary.DSN)
	tok := bearerH(allStreams(t))
	c := dial(t, sib.Addr().String(), "/streams/s", tok)
	require.Equal(t, 200, c.Status, c.Body)
	publish(t, pub, "s", "1", "", nil)
	require.Equal(t, "1", c.mustNextData(5*time.Second).IDValue)

	primary.onLoop(t, func() {
		for _, w := range primary.hub.workers {
			if w.sibling {
				_ = w.c.Close()
			}
		}
	})
	// Published while the sibling switches: read from the table after its resync.
	for i := 2; i <= 5; i++ {
		publish(t, pub, "s", strconv.Itoa(i), "", nil)
	}
	waitFor(t, 15*time.Second, "the switch to a direct session", func() bool { return f.Source() == pglisten.SourceDirect })
	assert.ErrorIs(t, f.Reason(), pglisten.ErrHubClosed)
	waitFor(t, 15*time.Second, "the sibling's own session", func() bool { return listenBackends(t, primary.DSN) == 2 })
	for i := 6; i <= 8; i++ {
		publish(t, pub, "s", strconv.Itoa(i), "", nil)
	}
	for i := 2; i <= 8; i++ {
		ev := c.mustNextData(10 * time.Second)
		require.Equal(t, strconv.Itoa(i), ev.IDValue, "every event once, in order, across the switch")
	}
	waitFor(t, 10*time.Second, "the sibling ready again", func() bool { return sib.Ready() })
	ch := dial(t, sib.Addr().String(), "/channels/after", tok)
	require.Equal(t, 200, ch.Status, ch.Body)
	pgNotify(t, pub, "after", []byte("direct"))
	assert.Equal(t, sseEvent{Data: "direct"}, ch.mustNextData(5*time.Second))
}

// TestSiblingThroughASessionLoss: the first process's LISTEN session is killed; the sibling
// hears LISTENER_DOWN and RESYNC through the hub, and its clients get every durable event —
// those committed while the session was down too — once, in order. The sibling never opens a
// session of its own.
func TestSiblingThroughASessionLoss(t *testing.T) {
	primary := startServer(t, "", nil)
	sib := startSibling(t, primary, nil)
	pub := connect(t, primary.DSN)
	c := dial(t, sib.Addr().String(), "/streams/loss", bearerH(allStreams(t)))
	require.Equal(t, 200, c.Status, c.Body)
	publish(t, pub, "loss", "1", "", nil)
	require.Equal(t, "1", c.mustNextData(5*time.Second).IDValue)

	pgtest.Exec(t, primary.DSN, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgsse-listen' AND datname = current_database()")
	for i := 2; i <= 5; i++ {
		publish(t, pub, "loss", strconv.Itoa(i), "", nil)
	}
	waitFor(t, 15*time.Second, "the sibling to hear the session come back", func() bool { return metricValue(t, sib.metrics.reconnects) == 1 })
	publish(t, pub, "loss", "6", "", nil)
	for i := 2; i <= 6; i++ {
		require.Equal(t, strconv.Itoa(i), c.mustNextData(10*time.Second).IDValue, "every event once, in order")
	}
	assert.Equal(t, pglisten.SourceHub, sib.siblingFailover(t).Source(), "a session loss is not a reason to fail over")
	assert.Equal(t, 1, listenBackends(t, primary.DSN))
}
