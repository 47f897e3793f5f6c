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
)

// Errors from ParsePayload, one per rule.
var (
	ErrPayloadKind    = errors.New("payload: kind must be D, W or E followed by version 1")
	ErrPayloadTime    = errors.New("payload: time must be 1-16 digits without leading zeros")
	ErrPayloadStream  = errors.New("payload: bad stream field")
	ErrPayloadID      = errors.New("payload: id must be 1-19 digits, 1 to 2^63-1, without leading zeros")
	ErrPayloadEvent   = errors.New("payload: bad event field")
	ErrPayloadNTags   = errors.New("payload: tag count must be 0-64 without leading zeros")
	ErrPayloadTag     = errors.New("payload: bad audience tag (len:octets, 1-200 bytes of UTF-8, no control characters)")
	ErrPayloadHeader  = errors.New("payload: header must end with a line feed after the last tag")
	ErrPayloadWake    = errors.New("payload: a W payload carries no event, tags or data")
	ErrPayloadSpacing = errors.New("payload: fields must be separated by single spaces")
)

// Payload is a parsed NOTIFY payload. Its byte slices are views into the buffer given
// to ParsePayload and are valid only as long as that buffer is.
type Payload struct {
	Kind   Kind
	TimeUS int64  // clock_timestamp() at publish, microseconds since the Unix epoch
	Stream []byte // a valid stream name
	ID     int64  // D/W: the event id; E: a nonce to ignore
	Event  []byte // empty = "message"
	NTags  int    // audience size; 0 = everyone
	Data   []byte // empty for W
	tags   []byte // raw audience section: NTags × (SP len ":" tag)
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
	if kind != KindDurable && kind != KindWake && kind != KindEphemeral {
		return ErrPayloadKind
	}
	i := 3
	t, i, ok := parseUint(src, i, maxTimeDigits)
	if !ok {
		return ErrPayloadTime
	}
	if i >= len(src) || src[i] != ' ' {
		return ErrPayloadSpacing
	}
	i++
	start := i
	for i < len(src) && src[i] != ' ' && i-start <= names.MaxStream {
		i++
	}
	stream := src[start:i]
	if names.CheckStream(stream) != nil {
		return ErrPayloadStream
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
	start = i
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

// parseUint reads a canonical decimal number (no sign, no leading zero unless the
// number is 0) of 1..maxDigits digits at src[i:], at most 2^63-1. It returns the
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

// AppendPayload appends the encoding of p to dst. The audience is tags when tags is
// non-nil, otherwise p's own (as parsed; p.NTags is then taken as is). It encodes what
// it is given: a caller that needs a valid payload checks names and limits first.
func AppendPayload(dst []byte, p *Payload, tags [][]byte) []byte {
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
