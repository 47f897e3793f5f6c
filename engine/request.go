package engine

import (
	"bytes"
	"errors"
	"strconv"
	"time"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/names"
	"github.com/pgsse/pgsse/sse"
)

// HTTP request handling on the SSE port (SPEC §3): a connection in state head is read until
// its request head is complete, the head is parsed (sse.Parser) and routed; route has one
// case per endpoint and method, so a new endpoint is one case there and its handler.

var (
	crlfcrlf = []byte("\r\n\r\n")
	lflf     = []byte("\n\n")
)

// readRequest handles bytes from an SSE-port connection. Nothing is read after the head: a
// connection past state head has whatever it sends discarded.
func (s *Server) readRequest(sc *sseConn) {
	c := sc.c
	if sc.state != stateHead {
		_, _ = c.Discard(-1)
		return
	}
	buf, _ := c.Peek(-1)
	// Parse only once the head can be complete (or is too big): a client trickling one byte
	// per packet must not make us re-parse a growing head each time.
	if len(buf) <= s.cfg.MaxHeaderBytes && !bytes.Contains(buf, crlfcrlf) && !bytes.Contains(buf, lflf) {
		return
	}
	req, err := s.parser.Parse(buf, s.cfg.MaxHeaderBytes)
	if errors.Is(err, sse.ErrIncomplete) {
		return
	}
	if err != nil {
		var pe *sse.ParseError
		switch {
		case errors.Is(err, sse.ErrHeadTooLarge):
			s.reject(sc, 431, "request head larger than "+strconv.Itoa(s.cfg.MaxHeaderBytes)+" bytes", sse.CORS{})
		case errors.As(err, &pe):
			s.reject(sc, pe.Status, pe.Reason, sse.CORS{})
		default:
			s.reject(sc, 400, err.Error(), sse.CORS{})
		}
		_, _ = c.Discard(-1)
		return
	}
	s.route(sc, req)
	_, _ = c.Discard(-1)
}

// route answers one request head: one case per endpoint, then per method.
func (s *Server) route(sc *sseConn, req *sse.Request) {
	cors := s.corsFor(req.Origin)
	switch req.Route {
	case sse.RouteStream, sse.RouteChannel:
		switch req.Method {
		case sse.MethodGET:
			s.subscribe(sc, req, cors)
		case sse.MethodOPTIONS:
			s.preflight(sc, req, cors)
		case sse.MethodHEAD:
			// A response to HEAD carries no body (RFC 9110 §9.3.2).
			s.metrics.rejectedFor(405).Inc()
			s.finish(sc, sse.AppendErrorHead(s.scratch[:0], 405, "method not allowed: use GET", cors))
		default:
			s.reject(sc, 405, "method not allowed: use GET", cors)
		}
	case sse.RouteRoot:
		if s.cfg.Demo && req.Method == sse.MethodGET {
			s.finish(sc, demoResponse)
			return
		}
		s.reject(sc, 404, "not found", cors)
	default:
		s.reject(sc, 404, "not found", cors)
	}
}

// reject answers with an error status and a one-line text/plain body, and closes.
func (s *Server) reject(sc *sseConn, status int, reason string, cors sse.CORS) {
	s.metrics.rejectedFor(status).Inc()
	s.finish(sc, sse.AppendError(s.scratch[:0], status, reason, cors))
}

// preflight answers a CORS preflight from an allowed origin (204), else 403.
func (s *Server) preflight(sc *sseConn, req *sse.Request, cors sse.CORS) {
	if cors.Origin == nil {
		s.reject(sc, 403, "origin not allowed", cors)
		return
	}
	allow := req.ACRHeaders
	if len(allow) == 0 || !sse.ValidHeaderList(allow) {
		allow = []byte(sse.DefaultAllowHeaders)
	}
	s.finish(sc, sse.AppendPreflight(s.scratch[:0], cors, allow))
}

// subscribe handles GET /streams/{stream} and GET /channels/{channel}: it checks the name and
// cursor, authorises, sheds over capacity, and otherwise admits the connection and registers
// it on its stream or channel (sseconn.go takes it from there).
func (s *Server) subscribe(sc *sseConn, req *sse.Request, cors sse.CORS) {
	isChan := req.Route == sse.RouteChannel
	var cursor int64
	hasCursor := false
	if isChan {
		if err := names.CheckChannel(req.Name); err != nil {
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
		// not fall back to since.
		v, have := bytes.TrimSpace(req.LastEventID), req.HasLastEventID
		if !have || len(v) == 0 {
			v, have = bytes.TrimSpace(req.Since), req.HasSince
		}
		if have && len(v) > 0 {
			c, err := names.ParseCursor(v)
			if err != nil {
				s.reject(sc, 400, err.Error(), cors)
				return
			}
			cursor, hasCursor = c, true
		}
	}

	claims, status, reason := s.authorize(req, isChan)
	if status == 401 {
		s.metrics.rejectedFor(401).Inc()
		// SPEC §3 names the challenge exactly as "Bearer"; the body says what was wrong.
		s.finish(sc, sse.AppendUnauthorized(s.scratch[:0], reason, false, cors))
		return
	}
	if status != 0 {
		s.reject(sc, status, reason, cors)
		return
	}
	if s.draining || s.active >= s.cfg.MaxConnections {
		s.metrics.droppedOverCapacity.Inc()
		sc.keepOrigin(cors)
		s.shed(sc)
		return
	}
	s.admit(sc, claims, cors)
	if isChan {
		s.subscribeChannel(sc, string(req.Name))
	} else {
		s.subscribeStream(sc, string(req.Name), cursor, hasCursor)
	}
}

// authorize finds the token (Authorization: Bearer, else ?token=, else the pgsse_token
// cookie) and checks the grant. It returns a status (401/403) and a one-line reason on
// refusal.
func (s *Server) authorize(req *sse.Request, isChan bool) (*auth.Claims, int, string) {
	public := !isChan && auth.MatchAny(s.cfg.PublicStreams, req.Name)
	tok := bearer(req.Authorization)
	if tok == nil && len(req.Token) > 0 {
		tok = req.Token
	}
	if tok == nil {
		if c := sse.CookieValue(req.Cookie, "pgsse_token"); len(c) > 0 {
			tok = c
		}
	}
	if tok == nil {
		if public {
			return nil, 0, ""
		}
		return nil, 401, "a bearer token is required"
	}
	if s.verifier == nil {
		if public {
			return nil, 0, ""
		}
		return nil, 401, "token authentication is not configured"
	}
	claims, err := s.verifier.Verify(tok, time.Now())
	if err != nil {
		if public {
			return nil, 0, "" // a stale token does not lock anyone out of a public stream
		}
		return nil, 401, err.Error()
	}
	if public {
		return claims, 0, ""
	}
	if isChan {
		if !claims.AllowsChannel(req.Name) {
			return nil, 403, "token does not grant channel " + string(req.Name)
		}
	} else if !claims.AllowsStream(req.Name) {
		return nil, 403, "token does not grant stream " + string(req.Name)
	}
	return claims, 0, ""
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
