package pglisten

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"
)

// MaxMessage bounds one backend message (type byte excluded). A NotificationResponse is at
// most ~8 KiB; anything announcing more than this is a protocol error that drops the session.
const MaxMessage = 1 << 20

// Backend message types this package reads.
const (
	MsgNotification   byte = 'A' // NotificationResponse
	MsgCommandDone    byte = 'C' // CommandComplete
	MsgReady          byte = 'Z' // ReadyForQuery
	MsgError          byte = 'E' // ErrorResponse
	MsgNotice         byte = 'N' // NoticeResponse
	MsgParameter      byte = 'S' // ParameterStatus
	MsgEmptyQueryDone byte = 'I' // EmptyQueryResponse (the answer to a ping)
)

// Protocol errors. Each names the rule that was broken.
var (
	ErrMessageLength     = errors.New("pglisten: backend message length must be 4.." + strconv.Itoa(MaxMessage+4) + " bytes")
	ErrBadNotification   = errors.New("pglisten: NotificationResponse must be pid, channel NUL, payload NUL and nothing more")
	ErrBadErrorResponse  = errors.New("pglisten: ErrorResponse/NoticeResponse fields must be code byte, text NUL, ending with NUL")
	ErrBadReadyForQuery  = errors.New("pglisten: ReadyForQuery must carry exactly one status byte")
	errUnexpectedMessage = errors.New("pglisten: unexpected backend message")
)

// BackendMsg is one framed backend message. Body is a view into the buffer given to
// ParseBackend, valid as long as that buffer is.
type BackendMsg struct {
	Type byte
	Body []byte
}

// ParseBackend frames the first backend message in buf: type byte, int32 length (counting
// itself), body. It returns n == 0 and no error when buf holds only part of a message (read
// more and call again with the longer buffer); n > 0 is the number of bytes the message
// occupies. A length outside 4..MaxMessage+4 is ErrMessageLength as soon as the header is
// visible, so a hostile length never makes the caller buffer more than MaxMessage.
// It never allocates.
func ParseBackend(buf []byte) (msg BackendMsg, n int, err error) {
	if len(buf) < 5 {
		return BackendMsg{}, 0, nil
	}
	l := binary.BigEndian.Uint32(buf[1:5])
	if l < 4 || l > MaxMessage+4 {
		return BackendMsg{}, 0, ErrMessageLength
	}
	total := int(l) + 1
	if len(buf) < total {
		return BackendMsg{}, 0, nil
	}
	return BackendMsg{Type: buf[0], Body: buf[5:total:total]}, total, nil
}

// ParseNotification decodes a NotificationResponse body. Channel and Payload are views into
// body (valid as long as body is). It never allocates.
func ParseNotification(body []byte) (Notification, error) {
	if len(body) < 6 {
		return Notification{}, ErrBadNotification
	}
	pid := binary.BigEndian.Uint32(body)
	rest := body[4:]
	i := bytes.IndexByte(rest, 0)
	if i < 0 {
		return Notification{}, ErrBadNotification
	}
	ch := rest[:i:i]
	rest = rest[i+1:]
	j := bytes.IndexByte(rest, 0)
	if j < 0 || j != len(rest)-1 {
		return Notification{}, ErrBadNotification
	}
	return Notification{PID: pid, Channel: ch, Payload: rest[:j:j]}, nil
}

// AppendNotificationResponse appends a NotificationResponse message ('A') to dst, the way
// PostgreSQL sends it. For tests, benchmarks and fuzzing; channel and payload must not
// contain NUL to round-trip.
func AppendNotificationResponse(dst []byte, pid uint32, channel, payload []byte) []byte {
	dst = append(dst, MsgNotification)
	dst = binary.BigEndian.AppendUint32(dst, uint32(4+4+len(channel)+1+len(payload)+1))
	dst = binary.BigEndian.AppendUint32(dst, pid)
	dst = append(dst, channel...)
	dst = append(dst, 0)
	dst = append(dst, payload...)
	return append(dst, 0)
}

// ParseErrorFields decodes an ErrorResponse or NoticeResponse body into a *pgconn.PgError
// (the type pgx users already match on with errors.As). It allocates; errors are rare.
func ParseErrorFields(body []byte) (*pgconn.PgError, error) {
	e := &pgconn.PgError{}
	for {
		if len(body) == 0 {
			return nil, ErrBadErrorResponse
		}
		code := body[0]
		if code == 0 {
			if len(body) != 1 {
				return nil, ErrBadErrorResponse
			}
			return e, nil
		}
		i := bytes.IndexByte(body[1:], 0)
		if i < 0 {
			return nil, ErrBadErrorResponse
		}
		v := string(body[1 : 1+i])
		body = body[2+i:]
		switch code {
		case 'S':
			e.Severity = v
		case 'V':
			e.SeverityUnlocalized = v
		case 'C':
			e.Code = v
		case 'M':
			e.Message = v
		case 'D':
			e.Detail = v
		case 'H':
			e.Hint = v
		case 'W':
			e.Where = v
		case 's':
			e.SchemaName = v
		case 't':
			e.TableName = v
		case 'c':
			e.ColumnName = v
		case 'd':
			e.DataTypeName = v
		case 'n':
			e.ConstraintName = v
		case 'F':
			e.File = v
		case 'R':
			e.Routine = v
		}
	}
}

// ParseReady decodes a ReadyForQuery body: the transaction status byte.
func ParseReady(body []byte) (byte, error) {
	if len(body) != 1 {
		return 0, ErrBadReadyForQuery
	}
	return body[0], nil
}

// appendQuery appends a simple Query message ('Q') whose text is verb + " " + the quoted
// identifier: `LISTEN "a""b"`. The channel is never spliced unquoted; a double quote is doubled
// and nothing else needs escaping inside a quoted identifier. channel must have passed
// names.CheckChannel (1–63 bytes, no NUL).
func appendQuery(dst []byte, verb, channel string) []byte {
	start := len(dst)
	dst = append(dst, 'Q', 0, 0, 0, 0)
	dst = append(dst, verb...)
	dst = append(dst, ' ', '"')
	for i := 0; i < len(channel); i++ {
		c := channel[i]
		if c == '"' {
			dst = append(dst, '"')
		}
		dst = append(dst, c)
	}
	dst = append(dst, '"', 0)
	binary.BigEndian.PutUint32(dst[start+1:], uint32(len(dst)-start-1))
	return dst
}

// appendPing appends the empty query used as a liveness round trip; PostgreSQL answers it
// with EmptyQueryResponse and ReadyForQuery.
func appendPing(dst []byte) []byte {
	return append(dst, 'Q', 0, 0, 0, 6, ';', 0)
}
