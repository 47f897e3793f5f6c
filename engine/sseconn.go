package engine

import (
	"math/rand/v2"
	"strconv"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"

	"github.com/pgsse/pgsse/sse"
)

// The connection state machine of the SSE port (docs/http.md). A subscriber moves through
//
//	head ─► verifying ─► queued ─► pending ─► catch-up ◄─► live
//	  └────────────────►┘                        ▲    ╲     │
//	                                             │     ▼    ▼
//	                                             └──── lagging    and from any state ─► closing
//
//   - head: reading the request head (headTimeoutMS from the accept, or from the first byte
//     of a keep-alive connection's next request);
//   - verifying: the head is parsed and its token is being checked on the verifier pool
//     (verify.go); the answer comes back as a loop task (verifyTimeoutMS);
//   - queued: authorised, waiting in the admission FIFO (admission.go), serviced a round at
//     a time between rounds of deliveries;
//   - pending: admitted and registered on its stream or channel, waiting for the LISTEN or
//     the head read before the response head goes out (pendingTimeoutMS);
//   - catch-up: the response head is sent; history is read from the table, live durable
//     events are not written (ephemeral ones are);
//   - live: taking live writes;
//   - lagging: over its high watermark queued (budget.go); waits to drain below the low one,
//     then catches up;
//   - closing: the last bytes are queued and the socket closes once they have left
//     (closeLingerMS at most);
//   - publish-body: a publish request's head was accepted; its body is read (bounded by
//     --max-publish-bytes) while its token is checked off the loop (publishBodyTimeoutMS);
//   - publish-commit: the request is with the Publisher; the answer goes out after COMMIT
//     (the connection reads nothing more until then: one request in flight);
//   - idle: a keep-alive connection between requests (keepAliveIdleMS);
//   - linger: answered with "Connection: close" while the client may still be sending its
//     body: the write side is shut and input is discarded until EOF or lingerTimeoutMS, so
//     that closing with unread input does not reset the connection before the client has
//     read the answer.
//
// The helpers in this file are the only code that assigns sseConn.state. Each says which
// transition it makes and does what that transition owes: verify parks a connection for
// the pool, queueAdmission puts it in the admission FIFO, admit counts it, respond writes the
// response head, pause enrols a lagging connection for the tick, shed says why it was sent
// away, finish writes the last bytes and closes. sweepConns (from the tick) applies the
// time rules of each state. Every byte to an SSE client goes out through write, writeEvents
// or writev (outbound.go has what happens underneath).
//
// Times are the loop clock, Server.nowMS (unix milliseconds, refreshed every tick).

// connState is where an SSE connection is in its life.
type connState uint8

const (
	stateHead          connState = iota // reading the request head
	stateVerifying                      // a subscriber whose token is on the verifier pool
	stateQueued                         // a subscriber authorised, waiting in the admission FIFO
	statePending                        // admitted and registered; no response head yet
	stateCatchUp                        // response sent; reading history from the table
	stateLive                           // taking live writes
	stateLagging                        // over the high watermark; waiting to drain
	stateClosing                        // a final write is queued; the socket closes once it is flushed
	statePublishBody                    // a publish request: reading its body, verifying its token
	statePublishCommit                  // a publish request with the Publisher: answered after COMMIT
	stateIdle                           // keep-alive: between a publisher's requests
	stateLinger                         // answered and closing: discarding input until EOF
)

