package names

import "errors"

// Text is any string or byte-slice type; the checks read it without converting.
type Text interface{ ~string | ~[]byte }

// Limits, in bytes.
const (
	MaxStream  = 200 // stream name
	MaxEvent   = 64  // SSE event name
	MaxChannel = 63  // PostgreSQL identifier (NAMEDATALEN-1)
	MaxTag     = 200 // audience tag (an event's audience, a token's tags)
)

// MaxAudience is the most tags one event's audience may list (SQL's
// pgsse.check_args enforces the same bound).
const MaxAudience = 64

// Sentinel errors, one per rule. Their messages are user-facing.
var (
	ErrStreamLength  = errors.New("stream name must be 1-200 bytes")
	ErrStreamChars   = errors.New("stream name may contain only A-Z a-z 0-9 and . _ : @ / = + ~ -")
	ErrEventLength   = errors.New("event name must be 1-64 bytes")
	ErrEventChars    = errors.New("event name may contain only A-Z a-z 0-9 and . _ : -")
	ErrEventReserved = errors.New("event names starting with pgsse: are reserved") // SQL's text too (docs/sql.md)
	ErrChannelEmpty  = errors.New("channel name must be 1-63 bytes")
	ErrChannelLength = errors.New("channel name must be at most 63 bytes")
	ErrChannelNUL    = errors.New("channel name must not contain a NUL byte")
	ErrChannelUTF8   = errors.New("channel name must be valid UTF-8")
	ErrTagLength     = errors.New("audience tag must be 1-200 bytes")
	ErrTagUTF8       = errors.New("audience tag must be valid UTF-8")
	ErrTagControl    = errors.New("audience tag must not contain control characters")
	ErrAudienceCount = errors.New("audience must have at most 64 tags")
	ErrPatternStar   = errors.New("stream pattern may hold * only as its last byte (a prefix pattern)")
	// The cursor errors name no field: callers put "since: " or
	// "Last-Event-ID: " in front, so the client learns which value was wrong.
	ErrCursorSyntax = errors.New("cursor must be decimal digits")
	ErrCursorRange  = errors.New("cursor must be at most 9223372036854775807")
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

// ReservedEventPrefix starts the names of pgsse's own events (pgsse:gap,
// pgsse:presence), which no publisher may use: a client must be able to trust
// them (docs/sql.md, The functions: Names).
const ReservedEventPrefix = "pgsse:"

// CheckEvent reports whether s is an event name a publisher may use: 1–64
// bytes of [A-Za-z0-9._:-] (CheckEventSyntax), not starting with
// ReservedEventPrefix (ErrEventReserved; case-sensitive, as event names are).
// An absent event (SQL NULL, "") means "message"; callers substitute that
// themselves before or instead of checking.
func CheckEvent[T Text](s T) error {
	if err := CheckEventSyntax(s); err != nil {
		return err
	}
	if len(s) >= len(ReservedEventPrefix) && string(s[:len(ReservedEventPrefix)]) == ReservedEventPrefix {
		return ErrEventReserved
	}
	return nil
}

// CheckEventSyntax is CheckEvent without the reserved prefix: the length and
// character rule alone, for reading an event the database already holds (a
// NOTIFY payload), which may predate the reservation (schema v3) and is
// delivered as stored, live as in replay. Publishing checks CheckEvent.
func CheckEventSyntax[T Text](s T) error {
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

// CheckChannelUTF8 is CheckChannel plus valid UTF-8: the rule for a channel
// a client names in /channels/{channel} or a token grants. PostgreSQL (UTF8
// server encoding) refuses to LISTEN on anything else, so such a name is a
// bad request, not a failed subscription; the hub answers a SUB of one with ACK
// BAD_CHANNEL (docs/hub-protocol.md). Hub frames themselves are decoded with the looser
// CheckChannel (framing), so such a SUB is an answerable request, not a protocol error.
func CheckChannelUTF8[T Text](s T) error {
	if err := CheckChannel(s); err != nil {
		return err
	}
	if !validUTF8(s) {
		return ErrChannelUTF8
	}
	return nil
}

// CheckTag reports whether s is a valid audience tag, in an event's
// audience or a token's tags: 1–200 bytes of valid UTF-8 without control
// characters (U+0000–U+001F, U+007F) — what SQL's pgsse.check_args enforces,
// plus the NUL that SQL text cannot even hold.
func CheckTag[T Text](s T) error {
	if len(s) == 0 || len(s) > MaxTag {
		return ErrTagLength
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f {
			return ErrTagControl
		}
	}
	if !validUTF8(s) {
		return ErrTagUTF8
	}
	return nil
}

// CheckAudience reports whether tags is a valid audience for an event: at
// most MaxAudience tags (ErrAudienceCount), each one CheckTag. Empty means
// everyone.
func CheckAudience[T Text](tags []T) error {
	if len(tags) > MaxAudience {
		return ErrAudienceCount
	}
	for _, t := range tags {
		if err := CheckTag(t); err != nil {
			return err
		}
	}
	return nil
}

// CheckStreamPattern reports whether p is a valid stream grant: "*", a
// stream name, or a prefix of one followed by '*' ("chat/*"; the prefix may
// be up to MaxStream bytes). The non-star part follows CheckStream's
// character rule; a '*' anywhere but at the end is ErrPatternStar.
func CheckStreamPattern[T Text](p T) error {
	n := len(p)
	if n > 0 && p[n-1] == '*' {
		n-- // a prefix: the empty prefix ("*") grants every stream
		if n > MaxStream {
			return ErrStreamLength
		}
	} else if n == 0 || n > MaxStream {
		return ErrStreamLength
	}
	for i := 0; i < n; i++ {
		if c := p[i]; !streamOK[c] {
			if c == '*' {
				return ErrPatternStar
			}
			return ErrStreamChars
		}
	}
	return nil
}

// CheckChannelPattern reports whether p is a valid channel grant: "*", a
// channel name (CheckChannelUTF8), or a prefix of one followed by '*' (up
// to MaxChannel bytes, no NUL, valid UTF-8). A channel name may itself hold
// '*', so only a final '*' is special, as in matching.
func CheckChannelPattern[T Text](p T) error {
	n := len(p)
	if n == 0 || p[n-1] != '*' {
		return CheckChannelUTF8(p)
	}
	if n == 1 {
		return nil // "*": every channel
	}
	return CheckChannelUTF8(p[:n-1]) // a prefix obeys the name rule, and may be a whole name
}

// ParseCursor parses a replay cursor (Last-Event-ID or ?since=): decimal
// digits only, no sign, no spaces, no prefix, value 0 … 2^63−1. Leading
// zeros are digits and accepted ("007" is 7): docs/http.md says "decimal
// digits", and a client that pads its cursor means the same number. Any
// non-digit yields ErrCursorSyntax (whitespace too: callers must not trim
// what the client sent), a value above 2^63−1 yields ErrCursorRange.
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

// validUTF8 is utf8.Valid for either text type, without converting: well-formed
// UTF-8 (RFC 3629) with no surrogates, no overlong forms and nothing above
// U+10FFFF.
func validUTF8[T Text](s T) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < 0x80 {
			i++
			continue
		}
		var n int
		lo, hi := byte(0x80), byte(0xbf) // the range of the second byte
		switch {
		case c >= 0xc2 && c <= 0xdf:
			n = 2
		case c == 0xe0:
			n, lo = 3, 0xa0
		case c >= 0xe1 && c <= 0xec, c == 0xee, c == 0xef:
			n = 3
		case c == 0xed:
			n, hi = 3, 0x9f
		case c == 0xf0:
			n, lo = 4, 0x90
		case c >= 0xf1 && c <= 0xf3:
			n = 4
		case c == 0xf4:
			n, hi = 4, 0x8f
		default:
			return false
		}
		if i+n > len(s) || s[i+1] < lo || s[i+1] > hi {
			return false
		}
		for j := i + 2; j < i+n; j++ {
			if s[j] < 0x80 || s[j] > 0xbf {
				return false
			}
		}
		i += n
	}
	return true
}
