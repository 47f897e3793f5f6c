package engine

import (
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/store"
)

// The fan-out's sweep (fanout_sweep.go) driven by hand on the loop: slices of sweepSubs
// subscriptions, paused after each (a budget of a nanosecond), events queued and connections
// removed while it is paused, as the loop entries between two slices do.

const sweepSubs = 4

// sweepFixture is a server with n live subscribers of stream "sweep/a", each one connection,
// and the stream's head known (0).
func sweepFixture(t *testing.T, n int) (*testServer, []*sseClient) {
	t.Helper()
	ts := startServer(t, "", func(c *Config) { c.MaxConnectionsPerSubject = NoLimit })
	authz := bearerH(allStreams(t))
	clients := make([]*sseClient, n)
	for i := range clients {
		d := &net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%4))}}
		clients[i] = dialWith(t, d, ts.Addr().String(), "/streams/sweep/a", authz)
		require.Equal(t, 200, clients[i].Status)
	}
	waitFor(t, 20*time.Second, "every subscriber live", func() bool {
		live := 0
		ts.onLoop(t, func() {
			if st := ts.fan.streams["sweep/a"]; st != nil && st.last == 0 {
				for _, sub := range st.subs {
					if sub.state == subLive {
						live++
					}
				}
			}
		})
		return live == n
	})
	return ts, clients
}

// notifyLive hands the fan-out a notification of stream "sweep/a": durable with id > 0,
// ephemeral with id 0 (on the loop).
func notifyLive(ts *testServer, id int64, data string) {
	kind := store.KindDurable
	if id == 0 {
		kind = store.KindEphemeral
	}
	ts.fan.onPayload(&store.Payload{Kind: kind, TimeUS: time.Now().UnixMicro(), Stream: []byte("sweep/a"), ID: id, Data: []byte(data)})
}

// sliceOnce runs one slice of sweepSubs subscriptions and reports whether a sweep is left.
func sliceOnce(ts *testServer) bool { return ts.fan.flushStreams(time.Nanosecond, true) }

// sweepToEnd runs slices until no sweep is left, and returns how many sweeps it took.
func sweepToEnd(ts *testServer) int {
	before := ts.fan.sweep.sweeps
	for sliceOnce(ts) {
	}
	return ts.fan.sweep.sweeps - before
}

// Events that arrive while a sweep is paused join it: the subscriptions not reached yet take
// them in the same write as the event the sweep began with, and those reached already take
// them together in the next sweep — two sweeps for three events, none written twice, every
// subscriber gap-free.
func TestSweepCarriesEventsThatArriveMidSweep(t *testing.T) {
	const n = 5 * sweepSubs
	ts, clients := sweepFixture(t, n)
	var sweeps, slices int
	var deliveries float64
	ts.onLoop(t, func() {
		ts.fan.sliceSubs = sweepSubs
		defer func() { ts.fan.sliceSubs = flushSliceSubs }()
		d0, s0, sl0 := counterValue(t, ts.metrics.deliveries), ts.fan.sweep.sweeps, ts.fan.sweep.slices
		notifyLive(ts, 1, "one")
		require.True(t, sliceOnce(ts), "the sweep pauses after a slice")
		require.Equal(t, sweepSubs, ts.fan.streams["sweep/a"].pausedAt())
		notifyLive(ts, 2, "two")
		notifyLive(ts, 3, "three")
		sweepToEnd(ts)
		sweeps, slices = ts.fan.sweep.sweeps-s0, ts.fan.sweep.slices-sl0
		deliveries = counterValue(t, ts.metrics.deliveries) - d0
	})
	assert.Equal(t, 2, sweeps, "three events in two sweeps: the second and third joined the first")
	assert.Greater(t, slices, sweeps, "the sweeps paused between slices")
	assert.Equal(t, float64(3*n), deliveries, "every event once to every subscriber")
	for _, c := range clients {
		c.readIDs(1, 3, 10*time.Second)
	}
	// What the second sweep wrote, a subscriber of the first slice had not had yet: the
	// sweep's per-subscriber rounds are 1 then 2 events there, 3 at once for the others.
	ts.onLoop(t, func() { assert.Empty(t, ts.fan.streams["sweep/a"].out, "trimmed at the end") })
}

// A subscription removed while a sweep is paused on its stream — before the position — does
// not make the sweep skip another: the last subscription, moved into its place by
// swapRemove, was not written yet. The removed connection gets nothing after its close, and
// every other subscriber is gap-free.
func TestSweepRemovalBehindPositionSkipsNobody(t *testing.T) {
	const n = 5 * sweepSubs
	ts, clients := sweepFixture(t, n)
	var gone *sseClient
	ts.onLoop(t, func() {
		ts.fan.sliceSubs = sweepSubs
		defer func() { ts.fan.sliceSubs = flushSliceSubs }()
		st := ts.fan.streams["sweep/a"]
		notifyLive(ts, 1, "one")
		require.True(t, sliceOnce(ts))
		require.Equal(t, sweepSubs, st.pausedAt())
		// Remove the connection at index 1 (written in the first slice), as a loop entry's
		// leave does between two slices.
		sc := st.subs[1].conn
		for i, c := range clients {
			if c.conn.RemoteAddr().String() == sc.c.LocalAddr().String() && c.conn.LocalAddr().String() == sc.c.RemoteAddr().String() {
				gone = clients[i]
				clients = append(clients[:i:i], clients[i+1:]...)
				break
			}
		}
		require.NotNil(t, gone)
		c := sc.c
		ts.conns.closed(sc)
		ts.conns.reapClosed()
		_ = c.Close()
		assert.Equal(t, sweepSubs-1, st.pausedAt(), "the position moves back with the visited one that took its place")
		for i, sub := range st.subs[:st.pausedAt()] {
			assert.Equal(t, int32(i), sub.idx)
		}
		notifyLive(ts, 2, "two")
		sweepToEnd(ts)
	})
	for _, c := range clients {
		c.readIDs(1, 2, 10*time.Second)
	}
	gone.readIDs(1, 1, 10*time.Second)
	_, err := gone.next(5 * time.Second)
	assert.True(t, isEOF(err), "the removed connection is closed after id 1: %v", err)
}

// An ephemeral event that arrives mid-sweep is written to the subscriptions the sweep
// reaches after it, and stays queued for the ones before it — the next sweep writes it to
// them, and not again to the others (subscription.seen): every subscriber gets it once.
func TestSweepEphemeralOnceAcrossResume(t *testing.T) {
	const n = 3 * sweepSubs
	ts, clients := sweepFixture(t, n)
	ts.onLoop(t, func() {
		ts.fan.sliceSubs = sweepSubs
		defer func() { ts.fan.sliceSubs = flushSliceSubs }()
		notifyLive(ts, 1, "one")
		require.True(t, sliceOnce(ts))
		notifyLive(ts, 0, "typing")
		sweepToEnd(ts)
		notifyLive(ts, 2, "two") // after it: a duplicate would come before this one
		sweepToEnd(ts)
	})
	for i, c := range clients {
		evs := c.events(3, 10*time.Second)
		require.Len(t, evs, 3, "subscriber %d", i)
		assert.Equal(t, "1", evs[0].IDValue)
		assert.Equal(t, "typing", evs[1].Data, "subscriber %d: the ephemeral once, then id 2", i)
		assert.False(t, evs[1].HasID)
		assert.Equal(t, "2", evs[2].IDValue, "subscriber %d: %v", i, evs)
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}