// Time rules of the states.
const (
	headTimeoutMS    = 10_000 // a complete request head within this (docs/http.md, Responses and errors)
	verifyTimeoutMS  = 10_000 // a token check that takes longer (the pool is swamped) is shed
	pendingTimeoutMS = 30_000 // a subscription whose LISTEN or head read takes longer is shed
	keepAliveIdleMS  = 30_000 // a keep-alive connection without a new request for this long is closed
	lingerTimeoutMS  = 2_000  // a lingering close waits at most this long for the client's EOF
	closeLingerMS    = 5_000  // a closing connection's last bytes get this long to leave
	sweepIntervalMS  = 240    // sweepConns runs at most this often: just under tickSlow, so every slow tick sweeps
	// dbUnavailableAfterMS: once the LISTEN session has been down this long, a connection
	// that has no response head yet is shed with ":database unavailable" rather than left
	// waiting (a PostgreSQL restart that is over within it costs nobody their connection).
	dbUnavailableAfterMS = 2_000
)

// shedReason says why a connection without a response head was sent away; its comment is
// the one line the client sees (docs/http.md, Responses and errors: never one reason for
// another).
type shedReason uint8

const (
	shedOverCapacity        shedReason = iota // --max-connections, the verifier or replay queue full, too slow to set up
	shedDraining                              // the server is shutting down
	shedDatabaseUnavailable                   // PostgreSQL cannot be reached (or is not migrated)
	shedSubjectLimit                          // --max-connections-per-subject
	shedReasons
)

var shedComments = [shedReasons][]byte{
	shedOverCapacity:        []byte("over capacity"),
	shedDraining:            []byte("draining"),
	shedDatabaseUnavailable: []byte("database unavailable"),
	shedSubjectLimit:        []byte("too many connections for this subject"),
}

// The retry: value a client gets when it is sent away (docs/http.md, Responses and errors:
// 2000–10000 ms, jittered, so that clients told to go away do not come back in one herd).
const (
	retryJitterMinMS = 2_000
	retryJitterMaxMS = 10_000
)

// sseConn is one SSE client. It lives on the loop goroutine only. Kept small: an idle
// connection should cost well under 1 KiB including gnet's own state.
type sseConn struct {
	c      gnet.Conn
	state  connState
	closed bool // OnClose ran: late replay results are ignored
	// replaying is set while a replay read for this connection is in flight.
	replaying bool
	// gapChecked is set once the client's cursor has been checked against the table.
	gapChecked bool
	counted    bool  // counted in Server.active (admitted)
	retries    uint8 // consecutive failed history reads
	watched    bool  // registered in the writability set (outbound.go)

	all    int32 // index in Server.conns
	subIdx int32 // index in stream.subs or channel.sse (a connection is on one of them at most)

	cursor      int64 // last durable id written (or skipped) for this connection
	enteredMS   int64 // when the connection entered its state (head and pending time rules)
	lastWriteMS int64 // when it was last written to (heartbeats)
	expiresMS   int64 // the token's exp, unix ms; 0 = none

	q       *outQueue // what the socket has not taken yet; nil when nothing (outbound.go)
	stream  *stream
	ch      *channel
	pub     *publishConn // a publisher's request state (publish.go); kept across keep-alive requests
	tags    []string     // token tags (audience)
	cors    []byte       // allowed Origin to echo in the response head, until it is sent
	req     *subRequest  // what it asked for, from the head until it is admitted (verifying, queued)
	subject string       // its key in Server.subjects while counted there ("" = not counted)
}

// to is the one assignment of a state; only the transition helpers below call it.
func (sc *sseConn) to(state connState, nowMS int64) {
	sc.state = state
	sc.enteredMS = nowMS
}

// streaming reports whether the response head has been sent and the connection is open
// for events (catch-up, live, lagging).
func (sc *sseConn) streaming() bool {
	return !sc.closed && sc.state >= stateCatchUp && sc.state <= stateLagging
}

// --- transitions --------------------------------------------------------------------------

// openConn registers a new connection on the SSE port: → head.
func (s *Server) openConn(c gnet.Conn) *sseConn {
	sc := &sseConn{c: c, all: int32(len(s.conns))}
	sc.to(stateHead, s.nowMS)
	s.conns = append(s.conns, sc)
	s.sseOpen.Store(int64(len(s.conns)))
	c.SetContext(sc)
	return sc
}

