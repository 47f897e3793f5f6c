package engine

import (
	"errors"

	"github.com/pgsse/pgsse/framing"
	"github.com/pgsse/pgsse/pglisten"
	"github.com/pgsse/pgsse/sse"
)

// errReservedChannel refuses the stream channel as a raw channel, to SSE clients (403) and
// hub workers (ACK BAD_CHANNEL) alike: its payloads are pgsse's own (store.ParsePayload).
var errReservedChannel = errors.New("channel " + storeChannel + " is reserved for pgsse's streams")

// reservedChannel reports whether name may not be subscribed to as a raw channel.
func reservedChannel(name []byte) bool { return string(name) == storeChannel }

// channelShares is how the LISTEN session's channels are shared out (docs/hub-protocol.md,
// Channel shares): the stream channel, the hub workers' share (hub.channels, hub.maxChannels)
// and the SSE side's — this process's /channels/ clients and, through the hub, those of sibling
// processes (--procs). Each side counts the distinct channels it holds, a channel both hold
// counting on both, so the session never holds more than 1 + the two shares: a LISTEN never
// fails for want of room, and neither side can take the other's.
type channelShares struct {
	session int // channels the session holds at most: listenMaxChannels (Config.listenChannels in tests)
	sse     int // distinct channels the SSE side holds (channel.clients > 0)
	sseMax  int // its share: session − the hub's − the stream channel
	// loggedMS: when a full share was last logged (logChannelLimit)
	loggedMS int64
}

// shareChannels derives the caps from the session's channel limit n (New).
func (s *Server) shareChannels(n int) {
	s.shares.session = n
	s.hub.maxChannels, s.hub.maxWorkerChannels = n/2, n/5 // hubMaxChannels, hubMaxChannelsPerWorker
	s.shares.sseMax = n - s.hub.maxChannels - 1
}

// sseShareFull reports whether the SSE side may not take channel name: it holds its share
// and not that channel already.
func (s *Server) sseShareFull(name []byte) bool {
	if ch := s.channels[string(name)]; ch != nil && ch.clients > 0 {
		return false
	}
	return s.shares.sse >= s.shares.sseMax
}

// holdClient and releaseClient count one SSE-side holder of ch (a /channels/ connection, or
// a sibling process's subscription) in the SSE share.
func (s *Server) holdClient(ch *channel) {
	if ch.clients++; ch.clients == 1 {
		s.shares.sse++
	}
}

func (s *Server) releaseClient(ch *channel) {
	if ch.clients--; ch.clients == 0 {
		s.shares.sse--
	}
}

// channel is one raw PostgreSQL channel with holders on this server: SSE /channels/
// clients and hub workers share one LISTEN (one session reference) per channel.
type channel struct {
	name      string
	sse       []*sseConn
	holders   int  // SSE connections + hub workers holding the channel
	clients   int  // of them, the SSE side's (SSE connections, sibling processes): channelShares
	listening bool // LISTEN completed on the current session
	ref       sessionRef
	out       []*event // notifications of this loop pass, each encoded once
	dirty     bool
	hub       hubChannel // hub workers' side (hub.go)
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
				s.tasks.push(func() { s.sessionEvent(func() { s.onListened(ch, err) }) }) // in order with the notifications
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

// channelFailed: the LISTEN failed. Waiting SSE clients are shed — for the channel limit when
// the session (or, in a sibling process, the first process's hub) holds all the channels it
// may, else the database is unavailable — and waiting hub SUBs answered.
func (s *Server) channelFailed(ch *channel, err error) {
	why := shedDatabaseUnavailable
	var refused *pglisten.AckError
	if errors.Is(err, pglisten.ErrTooManyChannels) || errors.As(err, &refused) && refused.Code == framing.AckLimit {
		why = shedChannelLimit
	}
	for _, sc := range append([]*sseConn(nil), ch.sse...) {
		if sc.state == statePending {
			s.shed(sc, why)
		}
	}
	s.hub.channelFailed(ch, err)
}

// subscribeChannel registers an admitted (pending) connection on its channel; the response
// head goes out once the LISTEN has completed (here, or in channelLive). Over the SSE side's
// share of channels it is shed, saying so: 200 and retry (docs/http.md, Responses and errors),
// as for any capacity — a limit of the server that frees up as others leave, not an error of
// the request, which EventSource would take as final.
func (s *Server) subscribeChannel(sc *sseConn, name string) {
	if s.sseShareFull([]byte(name)) {
		s.logChannelLimit("SSE clients", s.shares.sseMax)
		s.shed(sc, shedChannelLimit)
		return
	}
	ch := s.holdChannel(name)
	s.holdClient(ch)
	sc.ch = ch
	sc.subIdx = int32(len(ch.sse))
	ch.sse = append(ch.sse, sc)
	if ch.listening && s.listenUp {
		s.respond(sc, stateLive)
	}
}

// unsubscribeChannel takes a closed connection off its channel (removeConn).
func (s *Server) unsubscribeChannel(sc *sseConn) {
	ch := sc.ch
	ch.sse = swapRemove(ch.sse, sc, subIndex)
	sc.ch = nil
	s.releaseClient(ch)
	s.releaseChannel(ch)
}

// channelLimitLogEveryMS: "share of channels full" at most this often.
const channelLimitLogEveryMS = 10_000

// logChannelLimit says, at most every channelLimitLogEveryMS, that a side's share of the
// LISTEN session's channels is full.
func (s *Server) logChannelLimit(side string, limit int) {
	if s.nowMS-s.shares.loggedMS < channelLimitLogEveryMS {
		return
	}
	s.shares.loggedMS = s.nowMS
	s.log.Warn("refusing new channels: "+side+" hold their share of the LISTEN session's channels (docs/hub-protocol.md, Channel shares)",
		"limit", limit, "sse_channels", s.shares.sse, "hub_channels", s.hub.channels)
}

// onChannelNotify queues a raw notification for the channel's SSE clients (encoded once)
// and hands it to the hub workers; it reports whether the hub stalled on it.
func (s *Server) onChannelNotify(ch *channel, pid uint32, payload []byte) (stalled bool) {
	if len(ch.sse) > 0 {
		ch.out = append(ch.out, &event{enc: sse.AppendEvent(nil, 0, nil, payload)})
		if !ch.dirty {
			ch.dirty = true
			s.dirtyChannels = append(s.dirtyChannels, ch)
		}
	}
	return s.hub.notify(ch, pid, payload)
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
				s.evictSlow(sc)
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
