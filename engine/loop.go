package engine

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/pgsse/pgsse/store"
)

// What runs the loop: the environment every part of it reads (loopEnv), the task queue that
// hands work to the loop goroutine in order, enter/leave around every entry into the loop's
// state, and the ticker that drives the periodic work.

// loopEnv is what every part of the loop reads: the configuration, the log, the metrics, the
// task queue, the replay pool, the loop clock and whether the server is draining. New and Run
// set it up, the tick moves the clock and drain sets draining; it holds no rule of its own, so
// each part embeds a pointer to it instead of reaching into another part for these.
type loopEnv struct {
	cfg      Config
	log      *slog.Logger
	metrics  *metrics
	stages   *stageClock // the publish path's stages (stages.go)
	tasks    *taskQueue
	replayer *store.Replayer // the replay pool, from Run (nil before: no table reads)
	nowMS    int64           // the loop clock: unix milliseconds, refreshed every tick
	draining bool            // the server is shutting down: newcomers are sent away
}

// Tick periods. Waking the loop costs more than the tick's work — each wake pulls the
// loop's thread out of epoll_wait — so an idle server wakes it 4 times a second, and 50
// times a second only while a lagging client or hub worker waits for its socket to drain
// (gnet has no writable callback; SSE sockets have their own, outbound.go).
const (
	tickFast = 20 * time.Millisecond
	tickSlow = 250 * time.Millisecond
)

// enter/leave bracket every entry into the loop's state (gnet callbacks, each round of the
// task queue, each round of admissions). On the way out of the outermost entry, what the
// entry queued is written — one write per connection for all of it; the fan-out's share by a
// slice of its sweep, which the task drain continues (fanout_sweep.go) — and connections
// closed meanwhile (gnet closes a socket synchronously when a write fails) are removed from
// the tables, so no slice changes under an iteration.
//
// Hub workers are written first: one write each, and among them may be the sibling
// processes of --procs, which start their own fan-out as soon as they have the
// notification — in parallel with this process's, not after it.
func (s *Server) enter() { s.depth++ }

func (s *Server) leave() {
	if s.depth > 1 {
		s.depth--
		return
	}
	s.hub.flush()
	budget := time.Duration(0) // no publisher waits between slices: the sweep runs to its end
	if s.pub.count() > 0 {
		budget = sweepSlice
	}
	s.sweepLeft = s.fan.flush(budget, s.driving)
	s.hub.flush() // whatever the writes above queued (nothing, usually: then it costs a length check)
	s.conns.reapClosed()
	if s.sweepLeft && !s.driving {
		s.tasks.kick() // the drain continues the sweep (admitRound)
	}
	if poll := s.subs.anyLagging() || (pollQueues && s.out.anyQueued()) || s.hub.needsPoll(); poll != s.needPoll.Load() {
		s.needPoll.Store(poll)
		if poll {
			select {
			case s.pollNow <- struct{}{}:
			default:
			}
		}
	}
	s.depth--
}

// hurry runs the queued tasks from a gnet callback once the oldest has waited too long
// (taskQueue.hurry) — only outside any loop entry: a callback gnet runs synchronously inside
// one (a close on a failed write) leaves them to the entry's own caller.
func (s *Server) hurry() {
	if s.depth == 0 {
		s.tasks.hurry()
	}
}

// ticker hands the loop its periodic work (tick): every tickSlow, and every tickFast only
// while someone waits for a socket to drain.
func (s *Server) ticker(ctx context.Context) {
	t := time.NewTimer(tickSlow)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.pollNow:
		case <-t.C:
		}
		now := time.Now()
		if s.needPoll.Load() || now.Sub(last) >= tickSlow-tickFast {
			last = now
			s.tasks.push(s.tick)
		}
		d := tickSlow - now.Sub(last)
		if s.needPoll.Load() || d < tickFast {
			d = tickFast
		}
		t.Reset(d)
	}
}

