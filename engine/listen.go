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
	upNow       atomic.Bool   // up, for Ready (other goroutines)
	payload     store.Payload // scratch: the payload being routed
	batchSlots  chan struct{} // notification batches queued for the loop (Notifications)
	stopping    chan struct{} // closed when Run stops the goroutines beside the loop
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
		l.src = pglisten.NewSession(pglisten.Config{DSN: l.cfg.DatabaseURL, Logger: l.log, MaxChannels: listenMaxChannels}, sessionEvents{l})
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

func (e sessionEvents) Down(err error) { e.l.tasks.push(func() { e.l.onDown(err) }) }
func (e sessionEvents) Resynced()      { e.l.tasks.push(e.l.onResynced) }

// handBatch hands one batch of notifications (run routes it) to the loop as a task, on the
// source's goroutine. At most listenBatchesQueued batches wait for the loop at once
// (docs/architecture.md, invariant 3): beyond that the source's goroutine waits here, the
// source stops reading, and PostgreSQL's notification queue (or the first process's hub)
// holds the rest — a loop busy writing to thousands of slow sockets does not pile up read
// buffers. It returns false when the batch will not run (the server is stopping).
func (l *listenState) handBatch(run func()) bool {
	select {
	case l.batchSlots <- struct{}{}:
	case <-l.stopping:
		return false
	}
	if !l.tasks.push(func() { run(); <-l.batchSlots }) {
		<-l.batchSlots
		return false
	}
	return true
}

// onBatch routes one batch of notifications from the process's own session.
func (l *listenState) onBatch(b *pglisten.Batch, received time.Time) {
	l.metrics.notifications.Add(float64(len(b.Notes)))
	l.fan.receiving(received)
	for i := range b.Notes {
		n := &b.Notes[i]
		l.onNotification(n.Channel, n.PID, n.Payload)
	}
	b.Release() // everything above copied what it keeps; the loop entry's leave writes it out
}

// onEvents routes one batch of notifications from the first process's hub (a sibling's
// source, siblingsource.go): one loop entry, so one write per subscriber for all of them.
func (l *listenState) onEvents(evs []pglisten.Event) {
	l.metrics.notifications.Add(float64(len(evs)))
	l.fan.receiving(time.Now()) // when the loop took them: the hub's hand-off is not measured
	for i := range evs {
		l.onNotification([]byte(evs[i].Channel), evs[i].PID, evs[i].Payload)
	}
}

// onNotification routes one notification: the stream channel's payloads to the streams, raw
// channels to their SSE subscriptions and hub workers (in the first process of --procs, the
// stream channel is also a raw channel that sibling processes hold through the hub).
// channel and payload are valid only during the call.
func (l *listenState) onNotification(channel []byte, pid uint32, payload []byte) {
	if string(channel) == storeChannel {
		if err := store.ParsePayload(payload, &l.payload); err != nil {
			l.metrics.droppedBadPayload.Inc()
			l.log.Debug("ignoring a payload on the stream channel that is not pgsse's", "err", err, "pid", pid)
		} else if l.payload.Kind == store.KindPresence {
			l.pres.onPayload(&l.payload)
		} else {
			l.fan.onPayload(&l.payload)
		}
	}
	l.chans.notify(channel, pid, payload)
}

// onDown: the session was lost. Connections stay; raw channels are no longer listening and
// workers are told (LISTENER_DOWN).
func (l *listenState) onDown(err error) {
	l.up = false
	l.downSinceMS = l.nowMS
	l.upNow.Store(false)
	l.log.Warn("LISTEN session lost; clients keep their connections and will be caught up", "err", err)
	l.chans.down()
	l.hub.listenerDown()
	l.pres.listenDown()
}

// onResynced: the session is (back) up with every channel LISTENed again. Raw channels go
// live, every stream is caught up from the table (docs/architecture.md, invariant 4) and, after a
// loss, workers are told to RESYNC.
func (l *listenState) onResynced() {
	wasUp := l.everUp
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
		l.hub.resync()
	}
}
