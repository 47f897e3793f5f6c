package engine

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/framing"
	"github.com/pgsse/pgsse/sse"
	"github.com/pgsse/pgsse/store"
)

// Presence (docs/http.md, Presence; docs/architecture.md, Presence): who is on a presence stream
// (--presence-streams) across every process and host. This part keeps, on the loop:
//
//   - each presence stream's local counts per subject (sub claim; "" = anonymous) as
//     connections open (admission) and close (connTable.remove) — one map update, no I/O;
//   - what changed since the writer last took it (dirty), handed to the writer
//     (presencewriter.go) at most once per --presence-interval: the writer, on a goroutine with
//     a PostgreSQL connection of its own, writes it in one statement (store.Presence.Flush) and
//     renews the process's lease;
//   - for streams with presence=1 subscribers (watchers), a store.PresenceView fed by the P
//     notifications on channel pgsse — this process's own writes too, so there is one source of
//     truth — and read again (store.ReadPresence, on the writer's connection) when it cannot
//     follow, on its first watcher and after a lost LISTEN session;
//   - the events: a watcher's first one is a full "present" event (counting itself: the local
//     subjects not written yet are added), then one join/leave event per stream at most once
//     per interval, made once and shared by every watcher of the stream (encode once, write
//     many); after a lost LISTEN session the next one is full again.
//
// What the watchers have been told (announced) is one set per stream, not per connection: a
// watcher that arrived since the last event got a full event of its own moment, so the next
// change event may name a subject it already had (a join of one present, a leave of one
// absent); applying the event as set operations, as clients do, ends in the same state.

// presenceTable is the loop's part for presence.
type presenceTable struct {
	*loopEnv
	conns *connTable
	tr    transport
	ans   *httpAnswers
	w     *presenceWriter // from Run; nil before (and when no presence is kept)

	streams  map[string]*presenceStream
	members  map[*sseConn]*presenceMember
	subjects int // (stream, sub) pairs counted here with sub != "" (pgsse_presence_subjects)

	listenUp bool
	counts   []store.PresenceCount // scratch for a hand-off

	// adopting: this process is a successor taking connections over (Config.Inherited) and
	// has not let its writer register yet (takenOver).
	adopting bool
}

// presenceMember is what a connection on presence streams counts for.
type presenceMember struct {
	sub     string
	streams []*presenceStream
	watch   bool // presence=1: it gets presence events of its streams
}

// presenceStream is one presence stream with local connections or watchers.
type presenceStream struct {
	name   string
	counts map[string]int32    // local connections per sub ("" = anonymous)
	dirty  map[string]struct{} // subs whose count changed since the writer last took them

	// Watchers and what they were told.
	view          *store.PresenceView // nil without watchers
	reading       bool                // a snapshot read for view is in flight
	watchers      map[*sseConn]struct{}
	fresh         map[*sseConn]struct{} // watchers owed their first (full) event
	announced     map[string]struct{}
	announcedAnon int64
	full          bool  // the next event to every watcher is a full one (after a LISTEN loss)
	lastEventMS   int64 // when the last change event went out
	version       uint64
	sentVersion   uint64

	// The local anonymous count as PostgreSQL has it: written (committed) at change pendSeq,
	// and before that prevWritten. The view includes pendWritten once it has applied pendSeq.
	prevWritten, pendWritten int32
	pendSeq                  int64
	handedAnon               int32 // the local anonymous count last handed to the writer
	inflight                 bool  // a write with the anonymous count has no outcome yet
}

// presenceFreshPerRound bounds the full events encoded for newcomers outside the tick per
// stream and round: a storm of watchers joining one stream costs one encoding per tick, not
// one per watcher (each would list every subject).
const presenceFreshPerRound = 8

func newPresenceTable(env *loopEnv, conns *connTable, tr transport, ans *httpAnswers) presenceTable {
	return presenceTable{loopEnv: env, conns: conns, tr: tr, ans: ans,
		streams: make(map[string]*presenceStream), members: make(map[*sseConn]*presenceMember),
		adopting: env.cfg.Inherited != nil}
}

// enabled reports whether presence is kept for any stream.
func (p *presenceTable) enabled() bool { return len(p.cfg.PresenceStreams) > 0 }

