package sse

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// chromiumHead is what Chromium sends for new EventSource(url, {withCredentials: true}).
const chromiumHead = "GET /streams/orders%2F42?token=eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJleHAiOjE3MDAwMDAwMDAsInBnc3NlIjp7InN0cmVhbXMiOlsib3JkZXJzLzQyIl19fQ.c2lnbmF0dXJlc2lnbmF0dXJlc2lnbmF0dXJl&since=5 HTTP/1.1\r\n" +
	"Host: events.example.com\r\n" +
	"Connection: keep-alive\r\n" +
	"Accept: text/event-stream\r\n" +
	"Cache-Control: no-cache\r\n" +
	"Last-Event-ID: 41\r\n" +
	"Origin: https://app.example.com\r\n" +
	"User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36\r\n" +
	"Accept-Encoding: gzip, deflate, br, zstd\r\n" +
	"Accept-Language: en-US,en;q=0.9\r\n" +
	"Cookie: _ga=GA1.1.123456789.1700000000; pgsse_token=abc.def.ghi; theme=dark\r\n" +
	"\r\n"

func TestParseChromiumHead(t *testing.T) {
	var p Parser
	buf := []byte(chromiumHead + "GET /next HTTP/1.1\r\n") // pipelined bytes are left alone
	req, err := p.Parse(buf, 8192)
	require.NoError(t, err)
	assert.Equal(t, MethodGET, req.Method)
	assert.Equal(t, "GET", string(req.RawMethod))
	assert.Equal(t, RouteStream, req.Route)
	assert.Equal(t, "orders/42", string(req.Name))
	assert.True(t, strings.HasPrefix(string(req.Token), "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9."))
	assert.True(t, req.HasSince)
	assert.Equal(t, "5", string(req.Since))
	assert.True(t, req.HasLastEventID)
	assert.Equal(t, "41", string(req.LastEventID))
	assert.Equal(t, "https://app.example.com", string(req.Origin))
	assert.Equal(t, "events.example.com", string(req.Host))
	assert.Equal(t, "abc.def.ghi", string(CookieValue(req.Cookie, "pgsse_token")))
	assert.Nil(t, req.Authorization)
	assert.False(t, req.HTTP10)
	assert.Equal(t, len(chromiumHead), req.HeadLen)
}

