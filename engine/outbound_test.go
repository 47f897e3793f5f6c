package engine

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

// queueServer is a Server that is not running, with the write path's epoll set, and n live
// connections over socket pairs whose sending side holds little (SO_SNDBUF).
func queueServer(t *testing.T, n int) (*Server, []*recordConn, []*sseConn) {
	t.Helper()
	s, err := New(Config{Heartbeat: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	require.NoError(t, s.out.init())
	t.Cleanup(s.out.close)
	var cs []*recordConn
	var scs []*sseConn
	for range n {
		c := newRecordConn(t)
		require.NoError(t, unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4096))
		sc := s.conns.open(c)
		s.lsn.up = true
		admitNow(s, sc, 0)
		s.conns.respond(sc)
		cs = append(cs, c)
		scs = append(scs, sc)
	}
	return s, cs, scs
}

// fill writes transient bytes to sc until its socket is full and something is queued.
func fill(s *Server, sc *sseConn) []byte {
	var all []byte
	for i := 0; sc.pending() == 0; i++ {
		b := bytes.Repeat([]byte{'a' + byte(i%26)}, 1024)
		all = append(all, b...)
		s.conns.write(sc, b)
	}
	return all
}

// Live writes queue durable events only up to the limit once the queue holds something; the
// first event is always taken, ephemeral events always are.
func TestOutboundLiveLimit(t *testing.T) {
	s, _, scs := queueServer(t, 1)
	sc := scs[0]
	big := &event{id: 1, enc: bytes.Repeat([]byte("b"), 64<<10)}
	// An empty queue takes the first event whatever its size (the kernel takes some).
	require.Equal(t, 1, s.conns.writeLive(sc, liveItems(big), 1024))
	require.Positive(t, sc.pending())
	small := func(id int64) *event {
		return &event{id: id, enc: []byte("id: " + strconv.FormatInt(id, 10) + "\ndata: x\n\n")}
	}
	eph := &event{enc: []byte("data: e\n\n")}
	evs := []*event{small(2), eph, small(3)}
	before := sc.pending()
	n := s.conns.writeLive(sc, liveItems(evs...), before+len(evs[0].enc))
	assert.Equal(t, 2, n, "the first durable event over the limit (id 3) and what follows is not sent")
	assert.Equal(t, before+len(evs[0].enc)+len(eph.enc), sc.pending(), "the ephemeral event is queued anyway")
	assert.EqualValues(t, 1, evs[0].queued)
	assert.EqualValues(t, 1, eph.queued)
	assert.Zero(t, evs[2].queued)
}

// liveItems are the items a single-stream subscription writes for evs.
func liveItems(evs ...*event) []outItem {
	var items []outItem
	for _, ev := range evs {
		items = append(items, sharedItem(ev))
	}
	return items
}

// The limits shrink from the unpressured values at a quarter of the budget to floors from the
// per-connection share at half of it.
func TestOutboundLimits(t *testing.T) {
	s, err := New(Config{MaxOutboundMemory: 64 << 20, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	s.conns.active = 1000
	full := outLimits{high: durableHighBytes, slice: durableSliceBytes, low: durableHighBytes / 4, ephemeral: ephemeralLimitBytes}
	// share = 64 MiB / 1000 = 67108 B: high floor 8388, ephemeral floor 33554
	floor := outLimits{high: 8388, slice: 8388, low: 8388 / 4, ephemeral: 33554}
	mid := durableHighBytes - (durableHighBytes-8388)/2
	for _, tc := range []struct {
		total, reading int
		want           outLimits
	}{
		{0, 0, full},
		{16 << 20, 0, full},
		{32 << 20, 0, floor},
		{1 << 30, 0, floor},
		{24 << 20, 0, outLimits{high: mid, slice: durableSliceBytes, low: mid / 4, ephemeral: ephemeralLimitBytes - (ephemeralLimitBytes-33554)/2}},
		{16 << 20, 8 << 20, outLimits{high: mid, slice: durableSliceBytes, low: mid / 4, ephemeral: ephemeralLimitBytes - (ephemeralLimitBytes-33554)/2}}, // reads in flight count
	} {
		s.out.total, s.out.reading = tc.total, tc.reading
		assert.Equal(t, tc.want, s.out.limits(), "total %d, reading %d", tc.total, tc.reading)
	}
	s.conns.active = 1_000_000 // a share below the floors
	s.out.total, s.out.reading = 64<<20, 0
	assert.Equal(t, outLimits{high: minWatermarkBytes, slice: minWatermarkBytes, low: minWatermarkBytes / 4, ephemeral: minEphemeralBytes}, s.out.limits())
}

// The budget holds: with --max-outbound-memory at 1 MiB, 30 durable subscribers that do not
// read and two channel subscribers that do not read, under a burst far larger than the budget,
// the queued bytes stay near the budget (not 30 × the 256 KiB watermark), the watermark
// shrinks, the channel subscribers over their share are closed with retry:, a reading
// subscriber gets everything, and the stalled durable ones, once they read, get every event
// with no gap and no duplicate.
func TestOutboundBudgetHolds(t *testing.T) {
	const budget = 1 << 20
	ts := startServer(t, "", func(c *Config) { c.MaxOutboundMemory = budget; c.Heartbeat = time.Hour })
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	const stalled, total, size = 30, 600, 4000

	var slow []*sseClient
	for range stalled {
		c := dialWith(t, tinyRcvBuf(4096), addr, "/streams/budget", tok)
		require.Equal(t, 200, c.Status)
		slow = append(slow, c)
	}
	var chans []*sseClient
	for range 2 {
		c := dialWith(t, tinyRcvBuf(4096), addr, "/channels/budget", tok)
		require.Equal(t, 200, c.Status)
		chans = append(chans, c)
	}
	reader := dial(t, addr, "/streams/budget", tok)
	require.Equal(t, 200, reader.Status)
	ts.shrinkSendBuffers(t)
	readerDone := make(chan error, 1)
	go func() { readerDone <- readContiguous(reader, 1, total, size, 60*time.Second) }()

	var maxTotal, minWatermark atomic.Int64
	minWatermark.Store(durableHighBytes)
	stopSampling := ts.sample(t, 10*time.Millisecond, func() {
		maxTotal.Store(max(maxTotal.Load(), int64(ts.out.total)))
		minWatermark.Store(min(minWatermark.Load(), int64(ts.out.limits().high)))
	})

	payload := strings.Repeat("p", size-10)
	for n := 0; n < total; n += 20 {
		pgtest.Exec(t, ts.DSN, fmt.Sprintf(
			"SELECT pgsse.publish('budget', lpad(g::text, 10, '0') || '%s'), pg_notify('budget', g::text || '%s') FROM generate_series(%d, %d) g",
			payload, payload, n+1, n+20))
	}
	require.NoError(t, <-readerDone, "the reading subscriber gets every event in order")
	stopSampling()
	t.Logf("budget %d KiB: most queued %d KiB, lowest high watermark %d B", budget>>10, maxTotal.Load()>>10, minWatermark.Load())
	// Without a budget the 30 stalled subscribers alone would queue ≈ 30 × 256 KiB. With it,
	// the total passes the budget only by what one write may add over a connection's share.
	assert.Less(t, maxTotal.Load(), int64(budget), "the queued bytes follow the budget")
	assert.Less(t, minWatermark.Load(), int64(durableHighBytes), "the watermark shrank under pressure")
	gauge := metricValue(t, ts.metrics.outboundWatermark)
	assert.Positive(t, gauge, "pgsse_outbound_watermark_bytes is reported")

	// The channel subscribers that did not read were closed over their share: what they
	// read now ends in retry: and EOF (the close waited for those last bytes).
	for i, c := range chans {
		assertJitteredRetry(t, c.retryBeforeEOF(30*time.Second, true))
		_ = i
	}
	assert.GreaterOrEqual(t, metricValue(t, ts.metrics.droppedSlowClient), 2.0)

	// The stalled durable subscribers read now: every event, no gap, no duplicate.
	var wg sync.WaitGroup
	errs := make([]error, stalled)
	for i, c := range slow {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = readContiguous(c, 1, total, size, 90*time.Second) }()
	}
	wg.Wait()
	for i, err := range errs {
		assert.NoError(t, err, "stalled subscriber %d", i)
	}
	// Once everyone drained, nothing is held.
	waitFor(t, 10*time.Second, "queues empty", func() bool {
		var n int
		ts.onLoop(t, func() { n = ts.out.total })
		return n == 0
	})
}

// sample runs f on the loop every interval until the returned stop is called (white-box
// sampling of loop-owned state while a test drives the server).
func (ts *testServer) sample(t *testing.T, every time.Duration, f func()) (stop func()) {
	t.Helper()
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-done:
				return
			case <-time.After(every):
			}
			ran := make(chan struct{})
			if !ts.tasks.push(func() { f(); close(ran) }) {
				return
			}
			<-ran
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { close(done); <-stopped }) }
	t.Cleanup(stop)
	return stop
}

