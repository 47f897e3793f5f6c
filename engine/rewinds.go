package engine

import (
	"bytes"
	"slices"
	"strconv"

	"github.com/pgsse/pgsse/names"
)

// Rewinds known to the host (docs/http.md, When the stream went back). A stream's history went
// back when a crash lost acknowledged events and gave their ids to new ones; the process that
// delivered the lost events finds it (fanout.rewind, readBack) and sends its own subscribers a
// pgsse:gap back. A client that then reconnects with a Last-Event-ID from the lost events —
// EventSource keeps the last id, and a gap has none — may reach another process of the host
// (--procs: the kernel spreads the port's connections), which never delivered them: it must
// treat that cursor as the detecting process does (subscriptions.onReplay, lostCursor), or the
// client silently skips the new events under the reused ids.
//
// So every rewind a process finds is told to the host's other processes: by a sibling to the
// first process, by the first process to every sibling, over the hub socket pair each sibling
// was started with, as a NOTIFY frame on the stream channel with PID 0 and a payload that is a
// rewind notice (below) — never a PostgreSQL notification: PostgreSQL backends have PIDs > 0,
// and the notice does not parse as a pgsse payload. Outside hub workers never see one (they
// may not subscribe to the stream channel) and may not send one (a NOTIFY from a worker that
// is not a sibling is a protocol error, as before). Each process keeps what it found and was
// told, per stream, for rewindKeepMS and at most rewindsMax streams: a stream it follows
// takes the range over (stream.backFrom, backTo) and keeps it while the stream has
// subscribers here, like the process that found it; one it starts following within
// rewindKeepMS starts with it.
const (
	// rewindKeepMS: how long a process remembers a rewind of a stream it does not follow.
	// A client whose connection ended with a lost id reconnects after --retry (2 s) and its
	// own backoff — seconds, a minute for a client library backing off — so ten minutes
	// cover the reconnections of clients that were connected when it happened.
	rewindKeepMS = 10 * 60 * 1000
	// rewindsMax bounds the streams remembered (≈ 100 bytes each): a crash rewinds the
	// streams with events in the last moments before it, a few per publisher.
	rewindsMax = 8192
)

// rewindMark is a known rewind of one stream: a cursor in (to, from] is from history the
// stream lost; delivery resumes after to. atMS is when it was found or told (loop clock).
type rewindMark struct {
	to, from int64
	atMS     int64
}

// merged is m with another rewind (to, from) of the same stream added: one range when they
// overlap (two processes' views of one crash: a gap back further than needed only repeats
// events, which the gap announces; one not far enough would skip some), else the newer.
func (m rewindMark) merged(to, from int64) rewindMark {
	if m.from > 0 && to <= m.from && m.to <= from {
		return rewindMark{to: min(m.to, to), from: max(m.from, from)}
	}
	return rewindMark{to: to, from: from}
}

// rewindNoticePrefix starts a rewind notice: "R1 <to> <from> <stream>". 'R' is no kind of
// store.Payload, so a notice never passes for a pgsse payload.
const rewindNoticePrefix = "R1 "

// appendRewindNotice appends the notice that stream went back: cursors in (to, from] are lost.
func appendRewindNotice(dst []byte, stream string, to, from int64) []byte {
	dst = append(dst, rewindNoticePrefix...)
	dst = strconv.AppendInt(dst, to, 10)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, from, 10)
	dst = append(dst, ' ')
	return append(dst, stream...)
}

// parseRewindNotice parses a rewind notice strictly; ok is false for anything else.
func parseRewindNotice(b []byte) (stream []byte, to, from int64, ok bool) {
	rest, found := bytes.CutPrefix(b, []byte(rewindNoticePrefix))
	if !found {
		return nil, 0, 0, false
	}
	num := func() (int64, bool) {
		i := bytes.IndexByte(rest, ' ')
		if i <= 0 {
			return 0, false
		}
		v, err := names.ParseCursor(rest[:i])
		rest = rest[i+1:]
		return v, err == nil
	}
	var ok1, ok2 bool
	to, ok1 = num()
	from, ok2 = num()
	if !ok1 || !ok2 || to >= from || names.CheckStream(rest) != nil {
		return nil, 0, 0, false
	}
	return rest, to, from, true
}