func TestParseAccepts(t *testing.T) {
	cases := []struct {
		name  string
		head  string
		check func(t *testing.T, r *Request)
	}{
		{"root", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, RouteRoot, r.Route)
			assert.Nil(t, r.Name)
		}},
		{"browser client", "GET /pgsse.js?v=1 HTTP/1.1\r\nHost: x\r\nIf-None-Match: \"a\", W/\"b\"\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, RouteScript, r.Route)
			assert.Equal(t, `"a", W/"b"`, string(r.IfNoneMatch))
		}},
		{"browser client path is exact", "GET /pgsse.js/x HTTP/1.1\r\nHost: x\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, RouteOther, r.Route)
			assert.Nil(t, r.IfNoneMatch)
		}},
		{"channel", "GET /channels/jobs%20queue HTTP/1.1\r\nHost: x\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, RouteChannel, r.Route)
			assert.Equal(t, "jobs queue", string(r.Name))
		}},
		{"plus stays plus in path", "GET /streams/a+b HTTP/1.1\r\nHost: x\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, "a+b", string(r.Name))
		}},
		{"plus is space in query, escapes decoded", "GET /streams/s?token=a+b%2Bc%3d&since=%31 HTTP/1.1\r\nHost: x\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, "a b+c=", string(r.Token))
			assert.Equal(t, "1", string(r.Since))
		}},
		{"encoded query key", "GET /streams/s?t%6Fken=k HTTP/1.1\r\nHost: x\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, "k", string(r.Token))
		}},
		{"other params ignored, blank since present", "GET /streams/s?x=1&&since=&tokens=no&y HTTP/1.1\r\nHost: x\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Nil(t, r.Token)
			assert.True(t, r.HasSince)
			assert.Empty(t, r.Since)
		}},
		{"streams without slash is several streams", "GET /streams HTTP/1.1\r\nHost: x\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, RouteStreams, r.Route)
			assert.Empty(t, r.Streams)
			assert.Zero(t, r.NStreams)
		}},
		{"stream parameters in order, plus stays plus", "GET /streams?stream=orders/42&token=t&stream=a+b%2Bc&stream=&since=0:1,,2&stream=chat%2F7 HTTP/1.1\r\nHost: x\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, RouteStreams, r.Route)
			require.Equal(t, 4, r.NStreams)
			var got []string
			for _, s := range r.Streams {
				got = append(got, string(s))
			}
			assert.Equal(t, []string{"orders/42", "a+b+c", "", "chat/7"}, got)
			assert.Equal(t, "0:1,,2", string(r.Since))
			assert.Equal(t, "t", string(r.Token))
		}},
		{"stream parameters only on /streams", "GET /streams/s?stream=x HTTP/1.1\r\nHost: x\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, RouteStream, r.Route)
			assert.Zero(t, r.NStreams)
			assert.Nil(t, r.Streams)
		}},
		{"one stream on /streams", "GET /streams?stream=a HTTP/1.1\r\nHost: x\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, RouteStreams, r.Route)
			assert.Equal(t, 1, r.NStreams)
		}},
		{"empty stream name", "GET /streams/ HTTP/1.1\r\nHost: x\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, RouteStream, r.Route)
			assert.Empty(t, r.Name)
		}},
		{"encoded slash is not a route separator", "GET /streams%2Fx HTTP/1.1\r\nHost: x\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, RouteOther, r.Route)
		}},
		{"HTTP/1.0 needs no Host", "GET /streams/a HTTP/1.0\r\n\r\n", func(t *testing.T, r *Request) {
			assert.True(t, r.HTTP10)
		}},
		{"header names case-insensitive, values trimmed", "GET /streams/a HTTP/1.1\r\nhOsT:x\r\nAUTHORIZATION: \t Bearer t \t\r\nlast-event-id:\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, "x", string(r.Host))
			assert.Equal(t, "Bearer t", string(r.Authorization))
			assert.True(t, r.HasLastEventID)
			assert.Empty(t, r.LastEventID)
		}},
		{"obs-text in value is opaque", "GET /a HTTP/1.1\r\nHost: x\r\nX-Name: caf\xc3\xa9 \xff\r\n\r\n", nil},
		{"other method kept raw", "DELETE /streams/a HTTP/1.1\r\nHost: x\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, MethodOther, r.Method)
			assert.Equal(t, "DELETE", string(r.RawMethod))
		}},
		{"methods are case-sensitive", "get /streams/a HTTP/1.1\r\nHost: x\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, MethodOther, r.Method)
		}},
		{"preflight", "OPTIONS /streams/a HTTP/1.1\r\nHost: x\r\nOrigin: https://a.example\r\nAccess-Control-Request-Method: GET\r\nAccess-Control-Request-Headers: authorization, last-event-id\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, MethodOPTIONS, r.Method)
			assert.Equal(t, "GET", string(r.ACRMethod))
			assert.Equal(t, "authorization, last-event-id", string(r.ACRHeaders))
		}},
		{"HEAD", "HEAD /streams/a HTTP/1.1\r\nHost: x\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, MethodHEAD, r.Method)
		}},
		{"Content-Length zero accepted", "GET /a HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", nil},
		{"split Cookie headers joined", "GET /a HTTP/1.1\r\nHost: x\r\nCookie: a=1\r\nCookie:\r\nCookie: pgsse_token=t\r\nCookie: c=\"q\"\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, "a=1; pgsse_token=t; c=\"q\"", string(r.Cookie))
			assert.Equal(t, "t", string(CookieValue(r.Cookie, "pgsse_token")))
			assert.Equal(t, "q", string(CookieValue(r.Cookie, "c")))
		}},
		{"empty Host and IPv6 Host", "GET /a HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, "[::1]:8080", string(r.Host))
		}},
		{"visible ASCII browsers leave unescaped", "GET /streams/a|b^c[d]?token=`{x}|` HTTP/1.1\r\nHost: x\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, "a|b^c[d]", string(r.Name))
			assert.Equal(t, "`{x}|`", string(r.Token))
		}},
	}
	var p Parser
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, err := p.Parse([]byte(tc.head), 8192)
			require.NoError(t, err)
			assert.Equal(t, len(tc.head), req.HeadLen)
			if tc.check != nil {
				tc.check(t, req)
			}
		})
	}
}