// shrinkSendBuffers gives every SSE connection's socket a small send buffer (SO_SNDBUF 4 KiB,
// which also ends the kernel's autotuning): otherwise a loopback socket takes up to 4 MiB
// before anything stays in the server's queues.
func (ts *testServer) shrinkSendBuffers(t *testing.T) {
	t.Helper()
	ts.onLoop(t, func() {
		for _, sc := range ts.conns.list {
			if !sc.closed {
				require.NoError(t, unix.SetsockoptInt(sc.c.Fd(), unix.SOL_SOCKET, unix.SO_SNDBUF, 4096))
			}
		}
	})
}

// readContiguous reads events first..last (data "<10-digit id>…" of size bytes) from c,
// failing on a gap, a duplicate, a gap notice or a wrong size.
func readContiguous(c *sseClient, first, last int64, size int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	next := first
	for next <= last {
		ev, err := c.next(time.Until(deadline))
		if err != nil {
			return fmt.Errorf("waiting for id %d: %w", next, err)
		}
		if !ev.HasID && ev.Data == "" {
			continue
		}
		if ev.Event != "" {
			return fmt.Errorf("unexpected %q event before id %d: %v", ev.Event, next, ev)
		}
		if ev.IDValue != strconv.FormatInt(next, 10) {
			return fmt.Errorf("want id %d, got %q", next, ev.IDValue)
		}
		if len(ev.Data) != size || !strings.HasPrefix(ev.Data, fmt.Sprintf("%010d", next)) {
			return fmt.Errorf("id %d: %d bytes %.20q", next, len(ev.Data), ev.Data)
		}
		next++
	}
	return nil
}

