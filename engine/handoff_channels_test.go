package engine

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/framing"
)

// Raw channels across a handoff (docs/architecture.md, Handoff positions): the successor
// LISTENs the predecessor's channels before it takes anything over, and every channel
// subscription — SSE and hub worker — resumes at its handoff position, so that with
// notifications published throughout, each one gets every notification exactly once, in
// order, and no worker needs a RESYNC. The handover of each batch is slowed down on purpose
// (handoffChannelsDelay) so that plenty of notifications arrive at the successor's session
// for connections still between the two processes: the gap an earlier attempt left.

const handoffChannelsDelay = 30 * time.Millisecond

// seqReader reads one channel client's or worker's notifications, each the previous one's
// number plus one.
type seqReader struct {
	mu      sync.Mutex
	first   int
	last    int
	n       int
	resyncs int
	err     error
}

func (r *seqReader) got(v int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n > 0 && v != r.last+1 && r.err == nil {
		r.err = errors.New("notification " + strconv.Itoa(v) + " after " + strconv.Itoa(r.last) + " (a duplicate or a gap)")
	}
	if r.n == 0 {
		r.first = v
	}
	r.last = v
	r.n++
}

func (r *seqReader) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = err
	}
}

func (r *seqReader) state() (n, last, resyncs int, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n, r.last, r.resyncs, r.err
}

func TestHandoffChannelsLoseNothing(t *testing.T) {
	t.Parallel()
	a := startHub(t, nil)
	addr := a.Addr().String()
	tok := bearerH(allStreams(t))

	// Notifications on two channels, one after the other, throughout.
	var published [2]atomic.Int64
	published[0].Store(-1)
	published[1].Store(-1)
	notifyStop := make(chan struct{})
	notifyDone := make(chan struct{})
	go func() {
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
			case <-time.After(time.Millisecond):
			}
			for c, name := range []string{"hco1", "hco2"} {
				if err := conn.Exec(context.Background(), "SELECT pg_notify('"+name+"', '"+strconv.Itoa(i)+"')").Close(); err != nil {
					return
				}
				published[c].Store(int64(i))
			}
		}
	}()

	done := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(done); wg.Wait() }()
	type reader struct {
		r  *seqReader
		ch int
	}
	var readers []reader
	for i := range 16 {
		c := dial(t, addr, "/channels/hco"+strconv.Itoa(1+i%2), tok)
		require.Equal(t, 200, c.Status, c.Body)
		r := &seqReader{}
		readers = append(readers, reader{r, i % 2})
		wg.Add(1)
		go func() {
			defer wg.Done()
			headRetry := false
			for {
				ev, err := c.next(200 * time.Millisecond)
				select {
				case <-done:
					return
				default:
				}
				var ne net.Error
				switch {
				case errors.As(err, &ne) && ne.Timeout():
				case err != nil:
					r.fail(err)
					return
				case ev.Retry != "" && ev.Data == "" && !headRetry:
					headRetry = true // the response head's
				case ev.Retry != "" || ev.Event != "" || ev.HasID:
					r.fail(errors.New("unexpected event " + ev.Event + ev.Retry + ev.IDValue))
					return
				default:
					v, _ := strconv.Atoi(ev.Data)
					r.got(v)
				}
			}
		}()
	}
	var workers []reader
	for i := range 6 {
		w := dialHub(t, a.cfg.HubSocket)
		w.hello("w" + strconv.Itoa(i))
		mode := framing.ModeLossless
		if i%3 == 2 {
			mode = framing.ModeWake
		}
		name := "hco" + strconv.Itoa(1+i%2)
		require.Equal(t, framing.AckOK, w.sub(1, mode, name).Ack)
		r := &seqReader{}
		workers = append(workers, reader{r, i % 2})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				f, err := w.read(200 * time.Millisecond)
				select {
				case <-done:
					return
				default:
				}
				var ne net.Error
				switch {
				case errors.As(err, &ne) && ne.Timeout():
				case err != nil:
					r.fail(err)
					return
				case f.Type == framing.TypeStatus && f.Status == framing.StatusResync:
					r.mu.Lock()
					r.resyncs++
					r.mu.Unlock()
				case f.Type == framing.TypeNotify:
					v, _ := strconv.Atoi(string(f.Text))
					r.got(v)
				default:
					r.fail(errors.New("unexpected frame " + f.Type.String()))
					return
				}
			}
		}()
	}
	all := append(append([]reader(nil), readers...), workers...)
	waitFor(t, 10*time.Second, "every client has notifications", func() bool {
		for _, r := range all {
			if n, _, _, _ := r.r.state(); n == 0 {
				return false
			}
		}
		return true
	})

	// The successor, and the handoff as cmd/pgsse runs it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	accept := make(chan struct{})
	b := startSuccessor(t, a, addr, accept)
	mark, err := a.BeginHandoff(ctx)
	require.NoError(t, err)
	names, err := a.ListenedChannels(ctx)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"hco1", "hco2", mark}, names, "the channels the predecessor holds, and its mark's")
	require.NoError(t, b.HoldChannels(ctx, mark, names))
	a.StopAcceptingAll()
	names, err = a.ListenedChannels(ctx)
	require.NoError(t, err)
	require.NoError(t, b.HoldChannels(ctx, mark, names))
	require.NoError(t, a.MarkHandoff(ctx, mark))
	close(accept)
	handed, err := a.HandOver(ctx, func(batch []HandedConn) error {
		fds, recs, err := dupHanded(batch)
		if err != nil {
			return err
		}
		time.Sleep(handoffChannelsDelay) // a slow handover: notifications reach b's session meanwhile
		return b.Adopt(fds, recs)
	})
	require.NoError(t, err)
	assert.Equal(t, len(all), handed)
	b.ReleaseHeldChannels()
	a.Stop(t)

	time.Sleep(300 * time.Millisecond) // notifications go on after the move
	close(notifyStop)
	<-notifyDone
	waitFor(t, 15*time.Second, "every client has every notification", func() bool {
		for _, r := range all {
			_, last, _, err := r.r.state()
			if err == nil && int64(last) != published[r.ch].Load() {
				return false
			}
		}
		return true
	})
	for i, r := range all {
		n, last, resyncs, err := r.r.state()
		what := "channel client " + strconv.Itoa(i)
		if i >= len(readers) {
			what = "worker " + strconv.Itoa(i-len(readers))
		}
		assert.NoError(t, err, "%s (%d notifications, last %d)", what, n, last)
		assert.Equal(t, published[r.ch].Load(), int64(last), "%s has every notification", what)
		assert.Zero(t, resyncs, "%s: no RESYNC (every position was known)", what)
	}
	// The holds for the predecessor are gone: only the subscriptions' own remain.
	b.onLoop(t, func() {
		assert.ElementsMatch(t, []string{"hco1", "hco2"}, b.chans.names())
	})
}