// rewindBook is what a process knows of rewinds, per stream: found here or told.
type rewindBook struct {
	marks map[string]rewindMark
}

// knowRewind records that stream name went back from from to to — found here (tellBack) or
// told by another process of the host (listenState.onNotification) — for a stream followed
// here, as the detecting process keeps it (lostCursor).
func (f *fanout) knowRewind(name string, to, from int64) {
	m := f.rewinds.know(name, to, from, f.nowMS)
	if st := f.streams[name]; st != nil {
		st.knowBack(m)
	}
}

// know adds a rewind of stream name at nowMS (knowRewind) and returns what is known of it now.
func (b *rewindBook) know(name string, to, from, nowMS int64) rewindMark {
	m := b.marks[name]
	if m.atMS != 0 && nowMS-m.atMS > rewindKeepMS {
		m = rewindMark{}
	}
	m = m.merged(to, from)
	m.atMS = nowMS
	if _, ok := b.marks[name]; !ok && len(b.marks) >= rewindsMax {
		b.forget(nowMS)
	}
	if b.marks == nil {
		b.marks = make(map[string]rewindMark)
	}
	b.marks[name] = m
	return m
}

// forget makes room in the book: the expired marks, and if that is not enough the oldest
// quarter.
func (b *rewindBook) forget(nowMS int64) {
	ats := make([]int64, 0, len(b.marks))
	for name, m := range b.marks {
		if nowMS-m.atMS > rewindKeepMS {
			delete(b.marks, name)
			continue
		}
		ats = append(ats, m.atMS)
	}
	if len(b.marks) < rewindsMax {
		return
	}
	slices.Sort(ats)
	cut := ats[len(ats)/4]
	for name, m := range b.marks {
		if m.atMS <= cut {
			delete(b.marks, name)
		}
	}
}

// known is what a stream starting here (join) knows of its last rewind at nowMS.
func (b *rewindBook) known(name string, nowMS int64) (rewindMark, bool) {
	m, ok := b.marks[name]
	if !ok || nowMS-m.atMS > rewindKeepMS {
		return rewindMark{}, false
	}
	return m, true
}

// knowBack takes a rewind the host knows of over into the stream's last rewind (lostCursor).
func (st *stream) knowBack(m rewindMark) {
	st.backTo, st.backFrom = m.to, m.from
}

// Ghosts. A process finds a rewind by comparing what a stream delivered with the table once
// its LISTEN session is back (fanout.resync) — for the streams it follows then. A client whose
// connection ends in the crash (or just before it) takes the stream's last subscriber here
// with it: the stream is dropped, what it delivered forgotten, and no process finds that its
// events were lost; the client reconnects with a lost id, anywhere, and is served silently
// from it. So a stream dropped here leaves a ghost — the last id it delivered, that event's
// publish time and the latest it accounted for — for ghostKeepMS; a LISTEN loss meanwhile
// makes it suspect, and a suspect ghost is checked when the session is back as the stream
// would have been (a stream without subscribers, fanout.raiseGhosts: one check read, the
// rewind search if it went back, which tells the host), or taken over by the stream if a
// subscriber here follows it again first (haunt).
const (
	// ghostKeepMS: how long after its last subscriber left a stream's deliveries may still be
	// lost — a commit without synchronous_commit is on disk within 3 × wal_writer_delay
	// (600 ms by default, 30 s at its largest), unless the WAL writer falls behind.
	ghostKeepMS = 30_000
)

// ghostMark is what a dropped stream delivered (fanout.keepGhost).
type ghostMark struct {
	last, lastTimeUS, maxTimeUS int64
	atMS                        int64
	suspect                     bool // a LISTEN loss since it was delivered: check it
}

