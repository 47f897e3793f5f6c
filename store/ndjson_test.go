package store

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/names"
)

func TestParseBatch(t *testing.T) {
	ev := func(stream, data, event string, audience []string, eph bool) PublishEvent {
		return PublishEvent{Stream: stream, Data: []byte(data), Event: event, Audience: audience, Ephemeral: eph}
	}
	tests := []struct {
		name string
		body string
		want []PublishEvent
	}{
		{"minimal", `{"stream":"s","data":"d"}`, []PublishEvent{ev("s", "d", "", nil, false)}},
		{"every field", `{"stream":"orders/42","data":"{\"total\":3}","event":"created","audience":["user:7","role:admin"],"ephemeral":false}`,
			[]PublishEvent{ev("orders/42", `{"total":3}`, "created", []string{"user:7", "role:admin"}, false)}},
		{"nulls are absent", `{"stream":"s","data":"d","event":null,"audience":null,"ephemeral":null}`,
			[]PublishEvent{ev("s", "d", "", nil, false)}},
		{"empty audience is everyone", `{"stream":"s","data":"d","audience":[]}`, []PublishEvent{ev("s", "d", "", []string{}, false)}},
		{"ephemeral", `{"ephemeral":true,"data":"","stream":"s"}`, []PublishEvent{ev("s", "", "", nil, true)}},
		{"lines, CRLF, spaces, trailing blank lines", "{\"stream\":\"a\",\"data\":\"1\"}\r\n \t{ \"stream\" : \"b\" , \"data\" : \"2\" } \n\n  \r\n",
			[]PublishEvent{ev("a", "1", "", nil, false), ev("b", "2", "", nil, false)}},
		{"escapes", `{"stream":"s","data":"a\"b\\c\/d\b\f\n\r\t\u00e9\u20ac\ud834\udd1e"}`,
			[]PublishEvent{ev("s", "a\"b\\c/d\b\f\n\r\té€𝄞", "", nil, false)}},
		{"surrogate pairs", `{"stream":"s","data":"\ud834\udd1e\uD83D\uDC18","audience":["\ud83d\udc18"]}`,
			[]PublishEvent{ev("s", "𝄞🐘", "", []string{"🐘"}, false)}},
		{"U+FFFD itself", `{"stream":"s","data":"\ufffd"}`, []PublishEvent{ev("s", "\uFFFD", "", nil, false)}},
		{"an escaped backslash before u", `{"stream":"s","data":"\\ud800"}`, []PublishEvent{ev("s", `\ud800`, "", nil, false)}},
		{"a pair inside a JSON data value", `{"stream":"s","data":["\ud83d\udc18"]}`, []PublishEvent{ev("s", `["\ud83d\udc18"]`, "", nil, false)}},
		{"escaped keys", `{"str\u0065am":"s","data":"d"}`, []PublishEvent{ev("s", "d", "", nil, false)}},
		{"data as JSON: exact bytes", `{"stream":"s","data": {"a": [1, 2.5e3, -0, true, null, "x\n"]} }`,
			[]PublishEvent{ev("s", `{"a": [1, 2.5e3, -0, true, null, "x\n"]}`, "", nil, false)}},
		{"data as number", `{"stream":"s","data":-12.5E+3}`, []PublishEvent{ev("s", "-12.5E+3", "", nil, false)}},
		{"data as false", `{"stream":"s","data":false}`, []PublishEvent{ev("s", "false", "", nil, false)}},
		{"non-ASCII text", `{"stream":"s","data":"héllo 日本"}`, []PublishEvent{ev("s", "héllo 日本", "", nil, false)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseBatch([]byte(tc.body))
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}

	t.Run("data without escapes is a view into the body", func(t *testing.T) {
		body := []byte(`{"stream":"s","data":"abc"}`)
		got, err := ParseBatch(body)
		require.NoError(t, err)
		body[23] = 'X'
		assert.Equal(t, "aXc", string(got[0].Data))
		assert.Equal(t, 3, cap(got[0].Data), "appending to Data must not write into the body")
	})
}

func TestParseBatchErrors(t *testing.T) {
	surrogate := ErrLoneSurrogate.Error()
	over := strings.Repeat(`{"stream":"s","data":"d"}`+"\n", MaxBatchEvents+1)
	tests := []struct {
		name string
		body string
		line int
		msg  string
		err  error
	}{
		{"empty body", "", 0, "a request holds at least one event", ErrEmptyRequest},
		{"only blank lines", "\n \r\n", 0, "a request holds at least one event", ErrEmptyRequest},
		{"blank line inside", "{\"stream\":\"a\",\"data\":\"1\"}\n\n{\"stream\":\"b\",\"data\":\"2\"}", 2,
			"line 2: blank line inside the batch (only trailing blank lines are allowed)", ErrBlankLine},
		{"too many lines", over, 1001, "line 1001: a batch holds at most 1000 events", ErrTooManyEvents},
		{"not UTF-8", "{\"stream\":\"a\",\"data\":\"1\"}\n{\"stream\":\"b\",\"data\":\"\xff\"}", 2, "line 2: the batch must be UTF-8 text", ErrBatchNotUTF8},
		{"missing stream", `{"data":"d"}`, 1, `line 1, field "stream": required`, ErrFieldMissing},
		{"missing data", "{\"stream\":\"a\",\"data\":\"1\"}\n{\"stream\":\"s\"}", 2, `line 2, field "data": required`, ErrFieldMissing},
		{"unknown field", `{"stream":"s","data":"d","evnt":"x"}`, 1, `line 1, field "evnt": unknown field (known: stream, data, event, audience, ephemeral)`, ErrFieldUnknown},
		{"field twice", `{"stream":"s","data":"d","stream":"t"}`, 1, `line 1, field "stream": given twice`, ErrFieldTwice},
		{"data null", `{"stream":"s","data":null}`, 1, `line 1, field "data": must not be null`, ErrDataNull},
		{"stream not a string", `{"stream":7,"data":"d"}`, 1, `line 1, field "stream": must be a string`, ErrFieldNotString},
		{"stream null", `{"stream":null,"data":"d"}`, 1, `line 1, field "stream": must be a string`, ErrFieldNotString},
		{"event not a string", `{"stream":"s","data":"d","event":["x"]}`, 1, `line 1, field "event": must be a string or null`, ErrFieldNotEvent},
		{"empty event", `{"stream":"s","data":"d","event":""}`, 1, `line 1, field "event": must not be empty (leave it out or use null for the default "message")`, errEmptyEvent},
		{"audience a string", `{"stream":"s","data":"d","audience":"u"}`, 1, `line 1, field "audience": must be an array of strings, or null`, ErrFieldNotTags},
		{"audience with a number", `{"stream":"s","data":"d","audience":["u",1]}`, 1, `line 1, field "audience": must be an array of strings, or null`, ErrFieldNotTags},
		{"ephemeral a string", `{"stream":"s","data":"d","ephemeral":"true"}`, 1, `line 1, field "ephemeral": must be true, false or null`, ErrFieldNotBool},
		{"not an object", `["s","d"]`, 1, "line 1: invalid JSON at byte 1: expected '{'", nil},
		{"two objects on a line", `{"stream":"s","data":"d"} {"stream":"t","data":"e"}`, 1, "line 1: invalid JSON at byte 27: more after the object (one object per line)", nil},
		{"trailing comma", `{"stream":"s","data":"d",}`, 1, "line 1: invalid JSON at byte 26: expected a field name", nil},
		{"bad escape", `{"stream":"s","data":"\x"}`, 1, `line 1, field "data": invalid JSON at byte 22: bad string`, nil},
		{"raw control character", "{\"stream\":\"s\",\"data\":\"a\tb\"}", 1, `line 1, field "data": invalid JSON at byte 22: bad string`, nil},
		{"bad number", `{"stream":"s","data":01}`, 1, "line 1: invalid JSON at byte 23: expected ',' or '}'", nil},
		{"bad literal in data", `{"stream":"s","data":[tru]}`, 1, `line 1, field "data": invalid JSON at byte 23: bad value`, nil},
		{"unclosed data object", `{"stream":"s","data":{"a":1}`, 1, "line 1: invalid JSON at byte 29: expected ',' or '}'", nil},
		{"bad value of a typed field", `{"stream":nul,"data":"d"}`, 1, `line 1, field "stream": invalid JSON at byte 11: bad value`, nil},
		{"unterminated", `{"stream":"s`, 1, `line 1, field "stream": invalid JSON at byte 11: bad string`, nil},
		// Name rules, checked on each line (before any grant: docs/http.md).
		{"bad stream name", "{\"stream\":\"a\",\"data\":\"1\"}\n{\"stream\":\"bad name\",\"data\":\"2\"}", 2,
			`line 2, field "stream": stream name may contain only A-Z a-z 0-9 and . _ : @ / = + ~ -`, names.ErrStreamChars},
		{"empty stream name", `{"stream":"","data":"d"}`, 1, `line 1, field "stream": stream name must be 1-200 bytes`, names.ErrStreamLength},
		{"bad event name", `{"stream":"s","data":"d","event":"a/b"}`, 1, `line 1, field "event": event name may contain only A-Z a-z 0-9 and . _ : -`, names.ErrEventChars},
		{"reserved event name", `{"stream":"s","data":"d","event":"pgsse:gap"}`, 1, `line 1, field "event": event names starting with pgsse: are reserved`, names.ErrEventReserved},
		{"bad tag", `{"stream":"s","data":"d","audience":["ok","a\u0000"]}`, 1, `line 1, field "audience": audience tag must not contain control characters`, names.ErrTagControl},
		{"stream name before event name", `{"event":"a b","stream":"a b","data":"d"}`, 1, `line 1, field "stream": stream name may contain only A-Z a-z 0-9 and . _ : @ / = + ~ -`, names.ErrStreamChars},
		// Lone surrogate escapes: not UTF-8 text (they used to become U+FFFD).
		{"lone high surrogate in data", `{"stream":"s","data":"a\ud800b"}`, 1, `line 1, field "data": ` + surrogate, ErrLoneSurrogate},
		{"lone low surrogate in data", `{"stream":"s","data":"\udc00"}`, 1, `line 1, field "data": ` + surrogate, ErrLoneSurrogate},
		{"high surrogate at the end", `{"stream":"s","data":"\ud834"}`, 1, `line 1, field "data": ` + surrogate, ErrLoneSurrogate},
		{"high surrogate before a non-surrogate escape", `{"stream":"s","data":"\ud834\u0041"}`, 1, `line 1, field "data": ` + surrogate, ErrLoneSurrogate},
		{"two high surrogates", `{"stream":"s","data":"\ud834\ud834"}`, 1, `line 1, field "data": ` + surrogate, ErrLoneSurrogate},
		{"reversed pair", `{"stream":"s","data":"\udd1e\ud834"}`, 1, `line 1, field "data": ` + surrogate, ErrLoneSurrogate},
		{"in a stream name", `{"stream":"s\ud800","data":"d"}`, 1, `line 1, field "stream": ` + surrogate, ErrLoneSurrogate},
		{"in an event name", `{"stream":"s","data":"d","event":"\udfff"}`, 1, `line 1, field "event": ` + surrogate, ErrLoneSurrogate},
		{"in a tag", `{"stream":"s","data":"d","audience":["\udfff"]}`, 1, `line 1, field "audience": ` + surrogate, ErrLoneSurrogate},
		{"inside a JSON data value", `{"stream":"s","data":{"k":["\ud83d"]}}`, 1, `line 1, field "data": ` + surrogate, ErrLoneSurrogate},
		{"in a key inside a JSON data value", `{"stream":"s","data":{"\ud83d":1}}`, 1, `line 1, field "data": ` + surrogate, ErrLoneSurrogate},
		{"in a field name", `{"stream":"s","data":"d","\ud800":1}`, 1, "line 1: " + surrogate, ErrLoneSurrogate},
		{"a pair whose second half has bad hex", `{"stream":"s","data":"\ud834\uzzzz"}`, 1, `line 1, field "data": invalid JSON at byte 22: bad string`, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseBatch([]byte(tc.body))
			var ee *EventError
			require.ErrorAs(t, err, &ee)
			assert.Equal(t, tc.line, ee.Line)
			assert.Equal(t, tc.msg, err.Error())
			if tc.err != nil {
				assert.ErrorIs(t, err, tc.err)
			} else {
				var se *JSONSyntaxError
				assert.True(t, errors.As(err, &se), "a JSON syntax error")
			}
		})
	}
}
