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
// shedding (SPEC §3) is this head followed by AppendRetry and a close.
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
	if status < 100 || status > 999 {
		status = 500
	}
	dst = appendStatusLine(dst, status)
	dst = append(dst, "Content-Type: text/plain; charset=utf-8\r\nContent-Length: "...)
	dst = strconv.AppendInt(dst, int64(len(reason)+1), 10)
	dst = append(dst, "\r\nCache-Control: no-store\r\n"+
		"X-Content-Type-Options: nosniff\r\n"+
		"Connection: close\r\n"...)
	switch status {
	case 401:
		dst = append(dst, "WWW-Authenticate: "...)
		dst = append(dst, challenge...)
		dst = append(dst, '\r', '\n')
	case 405:
		dst = append(dst, "Allow: GET, OPTIONS\r\n"...)
	}
	dst = appendCORS(dst, cors)
	dst = append(dst, '\r', '\n')
	if body {
		dst = appendFieldValue(dst, reason)
		dst = append(dst, '\n')
	}
	return dst
}

// DefaultAllowHeaders is the preflight's Access-Control-Allow-Headers when
// the caller does not echo the request's own list.
const DefaultAllowHeaders = "Authorization, Last-Event-ID, Cache-Control"

// AppendPreflight appends the 204 answer to a CORS preflight: the CORS
// headers of cors, Access-Control-Allow-Methods: GET, OPTIONS,
// Access-Control-Allow-Headers (allowHeaders, typically the request's
// Access-Control-Request-Headers after ValidHeaderList; DefaultAllowHeaders
// when empty) and Access-Control-Max-Age: 600. A 204 carries no
// Content-Length (RFC 9110 §8.6 forbids it) and no body.
func AppendPreflight(dst []byte, cors CORS, allowHeaders []byte) []byte {
	dst = append(dst, "HTTP/1.1 204 No Content\r\n"...)
	dst = appendCORS(dst, cors)
	dst = append(dst, "Access-Control-Allow-Methods: GET, OPTIONS\r\nAccess-Control-Allow-Headers: "...)
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
	case 408:
		return "Request Timeout"
	case 413:
		return "Content Too Large"
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
