package engine

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Moved subscribers catch up from the successor's memory, not the table (issue 22;
// fanout_keep.go). A successor LISTENs the stream channel long before it takes anything over,
// but a stream's ring is filled only once a subscription here follows it: the durable
// notifications that reached it before the first moved subscription of each stream were
// dropped, and the stream read them again from the table (bench/RESULTS.md, scenario 17:
// thousands of catch-up reads, a pause p99 of seconds). Here the handover of each batch is
// slow on purpose, so that every stream has events at the successor's session before its
// subscriptions arrive: with what the successor kept, they continue from memory — no table
// read at all — and every subscriber gets every event exactly once, in order.
func TestHandoffStreamsCatchUpFromMemory(t *testing.T) {
	t.Parallel()
	a := startHub(t, nil)
	addr := a.Addr().String()
	tok := bearerH(allStreams(t))

	names := []string{"hr/1", "hr/2", "hr/3"}
	var pubs []*publisher
	for _, name := range names {
		pubs = append(pubs, startPublisher(t, a.DSN, name, 3*time.Millisecond))
	}
	var readers []*handoffReader
	for i := range 12 {
		readers = append(readers, &handoffReader{c: dial(t, addr, "/streams/"+names[i%len(names)], tok), last: make([]int64, 1)})
	}
	for range 3 {
		readers = append(readers, &handoffReader{c: dial(t, addr, "/streams?stream=hr/1&stream=hr/3", tok), multi: 2, last: make([]int64, 2)})
	}
	want := func(i int) []int64 {
		if i >= 12 {
			return []int64{pubs[0].last.Load(), pubs[2].last.Load()}
		}
		return []int64{pubs[i%len(names)].last.Load()}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, r := range readers {
		require.Equal(t, 200, r.c.Status, r.c.Body)
		wg.Add(1)
		go func() { defer wg.Done(); r.run(done) }()
	}
	defer func() { close(done); wg.Wait() }()
	waitEveryReaderHasEvents(t, readers)

	// The successor, and the handoff as cmd/pgsse runs it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	accept := make(chan struct{})
	b := startSuccessor(t, a, addr, accept)
	mark, err := a.BeginHandoff(ctx)
	require.NoError(t, err)
	chans, err := a.ListenedChannels(ctx)
	require.NoError(t, err)
	require.NoError(t, b.HoldChannels(ctx, mark, chans))
	a.StopAcceptingAll()
	require.NoError(t, a.MarkHandoff(ctx, mark))
	close(accept)
	handed, err := a.HandOver(ctx, func(batch []HandedConn) error {
		fds, recs, err := dupHanded(batch)
		if err != nil {
			return err
		}
		// A slow handover: every stream has events past these records' cursors meanwhile,
		// which reach b's session before the subscriptions do.
		from := make([]int64, len(pubs))
		for i, p := range pubs {
			from[i] = p.last.Load()
		}
		waitFor(t, 10*time.Second, "events published during the handover", func() bool {
			for i, p := range pubs {
				if p.last.Load() < from[i]+5 {
					return false
				}
			}
			return true
		})
		time.Sleep(handoffChannelsDelay) // their notifications reach b's session
		return b.Adopt(fds, recs)
	})
	require.NoError(t, err)
	assert.Equal(t, len(readers), handed)
	b.ReleaseHeldChannels()
	a.Stop(t)

	time.Sleep(300 * time.Millisecond) // publishing goes on after the move
	for _, p := range pubs {
		p.Stop()
	}
	waitFor(t, 15*time.Second, "every subscriber has every event", func() bool {
		for i, r := range readers {
			last, _, err := r.state()
			if err == nil && !assert.ObjectsAreEqual(want(i), last) {
				return false
			}
		}
		return true
	})
	for i, r := range readers {
		last, n, err := r.state()
		assert.NoError(t, err, "client %d (%d events, last %v): exactly once, in order", i, n, last)
		assert.Equal(t, want(i), last, "client %d has every event of its streams", i)
	}
	assert.Zero(t, metricValue(t, b.metrics.replays), "no moved subscriber read the table (pgsse_replay_reads_total)")
	b.onLoop(t, func() {
		assert.Zero(t, b.fan.fetches, "no stream read the table: the moved subscribers continued from what b kept")
		assert.Equal(t, len(readers), b.conns.subscribers())
	})
}
