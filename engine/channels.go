package engine

import (
	"errors"

	"github.com/pgsse/pgsse/pglisten"
	"github.com/pgsse/pgsse/sse"
)

// errReservedChannel refuses the stream channel as a raw channel, to SSE clients (403) and
// hub workers (ACK BAD_CHANNEL) alike: its payloads are pgsse's own (store.ParsePayload).
var errReservedChannel = errors.New("channel " + storeChannel + " is reserved for pgsse's streams")

// reservedChannel reports whether name may not be subscribed to as a raw channel.
func reservedChannel(name []byte) bool { return string(name) == storeChannel }

// channel is one raw PostgreSQL channel with holders on this server: SSE /channels/
// clients and hub workers share one LISTEN (one session reference) per channel.
type channel struct {
	name      string
	sse       []*sseConn
	holders   int  // SSE connections + hub workers holding the channel
	listening bool // LISTEN completed on the current session
	ref       sessionRef
	out       []*event // notifications of this loop pass, each encoded once
	dirty     bool
	hub       hubChannel // hub workers' side (hubserver.go)
}

// sessionRef is the channel's reference on the LISTEN session. The session can only be
// told to drop a reference it confirmed (done(nil)): a reference whose LISTEN is still in
// flight is dropped when its answer arrives, a failed one was never held.
type sessionRef uint8

const (
	refNone    sessionRef = iota // no reference (never asked, failed, or released)
	refPending                   // Listen called, done not yet
	refHeld                      // done(nil): Unlisten when the last holder leaves
)

// holdChannel adds a holder and returns the channel; the first holder starts the LISTEN.
func (s *Server) holdChannel(name string) *channel {
	ch := s.channels[name]
	if ch == nil {
		ch = &channel{name: name}
		s.channels[name] = ch
	}
	ch.holders++
	if ch.holders == 1 {
		s.countChannels()
		if s.listen != nil {
			ch.ref = refPending
			s.listen.Listen(name, func(err error) {
				s.tasks.push(func() { s.onListened(ch, err) })
			})
		}
	}
	return ch
}

// countChannels sets pgsse_listen_channels: the raw channels held, not the stream channel
// (which sibling processes of --procs hold through the hub).
func (s *Server) countChannels() {
	n := len(s.channels)
	if s.channels[storeChannel] != nil {
		n--
	}
	s.metrics.listenChannels.Set(float64(n))
}

// releaseChannel drops a holder; the last one UNLISTENs.
func (s *Server) releaseChannel(ch *channel) {
	ch.holders--
	if ch.holders > 0 {
		return
	}
	if s.channels[ch.name] == ch {
		delete(s.channels, ch.name)
		s.countChannels()
	}
	if ch.ref == refHeld && s.listen != nil {
		s.listen.Unlisten(ch.name)
		ch.ref = refNone
	}
	// refPending: onListened drops the reference once PostgreSQL has answered.
}

func (s *Server) onListened(ch *channel, err error) {
	if err != nil {
		ch.ref = refNone
		if s.channels[ch.name] == ch {
			s.log.Warn("LISTEN failed", "channel", ch.name, "err", err)
			s.channelFailed(ch, err)
		}
		return
	}
	if s.channels[ch.name] != ch || ch.holders == 0 {
		// Every holder left while the LISTEN was in flight: give the reference back.
		ch.ref = refNone
		if s.listen != nil {
			s.listen.Unlisten(ch.name)
		}
		return
	}
	ch.ref = refHeld
	s.channelLive(ch)
}

// channelLive runs once the LISTEN is complete on the current session: waiting SSE
// clients get their response head, waiting hub SUBs their ACK.
func (s *Server) channelLive(ch *channel) {
	if !s.listenUp {
		return // Resynced will do it once the session is back
	}
	ch.listening = true
	for _, sc := range ch.sse {
		if sc.state == statePending && !sc.closed {
			s.respond(sc, stateLive)
		}
	}
	s.hub.channelLive(ch)
}

// channelFailed: the LISTEN failed. Waiting SSE clients are shed — over capacity when the
// session holds all the channels it may, else the database is unavailable — and waiting hub
// SUBs answered.
func (s *Server) channelFailed(ch *channel, err error) {
	why := shedDatabaseUnavailable
	if errors.Is(err, pglisten.ErrTooManyChannels) {
		why = shedOverCapacity
	}
	for _, sc := range append([]*sseConn(nil), ch.sse...) {
		if sc.state == statePending {
			s.shed(sc, why)
		}
	}
	s.hub.channelFailed(ch, err)
}

// subscribeChannel registers an admitted (pending) connection on its channel; the response
// head goes out once the LISTEN has completed (here, or in channelLive).
func (s *Server) subscribeChannel(sc *sseConn, name string) {
	ch := s.holdChannel(name)
	sc.ch = ch
	sc.subIdx = int32(len(ch.sse))
	ch.sse = append(ch.sse, sc)
	if ch.listening && s.listenUp {
		s.respond(sc, stateLive)
	}
}

// onChannelNotify queues a raw notification for the channel's SSE clients (encoded once)
// and hands it to the hub workers.
func (s *Server) onChannelNotify(ch *channel, pid uint32, payload []byte) {
	if len(ch.sse) > 0 {
		ch.out = append(ch.out, &event{enc: sse.AppendEvent(nil, 0, nil, payload)})
		if !ch.dirty {
			ch.dirty = true
			s.dirtyChannels = append(s.dirtyChannels, ch)
		}
	}
	s.hub.notify(ch, pid, payload)
}

func (s *Server) flushChannels() {
	for _, ch := range s.dirtyChannels {
		ch.dirty = false
		if len(ch.out) == 0 {
			continue
		}
		n := 0
		for _, sc := range ch.sse {
			if sc.closed || sc.state != stateLive {
				continue
			}
			if sc.pending() > s.limits().ephemeral {
				s.metrics.droppedSlowClient.Inc()
				s.closeWithRetry(sc)
				continue
			}
			sc.writeEvents(s, ch.out)
			n += len(ch.out)
		}
		s.metrics.deliveries.Add(float64(n))
		clear(ch.out)
		ch.out = ch.out[:0]
	}
	s.dirtyChannels = s.dirtyChannels[:0]
}
