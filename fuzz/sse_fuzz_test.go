package fuzz

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
	"unsafe"

	"github.com/pgsse/pgsse/internal/testkit/ssetest"
	"github.com/pgsse/pgsse/sse"
)

// sseChromiumHead is a real EventSource request head, the main seed.
const sseChromiumHead = "GET /streams/orders%2F42?token=eyJhbGciOiJIUzI1NiJ9.eyJleHAiOjF9.c2ln&since=5 HTTP/1.1\r\n" +
	"Host: events.example.com\r\nConnection: keep-alive\r\nAccept: text/event-stream\r\n" +
	"Cache-Control: no-cache\r\nLast-Event-ID: 41\r\nOrigin: https://app.example.com\r\n" +
	"User-Agent: Mozilla/5.0 Chrome/124.0.0.0\r\nAccept-Encoding: gzip, deflate, br, zstd\r\n" +
	"Accept-Language: en-US,en;q=0.9\r\nCookie: _ga=1; pgsse_token=abc.def.ghi\r\n\r\n"

// ssePublishHead is a service publishing one event on a keep-alive connection.
const ssePublishHead = "POST /streams/orders%2F42?event=order.created&audience=user%3A7 HTTP/1.1\r\n" +
	"Host: events.example.com\r\nContent-Length: 5\r\nAuthorization: Bearer a.b.c\r\n" +
	"Content-Type: text/plain; charset=utf-8\r\n\r\n"

// refEmptyLines is the length of the empty lines (CRLF or LF) before a request line that
// the parser skips, at most sse.MaxEmptyLines of them (RFC 9112 §2.2).
func refEmptyLines(b []byte) int {
	n := 0
	for lines := 0; lines < sse.MaxEmptyLines; lines++ {
		switch {
		case bytes.HasPrefix(b[n:], []byte("\r\n")):
			n += 2
		case bytes.HasPrefix(b[n:], []byte("\n")):
			n++
		default:
			return n
		}
	}
	return n
}

