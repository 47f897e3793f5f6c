package sse

import (
	"bytes"
	"errors"
	"strconv"

	"github.com/pgsse/pgsse/names"
)

// Method is the request method, classified for routing.
type Method uint8

// Methods. Any other token is MethodOther; Request.RawMethod keeps it.
const (
	MethodNone Method = iota
	MethodGET
	MethodHEAD
	MethodOPTIONS
	MethodPOST
	MethodOther
)

func (m Method) String() string {
	switch m {
	case MethodGET:
		return "GET"
	case MethodHEAD:
		return "HEAD"
	case MethodOPTIONS:
		return "OPTIONS"
	case MethodPOST:
		return "POST"
	case MethodOther:
		return "other"
	}
	return "none"
}

// Route is the endpoint a request path selects.
type Route uint8

// Routes. Matching is on the raw (still percent-encoded), case-sensitive
// path: "/streams/…" and "/channels/…" need the trailing slash, the root is
// exactly "/", the batch endpoint exactly "/publish", several streams on
// one connection exactly "/streams", the browser client exactly "/pgsse.js"
// and presence "/presence/…".
const (
	RouteNone     Route = iota
	RouteStream         // /streams/{stream}: GET subscribes, POST publishes one event
	RouteChannel        // /channels/{channel}
	RouteRoot           // "/", the demo page
	RouteOther          // anything else: 404
	RoutePublish        // /publish: POST an NDJSON batch (docs/http.md, Publishing over HTTP)
	RouteStreams        // /streams?stream=…&stream=…: several streams on one connection (docs/http.md)
	RouteScript         // /pgsse.js: the browser client (clients/js), GET or HEAD
	RoutePresence       // /presence/{stream}: who is on a presence stream (docs/http.md, Presence)
)

func (r Route) String() string {
	switch r {
	case RouteStream:
		return "stream"
	case RouteChannel:
		return "channel"
	case RouteRoot:
		return "root"
	case RouteOther:
		return "other"
	case RoutePublish:
		return "publish"
	case RouteStreams:
		return "streams"
	case RouteScript:
		return "script"
	case RoutePresence:
		return "presence"
	}
	return "none"
}

// BodyFraming says how a request body is delimited (RFC 9112 §6.3).
type BodyFraming uint8

// Body framings.
const (
	BodyNone    BodyFraming = iota // neither Content-Length nor Transfer-Encoding: no body
	BodyLength                     // Content-Length: Request.ContentLength bytes
	BodyChunked                    // Transfer-Encoding: chunked
)

// Media classifies a request's Content-Type (type/subtype, ASCII
// case-insensitive, parameters ignored).
type Media uint8

// Media types the publisher tells apart.
const (
	MediaNone      Media = iota // no Content-Type header
	MediaOther                  // any other well-formed media type
	MediaNDJSON                 // application/x-ndjson: the only type POST /publish takes
	MediaMultipart              // multipart/*: never an event's data
)

// Request is a parsed request head. Every byte slice is a view into the
// buffer passed to Parse or into the Parser's scratch; views have no spare
// capacity (appending to one copies) and are valid until the next Parse on
// the same Parser. Values are trimmed of surrounding whitespace; absent
// headers are nil.
type Request struct {
	Method    Method
	RawMethod []byte // the method token as sent, for logs and the 405 decision
	Route     Route
	Target    []byte // the raw request target (path and query)

	// Name is the rest of the path after "/streams/", "/channels/" or "/presence/",
	// percent-decoded ('+' stays '+'). It is not validated here: callers
	// run names.CheckStream / names.CheckChannel on it.
	Name []byte

	// Streams are the ?stream= parameters of RouteStreams, in order: percent-decoded with
	// '+' kept as '+' (as in a path: stream names may hold '+', never a space), at most
	// MaxStreams of them, backed by the Parser; NStreams counts them all, including those
	// beyond MaxStreams. Not validated here: callers run names.CheckStream on each.
	Streams  [][]byte
	NStreams int

	Token    []byte // ?token=, percent-decoded, '+' as space; nil if absent
	Since    []byte // ?since=, percent-decoded, '+' as space
	HasSince bool   // ?since was present, even if blank
	// Presence: ?presence=1 (or true) on a subscription (docs/http.md, Presence); any other
	// value than 1, true, 0 or false is refused (400 naming the parameter).
	Presence       bool
	LastEventID    []byte // Last-Event-ID header
	HasLastEventID bool   // the header was present, even if blank
	Authorization  []byte
	Cookie         []byte // raw Cookie header; several Cookie lines are joined with "; "
	Origin         []byte
	Host           []byte
	ACRMethod      []byte // Access-Control-Request-Method
	ACRHeaders     []byte // Access-Control-Request-Headers
	SecFetchSite   []byte // Sec-Fetch-Site (Fetch Metadata): where a browser says the request comes from
	IfNoneMatch    []byte // If-None-Match (a cache revalidating /pgsse.js); several lines: the last one
	HTTP10         bool   // the request line said HTTP/1.0
	// HeadLen is the bytes of input the head occupied: the empty lines skipped before
	// the request line (RFC 9112 §2.2), the head, and its final CRLFCRLF.
	HeadLen int

	// KeepAlive: the client lets the connection carry another request after
	// this one's response (HTTP/1.1 unless "Connection: close"; HTTP/1.0 only
	// with "Connection: keep-alive"). An event stream ends its connection
	// whatever this says.
	KeepAlive bool
	// Expect100: an HTTP/1.1 request said "Expect: 100-continue" (ignored in
	// HTTP/1.0, as RFC 9110 §10.1.1 requires): the client may wait for
	// AppendContinue before sending its body.
	Expect100 bool

	// Body framing and type. Only a POST's body is ever read. GET, HEAD and
	// OPTIONS with a non-zero Content-Length or a Transfer-Encoding are
	// refused (400). A method this server does not implement (MethodOther)
	// may carry one, so that it is answered as its method and path deserve
	// (405, 404): its Framing says so, KeepAlive is false, and the caller
	// answers without reading the body and closes — nothing in a body that
	// is not parsed can be taken for the next request.
	Framing       BodyFraming
	ContentLength int64  // with BodyLength
	ContentType   []byte // the raw Content-Type value, nil if absent
	Media         Media  // ContentType classified

	// Publish parameters (docs/http.md, Publishing over HTTP), parsed from the query of a POST
	// only, percent-decoded with '+' as space. Not validated here: callers run names.CheckEvent /
	// names.CheckTag on them.
	Event     []byte   // ?event=
	HasEvent  bool     // ?event was present, even if blank
	Audience  [][]byte // ?audience=, in order, at most names.MaxAudience; backed by the Parser
	Ephemeral bool     // ?ephemeral=1 (or true)
}

