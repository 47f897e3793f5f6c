package engine

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"strconv"
	"time"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/names"
	"github.com/pgsse/pgsse/sse"
)

// HTTP request handling on the SSE port (docs/http.md): a connection in state head is read
// until its request head is complete, the head is parsed (sse.Parser) and routed; route has
// one case per endpoint and method, so a new endpoint is one case there and its handler
// (subscribe here, publish in publish.go).

var (
	crlfcrlf = []byte("\r\n\r\n")
	lflf     = []byte("\n\n")
)

// readRequest handles the input of an SSE-port connection, as far as its state allows: the
// request head (head), a publish request's body (publish-body), a keep-alive connection's
// next request (idle). A publisher waiting for its COMMIT leaves what it sent ahead (a
// pipelined request) in the input, up to publishPipelineBytes; anything a subscriber sends
// after its head is discarded.
func (s *Server) readRequest(sc *sseConn) {
	for !sc.closed {
		switch sc.state {
		case stateHead:
			if !s.readRequestHead(sc) {
				return
			}
		case statePublishBody:
			if !s.readBody(sc) {
				return
			}
		case stateIdle:
			if sc.c.InboundBuffered() == 0 {
				return
			}
			if sc.pending() > publishUnreadAnswerBytes {
				s.finish(sc, nil) // the client does not read its answers
				return
			}
			if in, _ := sc.c.Peek(-1); sse.EmptyLines(in) == len(in) {
				// The CRLF a client may send after a body (RFC 9112 §2.2): still idle, so
				// the keep-alive timeout applies, not the request head's.
				_, _ = sc.c.Discard(len(in))
				return
			}
			s.nextRequest(sc)
		case statePublishCommit:
			if sc.c.InboundBuffered() > publishPipelineBytes {
				s.finish(sc, nil)
			}
			return
		default:
			_, _ = sc.c.Discard(-1)
			return
		}
	}
}

// readRequestHead parses and routes a request head once it is complete. It reports whether the
// connection carries on reading (a publish request's body, or its next request).
func (s *Server) readRequestHead(sc *sseConn) bool {
	c := sc.c
	buf, _ := c.Peek(-1)
	// Parse only once the head can be complete (or is too big): a client trickling one byte
	// per packet must not make us re-parse a growing head each time. The empty lines the
	// parser skips before a request line (RFC 9112 §2.2) are no end of a head.
	head := buf[:min(len(buf), s.cfg.MaxHeaderBytes+len(crlfcrlf))]
	if head = head[sse.EmptyLines(head):]; len(buf) <= s.cfg.MaxHeaderBytes &&
		!bytes.Contains(head, crlfcrlf) && !bytes.Contains(head, lflf) {
		return false
	}
	req, err := s.parser.Parse(buf, s.cfg.MaxHeaderBytes)
	if errors.Is(err, sse.ErrIncomplete) {
		return false
	}
	if err != nil {
		var pe *sse.ParseError
		status, reason := 400, err.Error()
		switch {
		case errors.Is(err, sse.ErrHeadTooLarge):
			status, reason = 431, "request head larger than "+strconv.Itoa(s.cfg.MaxHeaderBytes)+" bytes"
		case errors.As(err, &pe):
			status, reason = pe.Status, pe.Reason
		}
		if isPOST(buf) {
			s.metrics.publishRequestsFor(status).Inc()
		} else {
			s.metrics.rejectedFor(status).Inc()
		}
		// A body may follow, whatever the method: linger so that the client reads the answer.
		s.linger(sc, sse.AppendError(s.scratch[:0], status, reason, sse.CORS{}))
		return false
	}
	s.route(sc, req)
	switch sc.state {
	case statePublishBody, statePublishCommit, stateIdle:
		_, _ = c.Discard(req.HeadLen) // the body, or the next request, follows
		return true
	}
	_, _ = c.Discard(-1)
	return false
}

