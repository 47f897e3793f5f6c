package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/pgsse/pgsse/names"
)

// Event size limits.
const (
	// DefaultMaxEventBytes is pgsse.max_event_bytes when the setting is unset or empty.
	DefaultMaxEventBytes = 1 << 20
	// MaxBatchEvents is the most events one request (an NDJSON batch) may hold.
	MaxBatchEvents = 1000
	// maxNonceDigits is the widest E-payload nonce (pgsse.broadcast_nonce is a bigint).
	maxNonceDigits = 19
	// timeDigits is the width of the payload's time field from 2001 to 2286.
	timeDigits = 16
)

// SettingMaxEventBytes names the PostgreSQL setting holding the durable event size limit.
const SettingMaxEventBytes = "pgsse.max_event_bytes"

var (
	// ErrEventTooLarge is matched (errors.Is) by the errors for data over
	// pgsse.max_event_bytes and for ephemeral events over the NOTIFY payload limit.
	ErrEventTooLarge = errors.New("event too large")
	// ErrDataNotText: data must be UTF-8 text without NUL bytes (a PostgreSQL text value).
	ErrDataNotText = errors.New("data must be UTF-8 text without NUL bytes")
	// ErrEmptyRequest: a request holds at least one event.
	ErrEmptyRequest = errors.New("a request holds at least one event")
	// ErrTooManyEvents: a request holds at most MaxBatchEvents events.
	ErrTooManyEvents = fmt.Errorf("a batch holds at most %d events", MaxBatchEvents)
)

// PublishEvent is one event for a Publisher (and one pgsse.message of pgsse.publish_many).
type PublishEvent struct {
	Stream    string
	Data      []byte   // UTF-8 text without NUL bytes; not copied: keep it unchanged until done
	Event     string   // "" = NULL = the SSE default "message"
	Audience  []string // nil or empty = everyone
	Ephemeral bool     // pgsse.broadcast semantics: delivered at commit, never stored
}

// DataTooLargeError is durable data over pgsse.max_event_bytes. Its message is the one
// pgsse.publish raises; errors.Is(err, ErrEventTooLarge) holds.
type DataTooLargeError struct {
	Size, Limit int64
}

func (e *DataTooLargeError) Error() string {
	return "event data is " + strconv.FormatInt(e.Size, 10) + " bytes, over pgsse.max_event_bytes (" +
		strconv.FormatInt(e.Limit, 10) + " bytes)"
}

// Is makes errors.Is(err, ErrEventTooLarge) true.
func (e *DataTooLargeError) Is(target error) bool { return target == ErrEventTooLarge }

// PayloadTooLargeError is an ephemeral event whose NOTIFY payload could exceed
// MaxPayload. Size counts the widest nonce, so it may be up to 18 bytes more than what
// pgsse.broadcast would compute for the same event. errors.Is(err, ErrEventTooLarge) holds.
type PayloadTooLargeError struct {
	Size int
}

func (e *PayloadTooLargeError) Error() string {
	return "the notification payload of an ephemeral event could be " + strconv.Itoa(e.Size) +
		" bytes, over the 7999-byte NOTIFY limit; publish it as a durable event"
}

// Is makes errors.Is(err, ErrEventTooLarge) true.
func (e *PayloadTooLargeError) Is(target error) bool { return target == ErrEventTooLarge }

// EventError says which event of a request is bad and why, e.g.
// `line 3, field "stream": stream name must be 1-200 bytes`. Err is the rule's sentinel
// (names.ErrStreamChars, ErrTagLength, ErrDataNotText, …) or a *DataTooLargeError.
type EventError struct {
	Line  int    // 1-based line of an NDJSON batch; 0 for a single event
	Field string // "stream", "data", "event", "audience", "ephemeral"; "" = the line itself
	Err   error
}

func (e *EventError) Error() string {
	var b []byte
	if e.Line > 0 {
		b = append(b, "line "...)
		b = strconv.AppendInt(b, int64(e.Line), 10)
	}
	if e.Field != "" {
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		b = append(b, "field "...)
		b = strconv.AppendQuote(b, e.Field)
	}
	if len(b) > 0 {
		b = append(b, ": "...)
	}
	return string(append(b, e.Err.Error()...))
}

