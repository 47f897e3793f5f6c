package engine

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A connection sent away while it lags (a drain, a sibling that stops serving) keeps only
// the event its socket has begun, then gets its last bytes — and nothing after them: its
// subscriptions must not catch up from the ring onto a closing connection. Otherwise the
// events dropped from its queue are skipped on the wire and, on a connection following
// several streams, the composite id sent after them names cursors the client never reached
// (found by the chaos run, seed 1: multi01-slow-k2).
func TestLaggingConnectionSentAwayGetsNothingAfterItsLastBytes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		path    string
		streams []string
	}{
		{"one stream", "/streams/close1", []string{"close1"}},
		{"two streams", "/streams?stream=close2a&stream=close2b", []string{"close2a", "close2b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// A small kernel send buffer: the server's own queue holds the backlog, and the
			// ring (512 events) still holds where the subscriptions paused.
			ts := startServer(t, "", func(c *Config) { c.SSESendBuffer = MinSSESendBuffer })
			slow := dialWith(t, tinyRcvBuf(4096), ts.Addr().String(), tc.path, bearerH(allStreams(t)))
			require.Equal(t, 200, slow.Status)
			pub := connect(t, ts.DSN)
			// 400 KiB in all: over the 256 KiB high watermark, within the ring.
			perStream, size := 400/len(tc.streams), 1<<10
			for i := 0; i < perStream; i += 20 {
				for _, st := range tc.streams {
					_, err := pub.Exec(context.Background(), fmt.Sprintf(
						"SELECT pgsse.publish('%s', lpad(g::text, %d, 'x')) FROM generate_series(%d, %d) g", st, size, i+1, i+20)).ReadAll()
					require.NoError(t, err)
				}
			}
			lagging := func() bool {
				n := 0
				ts.onLoop(t, func() {
					for _, sc := range ts.conns.list {
						for i := range sc.subCount() {
							if sub := sc.sub(i); sub.stream() != nil && sub.state == subLagging && sub.stream().inRing(sub.cursor) {
								n++
							}
						}
					}
				})
				return n == len(tc.streams)
			}
			waitFor(t, 15*time.Second, "every subscription lagging, its cursor in the ring", lagging)
			// Send it away as a drain does, then run the tick's resume of lagging
			// subscriptions: its queue is now below the low watermark.
			ts.onLoop(t, func() {
				ts.conns.retryAll(shedDraining)
				ts.subs.resumeLagging()
			})

			last := make([]int64, len(tc.streams))
			seen, sentAway := false, false
			for {
				ev, err := slow.next(15 * time.Second)
				if isEOF(err) {
					break
				}
				require.NoError(t, err)
				if ev.Retry != "" && !ev.HasID {
					sentAway = seen // the response head has one too
					continue
				}
				seen = true
				require.False(t, sentAway, "an event (id %q) after the connection's last bytes", ev.IDValue)
				require.True(t, ev.HasID, "a durable event without an id: %+v", ev)
				k, cursors := 0, []int64{ev.id()}
				if len(tc.streams) > 1 {
					pos, list, ok := strings.Cut(ev.IDValue, ":")
					require.True(t, ok, "composite id %q", ev.IDValue)
					k, _ = strconv.Atoi(pos)
					cursors = cursors[:0]
					for _, c := range strings.Split(list, ",") {
						n, err := strconv.ParseInt(c, 10, 64)
						require.NoError(t, err, "composite id %q", ev.IDValue)
						cursors = append(cursors, n)
					}
				}
				for i, c := range cursors {
					want := last[i]
					if i == k {
						want++
					}
					require.Equal(t, want, c, "id %q: entry %d (%s) — the client had %v", ev.IDValue, i, tc.streams[i], last)
				}
				last[k] = cursors[k]
			}
			require.True(t, sentAway, "the connection ended without its retry field")
		})
	}
}
