package store

import (
	"errors"
	"strconv"

	"github.com/pgsse/pgsse/names"
)

// Kind is the first byte of a NOTIFY payload on channel "pgsse".
type Kind byte

// Payload kinds.
const (
	KindDurable   Kind = 'D' // durable event, data inline
	KindWake      Kind = 'W' // durable events from id on (one too big for NOTIFY, or several of one transaction): read them from pgsse.events
	KindEphemeral Kind = 'E' // pgsse.broadcast: never stored
	KindPresence  Kind = 'P' // presence: who joined and left a stream (pgsse.presence_flush), not an event
)

// PayloadVersion is the format version byte that follows the kind.
const PayloadVersion = '1'

// MaxPayload is the largest NOTIFY payload PostgreSQL accepts, in bytes.
const MaxPayload = 7999

// Field limits of the payload header (see the package documentation).
const (
	maxTimeDigits = 16
	maxIDDigits   = 19
	maxNTagDigits = 3
	maxLenDigits  = 3
	maxNSubDigits = 4
	maxPartDigits = 2
)

// MaxPresenceParts is the most notifications one stream's presence change is split into;
// a change that would need more is sent as part 0 of 0 (re-read the stream).
const MaxPresenceParts = 64

// Errors from ParsePayload, one per rule.
var (
	ErrPayloadKind    = errors.New("payload: kind must be D, W, E or P followed by version 1")
	ErrPayloadTime    = errors.New("payload: time must be 1-16 digits without leading zeros")
	ErrPayloadStream  = errors.New("payload: bad stream field")
	ErrPayloadID      = errors.New("payload: id must be 1-19 digits, 1 to 2^63-1, without leading zeros")
	ErrPayloadEvent   = errors.New("payload: bad event field")
	ErrPayloadNTags   = errors.New("payload: tag count must be 0-64 without leading zeros")
	ErrPayloadTag     = errors.New("payload: bad audience tag (len:octets, 1-200 bytes of UTF-8, no control characters)")
	ErrPayloadHeader  = errors.New("payload: header must end with a line feed after the last tag or subject")
	ErrPayloadWake    = errors.New("payload: a W payload carries no event, tags or data")
	ErrPayloadSpacing = errors.New("payload: fields must be separated by single spaces")
	// Presence (kind P) fields.
	ErrPayloadPrev      = errors.New("payload: prev must be 1-19 digits without leading zeros, less than the change number")
	ErrPayloadParts     = errors.New("payload: part and parts must be 1 <= part <= parts <= 64, or both 0")
	ErrPayloadAnonymous = errors.New("payload: anonymous must be 1-19 digits without leading zeros")
	ErrPayloadNSubjects = errors.New("payload: join and leave counts must be 0-9999 without leading zeros, both 0 in part 0")
	ErrPayloadSubject   = errors.New("payload: bad subject (len:octets, 1-200 bytes of UTF-8, no control characters)")
	ErrPayloadTrailing  = errors.New("payload: a P payload ends at its line feed")
)

// Payload is a parsed NOTIFY payload. Its byte slices are views into the buffer given
// to ParsePayload and are valid only as long as that buffer is.
type Payload struct {
	Kind   Kind
	TimeUS int64  // clock_timestamp() at publish, microseconds since the Unix epoch
	Stream []byte // a valid stream name
	ID     int64  // D/W: the event id; E: a nonce to ignore; P: the stream's change number
	Event  []byte // empty = "message"; empty for P
	NTags  int    // audience size; 0 = everyone
	Data   []byte // empty for W and P
	tags   []byte // raw audience section: NTags × (SP len ":" tag)

	// Presence (kind P) only. A change is applied on top of the one numbered Prev (0: the
	// stream had nobody before); its parts arrive one after the other, in order.
	Prev          int64
	Part, Parts   int   // part 1 … Parts; 0 of 0: too large to list, re-read the stream
	Anonymous     int64 // the stream's anonymous connections after the change
	NJoin, NLeave int   // subjects in this part that joined, then that left
	subs          []byte
}

