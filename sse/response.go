package sse

import "strconv"

// CORS is what a response says about cross-origin access. The zero value
// writes no CORS headers. Origin is the exact allowed origin echoed back;
// with Credentials it must not be "*" (a "*" origin with Credentials is
// written without Access-Control-Allow-Credentials, which browsers would
// reject anyway).
type CORS struct {
	Origin      []byte
	Credentials bool
}

// AppendStreamHead appends the 200 response head that starts an event
// stream. The body is close-delimited (no Content-Length, no chunked): the
// caller writes raw SSE bytes and ends the response by closing. Load
// shedding (docs/http.md, Responses and errors) is this head followed by AppendRetry and a close.
func AppendStreamHead(dst []byte, cors CORS) []byte {
	dst = append(dst, "HTTP/1.1 200 OK\r\n"+
		"Content-Type: text/event-stream; charset=utf-8\r\n"+
		"Cache-Control: no-cache, no-store\r\n"+
		"X-Accel-Buffering: no\r\n"+
		"Connection: close\r\n"...)
	dst = appendCORS(dst, cors)
	return append(dst, '\r', '\n')
}

// AppendError appends a complete error response: the status line, a
// text/plain body that is reason on one line (CR, LF and other controls
// written as spaces), Content-Length, Cache-Control: no-store and
// Connection: close. 401 adds "WWW-Authenticate: Bearer" (use
// AppendUnauthorized when a token was presented); 405 adds
// "Allow: GET, OPTIONS".
func AppendError(dst []byte, status int, reason string, cors CORS) []byte {
	return appendError(dst, status, reason, cors, "Bearer", true)
}

// AppendErrorHead appends the head AppendError would write, without the
// body: the answer to a HEAD request.
func AppendErrorHead(dst []byte, status int, reason string, cors CORS) []byte {
	return appendError(dst, status, reason, cors, "Bearer", false)
}

// AppendUnauthorized appends a 401 response. When tokenPresented is set (a
// token was sent but is malformed, badly signed or expired) the challenge
// carries error="invalid_token" as RFC 6750 §3.1 asks; otherwise it is the
// bare "Bearer" challenge.
func AppendUnauthorized(dst []byte, reason string, tokenPresented bool, cors CORS) []byte {
	challenge := "Bearer"
	if tokenPresented {
		challenge = `Bearer error="invalid_token"`
	}
	return appendError(dst, 401, reason, cors, challenge, true)
}

func appendError(dst []byte, status int, reason string, cors CORS, challenge string, body bool) []byte {
	return appendText(dst, status, reason, Reply{CORS: cors, Allow: allowGET}, challenge, body)
}

// allowGET is the 405 Allow of AppendError, for the GET-only server that
// predates publishing; AppendReply's default is AllowStream.
const allowGET = "GET, OPTIONS"

// Allow header values for 405 answers (docs/http.md, Responses and errors; Publishing over HTTP).
const (
	AllowStream  = "GET, POST, OPTIONS" // /streams/{stream}
	AllowPublish = "POST, OPTIONS"      // /publish
)

// Reply says how a response that is not an event stream ends and what it
// carries besides its status and body.
//
// KeepAlive is the caller's decision, and is safe only when the request's
// framing was understood and its body has been consumed entirely (decoded,
// or skipped with BodyDecoder.Skip) — never after a head ParseError, a body
// Decode error, or a 413/411 answered before the body was read; then the
// connection must close, and Reply says so with KeepAlive false.
type Reply struct {
	CORS      CORS
	KeepAlive bool   // "Connection: keep-alive" rather than "Connection: close"
	Allow     string // 405: the Allow header; "" means AllowStream
	// RetryAfterSeconds is 503's Retry-After; 503 always carries one (1 when
	// this is not positive), other statuses only when it is positive.
	RetryAfterSeconds int
}

// AppendReply appends a complete text/plain response for status (an error,
// typically): reason on one line as the body (control bytes written as
// spaces), Content-Length, Cache-Control: no-store, Connection as r says,
// "WWW-Authenticate: Bearer" for 401, Allow for 405, Retry-After for 503,
// and r's CORS headers.
func AppendReply(dst []byte, status int, reason string, r Reply) []byte {
	return appendText(dst, status, reason, r, "Bearer", true)
}

// AppendReplyHead appends the head AppendReply would write, without the body: the
// answer to a HEAD request (RFC 9110 §9.3.2).
func AppendReplyHead(dst []byte, status int, reason string, r Reply) []byte {
	return appendText(dst, status, reason, r, "Bearer", false)
}