// FuzzParseRequest: arbitrary bytes never panic the parser; an accepted
// head ends at the first CRLFCRLF after the empty lines it may skip, within
// maxHead, its views lie inside the head (or in the parser's scratch, never
// in bytes after the head), every prefix of it is merely incomplete, net/http
// accepts it too (without the empty lines, which net/http's ReadRequest does
// not skip) with the same body framing and keep-alive — except that a body
// on a method we do not implement ends the connection — and the
// stream/channel name and token survive re-encoding.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		sseChromiumHead,
		sseChromiumHead + "GET /pipelined HTTP/1.1\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /channels/jobs%20q HTTP/1.0\r\n\r\n",
		"OPTIONS /streams/a HTTP/1.1\r\nHost: x\r\nOrigin: o\r\nAccess-Control-Request-Method: GET\r\nAccess-Control-Request-Headers: authorization\r\n\r\n",
		"GET /streams/a+b?token=a+b%2B&since=&x HTTP/1.1\r\nHost: [::1]:80\r\nCookie: a=1\r\nCookie: b=2\r\n\r\n",
		"GET /streams/%00 HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /streams/a%zz HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /a#b HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET / HTTP/1.1\nHost: x\n\n",
		"GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",
		"GET / HTTP/1.1\r\nHost : x\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
		"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\rX: y\r\n\r\n",
		"GET / HTTP/2.0\r\nHost: x\r\n\r\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"GET /streams/a?token=1&token=2 HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nX: \x00\r\n\r\n",
		"\r\n\r\n",
		ssePublishHead,
		"POST /publish?token=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Type: application/x-ndjson\r\nExpect: 100-continue\r\n\r\n",
		"POST /streams/a?ephemeral=1&audience=a+b&audience=%E2%82%AC&event=e HTTP/1.0\r\nContent-Length: 3\r\nConnection: keep-alive\r\n\r\n",
		"POST /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
		"POST /streams/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
		"POST /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
		"POST /streams/a HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data\r\nContent-Length: 1\r\n\r\n",
		"\r\nGET /streams/a HTTP/1.1\r\nHost: x\r\n\r\n",
		"\n\r\n\nPOST /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx",
		strings.Repeat("\r\n", 9) + "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"\r\n\rGET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"PUT /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
		"PATCH /streams/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"DELETE /publish HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
		"POST /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nSec-Fetch-Site: cross-site\r\n\r\nx",
		"GET /streams?stream=orders%2F42&stream=a+b&stream=&since=1:17,,4&token=t HTTP/1.1\r\nHost: x\r\nLast-Event-ID: 0:1,2,3\r\n\r\n",
		"GET /streams?stream=a&stream=a&stream%3Dx HTTP/1.1\r\nHost: x\r\n\r\n",
		"HEAD /pgsse.js?v=1 HTTP/1.1\r\nHost: x\r\nIf-None-Match: \"a\", W/\"b\"\r\nif-none-match: *\r\n\r\n",
	} {
		f.Add([]byte(s), uint16(8192))
	}
	f.Add([]byte(sseChromiumHead), uint16(100))
	f.Add([]byte(sseChromiumHead), uint16(len(sseChromiumHead)))

	var p sse.Parser
	f.Fuzz(func(t *testing.T, data []byte, maxHead uint16) {
		limit := int(maxHead)
		if limit == 0 {
			limit = sse.DefaultMaxHead
		}
		lead := refEmptyLines(data)
		end := bytes.Index(data[lead:], []byte("\r\n\r\n"))
		if end >= 0 {
			end += lead
		}
		req, err := p.Parse(data, limit)
		if err != nil {
			if req != nil {
				t.Fatalf("error %v with a request", err)
			}
			var pe *sse.ParseError
			switch {
			case errors.Is(err, sse.ErrIncomplete):
				if end >= 0 || len(data) > limit {
					t.Fatalf("ErrIncomplete with end=%d len=%d limit=%d", end, len(data), limit)
				}
			case errors.Is(err, sse.ErrHeadTooLarge):
				if end >= 0 && end+4 <= limit || end < 0 && len(data) <= limit {
					t.Fatalf("ErrHeadTooLarge with end=%d len=%d limit=%d", end, len(data), limit)
				}
			case errors.As(err, &pe):
				switch pe.Status {
				case 400, 413, 415, 417, 501:
				default:
					t.Fatalf("ParseError with status %d: %+v", pe.Status, pe)
				}
				if pe.Reason == "" || strings.ContainsAny(pe.Reason, "\r\n") {
					t.Fatalf("bad ParseError %+v", pe)
				}
			default:
				t.Fatalf("unexpected error type %T: %v", err, err)
			}
			return
		}

		if req.HeadLen > limit || end < 0 || req.HeadLen != end+4 {
			t.Fatalf("HeadLen %d, end %d, limit %d", req.HeadLen, end, limit)
		}
		head := data[:req.HeadLen]
		views := map[string][]byte{
			"RawMethod": req.RawMethod, "Target": req.Target, "Name": req.Name, "Token": req.Token,
			"Since": req.Since, "LastEventID": req.LastEventID, "Authorization": req.Authorization,
			"Cookie": req.Cookie, "Origin": req.Origin, "Host": req.Host, "ACRMethod": req.ACRMethod,
			"ACRHeaders": req.ACRHeaders, "ContentType": req.ContentType, "Event": req.Event,
			"IfNoneMatch": req.IfNoneMatch,
		}
		for i, a := range req.Audience {
			views["Audience"+strconv.Itoa(i)] = a
		}
		for i, st := range req.Streams {
			views["Streams"+strconv.Itoa(i)] = st
		}
		if len(req.Streams) > sse.MaxStreams || cap(req.Streams) != len(req.Streams) ||
			req.NStreams < len(req.Streams) || req.NStreams > len(req.Streams) && len(req.Streams) < sse.MaxStreams {
			t.Fatalf("stream list of %d (cap %d) for %d parameters", len(req.Streams), cap(req.Streams), req.NStreams)
		}
		if req.Route != sse.RouteStreams && req.NStreams > 0 {
			t.Fatalf("stream parameters on route %v", req.Route)
		}
		if len(req.Audience) > 64 || cap(req.Audience) != len(req.Audience) {
			t.Fatalf("audience list of %d (cap %d)", len(req.Audience), cap(req.Audience))
		}
		if req.Method != sse.MethodPOST && (req.HasEvent || req.Audience != nil || req.Ephemeral) {
			t.Fatalf("a %v with publish parameters: %+v", req.Method, req)
		}
		unreadBody := req.Method != sse.MethodPOST && req.Framing != sse.BodyNone
		if unreadBody && (req.Method != sse.MethodOther || req.KeepAlive) {
			t.Fatalf("a %v with a body it does not read, keep-alive %v: %+v", req.Method, req.KeepAlive, req)
		}
		for name, v := range views {
			if cap(v) != len(v) {
				t.Fatalf("%s has spare capacity %d > %d", name, cap(v), len(v))
			}
			if overlaps(v, data) && !within(v, head) {
				t.Fatalf("%s reaches outside the head", name)
			}
		}
		if req.Route == sse.RouteNone || req.Method == sse.MethodNone {
			t.Fatalf("accepted without route/method: %+v", req)
		}
		if !req.HTTP10 && req.Host == nil {
			t.Fatal("HTTP/1.1 accepted without Host")
		}

		// Copy what later checks need: the next Parse invalidates req.
		route, method, host := req.Route, string(req.RawMethod), string(req.Host)
		name, token := string(req.Name), string(req.Token)
		hasToken := req.Token != nil
		var streams []string
		for _, st := range req.Streams {
			streams = append(streams, string(st))
		}
		framing, contentLength, keepAlive := req.Framing, req.ContentLength, req.KeepAlive

		// Every proper prefix of an accepted head is incomplete, not wrong.
		for _, k := range []int{len(head) - 1, len(head) - 2, len(head) / 2} {
			if _, err := p.Parse(head[:k], limit); !errors.Is(err, sse.ErrIncomplete) {
				t.Fatalf("prefix %d of an accepted head: %v", k, err)
			}
		}

		// A stricter parser accepts a subset of what net/http accepts.
		hr, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head[lead:])))
		if err != nil {
			t.Fatalf("we accepted, net/http refused: %v\n%q", err, head)
		}
		if hr.Method != method || (!strings.EqualFold(hr.Host, host) && host != "") {
			t.Fatalf("net/http read method %q host %q, we read %q %q", hr.Method, hr.Host, method, host)
		}
		// The same body framing.
		chunked := len(hr.TransferEncoding) == 1 && hr.TransferEncoding[0] == "chunked"
		switch framing {
		case sse.BodyChunked:
			if !chunked {
				t.Fatalf("we read chunked, net/http %v", hr.TransferEncoding)
			}
		case sse.BodyLength:
			if chunked || hr.ContentLength != contentLength {
				t.Fatalf("we read Content-Length %d, net/http %d %v", contentLength, hr.ContentLength, hr.TransferEncoding)
			}
		default:
			if chunked || hr.ContentLength > 0 {
				t.Fatalf("we read no body, net/http %d %v", hr.ContentLength, hr.TransferEncoding)
			}
		}
		if keepAlive == hr.Close && !unreadBody {
			t.Fatalf("we read keep-alive %v, net/http close %v", keepAlive, hr.Close)
		}

		// Name and token round-trip through percent-encoding.
		if route == sse.RouteStream || route == sse.RouteChannel {
			prefix := "/streams/"
			if route == sse.RouteChannel {
				prefix = "/channels/"
			}
			target := prefix + ssePctEncode(name)
			if hasToken {
				target += "?token=" + ssePctEncode(token)
			}
			again, err := p.Parse([]byte("GET "+target+" HTTP/1.1\r\nHost: x\r\n\r\n"), 0)
			if err != nil {
				t.Fatalf("re-encoded %q: %v", target, err)
			}
			if again.Route != route || string(again.Name) != name || string(again.Token) != token {
				t.Fatalf("round trip of %q gave route %v name %q token %q", target, again.Route, again.Name, again.Token)
			}
		}
		// So do the stream parameters, in order.
		if route == sse.RouteStreams && len(streams) > 0 {
			target := "/streams?stream=" + ssePctEncode(streams[0])
			for _, st := range streams[1:] {
				target += "&stream=" + ssePctEncode(st)
			}
			again, err := p.Parse([]byte("GET "+target+" HTTP/1.1\r\nHost: x\r\n\r\n"), len(target)+64)
			if err != nil {
				t.Fatalf("re-encoded %q: %v", target, err)
			}
			if again.Route != route || again.NStreams != len(streams) {
				t.Fatalf("round trip of %q gave route %v and %d streams", target, again.Route, again.NStreams)
			}
			for i, st := range again.Streams {
				if string(st) != streams[i] {
					t.Fatalf("round trip of %q: stream %d is %q, not %q", target, i, st, streams[i])
				}
			}
		}
	})
}

