package engine

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/framing"
	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

// readNotifies reads w's frames in a goroutine as fast as it can until it has n NOTIFYs or
// anything else arrives; the result says how many, in order, and what ended it ("" = n).
func readNotifies(w *rawWorker, n int, prefix string) <-chan string {
	out := make(chan string, 1)
	go func() {
		for i := 0; i < n; i++ {
			f, err := w.read(60 * time.Second)
			switch {
			case err != nil:
				out <- fmt.Sprintf("after %d notifications: %v", i, err)
				return
			case f.Type != framing.TypeNotify:
				out <- fmt.Sprintf("after %d notifications: %v %v %s", i, f.Type, f.Status, f.Text)
				return
			}
			if want := prefix + strconv.Itoa(i+1) + ":"; len(f.Text) < len(want) || string(f.Text[:len(want)]) != want {
				out <- fmt.Sprintf("notification %d: got %.20q", i+1, f.Text)
				return
			}
		}
		out <- ""
	}()
	return out
}

// notifyBurst sends n distinct notifications of about size bytes on channel in ONE
// transaction: PostgreSQL delivers them back to back, far faster than any worker reads.
func notifyBurst(t testing.TB, dsn, channel string, n, size int) {
	t.Helper()
	pgtest.Exec(t, dsn, fmt.Sprintf("DO $$ BEGIN FOR i IN 1..%d LOOP PERFORM pg_notify('%s', i || ':' || repeat('x', %d)); END LOOP; END $$", n, channel, size))
}

// TestHubBurstFastWorker: a lossless worker that reads as fast as it can receives a whole
// transaction far larger than its 1 MiB buffer and is not evicted (docs/hub-protocol.md: the
// hub writes only as fast as you read — and as fast as you read). Before the fix the hub
// queued a whole PostgreSQL read before writing anything (bytes went through gnet's buffer,
// which drains only between loop passes): 2,000 × 4 KB ended after 256–947 notifications
// with STATUS EVICTED, 20,000 × 100 B after 6,014.
func TestHubBurstFastWorker(t *testing.T) {
	for _, tc := range []struct{ n, size int }{{2000, 4000}, {20000, 100}} {
		t.Run(fmt.Sprintf("%dx%dB", tc.n, tc.size), func(t *testing.T) {
			ts := startHub(t, nil)
			require.Equal(t, DefaultHubWorkerBuffer, ts.cfg.HubWorkerBuffer)
			w := dialHub(t, ts.cfg.HubSocket)
			w.hello("fast")
			require.Equal(t, framing.AckOK, w.sub(1, framing.ModeLossless, "burst").Ack)
			got := readNotifies(w, tc.n, "")
			notifyBurst(t, ts.DSN, "burst", tc.n, tc.size)
			assert.Empty(t, <-got, "every notification of the transaction, in order")
			assert.Zero(t, metricValue(t, ts.metrics.evictions))
			t.Logf("the hub waited %.3f s for the worker in all", metricValue(t, ts.metrics.hubStallSeconds))
		})
	}
}

// TestHubBurstWorkerProcess: the same with a worker process on pglisten's failover Listener
// (which a Go worker uses), printing every notification: it stays on the hub and gets the
// whole transaction (before the fix it was evicted and switched to a session of its own,
// having missed the rest).
func TestHubBurstWorkerProcess(t *testing.T) {
	bin := buildWorker(t)
	ts := startHub(t, nil)
	w := startWorker(t, bin, "fast", ts.cfg.HubSocket, ts.DSN, "lossless", "burst")
	require.Equal(t, "hub", w.expectEv(15*time.Second, "ready").Source)
	const n, size = 2000, 4000
	notifyBurst(t, ts.DSN, "burst", n, size)
	for i := range n {
		l := w.nextLine(30 * time.Second)
		require.Equal(t, "notify", l.Ev, "line %d: %+v", i, l)
		require.Equal(t, "hub", l.Source)
		require.Equal(t, strconv.Itoa(i+1)+":", string(l.Payload[:len(strconv.Itoa(i+1))+1]), "in order")
	}
	assert.Zero(t, metricValue(t, ts.metrics.evictions))
	t.Logf("the hub waited %.3f s for the worker in all", metricValue(t, ts.metrics.hubStallSeconds))
}