// ParseError is a request the server must refuse: Status is the HTTP status
// to answer with and Reason the one-line body that says which rule broke.
type ParseError struct {
	Status int
	Reason string
}

func (e *ParseError) Error() string { return e.Reason }

// DefaultMaxHead is the default --max-header-bytes (docs/operations.md, Configuration).
const DefaultMaxHead = 8192

// Cursor returns the replay cursor the client sent and which field it came
// from, applying docs/http.md, Cursors and gaps: Last-Event-ID wins over ?since=; a blank value
// (empty, or only spaces and tabs) counts as absent; an invalid header does
// not fall back to since. value is returned exactly as sent — not trimmed —
// so names.ParseCursor rejects "?since=+1" (" 1" once '+' is decoded) as
// docs/http.md's "decimal digits" demands. field is "Last-Event-ID" or "since",
// for the error message ("since: cursor must be decimal digits"). ok is false
// when there is no cursor: the subscription starts live.
func (r *Request) Cursor() (value []byte, field string, ok bool) {
	if r.HasLastEventID && !blank(r.LastEventID) {
		return r.LastEventID, "Last-Event-ID", true
	}
	if r.HasSince && !blank(r.Since) {
		return r.Since, "since", true
	}
	return nil, "", false
}

func blank(b []byte) bool {
	for _, c := range b {
		if c != ' ' && c != '\t' {
			return false
		}
	}
	return true
}

var (
	// ErrIncomplete means the buffer does not yet hold a whole head and
	// nothing in it so far is invalid: read more and call Parse again.
	ErrIncomplete = errors.New("sse: request head incomplete")

	// ErrHeadTooLarge is returned as soon as more than maxHead bytes have
	// arrived without the end of the head, or a complete head is longer
	// than maxHead.
	ErrHeadTooLarge = &ParseError{Status: 431, Reason: "request head is larger than the limit"}
)

func badRequest(reason string) *ParseError { return &ParseError{Status: 400, Reason: reason} }