// verify parks a connection whose token is being checked on the verifier pool: head →
// verifying. req is what it asked for; the pool's answer resumes it (request.go: authorized).
func (s *Server) verify(sc *sseConn, req *subRequest) {
	sc.req = req
	sc.to(stateVerifying, s.nowMS)
}

// queueAdmission puts an authorised connection in the admission FIFO: head or verifying → queued.
// grant is what its token allows it to see (tags, exp); the FIFO admits it in its turn.
func (s *Server) queueAdmission(sc *sseConn, req *subRequest, tags []string, expiresMS int64) {
	sc.req = req
	sc.tags = tags
	sc.expiresMS = expiresMS
	sc.to(stateQueued, s.nowMS)
	s.admitQ.push(sc)
	s.tasks.kick()
}

// admit makes a queued connection a subscriber: queued → pending. It counts the connection
// against MaxConnections; the caller then registers it on its stream or channel, which moves
// it on with respond when the subscription is live.
func (s *Server) admit(sc *sseConn) {
	sc.req = nil
	sc.counted = true
	s.active++
	s.metrics.sseConns.Set(float64(s.active))
	sc.to(statePending, s.nowMS)
}

// respond writes the response head — 200, the retry field and a comment, at once — once the
// subscription is live (docs/http.md, Cursors and gaps): pending → catch-up or live.
func (s *Server) respond(sc *sseConn, next connState) {
	b := sse.AppendStreamHead(s.scratch[:0], s.connCORS(sc))
	b = sse.AppendRetry(b, s.cfg.Retry.Milliseconds())
	b = sse.AppendComment(b, []byte("pgsse"))
	b = append(b, '\n')
	sc.write(s, b)
	sc.cors = nil
	sc.to(next, s.nowMS)
}

// goLive moves a connection that has caught up into the live set: catch-up → live.
func (s *Server) goLive(sc *sseConn) { sc.to(stateLive, s.nowMS) }

// pause stops live writes to a connection over the high watermark: live or catch-up →
// lagging. The tick resumes it (resume) once its buffer has drained.
func (s *Server) pause(sc *sseConn) {
	sc.to(stateLagging, s.nowMS)
	s.lagging = append(s.lagging, sc)
	s.metrics.lagging.Inc()
}

// resume sends a drained connection back to reading the table: lagging → catch-up.
func (s *Server) resume(sc *sseConn) { sc.to(stateCatchUp, s.nowMS) }

// finish writes a connection's last bytes (if any) and closes it: → closing. Of what the
// connection still has queued, only an event the socket has begun is kept (the client must
// not see half an event followed by the last bytes); if the socket does not take it all at
// once, the close waits until the queue has drained (flushQueue) or closeLingerMS has passed
// (sweepConns).
func (s *Server) finish(sc *sseConn, last []byte) {
	sc.to(stateClosing, s.nowMS)
	s.trimQueue(sc)
	if len(last) > 0 {
		sc.write(s, last)
	}
	if sc.pending() == 0 {
		_ = sc.c.Close()
	}
}

// linger writes a connection's last bytes and closes it gracefully although the client may
// still be sending (a publish refused before its body was read): → linger. Once the socket
// has taken the answer, the write side is shut (the client sees the answer and EOF); input
// is discarded until the client's EOF closes the connection or lingerTimeoutMS passes. If
// the answer could not be written at once, it closes as finish does (→ closing).
func (s *Server) linger(sc *sseConn, last []byte) {
	if sc.closed || sc.pending() > 0 || sc.c.OutboundBuffered() > 0 {
		s.finish(sc, last)
		return
	}
	sc.write(s, last)
	if sc.closed {
		return
	}
	if sc.pending() > 0 || unix.Shutdown(sc.c.Fd(), unix.SHUT_WR) != nil {
		// Part of the answer waits in the queue: close once it has left, as finish does.
		sc.to(stateClosing, s.nowMS)
		return
	}
	sc.to(stateLinger, s.nowMS)
	_, _ = sc.c.Discard(-1)
}