// A large event is held once: queued for five subscribers that do not read, the total counts
// its encoding once (not five times), and each of them gets it whole once it reads.
func TestLargeEventQueuedOnce(t *testing.T) {
	const size = 3 << 20
	dsn := migratedDB(t)
	pgtest.Exec(t, dsn, "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET pgsse.max_event_bytes = 4194304', current_database()); END $$")
	ts := startServer(t, dsn, func(c *Config) { c.Heartbeat = time.Hour })
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	var subs []*sseClient
	for range 5 {
		c := dialWith(t, tinyRcvBuf(4096), addr, "/streams/large", tok)
		require.Equal(t, 200, c.Status)
		subs = append(subs, c)
	}
	ts.shrinkSendBuffers(t)
	conn := connect(t, dsn)
	_, err := conn.Exec(context.Background(), "SELECT pgsse.publish('large', repeat('v', "+strconv.Itoa(size)+"))").ReadAll()
	require.NoError(t, err)

	var held, queued int
	waitFor(t, 30*time.Second, "the event queued for every subscriber", func() bool {
		ts.onLoop(t, func() {
			held, queued = ts.out.total, 0
			for _, sc := range ts.conns.list {
				if sc.pending() > size/2 {
					queued++
				}
			}
		})
		return queued == 5
	})
	t.Logf("queued for %d subscribers; held %d KiB for an event of %d KiB", queued, held>>10, size>>10)
	assert.Less(t, held, size+size/4, "the encoding is held once, not once per subscriber")

	for i, c := range subs {
		_ = c.conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		ev := c.mustNextData(30 * time.Second)
		assert.Equal(t, "1", ev.IDValue, "subscriber %d", i)
		assert.Equal(t, size, len(ev.Data), "subscriber %d gets it whole", i)
	}
}

// The soft memory limit: the runtime's own memory + the live heap that is not queued + the
// budget (or half that heap when larger).
func TestMemoryLimitFor(t *testing.T) {
	m := newMemoryLimiter(64 << 20)
	// live 30 MiB of which 10 queued; total 100, objects 40, unused 5, free 15, released 20: non-heap 20
	assert.Equal(t, int64(20<<20+20<<20+64<<20), m.limitFor(30<<20, 100<<20, 40<<20, 5<<20, 15<<20, 20<<20, 10<<20))
	// a live heap far above the budget: half of it as headroom
	assert.Equal(t, int64(0+400<<20+200<<20), m.limitFor(400<<20, 400<<20, 400<<20, 0, 0, 0, 0))
}

// With Config.GoMemoryLimit the engine sets the soft memory limit while it runs and puts the
// previous one back when it stops; without it (GOMEMLIMIT set) it leaves it alone.
func TestGoMemoryLimitFollowsTheBudget(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	ts := startServer(t, "", func(c *Config) { c.GoMemoryLimit = true; c.MaxOutboundMemory = 64 << 20 })
	waitFor(t, 10*time.Second, "a memory limit set", func() bool { return debug.SetMemoryLimit(-1) != before })
	limit := debug.SetMemoryLimit(-1)
	assert.Greater(t, limit, int64(64<<20), "at least the budget")
	ts.Stop(t)
	assert.Equal(t, before, debug.SetMemoryLimit(-1), "restored when the engine stops")

	ts = startServer(t, "", nil)
	time.Sleep(2 * memoryLimitEvery) // nothing to wait for: the limit must stay as it is
	assert.Equal(t, before, debug.SetMemoryLimit(-1))
	ts.Stop(t)
}