func TestParsePublishHeads(t *testing.T) {
	cases := []struct {
		name  string
		head  string
		check func(t *testing.T, r *Request)
	}{
		{"one event with every parameter", "POST /streams/orders%2F42?event=order.created&audience=user%3A7&token=t&audience=role+admin&ephemeral=1 HTTP/1.1\r\n" +
			"Host: x\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 0005\r\nOrigin: https://a.example\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, MethodPOST, r.Method)
			assert.Equal(t, "POST", r.Method.String())
			assert.Equal(t, RouteStream, r.Route)
			assert.Equal(t, "orders/42", string(r.Name))
			assert.True(t, r.HasEvent)
			assert.Equal(t, "order.created", string(r.Event))
			require.Len(t, r.Audience, 2)
			assert.Equal(t, "user:7", string(r.Audience[0]))
			assert.Equal(t, "role admin", string(r.Audience[1]))
			assert.Equal(t, len(r.Audience), cap(r.Audience), "the audience list cannot be appended to in place")
			assert.True(t, r.Ephemeral)
			assert.Equal(t, "t", string(r.Token))
			assert.Equal(t, BodyLength, r.Framing)
			assert.Equal(t, int64(5), r.ContentLength)
			assert.Equal(t, MediaOther, r.Media)
			assert.Equal(t, "text/plain; charset=utf-8", string(r.ContentType))
			assert.True(t, r.KeepAlive)
			assert.False(t, r.Expect100)
			assert.Equal(t, "https://a.example", string(r.Origin))
		}},
		{"batch, chunked, case-insensitive names", "POST /publish?token=abc HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n" +
			"Content-Type: Application/X-NDJSON;charset=utf-8\r\nExpect: 100-Continue\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, RoutePublish, r.Route)
			assert.Equal(t, "publish", r.Route.String())
			assert.Equal(t, BodyChunked, r.Framing)
			assert.Equal(t, MediaNDJSON, r.Media)
			assert.True(t, r.Expect100)
			assert.Equal(t, "abc", string(r.Token))
		}},
		{"publish with a query-less path only", "POST /publish/ HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, RouteOther, r.Route)
		}},
		{"no framing: parsed, Start says 411", "POST /streams/a HTTP/1.1\r\nHost: x\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, BodyNone, r.Framing)
		}},
		{"ephemeral false, blank event, 64 audiences", "POST /streams/a?ephemeral=false&event=&" + strings.Repeat("audience=t&", 64) + " HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n", func(t *testing.T, r *Request) {
			assert.False(t, r.Ephemeral)
			assert.True(t, r.HasEvent)
			assert.Empty(t, r.Event)
			assert.Len(t, r.Audience, 64)
		}},
		{"Connection: close", "POST /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: Upgrade, CLOSE\r\n\r\n", func(t *testing.T, r *Request) {
			assert.False(t, r.KeepAlive)
		}},
		{"close wins over keep-alive", "POST /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n", func(t *testing.T, r *Request) {
			assert.False(t, r.KeepAlive)
		}},
		{"HTTP/1.0 closes by default and ignores Expect", "POST /streams/a HTTP/1.0\r\nContent-Length: 1\r\nExpect: 100-continue\r\n\r\n", func(t *testing.T, r *Request) {
			assert.False(t, r.KeepAlive)
			assert.False(t, r.Expect100)
		}},
		{"HTTP/1.0 keep-alive on request", "POST /streams/a HTTP/1.0\r\nContent-Length: 1\r\nConnection: Keep-Alive\r\n\r\n", func(t *testing.T, r *Request) {
			assert.True(t, r.KeepAlive)
		}},
		{"a GET ignores publish parameters", "GET /streams/a?event=a&event=b&ephemeral=x&audience=1 HTTP/1.1\r\nHost: x\r\n\r\n", func(t *testing.T, r *Request) {
			assert.False(t, r.HasEvent)
			assert.Nil(t, r.Audience)
			assert.False(t, r.Ephemeral)
			assert.True(t, r.KeepAlive)
			assert.Equal(t, BodyNone, r.Framing)
		}},
		// A method that is not implemented may carry a body: answered (405, 404) without
		// reading it, then closed (issue 23: a PUT with a body on a stream was a 400).
		{"PUT with a body", "PUT /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, MethodOther, r.Method)
			assert.Equal(t, RouteStream, r.Route)
			assert.Equal(t, BodyLength, r.Framing)
			assert.Equal(t, int64(5), r.ContentLength)
			assert.False(t, r.KeepAlive, "a body that is not read ends the connection")
			assert.False(t, r.HasEvent)
		}},
		{"chunked DELETE", "DELETE /streams/a?event=x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, BodyChunked, r.Framing)
			assert.False(t, r.KeepAlive)
			assert.False(t, r.HasEvent, "publish parameters are a POST's")
		}},
		{"PATCH without a body keeps the connection", "PATCH /publish HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, BodyNone, r.Framing)
			assert.True(t, r.KeepAlive)
		}},
		{"Sec-Fetch-Site", "POST /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nSec-Fetch-Site:  cross-site \r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, "cross-site", string(r.SecFetchSite))
			assert.True(t, r.CrossSiteFetch())
		}},
		// RFC 9112 §2.2: empty lines before the request line are skipped, at most MaxEmptyLines.
		{"an empty line before the request line", "\r\nPOST /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, "POST", string(r.RawMethod))
			assert.Equal(t, "a", string(r.Name))
		}},
		{"empty lines up to the bound, CRLF and bare LF", "\n\r\n\n\r\n\r\n\n\n\r\nGET /streams/b HTTP/1.1\r\nHost: x\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, "GET", string(r.RawMethod))
			assert.Equal(t, "b", string(r.Name))
		}},
		{"multipart is only refused where it would be data", "POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Type: multipart/mixed\r\n\r\n", func(t *testing.T, r *Request) {
			assert.Equal(t, MediaMultipart, r.Media)
		}},
	}
	var p Parser
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, err := p.Parse([]byte(tc.head+"NEXT"), 8192)
			require.NoError(t, err)
			assert.Equal(t, len(tc.head), req.HeadLen)
			tc.check(t, req)
		})
	}
}

// Audience views survive the next parameters' decoding and the list is
// rebuilt, not appended to, by the next Parse.
func TestParseAudienceReuse(t *testing.T) {
	var p Parser
	req, err := p.Parse([]byte("POST /streams/a?audience=a%20b&audience=c HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n"), 8192)
	require.NoError(t, err)
	require.Len(t, req.Audience, 2)
	assert.Equal(t, "a b", string(req.Audience[0]))
	req, err = p.Parse([]byte("POST /streams/a?audience=z HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n"), 8192)
	require.NoError(t, err)
	require.Len(t, req.Audience, 1)
	assert.Equal(t, "z", string(req.Audience[0]))
}

