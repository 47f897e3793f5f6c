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
		_ = AppendPreflight(b, credCORS, allow)
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