// ParsePayload parses src into p, strictly: anything pgsse.publish/pgsse.broadcast
// would not write is an error, never a panic or a partly filled route. p's slices point
// into src. It does not allocate.
func ParsePayload(src []byte, p *Payload) error {
	*p = Payload{}
	if len(src) < 3 || src[1] != PayloadVersion || src[2] != ' ' {
		return ErrPayloadKind
	}
	kind := Kind(src[0])
	if kind == KindPresence {
		return parsePresence(src, p)
	}
	if kind != KindDurable && kind != KindWake && kind != KindEphemeral {
		return ErrPayloadKind
	}
	t, stream, i, err := parseHead(src)
	if err != nil {
		return err
	}
	if i >= len(src) {
		return ErrPayloadSpacing
	}
	i++
	id, i, ok := parseUint(src, i, maxIDDigits)
	if !ok || id == 0 {
		return ErrPayloadID
	}
	if i >= len(src) || src[i] != ' ' {
		return ErrPayloadSpacing
	}
	i++
	start := i
	for i < len(src) && src[i] != ' ' && i-start <= names.MaxEvent {
		i++
	}
	event := src[start:i]
	if len(event) > 0 && names.CheckEventSyntax(event) != nil { // as stored: it may predate the reserved prefix
		return ErrPayloadEvent
	}
	if i >= len(src) {
		return ErrPayloadSpacing
	}
	i++
	ntags, i, ok := parseUint(src, i, maxNTagDigits)
	if !ok || ntags > names.MaxAudience {
		return ErrPayloadNTags
	}
	tagStart := i
	for n := uint64(0); n < ntags; n++ {
		if i >= len(src) || src[i] != ' ' {
			return ErrPayloadSpacing
		}
		var l uint64
		l, i, ok = parseUint(src, i+1, maxLenDigits)
		if !ok || l == 0 || l > names.MaxTag || i >= len(src) || src[i] != ':' || uint64(len(src)-i-1) < l {
			return ErrPayloadTag
		}
		i++
		if names.CheckTag(src[i:i+int(l)]) != nil {
			return ErrPayloadTag
		}
		i += int(l)
	}
	tagEnd := i
	if i >= len(src) || src[i] != '\n' {
		return ErrPayloadHeader
	}
	i++
	if kind == KindWake && (len(event) > 0 || ntags > 0 || i != len(src)) {
		return ErrPayloadWake
	}
	*p = Payload{
		Kind:   kind,
		TimeUS: int64(t),
		Stream: stream,
		ID:     int64(id),
		Event:  event,
		NTags:  int(ntags),
		Data:   src[i:],
		tags:   src[tagStart:tagEnd],
	}
	return nil
}

// parsePresence parses a P payload (src[:3] is "P1 "):
//
//	"P1" SP time SP stream SP seq SP prev SP part SP parts SP anonymous SP njoin SP nleave
//	     *(SP len ":" sub) LF
func parsePresence(src []byte, p *Payload) error {
	t, stream, i, err := parseHead(src)
	if err != nil {
		return err
	}
	var ok bool
	// The numbers, each after one space.
	var f [7]uint64
	digits := [7]int{maxIDDigits, maxIDDigits, maxPartDigits, maxPartDigits, maxIDDigits, maxNSubDigits, maxNSubDigits}
	errs := [7]error{ErrPayloadID, ErrPayloadPrev, ErrPayloadParts, ErrPayloadParts, ErrPayloadAnonymous, ErrPayloadNSubjects, ErrPayloadNSubjects}
	for n := range f {
		if i >= len(src) || src[i] != ' ' {
			return ErrPayloadSpacing
		}
		if f[n], i, ok = parseUint(src, i+1, digits[n]); !ok {
			return errs[n]
		}
	}
	seq, prev, part, parts, anon, nj, nl := f[0], f[1], f[2], f[3], f[4], f[5], f[6]
	switch {
	case seq == 0:
		return ErrPayloadID
	case prev >= seq:
		return ErrPayloadPrev
	case parts > MaxPresenceParts || part > parts || (part == 0) != (parts == 0):
		return ErrPayloadParts
	case parts == 0 && nj+nl > 0:
		return ErrPayloadNSubjects
	}
	subStart := i
	for n := uint64(0); n < nj+nl; n++ {
		if i >= len(src) || src[i] != ' ' {
			return ErrPayloadSpacing
		}
		var l uint64
		l, i, ok = parseUint(src, i+1, maxLenDigits)
		if !ok || l == 0 || l > MaxSubject || i >= len(src) || src[i] != ':' || uint64(len(src)-i-1) < l {
			return ErrPayloadSubject
		}
		i++
		if names.CheckTag(src[i:i+int(l)]) != nil {
			return ErrPayloadSubject
		}
		i += int(l)
	}
	subEnd := i
	if i >= len(src) || src[i] != '\n' {
		return ErrPayloadHeader
	}
	if i+1 != len(src) {
		return ErrPayloadTrailing
	}
	*p = Payload{
		Kind:      KindPresence,
		TimeUS:    int64(t),
		Stream:    stream,
		ID:        int64(seq),
		Data:      src[len(src):],
		Prev:      int64(prev),
		Part:      int(part),
		Parts:     int(parts),
		Anonymous: int64(anon),
		NJoin:     int(nj),
		NLeave:    int(nl),
		subs:      src[subStart:subEnd],
	}
	return nil
}

// parseUint reads a canonical decimal number (no sign, no leading zero unless the
// number is 0) of 1..maxDigits digits at src[i:], at most 2^63-1. It returns the
// parseHead reads what every payload kind starts with after its kind byte and space:
// the commit time, one space and the stream; i is the index just past the stream.
func parseHead(src []byte) (t uint64, stream []byte, i int, err error) {
	t, i, ok := parseUint(src, 3, maxTimeDigits)
	if !ok {
		return 0, nil, 0, ErrPayloadTime
	}
	if i >= len(src) || src[i] != ' ' {
		return 0, nil, 0, ErrPayloadSpacing
	}
	i++
	start := i
	for i < len(src) && src[i] != ' ' && i-start <= names.MaxStream {
		i++
	}
	stream = src[start:i]
	if names.CheckStream(stream) != nil {
		return 0, nil, 0, ErrPayloadStream
	}
	return t, stream, i, nil
}