// More stream parameters than MaxStreams are counted, not kept; the next head starts afresh.
func TestParseStreamsBoundAndReuse(t *testing.T) {
	var p Parser
	target := "/streams?stream=s0"
	for i := 1; i < MaxStreams+5; i++ {
		target += "&stream=s" + strconv.Itoa(i)
	}
	req, err := p.Parse([]byte("GET "+target+" HTTP/1.1\r\nHost: x\r\n\r\n"), 16384)
	require.NoError(t, err)
	assert.Equal(t, MaxStreams+5, req.NStreams)
	require.Len(t, req.Streams, MaxStreams)
	assert.Equal(t, "s254", string(req.Streams[MaxStreams-1]))
	assert.Equal(t, len(req.Streams), cap(req.Streams))
	req, err = p.Parse([]byte("GET /streams?stream=z HTTP/1.1\r\nHost: x\r\n\r\n"), 8192)
	require.NoError(t, err)
	require.Len(t, req.Streams, 1)
	assert.Equal(t, "z", string(req.Streams[0]))
}

// TestCursor: docs/http.md's precedence (Cursors and gaps), and nothing trimmed away: issue #11
// saw ?since=+1 accepted as cursor 1 because the value was trimmed.
func TestCursor(t *testing.T) {
	cases := []struct {
		name, query, header string
		value, field        string
		ok                  bool
	}{
		{"none", "", "", "", "", false},
		{"since", "?since=5", "", "5", "since", true},
		{"header wins", "?since=5", "Last-Event-ID: 7\r\n", "7", "Last-Event-ID", true},
		{"invalid header does not fall back", "?since=5", "Last-Event-ID: x\r\n", "x", "Last-Event-ID", true},
		{"blank header falls back", "?since=5", "Last-Event-ID:  \r\n", "5", "since", true},
		{"blank since is absent", "?since=", "", "", "", false},
		{"spaces-only since is absent", "?since=+%20%09", "", "", "", false},
		{"+1 is not trimmed", "?since=+1", "", " 1", "since", true},
		{"%201 is not trimmed", "?since=1%20", "", "1 ", "since", true},
	}
	var p Parser
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, err := p.Parse([]byte("GET /streams/a"+tc.query+" HTTP/1.1\r\nHost: x\r\n"+tc.header+"\r\n"), 8192)
			require.NoError(t, err)
			v, field, ok := req.Cursor()
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.value, string(v))
			assert.Equal(t, tc.field, field)
		})
	}
}

