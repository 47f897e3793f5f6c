package engine

import (
	"math/rand/v2"
	"strconv"
	"sync/atomic"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/framing"
	"github.com/pgsse/pgsse/sse"
)

// The connection state machine of the SSE port (docs/http.md), and the table of its
// connections (connTable). A subscriber moves through
//
//	head ─► verifying ─► queued ─► pending ─► streaming
//	  └────────────────►┘                                 and from any state ─► closing
//
//   - head: reading the request head (headTimeoutMS from the accept, or from the first byte
//     of a keep-alive connection's next request);
//   - verifying: the head is parsed and its token is being checked on the verifier pool
//     (verify.go); the answer comes back as a loop task (verifyTimeoutMS);
//   - queued: authorised, waiting in the admission FIFO (admission.go), serviced a round at
//     a time between rounds of deliveries;
//   - pending: admitted, its subscriptions registered on their streams or channels, waiting
//     until every one of them knows where it starts (its stream's head read, its channel's
//     LISTEN) before the response head goes out (pendingTimeoutMS);
//   - streaming: the response head is sent; its subscriptions take events, each in its own
//     state — catch-up, live or lagging (subscription.go);
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
//     read the answer;
//   - handed-over: a streaming connection given to a successor process (SIGUSR2, handoff.go):
//     its descriptor and record are on their way; nothing is written to it any more and the
//     loop lets go of it (gnet closes our descriptor, the successor holds another).
//
// A connection the successor adopts (adopt) starts out streaming.
//
// The helpers in this file are the only code that assigns sseConn.state, through sseConn.to
// (a subscription's state has its own helpers, subscription.go; parts_test.go checks both).
// Each says which transition it makes and does what that transition owes: verify parks a
// connection for the pool, queueAdmission puts it in the admission FIFO, admit counts it,
// respond writes the response head, shed says why it was sent away, finish writes the last
// bytes and closes. sweep (from the tick) applies the time
// rules of each state. Every byte to an SSE client goes out through write, writeEvents,
// writeLive or writev (outbound.go has what happens underneath); what the bytes are is the
// transport's (transport.go).
//
// Times are the loop clock, loopEnv.nowMS (unix milliseconds, refreshed every tick).

// connState is where an SSE connection is in its life.
type connState uint8

const (
	stateHead          connState = iota // reading the request head
	stateVerifying                      // a subscriber whose token is on the verifier pool
	stateQueued                         // a subscriber authorised, waiting in the admission FIFO
	statePending                        // admitted and subscribed; no response head yet
	stateStreaming                      // response sent; its subscriptions take events
	stateClosing                        // a final write is queued; the socket closes once it is flushed
	statePublishBody                    // a publish request: reading its body, verifying its token
	statePublishCommit                  // a publish request with the Publisher: answered after COMMIT
	stateIdle                           // keep-alive: between a publisher's requests
	stateLinger                         // answered and closing: discarding input until EOF
	stateHandedOver                     // handed to a successor process (SIGUSR2): never written to again
)

// Time rules of the states.
const (
	headTimeoutMS    = 10_000 // a complete request head within this (docs/http.md, Responses and errors)
	verifyTimeoutMS  = 10_000 // a token check that takes longer (the pool is swamped) is shed
	pendingTimeoutMS = 30_000 // a subscription whose LISTEN or head read takes longer is shed
	keepAliveIdleMS  = 30_000 // a keep-alive connection without a new request for this long is closed
	lingerTimeoutMS  = 2_000  // a lingering close waits at most this long for the client's EOF
	closeLingerMS    = 5_000  // a closing connection's last bytes get this long to leave
	sweepIntervalMS  = 240    // sweep runs at most this often: just under tickSlow, so every slow tick sweeps
	// dbUnavailableAfterMS: once the LISTEN session has been down this long, a connection
	// that has no response head yet is shed with ":database unavailable" rather than left
	// waiting (a PostgreSQL restart that is over within it costs nobody their connection).
	dbUnavailableAfterMS = 2_000
	// slowCloseGraceMS: a subscriber sent away for not reading (evictSlow) gets this long to
	// take its last bytes before it is aborted with what it did not read (docs/operations.md,
	// Memory: the host's memory is given back within 2 s of an eviction).
	slowCloseGraceMS = 500
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
	shedChannelLimit                          // the SSE side's share of the LISTEN session's channels (channels.go)
	shedReasons
)

var shedComments = [shedReasons]string{
	shedOverCapacity:        "over capacity",
	shedDraining:            "draining",
	shedDatabaseUnavailable: "database unavailable",
	shedSubjectLimit:        "too many connections for this subject",
	shedChannelLimit:        "too many channels",
}