func (e *EventError) Unwrap() error { return e.Err }

// checkNames checks what is cheap to check (names, audience, sizes; not the bytes of
// data), in the order pgsse.publish_many checks: stream, event, audience, size.
// maxEventBytes < 0 skips the durable size check.
func (ev *PublishEvent) checkNames(maxEventBytes int64) error {
	if err := ev.checkNameRules(); err != nil {
		return err
	}
	if ev.Ephemeral {
		if n := ev.maxEphemeralPayload(); n > MaxPayload {
			return &EventError{Field: "data", Err: &PayloadTooLargeError{Size: n}}
		}
	} else if maxEventBytes >= 0 && int64(len(ev.Data)) > maxEventBytes {
		return &EventError{Field: "data", Err: &DataTooLargeError{Size: int64(len(ev.Data)), Limit: maxEventBytes}}
	}
	return nil
}

// checkNameRules applies the name rules alone (stream, event, audience, in that order),
// as an *EventError naming the field: what ParseBatch checks on each line, before any grant
// is looked at (docs/http.md, Publishing over HTTP).
func (ev *PublishEvent) checkNameRules() *EventError {
	if err := names.CheckStream(ev.Stream); err != nil {
		return &EventError{Field: "stream", Err: err}
	}
	if ev.Event != "" {
		if err := names.CheckEvent(ev.Event); err != nil {
			return &EventError{Field: "event", Err: err}
		}
	}
	if err := names.CheckAudience(ev.Audience); err != nil {
		return &EventError{Field: "audience", Err: err}
	}
	return nil
}

// checkText checks that data is PostgreSQL text (UTF-8 without NUL bytes; tags are
// checked with the names, names.CheckTag): O(len(data)), so the Publisher runs it on its
// own goroutine rather than its caller's.
func (ev *PublishEvent) checkText() error {
	if !isText(ev.Data) {
		return &EventError{Field: "data", Err: ErrDataNotText}
	}
	return nil
}

// isText reports whether b is UTF-8 without NUL bytes.
func isText(b []byte) bool {
	return utf8.Valid(b) && bytes.IndexByte(b, 0) < 0
}

// maxEphemeralPayload is the size of the event's E payload with the widest nonce.
func (ev *PublishEvent) maxEphemeralPayload() int {
	// "E1 " time " " stream " " nonce " " event " " ntags tags "\n" data
	n := 3 + timeDigits + 1 + len(ev.Stream) + 1 + maxNonceDigits + 1 + len(ev.Event) + 1
	n += tagsLen(ev.Audience) + 1 + len(ev.Data)
	return n
}

// tagsLen is the length of an audience's encoding in a payload header, from the tag
// count on: "0", or "<n>" and " <len>:<tag>" per tag.
func tagsLen(audience []string) int {
	n := len(strconv.Itoa(len(audience)))
	for _, t := range audience {
		n += 1 + len(strconv.Itoa(len(t))) + 1 + len(t)
	}
	return n
}

// size is what the event counts against the Publisher's memory budget.
func (ev *PublishEvent) size() int64 {
	n := int64(len(ev.Stream) + len(ev.Data) + len(ev.Event) + 64)
	for _, t := range ev.Audience {
		n += int64(len(t) + 16)
	}
	return n
}

// ParseMaxEventBytes reads the setting pgsse.max_event_bytes with pgsse.max_event_bytes()'s
// rule: unset or "" is DefaultMaxEventBytes, else 1–18 ASCII digits.
func ParseMaxEventBytes(setting string) (int64, error) {
	if setting == "" {
		return DefaultMaxEventBytes, nil
	}
	if len(setting) > 18 {
		return 0, badMaxEventBytes(setting)
	}
	var v int64
	for i := 0; i < len(setting); i++ {
		c := setting[i]
		if c < '0' || c > '9' {
			return 0, badMaxEventBytes(setting)
		}
		v = v*10 + int64(c-'0')
	}
	return v, nil
}

func badMaxEventBytes(setting string) error {
	return fmt.Errorf("%s must be a whole number of bytes, not %q", SettingMaxEventBytes, setting)
}