func TestParseRejects(t *testing.T) {
	const h = "\r\nHost: x\r\n\r\n"
	cases := []struct {
		name string
		head string
		want *ParseError
	}{
		{"empty request line", "\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\n", errEmptyLines},
		{"one empty line over the bound", strings.Repeat("\r\n", MaxEmptyLines) + "\r\nGET / HTTP/1.1" + h, errEmptyLines},
		{"one bare LF over the bound", strings.Repeat("\n", MaxEmptyLines) + "\nGET / HTTP/1.1" + h, errEmptyLines},
		{"a bare CR after empty lines", "\r\n\rGET / HTTP/1.1" + h, errBareCR},
		{"a bare CR after the bound", strings.Repeat("\r\n", MaxEmptyLines) + "\rGET / HTTP/1.1" + h, errBareCR},
		{"a space line before the request line", "\r\n \r\nGET / HTTP/1.1" + h, errMethod},
		{"method not a token", "G(T / HTTP/1.1" + h, errMethod},
		{"leading space", " GET / HTTP/1.1" + h, errMethod},
		{"HTTP/0.9 style", "GET /\r\nHost: x\r\n\r\n", errRequestLine},
		{"method only", "GET\r\n\r\n", errRequestLine},
		{"double space before target", "GET  / HTTP/1.1" + h, errSpaces},
		{"double space before version", "GET /  HTTP/1.1" + h, errSpaces},
		{"trailing space", "GET / HTTP/1.1 " + h, errSpaces},
		{"tab separator", "GET\t/ HTTP/1.1" + h, errMethod},
		{"asterisk-form", "OPTIONS * HTTP/1.1" + h, errAsteriskForm},
		{"absolute-form", "GET http://x/streams/a HTTP/1.1" + h, errAbsoluteForm},
		{"authority-form", "CONNECT x:443 HTTP/1.1" + h, errAbsoluteForm},
		{"relative target", "GET streams/a HTTP/1.1" + h, errOriginForm},
		{"control byte in target", "GET /a\x01b HTTP/1.1" + h, errTargetByte},
		{"raw non-ASCII in target", "GET /caf\xc3\xa9 HTTP/1.1" + h, errTargetByte},
		{"DEL in target", "GET /a\x7f HTTP/1.1" + h, errTargetByte},
		{"fragment", "GET /streams/a#frag HTTP/1.1" + h, errFragment},
		{"fragment in query", "GET /streams/a?x=1#frag HTTP/1.1" + h, errFragment},
		{"bad escape in path", "GET /streams/a%zz HTTP/1.1" + h, errPathEscape},
		{"truncated escape in path", "GET /streams/a%4 HTTP/1.1" + h, errPathEscape},
		{"escape at path end", "GET /streams/a% HTTP/1.1" + h, errPathEscape},
		{"NUL in path", "GET /streams/a%00b HTTP/1.1" + h, errPathNUL},
		{"bad escape in query", "GET /streams/a?token=%g1 HTTP/1.1" + h, errQueryEscape},
		{"bad escape in ignored param", "GET /streams/a?x=%" + " HTTP/1.1" + h, errQueryEscape},
		{"duplicate token", "GET /streams/a?token=1&token=2 HTTP/1.1" + h, errDupToken},
		{"duplicate since", "GET /streams/a?since=1&since=1 HTTP/1.1" + h, errDupSince},
		{"version lower-case", "GET / http/1.1" + h, errVersionSyntax},
		{"version garbage", "GET / FOO" + h, errVersionSyntax},
		{"version empty", "GET / \r\nHost: x\r\n\r\n", errVersionSyntax},
		{"HTTP/2.0", "GET / HTTP/2.0" + h, errVersion},
		{"HTTP/1.2", "GET / HTTP/1.2" + h, errVersion},
		{"HTTP/1.10", "GET / HTTP/1.10" + h, errVersion},
		{"bare LF in request line", "GET / HTTP/1.1\nHost: x\r\n\r\n", errBareLF},
		{"bare LF after header", "GET / HTTP/1.1\r\nHost: x\nX: y\r\n\r\n", errBareLF},
		{"bare LF ending head", "GET / HTTP/1.1\r\nHost: x\r\n\n\r\n\r\n", errBareLF},
		{"bare CR in request line", "GET / HTTP/1.1\rHost: x\r\n\r\n", errBareCR},
		{"bare CR in method", "GE\rT / HTTP/1.1" + h, errBareCR},
		{"bare CR in target", "GET /a\rb HTTP/1.1" + h, errBareCR},
		{"bare CR in header value", "GET / HTTP/1.1\r\nHost: x\rX: y\r\n\r\n", errBareCR},
		{"bare CR in header name", "GET / HTTP/1.1\r\nHo\rst: x\r\n\r\n", errBareCR},
		{"bare CR at line start", "GET / HTTP/1.1\r\nHost: x\r\n\rX: y\r\n\r\n", errBareCR},
		{"obs-fold SP", "GET / HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n", errObsFold},
		{"obs-fold HTAB", "GET / HTTP/1.1\r\nHost: x\r\nX-A: a\r\n\tb\r\n\r\n", errObsFold},
		{"empty header name", "GET / HTTP/1.1\r\nHost: x\r\n: v\r\n\r\n", errHeaderName},
		{"non-token header name", "GET / HTTP/1.1\r\nHost: x\r\nX(y): v\r\n\r\n", errHeaderName},
		{"space before colon", "GET / HTTP/1.1\r\nHost : x\r\n\r\n", errSpaceColon},
		{"tab before colon", "GET / HTTP/1.1\r\nHost\t: x\r\n\r\n", errSpaceColon},
		{"no colon", "GET / HTTP/1.1\r\nHost x\r\n\r\n", errSpaceColon},
		{"no colon, no space", "GET / HTTP/1.1\r\nHost: x\r\nJunk\r\n\r\n", errNoColon},
		{"NUL in value", "GET / HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n", errHeaderCTL},
		{"DEL in value", "GET / HTTP/1.1\r\nHost: x\r\nX: a\x7fb\r\n\r\n", errHeaderCTL},
		{"ESC in value", "GET / HTTP/1.1\r\nHost: x\r\nX: \x1b[31m\r\n\r\n", errHeaderCTL},
		{"Transfer-Encoding on GET", "GET /streams/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", errBody},
		{"Content-Length non-zero on GET", "GET /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n", errBody},
		{"Content-Length on OPTIONS", "OPTIONS /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n", errBody},
		{"Content-Length on HEAD", "HEAD /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n", errBody},
		{"both lengths on PUT", "PUT /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", errCLAndTE},
		{"duplicate Sec-Fetch-Site", "POST / HTTP/1.1" + h[:len(h)-2] + "Sec-Fetch-Site: same-origin\r\nsec-fetch-site: cross-site\r\n\r\n", errDupFetchSite},
		{"duplicate Content-Length, same value", "POST /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", errDupCL},
		{"conflicting Content-Length", "POST /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\ncontent-length: 6\r\n\r\n", errDupCL},
		{"duplicate zero Content-Length on GET", "GET /a HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n", errDupCL},
		{"Content-Length with sign", "POST /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\n", errContentLength},
		{"Content-Length negative", "POST /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", errContentLength},
		{"Content-Length inner space", "POST /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1 2\r\n\r\n", errContentLength},
		{"Content-Length 19 digits", "POST /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000000000\r\n\r\n", errCLTooLarge},
		{"Content-Length overflowing int64", "POST /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n", errCLTooLarge},
		{"both Content-Length and chunked", "POST /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", errCLAndTE},
		{"both, TE first", "POST /streams/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n", errCLAndTE},
		{"duplicate Transfer-Encoding", "POST /streams/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", errDupTE},
		{"TE gzip then chunked", "POST /streams/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", errTEUnknown},
		{"TE chunked then gzip", "POST /streams/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", errTENotFinal},
		{"TE gzip alone", "POST /streams/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", errTENotFinal},
		{"TE chunked twice", "POST /streams/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", errTENotFinal},
		{"TE chunked with parameter", "POST /streams/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked;q=1\r\n\r\n", errTENotFinal},
		{"TE trailing comma", "POST /streams/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked,\r\n\r\n", errTESyntax},
		{"TE empty", "POST /streams/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n\r\n", errTESyntax},
		{"TE not a token", "POST /streams/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: \"chunked\"\r\n\r\n", errTESyntax},
		{"TE with a space inside", "POST /streams/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chun ked\r\n\r\n", errTESyntax},
		{"TE in HTTP/1.0", "POST /streams/a HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", errTEHTTP10},
		{"duplicate Content-Type", "POST /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Type: text/plain\r\nContent-Type: text/plain\r\n\r\n", errDupCT},
		{"Content-Type without subtype", "POST /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Type: text\r\n\r\n", errContentType},
		{"Content-Type junk after subtype", "POST /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Type: text/plain junk\r\n\r\n", errContentType},
		{"Content-Type empty type", "POST /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Type: /plain\r\n\r\n", errContentType},
		{"multipart to a stream", "POST /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Type: Multipart/Form-Data; boundary=x\r\n\r\n", errMultipart},
		{"publish without Content-Type", "POST /publish HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n", errNotNDJSON},
		{"publish as JSON", "POST /publish HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Type: application/json\r\n\r\n", errNotNDJSON},
		{"Connection not a token list", "POST /streams/a HTTP/1.1\r\nHost: x\r\nConnection: keep alive\r\n\r\n", errConnection},
		{"Expect something else", "POST /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nExpect: 200-ok\r\n\r\n", errExpect},
		{"Expect longer", "POST /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nExpect: 100-continue-please\r\n\r\n", errExpect},
		{"duplicate Expect", "POST /streams/a HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nExpect: 100-continue\r\n\r\n", errDupExpect},
		{"duplicate event", "POST /streams/a?event=a&event=b HTTP/1.1" + h, errDupEvent},
		{"duplicate ephemeral", "POST /streams/a?ephemeral=1&ephemeral=1 HTTP/1.1" + h, errDupEphemeral},
		{"ephemeral yes", "POST /streams/a?ephemeral=yes HTTP/1.1" + h, errEphemeral},
		{"ephemeral blank", "POST /streams/a?ephemeral HTTP/1.1" + h, errEphemeral},
		{"65 audiences", "POST /streams/a?" + strings.Repeat("audience=t&", 65) + " HTTP/1.1" + h, errAudienceMax},
		{"Content-Length garbage", "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0x0\r\n\r\n", errContentLength},
		{"Content-Length empty", "GET / HTTP/1.1\r\nHost: x\r\nContent-Length:\r\n\r\n", errContentLength},
		{"Content-Length list", "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0, 0\r\n\r\n", errContentLength},
		{"missing Host", "GET / HTTP/1.1\r\nAccept: */*\r\n\r\n", errNoHost},
		{"Host with path", "GET / HTTP/1.1\r\nHost: x/y\r\n\r\n", errHost},
		{"Host with space", "GET / HTTP/1.1\r\nHost: x y\r\n\r\n", errHost},
		{"duplicate Host", "GET / HTTP/1.1\r\nHost: x\r\nhost: x\r\n\r\n", errDupHost},
		{"duplicate Authorization", "GET / HTTP/1.1" + h[:len(h)-2] + "Authorization: a\r\nAuthorization: b\r\n\r\n", errDupAuth},
		{"duplicate Last-Event-ID", "GET / HTTP/1.1" + h[:len(h)-2] + "Last-Event-ID: 1\r\nLast-Event-ID: 2\r\n\r\n", errDupLastID},
		{"duplicate Origin", "GET / HTTP/1.1" + h[:len(h)-2] + "Origin: a\r\nOrigin: b\r\n\r\n", errDupOrigin},
		{"duplicate ACR-Method", "OPTIONS / HTTP/1.1" + h[:len(h)-2] + "Access-Control-Request-Method: GET\r\nAccess-Control-Request-Method: GET\r\n\r\n", errDupACRMethod},
		{"duplicate ACR-Headers", "OPTIONS / HTTP/1.1" + h[:len(h)-2] + "Access-Control-Request-Headers: a\r\nAccess-Control-Request-Headers: b\r\n\r\n", errDupACRHeaders},
	}
	reasons := map[string]string{}
	var p Parser
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, err := p.Parse([]byte(tc.head), 8192)
			assert.Nil(t, req)
			var pe *ParseError
			require.True(t, errors.As(err, &pe), "got %v", err)
			assert.Equal(t, tc.want.Reason, pe.Reason)
			assert.Equal(t, tc.want.Status, pe.Status)
		})
		reasons[tc.want.Reason] = tc.name
	}
	// Every rule in the parser has its own reason and a case above.
	all := []*ParseError{errMethod, errRequestLine, errSpaces, errAsteriskForm, errAbsoluteForm,
		errOriginForm, errTargetByte, errFragment, errPathEscape, errPathNUL, errQueryEscape,
		errDupToken, errDupSince, errVersionSyntax, errVersion, errBareCR, errBareLF, errObsFold,
		errHeaderName, errSpaceColon, errNoColon, errHeaderCTL, errBody, errContentLength,
		errNoHost, errHost, errDupHost, errDupAuth, errDupLastID, errDupOrigin, errDupACRMethod,
		errDupACRHeaders, errDupCL, errCLTooLarge, errDupTE, errTESyntax, errTENotFinal, errTEUnknown,
		errTEHTTP10, errCLAndTE, errDupCT, errContentType, errMultipart, errNotNDJSON, errConnection,
		errDupExpect, errExpect, errDupEvent, errDupEphemeral, errEphemeral, errAudienceMax,
		errEmptyLines, errDupFetchSite}
	distinct := map[string]bool{}
	for _, e := range all {
		assert.False(t, distinct[e.Reason], "reason used twice: %q", e.Reason)
		distinct[e.Reason] = true
		assert.Contains(t, reasons, e.Reason, "no test case for %q", e.Reason)
	}
}

