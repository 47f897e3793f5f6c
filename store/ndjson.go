package store

import (
	"bytes"
	"errors"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// Errors of ParseBatch, wrapped in an *EventError naming the line (and the field).
var (
	ErrBatchNotUTF8   = errors.New("the batch must be UTF-8 text")
	ErrBlankLine      = errors.New("blank line inside the batch (only trailing blank lines are allowed)")
	ErrFieldMissing   = errors.New("required")
	ErrFieldUnknown   = errors.New("unknown field (known: stream, data, event, audience, ephemeral)")
	ErrFieldTwice     = errors.New("given twice")
	ErrFieldNotString = errors.New("must be a string")
	ErrFieldNotEvent  = errors.New("must be a string or null")
	ErrFieldNotTags   = errors.New("must be an array of strings, or null")
	ErrFieldNotBool   = errors.New("must be true, false or null")
	ErrDataNull       = errors.New("must not be null")
	// ErrLoneSurrogate: RFC 8259 §8.2 leaves such a string's meaning open and I-JSON (RFC
	// 7493 §2.1) forbids it; decoding it as U+FFFD would store text nobody sent.
	ErrLoneSurrogate = errors.New("must be UTF-8 text: a lone surrogate escape (\\ud800-\\udfff without its other half) is not a character")
	errEmptyEvent    = errors.New("must not be empty (leave it out or use null for the default \"message\")")
)

// Field names of a batch line.
const (
	batchFieldStream   = "stream"
	batchFieldData     = "data"
	batchFieldEvent    = "event"
	batchFieldAudience = "audience"
	batchFieldEph      = "ephemeral"
)

// JSONSyntaxError is a line that is not the JSON object ParseBatch expects. Offset is
// the 1-based byte in the line where it went wrong.
type JSONSyntaxError struct {
	Offset int
	What   string
}

func (e *JSONSyntaxError) Error() string {
	return "invalid JSON at byte " + strconv.Itoa(e.Offset) + ": " + e.What
}

// ParseBatch parses an NDJSON batch (docs/http.md, Publishing over HTTP: POST /publish, pgsse
// publish --ndjson): one JSON object per line (LF or CRLF),
//
//	{"stream":"orders/42","data":"…","event":"created","audience":["user:7"],"ephemeral":false}
//
// stream (a string) and data are required; event (string or null), audience (array of
// strings or null) and ephemeral (true, false or null) are optional. data is a string,
// whose decoded text is the event's data, or any other JSON value except null, whose
// exact bytes (as written in the line) are the data: {"data":{"total":3}} publishes
// `{"total":3}`. Anything else is an error: unknown or repeated fields, other types, an
// empty event string, a body that is not UTF-8, a string anywhere in a line (data's JSON
// value included) with a lone surrogate escape (ErrLoneSurrogate), blank lines before the
// last event (blank lines after it are ignored), more than MaxBatchEvents events, none at
// all. Each line's stream, event and audience must then follow the name rules
// (names.CheckStream, CheckEvent, CheckAudience), so that a bad name is refused as such
// before any grant is looked at (docs/http.md, Publishing over HTTP). The error is an
// *EventError with the 1-based line and, when it is about a value, the field. Sizes are
// checked by the Publisher.
//
// The events' Data slices point into body when the string had no escapes (so body must
// stay unchanged until the publish is done) and are fresh copies otherwise.
func ParseBatch(body []byte) ([]PublishEvent, error) {
	if !utf8.Valid(body) {
		// Name the first line that is not UTF-8.
		line := 1 + bytes.Count(body[:firstInvalidUTF8(body)], []byte{'\n'})
		return nil, &EventError{Line: line, Err: ErrBatchNotUTF8}
	}
	var events []PublishEvent
	blankAt := 0 // first blank line since the last event, 0 = none
	for lineNo, rest := 1, body; len(rest) > 0; lineNo++ {
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		if isBlank(line) {
			if blankAt == 0 {
				blankAt = lineNo
			}
			continue
		}
		if blankAt != 0 {
			return nil, &EventError{Line: blankAt, Err: ErrBlankLine}
		}
		if len(events) == MaxBatchEvents {
			return nil, &EventError{Line: lineNo, Err: ErrTooManyEvents}
		}
		ev, err := parseBatchLine(line)
		if err != nil {
			err.Line = lineNo
			return nil, err
		}
		events = append(events, ev)
	}
	if len(events) == 0 {
		return nil, &EventError{Err: ErrEmptyRequest}
	}
	return events, nil
}

func firstInvalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return len(b)
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

func isBlank(line []byte) bool {
	for _, c := range line {
		if !isJSONSpace(c) {
			return false
		}
	}
	return true
}

// lineParser reads one line; i is the index of the next byte. surrogate is set when a
// string failed because it holds a lone surrogate escape (not a syntax error).
type lineParser struct {
	s         []byte
	i         int
	surrogate bool
}

func (p *lineParser) syntax(what string) *EventError {
	return &EventError{Err: &JSONSyntaxError{Offset: p.i + 1, What: what}}
}

// failed is the error of a string or value that did not parse: a lone surrogate, or what.
func (p *lineParser) failed(what string) *EventError {
	if p.surrogate {
		return &EventError{Err: ErrLoneSurrogate}
	}
	return p.syntax(what)
}

// eat consumes c when it is the next byte.
func (p *lineParser) eat(c byte) bool {
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}

func (p *lineParser) skipSpace() {
	for p.i < len(p.s) && isJSONSpace(p.s[p.i]) {
		p.i++
	}
}

// parseBatchLine parses one non-blank line into an event.
func parseBatchLine(line []byte) (PublishEvent, *EventError) {
	var ev PublishEvent
	p := lineParser{s: line}
	p.skipSpace()
	if !p.eat('{') {
		return ev, p.syntax("expected '{'")
	}
	var seen [5]bool
	p.skipSpace()
	if !p.eat('}') {
		for {
			p.skipSpace()
			if p.i >= len(p.s) || p.s[p.i] != '"' {
				return ev, p.syntax("expected a field name")
			}
			key, ok := p.str()
			if !ok {
				return ev, p.failed("bad string")
			}
			p.skipSpace()
			if !p.eat(':') {
				return ev, p.syntax("expected ':'")
			}
			p.skipSpace()
			field := -1
			switch string(key) {
			case batchFieldStream:
				field = 0
			case batchFieldData:
				field = 1
			case batchFieldEvent:
				field = 2
			case batchFieldAudience:
				field = 3
			case batchFieldEph:
				field = 4
			default:
				return ev, &EventError{Field: string(key), Err: ErrFieldUnknown}
			}
			if seen[field] {
				return ev, &EventError{Field: string(key), Err: ErrFieldTwice}
			}
			seen[field] = true
			if err := p.value(field, &ev); err != nil {
				err.Field = string(key)
				return ev, err
			}
			p.skipSpace()
			if p.eat(',') {
				continue
			}
			if p.eat('}') {
				break
			}
			return ev, p.syntax("expected ',' or '}'")
		}
	}
	p.skipSpace()
	if p.i != len(p.s) {
		return ev, p.syntax("more after the object (one object per line)")
	}
	if !seen[0] {
		return ev, &EventError{Field: batchFieldStream, Err: ErrFieldMissing}
	}
	if !seen[1] {
		return ev, &EventError{Field: batchFieldData, Err: ErrFieldMissing}
	}
	return ev, ev.checkNameRules()
}

// value parses the value of field (an index into stream, data, event, audience,
// ephemeral) at p.i into ev.
func (p *lineParser) value(field int, ev *PublishEvent) *EventError {
	if p.i >= len(p.s) {
		return p.syntax("expected a value")
	}
	c := p.s[p.i]
	switch field {
	case 0: // stream
		if c != '"' {
			return p.typeError(ErrFieldNotString)
		}
		s, ok := p.str()
		if !ok {
			return p.failed("bad string")
		}
		ev.Stream = string(s)
	case 1: // data
		if c == '"' {
			s, ok := p.str()
			if !ok {
				return p.failed("bad string")
			}
			ev.Data = s
			return nil
		}
		start := p.i
		if !p.skipValue() {
			return p.failed("bad value")
		}
		if string(p.s[start:p.i]) == "null" {
			p.i = start
			return &EventError{Err: ErrDataNull}
		}
		ev.Data = p.s[start:p.i:p.i]
	case 2: // event
		if p.literal("null") {
			return nil
		}
		if c != '"' {
			return p.typeError(ErrFieldNotEvent)
		}
		s, ok := p.str()
		if !ok {
			return p.failed("bad string")
		}
		if len(s) == 0 {
			return &EventError{Err: errEmptyEvent}
		}
		ev.Event = string(s)
	case 3: // audience
		if p.literal("null") {
			return nil
		}
		if c != '[' {
			return p.typeError(ErrFieldNotTags)
		}
		p.i++
		tags := []string{}
		p.skipSpace()
		if p.eat(']') {
			ev.Audience = tags
			return nil
		}
		for {
			p.skipSpace()
			if p.i >= len(p.s) {
				return p.syntax("expected a value")
			}
			if p.s[p.i] != '"' {
				return p.typeError(ErrFieldNotTags)
			}
			s, ok := p.str()
			if !ok {
				return p.failed("bad string")
			}
			tags = append(tags, string(s))
			p.skipSpace()
			if p.eat(',') {
				continue
			}
			if p.eat(']') {
				ev.Audience = tags
				return nil
			}
			return p.syntax("expected ',' or ']'")
		}
	case 4: // ephemeral
		switch {
		case p.literal("true"):
			ev.Ephemeral = true
		case p.literal("false"), p.literal("null"):
		default:
			return p.typeError(ErrFieldNotBool)
		}
	}
	return nil
}

// typeError reports a value of the wrong type, unless the value is not JSON at all.
func (p *lineParser) typeError(err error) *EventError {
	start := p.i
	if !p.skipValue() {
		return p.failed("bad value")
	}
	p.i = start
	return &EventError{Err: err}
}

// literal consumes lit (true, false, null) when it is next.
func (p *lineParser) literal(lit string) bool {
	if len(p.s)-p.i >= len(lit) && string(p.s[p.i:p.i+len(lit)]) == lit {
		p.i += len(lit)
		return true
	}
	return false
}

// str parses the JSON string at p.i (which is '"') and returns its decoded bytes: a view
// into the line when it holds no escapes, else a new slice. A lone surrogate escape fails
// it with p.surrogate set (encoding/json would decode it to U+FFFD).
func (p *lineParser) str() ([]byte, bool) {
	open := p.i
	v, ok := p.strBody()
	if !ok {
		p.i = open // errors point at the string's opening quote
	}
	return v, ok
}

func (p *lineParser) strBody() ([]byte, bool) {
	p.i++
	start := p.i
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '"':
			v := p.s[start:p.i:p.i]
			p.i++
			return v, true
		case c == '\\':
			return p.strEscaped(start)
		case c < 0x20:
			return nil, false
		}
		p.i++
	}
	return nil, false
}

