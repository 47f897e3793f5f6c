package sse

import (
	"bytes"
	"slices"
	"strconv"
	"unicode/utf8"
)

// AppendEvent appends one SSE event to dst and returns the extended buffer.
//
// id < 1 writes no id line (ephemeral events and channel notifications must
// not disturb the browser's Last-Event-ID). An empty event or "message"
// writes no event line; CR and LF in event (which names.CheckEvent forbids
// anyway) are written as spaces. data is split on "\r\n", "\r" and "\n" and
// each piece becomes one "data: " line, so an EventSource reconstructs data
// exactly with its line breaks normalised to "\n": empty data gives a single
// "data: " line and a trailing line break gives a final empty data line.
// Because no CR or LF survives the split, nothing in data can start a field.
// The event ends with the blank line that dispatches it.
//
// It does not allocate when dst has room for the result.
func AppendEvent(dst []byte, id int64, event, data []byte) []byte {
	dst = slices.Grow(dst, len(event)+len(data)+48)
	if id >= 1 {
		dst = append(dst, "id: "...)
		dst = strconv.AppendInt(dst, id, 10)
		dst = append(dst, '\n')
	}
	if len(event) > 0 && string(event) != "message" {
		dst = append(dst, "event: "...)
		dst = appendOneLine(dst, event)
		dst = append(dst, '\n')
	}
	dst = appendData(dst, data)
	return append(dst, '\n')
}

// AppendCompositeID appends the id line of a durable event on a connection that follows
// several streams (docs/http.md, Several streams on one connection): "id: <k>:<c0>,…,<cK-1>",
// where k is the position of the event's own stream and cursors are every stream's cursor
// once the event is written. It does not allocate when dst has room.
func AppendCompositeID(dst []byte, k int, cursors []int64) []byte {
	dst = append(dst, "id: "...)
	dst = strconv.AppendInt(dst, int64(k), 10)
	dst = append(dst, ':')
	for i, c := range cursors {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendInt(dst, c, 10)
	}
	return append(dst, '\n')
}

// appendData writes data as "data: " lines, splitting on CRLF, CR and LF.
// It finds breaks with bytes.IndexByte and remembers the next CR and LF it
// has seen, so the cost is linear in len(data) whatever the mix of breaks.
func appendData(dst, data []byte) []byte {
	cr := bytes.IndexByte(data, '\r')
	lf := bytes.IndexByte(data, '\n')
	start := 0
	for {
		end := lf
		if cr >= 0 && (end < 0 || cr < end) {
			end = cr
		}
		dst = append(dst, "data: "...)
		if end < 0 {
			dst = append(dst, data[start:]...)
			return append(dst, '\n')
		}
		dst = append(dst, data[start:end]...)
		dst = append(dst, '\n')
		start = end + 1
		if data[end] == '\r' && start < len(data) && data[start] == '\n' {
			start++
		}
		if cr >= 0 && cr < start {
			cr = indexFrom(data, start, '\r')
		}
		if lf >= 0 && lf < start {
			lf = indexFrom(data, start, '\n')
		}
	}
}

// indexFrom is bytes.IndexByte over b[from:], returning an index into b.
func indexFrom(b []byte, from int, c byte) int {
	i := bytes.IndexByte(b[from:], c)
	if i < 0 {
		return -1
	}
	return from + i
}

// appendOneLine appends b with every CR and LF replaced by a space.
func appendOneLine(dst, b []byte) []byte {
	start := len(dst)
	dst = append(dst, b...)
	for i := start; i < len(dst); i++ {
		if dst[i] == '\r' || dst[i] == '\n' {
			dst[i] = ' '
		}
	}
	return dst
}

// AppendComment appends the comment line ":" + text + "\n". CR and LF in
// text are written as spaces so the comment stays one line. An empty text
// gives ":\n", the heartbeat.
func AppendComment(dst []byte, text []byte) []byte {
	dst = append(dst, ':')
	dst = appendOneLine(dst, text)
	return append(dst, '\n')
}

// AppendRetry appends "retry: <ms>\n", which sets the client's reconnection
// delay. A negative ms is written as 0 (EventSource ignores a signed value).
func AppendRetry(dst []byte, ms int64) []byte {
	if ms < 0 {
		ms = 0
	}
	dst = append(dst, "retry: "...)
	dst = strconv.AppendInt(dst, ms, 10)
	return append(dst, '\n')
}

// AppendGap appends the pgsse:gap event of docs/http.md, Cursors and gaps:
//
//	event: pgsse:gap
//	data: {"stream":"<stream>","after":<after>,"resume":<resume>}
//
// followed by the dispatching blank line. It has no id line. stream is
// written as a JSON string: quotes, backslashes and control characters are
// escaped, invalid UTF-8 becomes U+FFFD, U+2028/U+2029 are escaped.
func AppendGap(dst []byte, stream []byte, after, resume int64) []byte {
	dst = slices.Grow(dst, len(stream)+96)
	dst = append(dst, "event: pgsse:gap\ndata: {\"stream\":"...)
	dst = appendJSONString(dst, stream)
	dst = append(dst, `,"after":`...)
	dst = strconv.AppendInt(dst, after, 10)
	dst = append(dst, `,"resume":`...)
	dst = strconv.AppendInt(dst, resume, 10)
	return append(dst, "}\n\n"...)
}

const lowerHex = "0123456789abcdef"

// appendJSONString appends s as a JSON string literal.
func appendJSONString(dst, s []byte) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', lowerHex[c>>4], lowerHex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', lowerHex[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