// isPresenceStream reports whether presence is kept for name (--presence-streams).
func (p *presenceTable) isPresenceStream(name []byte) bool {
	return len(p.cfg.PresenceStreams) > 0 && auth.MatchAny(p.cfg.PresenceStreams, name)
}

// --- counting ---------------------------------------------------------------------------

// opened counts an admitted subscriber on each presence stream it follows (req: what it asked;
// req.presenceSub its subject, "" = anonymous) and makes it a watcher when it asked for
// presence=1.
func (p *presenceTable) opened(sc *sseConn, req *subRequest) {
	if !p.enabled() || req == nil || req.isChan {
		return
	}
	var m *presenceMember
	add := func(name string) {
		if !p.isPresenceStream([]byte(name)) {
			return
		}
		if m == nil {
			m = &presenceMember{sub: req.presenceSub, watch: req.presence}
		}
		st := p.stream(name)
		m.streams = append(m.streams, st)
		p.count(st, m.sub, +1)
		if m.watch {
			p.watch(st, sc)
		}
	}
	if req.streams != nil {
		for i := range req.streams {
			add(req.streams[i].name)
		}
	} else {
		add(req.name)
	}
	if m != nil {
		p.members[sc] = m
	}
}

// adopted counts a connection a predecessor handed over (adoptConn; h its record) as opened
// counts an admitted one: on each presence stream it follows, under the subject it counted
// under there, a watcher again if it was one (its next event is a full one: what it was told
// there is not known here). While this process takes over (adopting: it has not registered
// its presence yet, presencewriter.go), the predecessor's entries still count the connection,
// and with them the views: its anonymous count is one the views include already.
func (p *presenceTable) adopted(sc *sseConn, h *framing.HandoffConn) {
	if !p.enabled() {
		return
	}
	var m *presenceMember
	for i := range h.Subs {
		sub := &h.Subs[i]
		if sub.Kind != framing.HandoffStream || !p.isPresenceStream([]byte(sub.Name)) {
			continue
		}
		if m == nil {
			m = &presenceMember{sub: h.PresenceSub, watch: h.PresenceWatch}
		}
		st := p.stream(sub.Name)
		m.streams = append(m.streams, st)
		p.count(st, m.sub, +1)
		if m.sub == "" && p.adopting {
			st.prevWritten++
			st.pendWritten++
		}
		if m.watch {
			p.watch(st, sc)
		}
	}
	if m != nil {
		p.members[sc] = m
	}
}

// member is what sc counts for in presence, for its handoff record: its subject ("" =
// anonymous, or not counted) and whether it watches.
func (p *presenceTable) member(sc *sseConn) (sub string, watch bool) {
	if m := p.members[sc]; m != nil {
		return m.sub, m.watch
	}
	return "", false
}

// closed gives back what a closing connection counted (connTable.remove). A connection
// handed to a successor keeps its count here: this process's entries go on counting it until
// the successor registers with the same process key, which replaces them — with the moved
// connections' counts, in one statement (no moment absent, no double count) — or, if the
// successor dies before, until they lapse (presencewriter.go: the writer does not retire
// them).
func (p *presenceTable) closed(sc *sseConn) {
	m := p.members[sc]
	if m == nil {
		return
	}
	delete(p.members, sc)
	handed := sc.state == stateHandedOver
	if handed && p.w != nil {
		p.w.handedOver.Store(true)
	}
	for _, st := range m.streams {
		if !handed {
			p.count(st, m.sub, -1)
		}
		if m.watch {
			delete(st.watchers, sc)
			delete(st.fresh, sc)
			if len(st.watchers) == 0 { // nobody to tell: no view to keep (a watcher's arrival reads it again)
				st.view, st.announced, st.full = nil, nil, false
			}
		}
		p.maybeDrop(st)
	}
}

func (p *presenceTable) stream(name string) *presenceStream {
	st := p.streams[name]
	if st == nil {
		st = &presenceStream{name: name, counts: make(map[string]int32), dirty: make(map[string]struct{})}
		p.streams[name] = st
	}
	return st
}