// Invalid bytes are reported as soon as they arrive, without waiting for the
// end of the head (a client speaking bare LF never sends CRLFCRLF).
func TestParseRejectsEarly(t *testing.T) {
	cases := map[string]*ParseError{
		"GET / HTTP/1.1\nHost: x\n\n": errBareLF,
		"GET /a#":                     errFragment,
		"GET / HTTP/2":                errVersion,
		"GET / HTTP/1.1\r\nX : y":     errSpaceColon,
		"GET / HTTP/1.1\r\n x":        errObsFold,
		"GET /a%0 ":                   errPathEscape,
	}
	var p Parser
	for head, want := range cases {
		_, err := p.Parse([]byte(head), 8192)
		assert.Equal(t, want, err, "%q", head)
	}
}

func TestParseIncremental(t *testing.T) {
	var p Parser
	for _, lead := range []string{"", "\r\n", "\n\r\n" + strings.Repeat("\r\n", MaxEmptyLines-2)} {
		head := []byte(lead + chromiumHead)
		for n := 0; n < len(head); n++ {
			_, err := p.Parse(head[:n], 8192)
			require.Equal(t, ErrIncomplete, err, "prefix of %d bytes", n)
		}
		req, err := p.Parse(head, 8192)
		require.NoError(t, err)
		assert.Equal(t, "orders/42", string(req.Name))
		assert.Equal(t, len(head), req.HeadLen)
	}
}