func (p *lineParser) strEscaped(start int) ([]byte, bool) {
	out := make([]byte, 0, p.i-start+16)
	out = append(out, p.s[start:p.i]...)
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '"':
			p.i++
			return out, true
		case c < 0x20:
			return nil, false
		case c != '\\':
			out = append(out, c)
			p.i++
			continue
		}
		if p.i+1 >= len(p.s) {
			return nil, false
		}
		e := p.s[p.i+1]
		p.i += 2
		switch e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := p.hex4()
			if !ok {
				return nil, false
			}
			if utf16.IsSurrogate(r) {
				r, ok = p.lowHalf(r)
				if !ok {
					return nil, false
				}
			}
			out = utf8.AppendRune(out, r)
		default:
			return nil, false
		}
	}
	return nil, false
}

// lowHalf completes the surrogate escape r (just read) with the \\u escape of its low
// half, which must follow at p.i, into the character they spell. Anything else — r a low
// half, no escape after it, an escape that is not a low half — fails with p.surrogate set
// (or as bad syntax when the next escape's hex digits are bad).
func (p *lineParser) lowHalf(r rune) (rune, bool) {
	if r < 0xDC00 && p.i+1 < len(p.s) && p.s[p.i] == '\\' && p.s[p.i+1] == 'u' {
		p.i += 2
		r2, ok := p.hex4()
		if !ok {
			return 0, false
		}
		if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
			return dec, true
		}
	}
	p.surrogate = true
	return 0, false
}

