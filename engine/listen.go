package engine

import (
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

// newListenSource opens (not starts) the process's own LISTEN session — or, in a sibling
// process of --procs, the first process's hub (siblingsource.go).
func (s *Server) newListenSource() listenSource {
	if s.cfg.SiblingHub != nil {
		return s.newSiblingSource()
	}
	return pglisten.NewSession(pglisten.Config{DSN: s.cfg.DatabaseURL, Logger: s.log, MaxChannels: listenMaxChannels}, sessionEvents{s})
}

// sessionEvents hands the LISTEN source's callbacks to the loop, in order.
type sessionEvents struct{ s *Server }

var _ pglisten.Events = sessionEvents{}

// Notifications hands a batch to the loop. At most listenBatchesQueued batches wait for the
// loop at once (docs/architecture.md, invariant 3): beyond that the session's goroutine waits
// here, the session stops reading, and PostgreSQL's notification queue holds the rest — a loop
// busy writing to thousands of slow sockets does not pile up read buffers.
func (e sessionEvents) Notifications(b *pglisten.Batch) {
	select {
	case e.s.batchSlots <- struct{}{}:
	case <-e.s.stopping:
		b.Release()
		return
	}
	if !e.s.tasks.push(func() { e.s.onBatch(b); <-e.s.batchSlots }) {
		<-e.s.batchSlots
		b.Release()
	}
}

// listenBatchesQueued bounds the notification batches (a read buffer each, 64 KiB) waiting
// for the loop.
const listenBatchesQueued = 64

func (e sessionEvents) Down(err error) { e.s.tasks.push(func() { e.s.onDown(err) }) }
func (e sessionEvents) Resynced()      { e.s.tasks.push(e.s.onResynced) }

// onBatch routes one batch of notifications from the process's own session.
func (s *Server) onBatch(b *pglisten.Batch) {
	s.enter()
	defer s.leave()
	s.metrics.notifications.Add(float64(len(b.Notes)))
	for i := range b.Notes {
		n := &b.Notes[i]
		s.onNotification(n.Channel, n.PID, n.Payload)
	}
	b.Release() // everything above copied what it keeps; leave() writes it out
}

// onEvents routes one batch of notifications from the first process's hub (a sibling's
// source, siblingsource.go): one loop entry, so one write per subscriber for all of them.
func (s *Server) onEvents(evs []pglisten.Event) {
	s.enter()
	defer s.leave()
	s.metrics.notifications.Add(float64(len(evs)))
	for i := range evs {
		s.onNotification([]byte(evs[i].Channel), evs[i].PID, evs[i].Payload)
	}
}

// onNotification routes one notification: the stream channel's payloads to the streams, raw
// channels to their SSE clients and hub workers (in the first process of --procs, the
// stream channel is also a raw channel that sibling processes hold through the hub).
// channel and payload are valid only during the call.
func (s *Server) onNotification(channel []byte, pid uint32, payload []byte) {
	if string(channel) == storeChannel {
		if err := store.ParsePayload(payload, &s.payload); err != nil {
			s.metrics.droppedBadPayload.Inc()
			s.log.Debug("ignoring a payload on the stream channel that is not pgsse's", "err", err, "pid", pid)
		} else {
			s.onPayload(&s.payload)
		}
	}
	if ch := s.channels[string(channel)]; ch != nil {
		s.onChannelNotify(ch, pid, payload)
	}
}

// onDown: the session was lost. Connections stay; raw channels are no longer listening and
// workers are told (LISTENER_DOWN).
func (s *Server) onDown(err error) {
	s.enter()
	defer s.leave()
	s.listenUp = false
	s.listenDownSinceMS = s.nowMS
	s.listenOK.Store(false)
	s.log.Warn("LISTEN session lost; clients keep their connections and will be caught up", "err", err)
	for _, ch := range s.channels {
		ch.listening = false
	}
	s.hub.listenerDown()
}

// onResynced: the session is (back) up with every channel LISTENed again. Raw channels go
// live, every stream is caught up from the table (docs/architecture.md, invariant 4) and, after a
// loss, workers are told to RESYNC.
func (s *Server) onResynced() {
	s.enter()
	defer s.leave()
	wasUp := s.everUp
	s.listenUp, s.everUp = true, true
	s.listenOK.Store(true)
	if wasUp {
		s.metrics.reconnects.Inc()
		s.log.Info("LISTEN session back; catching streams up from the table", "streams", len(s.streams), "channels", len(s.channels))
	}
	for _, ch := range s.channels {
		if ch.ref == refHeld { // a failed or still-pending LISTEN is not live
			s.channelLive(ch)
		}
	}
	s.resyncStreams()
	if wasUp {
		s.hub.resync()
	}
}
