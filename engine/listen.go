package engine

import (
	"github.com/pgsse/pgsse/pglisten"
	"github.com/pgsse/pgsse/store"
)

// storeChannel is the one PostgreSQL channel all stream traffic travels on.
const storeChannel = store.Channel

// listenMaxChannels is how many channels the LISTEN session holds at most (PostgreSQL scans a
// backend's channel list linearly per notification); a LISTEN beyond it fails, and the hub
// takes at most its share (hub.go).
const listenMaxChannels = 10_000

// listenSource is where the loop's notifications come from: today the process's own LISTEN
// session (pglisten.Session). The loop uses nothing else of it: Listen/Unlisten for each
// channel it holds (done reports once the LISTEN completed, or failed), Start and Close, and
// the pglisten.Events callbacks below (sessionEvents) — so another source, e.g. a secondary
// process of --procs reading the first process's hub, can take its place.
type listenSource interface {
	Start()
	Listen(channel string, done func(error))
	Unlisten(channel string)
	Close() error
}

var _ listenSource = (*pglisten.Session)(nil)

// newListenSource opens (not starts) the process's own LISTEN session.
func (s *Server) newListenSource() listenSource {
	return pglisten.NewSession(pglisten.Config{DSN: s.cfg.DatabaseURL, Logger: s.log, MaxChannels: listenMaxChannels}, sessionEvents{s})
}

// sessionEvents hands the LISTEN source's callbacks to the loop, in order.
type sessionEvents struct{ s *Server }

var _ pglisten.Events = sessionEvents{}

// Notifications hands a batch to the loop. At most listenBatchesQueued batches wait for the
// loop at once (DESIGN invariant 3): beyond that the session's goroutine waits here, the
// session stops reading, and PostgreSQL's notification queue holds the rest — a loop busy
// writing to thousands of slow sockets does not pile up read buffers.
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

// onBatch routes one batch of notifications: the stream channel's payloads to the streams,
// raw channels to their SSE clients and hub workers.
func (s *Server) onBatch(b *pglisten.Batch) {
	s.enter()
	defer s.leave()
	s.metrics.notifications.Add(float64(len(b.Notes)))
	for i := range b.Notes {
		n := &b.Notes[i]
		if string(n.Channel) == storeChannel {
			if err := store.ParsePayload(n.Payload, &s.payload); err != nil {
				s.metrics.droppedBadPayload.Inc()
				s.log.Debug("ignoring a payload on the stream channel that is not pgsse's", "err", err, "pid", n.PID)
			} else {
				s.onPayload(&s.payload)
			}
		}
		if ch := s.channels[string(n.Channel)]; ch != nil {
			s.onChannelNotify(ch, n.PID, n.Payload)
		}
	}
	b.Release() // everything above copied what it keeps; leave() writes it out
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
// live, every stream is caught up from the table (DESIGN invariant 4) and, after a loss,
// workers are told to RESYNC.
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