// One error per rule; the Reason is the 400 body.
var (
	errMethod        = badRequest("request method must be a token")
	errRequestLine   = badRequest("request line must be METHOD SP request-target SP HTTP-version CRLF")
	errSpaces        = badRequest("request line must separate its parts with single spaces")
	errAsteriskForm  = badRequest("asterisk-form request target (*) is not accepted")
	errAbsoluteForm  = badRequest("absolute-form request target is not accepted: send the path only")
	errOriginForm    = badRequest("request target must be a path starting with /")
	errTargetByte    = badRequest("request target contains a byte that must be percent-encoded")
	errFragment      = badRequest("request target must not contain a fragment (#)")
	errPathEscape    = badRequest("invalid percent-escape in path")
	errPathNUL       = badRequest("path must not contain %00")
	errQueryEscape   = badRequest("invalid percent-escape in query")
	errDupToken      = badRequest("duplicate token query parameter")
	errDupSince      = badRequest("duplicate since query parameter")
	errDupPresence   = badRequest("duplicate presence query parameter")
	errPresence      = badRequest("presence: must be 1, true, 0 or false")
	errVersionSyntax = badRequest("malformed HTTP version")
	errVersion       = badRequest("HTTP version must be HTTP/1.1 or HTTP/1.0")
	errBareCR        = badRequest("bare CR in request head: lines must end in CRLF")
	errBareLF        = badRequest("bare LF in request head: lines must end in CRLF")
	errEmptyLines    = badRequest("more than " + strconv.Itoa(MaxEmptyLines) + " empty lines before the request line")
	errObsFold       = badRequest("obsolete header line folding is not accepted")
	errHeaderName    = badRequest("header name must be a token")
	errSpaceColon    = badRequest("whitespace between header name and colon is not accepted")
	errNoColon       = badRequest("header line must be name: value")
	errHeaderCTL     = badRequest("header value contains a control character")
	errBody          = badRequest("request bodies are accepted only with POST")
	errContentLength = badRequest("invalid Content-Length")
	errNoHost        = badRequest("missing Host header")
	errHost          = badRequest("invalid Host header")
	errDupHost       = badRequest("duplicate Host header")
	errDupAuth       = badRequest("duplicate Authorization header")
	errDupLastID     = badRequest("duplicate Last-Event-ID header")
	errDupOrigin     = badRequest("duplicate Origin header")
	errDupACRMethod  = badRequest("duplicate Access-Control-Request-Method header")
	errDupACRHeaders = badRequest("duplicate Access-Control-Request-Headers header")
	errDupFetchSite  = badRequest("duplicate Sec-Fetch-Site header")

	// Bodies and publishing (docs/http.md, Publishing over HTTP).
	errDupCL        = badRequest("duplicate Content-Length header")
	errCLTooLarge   = &ParseError{Status: 413, Reason: "Content-Length is larger than any body this server accepts"}
	errDupTE        = badRequest("duplicate Transfer-Encoding header")
	errTESyntax     = badRequest("invalid Transfer-Encoding")
	errTENotFinal   = badRequest("Transfer-Encoding must end in chunked, applied once")
	errTEUnknown    = &ParseError{Status: 501, Reason: "Transfer-Encoding: only chunked is implemented"}
	errTEHTTP10     = badRequest("an HTTP/1.0 request must not use Transfer-Encoding")
	errCLAndTE      = badRequest("a request must not have both Content-Length and Transfer-Encoding")
	errDupCT        = badRequest("duplicate Content-Type header")
	errContentType  = badRequest("invalid Content-Type: want type/subtype")
	errMultipart    = &ParseError{Status: 415, Reason: "multipart bodies are not accepted: the body is the event's data"}
	errNotNDJSON    = &ParseError{Status: 415, Reason: "POST /publish needs Content-Type: application/x-ndjson"}
	errConnection   = badRequest("invalid Connection header")
	errDupExpect    = badRequest("duplicate Expect header")
	errExpect       = &ParseError{Status: 417, Reason: "the only expectation supported is Expect: 100-continue"}
	errDupEvent     = badRequest("duplicate event query parameter")
	errDupEphemeral = badRequest("duplicate ephemeral query parameter")
	errEphemeral    = badRequest("ephemeral must be 1, 0, true or false")
	errAudienceMax  = badRequest(names.ErrAudienceCount.Error())
)

// maxCLDigits bounds a Content-Length's significant digits: 10^18−1 still
// fits an int64, and no body that large is ever accepted.
const maxCLDigits = 18

// Parser parses request heads. It is reusable and not safe for concurrent
// use: one per event loop. It owns a scratch buffer for percent-decoded and
// joined values, sized to the largest head seen, so steady-state parsing
// does not allocate.
type Parser struct {
	req      Request
	scratch  []byte
	seen     uint16 // headers seen in this head, for duplicate detection
	cookieS  int    // offset of the joined Cookie value in scratch, -1 if none
	close    bool   // Connection: close
	keep     bool   // Connection: keep-alive
	audience [names.MaxAudience][]byte
	streams  [MaxStreams][]byte
}

// MaxStreams is the most stream parameters a request's Streams holds: the highest
// --max-streams-per-connection there can be.
const MaxStreams = 255

const (
	seenHost uint16 = 1 << iota
	seenAuth
	seenCookie
	seenLastID
	seenOrigin
	seenACRMethod
	seenACRHeaders
	seenCL
	seenTE
	seenCT
	seenExpect
	seenFetchSite
)

// Parser states, one per position in the head's grammar.
const (
	stMethod = iota
	stTarget
	stVersion
	stLineStart
	stName
	stValue
)

var crlfcrlf = []byte("\r\n\r\n")

// MaxEmptyLines bounds the empty lines skipped before a request line. RFC 9112 §2.2 asks a
// server to ignore at least one (a client may end a POST body with an extra CRLF); more
// than a few is no client's mistake.
const MaxEmptyLines = 8

// EmptyLines returns the length of the empty lines (CRLF, or a bare LF) that start buf,
// counting at most MaxEmptyLines of them: where a request line may start. Those bytes
// count against the head's size limit (Request.HeadLen includes them).
func EmptyLines(buf []byte) int {
	i := 0
	for n := 0; n < MaxEmptyLines; n++ {
		switch {
		case i < len(buf) && buf[i] == '\n':
			i++
		case i+1 < len(buf) && buf[i] == '\r' && buf[i+1] == '\n':
			i += 2
		default:
			return i
		}
	}
	return i
}

