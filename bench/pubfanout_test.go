//go:build linux

package bench

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/internal/testkit/ssetest"
)

// With ByID the client numbers events by their SSE id, not by the publisher's number in the
// data: ids 1, 2, 3 in order are clean whatever the data says; a skipped id, a repeated one
// and an event without an id are each counted.
func TestClientChecksIDs(t *testing.T) {
	feed := func(body string) (*pollLoop, *sseConn) {
		c := &Client{cfg: ClientConfig{ByID: true}, counts: make([]atomic.Int32, 8), refs: make([]atomic.Int64, 8)}
		l := &pollLoop{c: c, first: make([]int64, 8), last: make([]int64, 8)}
		sc := &sseConn{s: ssetest.Decoder{Eager: true, MaxLine: maxLine}}
		sc.s.Feed([]byte(body), func(b *ssetest.Block) {
			if b.HasData {
				l.event(sc, b, 1)
			}
		})
		return l, sc
	}
	l, sc := feed("id: 1\ndata: 7 100\n\nid: 2\ndata: 3 100\n\nid: 3\ndata: 9 100\n\n")
	assert.Equal(t, int64(3), sc.events)
	assert.Zero(t, sc.gaps+sc.dups+l.bad, "the data's publisher numbers are out of order: not a gap with ByID")
	assert.Equal(t, 1, int(l.c.counts[3].Load()))

	_, sc = feed("id: 1\ndata: 1 100\n\nid: 3\ndata: 2 100\n\nid: 3\ndata: 3 100\n\n")
	assert.Equal(t, int64(1), sc.gaps, "id 2 skipped")
	assert.Equal(t, int64(1), sc.dups, "id 3 twice")

	l, _ = feed("data: 1 100\n\nid: x1\ndata: 2 100\n\n")
	assert.Equal(t, int64(2), l.bad, "an event without a numeric id")
}

// Scenario 16 at small scale (200 subscribers; 2 and 64 publishers over SQL, then over HTTP,
// a second each): both paths publish, every subscriber of every phase has every event once and
// in id order, and each figure the full run reports is there.
func TestPublishersUnderFanout(t *testing.T) {
	pg := servers(t)[0]
	env := &Env{Cluster: UseCluster(pgtest.URL(t)), Dir: t.TempDir(), Logf: t.Logf}
	p := Small()
	p.Sources = 4
	rs, err := PubFanout(context.Background(), env, pg, p.PubFanout, p)
	require.NoError(t, err)
	require.Len(t, rs, 2)
	for _, r := range rs {
		logResult(t, r)
		for _, n := range []string{"2 publishers", "64 publishers"} {
			assert.Positive(t, figure(t, r, n+": durable events"), r.Target)
			assert.Positive(t, figure(t, r, n+": answer latency p99"), r.Target)
			assert.Positive(t, figure(t, r, n+": server CPU per million deliveries"), r.Target)
			assert.Equal(t, float64(p.PubFanout.Conns), figure(t, r, n+": subscribers with every event after the drain"), r.Target)
			assert.Positive(t, figure(t, r, n+": end of publishing → every subscriber had every event"), r.Target)
			for _, zero := range []string{"subscribers with an id gap", "ids skipped", "ids repeated or out of order",
				"events without a numeric id or data", "subscribers closed by the server"} {
				assert.Zero(t, figure(t, r, n+": "+zero), "%s %s: %s", r.Target, n, zero)
			}
		}
	}
}