// A successor may get the predecessor's last batches, and release its holds, before its own
// session has delivered the mark (in a --procs sibling the mark comes through its first
// process's hub, behind that loop's own takeover: cmd/pgsse's TestHandoffSIGUSR2WithProcs…
// lost it one run in about twenty). The mark's hold outlives the others until the mark
// arrives: released with them, the mark was UNLISTENed and never seen, and every adopted
// channel subscription stayed parked for handoffParkAfterMS, then resumed with a gap.
func TestHandoffMarkOutlivesReleasedHolds(t *testing.T) {
	t.Parallel()
	b := startHub(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const mark = "pgsse_handoff_late"
	require.NoError(t, b.HoldChannels(ctx, mark, []string{"hlate"}))
	b.ReleaseHeldChannels() // before the mark was notified
	held := func() (names []string) {
		b.onLoop(t, func() { names = b.chans.names() })
		return names
	}
	assert.ElementsMatch(t, []string{mark}, held(), "the mark is still LISTENed: the holds but its own are released")

	conn := connectPlain(b.DSN)
	require.NotNil(t, conn)
	defer conn.Close(context.Background())
	require.NoError(t, conn.Exec(ctx, "SELECT pg_notify('"+mark+"', '')").Close())
	waitFor(t, 10*time.Second, "the mark arrived and its hold was released", func() bool { return len(held()) == 0 })
}

// A handed-over channel subscription that reaches the successor ahead of it (parked: the
// successor has not seen the mark yet) starts just before the notification at its position,
// which may come in the same loop pass as the ones before it — queued by then for the
// channel's live subscriptions (fanout.pendingNotes) and written at the pass's end. Those
// must not reach the subscription that starts: it had them (cmd/pgsse's
// TestHandoffSIGUSR2WithProcsKeepsEveryClient: a --procs sibling's channel clients got a
// notification twice, about one run in twenty, when the successor's sibling got its mark and
// the next two notifications in one batch).
func TestHandoffParkedResumeSkipsThePassQueue(t *testing.T) {
	t.Parallel()
	a := startHub(t, nil)
	addr := a.Addr().String()
	c := dial(t, addr, "/channels/hpq", bearerH(allStreams(t)))
	require.Equal(t, 200, c.Status, c.Body)
	next := func() string {
		for {
			ev, err := c.next(5 * time.Second)
			require.NoError(t, err)
			if ev.Data != "" || ev.Retry == "" { // not the response head's retry
				return ev.Data
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn := connectPlain(a.DSN)
	require.NotNil(t, conn)
	defer conn.Close(context.Background())

	accept := make(chan struct{})
	b := startSuccessor(t, a, addr, accept)
	mark, err := a.BeginHandoff(ctx)
	require.NoError(t, err)
	names, err := a.ListenedChannels(ctx)
	require.NoError(t, err)
	// The successor counts from a mark of its own, notified only once the subscription is
	// there: it arrives ahead of the successor and is parked, as when a sibling's mark comes
	// through its first process's hub late.
	const late = "pgsse_handoff_parked"
	require.NoError(t, b.HoldChannels(ctx, late, names))
	a.StopAcceptingAll()
	require.NoError(t, a.MarkHandoff(ctx, mark))
	close(accept)
	require.NoError(t, conn.Exec(ctx, "SELECT pg_notify('hpq', '1')").Close())
	require.Equal(t, "1", next(), "the predecessor wrote notification 1 (handoff position 1)")
	handed, err := a.HandOver(ctx, func(batch []HandedConn) error {
		fds, recs, err := dupHanded(batch)
		if err != nil {
			return err
		}
		return b.Adopt(fds, recs)
	})
	require.NoError(t, err)
	require.Equal(t, 1, handed)
	b.onLoop(t, func() {
		ch := b.chans.lookup([]byte("hpq"))
		require.NotNil(t, ch)
		require.Len(t, ch.parked, 1, "the subscription waits for the successor's position 1")
	})
	// One transaction: the successor's session delivers the three together, one loop pass.
	require.NoError(t, conn.Exec(ctx, "BEGIN; SELECT pg_notify('"+late+"', ''); SELECT pg_notify('hpq', '1'); SELECT pg_notify('hpq', '2'); COMMIT").Close())
	require.NoError(t, conn.Exec(ctx, "SELECT pg_notify('hpq', '3')").Close())
	assert.Equal(t, "2", next(), "after 1, from the predecessor: 2, not 1 again")
	assert.Equal(t, "3", next())
}
