package engine

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/pgsse/pgsse/pglisten"
	"github.com/pgsse/pgsse/store"
)

// storeChannel is the one PostgreSQL channel all stream traffic travels on.
const storeChannel = store.Channel

// listenMaxChannels is how many channels the LISTEN session holds at most (PostgreSQL scans a
// backend's channel list linearly per notification); a LISTEN beyond it fails, and the hub
// takes at most its share (hubserver.go).
const listenMaxChannels = 10_000

// listenSource is where the loop's notifications come from: the process's own LISTEN session
// (pglisten.Session), or in a sibling process of --procs the first process's hub (siblingSource,
// siblingsource.go). The loop uses nothing else of it: Listen/Unlisten for each channel it holds
// (done reports once the LISTEN completed, or failed), Start and Close, and the callbacks
// onBatch/onEvents, onDown and onResynced, which the source hands to the loop in order.
type listenSource interface {
	Start()
	Listen(channel string, done func(error))
	Unlisten(channel string)
	Close() error
}

var _ listenSource = (*pglisten.Session)(nil)

// listenState is the loop's part for the LISTEN source: the source itself, whether its
// session is up, and the routing of what it reports — notifications to the streams (the
// pgsse channel's payloads) and to the raw channels' holders, losses and resyncs to every
// part that must know.
type listenState struct {
	*loopEnv
	fan   *fanout
	chans *channelTable
	hub   *hubServer
	pres  *presenceTable

	src listenSource // from Run (open); nil before: nothing is LISTENed
	// up: the session is up with every channel LISTENed (Resynced, no Down since); everUp:
	// it has been once; downSinceMS: when it went down (or Run started it).
	up, everUp  bool
	downSinceMS int64
	upSinceMS   int64         // when it came back from a loss (onResynced): settling
	upNow       atomic.Bool   // up, for Ready (other goroutines)
	payload     store.Payload // scratch: the payload being routed
	batchSlots  chan struct{} // notification batches queued for the loop (Notifications)
	stopping    chan struct{} // closed when Run stops the goroutines beside the loop
	gate        sessionGate   // the source's events held while the hub stalls
}

// sessionGate keeps what the LISTEN source reports in its order while the hub stalls
// (hubserver.go: a lossless worker could not take a notification): the rest of the batch it
// stalled in (resume) and every event the source reported after it (waiting) run once the
// stall is over (resume), in order. Nothing else waits: SSE clients' and workers' own
// traffic, the ticks and the other tasks go on. waiting holds at most listenBatchesQueued
// batches (the slot each holds until it is routed) and the few state events between them.
type sessionGate struct {
	rest    func()
	waiting []func()
}

func newListenState(env *loopEnv, fan *fanout, chans *channelTable, hub *hubServer, pres *presenceTable) listenState {
	return listenState{loopEnv: env, fan: fan, chans: chans, hub: hub, pres: pres,
		batchSlots: make(chan struct{}, listenBatchesQueued), stopping: make(chan struct{})}
}

// open opens (not starts) the process's own LISTEN session — or, in a sibling process of
// --procs, the first process's hub (siblingsource.go) — and asks for the stream channel.
func (l *listenState) open() {
	if l.cfg.SiblingHub != nil {
		l.src = newSiblingSource(l)
	} else {
		l.src = pglisten.NewSession(pglisten.Config{DSN: l.cfg.DatabaseURL, Logger: l.log, MaxChannels: listenChannelLimit(l.cfg)}, sessionEvents{l})
	}
	l.src.Listen(storeChannel, func(err error) {
		if err != nil && !errors.Is(err, pglisten.ErrClosed) { // closed: the server is stopping
			l.log.Error("LISTEN on the stream channel failed", "channel", storeChannel, "err", err)
		}
	})
}

// start starts the source (once the loop runs).
func (l *listenState) start() { l.src.Start() }

// close stops handing batches to the loop and closes the source.
func (l *listenState) close() {
	close(l.stopping)
	if l.src != nil {
		_ = l.src.Close()
	}
}

// listen asks the source for a LISTEN on channel (done reports, on the source's goroutine);
// false when there is no source (a server that is not running).
func (l *listenState) listen(channel string, done func(error)) bool {
	if l.src == nil {
		return false
	}
	l.src.Listen(channel, done)
	return true
}

// unlisten gives back a channel whose LISTEN completed; false when there is no source.
func (l *listenState) unlisten(channel string) bool {
	if l.src == nil {
		return false
	}
	l.src.Unlisten(channel)
	return true
}

// rewindTellGraceMS is how long, after the LISTEN session came back from a loss, catch-up
// reads still wait (settling): the host's other processes check what they delivered when
// their session is back, and tell of a rewind they find (rewinds.go) — a few reads on
// PostgreSQL and a hub frame, milliseconds on a quiet host — while a client that reconnected
// meanwhile may hold an id one of them lost. Two seconds, not half of one: under load (the
// CI's -race suite) the finder's check read and its telling took longer than 500 ms, and the
// other process served the lost cursor silently. It is a time, not a signal: the next step is
// the first process telling its siblings when its own checks have answered.
const rewindTellGraceMS = 2000

