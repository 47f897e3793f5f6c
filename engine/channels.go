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

	// A handoff (handoff.go; docs/architecture.md, Handoff positions). pos counts the
	// channel's notifications since the handoff mark (−1: not counted — no mark yet, or the
	// channel was not LISTENed throughout since it). In a successor, armed says the LISTEN
	// was confirmed before the predecessor was told ready (so before its mark), notes are the
	// newest notifications since the mark (pos − len(notes) = base is the first one's), and
	// parked are handed-over subscriptions waiting for the notification at their position.
	pos     int64
	armed   bool
	base    int64
	notes   []heldNote
	parked  []parkedResume
	waiters []func(error) // told once the LISTEN completed or failed (HoldChannels, BeginHandoff)
}

// heldNote is one notification a successor keeps for handed-over subscriptions.
type heldNote struct {
	pid     uint32
	payload []byte
}

// parkedResume is a handed-over subscription waiting for its channel's notification at pos.
type parkedResume struct {
	pos int64
	fn  func(notes []heldNote, exact bool)
}

// handoffChans is the table's side of a handoff: the mark's channel, whether the mark has
// arrived, and in a successor the holds taken for the predecessor and the kept notes' bytes.
type handoffChans struct {
	mark      *channel
	successor bool
	marked    bool
	onMark    []func() // a predecessor waiting for its own mark
	held      []*channel
	keep      bool // a successor keeps notes (until releaseHeld)
	// markHeld: a successor released its holds before its mark arrived (the predecessor's
	// last batches can overtake the mark, which comes through this process's own session —
	// or, in a --procs sibling, through its first process's hub); the mark's hold is kept
	// until it arrives (marked) or the succession ends, or the mark would be UNLISTENed,
	// never seen, and every parked subscription would wait out handoffParkAfterMS.
	markHeld bool
	bytes    int
	endMS    int64 // a successor lets go of everything (holds, notes, parked) at this time
}

// Bounds of what a successor keeps (docs/architecture.md, Handoff positions).
const (
	handoffKeepBytes   = 16 << 20 // notes of all channels together, payload + heldNoteOverhead each
	heldNoteOverhead   = 48
	handoffHoldMS      = 90_000 // the predecessor's holds and parked subscriptions at most this long
	handoffParkAfterMS = 10_000 // parked subscriptions after the holds were released
)

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
	ho     handoffChans
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
		ch = &channel{name: name, pos: -1}
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
	defer t.tellWaiters(ch, err)
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
		// Positions count a session's notifications: a new session's are not comparable.
		ch.pos, ch.armed = -1, false
		t.unpark(ch)
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
	if ch == t.ho.mark {
		t.marked()
		return false // the mark is pgsse's own: nobody else LISTENs its channel
	}
	if ch.pos >= 0 {
		t.countNote(ch, pid, payload)
	}
	t.fan.channelNotify(ch, payload)
	return t.hub.notify(ch, pid, payload)
}

// --- handoff (handoff.go; docs/architecture.md, Handoff positions) ------------------------

// tellWaiters tells those waiting for ch's LISTEN how it went.
func (t *channelTable) tellWaiters(ch *channel, err error) {
	w := ch.waiters
	ch.waiters = nil
	for _, f := range w {
		f(err)
	}
}

// whenListened runs done once ch's LISTEN is complete (at once if it is) or has failed.
func (t *channelTable) whenListened(ch *channel, done func(error)) {
	if t.isLive(ch) {
		done(nil)
		return
	}
	ch.waiters = append(ch.waiters, done)
}

// listened are the raw channels held, not the stream channel (the successor holds it itself):
// what a predecessor tells its successor to LISTEN (framing.HandoffChannels).
func (t *channelTable) listened() []string {
	out := make([]string, 0, len(t.byName))
	for name := range t.byName {
		if name != storeChannel {
			out = append(out, name)
		}
	}
	return out
}

// beginMark (a predecessor) holds the mark's channel, done once its LISTEN is complete.
func (t *channelTable) beginMark(name string, done func(error)) {
	t.endSuccession() // a successor handing over in turn: what it kept is done with
	t.endMark()
	t.ho.mark = t.hold(name)
	t.whenListened(t.ho.mark, done)
}

// awaitMark (a predecessor) runs done once its own mark has arrived.
func (t *channelTable) awaitMark(done func()) {
	if t.ho.marked {
		done()
		return
	}
	t.ho.onMark = append(t.ho.onMark, done)
}

