package sse

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	noCORS   = CORS{}
	withCORS = CORS{Origin: []byte("https://app.example.com")}
	credCORS = CORS{Origin: []byte("https://app.example.com"), Credentials: true}
)

func TestResponseGolden(t *testing.T) {
	const errHead = "Content-Type: text/plain; charset=utf-8\r\n"
	const errTail = "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n"
	const corsCred = "Access-Control-Allow-Origin: https://app.example.com\r\nAccess-Control-Allow-Credentials: true\r\nVary: Origin\r\n"
	const corsPlain = "Access-Control-Allow-Origin: https://app.example.com\r\nVary: Origin\r\n"
	const streamHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nCache-Control: no-cache, no-store\r\nX-Accel-Buffering: no\r\nConnection: close\r\n"
	cases := []struct {
		name string
		got  []byte
		want string
	}{
		{"200 stream, no CORS", AppendStreamHead(nil, noCORS), streamHead + "\r\n"},
		{"200 stream, CORS", AppendStreamHead(nil, withCORS), streamHead + corsPlain + "\r\n"},
		{"200 stream, CORS with credentials", AppendStreamHead(nil, credCORS), streamHead + corsCred + "\r\n"},
		{"200 stream, * never with credentials", AppendStreamHead(nil, CORS{Origin: []byte("*"), Credentials: true}),
			streamHead + "Access-Control-Allow-Origin: *\r\nVary: Origin\r\n\r\n"},
		{"200 shed: head, retry, close", AppendRetry(AppendStreamHead(nil, noCORS), 7321), streamHead + "\r\nretry: 7321\n"},
		{"401 no token", AppendError(nil, 401, "missing token", noCORS),
			"HTTP/1.1 401 Unauthorized\r\n" + errHead + "Content-Length: 14\r\n" + errTail + "WWW-Authenticate: Bearer\r\n\r\nmissing token\n"},
		{"401 bad token", AppendUnauthorized(nil, "token expired", true, credCORS),
			"HTTP/1.1 401 Unauthorized\r\n" + errHead + "Content-Length: 14\r\n" + errTail + "WWW-Authenticate: Bearer error=\"invalid_token\"\r\n" + corsCred + "\r\ntoken expired\n"},
		{"401 via AppendUnauthorized without token", AppendUnauthorized(nil, "missing token", false, noCORS),
			"HTTP/1.1 401 Unauthorized\r\n" + errHead + "Content-Length: 14\r\n" + errTail + "WWW-Authenticate: Bearer\r\n\r\nmissing token\n"},
		{"403", AppendError(nil, 403, "stream not granted", withCORS),
			"HTTP/1.1 403 Forbidden\r\n" + errHead + "Content-Length: 19\r\n" + errTail + corsPlain + "\r\nstream not granted\n"},
		{"400", AppendError(nil, 400, "cursor must be decimal digits", noCORS),
			"HTTP/1.1 400 Bad Request\r\n" + errHead + "Content-Length: 30\r\n" + errTail + "\r\ncursor must be decimal digits\n"},
		{"404", AppendError(nil, 404, "not found", noCORS),
			"HTTP/1.1 404 Not Found\r\n" + errHead + "Content-Length: 10\r\n" + errTail + "\r\nnot found\n"},
		{"405", AppendError(nil, 405, "method not allowed", noCORS),
			"HTTP/1.1 405 Method Not Allowed\r\n" + errHead + "Content-Length: 19\r\n" + errTail + "Allow: GET, OPTIONS\r\n\r\nmethod not allowed\n"},
		{"405 to HEAD has no body", AppendErrorHead(nil, 405, "method not allowed", noCORS),
			"HTTP/1.1 405 Method Not Allowed\r\n" + errHead + "Content-Length: 19\r\n" + errTail + "Allow: GET, OPTIONS\r\n\r\n"},
		{"431", AppendError(nil, 431, ErrHeadTooLarge.Reason, noCORS),
			"HTTP/1.1 431 Request Header Fields Too Large\r\n" + errHead + "Content-Length: 38\r\n" + errTail + "\r\nrequest head is larger than the limit\n"},
		{"reason cannot split the response", AppendError(nil, 400, "a\r\nX-Evil: 1\r\n\r\nb", noCORS),
			"HTTP/1.1 400 Bad Request\r\n" + errHead + "Content-Length: 18\r\n" + errTail + "\r\na  X-Evil: 1    b\n"},
		{"nonsense status", AppendError(nil, 42, "x", noCORS),
			"HTTP/1.1 500 Internal Server Error\r\n" + errHead + "Content-Length: 2\r\n" + errTail + "\r\nx\n"},
		{"204 preflight, default headers", AppendPreflight(nil, credCORS, nil),
			"HTTP/1.1 204 No Content\r\n" + corsCred + "Access-Control-Allow-Methods: GET, OPTIONS\r\nAccess-Control-Allow-Headers: Authorization, Last-Event-ID, Cache-Control\r\nAccess-Control-Max-Age: 600\r\nConnection: close\r\n\r\n"},
		{"204 preflight, echoed headers", AppendPreflight(nil, withCORS, []byte("authorization, last-event-id")),
			"HTTP/1.1 204 No Content\r\n" + corsPlain + "Access-Control-Allow-Methods: GET, OPTIONS\r\nAccess-Control-Allow-Headers: authorization, last-event-id\r\nAccess-Control-Max-Age: 600\r\nConnection: close\r\n\r\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, string(tc.got))
		})
	}
}

