package fuzz

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"

	"github.com/pgsse/pgsse/names"
	"github.com/pgsse/pgsse/store"
)

// refEvent is one batch line as the reference parser sees it.
type refEvent struct {
	stream, data, event string
	audience            []string
	hasAudience         bool
	ephemeral           bool
}

var errRefDepth = errors.New("reference: nesting too deep for encoding/json")

// refParseBatch is store.ParseBatch's format (see its doc comment) written with
// encoding/json: a token walk for the object's keys, RawMessage for the values.
func refParseBatch(body string) ([]refEvent, error) {
	if !utf8.ValidString(body) {
		return nil, errors.New("not UTF-8")
	}
	var events []refEvent
	blank := false
	for _, line := range strings.Split(body, "\n") {
		if strings.Trim(line, " \t\r") == "" {
			blank = true
			continue
		}
		if blank {
			return nil, errors.New("blank line inside")
		}
		if len(events) == store.MaxBatchEvents {
			return nil, errors.New("too many")
		}
		ev, err := refParseLine(line)
		if err != nil {
			return nil, err
		}
		events = append(events, ev)
	}
	if len(events) == 0 {
		return nil, errors.New("empty")
	}
	return events, nil
}

func refParseLine(line string) (refEvent, error) {
	var ev refEvent
	if !json.Valid([]byte(line)) {
		var v any
		if err := json.Unmarshal([]byte(line), &v); err != nil && strings.Contains(err.Error(), "exceeded max depth") {
			return ev, errRefDepth
		}
		return ev, errors.New("invalid JSON")
	}
	if !refStringsUTF8(line) {
		return ev, errors.New("a string with a lone surrogate escape")
	}
	dec := json.NewDecoder(strings.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return ev, errors.New("not an object")
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return ev, err
		}
		key := tok.(string)
		if seen[key] {
			return ev, errors.New("twice")
		}
		seen[key] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if strings.Contains(err.Error(), "exceeded max depth") {
				return ev, errRefDepth
			}
			return ev, err
		}
		isString := raw[0] == '"'
		str := func() string {
			var s string
			_ = json.Unmarshal(raw, &s)
			return s
		}
		switch key {
		case "stream":
			if !isString {
				return ev, errors.New("stream type")
			}
			ev.stream = str()
		case "data":
			switch {
			case isString:
				ev.data = str()
			case string(raw) == "null":
				return ev, errors.New("data null")
			default:
				ev.data = string(raw)
			}
		case "event":
			switch {
			case string(raw) == "null":
			case !isString:
				return ev, errors.New("event type")
			case str() == "":
				return ev, errors.New("empty event")
			default:
				ev.event = str()
			}
		case "audience":
			if string(raw) == "null" {
				continue
			}
			var elems []json.RawMessage
			if raw[0] != '[' || json.Unmarshal(raw, &elems) != nil {
				return ev, errors.New("audience type")
			}
			ev.audience, ev.hasAudience = []string{}, true
			for _, e := range elems {
				var s string
				if e[0] != '"' || json.Unmarshal(e, &s) != nil {
					return ev, errors.New("tag type")
				}
				ev.audience = append(ev.audience, s)
			}
		case "ephemeral":
			switch string(raw) {
			case "true":
				ev.ephemeral = true
			case "false", "null":
			default:
				return ev, errors.New("ephemeral type")
			}
		default:
			return ev, errors.New("unknown field")
		}
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return ev, errors.New("unclosed")
	}
	if _, err := dec.Token(); err != io.EOF {
		return ev, errors.New("more after the object")
	}
	if !seen["stream"] || !seen["data"] {
		return ev, errors.New("missing")
	}
	// The name rules (fuzzed against their own references in FuzzNames).
	if names.CheckStream(ev.stream) != nil || ev.event != "" && names.CheckEvent(ev.event) != nil || names.CheckAudience(ev.audience) != nil {
		return ev, errors.New("bad name")
	}
	return ev, nil
}

// refStringsUTF8 reports whether every string literal of the valid JSON text line (keys and
// values, at any depth) spells UTF-8 (refJSONStringUTF8): a lone surrogate escape anywhere
// makes the line invalid.
func refStringsUTF8(line string) bool {
	for i := 0; i < len(line); i++ {
		if line[i] != '"' {
			continue
		}
		j := i + 1
		for line[j] != '"' {
			if line[j] == '\\' {
				j++
			}
			j++
		}
		if !refJSONStringUTF8([]byte(line[i : j+1])) {
			return false
		}
		i = j
	}
	return true
}

func FuzzParseBatch(f *testing.F) {
	for _, s := range []string{
		`{"stream":"orders/42","data":"{\"total\":3}","event":"created","audience":["user:7","role:admin"],"ephemeral":false}`,
		"{\"stream\":\"a\",\"data\":\"1\"}\r\n{\"stream\":\"b\",\"data\":{\"x\":[1,2.5e-3,null]}}\n\n",
		`{"stream":"s","data":"\ud834\udd1e\ud834x\u0000\n"}`,
		`{"stream":"s","data":"\ud834\udd1e\u0000\n"}`,
		`{"stream":"s","data":{"\udd1e":"\ud834\\u0041"}}`,
		`{"stream":"bad name","data":"d"}`,
		`{"stream":"s","data":"d","event":"pgsse:gap","audience":["\u0001"]}`,
		`{"str\u0065am":"s","data":"d","stream":"t"}`,
		`{"stream":"s","data":null}`,
		`{"stream":"s","data":-0.5E+10,"event":null,"audience":[],"ephemeral":true}`,
		"{\"stream\":\"a\",\"data\":\"1\"}\n\n{\"stream\":\"b\",\"data\":\"2\"}",
		`{"stream":"s","data":"d"} {}`,
		`{"stream":"s","data":01}`,
		`{"stream":"s","data":[[[{"a":{}}]]],"audience":["a",1]}`,
		`{"stream":"s","data":"\x"}`,
		"{\"stream\":\"s\",\"data\":\"\xff\"}",
		`{}`,
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		orig := bytes.Clone(body)
		events, err := store.ParseBatch(body)
		if !bytes.Equal(body, orig) {
			t.Fatal("ParseBatch modified its input")
		}
		ref, refErr := refParseBatch(string(body))
		if errors.Is(refErr, errRefDepth) {
			return // deeper than encoding/json goes; ParseBatch has no depth limit of its own
		}
		if (err == nil) != (refErr == nil) {
			t.Fatalf("ParseBatch err=%v, reference err=%v for %q", err, refErr, body)
		}
		if err != nil {
			var ee *store.EventError
			if !errors.As(err, &ee) || ee.Line < 0 || ee.Line > bytes.Count(body, []byte{'\n'})+1 {
				t.Fatalf("error %v does not name a line of the body", err)
			}
			return
		}
		got := make([]refEvent, len(events))
		for i, ev := range events {
			got[i] = refEvent{stream: ev.Stream, data: string(ev.Data), event: ev.Event,
				audience: ev.Audience, hasAudience: ev.Audience != nil, ephemeral: ev.Ephemeral}
		}
		if !assert.Equal(t, ref, got, "%q", body) {
			t.FailNow()
		}
	})
}