// endMark (a predecessor whose handoff failed) lets go of the mark: positions count no more.
func (t *channelTable) endMark() {
	if t.ho.mark == nil || t.ho.successor {
		return
	}
	t.release(t.ho.mark)
	for _, ch := range t.byName {
		ch.pos = -1
	}
	t.ho = handoffChans{}
}

// marked: the mark arrived. From here each channel LISTENed throughout counts its
// notifications — in a predecessor every channel LISTENed now, in a successor those armed
// (LISTENed before the predecessor was told ready, so before the mark was notified): the
// two sessions see the same notifications after the mark, in the same order (PostgreSQL's
// one notification queue), so the same position names the same notification in both.
func (t *channelTable) marked() {
	if t.ho.marked {
		return
	}
	t.ho.marked = true
	for _, ch := range t.byName {
		ch.pos, ch.base = -1, 0
		if t.isLive(ch) && (ch.armed || !t.ho.successor) && ch != t.ho.mark {
			ch.pos = 0
		}
		t.resumeParked(ch)
	}
	w := t.ho.onMark
	t.ho.onMark = nil
	for _, f := range w {
		f()
	}
	t.releaseMark()
}

// countNote is a notification on a counted channel: parked subscriptions waiting for this one
// start (they get it and what follows), a successor keeps it, and the position moves on.
func (t *channelTable) countNote(ch *channel, pid uint32, payload []byte) {
	t.resumeParked(ch)
	if t.ho.keep && ch.armed {
		t.keepNote(ch, pid, payload)
	}
	ch.pos++
	if len(ch.notes) == 0 {
		ch.base = ch.pos
	}
}

// keepNote keeps a copy of a notification, within handoffKeepBytes: the channel's oldest go
// first; one that does not fit then is not kept (a subscription that would need it is not
// exact: channelTable.resumeAt).
func (t *channelTable) keepNote(ch *channel, pid uint32, payload []byte) {
	need := len(payload) + heldNoteOverhead
	for t.ho.bytes+need > handoffKeepBytes && len(ch.notes) > 0 {
		t.ho.bytes -= len(ch.notes[0].payload) + heldNoteOverhead
		ch.notes[0] = heldNote{}
		ch.notes = ch.notes[1:]
		ch.base++
	}
	if t.ho.bytes+need > handoffKeepBytes {
		return // count moves base past it
	}
	if len(ch.notes) == 0 {
		ch.base = ch.pos
	}
	ch.notes = append(ch.notes, heldNote{pid: pid, payload: append([]byte(nil), payload...)})
	t.ho.bytes += need
}

// ssePosition and hubPosition are the handoff position of a subscription to ch that is
// handed over now (framing.HandoffNoPosition: not counted): the notifications since the mark
// it was given — an SSE subscription's, those already written (the loop pass's queued
// notifications, fanout.pendingNotes, are not), a hub worker's, those in its ring.
func (t *channelTable) ssePosition(ch *channel) int64 {
	if !t.ho.marked || ch.pos < 0 {
		return framing.HandoffNoPosition
	}
	p := ch.pos - int64(t.fan.pendingNotes(ch))
	if p < 0 {
		return framing.HandoffNoPosition // some of them came before the mark
	}
	return p
}

func (t *channelTable) hubPosition(ch *channel) int64 {
	if !t.ho.marked || ch.pos < 0 {
		return framing.HandoffNoPosition
	}
	return ch.pos
}

// holdFor (a successor) holds the predecessor's channels and the mark's, done once every
// LISTEN is complete (the first failure otherwise); those confirmed then are armed.
func (t *channelTable) holdFor(mark string, names []string, done func(error)) {
	t.ho.successor, t.ho.keep = true, true
	t.ho.endMS = t.nowMS + handoffHoldMS
	t.fan.keepUntil(t.ho.endMS)
	held := make(map[string]bool, len(t.ho.held))
	for _, ch := range t.ho.held {
		held[ch.name] = true
	}
	if mark != "" {
		names = append(names, mark)
	}
	var wait []*channel
	for _, name := range names {
		if held[name] || name == storeChannel {
			continue
		}
		held[name] = true
		ch := t.hold(name)
		t.ho.held = append(t.ho.held, ch)
		if name == mark {
			t.ho.mark = ch
		}
		wait = append(wait, ch)
	}
	left := len(wait) + 1
	var first error
	one := func(err error) {
		if first == nil {
			first = err
		}
		if left--; left > 0 {
			return
		}
		if first == nil && !t.ho.marked {
			for _, ch := range t.ho.held {
				ch.armed = ch.armed || t.isLive(ch)
			}
		}
		done(first)
	}
	for _, ch := range wait {
		t.whenListened(ch, one)
	}
	one(nil)
}

