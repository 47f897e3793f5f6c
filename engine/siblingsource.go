package engine

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/pgsse/pgsse/pglisten"
)

// The LISTEN source of a sibling process of --procs (docs/scaling.md, Every core of a host): the
// first process's hub, read over the socket it handed this process at start
// (Config.SiblingHub), through a pglisten.Failover — so that if the first process goes away
// this process switches, once and for good, to a LISTEN session of its own and keeps
// delivering (cmd/pgsse/procs.go decides how long it then lives).
//
// What the loop relies on, and how each holds here:
//   - done(nil) for a Listen only once the LISTEN completed on the session that feeds us:
//     Failover.Listen returns once the hub's ACK arrived, and the hub ACKs only after the
//     LISTEN completed on its session (docs/hub-protocol.md, Conversation: ACK after LISTEN), or
//     after the direct session's LISTEN once switched. done and the notifications travel on two
//     goroutines, so one committed just after the LISTEN may reach the loop before done does; it
//     then finds the channel's SSE clients still pending and passes them by — harmless, as their
//     response head goes out only after done, and docs/http.md promises what commits after the
//     head was read.
//   - Resynced only when every channel held is LISTENed: the first one once the Listens
//     queued before Start completed; later ones are the hub's RESYNC (its session came back)
//     or the switch's resync (after every recorded channel was LISTENed on the direct session).
//   - Down while notifications may be missed: the hub's LISTENER_DOWN, or the hub gone
//     (the switch), so that a /channels/ client does not get its response head in between.
//   - Notifications in the order the hub sent them, batched per loop entry so that a
//     subscriber gets one write for what arrived together (docs/architecture.md, invariant 2),
//     and no more of them queued for the loop than from an own session (listenBatchesQueued).
//
// Durable streams need nothing more: after every Resynced the loop reads each stream from
// the table (resyncStreams), and ids deduplicate whatever arrives twice.

const (
	// siblingAckTimeout: a SUB to the first process's hub is ACKed only once the LISTEN
	// completed on its session, which takes as long as PostgreSQL is unreachable; a dead or
	// wedged first process is found by the keepalive PING (and EOF) instead.
	siblingAckTimeout = time.Hour
	// siblingBatchMax bounds the notifications handed to the loop in one task.
	siblingBatchMax = 1024
	// siblingTellsQueued bounds the rewind notices waiting to be written to the first
	// process (tell); beyond it they are dropped (said in the log).
	siblingTellsQueued = 1024
)

// siblingSource is a listenSource over a pglisten.Failover on Config.SiblingHub.
type siblingSource struct {
	l   *listenState
	cfg pglisten.FailoverConfig

	mu      sync.Mutex
	ops     []siblingOp
	started bool
	closed  bool
	// initial: the Listens queued before Start have not all completed yet; until then the
	// Failover's own resyncs are not passed on (the first Resynced comes after them).
	initial bool
	down    bool // a Down was passed on and no Resynced since
	wake    chan struct{}
	// tells: rewind notices for the first process (tell), written by telling
	tells chan []byte
	// failover is the Listener once run has made it (for tests and logs: its Source and
	// Reason say where notifications come from).
	failover *pglisten.Failover

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type siblingOp struct {
	listen  bool
	channel string
	done    func(error)
}

var _ listenSource = (*siblingSource)(nil)

func newSiblingSource(l *listenState) *siblingSource {
	ctx, cancel := context.WithCancel(context.Background())
	return &siblingSource{
		l: l,
		cfg: pglisten.FailoverConfig{
			Hub: pglisten.HubConfig{
				Conn:       l.cfg.SiblingHub,
				Socket:     "the first process's hub",
				Name:       "pgsse sibling",
				AckTimeout: siblingAckTimeout,
				Logger:     l.log,
			},
			Direct: pglisten.Config{DSN: l.cfg.DatabaseURL, Logger: l.log},
			Logger: l.log,
		},
		initial: true,
		wake:    make(chan struct{}, 1),
		tells:   make(chan []byte, siblingTellsQueued),
		ctx:     ctx,
		cancel:  cancel,
	}
}

// Listen queues a LISTEN; done runs on the source's goroutine once it completed or failed.
func (h *siblingSource) Listen(channel string, done func(error)) {
	h.enqueue(siblingOp{listen: true, channel: channel, done: done})
}

// Unlisten queues an UNLISTEN of a channel whose Listen reported nil.
func (h *siblingSource) Unlisten(channel string) { h.enqueue(siblingOp{channel: channel}) }

func (h *siblingSource) enqueue(op siblingOp) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		if op.listen && op.done != nil {
			go op.done(pglisten.ErrClosed) // never synchronously, as pglisten.Session
		}
		return
	}
	h.ops = append(h.ops, op)
	h.mu.Unlock()
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// Start connects over the inherited socket and begins working through the queued Listens.
func (h *siblingSource) Start() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.started || h.closed {
		return
	}
	h.started = true
	h.wg.Add(1)
	go h.run()
}

// Close stops the Failover (hub client or direct session) and waits for the goroutines;
// queued Listens get ErrClosed.
func (h *siblingSource) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	started := h.started
	ops := h.ops
	h.ops = nil
	h.mu.Unlock()
	h.cancel()
	if started {
		h.wg.Wait()
	} else if h.cfg.Hub.Conn != nil {
		_ = h.cfg.Hub.Conn.Close()
	}
	for _, op := range ops {
		if op.listen && op.done != nil {
			op.done(pglisten.ErrClosed)
		}
	}
	return nil
}