// ssePctEncode percent-encodes every byte outside RFC 3986's unreserved set.
func ssePctEncode(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~", c) >= 0 {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// overlaps reports whether v shares memory with buf; within whether v lies
// entirely inside in.
func overlaps(v, buf []byte) bool {
	if len(v) == 0 || len(buf) == 0 {
		return false
	}
	vs, bs := uintptr(unsafe.Pointer(unsafe.SliceData(v))), uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	return vs < bs+uintptr(cap(buf)) && bs < vs+uintptr(len(v))
}

func within(v, in []byte) bool {
	if len(v) == 0 {
		return true
	}
	vs, is := uintptr(unsafe.Pointer(unsafe.SliceData(v))), uintptr(unsafe.Pointer(unsafe.SliceData(in)))
	return vs >= is && vs+uintptr(len(v)) <= is+uintptr(len(in))
}

// sseEvent is one event as a browser's EventSource dispatches it.
type sseEvent struct {
	typ, data, lastID string
}

// sseParse decodes a stream with internal/testkit/ssetest's Decoder: an EventSource parser
// written from the WHATWG HTML standard ("Interpreting an event stream"), independent of
// package sse — lines end in CRLF, LF or CR; a blank line dispatches a block that had data;
// ':' starts a comment; field:value with one optional leading space stripped; data lines are
// joined with LF; an unterminated last line is discarded. It returns the dispatched events
// and every field name it saw, in order.
func sseParse(stream []byte) (events []sseEvent, fields []string) {
	var d ssetest.Decoder
	d.Feed(stream, func(b *ssetest.Block) {
		for _, f := range b.Fields {
			fields = append(fields, string(f.Name))
		}
		if b.HasData {
			typ := string(b.Type)
			if typ == "" {
				typ = "message"
			}
			events = append(events, sseEvent{typ: typ, data: string(b.Data), lastID: string(b.LastEventID)})
		}
	})
	return events, fields
}

// FuzzSSERoundTrip: whatever the id, event name and data, AppendEvent
// produces exactly one event that an EventSource reads back with the same
// data (line breaks normalised to LF), type and id, and no field other than
// one id (only for id >= 1), at most one event, and data lines.
func FuzzSSERoundTrip(f *testing.F) {
	seeds := []struct {
		id          int64
		event, data string
	}{
		{1, "", "hello"},
		{42, "order.updated", `{"a":1}`},
		{0, "", ""},
		{-1, "message", "\n"},
		{7, "", "\r\n\r\n"},
		{7, "", "id: 5"},
		{7, "", "\rretry: 1"},
		{7, "", "data:\n\n"},
		{7, "x", "\n\r\r\n\n"},
		{1<<63 - 1, "e", "a\r\nid: 9\revent: evil\n\nretry: 0\n:comment\n"},
		{3, "", "héllo\n世界 🎉\r"},
		{5, "a\nb", " leading space\n\tTab"},
		{5, " spaced", "\x00nul"},
	}
	for _, s := range seeds {
		f.Add(s.id, []byte(s.event), []byte(s.data))
	}
	f.Fuzz(func(t *testing.T, id int64, event, data []byte) {
		out := sse.AppendEvent([]byte("keep"), id, event, data)
		if string(out[:4]) != "keep" {
			t.Fatal("prefix overwritten")
		}
		out = out[4:]
		if !bytes.HasSuffix(out, []byte("\n\n")) {
			t.Fatalf("event does not end with a blank line: %q", out)
		}
		events, fields := sseParse(out)
		if len(events) != 1 {
			t.Fatalf("%d events from %q", len(events), out)
		}
		ev := events[0]

		wantData := strings.ReplaceAll(strings.ReplaceAll(string(data), "\r\n", "\n"), "\r", "\n")
		if ev.data != wantData {
			t.Fatalf("data %q, want %q", ev.data, wantData)
		}
		wantType := strings.NewReplacer("\r", " ", "\n", " ").Replace(string(event))
		if wantType == "" {
			wantType = "message"
		}
		if ev.typ != wantType {
			t.Fatalf("type %q, want %q", ev.typ, wantType)
		}
		wantID := ""
		if id >= 1 {
			wantID = strconv.FormatInt(id, 10)
		}
		if ev.lastID != wantID {
			t.Fatalf("last event id %q, want %q", ev.lastID, wantID)
		}

		ids, events2 := 0, 0
		for _, name := range fields {
			switch name {
			case "data":
			case "id":
				ids++
			case "event":
				events2++
			default:
				t.Fatalf("field %q appeared in %q", name, out)
			}
		}
		if id >= 1 && ids != 1 || id < 1 && ids != 0 || events2 > 1 {
			t.Fatalf("%d id and %d event fields in %q", ids, events2, out)
		}
	})
}

// FuzzSSEGap: the gap notice is one event of type pgsse:gap with no id whose
// data is valid JSON carrying the stream name (invalid UTF-8 bytes as
// U+FFFD) and both cursors.
func FuzzSSEGap(f *testing.F) {
	f.Add([]byte("orders/42"), int64(5), int64(17))
	f.Add([]byte("a\"b\\c\r\n\u2028\xff"), int64(0), int64(-1))
	f.Add([]byte("\x00\x1f\x7f</script>"), int64(1<<63-1), int64(-1<<63))
	f.Fuzz(func(t *testing.T, stream []byte, after, resume int64) {
		out := sse.AppendGap(nil, stream, after, resume)
		events, fields := sseParse(out)
		if len(events) != 1 || events[0].typ != "pgsse:gap" || events[0].lastID != "" {
			t.Fatalf("events %+v from %q", events, out)
		}
		if len(fields) != 2 || fields[0] != "event" || fields[1] != "data" {
			t.Fatalf("fields %v", fields)
		}
		var v struct {
			Stream *string `json:"stream"`
			After  *int64  `json:"after"`
			Resume *int64  `json:"resume"`
		}
		if err := json.Unmarshal([]byte(events[0].data), &v); err != nil {
			t.Fatalf("gap data %q: %v", events[0].data, err)
		}
		var want strings.Builder
		for s := stream; len(s) > 0; {
			r, n := utf8.DecodeRune(s)
			want.WriteRune(r) // RuneError for each invalid byte
			s = s[n:]
		}
		if v.Stream == nil || *v.Stream != want.String() || v.After == nil || *v.After != after || v.Resume == nil || *v.Resume != resume {
			t.Fatalf("decoded %q as %+v", events[0].data, v)
		}
	})
}
