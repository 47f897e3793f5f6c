package engine

import (
	"errors"

	"github.com/pgsse/pgsse/framing"
	"github.com/pgsse/pgsse/pglisten"
)

// errReservedChannel refuses the stream channel as a raw channel, to SSE clients (403) and
// hub workers (ACK BAD_CHANNEL) alike: its payloads are pgsse's own (store.ParsePayload).
var errReservedChannel = errors.New("channel " + storeChannel + " is reserved for pgsse's streams")

// reservedChannel reports whether name may not be subscribed to as a raw channel.
func reservedChannel(name []byte) bool { return string(name) == storeChannel }

// channel is one raw PostgreSQL channel with holders on this server: SSE /channels/
// subscriptions and hub workers share one LISTEN (one session reference) per channel.
type channel struct {
	name      string
	holders   int  // SSE subscriptions + hub workers holding the channel
	clients   int  // of them, the SSE side's (SSE subscriptions, sibling processes): channelShares
	listening bool // LISTEN completed on the current session
	ref       sessionRef
	sse       channelSubs // the SSE subscriptions' side (fanout.go)
	hub       hubChannel  // hub workers' side (hubserver.go)
}

// channelTable is the loop's part for raw channels: the channels held, by name, each with
// its LISTEN on the session (held by its first holder, released by its last), and the news
// of that LISTEN for both sides — SSE subscriptions (fanout.go) and hub workers (hubserver.go).
type channelTable struct {
	*loopEnv
	lsn    *listenState
	fan    *fanout
	hub    *hubServer
	byName map[string]*channel
	shares channelShares
}

// channelShares is how the LISTEN session's channels are shared out (docs/hub-protocol.md,
// Channel shares): the stream channel, the hub workers' share (hubServer.channels, its
// maxChannels) and the SSE side's — this process's /channels/ subscriptions and, through the
// hub, those of sibling processes (--procs). Each side counts the distinct channels it holds,
// a channel both hold counting on both, so the session never holds more than 1 + the two
// shares: a LISTEN never fails for want of room, and neither side can take the other's.
type channelShares struct {
	session int // channels the session holds at most: listenMaxChannels (Config.listenChannels in tests)
	sse     int // distinct channels the SSE side holds (channel.clients > 0)
	sseMax  int // its share: session − the hub's − the stream channel
	// loggedMS: when a full share was last logged (logLimit)
	loggedMS int64
}

// listenChannelLimit is the LISTEN session's channel limit: listenMaxChannels, lowerable in
// tests (Config.listenChannels: filling 10,000 channels takes 20,000 descriptors).
func listenChannelLimit(cfg Config) int {
	if cfg.listenChannels > 0 {
		return cfg.listenChannels
	}
	return listenMaxChannels
}

// hubShares are the hub's caps of a session of n channels (hubMaxChannels,
// hubMaxChannelsPerWorker for listenMaxChannels): the workers together hold at most half of
// them, one worker at most a fifth.
func hubShares(n int) (all, perWorker int) { return n / 2, n / 5 }

func newChannelTable(env *loopEnv, lsn *listenState, fan *fanout, hub *hubServer) channelTable {
	n := listenChannelLimit(env.cfg)
	hubAll, _ := hubShares(n)
	return channelTable{loopEnv: env, lsn: lsn, fan: fan, hub: hub, byName: make(map[string]*channel),
		shares: channelShares{session: n, sseMax: n - hubAll - 1}}
}

// sseShareFull reports whether the SSE side may not take channel name: it holds its share
// and not that channel already.
func (t *channelTable) sseShareFull(name []byte) bool {
	if ch := t.byName[string(name)]; ch != nil && ch.clients > 0 {
		return false
	}
	return t.shares.sse >= t.shares.sseMax
}

// sseShare is the SSE side's share of channels.
func (t *channelTable) sseShare() int { return t.shares.sseMax }

// holdClient holds channel name for one SSE-side holder (a /channels/ subscription, or a
// sibling process's subscription through the hub), counted in the SSE share; releaseClient
// gives it back.
func (t *channelTable) holdClient(name string) *channel {
	ch := t.hold(name)
	if ch.clients++; ch.clients == 1 {
		t.shares.sse++
	}
	return ch
}

func (t *channelTable) releaseClient(ch *channel) {
	if ch.clients--; ch.clients == 0 {
		t.shares.sse--
	}
	t.release(ch)
}

// channelLimitLogEveryMS: "share of channels full" at most this often.
const channelLimitLogEveryMS = 10_000

