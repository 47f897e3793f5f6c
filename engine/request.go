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
	"github.com/pgsse/pgsse/store"
)

// HTTP request handling on the SSE port (docs/http.md): a connection in state head is read
// until its request head is complete, the head is parsed (sse.Parser) and routed; route has
// one case per endpoint and method, so a new endpoint is one case there and its handler
// (subscribe here, publish in publish.go). A subscription request is checked here — its
// names, cursor and token — and then waits for admission (admission.go).

// requests is the loop's part for request heads on the SSE port: the parser, routing, and a
// subscription's checks up to the admission FIFO.
type requests struct {
	*loopEnv
	conns  *connTable
	adm    *admission
	tok    *tokens
	pub    *publishing
	ans    *httpAnswers
	pres   *presenceTable
	parser sse.Parser
}

var (
	crlfcrlf = []byte("\r\n\r\n")
	lflf     = []byte("\n\n")
)

// read handles the input of an SSE-port connection, as far as its state allows: the
// request head (head), a publish request's body (publish-body), a keep-alive connection's
// next request (idle). A publisher waiting for its COMMIT leaves what it sent ahead (a
// pipelined request) in the input, up to publishPipelineBytes; anything a subscriber sends
// after its head is discarded.
func (r *requests) read(sc *sseConn) {
	for !sc.closed {
		switch sc.state {
		case stateHead:
			if !r.readHead(sc) {
				return
			}
		case statePublishBody:
			if !r.pub.readBody(sc) {
				return
			}
		case stateIdle:
			if sc.c.InboundBuffered() == 0 {
				return
			}
			if sc.pending() > publishUnreadAnswerBytes {
				r.conns.finish(sc, nil) // the client does not read its answers
				return
			}
			if in, _ := sc.c.Peek(-1); sse.EmptyLines(in) == len(in) {
				// The CRLF a client may send after a body (RFC 9112 §2.2): still idle, so
				// the keep-alive timeout applies, not the request head's.
				_, _ = sc.c.Discard(len(in))
				return
			}
			r.conns.nextRequest(sc)
		case statePublishCommit:
			if sc.c.InboundBuffered() > publishPipelineBytes {
				r.conns.finish(sc, nil)
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
func (r *requests) readHead(sc *sseConn) bool {
	c := sc.c
	r.pub.headSeen(sc)
	buf, _ := c.Peek(-1)
	// Parse only once the head can be complete (or is too big): a client trickling one byte
	// per packet must not make us re-parse a growing head each time. The empty lines the
	// parser skips before a request line (RFC 9112 §2.2) are no end of a head.
	head := buf[:min(len(buf), r.cfg.MaxHeaderBytes+len(crlfcrlf))]
	if head = head[sse.EmptyLines(head):]; len(buf) <= r.cfg.MaxHeaderBytes &&
		!bytes.Contains(head, crlfcrlf) && !bytes.Contains(head, lflf) {
		return false
	}
	req, err := r.parser.Parse(buf, r.cfg.MaxHeaderBytes)
	if errors.Is(err, sse.ErrIncomplete) {
		return false
	}
	if err != nil {
		var pe *sse.ParseError
		status, reason := 400, err.Error()
		switch {
		case errors.Is(err, sse.ErrHeadTooLarge):
			status, reason = 431, "request head larger than "+strconv.Itoa(r.cfg.MaxHeaderBytes)+" bytes"
		case errors.As(err, &pe):
			status, reason = pe.Status, pe.Reason
		}
		if isPOST(buf) {
			r.metrics.publishRequestsFor(status).Inc()
		} else {
			r.metrics.rejectedFor(status).Inc()
		}
		// A body may follow, whatever the method: linger so that the client reads the answer.
		r.conns.linger(sc, r.ans.error(status, reason, sse.CORS{}))
		return false
	}
	r.route(sc, req)
	switch sc.state {
	case statePublishBody, statePublishCommit, stateIdle:
		_, _ = c.Discard(req.HeadLen) // the body, or the next request, follows
		return true
	}
	_, _ = c.Discard(-1)
	return false
}

// route answers one request head: one case per endpoint, then per method.
func (r *requests) route(sc *sseConn, req *sse.Request) {
	cors := r.corsFor(req.Origin)
	switch req.Route {
	case sse.RouteStream, sse.RouteChannel:
		switch {
		case req.Method == sse.MethodGET:
			r.pub.uncountConn(sc) // a keep-alive publisher may turn into a subscriber
			r.subscribe(sc, req, cors)
		case req.Method == sse.MethodPOST && req.Route == sse.RouteStream:
			r.pub.publish(sc, req, cors)
		case req.Method == sse.MethodOPTIONS:
			r.preflight(sc, req, cors)
		default:
			r.methodNotAllowed(sc, req, cors)
		}
	case sse.RouteStreams:
		switch req.Method {
		case sse.MethodGET:
			r.pub.uncountConn(sc)
			r.subscribe(sc, req, cors)
		case sse.MethodOPTIONS:
			r.preflight(sc, req, cors)
		default:
			r.methodNotAllowed(sc, req, cors)
		}
	case sse.RoutePresence:
		switch req.Method {
		case sse.MethodGET:
			r.presence(sc, req, cors)
		case sse.MethodOPTIONS:
			r.preflight(sc, req, cors)
		default:
			r.methodNotAllowed(sc, req, cors)
		}
	case sse.RoutePublish:
		switch req.Method {
		case sse.MethodPOST:
			r.pub.publish(sc, req, cors)
		case sse.MethodOPTIONS:
			r.preflight(sc, req, cors)
		default:
			r.methodNotAllowed(sc, req, cors)
		}
	case sse.RouteRoot:
		if r.cfg.Demo && req.Method == sse.MethodGET {
			r.conns.finish(sc, demoResponse)
			return
		}
		r.notFound(sc, req, cors)
	case sse.RouteScript:
		if req.Method == sse.MethodGET || req.Method == sse.MethodHEAD {
			r.endRequest(sc, req, clientScriptAnswer(req))
			return
		}
		r.methodNotAllowed(sc, req, cors)
	default:
		r.notFound(sc, req, cors)
	}
}

// errNotFound is the 404 line for a path pgsse does not serve: the paths it does, since the
// usual cause is a guessed one (/stream/x, /events/x).
const errNotFound = "not found: pgsse serves GET /streams/{stream}, /streams?stream=…&stream=…, /channels/{channel}, /presence/{stream}, /pgsse.js and POST /streams/{stream}, /publish (docs/http.md)"

// notFound answers 404 (a HEAD request gets the head only: RFC 9110 §9.3.2).
func (r *requests) notFound(sc *sseConn, req *sse.Request, cors sse.CORS) {
	r.metrics.rejectedFor(404).Inc()
	if req.Method == sse.MethodHEAD {
		r.conns.finish(sc, r.ans.errorHead(404, errNotFound, cors))
		return
	}
	r.endRequest(sc, req, r.ans.error(404, errNotFound, cors))
}

// endRequest writes the final answer to req and closes the connection, lingering when req
// carries a body (which nothing reads on this path: a POST to a path that takes none, another
// method's: sse.Request.Framing), so that the client reads the answer rather than a reset
// and nothing in the body is taken for a request.
func (r *requests) endRequest(sc *sseConn, req *sse.Request, answer []byte) {
	if req.Framing != sse.BodyNone {
		r.conns.linger(sc, answer)
		return
	}
	r.conns.finish(sc, answer)
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
func (r *requests) methodNotAllowed(sc *sseConn, req *sse.Request, cors sse.CORS) {
	allow, use := allowedMethods(req.Route)
	r.metrics.rejectedFor(405).Inc()
	reply := sse.Reply{CORS: cors, Allow: allow}
	if req.Method == sse.MethodHEAD {
		r.conns.finish(sc, r.ans.replyHead(405, "method not allowed: use "+use, reply))
		return
	}
	r.endRequest(sc, req, r.ans.reply(405, "method not allowed: use "+use, reply))
}

// reject answers with an error status and a one-line text/plain body, and closes.
func (r *requests) reject(sc *sseConn, status int, reason string, cors sse.CORS) {
	r.metrics.rejectedFor(status).Inc()
	r.conns.finish(sc, r.ans.error(status, reason, cors))
}

// preflight answers a CORS preflight from an allowed origin (204) with the route's methods,
// else 403. A preflight for a POST asks for Content-Type, so the default allowed headers
// for it include Content-Type.
func (r *requests) preflight(sc *sseConn, req *sse.Request, cors sse.CORS) {
	if cors.Origin == nil {
		r.reject(sc, 403, "origin not allowed", cors)
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
	r.conns.finish(sc, r.ans.preflight(cors, allow, methods))
}

// subRequest is what a subscription request asked for, kept from its head (a view into
// gnet's buffer) while its token is verified, while it waits in the admission FIFO and until
// its response head is sent (sseConn.request).
type subRequest struct {
	name      string
	isChan    bool
	public    bool // a --public-streams stream (on /streams: every one is): a token only adds tags (auth.OnPublicStream)
	hasCursor bool
	// presence: ?presence=1 (presence events on its presence streams); presenceSub: the
	// subject it counts under on them ("" = anonymous), from its token's sub claim.
	presence    bool
	presenceSub string
	cursor      int64
	tokenKey    [sha256.Size]byte // the token's hash: its subject when it has no sub claim
	origin      []byte            // the allowed Origin to echo in the response head; nil = none
	// streams are the streams of GET /streams?stream=…, in request order, each with its cursor
	// and whether --public-streams covers it; nil for /streams/{stream} and /channels/{channel}.
	streams []streamAsk
	// ext is the connection's extension while it sets up (sseconn.go: setRequest): one
	// allocation for both, 208 B — a size class no lasting per-connection object is in (a
	// connection's later subscriptions are 32 B each: 224 B for 8 streams).
	ext connExt
}

// streamAsk is one stream of GET /streams?stream=… and where its subscription starts.
type streamAsk struct {
	name      string
	cursor    int64
	hasCursor bool
	public    bool
}

// cors is the CORS part of the answer to the request: its Origin when it is allowed.
func (req *subRequest) cors() sse.CORS {
	if req.origin == nil {
		return sse.CORS{}
	}
	return sse.CORS{Origin: req.origin, Credentials: true}
}

// parseSubscription reads what a subscription request asks for — its stream, streams or channel, their
// cursors, and the query parameters that shape the subscription — or says why it is refused
// (status, one line naming the parameter and the rule). Every subscription endpoint's
// parameters are read here, so a new one (a filter, presence) is one more case in this
// function and its field in subRequest.
func (r *requests) parseSubscription(req *sse.Request) (sub *subRequest, status int, reason string) {
	switch req.Route {
	case sse.RouteChannel:
		if err := names.CheckChannelUTF8(req.Name); err != nil {
			return nil, 400, err.Error()
		}
		if reservedChannel(req.Name) {
			return nil, 403, errReservedChannel.Error()
		}
		return &subRequest{isChan: true, name: string(req.Name)}, 0, ""
	case sse.RouteStreams:
		return r.askedStreams(req)
	}
	if err := names.CheckStream(req.Name); err != nil {
		if bytes.IndexByte(req.Name, ',') >= 0 { // /streams/a,b: several streams, as one name
			return nil, 400, err.Error() + " (to follow several streams on one connection: /streams?stream=a&stream=b)"
		}
		return nil, 400, err.Error()
	}
	sub = &subRequest{name: string(req.Name), public: auth.MatchAny(r.cfg.PublicStreams, req.Name), presence: req.Presence}
	// Last-Event-ID wins over since; blank counts as absent; an invalid header does not fall
	// back to since (sse.Request.Cursor). The error names the field.
	if v, field, ok := req.Cursor(); ok {
		c, err := names.ParseCursor(v)
		if err != nil {
			reason := field + ": " + err.Error()
			if bytes.IndexByte(v, ',') >= 0 || bytes.IndexByte(v, ':') >= 0 {
				// A composite id such as 1:3,1, taken from a /streams?stream=… connection.
				reason += " (a composite cursor like 1:3,1 belongs to the /streams?stream=…&stream=… connection that gave it)"
			}
			return nil, 400, reason
		}
		sub.cursor, sub.hasCursor = c, true
	}
	return sub, 0, ""
}

// askedStreams reads GET /streams?stream=…&stream=… (docs/http.md, Several streams on one
// connection): 1 to --max-streams-per-connection stream parameters, each a valid name named
// once, and a composite cursor with one entry per stream (an empty one: live).
func (r *requests) askedStreams(req *sse.Request) (*subRequest, int, string) {
	k := req.NStreams
	switch {
	case k == 0:
		return nil, 400, "stream: name at least one stream, as in /streams?stream=orders/42&stream=chat/7"
	case k > r.cfg.MaxStreamsPerConnection:
		return nil, 400, "stream: " + strconv.Itoa(k) + " streams, but one connection may follow at most " +
			strconv.Itoa(r.cfg.MaxStreamsPerConnection) + " (--max-streams-per-connection)"
	}
	sub := &subRequest{streams: make([]streamAsk, k), public: true, presence: req.Presence}
	for i, name := range req.Streams {
		if err := names.CheckStream(name); err != nil {
			reason := "stream[" + strconv.Itoa(i) + "]: " + err.Error()
			if bytes.IndexByte(name, ',') >= 0 { // stream=a,b: as the demo page takes them
				reason += " (name one stream per parameter: stream=a&stream=b)"
			}
			return nil, 400, reason
		}
		for j := range i {
			if string(name) == sub.streams[j].name {
				return nil, 400, "stream[" + strconv.Itoa(i) + "]: repeats stream[" + strconv.Itoa(j) + "] (" +
					sub.streams[j].name + "): name each stream once"
			}
		}
		ask := &sub.streams[i]
		ask.name = string(name)
		ask.public = auth.MatchAny(r.cfg.PublicStreams, name)
		sub.public = sub.public && ask.public
	}
	sub.name = sub.streams[0].name
	if v, field, ok := req.Cursor(); ok {
		cursors, present := make([]int64, k), make([]bool, k)
		if err := names.ParseCompositeCursor(v, cursors, present); err != nil {
			var entry *names.CompositeEntryError
			if errors.As(err, &entry) {
				return nil, 400, field + ": entry " + strconv.Itoa(entry.Index) + " (stream " +
					sub.streams[entry.Index].name + "): " + entry.Err.Error()
			}
			return nil, 400, field + ": " + err.Error()
		}
		for i := range sub.streams {
			sub.streams[i].cursor, sub.streams[i].hasCursor = cursors[i], present[i]
		}
	}
	return sub, 0, ""
}

// subscribe handles GET /streams/{stream}, GET /streams?stream=… and GET /channels/{channel}:
// it checks the names and cursors (parseSubscription), sheds when the server is draining or full, and
// checks the token — at once when the verifier pool's cache knows it, else on the pool
// (verify), whose answer resumes it in authorized. An authorised connection waits in the
// admission FIFO (admission.go).
func (r *requests) subscribe(sc *sseConn, req *sse.Request, cors sse.CORS) {
	sub, status, reason := r.parseSubscription(req)
	if sub == nil {
		r.reject(sc, status, reason, cors)
		return
	}
	if cors.Origin != nil {
		sub.origin = append([]byte(nil), cors.Origin...)
	}
	r.conns.asked(sc, sub)
	tok := requestToken(req)
	if (tok == nil || !r.tok.configured()) && !sub.public {
		reason := noTokenReason(req, errNoToken)
		if tok != nil {
			reason = "token authentication is not configured"
		}
		r.unauthorized(sc, reason)
		return
	}
	// Sent away before any token work: a full or draining server spends nothing on it.
	if why, full := r.adm.overCapacity(); full {
		r.conns.shed(sc, why)
		return
	}
	if tok == nil || !r.tok.configured() {
		r.authorized(sc, sub, nil, nil) // public stream, anonymous
		return
	}
	sub.tokenKey = sha256.Sum256(tok)
	claims, err, verdict := r.tok.check(tok, func(claims *auth.Claims, err error) {
		if sc.closed || sc.state != stateVerifying {
			return // gone, or sent away (drain, timeout) while the pool worked
		}
		r.authorized(sc, sc.request(), claims, err)
	})
	switch verdict {
	case tokenChecked:
		r.authorized(sc, sub, claims, err)
	case tokenPending:
		r.conns.verify(sc)
	case tokenBusy:
		r.conns.shed(sc, shedOverCapacity)
	}
}

// authorized continues a subscription once its token's check is known (claims, or err; both
// nil for an anonymous request on a public stream): 401 or 403 as docs/http.md's status table
// says, the public stream rule (auth.OnPublicStream), the per-subject cap, and then the admission
// FIFO.
func (r *requests) authorized(sc *sseConn, sub *subRequest, claims *auth.Claims, err error) {
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
		r.unauthorized(sc, err.Error())
		return
	case sub.isChan && !claims.AllowsChannel([]byte(sub.name)):
		r.reject(sc, 403, claims.NotGranted("channel "+sub.name), sub.cors())
		return
	case sub.streams != nil && notGranted(claims, sub.streams) >= 0:
		i := notGranted(claims, sub.streams)
		r.reject(sc, 403, claims.NotGrantedStream([]byte(sub.streams[i].name), "stream "+sub.streams[i].name+" (stream["+strconv.Itoa(i)+"])"), sub.cors())
		return
	case !sub.isChan && sub.streams == nil && !claims.AllowsStream([]byte(sub.name)):
		r.reject(sc, 403, claims.NotGrantedStream([]byte(sub.name), "stream "+sub.name), sub.cors())
		return
	default:
		tags = claims.Tags
		if !claims.Expires.IsZero() {
			expiresMS = claims.Expires.UnixMilli()
		}
	}
	if claims != nil && err == nil && claims.Subject != "" && r.onPresenceStream(sub) {
		// SPEC §3d: on a presence stream the sub claim is a subject others see.
		if bad := store.CheckSubject(claims.Subject); bad != nil {
			r.unauthorized(sc, "token claim "+bad.Error())
			return
		}
		sub.presenceSub = claims.Subject
	}
	if counted && !r.adm.countSubject(sc, subjectKey(claims, &sub.tokenKey)) {
		r.conns.shed(sc, shedSubjectLimit)
		return
	}
	r.conns.queueAdmission(sc, tags, expiresMS)
}

// onPresenceStream reports whether sub follows a stream presence is kept for.
func (r *requests) onPresenceStream(sub *subRequest) bool {
	switch {
	case sub.isChan:
		return false
	case sub.streams == nil:
		return r.pres.isPresenceStream([]byte(sub.name))
	}
	for i := range sub.streams {
		if r.pres.isPresenceStream([]byte(sub.streams[i].name)) {
			return true
		}
	}
	return false
}

// presence answers GET /presence/{stream} (docs/http.md, Presence): 404 unless presence is kept
// for the stream, authorised as a subscription to it (the token, or --public-streams), then
// read off the loop (presence.go: list) while the connection waits as one whose token is
// checked (verifying, with its time rule).
func (r *requests) presence(sc *sseConn, req *sse.Request, cors sse.CORS) {
	if err := names.CheckStream(req.Name); err != nil {
		r.reject(sc, 400, err.Error(), cors)
		return
	}
	name := string(req.Name)
	if !r.pres.isPresenceStream(req.Name) {
		r.reject(sc, 404, "presence is not kept for stream "+name+" (--presence-streams)", cors)
		return
	}
	public := auth.MatchAny(r.cfg.PublicStreams, req.Name)
	tok := requestToken(req)
	if (tok == nil || !r.tok.configured()) && !public {
		reason := noTokenReason(req, errNoToken)
		if tok != nil {
			reason = "token authentication is not configured"
		}
		r.unauthorizedCORS(sc, reason, cors)
		return
	}
	if tok == nil || !r.tok.configured() {
		r.presenceAuthorized(sc, name, true, nil, nil, cors)
		return
	}
	claims, err, verdict := r.tok.check(tok, func(claims *auth.Claims, err error) {
		if sc.closed || sc.state != stateVerifying {
			return
		}
		r.presenceAuthorized(sc, name, public, claims, err, cors)
	})
	switch verdict {
	case tokenChecked:
		r.presenceAuthorized(sc, name, public, claims, err, cors)
	case tokenPending:
		r.conns.verify(sc)
	case tokenBusy:
		r.reject(sc, 503, "over capacity", cors)
	}
}

// presenceAuthorized continues GET /presence once its token is known: 401, 403, or the read.
func (r *requests) presenceAuthorized(sc *sseConn, name string, public bool, claims *auth.Claims, err error, cors sse.CORS) {
	switch {
	case public:
	case err != nil:
		r.unauthorizedCORS(sc, err.Error(), cors)
		return
	case !claims.AllowsStream([]byte(name)):
		r.reject(sc, 403, claims.NotGrantedStream([]byte(name), "stream "+name), cors)
		return
	}
	if claims != nil && err == nil && claims.Subject != "" {
		if bad := store.CheckSubject(claims.Subject); bad != nil {
			r.unauthorizedCORS(sc, "token claim "+bad.Error(), cors)
			return
		}
	}
	if sc.state == stateHead {
		r.conns.verify(sc) // parked while the read runs
	}
	if !r.pres.list(name, cors, func(answer []byte) {
		if sc.closed || sc.state != stateVerifying {
			return
		}
		if answer == nil {
			r.reject(sc, 503, "presence could not be read from the database", cors)
			return
		}
		r.conns.finish(sc, answer)
	}) {
		r.reject(sc, 503, "over capacity", cors)
	}
}

// unauthorizedCORS is unauthorized for a request that has no setup (GET /presence).
func (r *requests) unauthorizedCORS(sc *sseConn, reason string, cors sse.CORS) {
	r.metrics.rejectedFor(401).Inc()
	r.conns.finish(sc, r.ans.unauthorized(reason, cors))
}

// notGranted is the position of the first of streams that is neither public nor granted by
// claims (docs/http.md: every stream must be), or -1.
func notGranted(claims *auth.Claims, streams []streamAsk) int {
	for i := range streams {
		if !streams[i].public && !claims.AllowsStream([]byte(streams[i].name)) {
			return i
		}
	}
	return -1
}

// unauthorized answers 401 with the challenge docs/http.md names exactly ("Bearer"); the body
// says what was wrong.
func (r *requests) unauthorized(sc *sseConn, reason string) {
	r.metrics.rejectedFor(401).Inc()
	r.conns.finish(sc, r.ans.unauthorized(reason, sc.cors()))
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

// errNoToken is the 401 line of a subscription (or GET /presence) without a token: where a
// token goes, since a browser's EventSource cannot send the header.
const errNoToken = "a token is required: send it as Authorization: Bearer <token>, as ?token=<token> or in the pgsse_token cookie"

// errNoPublishToken is the 401 line of a publish without a token.
const errNoPublishToken = "a token with a publish grant is required: send it as Authorization: Bearer <token> (e.g. from pgsse token --publish STREAM)"

// noTokenReason is the 401 line for a request without a token: what, a sentence a person can
// act on, unless an Authorization header was sent that is not "Bearer <token>" (the token
// alone, say, or Basic), which would otherwise be told "a bearer token is required" while
// it believes it sent one.
func noTokenReason(req *sse.Request, what string) string {
	if len(bytes.TrimSpace(req.Authorization)) > 0 {
		return `the Authorization header must be "Bearer <token>" (the word Bearer, a space, then the token)`
	}
	return what
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
func (r *requests) corsFor(origin []byte) sse.CORS {
	if len(origin) == 0 {
		return sse.CORS{}
	}
	for _, o := range r.cfg.CORSOrigins {
		if string(origin) == o {
			return sse.CORS{Origin: origin, Credentials: true}
		}
	}
	return sse.CORS{}
}