// Parse parses one request head from the start of buf, after at most MaxEmptyLines empty
// lines (EmptyLines), which it skips; one more is a 400.
//
// It finds the end of the head (the first CRLFCRLF after them) before anything else,
// so calling it on a growing buffer after every read is cheap, and then
// makes one pass over the head. Bytes after the head (a pipelined request)
// are not looked at; Request.HeadLen says where the head ended.
//
// It returns ErrIncomplete when buf holds no whole head yet, nothing in it
// is invalid and len(buf) <= maxHead; ErrHeadTooLarge when more than maxHead
// bytes arrived without the end of the head, or the head is longer than
// maxHead, and its first maxHead bytes break no rule; otherwise, for an
// invalid head, a *ParseError (400, or 413/415/417/501 for the body and
// expectation rules). The first rule broken is reported, whatever else
// follows, so the same bytes give the same answer however they arrived.
// maxHead <= 0 means DefaultMaxHead.
//
// The returned *Request and its views belong to p and are valid until the
// next call to Parse.
func (p *Parser) Parse(buf []byte, maxHead int) (*Request, error) {
	if maxHead <= 0 {
		maxHead = DefaultMaxHead
	}
	p.req = Request{}
	p.seen = 0
	p.cookieS = -1
	p.close, p.keep = false, false
	tooLarge := false
	start := EmptyLines(buf)
	end := bytes.Index(buf[start:], crlfcrlf)
	if end >= 0 {
		end += start
	}
	if end >= 0 && end+4 <= maxHead {
		buf = buf[:end+4]
	} else if end >= 0 || len(buf) > maxHead {
		// Too large — unless a rule is already broken within the first
		// maxHead bytes: that is reported instead, so the answer does not
		// depend on how the bytes arrived.
		tooLarge, buf = true, buf[:maxHead]
	}
	// Decoded and joined values never outgrow the head they come from, so
	// this capacity means appends to scratch never reallocate mid-parse.
	if cap(p.scratch) < len(buf) {
		p.scratch = make([]byte, 0, max(len(buf), min(maxHead, 64<<10)))
	}
	p.scratch = p.scratch[:0]
	err := p.scan(buf, min(start, len(buf)))
	if tooLarge && err == ErrIncomplete {
		err = ErrHeadTooLarge
	}
	if err != nil {
		return nil, err
	}
	return &p.req, nil
}

// scan is the state machine over the head, whose request line starts at
// b[start] (after the empty lines skipped). It returns nil once it has
// consumed the blank line that ends the head, ErrIncomplete if it runs out
// of input first, or the *ParseError of the first rule broken.
func (p *Parser) scan(b []byte, start int) error {
	r := &p.req
	state := stMethod
	mark, nameEnd, valStart, valEnd := 0, 0, 0, 0
	for i := start; i < len(b); i++ {
		switch state {
		case stMethod:
			for i < len(b) && isToken[b[i]] {
				i++
			}
			if i == len(b) {
				return ErrIncomplete
			}
			if c := b[i]; (c == '\r' || c == '\n') && i == start {
				// EmptyLines stopped here: one empty line too many, or a CR alone.
				if err := lineError(b, i, errEmptyLines); err != errBareLF {
					return err
				}
				return errEmptyLines
			} else if c == '\r' || c == '\n' {
				return lineError(b, i, errRequestLine)
			} else if c != ' ' {
				return errMethod
			}
			if i == start {
				return errMethod
			}
			r.RawMethod = b[start:i:i]
			r.Method = methodOf(r.RawMethod)
			mark = i + 1
			state = stTarget

		case stTarget:
			for i < len(b) && isTarget[b[i]] {
				i++
			}
			if i == len(b) {
				return ErrIncomplete
			}
			switch c := b[i]; {
			case c == ' ' && i == mark:
				return errSpaces
			case c == ' ':
				if err := p.target(b[mark:i:i]); err != nil {
					return err
				}
				mark = i + 1
				state = stVersion
			case c == '#':
				return errFragment
			case c == '\r' || c == '\n':
				return lineError(b, i, errRequestLine)
			default:
				return errTargetByte
			}

		case stVersion:
			c := b[i]
			switch {
			case c == '\r':
				if i+1 == len(b) {
					return ErrIncomplete
				}
				if b[i+1] != '\n' {
					return errBareCR
				}
				if err := p.version(b[mark:i]); err != nil {
					return err
				}
				i++
				state = stLineStart
			case c == '\n':
				return errBareLF
			case c == ' ':
				return errSpaces
			case i-mark >= len("HTTP/1.1"):
				return versionError(b[mark:i])
			case i-mark < len("HTTP/1.") && c != "HTTP/1."[i-mark]:
				return versionError(b[mark : i+1])
			}

		case stLineStart:
			c := b[i]
			switch {
			case isToken[c]:
				mark = i
				state = stName
			case c == '\r':
				if i+1 == len(b) {
					return ErrIncomplete
				}
				if b[i+1] != '\n' {
					return errBareCR
				}
				if p.seen&seenHost == 0 && !r.HTTP10 {
					return errNoHost
				}
				r.HeadLen = i + 2
				return p.finish()
			case c == '\n':
				return errBareLF
			case c == ' ' || c == '\t':
				return errObsFold
			default:
				return errHeaderName
			}

		case stName:
			for i < len(b) && isToken[b[i]] {
				i++
			}
			if i == len(b) {
				return ErrIncomplete
			}
			switch c := b[i]; c {
			case ':':
				nameEnd = i
				valStart, valEnd = -1, -1
				state = stValue
			case ' ', '\t':
				return errSpaceColon
			case '\r', '\n':
				return lineError(b, i, errNoColon)
			default:
				return errHeaderName
			}

		case stValue:
			for ; i < len(b); i++ {
				c := b[i]
				if isFieldVChar[c] {
					if valStart < 0 {
						valStart = i
					}
					valEnd = i + 1
					continue
				}
				if c != ' ' && c != '\t' {
					break
				}
			}
			if i == len(b) {
				return ErrIncomplete
			}
			switch b[i] {
			case '\r':
				if i+1 == len(b) {
					return ErrIncomplete
				}
				if b[i+1] != '\n' {
					return errBareCR
				}
				if valStart < 0 {
					valStart, valEnd = i, i
				}
				if err := p.header(b[mark:nameEnd], b[valStart:valEnd:valEnd]); err != nil {
					return err
				}
				i++
				state = stLineStart
			case '\n':
				return errBareLF
			default:
				return errHeaderCTL
			}
		}
	}
	return ErrIncomplete
}

