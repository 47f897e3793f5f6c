package names

import "errors"

// Text is any string or byte-slice type; the checks read it without converting.
type Text interface{ ~string | ~[]byte }

// Limits, in bytes.
const (
	MaxStream  = 200 // stream name
	MaxEvent   = 64  // SSE event name
	MaxChannel = 63  // PostgreSQL identifier (NAMEDATALEN-1)
)

// Sentinel errors, one per rule. Their messages are user-facing.
var (
	ErrStreamLength  = errors.New("stream name must be 1-200 bytes")
	ErrStreamChars   = errors.New("stream name may contain only A-Z a-z 0-9 and . _ : @ / = + ~ -")
	ErrEventLength   = errors.New("event name must be 1-64 bytes")
	ErrEventChars    = errors.New("event name may contain only A-Z a-z 0-9 and . _ : -")
	ErrChannelEmpty  = errors.New("channel name must be 1-63 bytes")
	ErrChannelLength = errors.New("channel name must be at most 63 bytes")
	ErrChannelNUL    = errors.New("channel name must not contain a NUL byte")
	ErrCursorSyntax  = errors.New("cursor must be decimal digits")
	ErrCursorRange   = errors.New("cursor must be at most 9223372036854775807")
)

// Character classes as lookup tables, built once at init.
var (
	streamOK [256]bool
	eventOK  [256]bool
)

func init() {
	for c := 0; c < 256; c++ {
		alnum := c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		switch {
		case alnum:
			streamOK[c], eventOK[c] = true, true
		case c == '.' || c == '_' || c == ':' || c == '-':
			streamOK[c], eventOK[c] = true, true
		case c == '@' || c == '/' || c == '=' || c == '+' || c == '~':
			streamOK[c] = true
		}
	}
}

// CheckStream reports whether s is a valid stream name:
// 1–200 bytes of [A-Za-z0-9._:@/=+~-].
func CheckStream[T Text](s T) error {
	if len(s) == 0 || len(s) > MaxStream {
		return ErrStreamLength
	}
	for i := 0; i < len(s); i++ {
		if !streamOK[s[i]] {
			return ErrStreamChars
		}
	}
	return nil
}

// CheckEvent reports whether s is a valid SSE event name:
// 1–64 bytes of [A-Za-z0-9._:-]. An absent event (SQL NULL, "") means
// "message"; callers substitute that themselves before or instead of checking.
func CheckEvent[T Text](s T) error {
	if len(s) == 0 || len(s) > MaxEvent {
		return ErrEventLength
	}
	for i := 0; i < len(s); i++ {
		if !eventOK[s[i]] {
			return ErrEventChars
		}
	}
	return nil
}

// CheckChannel reports whether s is usable as a PostgreSQL channel name for
// /channels/ and the hub: 1–63 bytes, no NUL. Any other byte is allowed; the
// LISTEN/UNLISTEN code quotes the identifier.
func CheckChannel[T Text](s T) error {
	if len(s) == 0 {
		return ErrChannelEmpty
	}
	if len(s) > MaxChannel {
		return ErrChannelLength
	}
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return ErrChannelNUL
		}
	}
	return nil
}

// ParseCursor parses a replay cursor (Last-Event-ID or ?since=): decimal
// digits only, no sign, no spaces, no prefix, value 0 … 2^63−1. Leading
// zeros are accepted ("007" is 7). Any non-digit yields ErrCursorSyntax, a
// value above 2^63−1 yields ErrCursorRange.
func ParseCursor[T Text](s T) (int64, error) {
	if len(s) == 0 {
		return 0, ErrCursorSyntax
	}
	var v uint64
	overflow := false
	for i := 0; i < len(s); i++ {
		d := s[i] - '0'
		if d > 9 {
			return 0, ErrCursorSyntax
		}
		if overflow {
			continue // keep scanning: a non-digit later is a syntax error
		}
		// v*10+d > 2^63-1 ?
		if v > (1<<63-1-uint64(d))/10 {
			overflow = true
			continue
		}
		v = v*10 + uint64(d)
	}
	if overflow {
		return 0, ErrCursorRange
	}
	return int64(v), nil
}