// The retry: value a client gets when it is sent away (docs/http.md, Responses and errors:
// 2000–10000 ms, jittered, so that clients told to go away do not come back in one herd).
const (
	retryJitterMinMS = 2_000
	retryJitterMaxMS = 10_000
)

// sseConn is one connection on the SSE port. It lives on the loop goroutine only. What stays
// per connection is here: the socket, the timers and the connection's state; what it follows
// is its subscriptions (subscription.go), each with its own stream, cursor and catch-up state.
//
// Kept small (issue 25: an idle connection costs gnet's own state and little more): 80 B, the
// first subscription inline (TestIdleConnSize pins the size). Whatever only some connections
// hold, or hold only for a while, hangs off ext, nil when there is none of it: the outbound
// queue while the socket is behind, a publisher's request state, the request until the
// response head is sent, what a token brings, the subscriptions after the first.
type sseConn struct {
	c   gnet.Conn
	ext *connExt // what only some connections hold, or hold for a while; nil for none

	// atMS is when the connection entered its state (the time rules of the states other than
	// streaming) and, while it streams, when it was last written to (heartbeats): one field,
	// since a state's time rule counts from its entry and only streaming counts from writes
	// (entering streaming is the response head's write).
	atMS int64

	all int32 // index in connTable.list
	// beatPos is 1 + its index in its slot of connTable.beats (beat), 0 when it is not in the
	// wheel: a connection that closes leaves the wheel at once (unbeat), not when its slot
	// comes round.
	beatPos int32
	state   connState
	closed  bool // OnClose ran: late results (replay reads, verdicts, COMMITs) are ignored
	counted bool // counted in connTable.active (admitted)
	timed   bool // listed in connTable.timed (sweep)
	beat    uint8
	// Its subscriptions (subscription.go): nsub of them, the first inline, the others in
	// ext.more (with what a connection following several streams needs besides).
	nsub  uint8
	first subscription
}

// connExt is what only some connections hold, or hold only for a while (sseConn.ext): an
// idle connection following a public stream holds none of it. Each field has its accessor
// on sseConn and belongs to the part that says so: q the write path's (outbound.go), pub
// publishing's (publish.go), setup the request's (request.go, until the response head), the
// token's tags and exp and the subject admission's (admission.go), more the subscriptions'.
// The extension goes once it holds nothing (tidy).
type connExt struct {
	q         *outQueue    // what the socket has not taken yet; nil when nothing (outbound.go)
	pub       *publishConn // a publisher's request state (publish.go); kept across keep-alive requests
	setup     *subRequest  // what it asked for, from its head until its response head is sent (request.go)
	tags      []string     // the token's tags (audience)
	subject   string       // its key in admission.subjects while counted there ("" = not counted; admission.go)
	expiresMS int64        // the token's exp, unix ms; 0 = none
	more      *subSet      // its subscriptions after the first (subscription.go); nil for one
}

// queue is what the socket has not taken yet (nil: nothing; outbound.go).
func (sc *sseConn) queue() *outQueue {
	if sc.ext == nil {
		return nil
	}
	return sc.ext.q
}

// setQueue gives the connection q as its outbound queue, or (nil) takes it away. spare is an
// empty extension it may take if it has none (nil: it makes one). It returns what the caller
// may keep for the next queue: the spare it did not take, or the extension it let go of, empty
// — so that a socket falling behind and catching up, again and again, allocates nothing
// (outbound.go keeps them with its emptied queues).
func (sc *sseConn) setQueue(q *outQueue, spare *connExt) (unused *connExt) {
	if q != nil {
		if sc.ext == nil {
			if spare == nil {
				spare = &connExt{}
			}
			sc.ext, spare = spare, nil
		}
		sc.ext.q = q
		return spare
	}
	x := sc.ext
	if x == nil {
		return spare
	}
	x.q = nil
	sc.tidy()
	if sc.ext == nil && spare == nil {
		return x
	}
	return spare
}

// publisher is its publish request state (nil: not a publisher; publish.go).
func (sc *sseConn) publisher() *publishConn {
	if sc.ext == nil {
		return nil
	}
	return sc.ext.pub
}

// setPublisher gives the connection its publish request state, or (nil) takes it away.
func (sc *sseConn) setPublisher(p *publishConn) {
	if p != nil {
		sc.extended().pub = p
	} else if sc.ext != nil {
		sc.ext.pub = nil
		sc.tidy()
	}
}

// request is what it asked for, until its response head is sent (nil after; request.go).
func (sc *sseConn) request() *subRequest {
	if sc.ext == nil {
		return nil
	}
	return sc.ext.setup
}