// Empty lines before the request line count against the head's size limit.
func TestParseEmptyLinesCountAgainstTheLimit(t *testing.T) {
	var p Parser
	head := "GET / HTTP/1.1\r\nHost: x\r\n\r\n"
	req, err := p.Parse([]byte(head), len(head))
	require.NoError(t, err)
	assert.Equal(t, len(head), req.HeadLen)
	_, err = p.Parse([]byte("\r\n"+head), len(head))
	assert.Equal(t, ErrHeadTooLarge, err)
	req, err = p.Parse([]byte("\r\n"+head), len(head)+2)
	require.NoError(t, err)
	assert.Equal(t, len(head)+2, req.HeadLen)
}

func TestEmptyLines(t *testing.T) {
	for in, want := range map[string]int{
		"": 0, "GET": 0, "\r": 0, "\r\n": 2, "\n": 1, "\r\nGET": 2, "\n\r\n\rX": 3, " \r\n": 0,
		strings.Repeat("\r\n", MaxEmptyLines+3): 2 * MaxEmptyLines,
		strings.Repeat("\n", MaxEmptyLines+3):   MaxEmptyLines,
	} {
		assert.Equal(t, want, EmptyLines([]byte(in)), "%q", in)
	}
}

// CrossSiteFetch: only what a browser says about another site counts.
func TestCrossSiteFetch(t *testing.T) {
	for v, want := range map[string]bool{"cross-site": true, "Cross-Site": true, "elsewhere": true, "": true,
		"same-origin": false, "same-site": false, "none": false, "NONE": false} {
		r := Request{SecFetchSite: []byte(v)}
		assert.Equal(t, want, r.CrossSiteFetch(), "%q", v)
	}
	assert.False(t, (&Request{}).CrossSiteFetch(), "absent: not a browser")
}

func TestParseHeadTooLarge(t *testing.T) {
	var p Parser
	filler := "X-Filler: " + strings.Repeat("a", 9*1024) + "\r\n"

	// Terminator in the same buffer: still too large.
	_, err := p.Parse([]byte("GET / HTTP/1.1\r\nHost: x\r\n"+filler+"\r\n"), 8192)
	assert.Equal(t, ErrHeadTooLarge, err)

	// No terminator yet, past the limit.
	_, err = p.Parse([]byte("GET / HTTP/1.1\r\nHost: x\r\n"+filler), 8192)
	assert.Equal(t, ErrHeadTooLarge, err)
	var pe *ParseError
	require.True(t, errors.As(err, &pe))
	assert.Equal(t, 431, pe.Status)

	// Exactly at the limit is fine, one byte over is not.
	head := "GET / HTTP/1.1\r\nHost: x\r\nX: "
	head += strings.Repeat("a", 8192-len(head)-4) + "\r\n\r\n"
	require.Len(t, head, 8192)
	_, err = p.Parse([]byte(head), 8192)
	assert.NoError(t, err)
	_, err = p.Parse([]byte(head), 8191)
	assert.Equal(t, ErrHeadTooLarge, err)
	_, err = p.Parse([]byte(head[:8000]), 8000)
	assert.Equal(t, ErrIncomplete, err)
	_, err = p.Parse([]byte(head[:8001]), 8000)
	assert.Equal(t, ErrHeadTooLarge, err)

	// A rule broken within the limit is reported as such, too large or not,
	// so the answer does not depend on how the bytes arrived.
	bad := "GET / HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n" + filler
	_, err = p.Parse([]byte(bad), 8192)
	assert.Equal(t, errHeaderCTL, err)
	_, err = p.Parse([]byte(bad+"\r\n"), 8192)
	assert.Equal(t, errHeaderCTL, err)
	_, err = p.Parse([]byte(bad[:40]), 8192)
	assert.Equal(t, errHeaderCTL, err)
	// A CR at the end of the input waits for its next byte.
	_, err = p.Parse([]byte("GET\r"), 8192)
	assert.Equal(t, ErrIncomplete, err)
	_, err = p.Parse([]byte("GET\rX"), 8192)
	assert.Equal(t, errBareCR, err)
}