// logLimit says, at most every channelLimitLogEveryMS, that a side's share of the LISTEN
// session's channels is full.
func (t *channelTable) logLimit(side string, limit int) {
	if t.nowMS-t.shares.loggedMS < channelLimitLogEveryMS {
		return
	}
	t.shares.loggedMS = t.nowMS
	t.log.Warn("refusing new channels: "+side+" hold their share of the LISTEN session's channels (docs/hub-protocol.md, Channel shares)",
		"limit", limit, "sse_channels", t.shares.sse, "hub_channels", t.hub.channelCount())
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

// hold adds a holder and returns the channel; the first holder starts the LISTEN.
func (t *channelTable) hold(name string) *channel {
	ch := t.byName[name]
	if ch == nil {
		ch = &channel{name: name}
		t.byName[name] = ch
	}
	ch.holders++
	if ch.holders == 1 {
		t.countChannels()
		if t.lsn.listen(name, func(err error) {
			t.tasks.push(func() { t.lsn.inOrder(func() { t.onListened(ch, err) }) }) // in order with the notifications
		}) {
			ch.ref = refPending
		}
	}
	return ch
}

// lookup is the channel held under name, or nil.
func (t *channelTable) lookup(name []byte) *channel { return t.byName[string(name)] }

// count is the number of channels held.
func (t *channelTable) count() int { return len(t.byName) }

// isLive reports whether the channel's LISTEN is complete on the current session, so that a
// new holder is live at once.
func (t *channelTable) isLive(ch *channel) bool { return ch.listening && t.lsn.isUp() }

// countChannels sets pgsse_listen_channels: the raw channels held, not the stream channel
// (which sibling processes of --procs hold through the hub).
func (t *channelTable) countChannels() {
	n := len(t.byName)
	if t.byName[storeChannel] != nil {
		n--
	}
	t.metrics.listenChannels.Set(float64(n))
}

// release drops a holder; the last one UNLISTENs.
func (t *channelTable) release(ch *channel) {
	ch.holders--
	if ch.holders > 0 {
		return
	}
	if t.byName[ch.name] == ch {
		delete(t.byName, ch.name)
		t.countChannels()
	}
	if ch.ref == refHeld && t.lsn.unlisten(ch.name) {
		ch.ref = refNone
	}
	// refPending: onListened drops the reference once PostgreSQL has answered.
}

func (t *channelTable) onListened(ch *channel, err error) {
	if err != nil {
		ch.ref = refNone
		if t.byName[ch.name] == ch {
			t.log.Warn("LISTEN failed", "channel", ch.name, "err", err)
			t.failed(ch, err)
		}
		return
	}
	if t.byName[ch.name] != ch || ch.holders == 0 {
		// Every holder left while the LISTEN was in flight: give the reference back.
		ch.ref = refNone
		t.lsn.unlisten(ch.name)
		return
	}
	ch.ref = refHeld
	t.live(ch)
}

// live runs once the LISTEN is complete on the current session: waiting SSE subscriptions
// start (their connections get the response head), waiting hub SUBs get their ACK.
func (t *channelTable) live(ch *channel) {
	if !t.lsn.isUp() {
		return // Resynced will do it once the session is back
	}
	ch.listening = true
	t.fan.channelLive(ch)
	t.hub.channelLive(ch)
}

// failed: the LISTEN failed. Waiting SSE subscriptions' connections are shed — for the
// channel limit when the session (or, in a sibling process, the first process's hub) holds
// all the channels it may, else the database is unavailable — and waiting hub SUBs answered.
func (t *channelTable) failed(ch *channel, err error) {
	why := shedDatabaseUnavailable
	var refused *pglisten.AckError
	if errors.Is(err, pglisten.ErrTooManyChannels) || errors.As(err, &refused) && refused.Code == framing.AckLimit {
		why = shedChannelLimit
	}
	t.fan.channelFailed(ch, why)
	t.hub.channelFailed(ch, err)
}

// down: the LISTEN session was lost; no channel is listening until it is back.
func (t *channelTable) down() {
	for _, ch := range t.byName {
		ch.listening = false
	}
}

// resynced: the session is back with every channel LISTENed again; the channels whose
// LISTEN had completed are live (a failed or still-pending one is not).
func (t *channelTable) resynced() {
	for _, ch := range t.byName {
		if ch.ref == refHeld {
			t.live(ch)
		}
	}
}

// names are the channels held (tests).
func (t *channelTable) names() []string {
	var out []string
	for name := range t.byName {
		out = append(out, name)
	}
	return out
}

// notify hands a raw notification to the channel's SSE subscriptions (encoded once) and hub
// workers; channel and payload are valid only during the call. It reports whether the hub
// stalled on it (a lossless worker could not take it yet: the caller's batch waits,
// listenState.pause).
func (t *channelTable) notify(channel []byte, pid uint32, payload []byte) (stalled bool) {
	ch := t.byName[string(channel)]
	if ch == nil {
		return false
	}
	t.fan.channelNotify(ch, payload)
	return t.hub.notify(ch, pid, payload)
}