// beginPublish makes a connection whose head is a publish request a publisher: head →
// publish-body. A connection counts against MaxConnections as a publisher from its first
// publish request until it closes or turns into a subscriber.
func (s *Server) beginPublish(sc *sseConn) {
	if !sc.pub.counted {
		sc.pub.counted = true
		s.publishers++
		s.metrics.publishConns.Set(float64(s.publishers))
	}
	sc.to(statePublishBody, s.nowMS)
}

// submitted records that a publish request is with the Publisher: publish-body →
// publish-commit. Nothing more is read from the connection until it is answered.
func (s *Server) submitted(sc *sseConn) { sc.to(statePublishCommit, s.nowMS) }

// answerPublish writes the answer to a publish request: publish-body or publish-commit →
// idle when the connection is kept alive; otherwise it closes (lingering when the client
// may still be sending).
func (s *Server) answerPublish(sc *sseConn, b []byte, keepAlive, bodyUnread bool) {
	switch {
	case keepAlive:
		sc.write(s, b)
		sc.to(stateIdle, s.nowMS)
	case bodyUnread:
		s.linger(sc, b)
	default:
		s.finish(sc, b)
	}
}

// nextRequest starts reading a keep-alive connection's next request: idle → head.
func (s *Server) nextRequest(sc *sseConn) { sc.to(stateHead, s.nowMS) }

// uncountPublisher stops counting a publisher connection that closed or turned into a
// subscriber.
func (s *Server) uncountPublisher(sc *sseConn) {
	if sc.pub != nil && sc.pub.counted {
		sc.pub.counted = false
		s.publishers--
		s.metrics.publishConns.Set(float64(s.publishers))
	}
}

// shed answers 200 with a jittered retry and a comment saying why, and closes: EventSource
// treats any non-200 as final, so load shedding must not use 503. For a connection whose
// response head has not been sent (head, verifying, queued, pending).
func (s *Server) shed(sc *sseConn, why shedReason) { s.shedSaying(sc, why, nil) }

// schemaMissingComment follows ":database unavailable" when the database has no pgsse schema
// (docs/http.md, Responses and errors): a second comment line, so that the first stays the
// reason a client matches, exactly as before, and this one says what to do.
var schemaMissingComment = []byte("schema not installed: the server's operator must run pgsse migrate")

// shedSaying is shed with a second comment line, detail, after the reason (nil: none).
func (s *Server) shedSaying(sc *sseConn, why shedReason, detail []byte) {
	s.metrics.shed[why].Inc()
	b := sse.AppendStreamHead(s.scratch[:0], s.connCORS(sc))
	b = sse.AppendRetry(b, jitteredRetryMS())
	b = sse.AppendComment(b, shedComments[why])
	if detail != nil {
		b = sse.AppendComment(b, detail)
	}
	b = append(b, '\n')
	s.finish(sc, b)
}

// closeWithRetry ends a streaming connection with a jittered retry field (shutdown, token
// expiry, too slow for ephemeral traffic).
func (s *Server) closeWithRetry(sc *sseConn) { s.closeWithRetrySaying(sc) }

// tokenExpiredComment says why a stream closes at its token's exp (docs/http.md,
// Authorization): a client that reconnects with the same token will get 401.
var tokenExpiredComment = []byte("token expired")

// closeWithRetrySaying is closeWithRetry with comment lines after the retry field.
func (s *Server) closeWithRetrySaying(sc *sseConn, comments ...[]byte) {
	if sc.closed || sc.state == stateClosing {
		return
	}
	b := sse.AppendRetry(s.scratch[:0], jitteredRetryMS())
	for _, c := range comments {
		b = sse.AppendComment(b, c)
	}
	s.finish(sc, append(b, '\n'))
}