// settling reports whether catch-up reads wait after a LISTEN loss: the session is down, or
// came back less than rewindTellGraceMS ago (the loop clock's ticks make it up to a tick more);
// never before the first loss.
func (l *listenState) settling() bool {
	return l.everUp && (!l.up || (l.upSinceMS > 0 && l.nowMS-l.upSinceMS < rewindTellGraceMS))
}

// isUp reports whether the session is up with every channel LISTENed.
func (l *listenState) isUp() bool { return l.up }

// ok is isUp for other goroutines (Ready).
func (l *listenState) ok() bool { return l.upNow.Load() }

// downSince records when the session went down (Run: it is not up yet).
func (l *listenState) downSince(nowMS int64) { l.downSinceMS = nowMS }

// databaseUnavailable: the LISTEN session has been down for dbUnavailableAfterMS (or has not
// come up that long after start).
func (l *listenState) databaseUnavailable() bool {
	after := int64(dbUnavailableAfterMS)
	if l.cfg.dbUnavailableAfterMS > 0 {
		after = l.cfg.dbUnavailableAfterMS
	}
	return !l.up && l.nowMS-l.downSinceMS >= after
}

// sessionEvents hands the LISTEN source's callbacks to the loop, in order.
type sessionEvents struct{ l *listenState }

var _ pglisten.Events = sessionEvents{}

// Notifications hands a batch to the loop (handBatch), stamped with when it was received
// (pgsse_publish_stage_seconds: notified, written).
func (e sessionEvents) Notifications(b *pglisten.Batch) {
	received := time.Now()
	if !e.l.handBatch(func() { e.l.onBatch(b, received) }) {
		b.Release()
	}
}

// listenBatchesQueued bounds the notification batches (a read buffer each, 64 KiB) waiting
// for the loop.
const listenBatchesQueued = 64

func (e sessionEvents) Down(err error) { e.l.event(func() { e.l.onDown(err) }) }
func (e sessionEvents) Resynced()      { e.l.event(e.l.onResynced) }

// event hands one of the source's events but a batch to the loop, in order with the batches
// (inOrder); from the source's goroutine.
func (l *listenState) event(f func()) { l.tasks.push(func() { l.inOrder(f) }) }

// inOrder runs f, one event of the LISTEN source (a batch, Down, Resynced, a LISTEN's
// completion), now — or, while the gate holds earlier ones, after them; on the loop.
func (l *listenState) inOrder(f func()) {
	if l.gate.rest != nil || len(l.gate.waiting) > 0 {
		l.gate.waiting = append(l.gate.waiting, f)
		return
	}
	f()
}

// pause holds the LISTEN source's events behind rest, the remainder of a batch the hub
// stalled in, until the stall is over (resume).
func (l *listenState) pause(rest func()) {
	l.gate.rest = rest
	if !l.hub.stalled() {
		l.tasks.push(l.resume) // over already
	}
}

// resume runs what the gate holds, in order, until it is empty or the hub stalls again: a
// task the hub pushes when a stall ends (hubServer.unstallDrop).
func (l *listenState) resume() {
	for !l.hub.stalled() {
		if rest := l.gate.rest; rest != nil {
			l.gate.rest = nil
			rest()
			continue
		}
		if len(l.gate.waiting) == 0 {
			l.gate.waiting = l.gate.waiting[:0:0]
			return
		}
		f := l.gate.waiting[0]
		l.gate.waiting[0] = nil
		l.gate.waiting = l.gate.waiting[1:]
		f()
	}
}

// handBatch hands one batch of notifications (run routes it) to the loop as a task, on the
// source's goroutine. At most listenBatchesQueued batches wait for the loop at once
// (docs/architecture.md, invariant 3): beyond that the source's goroutine waits here, the
// source stops reading, and PostgreSQL's notification queue (or the first process's hub)
// holds the rest — a loop busy writing to thousands of slow sockets does not pile up read
// buffers. It returns false when the batch will not run (the server is stopping). run gives
// the slot back once it has routed the whole batch (done), later if the hub stalls in it.
func (l *listenState) handBatch(run func()) bool {
	select {
	case l.batchSlots <- struct{}{}:
	case <-l.stopping:
		return false
	}
	if !l.tasks.push(func() { l.inOrder(run) }) {
		<-l.batchSlots
		return false
	}
	return true
}

// onBatch routes one batch of notifications from the process's own session, then gives its
// read buffer back and its slot (listenBatchesQueued) — later, if the hub stalls in it.
func (l *listenState) onBatch(b *pglisten.Batch, received time.Time) {
	l.metrics.notifications.Add(float64(len(b.Notes)))
	l.fan.receiving(received)
	l.routeBatch(b, 0)
}