func appendText(dst []byte, status int, reason string, r Reply, challenge string, body bool) []byte {
	if status < 100 || status > 999 {
		status = 500
	}
	dst = appendStatusLine(dst, status)
	dst = append(dst, "Content-Type: text/plain; charset=utf-8\r\nContent-Length: "...)
	dst = strconv.AppendInt(dst, int64(len(reason)+1), 10)
	dst = append(dst, "\r\nCache-Control: no-store\r\n"+
		"X-Content-Type-Options: nosniff\r\n"...)
	dst = appendConnection(dst, r.KeepAlive)
	switch status {
	case 401:
		dst = append(dst, "WWW-Authenticate: "...)
		dst = append(dst, challenge...)
		dst = append(dst, '\r', '\n')
	case 405:
		dst = append(dst, "Allow: "...)
		if r.Allow == "" {
			dst = append(dst, AllowStream...)
		} else {
			dst = appendFieldValue(dst, r.Allow)
		}
		dst = append(dst, '\r', '\n')
	}
	dst = appendRetryAfter(dst, status, r.RetryAfterSeconds)
	dst = appendCORS(dst, r.CORS)
	dst = append(dst, '\r', '\n')
	if body {
		dst = appendFieldValue(dst, reason)
		dst = append(dst, '\n')
	}
	return dst
}

// AppendJSON appends a complete application/json response: status, body
// (the caller's JSON, e.g. from AppendPublished or AppendPublishedBatch)
// with its Content-Length, Cache-Control: no-store, Connection as r says,
// Retry-After when r asks (or for 503), and r's CORS headers.
func AppendJSON(dst []byte, status int, body []byte, r Reply) []byte {
	if status < 100 || status > 999 {
		status = 500
	}
	dst = appendStatusLine(dst, status)
	dst = append(dst, "Content-Type: application/json\r\nContent-Length: "...)
	dst = strconv.AppendInt(dst, int64(len(body)), 10)
	dst = append(dst, "\r\nCache-Control: no-store\r\n"...)
	dst = appendConnection(dst, r.KeepAlive)
	dst = appendRetryAfter(dst, status, r.RetryAfterSeconds)
	dst = appendCORS(dst, r.CORS)
	dst = append(dst, '\r', '\n')
	return append(dst, body...)
}

// AppendPublished appends the JSON answer to POST /streams/{stream}:
// {"stream":"orders/42","id":17} for a durable event, or
// {"stream":"orders/42"} when id < 1 (an ephemeral one).
func AppendPublished(dst []byte, stream []byte, id int64) []byte {
	dst = append(dst, `{"stream":`...)
	dst = appendJSONString(dst, stream)
	if id >= 1 {
		dst = append(dst, `,"id":`...)
		dst = strconv.AppendInt(dst, id, 10)
	}
	return append(dst, '}')
}

// AppendPublishedBatch appends the JSON answer to POST /publish:
// {"ids":[17,null,18]}, one element per line in line order, null for an id
// < 1 (an ephemeral line).
func AppendPublishedBatch(dst []byte, ids []int64) []byte {
	dst = append(dst, `{"ids":[`...)
	for i, id := range ids {
		if i > 0 {
			dst = append(dst, ',')
		}
		if id >= 1 {
			dst = strconv.AppendInt(dst, id, 10)
		} else {
			dst = append(dst, "null"...)
		}
	}
	return append(dst, "]}"...)
}

// AppendContinue appends the interim "100 Continue" response. pgsse sends
// it to a request with Expect100 once the head has passed every check that
// needs no body (route, token, grant, declared size), so a client that
// waits (curl does, for large bodies) sends its body at once; a request
// refused before its body gets the final status instead, and the
// connection closes.
func AppendContinue(dst []byte) []byte {
	return append(dst, "HTTP/1.1 100 Continue\r\n\r\n"...)
}

func appendConnection(dst []byte, keepAlive bool) []byte {
	if keepAlive {
		return append(dst, "Connection: keep-alive\r\n"...)
	}
	return append(dst, "Connection: close\r\n"...)
}

func appendRetryAfter(dst []byte, status, seconds int) []byte {
	if seconds <= 0 {
		if status != 503 {
			return dst
		}
		seconds = 1
	}
	dst = append(dst, "Retry-After: "...)
	dst = strconv.AppendInt(dst, int64(seconds), 10)
	return append(dst, '\r', '\n')
}

