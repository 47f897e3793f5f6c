package engine

import (
	"net"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

// Early local delivery (issue 20; docs/architecture.md): an event published over HTTP reaches
// this process's subscribers as soon as its COMMIT is answered, without the NOTIFY round trip,
// when it is the next id the stream expects; otherwise its notification delivers it. These
// tests hold the notifications back for real: the LISTEN session's backend is stopped
// (SIGSTOP) for well under its ping interval, so nothing but the early path can deliver.

// earlyCount reads pgsse_early_deliveries_total.
func earlyCount(t *testing.T, ts *testServer) float64 {
	var m dto.Metric
	require.NoError(t, ts.metrics.earlyDeliveries.Write(&m))
	return m.GetCounter().GetValue()
}

// stopListener stops the LISTEN backend (pgsse-listen) of the test database — the cluster is
// shared with other packages' tests — and returns what resumes it
// (also run at cleanup).
func stopListener(t *testing.T, dsn string) (resume func()) {
	t.Helper()
	pid, err := strconv.Atoi(pgtest.QueryValue(t, dsn, "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgsse-listen' AND datname = current_database()"))
	require.NoError(t, err, "one LISTEN session on the host")
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	var once sync.Once
	resume = func() { once.Do(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) }
	t.Cleanup(resume)
	return resume
}

// The subscriber here gets the event while the notification is held; a --procs sibling (and
// so any other process) gets it once the notification comes, and the subscriber here does not
// get it twice; event name, audience and multi-stream connections take the early path too.
func TestEarlyDeliveryBeforeTheNotification(t *testing.T) {
	ts := startServer(t, "", nil)
	sib := startSibling(t, ts, nil)
	addr := ts.Addr().String()
	sub := dial(t, addr, "/streams/early/a", bearerH(allStreams(t, "user:7")))
	require.Equal(t, 200, sub.Status, sub.Body)
	multi := dial(t, addr, "/streams?stream=early/b&stream=early/a", bearerH(allStreams(t)))
	require.Equal(t, 200, multi.Status, multi.Body)
	other := dial(t, sib.Addr().String(), "/streams/early/a", bearerH(allStreams(t)))
	require.Equal(t, 200, other.Status, other.Body)
	c := dialPub(t, addr)
	authz := bearerH(publishToken(t, "early/*"))

	// The first event makes every subscription live (its notification may come first).
	require.Equal(t, int64(1), *decodePublished(t, c.do(post("/streams/early/a", "one", authz))).ID)
	for _, s := range []*sseClient{sub, multi, other} { // (multi's id is composite: 1:0,1)
		assert.Contains(t, []string{"1", "1:0,1"}, s.mustNextData(10*time.Second).IDValue)
	}
	early := earlyCount(t, ts)

	resume := stopListener(t, ts.DSN)
	held := time.Now()
	require.Equal(t, int64(2), *decodePublished(t, c.do(post("/streams/early/a?event=note", "two", authz))).ID)
	assert.Equal(t, sseEvent{HasID: true, IDValue: "2", Event: "note", Data: "two"}, sub.mustNextData(time.Second))
	m := newMultiReader(t, multi, []string{"early/b", "early/a"}, []int64{0, 1})
	ev, k := m.next(time.Second)
	assert.Equal(t, []any{1, "note", "two", int64(2)}, []any{k, ev.Event, ev.Data, m.at[1]})
	// An event for someone else: the early path checks the audience as the notification's does.
	require.Equal(t, int64(3), *decodePublished(t, c.do(post("/streams/early/a?audience=user:8", "three", authz))).ID)
	require.Equal(t, int64(4), *decodePublished(t, c.do(post("/streams/early/a?audience=user:7", "four", authz))).ID)
	assert.Equal(t, sseEvent{HasID: true, IDValue: "4", Data: "four"}, sub.mustNextData(time.Second))
	other.expectSilence(200 * time.Millisecond)
	require.Less(t, time.Since(held), 1500*time.Millisecond, "the notifications were held for less than the LISTEN ping interval")
	resume()
	assert.Equal(t, 3.0, earlyCount(t, ts)-early)

	// The sibling gets them from the notifications; here they are dropped as duplicates.
	other.readIDs(2, 2, 10*time.Second) // (3 and 4 are for tagged tokens)
	require.Equal(t, int64(5), *decodePublished(t, c.do(post("/streams/early/a", "five", authz))).ID)
	assert.Equal(t, "5", sub.mustNextData(10*time.Second).IDValue, "no event twice")
	assert.Equal(t, "5", other.mustNextData(10*time.Second).IDValue)
	_, k = m.next(10 * time.Second) // its token has no tags: 3 and 4 are not its
	assert.Equal(t, []any{1, int64(5)}, []any{k, m.at[1]}, "no event twice")
}

// An HTTP publish whose id is not the next the stream expects — an SQL publisher's event came
// between, its notification still held — is not delivered early: the notifications deliver both,
// in id order, once they come.
func TestEarlyDeliveryKeepsOrder(t *testing.T) {
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	sub := dial(t, addr, "/streams/order/a", bearerH(allStreams(t)))
	require.Equal(t, 200, sub.Status, sub.Body)
	c := dialPub(t, addr)
	authz := bearerH(publishToken(t, "order/*"))
	require.Equal(t, int64(1), *decodePublished(t, c.do(post("/streams/order/a", "1", authz))).ID)
	sub.readIDs(1, 1, 10*time.Second)

	resume := stopListener(t, ts.DSN)
	held := time.Now()
	pgtest.QueryValue(t, ts.DSN, "SELECT pgsse.publish('order/a', '2')") // committed; notification held
	require.Equal(t, int64(3), *decodePublished(t, c.do(post("/streams/order/a", "3", authz))).ID)
	sub.expectSilence(300 * time.Millisecond)
	require.Less(t, time.Since(held), 1500*time.Millisecond, "the notifications were held for less than the LISTEN ping interval")
	resume()
	sub.readIDs(2, 3, 10*time.Second)
	require.Equal(t, int64(4), *decodePublished(t, c.do(post("/streams/order/a", "4", authz))).ID)
	sub.readIDs(4, 4, 10*time.Second)
}

// Concurrent HTTP publishers (whose commits can be answered in any order relative to the
// notifications) and an SQL publisher on the same streams: every subscriber, single-stream or
// composite, gets every id exactly once and in order.
func TestEarlyDeliveryConcurrentPublishers(t *testing.T) {
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	subs := []*sseClient{
		dial(t, addr, "/streams/conc/a", bearerH(allStreams(t))),
		dial(t, addr, "/streams/conc/a", bearerH(allStreams(t))),
	}
	multi := dial(t, addr, "/streams?stream=conc/a&stream=conc/b", bearerH(allStreams(t)))
	for _, s := range append(subs, multi) {
		require.Equal(t, 200, s.Status, s.Body)
	}
	authz := bearerH(publishToken(t, "conc/*"))
	const perPublisher, publishers, sqlEvents = 40, 6, 60
	var wg sync.WaitGroup
	for i := range publishers {
		c := dialPub(t, addr)
		stream := "conc/a"
		if i%3 == 2 {
			stream = "conc/b"
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range perPublisher {
				r := c.do(post("/streams/"+stream, "h", authz))
				if !assert.Equal(t, 200, r.Status, r.Body) {
					return
				}
			}
		}()
	}
	conn := connectPlain(ts.DSN)
	defer conn.Close(t.Context())
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range sqlEvents {
			_, err := conn.Exec(t.Context(), "SELECT pgsse.publish('conc/a', 's')").ReadAll()
			if !assert.NoError(t, err) {
				return
			}
		}
	}()
	wg.Wait()
	nA := int64(perPublisher*(publishers-publishers/3) + sqlEvents)
	nB := int64(perPublisher * (publishers / 3))
	for _, s := range subs {
		s.readIDs(1, nA, 30*time.Second)
	}
	m := newMultiReader(t, multi, []string{"conc/a", "conc/b"}, nil)
	for range nA + nB {
		m.next(30 * time.Second)
	}
	for k, n := range []int64{nA, nB} {
		want := make([]int64, n)
		for i := range want {
			want[i] = int64(i + 1)
		}
		assert.Equal(t, want, m.ids[k], "stream %d: every id once, in order", k)
	}
	assert.Greater(t, earlyCount(t, ts), 0.0, "some took the early path")
}

