package store

import "slices"

// PresenceApply says what PresenceView.Apply did with a notification.
type PresenceApply int

const (
	// PresenceApplied: the notification (or the part of one) was taken in.
	PresenceApplied PresenceApply = iota
	// PresenceIgnored: it was about another stream, or a change the view already has.
	PresenceIgnored
	// PresenceNeedRead: the view cannot follow from here (a change was missed, or it came
	// as part 0 of 0): read the stream (ReadPresence with NoLimit) and call Reset. The
	// view keeps this notification and those that arrive until then, to apply after the
	// snapshot.
	PresenceNeedRead
	// PresenceBuffered: the view waits for a snapshot (before the first Reset, or after
	// PresenceNeedRead or Desync) and kept the notification for after it.
	PresenceBuffered
)

// maxPresenceBuffered is how many notifications a view keeps while it waits for a
// snapshot; past it, the snapshot is followed by another read.
const maxPresenceBuffered = 256

// PresenceView is one stream's presence as a consumer of the P notifications on channel
// "pgsse" sees it: who is present, the anonymous count and the number of the last change,
// plus the joins and leaves since the caller last took them (for the next pgsse:presence
// event, at most one per interval). It follows the rules of the format: a change applies
// on top of the one numbered Prev (0: after one that left the stream empty), parts arrive
// in order, and anything else means a read. Not safe for concurrent use; it is meant to
// live on the engine's loop, one per stream with presence subscribers.
type PresenceView struct {
	stream    string
	synced    bool // Reset has given it a snapshot and it has missed nothing since
	seq       int64
	anonymous int64
	present   map[string]struct{}

	// A change whose parts are arriving.
	partSeq, partPrev int64
	partNext          int // the part expected next; 0: none in progress
	partJoins         []string
	partLeaves        []string

	// While waiting for a snapshot: the notifications since, copied.
	buffered []bufferedPresence
	overflow bool

	// Since the last TakeChanges.
	joined, left map[string]struct{}
	anonTaken    int64
}

type bufferedPresence struct {
	seq, prev, anonymous int64
	part, parts          int
	joins, leaves        []string
}

// NewPresenceView returns a view of stream that waits for its first snapshot: Apply
// keeps the notifications it gets until Reset.
func NewPresenceView(stream string) *PresenceView {
	return &PresenceView{
		stream:  stream,
		present: make(map[string]struct{}),
		joined:  make(map[string]struct{}),
		left:    make(map[string]struct{}),
	}
}

// Synced reports whether the view is current (false until Reset, and after
// PresenceNeedRead until the next Reset).
func (v *PresenceView) Synced() bool { return v.synced }

// Seq returns the number of the last change the view has.
func (v *PresenceView) Seq() int64 { return v.seq }

// Anonymous returns the anonymous connections as of the last change.
func (v *PresenceView) Anonymous() int64 { return v.anonymous }