// retryLater sends a connection away, whatever its state: one still sending its head (or
// idle between requests) is closed, one without a response head is shed for why, a
// streaming one gets a retry field; a publisher reading its body is answered 503, one
// waiting for its COMMIT is answered (and closed) when it comes.
func (s *Server) retryLater(sc *sseConn, why shedReason) {
	switch {
	case sc.closed || sc.state == stateClosing:
	case sc.state == stateHead, sc.state == stateIdle, sc.state == stateLinger:
		s.finish(sc, nil)
	case sc.state == statePublishBody:
		s.refusePublish(sc, 503, "the server is shutting down; retry elsewhere")
	case sc.state == statePublishCommit:
		// Answered after COMMIT (with a close: the server is draining).
	case sc.state < stateCatchUp: // verifying, queued, pending
		s.shed(sc, why)
	default:
		s.closeWithRetry(sc)
	}
}

// connClosed runs from OnClose: the connection is removed from the tables on the way out of
// the current loop entry (leave), so no slice changes under an iteration.
func (s *Server) connClosed(sc *sseConn) {
	if sc.closed {
		return
	}
	if sc.state == stateClosing {
		s.flushQueue(sc) // the last bytes, as far as the socket takes them now
	}
	sc.closed = true
	s.reap = append(s.reap, sc)
	if s.depth == 0 {
		s.enter()
		s.leave()
	}
}

// removeConn drops a closed connection from every table (from leave).
func (s *Server) removeConn(sc *sseConn) {
	if sc.counted {
		sc.counted = false
		s.active--
		s.metrics.sseConns.Set(float64(s.active))
	}
	s.uncountSubject(sc)
	s.uncountPublisher(sc)
	s.releasePublish(sc)
	switch {
	case sc.stream != nil:
		st := sc.stream
		st.subs = swapRemove(st.subs, sc, subIndex)
		sc.stream = nil
		s.maybeDropStream(st)
	case sc.ch != nil:
		ch := sc.ch
		ch.sse = swapRemove(ch.sse, sc, subIndex)
		sc.ch = nil
		s.releaseChannel(ch)
	}
	s.conns = swapRemove(s.conns, sc, connIndex)
	s.sseOpen.Store(int64(len(s.conns)))
	s.unwatch(sc)
	s.dropQueue(sc)
	sc.c = nil
	sc.tags = nil
	sc.req = nil
}

// connIndex is sc's position in Server.conns.
func connIndex(sc *sseConn) *int32 { return &sc.all }

// subIndex is sc's position in its stream's or channel's subscriber list.
func subIndex(sc *sseConn) *int32 { return &sc.subIdx }

// --- time rules ---------------------------------------------------------------------------