// TestHubBurstStoppedWorker: a lossless worker that does not read is still evicted (SPEC §5)
// — after the hub waited at most hubStallMaxMS for it — and delivery to everyone else (a
// worker that reads, an SSE client on another channel) resumes then; its notifications on the
// channel arrive complete and in order.
func TestHubBurstStoppedWorker(t *testing.T) {
	ts := startHub(t, nil)
	stopped := dialHub(t, ts.cfg.HubSocket)
	stopped.hello("stopped")
	require.Equal(t, framing.AckOK, stopped.sub(1, framing.ModeLossless, "burst").Ack)
	other := dialHub(t, ts.cfg.HubSocket)
	other.hello("other")
	require.Equal(t, framing.AckOK, other.sub(1, framing.ModeLossless, "other").Ack)
	sse := dial(t, ts.Addr().String(), "/channels/other", bearerH(token(t, authClaimsChannels("other"), time.Hour)))
	require.Equal(t, "pgsse", sse.firstComment(10*time.Second))

	const n, size = 2000, 4000
	gotOther := readNotifies(other, 2, "o")
	pgtest.Exec(t, ts.DSN, fmt.Sprintf(`DO $$ BEGIN
		PERFORM pg_notify('other', 'o1:before');
		FOR i IN 1..%d LOOP PERFORM pg_notify('burst', i || ':' || repeat('x', %d)); END LOOP;
		PERFORM pg_notify('other', 'o2:after');
	END $$`, n, size))
	assert.Empty(t, <-gotOther, "the other worker gets its notifications, those after the burst too")
	assert.Equal(t, "o1:before", sse.mustNextData(10*time.Second).Data)
	assert.Equal(t, "o2:after", sse.mustNextData(10*time.Second).Data, "the SSE client too")
	assert.Equal(t, 1.0, metricValue(t, ts.metrics.evictions), "the worker that does not read is evicted")
	stall := metricValue(t, ts.metrics.hubStallSeconds)
	t.Logf("the hub waited %.3f s for the stopped worker", stall)
	assert.GreaterOrEqual(t, stall, float64(hubStallMaxMS)/1000, "it waited for the stopped worker as long as it may")
	assert.Less(t, stall, float64(hubStallMaxMS+2*tickFast.Milliseconds()+100)/1000, "and not longer (a tick late at most, and a loaded machine)")

	// What the stopped worker reads now: whole frames, in order, then EVICTED.
	frames, err := stopped.untilClosed(20 * time.Second)
	require.NoError(t, err)
	require.NotEmpty(t, frames)
	for i, f := range frames[:len(frames)-1] {
		require.Equal(t, framing.TypeNotify, f.Type)
		require.Equal(t, strconv.Itoa(i+1)+":", string(f.Text[:len(strconv.Itoa(i+1))+1]))
	}
	last := frames[len(frames)-1]
	assert.Equal(t, framing.StatusEvicted, last.Status, "EVICTED last (%d notifications before it)", len(frames)-1)
}

// TestHubStallBudget: workers that stop reading one after another hold delivery up for
// hubStallMaxMS each only while the stall budget lasts (hubStallBudgetMS); beyond it a
// lossless notification that does not fit evicts at once, so all of them together delay
// everyone else by at most the budget (and a tick per stall).
func TestHubStallBudget(t *testing.T) {
	const workers = 16 // 16 × hubStallMaxMS = 1.6 s, more than the budget
	ts := startHub(t, func(c *Config) { c.HubWorkerBuffer = MinHubWorkerBuffer })
	var ws []*rawWorker
	for i := range workers {
		w := dialHub(t, ts.cfg.HubSocket)
		w.hello("stopped")
		require.Equal(t, framing.AckOK, w.sub(1, framing.ModeLossless, fmt.Sprintf("w%d", i)).Ack)
		ws = append(ws, w)
	}
	reader := dialHub(t, ts.cfg.HubSocket)
	reader.hello("reader")
	require.Equal(t, framing.AckOK, reader.sub(1, framing.ModeLossless, "tail").Ack)
	got := readNotifies(reader, 1, "t")
	// Each worker's channel gets three rings' worth in turn: they fill one after another.
	per := 3 * MinHubWorkerBuffer / 4000
	start := time.Now()
	pgtest.Exec(t, ts.DSN, fmt.Sprintf(`DO $$ BEGIN
		FOR w IN 0..%d LOOP FOR i IN 1..%d LOOP PERFORM pg_notify('w' || w, i || ':' || repeat('x', 4000)); END LOOP; END LOOP;
		PERFORM pg_notify('tail', 't1:');
	END $$`, workers-1, per))
	assert.Empty(t, <-got)
	elapsed := time.Since(start)
	t.Logf("the tail notification arrived %v after the commit began", elapsed)
	assert.Equal(t, float64(workers), metricValue(t, ts.metrics.evictions), "every worker that does not read is evicted")
	stall := metricValue(t, ts.metrics.hubStallSeconds)
	t.Logf("the hub waited %.3f s in all", stall)
	// The budget, plus the tenth of the time it regains meanwhile, plus a few ms per stall for
	// the timer and the loop.
	bound := float64(hubStallBudgetMS)/1000 + elapsed.Seconds()/hubStallRefill + workers*0.005
	assert.Less(t, stall, bound, "all stalls together stay within the budget")
	assert.Greater(t, stall, float64(hubStallBudgetMS)/2/1000, "the budget was used")
}