func TestViewsHaveNoSpareCapacity(t *testing.T) {
	var p Parser
	buf := []byte("GET /streams/a%2Fb?token=x HTTP/1.1\r\nHost: h\r\nCookie: a=1\r\nCookie: b=2\r\nOrigin: o\r\n\r\nNEXT")
	req, err := p.Parse(buf, 8192)
	require.NoError(t, err)
	for _, v := range [][]byte{req.Name, req.Token, req.Host, req.Cookie, req.Origin, req.Target, req.RawMethod} {
		assert.Equal(t, len(v), cap(v))
	}
	_ = append(req.Origin, "XXXX"...)
	assert.Equal(t, "NEXT", string(buf[len(buf)-4:]))
}

func TestCookieValue(t *testing.T) {
	c := []byte(` a=1;b = 2 ;pgsse_token="tok";empty=; pgsse_token=second; noeq`)
	assert.Equal(t, "1", string(CookieValue(c, "a")))
	assert.Equal(t, "2", string(CookieValue(c, "b")))
	assert.Equal(t, "tok", string(CookieValue(c, "pgsse_token")))
	v := CookieValue(c, "empty")
	assert.NotNil(t, v)
	assert.Empty(t, v)
	assert.Nil(t, CookieValue(c, "missing"))
	assert.Nil(t, CookieValue(c, "noeq"))
	assert.Nil(t, CookieValue(nil, "a"))
	assert.Zero(t, testing.AllocsPerRun(100, func() { _ = CookieValue(c, "pgsse_token") }))
}

func TestValidHeaderList(t *testing.T) {
	assert.True(t, ValidHeaderList([]byte("authorization, last-event-id,cache-control")))
	assert.True(t, ValidHeaderList([]byte("")))
	assert.True(t, ValidHeaderList([]byte("a, ,b")))
	assert.False(t, ValidHeaderList([]byte("a b")))
	assert.False(t, ValidHeaderList([]byte("a;b")))
}

func TestParseDoesNotAllocate(t *testing.T) {
	var p Parser
	heads := [][]byte{
		[]byte(chromiumHead),
		[]byte("GET /streams/a%20b?token=x+y HTTP/1.1\r\nHost: x\r\nCookie: a=1\r\nCookie: b=2\r\n\r\n"),
		[]byte(chromiumHead[:300]),
		[]byte(publishHead),
		[]byte("POST /publish HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Type: application/x-ndjson\r\nConnection: keep-alive\r\n\r\n"),
		[]byte("GET /streams?stream=orders%2F42&stream=chat/7&stream=a+b&since=1:17,4,0 HTTP/1.1\r\nHost: x\r\nLast-Event-ID: 0:17,,4\r\n\r\n"),
	}
	_, _ = p.Parse(heads[0], 8192) // warm-up sizes the scratch
	allocs := testing.AllocsPerRun(200, func() {
		for _, h := range heads {
			_, _ = p.Parse(h, 8192)
		}
	})
	assert.Zero(t, allocs)
}

// publishHead is what a service publishing one event over a keep-alive
// connection sends.
const publishHead = "POST /streams/orders%2F42?event=order.created&audience=user%3A7&audience=role%3Aadmin HTTP/1.1\r\n" +
	"Host: events.example.com\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: 27\r\n" +
	"Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJleHAiOjE3MDAwMDAwMDB9.c2lnbmF0dXJlc2lnbmF0dXJl\r\n" +
	"Content-Type: application/json\r\nAccept-Encoding: gzip\r\n\r\n"

func BenchmarkParsePublishHead(b *testing.B) {
	var p Parser
	head := []byte(publishHead)
	b.SetBytes(int64(len(head)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Parse(head, 8192); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseEventSourceHead(b *testing.B) {
	var p Parser
	head := []byte(chromiumHead)
	b.SetBytes(int64(len(head)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Parse(head, 8192); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseGrowingBuffer is the engine's pattern: Parse after every
// read of a head that arrives in 64-byte pieces.
func BenchmarkParseGrowingBuffer(b *testing.B) {
	var p Parser
	head := []byte(chromiumHead)
	b.SetBytes(int64(len(head)))
	b.ReportAllocs()
	for b.Loop() {
		for n := 64; ; n += 64 {
			if n > len(head) {
				n = len(head)
			}
			if _, err := p.Parse(head[:n], 8192); err == nil {
				break
			}
		}
	}
}