func (p *lineParser) hex4() (rune, bool) {
	if len(p.s)-p.i < 4 {
		return 0, false
	}
	var r rune
	for _, c := range p.s[p.i : p.i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	p.i += 4
	return r, true
}

// skipValue moves past one JSON value of any kind. Containers are tracked on an explicit
// stack, so nesting depth costs memory proportional to the line, never goroutine stack.
func (p *lineParser) skipValue() bool {
	var stack []byte // '{' or '['
	for {
		p.skipSpace()
		if p.i >= len(p.s) {
			return false
		}
		// A value.
		switch c := p.s[p.i]; {
		case c == '{' || c == '[':
			p.i++
			p.skipSpace()
			closer := byte('}')
			if c == '[' {
				closer = ']'
			}
			if p.i < len(p.s) && p.s[p.i] == closer {
				p.i++
				break
			}
			stack = append(stack, c)
			if c == '{' && !p.skipKey() {
				return false
			}
			continue
		case c == '"':
			if _, ok := p.skipStr(); !ok {
				return false
			}
		case c == '-' || (c >= '0' && c <= '9'):
			if !p.number() {
				return false
			}
		case p.literal("true"), p.literal("false"), p.literal("null"):
		default:
			return false
		}
		// After a value: close containers or go to the next element.
		for {
			if len(stack) == 0 {
				return true
			}
			p.skipSpace()
			if p.i >= len(p.s) {
				return false
			}
			top := stack[len(stack)-1]
			c := p.s[p.i]
			if c == ',' {
				p.i++
				if top == '{' && !p.skipKey() {
					return false
				}
				break
			}
			if (top == '{' && c == '}') || (top == '[' && c == ']') {
				p.i++
				stack = stack[:len(stack)-1]
				continue
			}
			return false
		}
	}
}

// skipKey moves past `"key" :` inside an object.
func (p *lineParser) skipKey() bool {
	p.skipSpace()
	if p.i >= len(p.s) || p.s[p.i] != '"' {
		return false
	}
	if _, ok := p.skipStr(); !ok {
		return false
	}
	p.skipSpace()
	return p.eat(':')
}

// skipStr validates the string at p.i without decoding it.
func (p *lineParser) skipStr() (int, bool) {
	start := p.i
	p.i++
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '"':
			p.i++
			return start, true
		case c < 0x20:
			return 0, false
		case c == '\\':
			if p.i+1 >= len(p.s) {
				return 0, false
			}
			switch p.s[p.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				p.i += 2
			case 'u':
				p.i += 2
				r, ok := p.hex4()
				if !ok {
					return 0, false
				}
				if utf16.IsSurrogate(r) {
					if _, ok := p.lowHalf(r); !ok {
						return 0, false
					}
				}
			default:
				return 0, false
			}
			continue
		}
		p.i++
	}
	return 0, false
}

// number moves past a JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (p *lineParser) number() bool {
	if p.s[p.i] == '-' {
		p.i++
	}
	digits := func() int {
		n := 0
		for p.i < len(p.s) && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
			p.i++
			n++
		}
		return n
	}
	if p.eat('0') {
	} else if digits() == 0 {
		return false
	}
	if p.eat('.') {
		if digits() == 0 {
			return false
		}
	}
	if p.i < len(p.s) && (p.s[p.i] == 'e' || p.s[p.i] == 'E') {
		p.i++
		if p.i < len(p.s) && (p.s[p.i] == '+' || p.s[p.i] == '-') {
			p.i++
		}
		if digits() == 0 {
			return false
		}
	}
	return true
}