// route answers one request head: one case per endpoint, then per method.
func (s *Server) route(sc *sseConn, req *sse.Request) {
	cors := s.corsFor(req.Origin)
	switch req.Route {
	case sse.RouteStream, sse.RouteChannel:
		switch {
		case req.Method == sse.MethodGET:
			s.uncountPublisher(sc) // a keep-alive publisher may turn into a subscriber
			s.subscribe(sc, req, cors)
		case req.Method == sse.MethodPOST && req.Route == sse.RouteStream:
			s.publish(sc, req, cors)
		case req.Method == sse.MethodOPTIONS:
			s.preflight(sc, req, cors)
		default:
			s.methodNotAllowed(sc, req, cors)
		}
	case sse.RoutePublish:
		switch req.Method {
		case sse.MethodPOST:
			s.publish(sc, req, cors)
		case sse.MethodOPTIONS:
			s.preflight(sc, req, cors)
		default:
			s.methodNotAllowed(sc, req, cors)
		}
	case sse.RouteRoot:
		if s.cfg.Demo && req.Method == sse.MethodGET {
			s.finish(sc, demoResponse)
			return
		}
		s.notFound(sc, req, cors)
	case sse.RouteScript:
		if req.Method == sse.MethodGET || req.Method == sse.MethodHEAD {
			s.endRequest(sc, req, clientScriptAnswer(req))
			return
		}
		s.methodNotAllowed(sc, req, cors)
	default:
		s.notFound(sc, req, cors)
	}
}

// notFound answers 404 (a HEAD request gets the head only: RFC 9110 §9.3.2).
func (s *Server) notFound(sc *sseConn, req *sse.Request, cors sse.CORS) {
	s.metrics.rejectedFor(404).Inc()
	if req.Method == sse.MethodHEAD {
		s.finish(sc, sse.AppendErrorHead(s.scratch[:0], 404, "not found", cors))
		return
	}
	s.endRequest(sc, req, sse.AppendError(s.scratch[:0], 404, "not found", cors))
}

// endRequest writes the final answer to req and closes the connection, lingering when req
// carries a body (which nothing reads on this path: a POST to a path that takes none, another
// method's: sse.Request.Framing), so that the client reads the answer rather than a reset
// and nothing in the body is taken for a request.
func (s *Server) endRequest(sc *sseConn, req *sse.Request, answer []byte) {
	if req.Framing != sse.BodyNone {
		s.linger(sc, answer)
		return
	}
	s.finish(sc, answer)
}

// allowedMethods is the Allow header (405) and the preflight's
// Access-Control-Allow-Methods of a route.
func allowedMethods(r sse.Route) (allow, use string) {
	switch r {
	case sse.RouteStream:
		return sse.AllowStream, "GET or POST"
	case sse.RoutePublish:
		return sse.AllowPublish, "POST"
	case sse.RouteScript:
		return "GET, HEAD", "GET"
	}
	return "GET, OPTIONS", "GET"
}

// methodNotAllowed answers 405 with the route's Allow header (a HEAD request gets the
// head only: RFC 9110 §9.3.2).
func (s *Server) methodNotAllowed(sc *sseConn, req *sse.Request, cors sse.CORS) {
	allow, use := allowedMethods(req.Route)
	s.metrics.rejectedFor(405).Inc()
	r := sse.Reply{CORS: cors, Allow: allow}
	if req.Method == sse.MethodHEAD {
		s.finish(sc, sse.AppendReplyHead(s.scratch[:0], 405, "method not allowed: use "+use, r))
		return
	}
	s.endRequest(sc, req, sse.AppendReply(s.scratch[:0], 405, "method not allowed: use "+use, r))
}

// reject answers with an error status and a one-line text/plain body, and closes.
func (s *Server) reject(sc *sseConn, status int, reason string, cors sse.CORS) {
	s.metrics.rejectedFor(status).Inc()
	s.finish(sc, sse.AppendError(s.scratch[:0], status, reason, cors))
}

