package names

import (
	"errors"
	"strconv"
)

// The composite cursor of GET /streams?stream=…&stream=… (docs/http.md, Several streams on one
// connection): where each of a connection's K streams stands, in the order of its stream
// parameters. The server writes it as every durable event's id, `<k>:<c0>,<c1>,…,<cK-1>`, and
// reads it back from Last-Event-ID or ?since=:
//
//	composite = [ prefix ":" ] entry *( "," entry )   exactly K entries
//	prefix    = a cursor (the position k of the event's own stream; ignored)
//	entry     = "" / a cursor                         "" = absent: live from that stream's head
//
// where a cursor is ParseCursor's (decimal digits, 0 … 2^63−1, nothing trimmed). A plain
// number is one entry: right for one stream, a count error for more.

// ErrCompositePrefix: what comes before the ':' of a composite cursor is not a cursor.
var ErrCompositePrefix = errors.New("cursor prefix before ':' must be decimal digits (the position of the event's stream, as in 1:17,4)")

// CompositeCountError: a composite cursor with a number of entries other than the streams the
// request names.
type CompositeCountError struct {
	Entries int // comma-separated entries in the cursor
	Streams int // stream parameters of the request
}

func (e *CompositeCountError) Error() string {
	entries := strconv.Itoa(e.Entries) + " entries"
	if e.Entries == 1 {
		entries = "1 entry"
	}
	return "cursor has " + entries + " but the request names " + strconv.Itoa(e.Streams) +
		" streams: it needs one entry per stream parameter, comma-separated (an empty one = live)"
}

// CompositeEntryError: entry Index (0-based, the position of its stream) breaks ParseCursor's
// rule; Err is ErrCursorSyntax or ErrCursorRange.
type CompositeEntryError struct {
	Index int
	Err   error
}

func (e *CompositeEntryError) Error() string {
	return "entry " + strconv.Itoa(e.Index) + ": " + e.Err.Error()
}

func (e *CompositeEntryError) Unwrap() error { return e.Err }

// ParseCompositeCursor reads the composite cursor s for len(cursors) streams: cursors[i] is
// stream i's cursor and present[i] whether its entry was given (an empty entry leaves it false
// and cursors[i] 0). present must be as long as cursors, which must not be empty. It does not
// allocate unless it fails, with ErrCompositePrefix, a *CompositeCountError or a
// *CompositeEntryError. A blank value is the caller's to treat as absent before calling (docs/http.md:
// a blank Last-Event-ID counts as absent); here an empty s is one empty entry.
func ParseCompositeCursor[T Text](s T, cursors []int64, present []bool) error {
	if i := indexByte(s, ':'); i >= 0 {
		if _, err := ParseCursor(s[:i]); err != nil {
			return ErrCompositePrefix
		}
		s = s[i+1:]
	}
	n := 1
	for i := 0; i < len(s); i++ {
		if s[i] == ',' {
			n++
		}
	}
	if n != len(cursors) {
		return &CompositeCountError{Entries: n, Streams: len(cursors)}
	}
	for k := range cursors {
		end := indexByte(s, ',')
		if end < 0 {
			end = len(s)
		}
		entry := s[:end]
		cursors[k], present[k] = 0, false
		if len(entry) > 0 {
			c, err := ParseCursor(entry)
			if err != nil {
				return &CompositeEntryError{Index: k, Err: err}
			}
			cursors[k], present[k] = c, true
		}
		if end < len(s) {
			s = s[end+1:]
		}
	}
	return nil
}

func indexByte[T Text](s T, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}
