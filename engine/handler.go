package engine

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/names"
	"github.com/pgsse/pgsse/sse"
)

const headTimeout = 10 // seconds to send a complete request head

type anchorMark struct{}

var (
	crlfcrlf = []byte("\r\n\r\n")
	lflf     = []byte("\n\n")
)

// OnBoot implements gnet.EventHandler.
func (s *Server) OnBoot(eng gnet.Engine) gnet.Action {
	s.eng = eng
	close(s.booted)
	return gnet.None
}

// OnOpen implements gnet.EventHandler.
func (s *Server) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	if ctx, ok := c.Context().(context.Context); ok && ctx.Value(anchorKey{}) != nil {
		c.SetContext(anchorMark{})
		return nil, gnet.None
	}
	s.enter()
	defer s.leave()
	if s.isHubConn(c) {
		return s.hubOpen(c)
	}
	if len(s.conns) >= s.cfg.MaxConnections+shedSlack {
		// Far over the limit: do not even read the request; keep descriptors for others.
		s.metrics.dropped.WithLabelValues("over_capacity").Inc()
		return nil, gnet.Close
	}
	sc := &sseConn{c: c, state: stateHead, deadline: s.now/1000 + headTimeout, all: int32(len(s.conns))}
	s.conns = append(s.conns, sc)
	c.SetContext(sc)
	return nil, gnet.None
}

// OnClose implements gnet.EventHandler.
func (s *Server) OnClose(c gnet.Conn, _ error) gnet.Action {
	switch x := c.Context().(type) {
	case *sseConn:
		if x.closed {
			return gnet.None
		}
		x.closed = true
		s.reap = append(s.reap, x)
		if s.depth == 0 {
			s.enter()
			s.leave()
		}
	case *worker:
		s.hubClose(x)
	}
	return gnet.None
}

// enter/leave bracket every entry into the loop's state (gnet callbacks and each drain of
// the task queue). On the way out of the outermost entry, everything the entry queued is
// written — one write per connection for all of it — and connections closed meanwhile
// (gnet closes a socket synchronously when a write fails) are removed from the tables,
// so no slice changes under an iteration.
func (s *Server) enter() { s.depth++ }

func (s *Server) leave() {
	if s.depth > 1 {
		s.depth--
		return
	}
	s.flushStreams()
	s.flushChannels()
	s.hubFlush()
	for len(s.reap) > 0 {
		sc := s.reap[len(s.reap)-1]
		s.reap[len(s.reap)-1] = nil
		s.reap = s.reap[:len(s.reap)-1]
		s.removeConn(sc)
	}
	if poll := len(s.lagging) > 0 || s.hub.needsPoll(); poll != s.needPoll.Load() {
		s.needPoll.Store(poll)
		if poll {
			select {
			case s.pollNow <- struct{}{}:
			default:
			}
		}
	}
	s.depth--
}

func (s *Server) removeConn(sc *sseConn) {
	if sc.counted {
		sc.counted = false
		s.active--
		s.metrics.sseConns.Set(float64(s.active))
	}
	if sc.isChan {
		s.unsubscribeChannel(sc)
	} else {
		s.unsubscribeStream(sc)
	}
	s.conns = swapRemove(s.conns, sc, func(c *sseConn) *int32 { return &c.all })
	sc.c = nil
	sc.tags = nil
}

// OnTraffic implements gnet.EventHandler.
func (s *Server) OnTraffic(c gnet.Conn) gnet.Action {
	switch x := c.Context().(type) {
	case *sseConn:
		s.enter()
		defer s.leave()
		if x.state != stateHead {
			// Nothing is read after the head: discard whatever a client sends.
			_, _ = c.Discard(-1)
			return gnet.None
		}
		buf, _ := c.Peek(-1)
		// Parse only once the head can be complete (or is too big): a client trickling
		// one byte per packet must not make us re-parse a growing head each time.
		if len(buf) <= s.cfg.MaxHeaderBytes && !bytes.Contains(buf, crlfcrlf) && !bytes.Contains(buf, lflf) {
			return gnet.None
		}
		req, err := s.parser.Parse(buf, s.cfg.MaxHeaderBytes)
		if errors.Is(err, sse.ErrIncomplete) {
			return gnet.None
		}
		if err != nil {
			var pe *sse.ParseError
			switch {
			case errors.Is(err, sse.ErrHeadTooLarge):
				s.reject(x, 431, "request head larger than "+itoa(s.cfg.MaxHeaderBytes)+" bytes", sse.CORS{})
			case errors.As(err, &pe):
				s.reject(x, pe.Status, pe.Reason, sse.CORS{})
			default:
				s.reject(x, 400, err.Error(), sse.CORS{})
			}
			_, _ = c.Discard(-1)
			return gnet.None
		}
		s.handleRequest(x, req)
		_, _ = c.Discard(-1)
	case *worker:
		s.enter()
		defer s.leave()
		s.hubTraffic(x)
	default:
		_, _ = c.Discard(-1)
	}
	return gnet.None
}

// OnShutdown implements gnet.EventHandler.
func (s *Server) OnShutdown(gnet.Engine) {}

// OnTick implements gnet.EventHandler. gnet starts its ticker only after the event loops
// are registered, so the first tick tells Run it may enrol the anchor connection
// (Engine.Register before that races with gnet's own setup). Periodic work does not
// use it: gnet runs OnTick on its own goroutine, not the loop's.
func (s *Server) OnTick() (time.Duration, gnet.Action) {
	s.loopsOnce.Do(func() { close(s.loopsReady) })
	return time.Hour, gnet.None
}

// finish writes a connection's last bytes and closes it (gnet flushes what the socket
// takes before closing).
func (s *Server) finish(sc *sseConn, b []byte) {
	sc.state = stateClosing
	sc.write(s, b)
	_ = sc.c.Close()
}