// resumeAt (a successor) says how a subscription handed over at pos on ch continues: fn
// gets the kept notifications it has not had (it writes them, then is live) and exact. At
// once when it can — pos is within what is kept, or the channel or the record is not
// counted (exact false: as good as it gets) — or, when the subscription is ahead of this
// session (the predecessor's session read further, or the mark has not arrived here yet),
// once the notification at pos arrives (before it is delivered).
func (t *channelTable) resumeAt(ch *channel, pos int64, fn func(notes []heldNote, exact bool)) {
	switch {
	case pos < 0 || !ch.armed || t.ho.marked && ch.pos < 0:
		fn(nil, false)
	case !t.ho.marked || pos > ch.pos:
		ch.parked = append(ch.parked, parkedResume{pos: pos, fn: fn})
	case pos < ch.base:
		fn(nil, false) // what it needs was not kept
	default:
		t.fan.flushChannels(ch) // those queued this pass are in notes (resumeParked)
		fn(ch.notes[pos-ch.base:], true)
	}
}

// resumeParked starts the parked subscriptions whose position the channel has reached.
func (t *channelTable) resumeParked(ch *channel) {
	if len(ch.parked) == 0 || !t.ho.marked {
		return
	}
	keep := ch.parked[:0]
	var due []parkedResume
	for _, p := range ch.parked {
		if ch.pos >= 0 && p.pos <= ch.pos {
			due = append(due, p)
		} else if ch.pos < 0 {
			due = append(due, parkedResume{pos: -1, fn: p.fn})
		} else {
			keep = append(keep, p)
		}
	}
	clear(ch.parked[len(keep):])
	ch.parked = keep
	if len(due) > 0 {
		// The notifications this loop pass queued for the live subscriptions
		// (fanout.pendingNotes) are before pos: written at the pass's end, they would reach
		// a subscription that starts now too — one more time, for those it gets from notes,
		// or before its position. So they go to the others first.
		t.fan.flushChannels(ch)
	}
	for _, p := range due {
		if p.pos < 0 || p.pos < ch.base {
			p.fn(nil, false)
		} else {
			p.fn(ch.notes[p.pos-ch.base:], true)
		}
	}
}

// unpark starts every parked subscription of ch as not exact.
func (t *channelTable) unpark(ch *channel) {
	p := ch.parked
	ch.parked = nil
	for _, r := range p {
		r.fn(nil, false)
	}
}

// releaseHeld (a successor) lets go of the predecessor's holds — the adopted subscriptions
// hold their channels themselves — and of the kept notes; parked subscriptions wait
// handoffParkAfterMS more at most.
func (t *channelTable) releaseHeld() {
	held := t.ho.held
	t.ho.held, t.ho.keep = nil, false
	t.fan.endKeep()
	for _, ch := range t.byName {
		clear(ch.notes)
		ch.notes = nil
		ch.base = ch.pos
	}
	t.ho.bytes = 0
	for _, ch := range held {
		if ch == t.ho.mark && !t.ho.marked {
			t.ho.markHeld = true // released once the mark has arrived (marked)
			continue
		}
		t.release(ch)
	}
	t.ho.endMS = t.nowMS + handoffParkAfterMS
}

// releaseMark lets go of a mark's hold that releaseHeld kept.
func (t *channelTable) releaseMark() {
	if t.ho.markHeld {
		t.ho.markHeld = false
		t.release(t.ho.mark)
	}
}

// handoffTick ends what a successor kept for a handoff that did not finish in time.
func (t *channelTable) handoffTick() {
	if !t.ho.successor || t.ho.endMS == 0 || t.nowMS < t.ho.endMS {
		return
	}
	if t.ho.held != nil || t.ho.keep {
		t.releaseHeld()
		return
	}
	t.endSuccession()
}

// endSuccession ends a successor's handoff state: parked subscriptions start (not exact),
// positions count no more.
func (t *channelTable) endSuccession() {
	t.fan.endKeep()
	if !t.ho.successor {
		return
	}
	if t.ho.held != nil || t.ho.keep {
		t.releaseHeld()
	}
	t.releaseMark()
	for _, ch := range t.byName {
		t.unpark(ch)
		ch.pos, ch.armed = -1, false
	}
	t.ho = handoffChans{}
}
