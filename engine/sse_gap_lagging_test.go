package engine

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

// A durable client that is too slow for live writes is caught up from the table; if the
// events it has not read yet are pruned meanwhile, docs/http.md's delivery guarantee still
// promises that no id is skipped unless announced by pgsse:gap.
func TestSSEGapWhileLagging(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	// The kernel absorbs a few MiB per socket (tcp_wmem) before the server's own buffer
	// grows, so publish well beyond that.
	const total, size = 1500, 8 << 10
	slow := dialWith(t, tinyRcvBuf(4096), addr, "/streams/lag", tok)
	require.Equal(t, 200, slow.Status)
	pub := connect(t, ts.DSN)
	for i := 0; i < total; i += 10 {
		_, err := pub.Exec(context.Background(), fmt.Sprintf(
			"SELECT pgsse.publish('lag', lpad(g::text, %d, 'x')) FROM generate_series(%d, %d) g", size, i+1, i+10)).ReadAll()
		require.NoError(t, err)
	}
	// Let the server fill the slow client's buffers and mark it lagging.
	var lagging bool
	waitFor(t, 10*time.Second, "slow client lagging", func() bool {
		ts.onLoop(t, func() {
			for _, sc := range ts.conns.list {
				if sub := sc.streamSub("lag"); sub != nil && sub.state == subLagging {
					lagging = true
				}
			}
		})
		return lagging
	})
	pgtest.Exec(t, ts.DSN, "SELECT pgsse.prune('0 seconds', 3)")

	var last int64
	gaps := 0
	for last < total {
		ev, err := slow.next(15 * time.Second)
		require.NoError(t, err, "after id %d", last)
		if ev.Event == "pgsse:gap" {
			gaps++
			assert.Equal(t, fmt.Sprintf(`{"stream":"lag","after":%d,"resume":%d}`, last, total-3), ev.Data)
			last = total - 3
			continue
		}
		if !ev.HasID {
			continue
		}
		require.Equal(t, strconv.FormatInt(last+1, 10), ev.IDValue, "ids skip only where a pgsse:gap says so")
		last++
	}
	assert.Equal(t, 1, gaps, "one gap announced")
}

// The same promise for a connection whose cursor is still 0 when it falls behind: it
// subscribed without a cursor to a stream that had no events yet, so every event was
// committed while it was connected. "0 means everything retained" is the rule for a cursor
// the client sends, not a licence to skip events pruned while the connection lagged.
func TestSSEGapWhileLaggingFromCursorZero(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	c := dial(t, ts.Addr().String(), "/streams/lag0", bearerH(allStreams(t)))
	require.Equal(t, 200, c.Status)
	sub := func() (found *subscription) {
		for _, sc := range ts.conns.list {
			if s := sc.streamSub("lag0"); s != nil {
				found = s
			}
		}
		return found
	}
	waitFor(t, 10*time.Second, "subscriber live at head 0", func() bool {
		live := false
		ts.onLoop(t, func() { s := sub(); live = s != nil && s.state == subLive && s.cursor == 0 })
		return live
	})
	// More events than the stream's ring keeps, so that catching up reads the table, which
	// has been pruned by then. All of it happens while the loop is held, before the next tick
	// could resume the connection.
	// (Events of 1 KiB: the ring's bytes bound keeps fewer than a thousand, and the SQL stays
	// quick under load — 2 × ringMaxEvents small events ran past onLoop's 10 s at load 28.)
	const total, kept, size = 2048, 3, 1 << 10
	require.Greater(t, total*size, ringMaxBytes)
	ts.onLoop(t, func() {
		ts.subs.pause(sub()) // as deliver does over the high watermark
		pgtest.Exec(t, ts.DSN, fmt.Sprintf("SELECT pgsse.publish('lag0', lpad(g::text, %d, 'x')) FROM generate_series(1, %d) g", size, total))
		pgtest.Exec(t, ts.DSN, fmt.Sprintf("SELECT pgsse.prune('0 seconds', %d)", kept))
	})
	ev := c.mustNextData(15 * time.Second)
	assert.Equal(t, "pgsse:gap", ev.Event, "the pruned events are announced: %v", ev)
	assert.Equal(t, fmt.Sprintf(`{"stream":"lag0","after":0,"resume":%d}`, total-kept), ev.Data)
	if ev.Event == "pgsse:gap" {
		ev = c.mustNextData(15 * time.Second)
	}
	for id := int64(total - kept + 1); id <= total; id++ {
		assert.Equal(t, strconv.FormatInt(id, 10), ev.IDValue)
		if id < total {
			ev = c.mustNextData(15 * time.Second)
		}
	}
}
