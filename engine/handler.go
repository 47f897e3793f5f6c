package engine

import (
	"context"
	"time"

	"github.com/panjf2000/gnet/v2"
)

// The gnet.EventHandler: every callback finds out which kind of connection it is about — an
// SSE connection (sseconn.go, request.go), a hub worker (hub.go) or the loop's private anchor
// (loop.go) — from the connection's context, and hands it to that part.

// anchorMark is the context of the anchor connection.
type anchorMark struct{}

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
	if s.hub.owns(c) {
		return s.hub.accept(c)
	}
	if len(s.conns) >= s.cfg.MaxConnections+shedSlack {
		// Far over the limit: do not even read the request; keep descriptors for others.
		s.metrics.shed[shedOverCapacity].Inc()
		return nil, gnet.Close
	}
	s.openConn(c)
	return nil, gnet.None
}

// OnClose implements gnet.EventHandler.
func (s *Server) OnClose(c gnet.Conn, _ error) gnet.Action {
	switch x := c.Context().(type) {
	case *sseConn:
		s.connClosed(x)
	case *worker:
		s.hub.closed(x)
	}
	return gnet.None
}

// OnTraffic implements gnet.EventHandler.
func (s *Server) OnTraffic(c gnet.Conn) gnet.Action {
	switch x := c.Context().(type) {
	case *sseConn:
		s.enter()
		defer s.leave()
		s.readRequest(x)
	case *worker:
		s.enter()
		defer s.leave()
		s.hub.traffic(x)
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
// use it: gnet runs OnTick on its own goroutine, not the loop's (see Server.ticker).
func (s *Server) OnTick() (time.Duration, gnet.Action) {
	s.loopsOnce.Do(func() { close(s.loopsReady) })
	return time.Hour, gnet.None
}