// sweepConns applies each state's time rule, at most every sweepIntervalMS: a head not
// complete within headTimeoutMS is closed, a token check not answered within verifyTimeoutMS
// and a subscription pending longer than pendingTimeoutMS are shed (over capacity), a
// pending one is shed once the LISTEN session has been down for dbUnavailableAfterMS
// (database unavailable), a streaming connection whose token expired is closed with a
// retry, one without a write for --heartbeat gets a comment line, and a closing one whose
// last bytes have not left within closeLingerMS is closed without them; a publish body not
// complete within publishBodyTimeoutMS is answered 408, a keep-alive connection idle for
// keepAliveIdleMS and a lingering one after lingerTimeoutMS are closed.
func (s *Server) sweepConns() {
	heartbeatMS := s.cfg.Heartbeat.Milliseconds()
	dbDown := s.databaseUnavailable()
	for _, sc := range s.conns {
		if sc.closed {
			continue
		}
		switch sc.state {
		case stateHead:
			if s.nowMS-sc.enteredMS >= headTimeoutMS {
				s.finish(sc, nil)
			}
		case stateVerifying:
			if s.nowMS-sc.enteredMS > verifyTimeoutMS {
				s.shed(sc, shedOverCapacity)
			}
		case statePending:
			switch {
			case dbDown:
				s.shed(sc, shedDatabaseUnavailable)
			case s.nowMS-sc.enteredMS > pendingTimeoutMS:
				s.shed(sc, shedOverCapacity)
			}
		case stateIdle:
			if s.nowMS-sc.enteredMS >= keepAliveIdleMS {
				s.finish(sc, nil)
			}
		case stateLinger:
			if s.nowMS-sc.enteredMS >= lingerTimeoutMS {
				s.finish(sc, nil)
			}
		case statePublishBody:
			if s.nowMS-sc.enteredMS >= s.publishBodyTimeoutMS {
				s.refusePublish(sc, 408, "the request body did not arrive within "+
					strconv.FormatInt(s.publishBodyTimeoutMS/1000, 10)+" s")
			}
		case stateClosing:
			if sc.pending() > 0 && s.nowMS-sc.enteredMS >= closeLingerMS {
				s.dropQueue(sc) // the client does not read: give up on the last bytes
				_ = sc.c.Close()
			}
		case stateCatchUp, stateLive, stateLagging:
			if sc.expiresMS > 0 && s.nowMS >= sc.expiresMS {
				s.closeWithRetrySaying(sc, tokenExpiredComment)
				continue
			}
			if s.nowMS-sc.lastWriteMS >= heartbeatMS {
				sc.write(s, heartbeat)
			}
		}
	}
}

var heartbeat = []byte(":\n")

// --- writes -------------------------------------------------------------------------------

// write, writeEvents and writev are the only paths from the engine to an SSE client's
// socket; each is one writev (outbound.go: Server.send).

// write sends b, which the caller may reuse at once (it is copied if the socket does not take
// it all now).
func (sc *sseConn) write(s *Server, b []byte) {
	items := append(s.out.items[:0], outItem{b: b, transient: true})
	s.send(sc, items)
	clear(items)
	s.out.items = items[:0]
	sc.lastWriteMS = s.nowMS
}

// writeEvents sends the encodings of evs, which are shared by every subscriber: what the
// socket does not take is kept by reference, never copied.
func (sc *sseConn) writeEvents(s *Server, evs []*event) {
	items := s.out.items[:0]
	for _, ev := range evs {
		items = append(items, outItem{b: ev.enc, ev: ev})
	}
	s.send(sc, items)
	clear(items)
	s.out.items = items[:0]
	sc.lastWriteMS = s.nowMS
}

// writeLive sends live events like writeEvents, but queues durable ones only up to limit
// bytes (Server.sendLive); it returns the index in evs of the first durable event not sent.
func (sc *sseConn) writeLive(s *Server, evs []*event, limit int) int {
	n := s.sendLive(sc, evs, limit)
	sc.lastWriteMS = s.nowMS
	return n
}

// writev sends items as they are: shared (ev set), the connection's own and immutable, or
// transient (copied if kept).
func (sc *sseConn) writev(s *Server, items []outItem) {
	s.send(sc, items)
	sc.lastWriteMS = s.nowMS
}

// keepOrigin remembers the allowed Origin until the response head is written.
func (sc *sseConn) keepOrigin(cors sse.CORS) {
	if cors.Origin != nil {
		sc.cors = append([]byte(nil), cors.Origin...)
	}
}

// connCORS is the CORS part of the response head: the request's Origin when it is allowed.
func (s *Server) connCORS(sc *sseConn) sse.CORS {
	if sc.cors == nil {
		return sse.CORS{}
	}
	return sse.CORS{Origin: sc.cors, Credentials: true}
}

// jitteredRetryMS is a retry: value between retryJitterMinMS and retryJitterMaxMS.
func jitteredRetryMS() int64 {
	return retryJitterMinMS + rand.Int64N(retryJitterMaxMS-retryJitterMinMS+1)
}
