package engine

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pgsse/pgsse/framing"
)

// A handoff inside one test process (the processes' side is cmd/pgsse's handoff_test.go): two
// Servers on one database, the second serving on the first's inherited --listen, every
// connection moved with HandOver → Adopt over real sockets while publishers keep publishing.
// Every client keeps its connection and gets every durable event exactly once, in order.

// handoffReader reads one client's events on its own goroutine and checks them as they come.
type handoffReader struct {
	c     *sseClient
	multi int // streams of a GET /streams connection (composite ids); 0 = one stream

	mu        sync.Mutex
	last      []int64 // per stream position: the last durable id seen
	events    int
	headRetry bool
	err       error // the first broken rule, or the connection's end
}

func (r *handoffReader) run(done <-chan struct{}) {
	k := max(r.multi, 1)
	for {
		ev, err := r.c.next(200 * time.Millisecond)
		select {
		case <-done:
			return
		default:
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			continue
		}
		r.mu.Lock()
		switch {
		case err != nil:
			r.err = err
		case ev.Retry != "" && r.events == 0 && !r.headRetry:
			r.headRetry = true // the response head's
		case ev.Retry != "":
			r.err = errors.New("got a retry field: " + ev.Retry)
		case ev.Event != "":
			r.err = errors.New("got event " + ev.Event + ": " + ev.Data)
		case !ev.HasID:
			r.events++ // a channel notification
		default:
			r.events++
			pos, id := 0, ev.id()
			if r.multi > 0 {
				var cursors []int64
				pos, cursors = parseCompositeErr(ev.IDValue, k)
				if pos < 0 {
					r.err = errors.New("bad composite id " + ev.IDValue)
					break
				}
				id = cursors[pos]
			}
			if r.last[pos] != 0 && id != r.last[pos]+1 {
				r.err = errors.New("stream " + strconv.Itoa(pos) + ": id " + strconv.FormatInt(id, 10) +
					" after " + strconv.FormatInt(r.last[pos], 10) + " (a duplicate or a gap)")
			}
			r.last[pos] = id
		}
		failed := r.err != nil
		r.mu.Unlock()
		if failed {
			return
		}
	}
}

// waitEveryReaderHasEvents waits until each reader has read an event, failing at once on a
// reader's error (the handoff tests start moving only then).
func waitEveryReaderHasEvents(t *testing.T, readers []*handoffReader) {
	t.Helper()
	waitFor(t, 10*time.Second, "every client has events", func() bool {
		for i, r := range readers {
			if _, n, err := r.state(); n == 0 {
				require.NoError(t, err, "client %d", i)
				return false
			}
		}
		return true
	})
}

func (r *handoffReader) state() ([]int64, int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int64(nil), r.last...), r.events, r.err
}

// parseCompositeErr is parseComposite for a reader goroutine: -1 when id is not one.
func parseCompositeErr(id string, k int) (int, []int64) {
	pos, rest, ok := cutString(id, ':')
	p, err := strconv.Atoi(pos)
	if !ok || err != nil || p < 0 || p >= k {
		return -1, nil
	}
	cursors := make([]int64, 0, k)
	for range k {
		var e string
		e, rest, _ = cutString(rest, ',')
		n, err := strconv.ParseInt(e, 10, 64)
		if err != nil {
			return -1, nil
		}
		cursors = append(cursors, n)
	}
	return p, cursors
}