// setRequest records what it asked for, or (nil) lets go of it. While the request is held the
// extension is the one inside it (subRequest.ext), so that setting up allocates no extension
// of its own: an 80-byte connExt per connection, garbage once the response head is sent,
// would sit among the sseConns of the same size class and keep their spans resident (issue
// 25). What of it outlives the setup (a token's tags, the subscriptions after the first)
// moves to an extension of its own when the request goes.
func (sc *sseConn) setRequest(req *subRequest) {
	if req != nil {
		if sc.ext != nil {
			req.ext = *sc.ext
		}
		req.ext.setup = req
		sc.ext = &req.ext
		return
	}
	x := sc.ext
	if x == nil || x.setup == nil {
		return
	}
	inside := x == &x.setup.ext
	x.setup = nil
	sc.tidy()
	if inside && sc.ext != nil {
		moved := *x
		sc.ext = &moved
	}
}

// tidy lets the extension go once it holds nothing.
func (sc *sseConn) tidy() {
	if x := sc.ext; x.q == nil && x.pub == nil && x.setup == nil && x.tags == nil && x.subject == "" && x.expiresMS == 0 && x.more == nil {
		sc.ext = nil
	}
}

// moreSubs is what a connection following several streams holds besides its first
// subscription (nil for one: subscription.go).
func (sc *sseConn) moreSubs() *subSet {
	if sc.ext == nil {
		return nil
	}
	return sc.ext.more
}

// setMoreSubs gives the connection its subscriptions after the first (subscription.go).
func (sc *sseConn) setMoreSubs(m *subSet) { sc.extended().more = m }

// tags is the token's tags (nil: none).
func (sc *sseConn) tags() []string {
	if sc.ext == nil {
		return nil
	}
	return sc.ext.tags
}

// expiresMS is the token's exp in unix ms (0: none).
func (sc *sseConn) expiresMS() int64 {
	if sc.ext == nil {
		return 0
	}
	return sc.ext.expiresMS
}

// subject is its key in admission.subjects while counted there ("": not counted).
func (sc *sseConn) subject() string {
	if sc.ext == nil {
		return ""
	}
	return sc.ext.subject
}

// extended is sc.ext, made if it is not there yet.
func (sc *sseConn) extended() *connExt {
	if sc.ext == nil {
		sc.ext = &connExt{}
	}
	return sc.ext
}

// setSubject records (or, with "", forgets) its key in admission.subjects; the extension goes
// once it holds nothing.
func (sc *sseConn) setSubject(key string) {
	if key != "" {
		sc.extended().subject = key
		return
	}
	if sc.ext != nil {
		sc.ext.subject = ""
		sc.tidy()
	}
}

// to is the one assignment of a state; only the transition helpers below call it.
func (sc *sseConn) to(state connState, nowMS int64) {
	sc.state = state
	sc.atMS = nowMS
}

// enter moves sc to state (the transition helpers below call it): a state other than
// streaming has a time rule, so the connection is listed for the sweep (once).
func (t *connTable) enter(sc *sseConn, state connState) {
	sc.to(state, t.nowMS)
	if state != stateStreaming && !sc.timed {
		sc.timed = true
		t.timed = append(t.timed, sc)
	}
}

// streaming reports whether the response head has been sent and the connection is open
// for events.
func (sc *sseConn) streaming() bool { return !sc.closed && sc.state == stateStreaming }

// ending reports whether the connection is closed or closing: nothing more is written to it.
func (sc *sseConn) ending() bool {
	return sc.closed || sc.state == stateClosing || sc.state == stateHandedOver
}

// sees reports whether the token lets this connection see an event for audience (nil =
// everyone; docs/http.md, Audience).
func (sc *sseConn) sees(audience []string) bool { return auth.InAudience(sc.tags(), audience) }

// wrote records a write to the socket: heartbeats count from the last one. In the other
// states the time rules count from the state's entry, which a write does not move.
func (sc *sseConn) wrote(nowMS int64) {
	if sc.state == stateStreaming {
		sc.atMS = nowMS
	}
}

// cors is the CORS part of a response head: the request's Origin when it is allowed.
func (sc *sseConn) cors() sse.CORS {
	if sc.request() == nil {
		return sse.CORS{}
	}
	return sc.request().cors()
}

// connTable is the SSE port's connections: every one of them (list), the admitted ones
// counted (active), and those closed during the current loop entry (reap, removed on the way
// out). It owns the state machine above and reaches the other parts only through their types.
type connTable struct {
	*loopEnv
	out  *outbound
	tr   transport
	adm  *admission
	pub  *publishing
	subs *subscriptions
	lsn  *listenState
	pres *presenceTable

	list   []*sseConn
	reap   []*sseConn
	active int          // admitted SSE connections (subscribers)
	opened atomic.Int64 // len(list), for the acceptor's hard cap
	// slow: closing connections sent away for not reading (evictSlow), aborted after
	// slowCloseGraceMS (a set beside the connections: a flag would not fit sseConn's size)
	slow map[*sseConn]struct{}

	// The time rules' lists (sweep), so that an idle server's sweep costs what is due, not a
	// pass over every connection: timed holds the connections that entered a state other
	// than streaming (each once: sseConn.timed) until the sweep finds them streaming or
	// closed; beats is a wheel of beatSlots slots of sweepIntervalMS, each the streaming
	// connections whose heartbeat (or token exp) falls due in it, placed again as they
	// come round (beatTick: the last slot done with; the current one is looked at again by the
	// next sweep, for what falls due later in it).
	timed    []*sseConn
	beats    [][]*sseConn
	beatTick int64
}