// Binary wire format of pgsse.message[] (PostgreSQL's array_recv and record_recv):
// array = int32 ndim, int32 has-nulls flag, uint32 element type, per dimension int32 size
// and int32 lower bound, then per element int32 length (-1 = NULL) and its bytes;
// record = int32 column count, then per column uint32 type, int32 length, bytes.
const (
	messageColumns = 5 // stream, data, event, audience, ephemeral
)

// appendMessageArray appends events as a binary pgsse.message[] whose element type is
// messageOID.
func appendMessageArray(dst []byte, messageOID uint32, events []*PublishEvent) []byte {
	dst = binary.BigEndian.AppendUint32(dst, 1) // ndim
	dst = binary.BigEndian.AppendUint32(dst, 0) // no NULL elements
	dst = binary.BigEndian.AppendUint32(dst, messageOID)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(events)))
	dst = binary.BigEndian.AppendUint32(dst, 1) // lower bound
	for _, ev := range events {
		at := len(dst)
		dst = append(dst, 0, 0, 0, 0) // element length, patched below
		dst = binary.BigEndian.AppendUint32(dst, messageColumns)
		dst = appendColumn(dst, oidText, []byte(ev.Stream), true)
		dst = appendColumn(dst, oidText, ev.Data, true)
		dst = appendColumn(dst, oidText, []byte(ev.Event), ev.Event != "")
		dst = binary.BigEndian.AppendUint32(dst, oidTextArray)
		if len(ev.Audience) == 0 {
			dst = binary.BigEndian.AppendUint32(dst, 0xFFFFFFFF) // NULL
		} else {
			tagsAt := len(dst)
			dst = append(dst, 0, 0, 0, 0)
			dst = appendTextArrayBinary(dst, ev.Audience)
			binary.BigEndian.PutUint32(dst[tagsAt:], uint32(len(dst)-tagsAt-4))
		}
		dst = binary.BigEndian.AppendUint32(dst, oidBool)
		dst = binary.BigEndian.AppendUint32(dst, 1)
		if ev.Ephemeral {
			dst = append(dst, 1)
		} else {
			dst = append(dst, 0)
		}
		binary.BigEndian.PutUint32(dst[at:], uint32(len(dst)-at-4))
	}
	return dst
}

func appendColumn(dst []byte, oid uint32, v []byte, present bool) []byte {
	dst = binary.BigEndian.AppendUint32(dst, oid)
	if !present {
		return binary.BigEndian.AppendUint32(dst, 0xFFFFFFFF)
	}
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(v)))
	return append(dst, v...)
}

// appendTextArrayBinary appends a one-dimensional text[] without NULLs in binary format.
func appendTextArrayBinary(dst []byte, elems []string) []byte {
	dst = binary.BigEndian.AppendUint32(dst, 1)
	dst = binary.BigEndian.AppendUint32(dst, 0)
	dst = binary.BigEndian.AppendUint32(dst, oidText)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(elems)))
	dst = binary.BigEndian.AppendUint32(dst, 1)
	for _, e := range elems {
		dst = binary.BigEndian.AppendUint32(dst, uint32(len(e)))
		dst = append(dst, e...)
	}
	return dst
}

var errBadIDArray = errors.New("store: pgsse.publish_many returned a malformed bigint[]")

// parseIDArray reads a binary bigint[] (NULL elements as 0) into ids, which must have
// exactly as many elements.
func parseIDArray(src []byte, ids []int64) error {
	if len(src) < 12 {
		return errBadIDArray
	}
	ndim := binary.BigEndian.Uint32(src)
	if ndim == 0 {
		if len(ids) != 0 {
			return errBadIDArray
		}
		return nil
	}
	if ndim != 1 || binary.BigEndian.Uint32(src[8:]) != oidInt8 || len(src) < 20 ||
		int(binary.BigEndian.Uint32(src[12:])) != len(ids) {
		return errBadIDArray
	}
	src = src[20:]
	for i := range ids {
		if len(src) < 4 {
			return errBadIDArray
		}
		l := int32(binary.BigEndian.Uint32(src))
		src = src[4:]
		switch {
		case l == -1:
			ids[i] = 0
		case l == 8 && len(src) >= 8:
			ids[i] = int64(binary.BigEndian.Uint64(src))
			src = src[8:]
		default:
			return errBadIDArray
		}
	}
	if len(src) != 0 {
		return errBadIDArray
	}
	return nil
}
