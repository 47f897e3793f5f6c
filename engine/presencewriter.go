package engine

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgsse/pgsse/store"
)

// presenceWriter is presence's side off the loop (presence.go): one goroutine with one
// PostgreSQL connection of its own (application_name pgsse-presence) that, every
// --presence-interval, takes the loop's changed counts (a loop task) and writes them with
// store.Presence.Flush — one statement, with the lease renewal and the reaping of processes
// whose lease lapsed, even when nothing changed — and between writes answers reads: the
// snapshots a view needs and GET /presence. Each statement has a deadline; a failed one
// closes the connection, its changes go with the next write on a new one.
type presenceWriter struct {
	log      *slog.Logger
	tasks    *taskQueue
	cfg      *pgconn.Config
	interval time.Duration
	p        *store.Presence
	conn     *pgconn.PgConn
	reads    chan presenceRead
	take     func() []store.PresenceCount           // on the loop: the changes to write
	flushed  func(res store.PresenceFlush, ok bool) // on the loop: a write's outcome
	pending  []store.PresenceCount                  // changes taken while no connection could be made
	stopped  bool                                   // superseded: no more writes
	failing  bool                                   // the last write failed (logged once per run of failures)
	done     chan struct{}

	// A successor (handoff.go) registers only once it has taken its predecessor's
	// connections over (presenceTable.takenOver): registering replaces the predecessor's
	// entries — same process key — so it must carry the moved connections' counts. Until
	// hold is closed the writer answers reads and writes nothing; registered is closed once
	// the first write has an outcome. fallback (a loop task) lets go by itself after
	// presenceTakeOverMax.
	hold       chan struct{} // nil: register at once
	holdOnce   sync.Once
	fallback   func()
	registered chan struct{}
	// handedOver: this process handed presence-counted connections to a successor; its
	// entries are the successor's to replace, so it does not retire them on the way out, and
	// being superseded is the handoff working, not an error.
	handedOver atomic.Bool
}

// presenceTakeOverMax is how long a successor's writer waits to be told the handoff is over
// before it registers anyway (the handoff's own timeouts are 30 s each for ready and move).
const presenceTakeOverMax = 2 * time.Minute

// presenceRead is one read the writer answers on the loop.
type presenceRead struct {
	stream string
	limit  int
	done   func(store.PresenceSnapshot, error)
}

// presenceReadsQueued bounds the reads waiting for the writer's connection; beyond them
// GET /presence answers 503 and a view asks again on the next tick.
const presenceReadsQueued = 256

// presenceTimeout is the deadline of a statement that writes n counts (and of the retire of a
// process holding n entries): a few intervals, at
// least 2 s, and 500 µs more per count — a process's first write after a start, a restart of
// PostgreSQL or a lost lease carries its whole state (100 streams × 1,000 subjects: 100,000
// counts), and a deadline that such a write cannot meet would fail it, and every retry, for
// good (bench scenario 13 did: 0 rows after 60 s with a flat 3 s, and again with 100 µs a
// count; one statement of 100,000 counts took 11.3 s on the 2-core VM at a load average of
// 20). At most presenceMaxTimeout.
func presenceTimeout(interval time.Duration, n int) time.Duration {
	return min(max(3*interval, 2*time.Second)+time.Duration(n)*500*time.Microsecond, presenceMaxTimeout)
}

// presenceMaxTimeout caps presenceTimeout.
const presenceMaxTimeout = 2 * time.Minute

func newPresenceWriter(dsn, key string, interval time.Duration, log *slog.Logger, tasks *taskQueue,
	take func() []store.PresenceCount, flushed func(store.PresenceFlush, bool)) (*presenceWriter, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = store.PresenceAppName
	p, err := store.NewPresence(store.PresenceConfig{Key: key, Interval: interval})
	if err != nil {
		return nil, err
	}
	return &presenceWriter{log: log, tasks: tasks, cfg: cfg, interval: interval, p: p,
		reads: make(chan presenceRead, presenceReadsQueued), take: take, flushed: flushed, done: make(chan struct{}),
		registered: make(chan struct{})}, nil
}

// holdUntilTakenOver makes the writer wait for release before its first write (a successor;
// before run). fallback runs as a loop task if nobody releases it within presenceTakeOverMax.
func (w *presenceWriter) holdUntilTakenOver(tasks *taskQueue, fallback func()) {
	w.hold = make(chan struct{})
	w.fallback = func() { tasks.push(fallback) }
}

// release lets a holding writer register (idempotent; any goroutine).
func (w *presenceWriter) release() {
	if w.hold != nil {
		w.holdOnce.Do(func() { close(w.hold) })
	}
}

// awaitTakeOver answers reads until the writer is released (true) or ctx ends (false).
func (w *presenceWriter) awaitTakeOver(ctx context.Context) bool {
	if w.hold == nil {
		return true
	}
	t := time.NewTimer(presenceTakeOverMax)
	defer t.Stop()
	for {
		select {
		case <-w.hold:
			return true
		case <-t.C:
			w.log.Warn("presence: the handoff did not end within " + presenceTakeOverMax.String() + "; registering this process's presence anyway")
			w.fallback()
			return true
		case r := <-w.reads:
			w.answer(ctx, r)
		case <-ctx.Done():
			return false
		}
	}
}