// tick is the loop's periodic work: the clock, lagging subscriptions whose connections
// drained, the hub's flushing and deadlines, the outbound gauges, and — at most every
// sweepIntervalMS — failed reads to retry, queues to retry and the connections' time rules
// (connTable.sweep). It runs as a task, inside the drain's enter/leave.
func (s *Server) tick() {
	now := time.Now()
	s.nowMS = now.UnixMilli()
	s.healthyAt.Store(now.UnixNano())
	if pollQueues {
		s.out.retryQueues(0)
	}
	s.subs.resumeLagging()
	s.hub.tick()
	s.chans.handoffTick()
	s.pres.tick()
	s.out.observe()
	if s.nowMS-s.lastSweepMS < sweepIntervalMS {
		return
	}
	s.lastSweepMS = s.nowMS
	s.fan.retryFetches()
	s.subs.runReadRetries()
	s.out.retryQueues(queueRetryMS)
	s.subs.retryLarge()
	s.conns.sweep()
}

// taskQueue hands work from other goroutines (the LISTEN session, replay reads, the
// verifier pool, the ticker, shutdown) to the loop goroutine, strictly in push order.
//
// gnet's Execute queue may reorder low-priority tasks under load (docs/architecture.md,
// invariant 1), so Execute is used only as a wake-up: the loop drains this FIFO, which alone
// fixes order.
// Between rounds of tasks the drain services the admission FIFO (between), so new connections are
// set up a bounded number at a time with deliveries in between.
type taskQueue struct {
	mu        sync.Mutex
	waitingNS atomic.Int64 // when the oldest queued task was pushed (unix ns); 0 = none queued (hurry)
	tasks     []func()
	spare     []func()
	scheduled bool
	closed    bool
	loop      gnet.EventLoop // set once the anchor connection is registered
	drainFn   gnet.RunnableFunc
	// enter and leave bracket each round of tasks (Server.enter/leave): whatever the tasks
	// queued is written out once the round has run.
	enter, leave func()
	// between runs after each round of tasks, given how long that round took (on the loop,
	// bracketing itself), and reports whether it has more to do (Server.admitRound).
	between func(taskTime time.Duration) bool
}

// The drain does not hold the loop for long: once it has run for drainSlice with work still
// waiting — or when only between's work is left — it gives the loop back to gnet, which reads
// the sockets that became ready (new request heads, closes) and opens the connections the
// acceptors handed over, and resumes drainYield later. Without it a loop saturated with
// deliveries would never return to epoll_wait, and nobody new would get in.
const (
	drainSlice = 2 * time.Millisecond
	drainYield = 50 * time.Microsecond
)

func newTaskQueue() *taskQueue {
	q := &taskQueue{}
	q.drainFn = func(context.Context) error { q.drain(); return nil }
	return q
}

// push queues f to run on the loop. It never blocks on I/O; it returns false once the
// queue is closed (the loop has stopped), in which case f will never run.
func (q *taskQueue) push(f func()) bool {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return false
	}
	if len(q.tasks) == 0 {
		q.waitingNS.Store(time.Now().UnixNano())
	}
	q.tasks = append(q.tasks, f)
	q.mu.Unlock()
	q.wake()
	return true
}

// hurryAfter is how long a queued task may wait before the loop's socket callbacks run it
// themselves (hurry).
const hurryAfter = time.Millisecond

// hurry runs the queued tasks now if the oldest has waited hurryAfter; the gnet callbacks
// call it on their way out, outside any loop entry. The drain that push scheduled only runs
// once gnet's poller reaches its wake-up descriptor, and epoll hands back ready descriptors
// in the order they became ready: when thousands of clients close at once (or send their
// request heads), the wake-up waits behind every one of them — a pass of 1,024 closes is
// 10–20 ms of close(2) and the poller makes several — and so do the deliveries in the queue
// (bench scenario 12: the written stage's p99 went from 0.25 ms to 50–100 ms while 10,000
// clients left). Hurried, a task waits at most hurryAfter and one callback. The tasks run in
// push order, in rounds bracketed like the drain's, for at most drainSlice; what is left,
// and the admissions between rounds, stay for the scheduled drain, which still runs.
func (q *taskQueue) hurry() {
	since := q.waitingNS.Load()
	if since == 0 || time.Now().UnixNano()-since < int64(hurryAfter) {
		return
	}
	started := time.Now()
	for {
		q.mu.Lock()
		batch := q.tasks
		if len(batch) == 0 {
			q.mu.Unlock()
			return
		}
		q.tasks = q.spare[:0]
		q.waitingNS.Store(0)
		q.mu.Unlock()
		q.runRound(batch)
		q.mu.Lock()
		q.spare = batch[:0]
		q.mu.Unlock()
		if time.Since(started) >= drainSlice {
			return
		}
	}
}