// count moves sub's local count on st by d.
func (p *presenceTable) count(st *presenceStream, sub string, d int32) {
	n := st.counts[sub] + d
	switch {
	case n > 0:
		st.counts[sub] = n
	default:
		delete(st.counts, sub)
	}
	st.dirty[sub] = struct{}{}
	if sub != "" && (n == 0 || n == d) { // a subject came or went here
		if n == 0 {
			p.subjects--
		} else {
			p.subjects++
		}
		p.metrics.presenceSubjects.Set(float64(p.subjects))
		st.version++
	}
	if sub == "" {
		st.version++
	}
}

// maybeDrop forgets a stream that has nothing left to count, write or tell.
func (p *presenceTable) maybeDrop(st *presenceStream) {
	if len(st.counts) == 0 && len(st.dirty) == 0 && len(st.watchers) == 0 && !st.reading && st.pendWritten == 0 && !st.inflight &&
		p.streams[st.name] == st {
		delete(p.streams, st.name)
	}
}

// takeChanges hands the writer every count that changed since it last took them (absolute
// counts: a retried write changes nothing twice). A stream whose anonymous count goes with
// this write is in flight until the write's outcome (flushed): until then nobody knows whether
// the view's anonymous count includes it, so no event of it goes out.
func (p *presenceTable) takeChanges() []store.PresenceCount {
	out := p.counts[:0]
	for _, st := range p.streams {
		for sub := range st.dirty {
			n := st.counts[sub]
			out = append(out, store.PresenceCount{Stream: st.name, Sub: sub, Connections: int(n)})
			if sub == "" {
				st.handedAnon, st.inflight = n, true
			}
		}
		clear(st.dirty)
	}
	p.counts = out
	res := slices.Clone(out)
	for _, st := range p.streams {
		p.maybeDrop(st)
	}
	return res
}

// flushed takes a write's outcome (on the loop; ok: it committed): the metrics, and for the
// streams whose anonymous count it wrote, which change carries it — then their events, which
// waited for it.
func (p *presenceTable) flushed(res store.PresenceFlush, ok bool) {
	p.metrics.presenceWrites.Add(float64(res.Statements))
	p.metrics.presenceLeaseExpired.Add(float64(len(res.Reaped)))
	for _, r := range res.Reaped {
		p.log.Warn("presence: removed a pgsse process whose lease lapsed (it died without cleaning up); its subjects left",
			"process", r.Key, "entries", r.Entries)
	}
	seqs := make(map[string]int64, len(res.Changes))
	for _, c := range res.Changes {
		seqs[c.Stream] = c.Seq
	}
	for _, st := range p.streams {
		if !st.inflight && (!ok || st.handedAnon == st.pendWritten) {
			continue
		}
		st.inflight = false
		if ok && st.handedAnon != st.pendWritten {
			st.prevWritten = p.writtenAnon(st)
			st.pendWritten = st.handedAnon
			st.pendSeq = seqs[st.name] // 0 when no change was announced: nobody's anonymous count moved
			st.version++
		}
		if st.view != nil && p.nowMS-st.lastEventMS >= p.cfg.PresenceInterval.Milliseconds() {
			p.announce(st, false)
		}
		p.welcome(st, presenceFreshPerRound)
		p.maybeDrop(st)
	}
}

// writtenAnon is the local anonymous count st's view includes.
func (p *presenceTable) writtenAnon(st *presenceStream) int32 {
	if st.view == nil || st.view.Seq() >= st.pendSeq {
		return st.pendWritten
	}
	return st.prevWritten
}

// --- watching ---------------------------------------------------------------------------

// watch makes sc a watcher of st: its first event is full, once the view is current and the
// connection's response head is out.
func (p *presenceTable) watch(st *presenceStream, sc *sseConn) {
	if st.watchers == nil {
		st.watchers, st.fresh = make(map[*sseConn]struct{}), make(map[*sseConn]struct{})
	}
	st.watchers[sc] = struct{}{}
	st.fresh[sc] = struct{}{}
	if st.view == nil {
		st.view = store.NewPresenceView(st.name)
		st.announced = nil
		p.read(st)
	}
}