// DefaultAllowHeaders is the preflight's Access-Control-Allow-Headers when
// the caller does not echo the request's own list.
const DefaultAllowHeaders = "Authorization, Last-Event-ID, Cache-Control"

// DefaultPublishAllowHeaders is DefaultAllowHeaders for a preflight that
// asks to POST: a publisher sends Content-Type and Authorization.
const DefaultPublishAllowHeaders = "Authorization, Content-Type, Last-Event-ID, Cache-Control"

// AppendPreflight appends the 204 answer to a CORS preflight: the CORS
// headers of cors, Access-Control-Allow-Methods: GET, OPTIONS,
// Access-Control-Allow-Headers (allowHeaders, typically the request's
// Access-Control-Request-Headers after ValidHeaderList; DefaultAllowHeaders
// when empty) and Access-Control-Max-Age: 600. A 204 carries no
// Content-Length (RFC 9110 §8.6 forbids it) and no body.
func AppendPreflight(dst []byte, cors CORS, allowHeaders []byte) []byte {
	return AppendPreflightMethods(dst, cors, allowHeaders, allowGET)
}

// AppendPreflightMethods is AppendPreflight with the Access-Control-Allow-
// Methods to announce: AllowStream for /streams/ once publishing is served,
// AllowPublish for /publish. A preflight for a POST asks for Content-Type,
// so the caller echoes the request's list (or uses DefaultPublishAllowHeaders).
func AppendPreflightMethods(dst []byte, cors CORS, allowHeaders []byte, methods string) []byte {
	dst = append(dst, "HTTP/1.1 204 No Content\r\n"...)
	dst = appendCORS(dst, cors)
	dst = append(dst, "Access-Control-Allow-Methods: "...)
	dst = appendFieldValue(dst, methods)
	dst = append(dst, "\r\nAccess-Control-Allow-Headers: "...)
	if len(allowHeaders) > 0 {
		dst = appendFieldValue(dst, allowHeaders)
	} else {
		dst = append(dst, DefaultAllowHeaders...)
	}
	return append(dst, "\r\nAccess-Control-Max-Age: 600\r\n"+
		"Connection: close\r\n\r\n"...)
}

// appendCORS appends Access-Control-Allow-Origin, -Allow-Credentials and
// Vary: Origin when cors names an origin.
func appendCORS(dst []byte, cors CORS) []byte {
	if len(cors.Origin) == 0 {
		return dst
	}
	dst = append(dst, "Access-Control-Allow-Origin: "...)
	dst = appendFieldValue(dst, cors.Origin)
	dst = append(dst, '\r', '\n')
	if cors.Credentials && string(cors.Origin) != "*" {
		dst = append(dst, "Access-Control-Allow-Credentials: true\r\n"...)
	}
	return append(dst, "Vary: Origin\r\n"...)
}

// appendFieldValue appends v with every control byte but HTAB written as a
// space, so no value can end a header line or the head early.
func appendFieldValue[T ~string | ~[]byte](dst []byte, v T) []byte {
	start := len(dst)
	dst = append(dst, v...)
	for i := start; i < len(dst); i++ {
		if c := dst[i]; c < 0x20 && c != '\t' || c == 0x7f {
			dst[i] = ' '
		}
	}
	return dst
}

func appendStatusLine(dst []byte, status int) []byte {
	dst = append(dst, "HTTP/1.1 "...)
	dst = strconv.AppendInt(dst, int64(status), 10)
	dst = append(dst, ' ')
	dst = append(dst, StatusText(status)...)
	return append(dst, '\r', '\n')
}

// StatusText is the reason phrase written for status.
func StatusText(status int) string {
	switch status {
	case 100:
		return "Continue"
	case 200:
		return "OK"
	case 204:
		return "No Content"
	case 400:
		return "Bad Request"
	case 401:
		return "Unauthorized"
	case 403:
		return "Forbidden"
	case 404:
		return "Not Found"
	case 405:
		return "Method Not Allowed"
	case 411:
		return "Length Required"
	case 408:
		return "Request Timeout"
	case 413:
		return "Content Too Large"
	case 415:
		return "Unsupported Media Type"
	case 417:
		return "Expectation Failed"
	case 429:
		return "Too Many Requests"
	case 431:
		return "Request Header Fields Too Large"
	case 500:
		return "Internal Server Error"
	case 501:
		return "Not Implemented"
	case 503:
		return "Service Unavailable"
	case 505:
		return "HTTP Version Not Supported"
	}
	switch {
	case status >= 500:
		return "Server Error"
	case status >= 400:
		return "Client Error"
	}
	return "Status"
}