func TestPublishResponsesGolden(t *testing.T) {
	const corsPlain = "Access-Control-Allow-Origin: https://app.example.com\r\nVary: Origin\r\n"
	const text = "Content-Type: text/plain; charset=utf-8\r\n"
	const noStore = "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
	keep := Reply{KeepAlive: true}
	cases := []struct {
		name string
		got  []byte
		want string
	}{
		{"durable", AppendJSON(nil, 200, AppendPublished(nil, []byte("orders/42"), 17), Reply{KeepAlive: true, CORS: withCORS}),
			"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 30\r\nCache-Control: no-store\r\nConnection: keep-alive\r\n" +
				corsPlain + "\r\n" + `{"stream":"orders/42","id":17}`},
		{"ephemeral, closing", AppendJSON(nil, 200, AppendPublished(nil, []byte("orders/42"), 0), Reply{}),
			"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 22\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n" +
				`{"stream":"orders/42"}`},
		{"batch", AppendPublishedBatch(nil, []int64{17, 0, 18, -1}), `{"ids":[17,null,18,null]}`},
		{"empty batch", AppendPublishedBatch(nil, nil), `{"ids":[]}`},
		{"stream name escaped", AppendPublished(nil, []byte("a\"b\\"), 1), `{"stream":"a\"b\\","id":1}`},
		{"403 keep-alive", AppendReply(nil, 403, "token does not grant publishing to a", keep),
			"HTTP/1.1 403 Forbidden\r\n" + text + "Content-Length: 37\r\n" + noStore + "Connection: keep-alive\r\n\r\ntoken does not grant publishing to a\n"},
		{"401 keep-alive", AppendReply(nil, 401, "a bearer token is required", keep),
			"HTTP/1.1 401 Unauthorized\r\n" + text + "Content-Length: 27\r\n" + noStore + "Connection: keep-alive\r\nWWW-Authenticate: Bearer\r\n\r\na bearer token is required\n"},
		{"405 on a stream", AppendReply(nil, 405, "method not allowed", Reply{}),
			"HTTP/1.1 405 Method Not Allowed\r\n" + text + "Content-Length: 19\r\n" + noStore + "Connection: close\r\nAllow: GET, POST, OPTIONS\r\n\r\nmethod not allowed\n"},
		{"405 on /publish", AppendReply(nil, 405, "method not allowed", Reply{Allow: AllowPublish}),
			"HTTP/1.1 405 Method Not Allowed\r\n" + text + "Content-Length: 19\r\n" + noStore + "Connection: close\r\nAllow: POST, OPTIONS\r\n\r\nmethod not allowed\n"},
		{"411", AppendReply(nil, 411, errLengthRequired.Reason, Reply{}),
			"HTTP/1.1 411 Length Required\r\n" + text + "Content-Length: 58\r\n" + noStore + "Connection: close\r\n\r\n" + errLengthRequired.Reason + "\n"},
		{"413", AppendReply(nil, 413, "too large", Reply{CORS: withCORS}),
			"HTTP/1.1 413 Content Too Large\r\n" + text + "Content-Length: 10\r\n" + noStore + "Connection: close\r\n" + corsPlain + "\r\ntoo large\n"},
		{"503 with Retry-After", AppendReply(nil, 503, "database unavailable", Reply{RetryAfterSeconds: 5, KeepAlive: true}),
			"HTTP/1.1 503 Service Unavailable\r\n" + text + "Content-Length: 21\r\n" + noStore + "Connection: keep-alive\r\nRetry-After: 5\r\n\r\ndatabase unavailable\n"},
		{"503 always says when", AppendReply(nil, 503, "x", Reply{}),
			"HTTP/1.1 503 Service Unavailable\r\n" + text + "Content-Length: 2\r\n" + noStore + "Connection: close\r\nRetry-After: 1\r\n\r\nx\n"},
		{"100 Continue", AppendContinue(nil), "HTTP/1.1 100 Continue\r\n\r\n"},
		{"preflight for publishing", AppendPreflightMethods(nil, withCORS, nil, AllowStream),
			"HTTP/1.1 204 No Content\r\n" + corsPlain + "Access-Control-Allow-Methods: GET, POST, OPTIONS\r\nAccess-Control-Allow-Headers: Authorization, Last-Event-ID, Cache-Control\r\nAccess-Control-Max-Age: 600\r\nConnection: close\r\n\r\n"},
		{"preflight for /publish", AppendPreflightMethods(nil, withCORS, []byte(DefaultPublishAllowHeaders), AllowPublish),
			"HTTP/1.1 204 No Content\r\n" + corsPlain + "Access-Control-Allow-Methods: POST, OPTIONS\r\nAccess-Control-Allow-Headers: Authorization, Content-Type, Last-Event-ID, Cache-Control\r\nAccess-Control-Max-Age: 600\r\nConnection: close\r\n\r\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, string(tc.got))
		})
	}
}

