package engine

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

// A subscriber far behind (a reconnect after a restart, or a connection a successor adopted
// with an old cursor) is caught up from the table only until its cursor reaches the stream's
// ring; the rest is written from the ring at once (tryJoin), not read again batch by batch.
// Each read of replayBatchEvents costs a round trip through the replay pool, which a few
// thousand subscribers catching up at once queue behind one another: scenario 17's restarted
// server made reads for seconds after every subscriber had reconnected, and a subscriber whose
// reads waited longer than the ring lasts never joined (bench/RESULTS.md, task deployscale).
// Here: `before` events only in the table, `inRing` more that the ring holds; a subscriber
// from cursor 1 needs ceil((before-1)/replayBatchEvents) reads, not one per batch up to the head.
func TestCatchUpJoinsFromTheRingOnceItReachesIt(t *testing.T) {
	t.Parallel()
	catchUpFromRing(t, 500, 500)
}

// The ring reaches back far enough for that: 2,000 events (20 s of a stream at 100 events/s,
// scenario 17's rate) are in it, so that a subscriber whose cursor is that far behind the
// head once its first reads are done joins from memory. With 512 events it read the table
// ceil((500-1+2000-512)/200) = 10 times, each behind every other subscriber catching up.
func TestCatchUpRingHoldsTwentySecondsOfABusyStream(t *testing.T) {
	t.Parallel()
	catchUpFromRing(t, 500, 2000)
}

func catchUpFromRing(t *testing.T, before, inRing int) {
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	pgtest.Exec(t, ts.DSN, fmt.Sprintf("SELECT pgsse.publish('cr', g::text) FROM generate_series(1, %d) g", before))
	// Their notifications have reached the server (and been dropped: nobody follows the
	// stream yet) before the follower comes, so that the ring starts after them.
	waitFor(t, 10*time.Second, "the notifications of the first events", func() bool {
		return metricValue(t, ts.metrics.notifications) >= float64(before)
	})

	// A follower from the head: the stream's live side starts there, and its ring gets
	// what follows.
	live := dial(t, addr, "/streams/cr", tok)
	require.Equal(t, 200, live.Status)
	waitFor(t, 10*time.Second, "the follower live at the head", func() bool {
		ok := false
		ts.onLoop(t, func() {
			for _, sc := range ts.conns.list {
				if s := sc.streamSub("cr"); s != nil {
					ok = s.state == subLive && s.cursor == int64(before)
				}
			}
		})
		return ok
	})
	pgtest.Exec(t, ts.DSN, fmt.Sprintf("SELECT pgsse.publish('cr', g::text) FROM generate_series(1, %d) g", inRing))
	for {
		if ev := live.mustNextData(15 * time.Second); ev.id() == int64(before+inRing) {
			break
		}
	}
	ringLen := -1
	ts.onLoop(t, func() {
		if st := ts.fan.streams["cr"]; st != nil {
			ringLen = len(st.ring)
		}
	})
	require.Equal(t, inRing, ringLen, "the ring holds every event since the follower joined")

	reads0 := metricValue(t, ts.metrics.replays)
	late := dial(t, addr, "/streams/cr", tok, "Last-Event-ID: 1")
	require.Equal(t, 200, late.Status)
	for id := int64(2); id <= int64(before+inRing); id++ {
		ev := late.mustNextData(15 * time.Second)
		require.Equal(t, strconv.FormatInt(id, 10), ev.IDValue, "every event once, in order")
	}
	reads := metricValue(t, ts.metrics.replays) - reads0
	want := float64((before - 1 + replayBatchEvents - 1) / replayBatchEvents)
	assert.LessOrEqual(t, reads, want, "table reads until the cursor is in the ring, then the ring (pgsse_replay_reads_total)")
	ts.onLoop(t, func() {
		for _, sc := range ts.conns.list {
			if s := sc.streamSub("cr"); s != nil {
				assert.Equal(t, subLive, s.state)
			}
		}
	})
}

// Many subscribers catching up at once queue at most readGate.max reads in the replay pool
// at a time, the others waiting in the engine: a read reserves what it may bring against the
// outbound budget from the moment it is queued, and thousands queued behind the pool's few
// connections (scenario 17's restart at 15,000) squeezed every connection's watermark to its
// floor, pausing live subscribers. Here the table is locked, so that no read returns while
// the subscribers come; the watermark stays where it is without pressure, and once the lock
// is gone every subscriber gets every event once, in order.
func TestCatchUpReadsQueuedAtOnceAreBounded(t *testing.T) {
	t.Parallel()
	const budget = 16 << 20
	ts := startServer(t, "", func(c *Config) { c.MaxOutboundMemory = budget })
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	const events, clients = 50, 40
	pgtest.Exec(t, ts.DSN, fmt.Sprintf("SELECT pgsse.publish('gate', g::text) FROM generate_series(1, %d) g", events))
	lock := connect(t, ts.DSN)
	pgtest.ExecOn(t, lock, "BEGIN; LOCK TABLE pgsse.events IN ACCESS EXCLUSIVE MODE")
	locked := true
	defer func() {
		if locked {
			pgtest.ExecOn(t, lock, "COMMIT")
		}
	}()
	var cs []*sseClient
	for range clients {
		c := dial(t, addr, "/streams/gate", tok, "Last-Event-ID: 1")
		require.Equal(t, 200, c.Status)
		cs = append(cs, c)
	}
	maxReads := ts.subs.reads.max(ts.cfg.ReplayPoolSize, budget)
	var inFlight, waiting, high int
	waitFor(t, 10*time.Second, "every subscriber's read queued or waiting", func() bool {
		ts.onLoop(t, func() {
			inFlight, waiting, high = ts.subs.reads.inFlight, len(ts.subs.reads.waiting), ts.out.limits().high
		})
		return inFlight+waiting >= clients || inFlight > maxReads
	})
	assert.LessOrEqual(t, inFlight, maxReads, "reads queued in the replay pool at once")
	assert.Equal(t, durableHighBytes, high, "the watermark is not squeezed by reads that have not started")
	pgtest.ExecOn(t, lock, "COMMIT")
	locked = false
	for i, c := range cs {
		for id := int64(2); id <= events; id++ {
			ev := c.mustNextData(15 * time.Second)
			require.Equal(t, strconv.FormatInt(id, 10), ev.IDValue, "subscriber %d: every event once, in order", i)
		}
	}
}