func cutString(s string, sep byte) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == sep {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// hubReader reads one raw hub worker's frames: each lossless notification on hjobs is the
// previous one's number plus one, unless a RESYNC came in between; at most one RESYNC.
type hubReader struct {
	w *rawWorker

	mu      sync.Mutex
	last    int
	n       int
	resyncs int
	err     error
}

func (r *hubReader) run(done <-chan struct{}) {
	resynced := false
	for {
		f, err := r.w.read(200 * time.Millisecond)
		select {
		case <-done:
			return
		default:
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			continue
		}
		r.mu.Lock()
		switch {
		case err != nil:
			r.err = err
		case f.Type == framing.TypeStatus && f.Status == framing.StatusResync:
			r.resyncs++
			resynced = true
			if r.resyncs > 1 {
				r.err = errors.New("more than one RESYNC")
			}
		case f.Type == framing.TypeNotify:
			v, _ := strconv.Atoi(string(f.Text))
			if r.n > 0 && v != r.last+1 && !(resynced && v > r.last) {
				r.err = errors.New("notification " + strconv.Itoa(v) + " after " + strconv.Itoa(r.last) + " without a RESYNC")
			}
			resynced = false
			r.last = v
			r.n++
		default:
			r.err = errors.New("unexpected frame " + f.Type.String())
		}
		failed := r.err != nil
		r.mu.Unlock()
		if failed {
			return
		}
	}
}

func (r *hubReader) state() (int, int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n, r.resyncs, r.err
}

func TestHandoffMovesEveryConnection(t *testing.T) {
	t.Parallel()
	a := startHub(t, nil)
	addr := a.Addr().String()
	tok := bearerH(allStreams(t))

	pubs := []*publisher{startPublisher(t, a.DSN, "h/1", 3*time.Millisecond), startPublisher(t, a.DSN, "h/2", 5*time.Millisecond)}
	notifyStop := make(chan struct{})
	notifyDone := make(chan struct{})
	go func() { // channel traffic
		defer close(notifyDone)
		conn := connectPlain(a.DSN)
		if conn == nil {
			return
		}
		defer conn.Close(context.Background())
		for i := 0; ; i++ {
			select {
			case <-notifyStop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			_ = conn.Exec(context.Background(), "SELECT pg_notify('hjobs', '"+strconv.Itoa(i)+"')").Close()
		}
	}()

	var readers []*handoffReader
	for i := range 24 {
		path := "/streams/h/1"
		if i%3 == 0 {
			path = "/streams/h/2"
		}
		readers = append(readers, &handoffReader{c: dial(t, addr, path, tok), last: make([]int64, 1)})
	}
	for range 8 {
		readers = append(readers, &handoffReader{c: dial(t, addr, "/streams?stream=h/1&stream=h/2", tok), multi: 2, last: make([]int64, 2)})
	}
	for range 4 {
		readers = append(readers, &handoffReader{c: dial(t, addr, "/channels/hjobs", tok), last: make([]int64, 1)})
	}
	var workers []*hubReader
	for i := range 4 {
		w := dialHub(t, a.cfg.HubSocket)
		w.hello("w" + strconv.Itoa(i))
		require.Equal(t, framing.AckOK, w.sub(1, framing.ModeLossless, "hjobs").Ack)
		workers = append(workers, &hubReader{w: w})
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Add(1)
		go func() { defer wg.Done(); w.run(done) }()
	}
	for _, r := range readers {
		require.Equal(t, 200, r.c.Status, r.c.Body)
		wg.Add(1)
		go func() { defer wg.Done(); r.run(done) }()
	}
	defer func() { close(done); wg.Wait() }()
	waitEveryReaderHasEvents(t, readers)

	// The successor: serves on the inherited --listen, accepting once the predecessor stops.
	accept := make(chan struct{})
	b := startSuccessor(t, a, addr, accept)
	hubBefore := make([]int, len(workers))
	for i, w := range workers {
		hubBefore[i], _, _ = w.state()
	}
	channelBefore := map[int]int{}
	for i := 32; i < len(readers); i++ {
		_, channelBefore[i], _ = readers[i].state()
	}
	a.StopAcceptingAll()
	close(accept)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	handed, err := a.HandOver(ctx, func(batch []HandedConn) error {
		fds, recs, err := dupHanded(batch)
		if err != nil {
			return err
		}
		return b.Adopt(fds, recs)
	})
	require.NoError(t, err)
	assert.Equal(t, len(readers)+len(workers), handed)
	a.Stop(t)

	// A new client and a new worker reach the successor on the same sockets.
	late := dial(t, addr, "/streams/h/1", tok)
	require.Equal(t, 200, late.Status)
	dialHub(t, a.cfg.HubSocket).hello("late")

	time.Sleep(300 * time.Millisecond) // publishing goes on across and after the move
	for _, p := range pubs {
		p.Stop()
	}
	close(notifyStop)
	<-notifyDone
	heads := []int64{pubs[0].last.Load(), pubs[1].last.Load()}
	want := func(i int) []int64 {
		switch r := readers[i]; {
		case r.multi > 0:
			return heads
		case i >= 32:
			return nil // a channel client
		case i%3 == 0:
			return heads[1:]
		default:
			return heads[:1]
		}
	}
	waitFor(t, 15*time.Second, "every subscriber has every event", func() bool {
		for i, r := range readers {
			last, _, err := r.state()
			if w := want(i); err == nil && w != nil && !assert.ObjectsAreEqual(w, last) {
				return false
			}
		}
		return true
	})
	for i, r := range readers {
		last, n, err := r.state()
		assert.NoError(t, err, "client %d (%d events, last %v): its connection and its events", i, n, last)
		if w := want(i); w != nil {
			assert.Equal(t, w, last, "client %d has every event of its streams", i)
		} else {
			assert.Greater(t, n, channelBefore[i], "channel client %d gets notifications after the move", i)
		}
	}
	for i, w := range workers {
		n, resyncs, err := w.state()
		assert.NoError(t, err, "worker %d: its connection and its notifications", i)
		assert.Greater(t, n, hubBefore[i], "worker %d gets notifications after the move", i)
		assert.LessOrEqual(t, resyncs, 1, "worker %d: at most one RESYNC", i)
	}
	b.onLoop(t, func() {
		assert.Equal(t, len(readers)+1, b.conns.subscribers())
		assert.Equal(t, len(workers)+1, b.hub.count())
	})
}

// One loop task hands over every connection that is ready (at least handoffTaskMin of them),
// sent to the successor a batch at a time: with one batch of handoffBatch per task, a move of
// 15,000 connections took 235 loop turns, each behind a delivery round to the connections
// left, and ran past the 30 s move timeout (bench/RESULTS.md, scenario 17).
func TestHandOverMovesManyBatchesPerLoopTask(t *testing.T) {
	t.Parallel()
	const n = 3*handoffBatch + 5
	require.LessOrEqual(t, n, handoffTaskMin)
	ts := startServer(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	streaming := dialStreaming(t, ctx, ts, n, 10*time.Second)

	ts.StopAcceptingAll()
	var sizes []int
	left := -1 // connections still streaming here when the first batch is sent
	handed, err := ts.HandOver(ctx, func(batch []HandedConn) error {
		if len(sizes) == 0 {
			left = streaming()
		}
		sizes = append(sizes, len(batch))
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, n, handed)
	assert.Equal(t, []int{handoffBatch, handoffBatch, handoffBatch, 5}, sizes, "sent a batch of descriptors at a time")
	assert.Zero(t, left, "the first loop task handed over every connection that was ready, not one batch")
}

// dupHanded is what a test's handover callback sends on: each handed connection's descriptor
// (a duplicate, as SCM_RIGHTS would give the successor) and its record.
func dupHanded(batch []HandedConn) ([]int, [][]byte, error) {
	fds := make([]int, len(batch))
	recs := make([][]byte, len(batch))
	for i, h := range batch {
		fd, err := unix.Dup(h.FD)
		if err != nil {
			return nil, nil, err
		}
		fds[i], recs[i] = fd, h.Record
	}
	return fds, recs, nil
}

// startSuccessor starts a successor of a as cmd/pgsse does: serving on a's --listen (addr)
// and hub socket, inherited, accepting once accept is closed (the predecessor stopped);
// tweaks apply a's other settings (cmd/pgsse's successor has the same flags).
func startSuccessor(t *testing.T, a *testServer, addr string, accept chan struct{}, tweaks ...func(*Config)) *testServer {
	t.Helper()
	sseFD, hubFD, err := a.ListenerFDs()
	require.NoError(t, err)
	inherit := func(fd int) net.Listener {
		f := os.NewFile(uintptr(fd), "inherited")
		ln, err := net.FileListener(f)
		require.NoError(t, err)
		_ = f.Close()
		return ln
	}
	return startServer(t, a.DSN, func(c *Config) {
		c.Listen = addr
		c.HubSocket = a.cfg.HubSocket
		c.Inherited = &Inheritance{SSE: inherit(sseFD), Hub: inherit(hubFD), Accept: accept}
		for _, tw := range tweaks {
			tw(c)
		}
	})
}

// A loop task whose turn came late hands over for longer: its budget after handoffTaskMin is a
// half of the time it waited behind the loop's rounds (a delivery round to every connection
// still here), up to handoffTaskMax. At 15,000 connections on a loaded host each task of about
// 256 waited 420 ms, and 54 of them ran the move past its 30 s timeout (bench/RESULTS.md,
// scenario 17, task deployscale: between_sends 22.7 s of 30.1 s). Here the loop is kept busy
// for 300 ms before the first task: it then hands over all n at once.
func TestHandOverTaskThatWaitedMovesMore(t *testing.T) {
	t.Parallel()
	const n = 1000
	require.LessOrEqual(t, n, handoffTaskMax)
	ts := startServer(t, "", func(c *Config) { c.MaxConnectionsPerSubject = NoLimit })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	streaming := dialStreaming(t, ctx, ts, n, 20*time.Second)

	ts.StopAcceptingAll()
	ts.tasks.push(func() { time.Sleep(300 * time.Millisecond) }) // a slow round
	left := -1                                                   // connections still streaming here when the first batch is sent
	handed, err := ts.HandOver(ctx, func(batch []HandedConn) error {
		if left < 0 {
			left = streaming()
		}
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, n, handed)
	assert.Zero(t, left, "the first loop task, 300 ms late, handed over every connection")
}

// dialStreaming opens n subscriptions of /streams/m/1 to ts and waits (up to wait) until every
// one streams; it returns how many connections stream on ts (read on its loop, within ctx).
func dialStreaming(t *testing.T, ctx context.Context, ts *testServer, n int, wait time.Duration) func() int {
	t.Helper()
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	for range n {
		c := dial(t, addr, "/streams/m/1", tok)
		require.Equal(t, 200, c.Status, c.Body)
	}
	streaming := func() (k int) {
		require.NoError(t, ts.loopDo(ctx, func() {
			for _, sc := range ts.conns.all() {
				if !sc.closed && sc.state == stateStreaming {
					k++
				}
			}
		}))
		return k
	}
	waitFor(t, wait, "every connection streams", func() bool { return streaming() == n })
	return streaming
}