// keepGhost remembers what a stream that nobody here follows any more delivered.
func (f *fanout) keepGhost(st *stream) {
	last, t := st.last, st.lastTimeUS
	if st.readID > last && st.readTimeUS > 0 {
		last, t = st.readID, st.readTimeUS // its newest event came from a catch-up read
	}
	if last <= 0 || st.maxTimeUS == 0 {
		return
	}
	g := ghostMark{last: last, lastTimeUS: t, maxTimeUS: st.maxTimeUS, atMS: f.nowMS, suspect: st.unchecked() || !f.lsn.isUp()}
	if g.suspect && f.lsn.isUp() {
		f.raiseGhost(st.name, g) // dropped before its check read after the loss answered
		return
	}
	f.ghosts.put(st.name, g, f.nowMS)
}

// ghostBook is what the streams nobody here follows any more delivered (keepGhost), per stream.
type ghostBook struct {
	marks    map[string]ghostMark
	prunedMS int64 // when a full book was last looked through
}

// put keeps g for stream name, unless the book is full of ghosts not yet expired.
func (b *ghostBook) put(name string, g ghostMark, nowMS int64) {
	if len(b.marks) >= rewindsMax && nowMS-b.prunedMS >= 1000 {
		b.prunedMS = nowMS // a full book is looked through at most once a second
		for n, o := range b.marks {
			if !o.suspect && nowMS-o.atMS > ghostKeepMS {
				delete(b.marks, n)
			}
		}
	}
	if len(b.marks) >= rewindsMax {
		return
	}
	if b.marks == nil {
		b.marks = make(map[string]ghostMark)
	}
	b.marks[name] = g
}

// take hands over and forgets the ghost of stream name.
func (b *ghostBook) take(name string) (ghostMark, bool) {
	g, ok := b.marks[name]
	if ok {
		delete(b.marks, name)
	}
	return g, ok
}

// suspect: the LISTEN session was lost at nowMS (fanout.down) — perhaps in a crash that took
// what the recent ghosts' streams delivered; the older ones are forgotten.
func (b *ghostBook) suspect(nowMS int64) {
	for name, g := range b.marks {
		switch {
		case g.suspect:
		case nowMS-g.atMS > ghostKeepMS:
			delete(b.marks, name)
		default:
			g.suspect = true
			b.marks[name] = g
		}
	}
}

// raiseGhosts checks the suspect ghosts once the LISTEN session is back (fanout.resync): each
// is a stream here again, without subscribers, whose check read compares what it delivered
// with the table (onFetch; a rewind found is told as any: tellBack) and which is dropped once
// checked (laid).
func (f *fanout) raiseGhosts() {
	if f.replayer == nil {
		return
	}
	for name, g := range f.ghosts.marks {
		if g.suspect {
			delete(f.ghosts.marks, name)
			f.raiseGhost(name, g)
		}
	}
}

// raiseGhost starts the check of one ghost (raiseGhosts).
func (f *fanout) raiseGhost(name string, g ghostMark) {
	if f.replayer == nil || f.streams[name] != nil {
		return
	}
	st := &stream{name: name, ghost: true, check: true}
	st.adopt(g)
	f.streams[name] = st
	f.startFetch(st)
	if !st.fetching {
		f.laid(st) // the replay queue is full (said in the log)
	}
}

// haunt gives a stream a subscriber here follows again (join) what its ghost delivered, when
// the LISTEN session was lost since: its check read (now, or after the session is back:
// resync) compares it with the table, and the subscription's catch-up waits for it (holdRead).
func (f *fanout) haunt(st *stream) {
	g, ok := f.ghosts.take(st.name)
	if !ok {
		return
	}
	up := f.lsn.isUp()
	if !g.suspect && up {
		return
	}
	st.adopt(g)
	st.check = true
	if up {
		f.startFetch(st)
	}
}

// laid drops a ghost's stream once it is checked, unless a subscriber follows it by now.
func (f *fanout) laid(st *stream) {
	st.ghost = false
	if len(st.subs) > 0 || f.streams[st.name] != st {
		return
	}
	delete(f.streams, st.name)
	clear(st.pending)
	st.pending, st.rewindHi = nil, 0
}

// adopt takes over what a ghost delivered.
func (st *stream) adopt(g ghostMark) {
	st.last, st.lastTimeUS, st.maxTimeUS = g.last, g.lastTimeUS, g.maxTimeUS
	st.notified = max(st.notified, g.last)
}