func (l *listenState) routeBatch(b *pglisten.Batch, from int) {
	for i := from; i < len(b.Notes); i++ {
		n := &b.Notes[i]
		if l.onNotification(n.Channel, n.PID, n.Payload) {
			l.pause(func() { l.routeBatch(b, i+1) })
			return
		}
	}
	b.Release() // everything above copied what it keeps; the loop entry's leave writes it out
	<-l.batchSlots
}

// onEvents routes one batch of notifications from the first process's hub (a sibling's
// source, siblingsource.go): one loop entry, so one write per subscriber for all of them;
// then it gives the batch's slot back (later, if the hub stalls in it).
func (l *listenState) onEvents(evs []pglisten.Event) {
	l.metrics.notifications.Add(float64(len(evs)))
	l.fan.receiving(time.Now()) // when the loop took them: the hub's hand-off is not measured
	l.routeEvents(evs, 0)
}

func (l *listenState) routeEvents(evs []pglisten.Event, from int) {
	for i := from; i < len(evs); i++ {
		if l.onNotification([]byte(evs[i].Channel), evs[i].PID, evs[i].Payload) {
			l.pause(func() { l.routeEvents(evs, i+1) })
			return
		}
	}
	<-l.batchSlots
}

// onNotification routes one notification: the stream channel's payloads to the streams, raw
// channels to their SSE subscriptions and hub workers (in the first process of --procs, the
// stream channel is also a raw channel that sibling processes hold through the hub).
// channel and payload are valid only during the call. It reports whether the hub stalled on
// it (the caller holds the rest of its batch: pause).
func (l *listenState) onNotification(channel []byte, pid uint32, payload []byte) (stalled bool) {
	if string(channel) == storeChannel {
		if err := store.ParsePayload(payload, &l.payload); err != nil {
			if name, to, from, ok := parseRewindNotice(payload); ok && pid == 0 && l.cfg.SiblingHub != nil {
				// Not PostgreSQL's (its backends' PIDs are > 0): the first process's hub
				// telling of a rewind another process of the host found (rewinds.go).
				l.fan.knowRewind(string(name), to, from)
				return false
			}
			l.metrics.droppedBadPayload.Inc()
			l.log.Debug("ignoring a payload on the stream channel that is not pgsse's", "err", err, "pid", pid)
		} else if l.payload.Kind == store.KindPresence {
			l.pres.onPayload(&l.payload)
		} else {
			l.fan.onPayload(&l.payload)
		}
	}
	return l.chans.notify(channel, pid, payload)
}

// onDown: the session was lost. Connections stay; raw channels are no longer listening and
// workers are told (LISTENER_DOWN).
func (l *listenState) onDown(err error) {
	l.up = false
	l.downSinceMS = l.nowMS
	l.upNow.Store(false)
	l.log.Warn("LISTEN session lost; clients keep their connections and will be caught up", "err", err)
	l.chans.down()
	l.fan.down()
	l.hub.sessionStatus(false)
	l.pres.listenDown()
}

// onResynced: the session is (back) up with every channel LISTENed again. Raw channels go
// live, every stream is caught up from the table (docs/architecture.md, invariant 4) and, after a
// loss, workers are told to RESYNC.
func (l *listenState) onResynced() {
	wasUp := l.everUp
	if wasUp {
		l.upSinceMS = l.nowMS // back from a loss: settling (not at the first start)
	}
	l.up, l.everUp = true, true
	l.upNow.Store(true)
	if wasUp {
		l.metrics.reconnects.Inc()
		l.log.Info("LISTEN session back; catching streams up from the table", "streams", l.fan.count(), "channels", l.chans.count())
	}
	l.chans.resynced()
	l.fan.resync()
	l.pres.listenResynced()
	if wasUp {
		l.hub.sessionStatus(true)
	}
}

// tellRewind tells the host's other processes (rewinds.go) that stream went back: cursors in
// (to, from] are from history it lost. A sibling tells the first process, which tells every
// sibling (relay); best effort — a process that is not told serves such a cursor as before.
func (l *listenState) tellRewind(stream string, to, from int64) {
	notice := appendRewindNotice(nil, stream, to, from)
	if src, ok := l.src.(*siblingSource); ok {
		src.tell(notice)
		return
	}
	l.relay(notice)
}

// fromSibling takes a rewind notice a sibling sent the hub (hubServer.frame), records it and
// tells every sibling; false when the payload is not a notice (a protocol error).
func (l *listenState) fromSibling(payload []byte) bool {
	name, to, from, ok := parseRewindNotice(payload)
	if !ok {
		return false
	}
	l.fan.knowRewind(string(name), to, from)
	l.relay(append([]byte(nil), payload...))
	return true
}

// relay hands a rewind notice to the siblings that hold the stream channel through the hub —
// only they may (reservedChannel) — in order with the notifications (inOrder), with PID 0.
func (l *listenState) relay(notice []byte) {
	l.inOrder(func() {
		if l.chans.notify([]byte(storeChannel), 0, notice) {
			l.pause(func() {}) // a sibling stalled on it: what the source reports next waits
		}
	})
}