// read asks the writer for a snapshot of st (its view cannot follow without one).
func (p *presenceTable) read(st *presenceStream) {
	if st.reading || p.w == nil || !p.listenUp {
		return // the LISTEN session's return reads every view again
	}
	st.reading = true
	name := st.name
	if !p.w.read(name, store.NoLimit, func(snap store.PresenceSnapshot, err error) { p.snapshot(name, snap, err) }) {
		st.reading = false // the writer's queue is full: the sweep asks again
	}
}

// snapshot takes a read's answer on the loop.
func (p *presenceTable) snapshot(name string, snap store.PresenceSnapshot, err error) {
	st := p.streams[name]
	if st == nil {
		return
	}
	st.reading = false
	if st.view == nil {
		p.maybeDrop(st)
		return
	}
	if err != nil {
		p.log.Warn("presence: reading a stream failed; trying again", "stream", name, "err", err)
		return // the sweep reads again
	}
	if !st.view.Reset(snap) {
		p.read(st)
		return
	}
	st.version++
	p.announce(st, true)
}

// responded: sc's response head is out (connTable.respond); a watcher gets its first event
// now if its streams' views are current.
func (p *presenceTable) responded(sc *sseConn) {
	m := p.members[sc]
	if m == nil || !m.watch {
		return
	}
	for _, st := range m.streams {
		p.welcome(st, presenceFreshPerRound)
	}
}

// onPayload takes one P notification (listenState routes the pgsse channel's P payloads here).
func (p *presenceTable) onPayload(pl *store.Payload) {
	st := p.streams[string(pl.Stream)]
	if st == nil || st.view == nil {
		return
	}
	switch st.view.Apply(pl) {
	case store.PresenceApplied:
		st.version++
		if p.nowMS-st.lastEventMS >= p.cfg.PresenceInterval.Milliseconds() {
			p.announce(st, false)
		}
	case store.PresenceNeedRead:
		p.read(st)
	}
}

// listenDown: the LISTEN session was lost; every view may have missed changes.
func (p *presenceTable) listenDown() {
	p.listenUp = false
	for _, st := range p.streams {
		if st.view != nil {
			st.view.Desync()
			st.full = true
		}
	}
}

// listenResynced: the session is up (again) with every channel LISTENed: every view is read
// again, and its next event is full.
func (p *presenceTable) listenResynced() {
	p.listenUp = true
	for _, st := range p.streams {
		if st.view != nil {
			p.read(st)
		}
	}
}

// tick (from the loop's tick): the change events due, the newcomers' first events, the reads
// to retry.
func (p *presenceTable) tick() {
	for _, st := range p.streams {
		if st.view == nil {
			continue
		}
		if !st.view.Synced() {
			p.read(st)
			continue
		}
		if p.nowMS-st.lastEventMS >= p.cfg.PresenceInterval.Milliseconds() {
			p.announce(st, false)
		}
		p.welcome(st, len(st.fresh))
	}
}

// current is who is on st as this process sees it: the view, plus the local subjects not
// written yet; anonymous likewise.
func (p *presenceTable) current(st *presenceStream) (map[string]struct{}, int64) {
	present := make(map[string]struct{}, len(st.counts))
	for _, s := range st.view.Present() {
		present[s] = struct{}{}
	}
	for sub := range st.counts {
		if sub != "" {
			present[sub] = struct{}{}
		}
	}
	anon := st.view.Anonymous() + int64(st.counts[""]) - int64(p.writtenAnon(st))
	return present, max(anon, 0)
}

// announce sends st's watchers (those told before) what changed since their last event — a
// full event when full is set (after a read that followed a LISTEN loss) — and makes that
// what they were told. Newcomers get theirs in welcome.
func (p *presenceTable) announce(st *presenceStream, afterRead bool) {
	if st.view == nil || !st.view.Synced() || st.inflight {
		return
	}
	st.view.TakeChanges() // the view's own bookkeeping is not used: drop it
	if st.version == st.sentVersion && !(afterRead && st.full) {
		return
	}
	present, anon := p.current(st)
	var enc []byte
	switch {
	case st.announced == nil:
		// Nobody was told anything yet: the watchers are all fresh.
	case st.full:
		enc = p.tr.presenceFull(st.name, sortedKeys(present), anon)
	default:
		var joins, leaves []string
		for s := range present {
			if _, ok := st.announced[s]; !ok {
				joins = append(joins, s)
			}
		}
		for s := range st.announced {
			if _, ok := present[s]; !ok {
				leaves = append(leaves, s)
			}
		}
		if len(joins) > 0 || len(leaves) > 0 || anon != st.announcedAnon {
			slices.Sort(joins)
			slices.Sort(leaves)
			enc = p.tr.presenceChange(st.name, joins, leaves, anon)
		}
	}
	st.full = false
	st.announced, st.announcedAnon, st.sentVersion = present, anon, st.version
	if enc == nil {
		return
	}
	st.lastEventMS = p.nowMS
	p.send(st, enc)
}

