package engine

import (
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/store"
)

func storeResult(t0 time.Time) store.PublishResult {
	return store.PublishResult{IDs: []int64{0}, Times: store.PublishTimes{Queued: t0, Sent: t0, Committed: t0}}
}

// stageCounts are the observation counts of pgsse_publish_stage_seconds by stage.
func stageCounts(t testing.TB, reg prometheus.Gatherer) map[string]uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "pgsse_publish_stage_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "stage" {
					got[l.GetValue()] = m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return got
}

// Issue 20: pgsse_publish_stage_seconds{stage} measures each stage of an HTTP publish —
// head (for a kept-alive publisher's later requests), body, queued, sent, committed,
// answered, notified — and the written stage of every live durable event, SQL-published too.
func TestPublishStages(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	ts := startServer(t, "", func(c *Config) { c.Registry = reg })
	addr := ts.Addr().String()
	sub := dial(t, addr, "/streams/st/1", bearerH(allStreams(t)))
	require.Equal(t, 200, sub.Status, sub.Body)
	c := dialPub(t, addr)
	authz := bearerH(publishToken(t, "st/*"))

	// Until its catch-up has ended, a subscription gets events from the table or the ring,
	// which have no written stage: SQL publishes until one is written live. Each has only
	// the written stage.
	next := int64(0)
	for live := false; !live; {
		require.Less(t, next, int64(20), "the subscription never went live")
		next++
		before := stageCounts(t, reg)
		pgtest.Exec(t, ts.DSN, "SELECT pgsse.publish('st/1', 'sql"+strconv.FormatInt(next, 10)+"')")
		assert.Equal(t, "sql"+strconv.FormatInt(next, 10), sub.mustNextData(10*time.Second).Data)
		after := stageCounts(t, reg) // the flush observes after writing: a late one counts next time
		live = after["written"] >= before["written"]+1
		for _, s := range publishStageLabels[:stageWritten] {
			assert.Equal(t, before[s], after[s], s)
		}
	}

	before := stageCounts(t, reg)
	const n = 3
	for i := 1; i <= n; i++ {
		p := decodePublished(t, c.do(post("/streams/st/1", "e"+strconv.Itoa(i), authz)))
		require.Equal(t, next+int64(i), *p.ID)
		assert.Equal(t, "e"+strconv.Itoa(i), sub.mustNextData(10*time.Second).Data)
	}
	// The notified stage is recorded when the notification is routed, which may follow the
	// answer: wait for it rather than for a guess of time.
	require.Eventually(t, func() bool {
		got := stageCounts(t, reg)
		return got["notified"] >= before["notified"]+n && got["written"] >= before["written"]+n
	}, 10*time.Second, 5*time.Millisecond, "stages %v, before %v", stageCounts(t, reg), before)
	got := stageCounts(t, reg)
	for _, s := range []string{"body", "queued", "sent", "committed", "answered"} {
		assert.EqualValues(t, n, got[s]-before[s], s)
	}
	assert.EqualValues(t, n-1, got["head"]-before["head"], "the first request's connection had no publish state yet")
	assert.EqualValues(t, n, got["notified"]-before["notified"], "whichever of the commit's answer and the notification comes first")
	assert.EqualValues(t, n, got["written"]-before["written"])
}

// BenchmarkPublishStages is what the stages cost one HTTP-published event on the loop: the
// loop's clock readings (head seen, parsed, body, answered), the six observations at its
// answer, the stream's mark until its notification, the notified and written observations.
// The Publisher's readings (one per request, two per transaction) are not in it.
func BenchmarkPublishStages(b *testing.B) {
	vec := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "x", Buckets: prometheus.DefBuckets}, []string{"stage"})
	c := newStageClock(vec)
	p := &publishing{loopEnv: &loopEnv{stages: c}}
	sc := &sseConn{ext: &connExt{pub: &publishConn{stream: "bench/1"}}}
	pub := sc.publisher()
	stream := []byte(pub.stream)
	items := []*event{{id: 1}}
	t0 := time.Now()
	res := storeResult(t0)
	b.ReportAllocs()
	c.submitted(pub.stream)
	for i := range b.N {
		p.headSeen(sc)
		st := &pub.stamps
		st.head, st.parsed, st.seen = st.headAt, time.Now(), false
		st.body = time.Now()
		res.IDs[0] = int64(i + 1)
		p.observeStages(pub, &res, time.Now())
		now := time.Now()
		c.notified(stream, int64(i+1), now)
		items[0].received = now.UnixNano()
		c.written(items, time.Now())
	}
}