// Present returns who is present, sorted bytewise (for a full "present" event).
func (v *PresenceView) Present() []string {
	out := make([]string, 0, len(v.present))
	for s := range v.present {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// Desync marks the view as not current, e.g. after the LISTEN session was lost: the next
// Apply answers PresenceNeedRead (ReadPresenceSeqs tells whether anything changed at all).
func (v *PresenceView) Desync() { v.synced, v.partNext = false, 0 }

// Reset takes a snapshot (ReadPresence with NoLimit, so not Truncated), then the
// notifications kept since that are newer than it. The subjects that differ from what the
// view had count as joins and leaves for TakeChanges (after a full "present" event, take
// and drop them). It reports false when the kept notifications do not follow the
// snapshot, or were too many to keep: read again.
func (v *PresenceView) Reset(snap PresenceSnapshot) bool {
	next := make(map[string]struct{}, len(snap.Subjects))
	for _, s := range snap.Subjects {
		next[s.Sub] = struct{}{}
	}
	for s := range v.present {
		if _, ok := next[s]; !ok {
			v.noteLeave(s)
		}
	}
	for s := range next {
		if _, ok := v.present[s]; !ok {
			v.noteJoin(s)
		}
	}
	v.present, v.seq, v.anonymous = next, snap.Seq, snap.Anonymous
	v.synced, v.partNext = true, 0
	buffered, overflow := v.buffered, v.overflow
	v.buffered, v.overflow = nil, false
	if overflow {
		v.synced = false
		return false
	}
	for i := range buffered {
		b := &buffered[i]
		if v.apply(b.seq, b.prev, b.part, b.parts, b.anonymous, b.joins, b.leaves) == PresenceNeedRead {
			v.synced = false
			return false
		}
	}
	return true
}

// Apply takes one parsed notification of channel "pgsse" (any kind; only P payloads of
// this view's stream matter). Its slices are copied where kept.
func (v *PresenceView) Apply(p *Payload) PresenceApply {
	if p.Kind != KindPresence || string(p.Stream) != v.stream {
		return PresenceIgnored
	}
	var joins, leaves []string
	p.Joins(func(s []byte) bool { joins = append(joins, string(s)); return true })
	p.Leaves(func(s []byte) bool { leaves = append(leaves, string(s)); return true })
	if !v.synced {
		v.keep(p, joins, leaves)
		return PresenceBuffered
	}
	r := v.apply(p.ID, p.Prev, p.Part, p.Parts, p.Anonymous, joins, leaves)
	if r == PresenceNeedRead {
		v.synced, v.partNext = false, 0
		v.keep(p, joins, leaves)
	}
	return r
}

// keep buffers a notification for after the next snapshot, up to maxPresenceBuffered.
func (v *PresenceView) keep(p *Payload, joins, leaves []string) {
	if len(v.buffered) == maxPresenceBuffered {
		v.overflow = true
		return
	}
	if !v.overflow {
		v.buffered = append(v.buffered, bufferedPresence{seq: p.ID, prev: p.Prev, anonymous: p.Anonymous,
			part: p.Part, parts: p.Parts, joins: joins, leaves: leaves})
	}
}

func (v *PresenceView) apply(seq, prev int64, part, parts int, anonymous int64, joins, leaves []string) PresenceApply {
	if seq <= v.seq {
		return PresenceIgnored
	}
	if v.partNext > 0 && (seq != v.partSeq || part != v.partNext) {
		return PresenceNeedRead // a part went missing
	}
	if v.partNext == 0 {
		follows := prev == v.seq || prev == 0 && len(v.present) == 0 && v.anonymous == 0
		if !follows || parts == 0 || part != 1 {
			return PresenceNeedRead
		}
		v.partSeq, v.partPrev, v.partJoins, v.partLeaves = seq, prev, v.partJoins[:0], v.partLeaves[:0]
	}
	v.partJoins = append(v.partJoins, joins...)
	v.partLeaves = append(v.partLeaves, leaves...)
	if part < parts {
		v.partNext = part + 1
		return PresenceApplied
	}
	v.partNext = 0
	for _, s := range v.partLeaves {
		if _, ok := v.present[s]; ok {
			delete(v.present, s)
			v.noteLeave(s)
		}
	}
	for _, s := range v.partJoins {
		if _, ok := v.present[s]; !ok {
			v.present[s] = struct{}{}
			v.noteJoin(s)
		}
	}
	v.seq, v.anonymous = seq, anonymous
	return PresenceApplied
}

// noteJoin and noteLeave keep the net change since TakeChanges: a subject that left and
// came back in between is neither.
func (v *PresenceView) noteJoin(s string) {
	if _, ok := v.left[s]; ok {
		delete(v.left, s)
	} else {
		v.joined[s] = struct{}{}
	}
}

func (v *PresenceView) noteLeave(s string) {
	if _, ok := v.joined[s]; ok {
		delete(v.joined, s)
	} else {
		v.left[s] = struct{}{}
	}
}

// TakeChanges returns the subjects that joined and left since the last call (sorted) and
// the anonymous count now; changed is false when neither the subjects nor the anonymous
// count moved since then.
func (v *PresenceView) TakeChanges() (joins, leaves []string, anonymous int64, changed bool) {
	for s := range v.joined {
		joins = append(joins, s)
	}
	for s := range v.left {
		leaves = append(leaves, s)
	}
	slices.Sort(joins)
	slices.Sort(leaves)
	clear(v.joined)
	clear(v.left)
	changed = len(joins) > 0 || len(leaves) > 0 || v.anonymous != v.anonTaken
	v.anonTaken = v.anonymous
	return joins, leaves, v.anonymous, changed
}