// A client reads keep-alive answers back to back on one connection.
func TestPublishResponsesReadByNetHTTP(t *testing.T) {
	var wire []byte
	wire = AppendContinue(wire)
	wire = AppendJSON(wire, 200, AppendPublished(nil, []byte("s"), 1), Reply{KeepAlive: true, CORS: credCORS})
	wire = AppendJSON(wire, 200, AppendPublishedBatch(nil, []int64{2, 0, 3}), Reply{KeepAlive: true})
	wire = AppendReply(wire, 403, "not granted", Reply{KeepAlive: true})
	wire = AppendReply(wire, 503, "database unavailable", Reply{RetryAfterSeconds: 2, KeepAlive: true})
	wire = AppendReply(wire, 413, "too large", Reply{})
	want := []struct {
		status int
		body   string
		close  bool
	}{
		{200, `{"stream":"s","id":1}`, false},
		{200, `{"ids":[2,null,3]}`, false},
		{403, "not granted\n", false},
		{503, "database unavailable\n", false},
		{413, "too large\n", true},
	}
	r := bufio.NewReader(bytes.NewReader(wire))
	for i, w := range want {
		resp, err := http.ReadResponse(r, nil)
		require.NoError(t, err)
		if i == 0 {
			require.Equal(t, 100, resp.StatusCode, "the interim answer comes first")
			resp, err = http.ReadResponse(r, nil)
			require.NoError(t, err)
		}
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, w.status, resp.StatusCode)
		assert.Equal(t, w.body, string(body))
		assert.Equal(t, w.close, resp.Close)
		if w.status == 503 {
			assert.Equal(t, "2", resp.Header.Get("Retry-After"))
		}
		if w.status == 200 {
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		}
	}
	_, err := r.ReadByte()
	assert.Equal(t, io.EOF, err, "nothing left over")
}

// Every head is well-formed HTTP/1.1 as another implementation reads it.
func TestResponsesReadByNetHTTP(t *testing.T) {
	cases := []struct {
		b      []byte
		status int
		body   string
	}{
		{AppendStreamHead(nil, credCORS), 200, ""},
		{AppendError(nil, 400, "bad cursor", withCORS), 400, "bad cursor\n"},
		{AppendUnauthorized(nil, "expired", true, noCORS), 401, "expired\n"},
		{AppendError(nil, 403, "no", noCORS), 403, "no\n"},
		{AppendError(nil, 404, "no such path", noCORS), 404, "no such path\n"},
		{AppendError(nil, 405, "GET only", noCORS), 405, "GET only\n"},
		{AppendError(nil, 431, "too big", noCORS), 431, "too big\n"},
		{AppendPreflight(nil, credCORS, nil), 204, ""},
	}
	for _, tc := range cases {
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(tc.b)), nil)
		require.NoError(t, err, "%q", tc.b)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, tc.status, resp.StatusCode)
		assert.Equal(t, tc.body, string(body))
		assert.True(t, resp.Close)
		switch tc.status {
		case 200:
			assert.Equal(t, "text/event-stream; charset=utf-8", resp.Header.Get("Content-Type"))
			assert.Equal(t, "true", resp.Header.Get("Access-Control-Allow-Credentials"))
		case 204:
			assert.Equal(t, "600", resp.Header.Get("Access-Control-Max-Age"))
		case 401:
			assert.Equal(t, `Bearer error="invalid_token"`, resp.Header.Get("WWW-Authenticate"))
		case 405:
			assert.Equal(t, "GET, OPTIONS", resp.Header.Get("Allow"))
		}
	}
}

func TestResponsesDoNotAllocate(t *testing.T) {
	buf := make([]byte, 0, 4096)
	allow := []byte("authorization, last-event-id")
	allocs := testing.AllocsPerRun(100, func() {
		b := AppendStreamHead(buf[:0], credCORS)
		b = AppendError(b, 403, "stream not granted", withCORS)
		b = AppendError(b, 405, "method not allowed", noCORS)
		b = AppendErrorHead(b, 404, "not found", noCORS)
		b = AppendUnauthorized(b, "token expired", true, credCORS)
		b = AppendPreflight(b, credCORS, allow)
		b = AppendReply(b, 503, "database unavailable", Reply{RetryAfterSeconds: 3, KeepAlive: true, CORS: credCORS})
		body := AppendPublishedBatch(b[len(b):], []int64{1, 0, 1 << 62})
		b = AppendJSON(b, 200, body, Reply{KeepAlive: true})
		_ = AppendContinue(b)
	})
	assert.Zero(t, allocs)
}

func BenchmarkAppendStreamHead(b *testing.B) {
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendStreamHead(buf[:0], credCORS)
	}
}

func BenchmarkAppendError(b *testing.B) {
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendUnauthorized(buf[:0], "token expired", true, credCORS)
	}
}