// welcome sends at most n fresh watchers of st whose response head is out their first, full,
// event (one encoding for all of them).
func (p *presenceTable) welcome(st *presenceStream, n int) {
	if len(st.fresh) == 0 || n <= 0 || st.view == nil || !st.view.Synced() || st.inflight {
		return
	}
	if st.announced == nil {
		p.announce(st, false) // sets what the watchers are told from here on
	}
	var enc []byte
	for sc := range st.fresh {
		if !sc.streaming() {
			continue
		}
		if enc == nil {
			present, anon := p.current(st)
			enc = p.tr.presenceFull(st.name, sortedKeys(present), anon)
		}
		delete(st.fresh, sc)
		p.conns.writeEvents(sc, []*event{{enc: enc}})
		if n--; n == 0 {
			return
		}
	}
}

// send writes enc to every watcher of st that has had its first event.
func (p *presenceTable) send(st *presenceStream, enc []byte) {
	ev := &event{enc: enc}
	evs := []*event{ev}
	for sc := range st.watchers {
		if _, fresh := st.fresh[sc]; fresh || !sc.streaming() {
			continue
		}
		p.conns.writeEvents(sc, evs)
	}
}

func sortedKeys(m map[string]struct{}) []string {
	return slices.Sorted(maps.Keys(m))
}

// --- GET /presence/{stream} ---------------------------------------------------------------

// list reads stream's presence for GET /presence (on the writer's connection, off the loop)
// and calls done on the loop with the whole answer (200 and its JSON), or nil when it could
// not be read. It reports false when the read was not queued (the writer is busy or absent).
func (p *presenceTable) list(stream string, cors sse.CORS, done func(answer []byte)) bool {
	if p.w == nil {
		return false
	}
	return p.w.read(stream, p.cfg.PresenceMaxList, func(snap store.PresenceSnapshot, err error) {
		if err != nil {
			p.log.Warn("presence: GET /presence read failed", "stream", stream, "err", err)
			done(nil)
			return
		}
		done(p.ans.presence(&snap, cors))
	})
}

// writing reports whether presence has a writer (Run made one).
func (p *presenceTable) writing() bool { return p.w != nil }

// takenOver (on the loop): a successor has adopted what its predecessor handed over (or
// stopped waiting for it); its writer may register now, replacing the predecessor's entries
// with this process's counts. It reports the writer's first-write signal (closed once that
// write has an outcome), nil without a writer.
func (p *presenceTable) takenOver() <-chan struct{} {
	p.adopting = false
	if p.w == nil {
		return nil
	}
	p.w.release()
	return p.w.registered
}

// runWriter runs the writer on the calling goroutine until ctx ends; on the way out it
// removes this process's entries (its subjects leave at once) — unless it handed connections
// to a successor, whose registration replaces them.
func (p *presenceTable) runWriter(ctx context.Context) { p.w.run(ctx, true) }

// newWriter makes the writer (Run, before the loop starts) under this process's key: the
// host, the bound --listen address and its index among --procs processes.
func (p *presenceTable) newWriter(bound net.Addr) error {
	host := p.cfg.PresenceHost
	if host == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("presence needs the host name for this process's key: %w", err)
		}
		host = h
	}
	key := store.PresenceKey(host, bound.String(), p.cfg.PresenceIndex)
	w, err := newPresenceWriter(p.cfg.DatabaseURL, key, p.cfg.PresenceInterval, p.log, p.tasks, p.takeChanges, p.flushed)
	if err != nil {
		return err
	}
	if p.adopting {
		w.holdUntilTakenOver(p.tasks, func() { p.takenOver() })
	}
	p.w = w
	return nil
}