// preflight answers a CORS preflight from an allowed origin (204) with the route's methods,
// else 403. A preflight for a POST asks for Content-Type, so the default allowed headers
// for it include Content-Type.
func (s *Server) preflight(sc *sseConn, req *sse.Request, cors sse.CORS) {
	if cors.Origin == nil {
		s.reject(sc, 403, "origin not allowed", cors)
		return
	}
	allow := req.ACRHeaders
	if len(allow) == 0 || !sse.ValidHeaderList(allow) {
		allow = []byte(sse.DefaultAllowHeaders)
		if string(req.ACRMethod) == "POST" {
			allow = []byte(sse.DefaultPublishAllowHeaders)
		}
	}
	methods, _ := allowedMethods(req.Route)
	s.finish(sc, sse.AppendPreflightMethods(s.scratch[:0], cors, allow, methods))
}

// subRequest is what a subscription request asked for, kept from its head (a view into
// gnet's buffer) while its token is verified and while it waits in the admission FIFO.
type subRequest struct {
	name      string
	isChan    bool
	public    bool // a --public-streams stream: a token only adds tags (auth.OnPublicStream)
	hasCursor bool
	cursor    int64
	tokenKey  [sha256.Size]byte // the token's hash: its subject when it has no sub claim
}

// subscribe handles GET /streams/{stream} and GET /channels/{channel}: it checks the name and
// cursor, sheds when the server is draining or full, and checks the token — at once when the
// verifier pool's cache knows it, else on the pool (verify), whose answer resumes it in
// authorized. An authorised connection waits in the admission FIFO (admission.go).
func (s *Server) subscribe(sc *sseConn, req *sse.Request, cors sse.CORS) {
	sub := &subRequest{isChan: req.Route == sse.RouteChannel}
	if sub.isChan {
		if err := names.CheckChannelUTF8(req.Name); err != nil {
			s.reject(sc, 400, err.Error(), cors)
			return
		}
		if reservedChannel(req.Name) {
			s.reject(sc, 403, errReservedChannel.Error(), cors)
			return
		}
	} else {
		if err := names.CheckStream(req.Name); err != nil {
			s.reject(sc, 400, err.Error(), cors)
			return
		}
		// Last-Event-ID wins over since; blank counts as absent; an invalid header does
		// not fall back to since (sse.Request.Cursor). The error names the field.
		if v, field, ok := req.Cursor(); ok {
			c, err := names.ParseCursor(v)
			if err != nil {
				s.reject(sc, 400, field+": "+err.Error(), cors)
				return
			}
			sub.cursor, sub.hasCursor = c, true
		}
		sub.public = auth.MatchAny(s.cfg.PublicStreams, req.Name)
	}
	sc.keepOrigin(cors)
	tok := requestToken(req)
	if (tok == nil || s.verifier == nil) && !sub.public {
		reason := "a bearer token is required"
		if tok != nil {
			reason = "token authentication is not configured"
		}
		s.unauthorized(sc, reason)
		return
	}
	// Sent away before any token work: a full or draining server spends nothing on it.
	if why, full := s.overCapacity(); full {
		s.shed(sc, why)
		return
	}
	sub.name = string(req.Name)
	if tok == nil || s.verifier == nil {
		s.authorized(sc, sub, nil, nil) // public stream, anonymous
		return
	}
	sub.tokenKey = sha256.Sum256(tok)
	claims, err, verdict := s.checkToken(tok, func(claims *auth.Claims, err error) {
		if sc.closed || sc.state != stateVerifying {
			return // gone, or sent away (drain, timeout) while the pool worked
		}
		s.authorized(sc, sc.req, claims, err)
	})
	switch verdict {
	case tokenChecked:
		s.authorized(sc, sub, claims, err)
	case tokenPending:
		s.verify(sc, sub)
	case tokenBusy:
		s.shed(sc, shedOverCapacity)
	}
}