// lineError reports the byte at b[i], which ended a request-line part too
// early: a CR not followed by LF or an LF not preceded by CR is reported as
// such, a proper CRLF as def. A CR still waiting for its next byte is
// ErrIncomplete, so the answer does not depend on where the input was cut.
func lineError(b []byte, i int, def *ParseError) error {
	switch b[i] {
	case '\n':
		return errBareLF
	case '\r':
		if i+1 == len(b) {
			return ErrIncomplete
		}
		if b[i+1] != '\n' {
			return errBareCR
		}
	}
	return def
}

func methodOf(m []byte) Method {
	switch string(m) {
	case "GET":
		return MethodGET
	case "HEAD":
		return MethodHEAD
	case "OPTIONS":
		return MethodOPTIONS
	case "POST":
		return MethodPOST
	}
	return MethodOther
}

// version checks the whole HTTP-version of the request line.
func (p *Parser) version(v []byte) error {
	switch string(v) {
	case "HTTP/1.1":
		return nil
	case "HTTP/1.0":
		p.req.HTTP10 = true
		return nil
	}
	return versionError(v)
}

// versionError tells a well-formed but unsupported version (HTTP/2.0) from
// one that is not an HTTP-version at all.
func versionError(v []byte) error {
	if len(v) > 5 && string(v[:5]) == "HTTP/" {
		return errVersion
	}
	return errVersionSyntax
}

// target parses the request target: origin-form only, the path's escapes
// checked, the route chosen, the name and query decoded.
func (p *Parser) target(t []byte) error {
	r := &p.req
	r.Target = t
	if t[0] != '/' {
		switch {
		case len(t) == 1 && t[0] == '*':
			return errAsteriskForm
		case isAbsoluteForm(t):
			return errAbsoluteForm
		}
		return errOriginForm
	}
	path, query, hasQuery := t, []byte(nil), false
	if q := bytes.IndexByte(t, '?'); q >= 0 {
		path, query, hasQuery = t[:q:q], t[q+1:], true
	}
	if err := checkPathEscapes(path); err != nil {
		return err
	}
	switch {
	case len(path) == 1:
		r.Route = RouteRoot
	case hasPrefix(path, "/streams/"):
		r.Route = RouteStream
		r.Name = p.decode(path[len("/streams/"):], false)
	case hasPrefix(path, "/channels/"):
		r.Route = RouteChannel
		r.Name = p.decode(path[len("/channels/"):], false)
	case hasPrefix(path, "/presence/"):
		r.Route = RoutePresence
		r.Name = p.decode(path[len("/presence/"):], false)
	case string(path) == "/publish":
		r.Route = RoutePublish
	case string(path) == "/streams":
		r.Route = RouteStreams
	case string(path) == "/pgsse.js":
		r.Route = RouteScript
	default:
		r.Route = RouteOther
	}
	if hasQuery {
		return p.query(query)
	}
	return nil
}

// isAbsoluteForm reports whether t starts with a URI scheme and ':'.
func isAbsoluteForm(t []byte) bool {
	if !isAlpha(t[0]) {
		return false
	}
	for _, c := range t[1:] {
		switch {
		case c == ':':
			return true
		case isAlpha(c) || c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.':
		default:
			return false
		}
	}
	return false
}

func isAlpha(c byte) bool { return c|0x20 >= 'a' && c|0x20 <= 'z' }

func hasPrefix(b []byte, prefix string) bool {
	return len(b) >= len(prefix) && string(b[:len(prefix)]) == prefix
}

// checkPathEscapes checks that every '%' in path starts a two-hex-digit
// escape and that none is %00.
func checkPathEscapes(path []byte) error {
	for i := bytes.IndexByte(path, '%'); i >= 0; {
		if i+2 >= len(path) || unhex[path[i+1]] < 0 || unhex[path[i+2]] < 0 {
			return errPathEscape
		}
		if path[i+1] == '0' && path[i+2] == '0' {
			return errPathNUL
		}
		j := bytes.IndexByte(path[i+3:], '%')
		if j < 0 {
			break
		}
		i += 3 + j
	}
	return nil
}

