package engine

import (
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/pgsse/pgsse/framing"
)

// The gnet.EventHandler: every callback finds out which kind of connection it is about — an
// SSE connection (sseconn.go, request.go), a hub worker (hubserver.go) or the loop's private anchor
// (loop.go) — from the connection's context: when OnOpen runs, that is the origin the
// acceptor that handed it over gave it (accept.go); after that, its part's own state.

// anchorMark is the context of the anchor connection.
type anchorMark struct{}

// OnBoot implements gnet.EventHandler.
func (s *Server) OnBoot(eng gnet.Engine) gnet.Action {
	s.eng = eng
	return gnet.None
}

// Every callback but the anchor's (and a handed-over connection's close) calls Server.hurry, so that the queued tasks (deliveries
// among them) do not wait behind a storm of sockets gnet's poller handles first (loop.go):
// OnTraffic and OnClose on their way out, OnOpen before the new connection is in the tables —
// gnet goes on with it after OnOpen returns, so no task may have closed it meanwhile.

// OnOpen implements gnet.EventHandler.
func (s *Server) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	if a, ok := c.Context().(*adoption); ok { // handed over by a predecessor (handoff.go)
		s.enter()
		defer s.leave()
		if a.rec.Kind == framing.HandoffWorker {
			s.hub.adopt(c, &a.rec.Worker)
		} else {
			s.conns.open(c, &a.rec.Conn)
		}
		return nil, gnet.None
	}
	switch c.Context() {
	case originAnchor:
		c.SetContext(anchorMark{})
		return nil, gnet.None
	case originHub, originSibling:
		s.hurry()
		s.enter()
		defer s.leave()
		return s.hub.accept(c, c.Context() == originSibling)
	case originSSE:
		s.hurry()
		s.enter()
		defer s.leave()
		s.conns.open(c)
		return nil, gnet.None
	}
	return nil, gnet.Close // not ours (gnet's placeholder listener cannot accept anyone)
}

// OnClose implements gnet.EventHandler.
func (s *Server) OnClose(c gnet.Conn, _ error) gnet.Action {
	// gnet runs OnClose synchronously when the loop's own code closes a socket (a failed
	// write), inside an entry; or on its own, outside any: then this is the entry, and the
	// connection is removed from the tables on the way out.
	switch x := c.Context().(type) {
	case *sseConn:
		// A connection handed to a successor (handoff.go) is no client going away: its close
		// does not hurry the queued deliveries — a handoff closes thousands, and each would
		// run a delivery round to the connections not moved yet (bench/RESULTS.md, scenario
		// 17), between the loop tasks that move them.
		if x.state != stateHandedOver {
			defer s.hurry()
		}
		s.enter()
		defer s.leave()
		s.conns.closed(x)
	case *worker:
		defer s.hurry()
		s.hub.closed(x)
	default:
		defer s.hurry()
	}
	return gnet.None
}

// OnTraffic implements gnet.EventHandler.
func (s *Server) OnTraffic(c gnet.Conn) gnet.Action {
	defer s.hurry()
	switch x := c.Context().(type) {
	case *sseConn:
		s.enter()
		defer s.leave()
		s.req.read(x)
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