// A slow durable subscriber under its watermark gets at most the watermark plus a slice of a
// large batch (here one table read of 200 events of 9,000 bytes: 1.8 MB), not the whole batch;
// the rest comes from the table once it reads, with no gap and no duplicate.
func TestSlowDurableCappedAtWatermarkPlusSlice(t *testing.T) {
	ts := startServer(t, "", func(c *Config) { c.Heartbeat = time.Hour })
	tok := bearerH(allStreams(t))
	slow := dialWith(t, tinyRcvBuf(4096), ts.Addr().String(), "/streams/cap", tok)
	require.Equal(t, 200, slow.Status)
	ts.shrinkSendBuffers(t)
	const size = 9000 // over NOTIFY's 8000 bytes: the events travel as wakes and are read from the table
	queued := func() (n int, st subState) {
		ts.onLoop(t, func() {
			for _, sc := range ts.conns.list {
				if sub := sc.streamSub("cap"); sub != nil {
					n, st = sc.pending(), sub.state
				}
			}
		})
		return n, st
	}
	streamLast := func() (l int64) {
		ts.onLoop(t, func() {
			if st := ts.fan.streams["cap"]; st != nil {
				l = st.last
			}
		})
		return l
	}
	// Fill the queue to just under the high watermark, one event at a time.
	next := 1
	for {
		n, st := queued()
		require.Equal(t, subLive, st)
		if n >= durableHighBytes-2*size {
			break
		}
		pgtest.Exec(t, ts.DSN, fmt.Sprintf("SELECT pgsse.publish('cap', lpad('%d', %d, '0'))", next, size))
		id := int64(next)
		waitFor(t, 10*time.Second, "event read and written", func() bool { return streamLast() == id })
		next++
	}
	var most atomic.Int64
	stop := ts.sample(t, time.Millisecond, func() {
		for _, sc := range ts.conns.list {
			if sc.streamSub("cap") != nil {
				most.Store(max(most.Load(), int64(sc.pending())))
			}
		}
	})
	// One transaction of 200 more: one wake, one table read of them all.
	pgtest.Exec(t, ts.DSN, fmt.Sprintf("SELECT pgsse.publish('cap', lpad(g::text, %d, '0')) FROM generate_series(%d, %d) g", size, next, next+199))
	last := next + 199
	waitFor(t, 10*time.Second, "the stream read", func() bool { return streamLast() == int64(last) })
	_, st := queued()
	stop()
	t.Logf("queued at most %d KiB; state %d", most.Load()>>10, st)
	assert.LessOrEqual(t, most.Load(), int64(durableHighBytes+durableSliceBytes+size+64), "at most the watermark plus a slice (plus the event that crosses it)")
	assert.Equal(t, subLagging, st, "paused: the rest comes from the table")
	for id := 1; id <= last; id++ {
		ev, err := slow.next(60 * time.Second)
		for err == nil && !ev.HasID && ev.Data == "" {
			ev, err = slow.next(60 * time.Second)
		}
		require.NoError(t, err, "waiting for id %d", id)
		require.Equal(t, strconv.Itoa(id), ev.IDValue, "no gap, no duplicate")
		require.Len(t, ev.Data, size)
	}
}

// Once the queues have been over a quarter of the budget and are low again, the loop asks for
// the heap to be given back (keepMemory runs debug.FreeOSMemory, at most every 10 s); the
// gauges follow the total.
func TestOutboundPressurePassing(t *testing.T) {
	s, err := New(Config{MaxOutboundMemory: 16 << 20, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	relieved := func() bool {
		select {
		case <-s.out.relieved:
			return true
		default:
			return false
		}
	}
	s.conns.active = 1000
	s.out.total = 2 << 20
	s.out.observe()
	assert.False(t, relieved(), "no pressure yet")
	s.out.total = 5 << 20 // over a quarter
	s.out.observe()
	assert.Equal(t, float64(5<<20), metricValue(t, s.metrics.outboundBytes))
	assert.Less(t, metricValue(t, s.metrics.outboundWatermark), float64(durableHighBytes))
	s.out.total = 2 << 20 // still over a sixteenth
	s.out.observe()
	assert.False(t, relieved())
	s.out.total = 512 << 10
	s.out.observe()
	assert.True(t, relieved(), "the pressure passed")
	assert.Equal(t, float64(durableHighBytes), metricValue(t, s.metrics.outboundWatermark))
	s.out.observe()
	assert.False(t, relieved(), "once per episode")
}