// query walks the '&'-separated parameters, keeping token and since, the
// stream list of RouteStreams, and for a POST event, audience and ephemeral. Every escape in the query must
// be valid, used or not.
func (p *Parser) query(q []byte) error {
	r := &p.req
	haveToken, haveEphemeral, havePresence := false, false, false
	post := r.Method == MethodPOST
	for len(q) > 0 {
		param := q
		if i := bytes.IndexByte(q, '&'); i >= 0 {
			param, q = q[:i], q[i+1:]
		} else {
			q = nil
		}
		if len(param) == 0 {
			continue
		}
		for i := bytes.IndexByte(param, '%'); i >= 0; {
			if i+2 >= len(param) || unhex[param[i+1]] < 0 || unhex[param[i+2]] < 0 {
				return errQueryEscape
			}
			j := bytes.IndexByte(param[i+3:], '%')
			if j < 0 {
				break
			}
			i += 3 + j
		}
		key, value := param, param[len(param):]
		if i := bytes.IndexByte(param, '='); i >= 0 {
			key, value = param[:i], param[i+1:]
		}
		switch {
		case queryKeyIs(key, "token"):
			if haveToken {
				return errDupToken
			}
			haveToken = true
			r.Token = p.decode(value, true)
		case queryKeyIs(key, "since"):
			if r.HasSince {
				return errDupSince
			}
			r.HasSince = true
			r.Since = p.decode(value, true)
		case !post && queryKeyIs(key, "presence"):
			if havePresence {
				return errDupPresence
			}
			havePresence = true
			switch v := p.decode(value, true); string(v) {
			case "1", "true":
				r.Presence = true
			case "0", "false":
			default:
				return errPresence
			}
		case r.Route == RouteStreams && queryKeyIs(key, "stream"):
			if n := r.NStreams; n < len(p.streams) {
				p.streams[n] = p.decode(value, false)
				r.Streams = p.streams[: n+1 : n+1]
			}
			r.NStreams++
		case !post:
		case queryKeyIs(key, "event"):
			if r.HasEvent {
				return errDupEvent
			}
			r.HasEvent = true
			r.Event = p.decode(value, true)
		case queryKeyIs(key, "audience"):
			n := len(r.Audience)
			if n == len(p.audience) {
				return errAudienceMax
			}
			p.audience[n] = p.decode(value, true)
			r.Audience = p.audience[: n+1 : n+1]
		case queryKeyIs(key, "ephemeral"):
			if haveEphemeral {
				return errDupEphemeral
			}
			haveEphemeral = true
			switch v := p.decode(value, true); string(v) {
			case "1", "true":
				r.Ephemeral = true
			case "0", "false":
			default:
				return errEphemeral
			}
		}
	}
	return nil
}

// queryKeyIs reports whether the raw, already-validated query key decodes
// to want, without decoding it anywhere.
func queryKeyIs(key []byte, want string) bool {
	j := 0
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch c {
		case '%':
			c = byte(unhex[key[i+1]]<<4 | unhex[key[i+2]])
			i += 2
		case '+':
			c = ' '
		}
		if j == len(want) || want[j] != c {
			return false
		}
		j++
	}
	return j == len(want)
}

// decode returns the percent-decoded raw value (with '+' as space when
// plus is set): raw itself when it has nothing to decode, else a copy in
// scratch. raw's escapes have been validated.
func (p *Parser) decode(raw []byte, plus bool) []byte {
	if bytes.IndexByte(raw, '%') < 0 && (!plus || bytes.IndexByte(raw, '+') < 0) {
		return raw[:len(raw):len(raw)]
	}
	start := len(p.scratch)
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case c == '%':
			c = byte(unhex[raw[i+1]]<<4 | unhex[raw[i+2]])
			i += 2
		case c == '+' && plus:
			c = ' '
		}
		p.scratch = append(p.scratch, c)
	}
	return p.scratch[start:len(p.scratch):len(p.scratch)]
}

// header handles one header line: name is a token, value is trimmed and
// free of control characters other than HTAB.
func (p *Parser) header(name, value []byte) error {
	r := &p.req
	switch len(name) {
	case 4:
		if foldEq(name, "host") {
			if err := p.once(seenHost, errDupHost); err != nil {
				return err
			}
			for _, c := range value {
				if !isHost[c] {
					return errHost
				}
			}
			r.Host = value
		}
	case 6:
		switch {
		case foldEq(name, "expect"):
			if err := p.once(seenExpect, errDupExpect); err != nil {
				return err
			}
			if !equalFold(value, "100-continue") {
				return errExpect
			}
			r.Expect100 = !r.HTTP10
		case foldEq(name, "cookie"):
			p.cookie(value)
		case foldEq(name, "origin"):
			if err := p.once(seenOrigin, errDupOrigin); err != nil {
				return err
			}
			r.Origin = value
		}
	case 13:
		switch {
		case foldEq(name, "authorization"):
			if err := p.once(seenAuth, errDupAuth); err != nil {
				return err
			}
			r.Authorization = value
		case foldEq(name, "last-event-id"):
			if err := p.once(seenLastID, errDupLastID); err != nil {
				return err
			}
			r.LastEventID, r.HasLastEventID = value, true
		case foldEq(name, "if-none-match"):
			r.IfNoneMatch = value
		}
	case 10:
		if foldEq(name, "connection") {
			return p.connection(value)
		}
	case 12:
		if foldEq(name, "content-type") {
			if err := p.once(seenCT, errDupCT); err != nil {
				return err
			}
			m, ok := mediaOf(value)
			if !ok {
				return errContentType
			}
			r.ContentType, r.Media = value, m
		}
	case 14:
		switch {
		case foldEq(name, "content-length"):
			if err := p.once(seenCL, errDupCL); err != nil {
				return err
			}
			return p.contentLength(value)
		case foldEq(name, "sec-fetch-site"):
			if err := p.once(seenFetchSite, errDupFetchSite); err != nil {
				return err
			}
			r.SecFetchSite = value
		}
	case 17:
		if foldEq(name, "transfer-encoding") {
			if err := p.once(seenTE, errDupTE); err != nil {
				return err
			}
			return transferEncoding(value)
		}
	case 29:
		if foldEq(name, "access-control-request-method") {
			if err := p.once(seenACRMethod, errDupACRMethod); err != nil {
				return err
			}
			r.ACRMethod = value
		}
	case 30:
		if foldEq(name, "access-control-request-headers") {
			if err := p.once(seenACRHeaders, errDupACRHeaders); err != nil {
				return err
			}
			r.ACRHeaders = value
		}
	}
	return nil
}