func (s *Server) reject(sc *sseConn, status int, reason string, cors sse.CORS) {
	s.metrics.rejected.WithLabelValues(itoa(status)).Inc()
	s.finish(sc, sse.AppendError(s.scratch[:0], status, reason, cors))
}

func (s *Server) handleRequest(sc *sseConn, req *sse.Request) {
	cors := s.corsFor(req.Origin)
	switch req.Route {
	case sse.RouteStream, sse.RouteChannel:
	case sse.RouteRoot:
		if s.cfg.Demo && req.Method == sse.MethodGET {
			s.finish(sc, demoResponse)
			return
		}
		s.reject(sc, 404, "not found", cors)
		return
	default:
		s.reject(sc, 404, "not found", cors)
		return
	}
	switch req.Method {
	case sse.MethodGET:
	case sse.MethodOPTIONS:
		if cors.Origin == nil {
			s.reject(sc, 403, "origin not allowed", cors)
			return
		}
		allow := req.ACRHeaders
		if len(allow) == 0 || !sse.ValidHeaderList(allow) {
			allow = []byte(sse.DefaultAllowHeaders)
		}
		s.finish(sc, sse.AppendPreflight(s.scratch[:0], cors, allow))
		return
	case sse.MethodHEAD:
		// A response to HEAD carries no body (RFC 9110 §9.3.2).
		s.metrics.rejected.WithLabelValues("405").Inc()
		s.finish(sc, sse.AppendErrorHead(s.scratch[:0], 405, "method not allowed: use GET", cors))
		return
	default:
		s.reject(sc, 405, "method not allowed: use GET", cors)
		return
	}

	isChan := req.Route == sse.RouteChannel
	var cursor int64
	hasCursor := false
	if isChan {
		if err := names.CheckChannel(req.Name); err != nil {
			s.reject(sc, 400, err.Error(), cors)
			return
		}
		if string(req.Name) == storeChannel {
			s.reject(sc, 403, "channel "+storeChannel+" is reserved: subscribe to /streams/ instead", cors)
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
		s.metrics.rejected.WithLabelValues("401").Inc()
		// SPEC §3 names the challenge exactly as "Bearer"; the body says what was wrong.
		s.finish(sc, sse.AppendUnauthorized(s.scratch[:0], reason, false, cors))
		return
	}
	if status != 0 {
		s.reject(sc, status, reason, cors)
		return
	}
	if s.draining || s.active >= s.cfg.MaxConnections {
		s.metrics.dropped.WithLabelValues("over_capacity").Inc()
		if cors.Origin != nil {
			sc.cors = append([]byte(nil), cors.Origin...)
		}
		s.shed(sc)
		return
	}
	if cors.Origin != nil {
		sc.cors = append([]byte(nil), cors.Origin...)
		sc.corsAny = !cors.Credentials
	}
	if claims != nil {
		sc.tags = claims.Tags
		if !claims.Expires.IsZero() {
			sc.deadline = claims.Expires.Unix()
		} else {
			sc.deadline = 0
		}
	} else {
		sc.deadline = 0
	}
	sc.isChan = isChan
	sc.state = statePending
	sc.counted = true
	s.active++
	s.metrics.sseConns.Set(float64(s.active))
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
	public := !isChan && s.isPublic(req.Name)
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

func (s *Server) isPublic(name []byte) bool {
	for _, p := range s.cfg.PublicStreams {
		if auth.Match(p, name) {
			return true
		}
	}
	return false
}

func (s *Server) corsFor(origin []byte) sse.CORS {
	if len(origin) == 0 {
		return sse.CORS{}
	}
	for _, o := range s.cfg.CORSOrigins {
		if o == "*" {
			return sse.CORS{Origin: []byte("*")}
		}
		if string(origin) == o {
			return sse.CORS{Origin: origin, Credentials: true}
		}
	}
	return sse.CORS{}
}

func (s *Server) connCORS(sc *sseConn) sse.CORS {
	if sc.cors == nil {
		return sse.CORS{}
	}
	return sse.CORS{Origin: sc.cors, Credentials: !sc.corsAny}
}

// sendStreamHead writes the 200 head, the retry field and a comment, at once.
func (s *Server) sendStreamHead(sc *sseConn) {
	b := sse.AppendStreamHead(s.scratch[:0], s.connCORS(sc))
	b = sse.AppendRetry(b, s.cfg.Retry.Milliseconds())
	b = sse.AppendComment(b, []byte("pgsse"))
	b = append(b, '\n')
	sc.write(s, b)
	sc.cors = nil
}

// jitteredRetry is 2000–10000 ms so that clients told to go away do not return in one herd.
func jitteredRetry() int64 { return 2000 + rand.Int64N(8001) }

// shed answers 200 with a jittered retry and closes: EventSource treats any non-200 as
// final, so load shedding must not use 503.
func (s *Server) shed(sc *sseConn) {
	b := sse.AppendStreamHead(s.scratch[:0], s.connCORS(sc))
	b = sse.AppendRetry(b, jitteredRetry())
	b = sse.AppendComment(b, []byte("over capacity, retry later"))
	b = append(b, '\n')
	s.finish(sc, b)
}

// closeWithRetry ends a streaming connection with a jittered retry field (shutdown,
// token expiry, too slow for ephemeral traffic).
func (s *Server) closeWithRetry(sc *sseConn) {
	if sc.closed || sc.state == stateClosing {
		return
	}
	b := sse.AppendRetry(s.scratch[:0], jitteredRetry())
	s.finish(sc, append(b, '\n'))
}

func itoa(n int) string { return strconv.Itoa(n) }