// authorized continues a subscription once its token's check is known (claims, or err; both
// nil for an anonymous request on a public stream): 401 or 403 as docs/http.md's status table
// says, the public stream rule (auth.OnPublicStream), the per-subject cap, and then the admission
// FIFO.
func (s *Server) authorized(sc *sseConn, sub *subRequest, claims *auth.Claims, err error) {
	var tags []string
	var expiresMS int64
	counted := claims != nil && err == nil
	switch {
	case sub.public:
		// A token on a public stream only adds tags; one that does not verify is ignored.
		var deadline time.Time
		tags, deadline = auth.OnPublicStream(claims, err)
		if !deadline.IsZero() {
			expiresMS = deadline.UnixMilli()
		}
		counted = len(tags) > 0
	case err != nil:
		s.unauthorized(sc, err.Error())
		return
	case sub.isChan && !claims.AllowsChannel([]byte(sub.name)):
		s.reject(sc, 403, claims.NotGranted("channel "+sub.name), s.connCORS(sc))
		return
	case !sub.isChan && !claims.AllowsStream([]byte(sub.name)):
		s.reject(sc, 403, claims.NotGranted("stream "+sub.name), s.connCORS(sc))
		return
	default:
		tags = claims.Tags
		if !claims.Expires.IsZero() {
			expiresMS = claims.Expires.UnixMilli()
		}
	}
	if counted && !s.countSubject(sc, subjectKey(claims, &sub.tokenKey)) {
		s.shed(sc, shedSubjectLimit)
		return
	}
	s.queueAdmission(sc, sub, tags, expiresMS)
}

// unauthorized answers 401 with the challenge docs/http.md names exactly ("Bearer"); the body
// says what was wrong.
func (s *Server) unauthorized(sc *sseConn, reason string) {
	s.metrics.rejectedFor(401).Inc()
	s.finish(sc, sse.AppendUnauthorized(s.scratch[:0], reason, false, s.connCORS(sc)))
}

// requestToken is the request's token (docs/http.md, Authorization): Authorization: Bearer, else
// ?token=, else the pgsse_token cookie; nil if there is none. A view into the request.
func requestToken(req *sse.Request) []byte {
	if tok := bearer(req.Authorization); tok != nil {
		return tok
	}
	if len(req.Token) > 0 {
		return req.Token
	}
	if c := sse.CookieValue(req.Cookie, "pgsse_token"); len(c) > 0 {
		return c
	}
	return nil
}

// crossSiteCookie reports whether req is authorised only by the pgsse_token cookie and comes
// from a page of another site: an Origin that is neither one of --cors-origins (cors) nor the
// request's own Host, or, without an Origin, a Sec-Fetch-Site other than same-origin,
// same-site or none (sse.Request.CrossSiteFetch). A browser attaches the cookie to any site's
// POST, so publishing on it would let every web page publish as the visitor (cross-site
// request forgery; Mercure's hub refuses it the same way). Clients that are not browsers send
// neither header.
func crossSiteCookie(req *sse.Request, cors sse.CORS) bool {
	if cors.Origin != nil || bearer(req.Authorization) != nil || len(req.Token) > 0 {
		return false
	}
	if len(req.Origin) == 0 {
		return req.CrossSiteFetch()
	}
	_, host, ok := bytes.Cut(req.Origin, []byte("://"))
	return !ok || len(req.Host) == 0 || !bytes.EqualFold(host, req.Host)
}

func bearer(h []byte) []byte {
	h = bytes.TrimSpace(h)
	if len(h) > 7 && bytes.EqualFold(h[:7], []byte("Bearer ")) {
		if t := bytes.TrimSpace(h[7:]); len(t) > 0 {
			return t
		}
	}
	return nil
}

// corsFor allows a request's Origin when it is one of --cors-origins (exact origins, with
// credentials; the CLI refuses "*").
func (s *Server) corsFor(origin []byte) sse.CORS {
	if len(origin) == 0 {
		return sse.CORS{}
	}
	for _, o := range s.cfg.CORSOrigins {
		if string(origin) == o {
			return sse.CORS{Origin: origin, Credentials: true}
		}
	}
	return sse.CORS{}
}