// once records that the header with bit seen has been seen, or returns
// dup if it had been already: the headers a request may send only once.
func (p *Parser) once(bit uint16, dup *ParseError) error {
	if p.seen&bit != 0 {
		return dup
	}
	p.seen |= bit
	return nil
}

// contentLength parses a Content-Length value: 1*DIGIT, nothing else (no
// list, no sign). Leading zeros are digits; more than maxCLDigits
// significant digits is a body no limit admits (413).
func (p *Parser) contentLength(v []byte) error {
	if len(v) == 0 {
		return errContentLength
	}
	var n int64
	digits := 0
	for _, c := range v {
		if c < '0' || c > '9' {
			return errContentLength
		}
		if n == 0 && c == '0' {
			continue
		}
		if digits++; digits > maxCLDigits {
			return errCLTooLarge
		}
		n = n*10 + int64(c-'0')
	}
	p.req.ContentLength = n
	return nil
}

// transferEncoding checks a Transfer-Encoding value. Exactly "chunked"
// (ASCII case-insensitive) is the only framing implemented. Otherwise, a
// well-formed list of codings whose last is a bare chunked, applied once,
// is 501 (RFC 9112 §7: a coding we do not implement); anything else —
// chunked missing, not last, twice or with parameters, an empty element, a
// malformed coding — is 400, since the body's length cannot be known
// (RFC 9112 §6.3).
func transferEncoding(v []byte) error {
	if equalFold(v, "chunked") {
		return nil
	}
	chunked, lastChunked := 0, false
	for {
		elem := v
		i := bytes.IndexByte(v, ',')
		if i >= 0 {
			elem = v[:i]
		}
		elem = trimOWS(elem)
		coding := elem
		if j := bytes.IndexByte(elem, ';'); j >= 0 {
			coding = trimOWS(elem[:j]) // a coding's parameters are not examined
		}
		if len(coding) == 0 || !allToken(coding) {
			return errTESyntax
		}
		lastChunked = equalFold(coding, "chunked")
		if lastChunked {
			chunked++
			if len(coding) != len(elem) {
				return errTENotFinal // chunked takes no parameters
			}
		}
		if i < 0 {
			break
		}
		v = v[i+1:]
	}
	if chunked != 1 || !lastChunked {
		return errTENotFinal
	}
	return errTEUnknown
}

// connection records the Connection options that decide keep-alive; other
// options (Upgrade, TE, …) are ignored. The header may be repeated.
func (p *Parser) connection(v []byte) error {
	for len(v) > 0 {
		elem := v
		if i := bytes.IndexByte(v, ','); i >= 0 {
			elem, v = v[:i], v[i+1:]
		} else {
			v = nil
		}
		elem = trimOWS(elem)
		switch {
		case len(elem) == 0:
		case !allToken(elem):
			return errConnection
		case equalFold(elem, "close"):
			p.close = true
		case equalFold(elem, "keep-alive"):
			p.keep = true
		}
	}
	return nil
}

// mediaOf classifies a Content-Type value: type "/" subtype, each a token,
// then nothing or OWS ";" parameters (not examined).
func mediaOf(v []byte) (Media, bool) {
	slash := bytes.IndexByte(v, '/')
	if slash <= 0 {
		return MediaNone, false
	}
	end := slash + 1
	for end < len(v) && isToken[v[end]] {
		end++
	}
	if end == slash+1 || !allToken(v[:slash]) {
		return MediaNone, false
	}
	if rest := trimOWS(v[end:]); len(rest) > 0 && rest[0] != ';' {
		return MediaNone, false
	}
	typ, sub := v[:slash], v[slash+1:end]
	switch {
	case equalFold(typ, "multipart"):
		return MediaMultipart, true
	case equalFold(typ, "application") && equalFold(sub, "x-ndjson"):
		return MediaNDJSON, true
	}
	return MediaOther, true
}

func allToken(b []byte) bool {
	for _, c := range b {
		if !isToken[c] {
			return false
		}
	}
	return true
}