// read queues a read; done runs on the loop. False when the queue is full.
func (w *presenceWriter) read(stream string, limit int, done func(store.PresenceSnapshot, error)) bool {
	select {
	case w.reads <- presenceRead{stream: stream, limit: limit, done: done}:
		return true
	default:
		return false
	}
}

// run writes every interval and answers reads until ctx ends; then, if retire, it removes
// what the process holds (its subjects leave at once rather than when the lease lapses).
func (w *presenceWriter) run(ctx context.Context, retire bool) {
	defer close(w.done)
	defer w.close()
	if !w.awaitTakeOver(ctx) {
		close(w.registered)
		return // a successor that never took over: nothing registered, nothing to retire
	}
	t := time.NewTicker(w.interval)
	defer t.Stop()
	w.flush(ctx) // register at once: a restarted process clears what it held before
	close(w.registered)
	for {
		select {
		case <-ctx.Done():
			if retire {
				w.retire()
			}
			return
		case <-t.C:
			w.flush(ctx)
		case r := <-w.reads:
			w.answer(ctx, r)
		}
	}
}

// retire removes what the process holds, on the way out (unless superseded): one statement,
// with the deadline of a write of every entry held (presenceTimeout) — a process holding
// 100 streams × 1,000 subjects missed a flat 2 s (bench scenario 13), and its subjects then
// stayed present until its lease lapsed. It is abandoned past the deadline: the lease lapses.
func (w *presenceWriter) retire() {
	if w.stopped {
		return
	}
	if w.handedOver.Load() {
		w.log.Info("presence: leaving this process's entries to its successor, which replaces them as it registers", "entries", w.p.Held())
		return
	}
	rctx, cancel := context.WithTimeout(context.Background(), presenceTimeout(w.interval, w.p.Held()))
	defer cancel()
	err := w.connect(rctx)
	if err == nil {
		_, err = w.p.Retire(rctx, w.conn)
	}
	if err != nil {
		w.log.Warn("presence: could not remove this process's entries on the way out; they go when its lease lapses", "entries", w.p.Held(), "err", err)
	}
}

// flush takes the loop's changes and writes them.
func (w *presenceWriter) flush(ctx context.Context) {
	if w.stopped {
		return
	}
	got := make(chan []store.PresenceCount, 1)
	if !w.tasks.push(func() { got <- w.take() }) {
		return
	}
	var changes []store.PresenceCount
	select {
	case changes = <-got:
	case <-ctx.Done():
		return
	}
	if len(w.pending) > 0 { // changes taken while there was no connection: the later ones win
		changes = append(w.pending, changes...)
		w.pending = nil
	}
	fctx, cancel := context.WithTimeout(ctx, presenceTimeout(w.interval, max(len(changes), w.p.Held())))
	defer cancel()
	var res store.PresenceFlush
	err := w.connect(fctx)
	if err == nil {
		res, err = w.p.Flush(fctx, w.conn, changes) // keeps them for the next one if it fails
	} else {
		w.pending = changes
	}
	switch {
	case errors.Is(err, store.ErrPresenceSuperseded) && w.handedOver.Load():
		w.stopped = true
		w.log.Info("presence: the successor registered and took this process's entries over", "key", w.p.Key())
	case errors.Is(err, store.ErrPresenceSuperseded):
		w.stopped = true
		w.log.Error("presence: another pgsse process registered with this process's key (same host, --listen and process index); this one stops writing presence", "key", w.p.Key())
	case err != nil:
		if ctx.Err() != nil {
			return
		}
		if !w.failing {
			w.log.Warn("presence: write failed; the changes go with the next one", "err", err)
		}
		w.failing = true
		w.drop()
	default:
		if w.failing {
			w.log.Info("presence: writing again")
		}
		w.failing = false
	}
	ok := err == nil
	w.tasks.push(func() { w.flushed(res, ok) })
}

// answer runs one read and hands its answer to the loop.
func (w *presenceWriter) answer(ctx context.Context, r presenceRead) {
	rctx, cancel := context.WithTimeout(ctx, presenceTimeout(w.interval, 0))
	defer cancel()
	var snap store.PresenceSnapshot
	err := w.connect(rctx)
	if err == nil {
		snap, err = store.ReadPresence(rctx, w.conn, r.stream, r.limit)
		if err != nil {
			w.drop()
		}
	}
	w.tasks.push(func() { r.done(snap, err) })
}

// connect makes sure the writer has a connection.
func (w *presenceWriter) connect(ctx context.Context) error {
	if w.conn != nil && !w.conn.IsClosed() {
		return nil
	}
	c, err := pgconn.ConnectConfig(ctx, w.cfg)
	if err != nil {
		return err
	}
	w.conn = c
	return nil
}

// drop closes a connection after a failed statement (its state is unknown).
func (w *presenceWriter) drop() {
	if w.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = w.conn.Close(ctx)
		cancel()
		w.conn = nil
	}
}

func (w *presenceWriter) close() { w.drop() }