// beatSlots is the heartbeat wheel's size: 128 × sweepIntervalMS ≈ 31 s. A connection due
// later (a longer --heartbeat, a token's exp) waits in the furthest slot and is placed again
// when that comes round — once per 31 s instead of once per sweep.
const beatSlots = 128

// all is every connection on the SSE port (read it, do not keep it).
func (t *connTable) all() []*sseConn { return t.list }

// count is the number of connections open on the SSE port.
func (t *connTable) count() int { return len(t.list) }

// subscribers is the number of admitted subscribers (counted against --max-connections).
func (t *connTable) subscribers() int { return t.active }

// openCounter is the count of open connections the SSE acceptor caps.
func (t *connTable) openCounter() *atomic.Int64 { return &t.opened }

// --- transitions --------------------------------------------------------------------------

// open registers a new connection on the SSE port: → head; or, with a record h, a connection a
// predecessor handed over (handoff.go) as it stood there: → streaming, counted, its
// subscriptions resumed at their cursors (subscriptions.adopt), the bytes the predecessor
// had not written going out first.
func (t *connTable) open(c gnet.Conn, handed ...*framing.HandoffConn) *sseConn {
	var h *framing.HandoffConn
	if len(handed) > 0 {
		h = handed[0]
	}
	sc := &sseConn{c: c, all: int32(len(t.list))}
	if h == nil {
		t.enter(sc, stateHead)
	}
	t.list = append(t.list, sc)
	t.opened.Store(int64(len(t.list)))
	c.SetContext(sc)
	if h != nil {
		adoptConn(t, sc, h)
	}
	return sc
}

// asked records what a subscription request asked for (its streams, cursor and Origin):
// kept until the response head is sent.
func (t *connTable) asked(sc *sseConn, req *subRequest) { sc.setRequest(req) }

// verify parks a connection whose token is being checked on the verifier pool: head →
// verifying. The pool's answer resumes it (request.go: authorized).
func (t *connTable) verify(sc *sseConn) { t.enter(sc, stateVerifying) }

// queueAdmission puts an authorised connection in the admission FIFO: head or verifying →
// queued. tags and expiresMS are what its token allows it (its audience, its exp); the FIFO
// admits it in its turn.
func (t *connTable) queueAdmission(sc *sseConn, tags []string, expiresMS int64) {
	if tags != nil || expiresMS != 0 {
		x := sc.extended()
		x.tags, x.expiresMS = tags, expiresMS
	}
	t.enter(sc, stateQueued)
	t.adm.push(sc)
	t.tasks.kick()
}

// admit makes a queued connection a subscriber: queued → pending. It counts the connection
// against MaxConnections; the caller then subscribes it, which moves it on with respond once
// every subscription knows where it starts.
func (t *connTable) admit(sc *sseConn) {
	sc.counted = true
	t.active++
	t.metrics.sseConns.Set(float64(t.active))
	t.enter(sc, statePending)
}

// respond writes the response head — 200, the retry field and a comment, at once — once
// every subscription is live (docs/http.md, Cursors and gaps): pending → streaming.
func (t *connTable) respond(sc *sseConn) {
	t.write(sc, t.tr.streamHead(sc.cors(), t.cfg.Retry.Milliseconds()))
	sc.setRequest(nil)
	t.enter(sc, stateStreaming)
	t.schedule(sc)
	t.pres.responded(sc)
}

// finish writes a connection's last bytes (if any) and closes it: → closing. Of what the
// connection still has queued, only an event the socket has begun is kept (the client must
// not see half an event followed by the last bytes); if the socket does not take it all at
// once, the close waits until the queue has drained (outbound.flushQueue) or closeLingerMS
// has passed (sweep).
func (t *connTable) finish(sc *sseConn, last []byte) {
	t.enter(sc, stateClosing)
	t.out.trimQueue(sc)
	if len(last) > 0 {
		t.write(sc, last)
	}
	if sc.pending() == 0 && !sc.closed {
		t.finished(sc)
	}
}