// runRound runs one round of tasks inside enter/leave.
func (q *taskQueue) runRound(batch []func()) {
	if q.enter != nil {
		q.enter()
	}
	for i, f := range batch {
		f()
		batch[i] = nil
	}
	if q.leave != nil {
		q.leave()
	}
}

// kick makes sure a drain runs soon, for work the drain finds itself (between).
func (q *taskQueue) kick() {
	q.mu.Lock()
	closed := q.closed
	q.mu.Unlock()
	if !closed {
		q.wake()
	}
}

// wake schedules a drain unless one is scheduled or running.
func (q *taskQueue) wake() {
	q.mu.Lock()
	wake := !q.scheduled && q.loop != nil
	if wake {
		q.scheduled = true
	}
	loop := q.loop
	q.mu.Unlock()
	if wake {
		if err := loop.Execute(context.Background(), q.drainFn); err != nil {
			// The engine is shutting down; the tasks are dropped with the loop.
			q.mu.Lock()
			q.scheduled = false
			q.mu.Unlock()
		}
	}
}

// start attaches the loop and runs whatever was queued before it existed.
func (q *taskQueue) start(loop gnet.EventLoop) {
	q.mu.Lock()
	q.loop = loop
	pending := len(q.tasks) > 0 && !q.scheduled
	if pending {
		q.scheduled = true
	}
	q.mu.Unlock()
	if pending {
		_ = loop.Execute(context.Background(), q.drainFn)
	}
}

// drain runs on the loop goroutine: rounds of every queued task, each round followed by
// between, until neither has anything left, or it yields (drainSlice).
func (q *taskQueue) drain() {
	started := time.Now()
	more := q.between != nil // a kick may have scheduled this drain for between alone
	for {
		q.mu.Lock()
		batch := q.tasks
		q.tasks = q.spare[:0]
		q.waitingNS.Store(0)
		if len(batch) == 0 && !more {
			q.scheduled = false
			q.spare = batch
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		var taskTime time.Duration
		if len(batch) > 0 {
			start := time.Now()
			q.runRound(batch)
			taskTime = time.Since(start)
		}
		q.mu.Lock()
		q.spare = batch[:0]
		q.mu.Unlock()
		more = q.between != nil && q.between(taskTime)
		q.mu.Lock()
		waiting := len(q.tasks) > 0
		q.mu.Unlock()
		if more && !waiting || (more || waiting) && time.Since(started) >= drainSlice {
			time.AfterFunc(drainYield, q.resume) // q.scheduled stays set: pushes meanwhile wait for it
			return
		}
	}
}

// resume schedules the drain again after it yielded.
func (q *taskQueue) resume() {
	q.mu.Lock()
	loop, closed := q.loop, q.closed
	q.mu.Unlock()
	if closed || loop == nil || loop.Execute(context.Background(), q.drainFn) != nil {
		q.mu.Lock()
		q.scheduled = false
		q.mu.Unlock()
	}
}

func (q *taskQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.tasks = nil
	q.waitingNS.Store(0)
	q.mu.Unlock()
}

// registerAnchor enrols one end of a private loopback TCP connection in the gnet engine
// so that we hold a gnet.EventLoop (gnet hands loops out only through connections).
// The anchor carries no traffic; its peer stays open for the life of the server.
func registerAnchor(eng gnet.Engine) (gnet.Conn, net.Conn, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	dialed, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return nil, nil, err
	}
	peer, ok := <-accepted
	if !ok {
		dialed.Close()
		return nil, nil, net.ErrClosed
	}
	res, err := eng.Register(gnet.NewNetConnContext(gnet.NewContext(context.Background(), originAnchor), dialed))
	if err != nil {
		dialed.Close()
		peer.Close()
		return nil, nil, err
	}
	r := <-res
	// gnet dup()s the descriptor; our copy is closed by gnet's enrol worker.
	if r.Err != nil {
		peer.Close()
		return nil, nil, r.Err
	}
	return r.Conn, peer, nil
}