// A publisher's answer never waits for a fan-out round (docs/architecture.md, Publishing):
// while rounds to a few thousand subscribers run back to back, the answers of the requests
// committed meanwhile are written between slices of the round, not after it — the answered
// stage (COMMIT answered → answer written). The same server under the same load with
// unsliced rounds is the baseline. (The request itself is still read between rounds: the
// whole call is bounded by a round, see bench/RESULTS.md.)
func TestPublishAnswerDoesNotWaitForFanout(t *testing.T) {
	subscribers := 3000
	if testing.Short() {
		subscribers = 1000
	}
	ts := startServer(t, "", func(c *Config) { c.MaxConnectionsPerSubject = NoLimit }) // one token for all
	addr := ts.Addr().String()
	head := request("GET", "/streams/bound/a", bearerH(allStreams(t)))
	for i := range subscribers {
		d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(1+i%5))}}
		c, err := d.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		_, err = c.Write([]byte(head)) // never read: a round is a write per subscriber
		require.NoError(t, err)
	}
	waitFor(t, 60*time.Second, "every subscriber live", func() bool {
		n := 0
		ts.onLoop(t, func() {
			if st := ts.fan.streams["bound/a"]; st != nil {
				n = len(st.subs)
			}
		})
		return n == subscribers
	})
	c := dialPub(t, addr)
	authz := bearerH(publishToken(t, "bound/*"))
	sql := connectPlain(ts.DSN)
	defer sql.Close(t.Context())
	answered := ts.metrics.publishStages.WithLabelValues("answered").(prometheus.Metric)
	stage := func() (sum float64, n uint64) {
		var m dto.Metric
		require.NoError(t, answered.Write(&m))
		return m.GetHistogram().GetSampleSum(), m.GetHistogram().GetSampleCount()
	}

	// answers is the mean answered stage of a publisher's calls while an SQL publisher keeps
	// the fan-out busy.
	answers := func(slice int) (mean time.Duration, calls uint64) {
		ts.onLoop(t, func() { ts.fan.sliceSubs = slice })
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, err := sql.Exec(t.Context(), "SELECT pgsse.publish('bound/a', 'x')").ReadAll()
				if !assert.NoError(t, err) {
					return
				}
				time.Sleep(2 * time.Millisecond) // a steady rate, not a flood: the subscribers do not read
			}
		}()
		sum0, n0 := stage()
		for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
			r := c.do(post("/streams/bound/p", "p", authz))
			require.Equal(t, 200, r.Status, r.Body)
		}
		close(stop)
		<-done
		sum, n := stage()
		require.Greater(t, n, n0)
		return time.Duration((sum - sum0) / float64(n-n0) * 1e9), n - n0
	}
	base, baseCalls := answers(1 << 30)
	mean, calls := answers(flushSliceSubs)
	t.Logf("%d subscribers: COMMIT answered → answer written, mean %v over %d calls with sliced rounds, %v over %d with whole rounds",
		subscribers, mean, calls, base, baseCalls)
	assert.Less(t, mean, base/3, "answers are written between slices of a round, not after it")
}