// finished closes a closing connection whose last bytes the socket has taken (finish,
// outbound.flushQueue) — unless it was sent away for not reading and the kernel has not
// delivered them all yet: sweep closes it once it has, or aborts it after slowCloseGraceMS.
func (t *connTable) finished(sc *sseConn) {
	if sc.state != stateClosing || sc.closed || t.isSlow(sc) && unsentBytes(sc.c.Fd()) > 0 {
		return
	}
	_ = sc.c.Close()
}

// isSlow reports whether sc was sent away for not reading (evictSlow).
func (t *connTable) isSlow(sc *sseConn) bool {
	_, slow := t.slow[sc]
	return slow
}

// abort closes a connection that does not read, with what it has not taken: pgsse's queue
// and the kernel's send buffer, which a close would otherwise keep trying to deliver long
// after (SO_LINGER 0: the peer gets a reset) — so that a client sent away for not reading
// holds no memory from that moment (docs/operations.md, Memory): → closing. Never for a close
// whose last bytes the client should still get (finish).
func (t *connTable) abort(sc *sseConn) {
	if sc.closed {
		return
	}
	t.enter(sc, stateClosing)
	t.out.dropQueue(sc)
	_ = unix.SetsockoptLinger(sc.c.Fd(), unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	_ = sc.c.Close()
}

// evictSlow sends away an ephemeral or channel subscriber over its outbound limit
// (budget.go) with a retry field, like any streaming connection (closeWithRetry) — but it is
// not reading: of its queue only an event the socket has begun is kept, and if the socket
// has no room for that and the retry field now, the connection is aborted at once; if it
// has, the client gets slowCloseGraceMS to take them from the kernel before it is aborted
// (sweep). Either way what it did not read is given back at once or within the grace.
func (t *connTable) evictSlow(sc *sseConn) {
	t.metrics.droppedSlowClient.Inc()
	if t.slow == nil {
		t.slow = make(map[*sseConn]struct{})
	}
	t.slow[sc] = struct{}{}
	t.closeWithRetry(sc)
	if sc.closed || sc.pending() == 0 {
		return
	}
	t.out.flushQueue(sc) // the begun event and the retry field, as far as the socket takes them now
	if !sc.closed && sc.pending() > 0 {
		t.abort(sc)
	}
}

// linger writes a connection's last bytes and closes it gracefully although the client may
// still be sending (a publish refused before its body was read): → linger. Once the socket
// has taken the answer, the write side is shut (the client sees the answer and EOF); input
// is discarded until the client's EOF closes the connection or lingerTimeoutMS passes. If
// the answer could not be written at once, it closes as finish does (→ closing).
func (t *connTable) linger(sc *sseConn, last []byte) {
	if sc.closed || sc.pending() > 0 || sc.c.OutboundBuffered() > 0 {
		t.finish(sc, last)
		return
	}
	t.write(sc, last)
	if sc.closed {
		return
	}
	if sc.pending() > 0 || unix.Shutdown(sc.c.Fd(), unix.SHUT_WR) != nil {
		// Part of the answer waits in the queue: close once it has left, as finish does.
		t.enter(sc, stateClosing)
		return
	}
	t.enter(sc, stateLinger)
	_, _ = sc.c.Discard(-1)
}

// beginPublish makes a connection whose head is a publish request a publisher: head →
// publish-body. A connection counts against MaxConnections as a publisher from its first
// publish request until it closes or turns into a subscriber (publishing.countConn).
func (t *connTable) beginPublish(sc *sseConn) {
	t.pub.countConn(sc)
	t.enter(sc, statePublishBody)
}

// submitted records that a publish request is with the Publisher: publish-body →
// publish-commit. Nothing more is read from the connection until it is answered.
func (t *connTable) submitted(sc *sseConn) { t.enter(sc, statePublishCommit) }

// answerPublish writes the answer to a publish request: publish-body or publish-commit →
// idle when the connection is kept alive; otherwise it closes (lingering when the client
// may still be sending).
func (t *connTable) answerPublish(sc *sseConn, b []byte, keepAlive, bodyUnread bool) {
	switch {
	case keepAlive:
		t.write(sc, b)
		t.enter(sc, stateIdle)
	case bodyUnread:
		t.linger(sc, b)
	default:
		t.finish(sc, b)
	}
}

// handOver gives a streaming connection to a successor (handoff.go): streaming →
// handed-over. It appends the connection's record to dst — its subscriptions with their
// cursors and states, token tags, subject, presence subject and watcher flag, expiry and the
// bytes its socket has not taken yet (the unsent remainder of a partly written event first)
// — and returns a duplicate of its descriptor for the successor; the loop's own descriptor
// is closed (gnet: OnClose removes the connection from the tables, the socket lives on in
// the duplicate). ok is false for a connection that cannot be handed over now (not
// streaming, or bytes in gnet's own buffer).
func (t *connTable) handOver(sc *sseConn, dst []byte) (rec []byte, fd int, ok bool) {
	if !sc.streaming() || sc.c.OutboundBuffered() > 0 {
		return dst, -1, false
	}
	h := framing.HandoffConn{Composite: sc.composite(), ExpiresMS: sc.expiresMS(), Subject: t.adm.subjectOf(sc), Tags: sc.tags()}
	h.PresenceSub, h.PresenceWatch = t.pres.member(sc)
	var subs [8]framing.HandoffSub
	if h.Subs, ok = t.subs.record(sc, subs[:0]); !ok {
		return dst, -1, false
	}
	fd, err := unix.FcntlInt(uintptr(sc.c.Fd()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return dst, -1, false
	}
	h.Tail = t.out.takeQueue(sc, nil)
	t.enter(sc, stateHandedOver)
	_ = sc.c.Close()
	return framing.AppendHandoffConn(dst, &h), fd, true
}

func adoptConn(t *connTable, sc *sseConn, h *framing.HandoffConn) {
	if h.Tags != nil || h.ExpiresMS != 0 {
		x := sc.extended()
		x.tags, x.expiresMS = h.Tags, h.ExpiresMS
	}
	sc.counted = true
	t.active++
	t.metrics.sseConns.Set(float64(t.active))
	t.adm.adoptSubject(sc, h.Subject)
	t.enter(sc, stateStreaming)
	sc.wrote(t.nowMS)
	t.schedule(sc) // heartbeats and the token's expiry, as for a connection that responded
	if len(h.Tail) > 0 {
		t.write(sc, h.Tail)
	}
	t.subs.adopt(sc, h)
	t.pres.adopted(sc, h)
}

// nextRequest starts reading a keep-alive connection's next request: idle → head.
func (t *connTable) nextRequest(sc *sseConn) { t.enter(sc, stateHead) }

// shed answers 200 with a jittered retry and a comment saying why, and closes: EventSource
// treats any non-200 as final, so load shedding must not use 503. For a connection whose
// response head has not been sent (head, verifying, queued, pending).
func (t *connTable) shed(sc *sseConn, why shedReason) { t.shedSaying(sc, why, "") }

// schemaMissingComment follows ":database unavailable" when the database has no pgsse schema
// (docs/http.md, Responses and errors): a second comment line, so that the first stays the
// reason a client matches, exactly as before, and this one says what to do.
const schemaMissingComment = "schema not installed: the server's operator must run pgsse migrate"

// shedSaying is shed with a second comment line, detail, after the reason ("": none).
func (t *connTable) shedSaying(sc *sseConn, why shedReason, detail string) {
	t.metrics.shed[why].Inc()
	if detail == "" {
		t.finish(sc, t.tr.shed(sc.cors(), jitteredRetryMS(), shedComments[why]))
		return
	}
	t.finish(sc, t.tr.shed(sc.cors(), jitteredRetryMS(), shedComments[why], detail))
}

// closeWithRetry ends a streaming connection with a jittered retry field (shutdown, too slow
// for ephemeral traffic).
func (t *connTable) closeWithRetry(sc *sseConn) { t.closeWithRetrySaying(sc) }

// tokenExpiredComment says why a stream closes at its token's exp (docs/http.md,
// Authorization): a client that reconnects with the same token will get 401.
const tokenExpiredComment = "token expired"

// closeWithRetrySaying is closeWithRetry with comment lines after the retry field.
func (t *connTable) closeWithRetrySaying(sc *sseConn, comments ...string) {
	if sc.ending() {
		return
	}
	t.finish(sc, t.tr.retry(jitteredRetryMS(), comments...))
}

// retryLater sends a connection away, whatever its state: one still sending its head (or
// idle between requests) is closed, one without a response head is shed for why, a
// streaming one gets a retry field; a publisher reading its body is answered 503, one
// waiting for its COMMIT is answered (and closed) when it comes.
func (t *connTable) retryLater(sc *sseConn, why shedReason) {
	switch {
	case sc.ending():
	case sc.state == stateHead, sc.state == stateIdle, sc.state == stateLinger:
		t.finish(sc, nil)
	case sc.state == statePublishBody:
		t.pub.refuse(sc, 503, "the server is shutting down; retry elsewhere")
	case sc.state == statePublishCommit:
		// Answered after COMMIT (with a close: the server is draining).
	case sc.state < stateStreaming: // verifying, queued, pending
		t.shed(sc, why)
	default:
		t.closeWithRetry(sc)
	}
}

// retryAll sends every connection away (drain).
func (t *connTable) retryAll(why shedReason) {
	for _, sc := range t.list {
		t.retryLater(sc, why)
	}
}

// closed runs from OnClose: the connection is removed from the tables on the way out of
// the current loop entry (reapClosed), so no slice changes under an iteration.
func (t *connTable) closed(sc *sseConn) {
	if sc.closed {
		return
	}
	if sc.state == stateClosing {
		t.out.flushQueue(sc) // the last bytes, as far as the socket takes them now
	}
	sc.closed = true
	t.reap = append(t.reap, sc)
}

// reapClosed removes the connections closed during this loop entry (Server.leave).
func (t *connTable) reapClosed() {
	for len(t.reap) > 0 {
		sc := t.reap[len(t.reap)-1]
		t.reap[len(t.reap)-1] = nil
		t.reap = t.reap[:len(t.reap)-1]
		t.remove(sc)
	}
}

// remove drops a closed connection from every table.
func (t *connTable) remove(sc *sseConn) {
	if sc.counted {
		sc.counted = false
		t.active--
		t.metrics.sseConns.Set(float64(t.active))
	}
	t.adm.uncountSubject(sc)
	t.pub.uncountConn(sc)
	t.pub.release(sc)
	t.subs.unsubscribeAll(sc)
	delete(t.slow, sc)
	t.unbeat(sc)
	t.pres.closed(sc)
	t.list = swapRemove(t.list, sc, connIndex)
	t.opened.Store(int64(len(t.list)))
	t.out.unwatch(sc)
	t.out.dropQueue(sc)
	sc.c = nil
	if sc.ext != nil { // the subscriptions after the first stay where late results find them
		*sc.ext = connExt{more: sc.ext.more}
		sc.tidy()
	}
}

// connIndex is sc's position in connTable.list.
func connIndex(sc *sseConn) *int32 { return &sc.all }

// --- time rules ---------------------------------------------------------------------------

// sweep applies each state's time rule, at most every sweepIntervalMS: a head not complete
// within headTimeoutMS is closed, a token check not answered within verifyTimeoutMS and a
// subscription pending longer than pendingTimeoutMS are shed (over capacity), a pending one
// is shed once the LISTEN session has been down for dbUnavailableAfterMS (database
// unavailable), a streaming connection whose token expired is closed with a retry, one
// without a write for --heartbeat gets a heartbeat, and a closing one whose last bytes have
// not left within closeLingerMS is closed without them; a publish body not complete within
// publishBodyTimeoutMS is answered 408, a keep-alive connection idle for keepAliveIdleMS and
// a lingering one after lingerTimeoutMS are closed.
func (t *connTable) sweep() {
	t.sweepTimed()
	t.sweepBeats()
}

// sweepTimed applies the time rules of the states other than streaming to the connections
// listed in timed, and lets go of those that are streaming or closed.
func (t *connTable) sweepTimed() {
	dbDown := t.lsn.databaseUnavailable()
	kept := 0
	for i := 0; i < len(t.timed); i++ { // a rule may list another connection: len is read each time
		sc := t.timed[i]
		if sc.closed || sc.state == stateStreaming {
			sc.timed = false
			continue
		}
		switch sc.state {
		case stateHead:
			if t.nowMS-sc.atMS >= headTimeoutMS {
				t.finish(sc, nil)
			}
		case stateVerifying:
			if t.nowMS-sc.atMS > verifyTimeoutMS {
				t.shed(sc, shedOverCapacity)
			}
		case statePending:
			switch {
			case dbDown:
				t.shed(sc, shedDatabaseUnavailable)
			case t.nowMS-sc.atMS > pendingTimeoutMS:
				t.shed(sc, shedOverCapacity)
			}
		case stateIdle:
			if t.nowMS-sc.atMS >= keepAliveIdleMS {
				t.finish(sc, nil)
			}
		case stateLinger:
			if t.nowMS-sc.atMS >= lingerTimeoutMS {
				t.finish(sc, nil)
			}
		case statePublishBody:
			if timeout := t.pub.bodyTimeoutMS(); t.nowMS-sc.atMS >= timeout {
				t.pub.refuse(sc, 408, "the request body did not arrive within "+
					strconv.FormatInt(timeout/1000, 10)+" s")
			}
		case stateClosing:
			slow := t.isSlow(sc)
			switch {
			case slow && t.nowMS-sc.atMS >= slowCloseGraceMS:
				t.abort(sc) // sent away for not reading, and it still does not
			case slow && sc.pending() == 0:
				t.finished(sc) // once the kernel has delivered the last bytes
			case sc.pending() > 0 && t.nowMS-sc.atMS >= closeLingerMS:
				t.abort(sc) // the client does not read: give up on the last bytes
			}
		}
		t.timed[kept] = sc
		kept++
	}
	clear(t.timed[kept:])
	t.timed = t.timed[:kept]
}

// schedule places a streaming connection in the heartbeat wheel's slot of its next heartbeat
// (its last write + --heartbeat) or its token's exp, whichever is first.
func (t *connTable) schedule(sc *sseConn) {
	t.unbeat(sc) // never in two slots
	now := t.nowMS / sweepIntervalMS
	if t.beats == nil {
		t.beats = make([][]*sseConn, beatSlots)
		t.beatTick = now - 1
	}
	due := sc.atMS + t.cfg.Heartbeat.Milliseconds()
	if exp := sc.expiresMS(); exp > 0 {
		due = min(due, exp)
	}
	slot := min(max(due/sweepIntervalMS, now), now+beatSlots-1) % beatSlots
	sc.beat, sc.beatPos = uint8(slot), int32(len(t.beats[slot]))+1
	t.beats[slot] = append(t.beats[slot], sc)
}

// unbeat takes sc out of the heartbeat wheel, if it is there (remove).
func (t *connTable) unbeat(sc *sseConn) {
	if sc.beatPos == 0 {
		return
	}
	slot, i := &t.beats[sc.beat], int(sc.beatPos)-1
	sc.beatPos = 0
	last := len(*slot) - 1
	if i > last || (*slot)[i] != sc {
		return
	}
	(*slot)[i] = (*slot)[last]
	(*slot)[i].beatPos = int32(i) + 1
	(*slot)[last] = nil
	*slot = (*slot)[:last]
}

// sweepBeats takes the slots that fell due since the last sweep: a connection whose token
// has expired is closed with retry:, one not written to for --heartbeat gets a heartbeat,
// and each that still streams is placed again; a connection that no longer streams is let
// go. A connection written to meanwhile costs one look when its old slot comes round.
func (t *connTable) sweepBeats() {
	if t.beats == nil {
		return
	}
	heartbeatMS := t.cfg.Heartbeat.Milliseconds()
	now := t.nowMS / sweepIntervalMS
	for tick := max(t.beatTick+1, now-beatSlots+1); tick <= now; tick++ {
		slot := &t.beats[tick%beatSlots]
		due := *slot
		*slot = nil // schedule may append to this slot meanwhile (not due yet, or a later round)
		for _, sc := range due {
			sc.beatPos = 0 // out of the wheel until placed again
		}
		for _, sc := range due {
			if !sc.streaming() {
				continue
			}
			if exp := sc.expiresMS(); exp > 0 && t.nowMS >= exp {
				t.closeWithRetrySaying(sc, tokenExpiredComment)
				continue
			}
			if t.nowMS-sc.atMS >= heartbeatMS {
				t.write(sc, t.tr.heartbeat())
			}
			if sc.streaming() {
				t.schedule(sc)
			}
		}
		clear(due)
		if *slot == nil {
			*slot = due[:0] // keep the slot's array for its next round
		}
	}
	t.beatTick = now - 1 // the current slot again next time: what is due later in it
}

// --- writes -------------------------------------------------------------------------------

// write, writeEvents, writeLive and writev are the only paths from the engine to an SSE
// client's socket; each is one writev (outbound.go: outbound.send).

// write sends b, which the caller may reuse at once (it is copied if the socket does not take
// it all now).
func (t *connTable) write(sc *sseConn, b []byte) {
	t.out.sendOne(sc, b)
	sc.wrote(t.nowMS)
}

// writeEvents sends the encodings of evs, which are shared by every subscriber: what the
// socket does not take is kept by reference, never copied.
func (t *connTable) writeEvents(sc *sseConn, evs []*event) {
	t.out.sendEvents(sc, evs)
	sc.wrote(t.nowMS)
}

// writeLive sends live events (items built by the subscriptions: the events' shared
// encodings, each perhaps led by bytes of the connection's own) like writev, but queues
// durable ones only up to limit bytes (outbound.sendLive); it returns the index in items
// of the first durable event not sent (its lead, if it has one), len(items) if all were.
func (t *connTable) writeLive(sc *sseConn, items []outItem, limit int) int {
	if sc.ending() { // after its last bytes (finish) nothing more goes out
		return len(items)
	}
	n := t.out.sendLive(sc, items, limit)
	sc.wrote(t.nowMS)
	return n
}

// writev sends items as they are: shared (ev set), the connection's own and immutable, or
// transient (copied if kept).
func (t *connTable) writev(sc *sseConn, items []outItem) {
	if sc.ending() { // after its last bytes (finish) nothing more goes out
		return
	}
	t.out.send(sc, items)
	sc.wrote(t.nowMS)
}

// jitteredRetryMS is a retry: value between retryJitterMinMS and retryJitterMaxMS.
func jitteredRetryMS() int64 {
	return retryJitterMinMS + rand.Int64N(retryJitterMaxMS-retryJitterMinMS+1)
}