// value and the index after it.
func parseUint(src []byte, i, maxDigits int) (uint64, int, bool) {
	start := i
	var v uint64
	for i < len(src) && src[i] >= '0' && src[i] <= '9' {
		if i-start == maxDigits {
			return 0, i, false
		}
		d := uint64(src[i] - '0')
		if v > (1<<63-1-d)/10 {
			return 0, i, false
		}
		v = v*10 + d
		i++
	}
	n := i - start
	if n == 0 || (n > 1 && src[start] == '0') {
		return 0, i, false
	}
	return v, i, true
}

// Tags calls yield with each audience tag in order until it returns false. The tags
// are views into the parsed buffer; it does not allocate.
func (p *Payload) Tags(yield func(tag []byte) bool) {
	s := p.tags
	for len(s) > 0 {
		// s is " len:tag..." and was validated by ParsePayload.
		j := 1
		l := 0
		for s[j] != ':' {
			l = l*10 + int(s[j]-'0')
			j++
		}
		tag := s[j+1 : j+1+l]
		s = s[j+1+l:]
		if !yield(tag) {
			return
		}
	}
}

// Joins calls yield with each subject of a P payload that joined, in order, until it
// returns false; Leaves with each that left. Views into the parsed buffer; no allocation.
func (p *Payload) Joins(yield func(sub []byte) bool) { eachEntry(p.subs, 0, p.NJoin, yield) }

// Leaves: see Joins.
func (p *Payload) Leaves(yield func(sub []byte) bool) {
	eachEntry(p.subs, p.NJoin, p.NJoin+p.NLeave, yield)
}

// eachEntry yields entries from to to of a validated " len:octets" list.
func eachEntry(s []byte, from, to int, yield func([]byte) bool) {
	for n := 0; n < to && len(s) > 0; n++ {
		j, l := 1, 0
		for s[j] != ':' {
			l = l*10 + int(s[j]-'0')
			j++
		}
		entry := s[j+1 : j+1+l]
		s = s[j+1+l:]
		if n >= from && !yield(entry) {
			return
		}
	}
}

// AppendPresencePayload appends a P payload with p's TimeUS, Stream, ID (the change
// number), Prev, Part, Parts and Anonymous, and the given subjects (p's own, as parsed,
// when both are nil). Like AppendPayload it encodes what it is given.
func AppendPresencePayload(dst []byte, p *Payload, joins, leaves [][]byte) []byte {
	dst = append(dst, byte(KindPresence), PayloadVersion, ' ')
	for i, v := range [...]int64{p.TimeUS, -1, p.ID, p.Prev, int64(p.Part), int64(p.Parts), p.Anonymous} {
		if i == 1 {
			dst = append(dst, p.Stream...)
		} else {
			dst = strconv.AppendInt(dst, v, 10)
		}
		dst = append(dst, ' ')
	}
	if joins == nil && leaves == nil {
		dst = strconv.AppendInt(dst, int64(p.NJoin), 10)
		dst = append(dst, ' ')
		dst = strconv.AppendInt(dst, int64(p.NLeave), 10)
		dst = append(dst, p.subs...)
		return append(dst, '\n')
	}
	dst = strconv.AppendInt(dst, int64(len(joins)), 10)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, int64(len(leaves)), 10)
	for _, list := range [2][][]byte{joins, leaves} {
		for _, s := range list {
			dst = append(dst, ' ')
			dst = strconv.AppendInt(dst, int64(len(s)), 10)
			dst = append(dst, ':')
			dst = append(dst, s...)
		}
	}
	return append(dst, '\n')
}

// AppendPayload appends the encoding of p to dst. The audience is tags when tags is
// non-nil, otherwise p's own (as parsed; p.NTags is then taken as is). A P payload is
// encoded as AppendPresencePayload(dst, p, nil, nil) does. It encodes what
// it is given: a caller that needs a valid payload checks names and limits first.
func AppendPayload(dst []byte, p *Payload, tags [][]byte) []byte {
	if p.Kind == KindPresence {
		return AppendPresencePayload(dst, p, nil, nil)
	}
	dst = append(dst, byte(p.Kind), PayloadVersion, ' ')
	dst = strconv.AppendInt(dst, p.TimeUS, 10)
	dst = append(dst, ' ')
	dst = append(dst, p.Stream...)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, p.ID, 10)
	dst = append(dst, ' ')
	dst = append(dst, p.Event...)
	dst = append(dst, ' ')
	if tags != nil {
		dst = strconv.AppendInt(dst, int64(len(tags)), 10)
		for _, t := range tags {
			dst = append(dst, ' ')
			dst = strconv.AppendInt(dst, int64(len(t)), 10)
			dst = append(dst, ':')
			dst = append(dst, t...)
		}
	} else {
		dst = strconv.AppendInt(dst, int64(p.NTags), 10)
		dst = append(dst, p.tags...)
	}
	dst = append(dst, '\n')
	return append(dst, p.Data...)
}