// run owns the Failover: it serves the queued operations in order (Listen and Unlisten of one
// channel must not overtake each other) while events forwards what the Failover reports.
func (h *siblingSource) run() {
	defer h.wg.Done()
	l, err := pglisten.NewFailover(h.cfg)
	if err != nil {
		// Only a configuration that cannot work (a bad DSN): New has checked it already.
		h.l.log.Error("sibling: cannot read the first process's hub", "err", err)
		return
	}
	defer l.Close()
	h.mu.Lock()
	h.failover, _ = l.(*pglisten.Failover)
	h.mu.Unlock()
	h.wg.Add(2)
	go h.events(l)
	go h.telling(h.failover)
	for {
		h.mu.Lock()
		ops := h.ops
		h.ops = nil
		initial := h.initial && len(ops) == 0
		h.mu.Unlock()
		if initial {
			h.firstResync()
		}
		for _, op := range ops {
			h.serve(l, op)
		}
		if len(ops) > 0 {
			continue
		}
		select {
		case <-h.wake:
		case <-h.ctx.Done():
			return
		}
	}
}

// serve runs one queued operation against the Failover, blocking this goroutine only.
func (h *siblingSource) serve(l pglisten.Listener, op siblingOp) {
	if !op.listen {
		if err := l.Unlisten(h.ctx, op.channel); err != nil && !errors.Is(err, pglisten.ErrNotListening) && h.ctx.Err() == nil {
			h.l.log.Warn("sibling: UNLISTEN through the hub failed", "channel", op.channel, "err", err)
		}
		return
	}
	err := l.Listen(h.ctx, op.channel)
	if err != nil && h.ctx.Err() != nil {
		err = pglisten.ErrClosed
	}
	if op.done != nil {
		op.done(err)
	}
}

// firstResync reports the first Resynced once the Listens queued before Start completed —
// unless the hub was lost meanwhile, in which case the Failover's resync after the switch
// is the one that counts.
func (h *siblingSource) firstResync() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.initial = false
	if !h.down {
		h.l.event(h.l.onResynced)
	}
}

// events forwards the Failover's events to the loop: notifications in batches, Down and
// Resynced in order with them.
func (h *siblingSource) events(l pglisten.Listener) {
	defer h.wg.Done()
	in := l.Events()
	batch := make([]pglisten.Event, 0, 64)
	for {
		ev, ok := <-in
		if !ok {
			return
		}
		batch = append(batch[:0], ev)
	more:
		for len(batch) < siblingBatchMax {
			select {
			case ev, ok := <-in:
				if !ok {
					break more
				}
				batch = append(batch, ev)
			default:
				break more
			}
		}
		h.deliver(batch)
		clear(batch)
	}
}

// deliver hands one batch to the loop, keeping its order: runs of notifications go as one
// task each, state events between them. Down and Resynced are pushed with mu held, so the
// loop sees them in the order this source decided them (firstResync does the same).
func (h *siblingSource) deliver(batch []pglisten.Event) {
	start := 0
	flush := func(end int) {
		if end <= start {
			return
		}
		// The same bound as the own session's batches (listenState.handBatch): beyond it
		// this goroutine waits, the hub client stops reading, and the first process's hub
		// applies its policy to this sibling's ring (docs/hub-protocol.md, Modes and
		// backpressure) — nothing piles up here.
		notes := append([]pglisten.Event(nil), batch[start:end]...)
		h.l.handBatch(func() { h.l.onEvents(notes) })
	}
	for i, ev := range batch {
		if ev.Kind == pglisten.KindNotification {
			continue
		}
		flush(i)
		start = i + 1
		h.mu.Lock()
		switch {
		case ev.Kind == pglisten.KindDown:
			h.down = true
			h.l.event(func() { h.l.onDown(errHubLost) })
		case h.initial:
			// The first Resynced follows the queued Listens (firstResync).
			h.down = false
		default: // KindResync: of everything, or of one channel (lossless mode sends none)
			h.down = false
			h.l.event(h.l.onResynced)
		}
		h.mu.Unlock()
	}
	flush(len(batch))
}

// errHubLost is the Down a sibling reports when the first process's hub stops feeding it.
var errHubLost = errors.New("the first process's hub reports its LISTEN session down, or is gone")

// tell queues a rewind notice (rewinds.go) for the first process's hub, from the loop: never
// blocking it — beyond siblingTellsQueued waiting, the notice is dropped.
func (h *siblingSource) tell(notice []byte) {
	select {
	case h.tells <- notice:
	default:
		h.l.log.Warn("sibling: too many rewind notices waiting for the first process; one dropped")
	}
}

// telling writes the queued rewind notices to the first process's hub as NOTIFY frames
// (pglisten.Failover.NotifyHub), until the source closes. Once the Failover has switched to a
// direct session (the first process is gone) there is nobody left to tell.
func (h *siblingSource) telling(f *pglisten.Failover) {
	defer h.wg.Done()
	for {
		select {
		case notice := <-h.tells:
			if f == nil {
				continue
			}
			if err := f.NotifyHub(storeChannel, notice); err != nil && h.ctx.Err() == nil && !errors.Is(err, pglisten.ErrNotOnHub) {
				h.l.log.Warn("sibling: could not tell the first process of a rewind", "err", err)
			}
		case <-h.ctx.Done():
			return
		}
	}
}