// finish applies the rules that need the whole head: keep-alive, and how
// (and whether) a body follows (RFC 9112 §6.1, §6.3).
func (p *Parser) finish() error {
	r := &p.req
	r.KeepAlive = !p.close && (!r.HTTP10 || p.keep)
	te, cl := p.seen&seenTE != 0, p.seen&seenCL != 0
	switch {
	case te && r.HTTP10:
		return errTEHTTP10
	case te && cl:
		return errCLAndTE // the classic request-smuggling ambiguity
	case r.Method == MethodOther && (te || r.ContentLength > 0):
		// Answered as its method and path deserve (405, 404) without reading the
		// body, and closed (Request.Framing).
		r.KeepAlive = false
		if te {
			r.Framing = BodyChunked
		} else {
			r.Framing = BodyLength
		}
		return nil
	case r.Method != MethodPOST:
		if te || r.ContentLength > 0 {
			return errBody
		}
		r.ContentLength = 0 // "Content-Length: 0": no body, as without the header
	case te:
		r.Framing = BodyChunked
	case cl:
		r.Framing = BodyLength
	}
	if r.Method == MethodPOST {
		switch {
		case r.Route == RouteStream && r.Media == MediaMultipart:
			return errMultipart
		case r.Route == RoutePublish && r.Media != MediaNDJSON:
			return errNotNDJSON
		}
	}
	return nil
}

// CrossSiteFetch reports whether a browser said, in Sec-Fetch-Site (W3C Fetch Metadata),
// that the request does not come from this site: any value but same-origin, same-site and
// none (the user's own navigation), ASCII case-insensitive. false when the header is absent
// (a client that is not a browser, or a browser that predates the header).
func (r *Request) CrossSiteFetch() bool {
	v := r.SecFetchSite
	return v != nil && !equalFold(v, "same-origin") && !equalFold(v, "same-site") && !equalFold(v, "none")
}

// cookie records a Cookie header. RFC 9113 lets a client split cookies over
// several lines; they are joined with "; " in scratch, whose capacity (the
// head's length) always holds the join.
func (p *Parser) cookie(value []byte) {
	r := &p.req
	if p.seen&seenCookie == 0 || len(r.Cookie) == 0 {
		p.seen |= seenCookie
		r.Cookie = value
		return
	}
	if len(value) == 0 {
		return
	}
	if p.cookieS < 0 {
		p.cookieS = len(p.scratch)
		p.scratch = append(p.scratch, r.Cookie...)
	}
	p.scratch = append(p.scratch, ';', ' ')
	p.scratch = append(p.scratch, value...)
	r.Cookie = p.scratch[p.cookieS:len(p.scratch):len(p.scratch)]
}

// equalFold reports whether b equals lower, a lower-case ASCII string,
// ignoring ASCII case.
func equalFold(b []byte, lower string) bool { return len(b) == len(lower) && foldEq(b, lower) }

// foldEq reports whether the header name equals lower, a lower-case name of
// the same length, ignoring ASCII case.
func foldEq(name []byte, lower string) bool {
	for i := 0; i < len(name); i++ {
		c := name[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// CookieValue returns the value of the first cookie called name in a Cookie
// header value ("a=1; b=2"), without surrounding double quotes, or nil if
// there is none. The result is a view into cookie; it does not allocate.
func CookieValue(cookie []byte, name string) []byte {
	for len(cookie) > 0 {
		part := cookie
		if i := bytes.IndexByte(cookie, ';'); i >= 0 {
			part, cookie = cookie[:i], cookie[i+1:]
		} else {
			cookie = nil
		}
		eq := bytes.IndexByte(part, '=')
		if eq < 0 || string(trimOWS(part[:eq])) != name {
			continue
		}
		v := trimOWS(part[eq+1:])
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			v = v[1 : len(v)-1]
		}
		return v[:len(v):len(v)]
	}
	return nil
}

func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// ValidHeaderList reports whether b is a comma-separated list of header
// names (tokens, optional whitespace, empty elements allowed), the shape of
// Access-Control-Request-Headers, so it can be echoed in a preflight.
func ValidHeaderList(b []byte) bool {
	for len(b) > 0 {
		elem := b
		if i := bytes.IndexByte(b, ','); i >= 0 {
			elem, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		for _, c := range trimOWS(elem) {
			if !isToken[c] {
				return false
			}
		}
	}
	return true
}

// Byte classes.
var (
	isToken      [256]bool // RFC 9110 tchar
	isTarget     [256]bool // bytes allowed raw in a request target: VCHAR but '#'
	isFieldVChar [256]bool // VCHAR and obs-text: a header value's non-space bytes
	isHost       [256]bool // uri-host [ ":" port ], IP-literals included
	unhex        [256]int8 // hex digit value, -1 if not a hex digit
)

func init() {
	for c := 0; c < 256; c++ {
		unhex[c] = -1
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		isToken[c] = alnum || c < 0x80 && bytes.IndexByte([]byte("!#$%&'*+-.^_`|~"), byte(c)) >= 0
		isTarget[c] = c > 0x20 && c < 0x7f && c != '#'
		isFieldVChar[c] = c > 0x20 && c != 0x7f
		isHost[c] = alnum || c < 0x80 && bytes.IndexByte([]byte("-._~!$&'()*+,;=:[]%"), byte(c)) >= 0
	}
	for c := '0'; c <= '9'; c++ {
		unhex[c] = int8(c - '0')
	}
	for c := 'a'; c <= 'f'; c++ {
		unhex[c] = int8(c - 'a' + 10)
		unhex[c-'a'+'A'] = int8(c - 'a' + 10)
	}
}
