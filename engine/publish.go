package engine

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/names"
	"github.com/pgsse/pgsse/sse"
	"github.com/pgsse/pgsse/store"
)

// Publishing over HTTP (docs/http.md): POST /streams/{stream} publishes one event (the body is
// its data) and POST /publish an NDJSON batch, through the group-commit Publisher
// (store.Publisher). A publisher connection carries one request at a time (sseconn.go:
// publish-body → publish-commit → idle, HTTP/1.1 keep-alive): its body is read into the
// connection's buffer (at most --max-publish-bytes, counted against the bodies' budget as
// its bytes arrive: bodyBudget) while its token is checked off the loop (verify.go:
// tokens.check); once both are done the request goes to the Publisher, and the answer is written only after COMMIT,
// from a loop task (the connection may have closed meanwhile). Pipelined requests wait in
// the connection's input until then (at most publishPipelineBytes of them) and are read as
// soon as it is answered, whatever answered it (readAhead).

// Limits of the publishing path (besides --max-publish-bytes).
const (
	publishBodyTimeoutMS     = 30_000    // a body must arrive within this of its head, however it trickles (slow-loris bound)
	publishMemoryBytes       = 128 << 20 // bodies being received, all connections together (at least 2 × --max-publish-bytes)
	publishShareDivisor      = 8         // one subject's bodies: at most this fraction of publishMemoryBytes (at least --max-publish-bytes)
	publishUnverifiedDivisor = 4         // bodies whose token has no verdict yet, together: at most this fraction (at least --max-publish-bytes)
	publishKeepBufBytes      = 4 << 10   // a body buffer up to this size is kept for the connection's next request (idle keep-alive connections hold no more)
	publishPipelineBytes     = 64 << 10  // input a client may send ahead while its request is committed
	publishUnreadAnswerBytes = 64 << 10  // answers a client leaves unread before its connection is closed
	publishRetryAfterSeconds = 2         // Retry-After of a 503: the Publisher reconnects within 0.1–5 s
)

// publishConn is a publisher connection's request state; it lives as long as the
// connection and is reused by its keep-alive requests.
type publishConn struct {
	counted bool   // counted in publishing.publishers
	seq     uint32 // the current request's number: a verdict or COMMIT for an earlier one is ignored

	// The request, copied from its head (the head's bytes are gone once the body is read).
	batch     bool // POST /publish
	stream    string
	event     string
	audience  []string
	ephemeral bool
	keepAlive bool
	expect100 bool
	origin    []byte // the allowed Origin to echo; nil = none

	body     sse.BodyDecoder
	buf      []byte // the body's buffer, kept for the next request while small
	data     []byte // the whole body, owned (in buf), once read
	bodyDone bool   // data is set

	// Its share of the bodies' budget (bodyBudget): held bytes, counted under key — the
	// token's until its verdict (unverified), then its subject's.
	held       int64
	key        string
	verified   bool
	tokenHash  [sha256.Size]byte // the current request's token
	tokenKey   string            // "token:" + tokenHash, kept while the connection keeps its token
	subjectKey string            // the last verdict's subject key, kept likewise

	claims  *auth.Claims // the token's verdict, once known
	granted bool
	status  int    // a refusal decided before the body was read: answered once it is skipped
	reason  string //
	req     store.PublishRequest
	one     [1]store.PublishEvent

	stamps publishStamps // pgsse_publish_stage_seconds (stages.go)
}

// publishStamps are the loop's readings of one request's stages (stages.go); the
// Publisher's follow with its result (store.PublishTimes).
type publishStamps struct {
	headAt time.Time // the loop saw the next request's first bytes (headSeen)
	seen   bool      // headAt is the next request's: set by headSeen, taken by publish
	head   time.Time // this request's headAt; zero when not measured
	parsed time.Time // its head was parsed
	body   time.Time // its body was complete
}

// publish starts a POST /streams/{stream} or POST /publish request: the checks that need
// neither the body nor the token's verdict, then the body (read by readBody) and the
// token (verified off the loop) in parallel.
func (p *publishing) publish(sc *sseConn, req *sse.Request, cors sse.CORS) {
	if sc.publisher() == nil {
		sc.setPublisher(&publishConn{})
	}
	pub := sc.publisher()
	pub.seq++
	st := &pub.stamps
	st.head, st.parsed, st.body = time.Time{}, time.Now(), time.Time{}
	if st.seen {
		st.head, st.seen = st.headAt, false
	}
	pub.batch = req.Route == sse.RoutePublish
	pub.keepAlive, pub.expect100 = req.KeepAlive, req.Expect100
	pub.origin = append(pub.origin[:0], cors.Origin...)
	if cors.Origin == nil {
		pub.origin = pub.origin[:0:0]
	}
	pub.claims, pub.granted, pub.status, pub.reason = nil, false, 0, ""
	pub.data, pub.bodyDone = nil, false
	pub.key, pub.verified = "", false // bodies.start sets them once the request has a token

	switch {
	case p.draining:
		p.closePublish(sc, 503, "the server is shutting down; retry elsewhere")
		return
	case !pub.counted && p.adm.atCapacity():
		p.metrics.shed[shedOverCapacity].Inc() // pgsse_dropped_total{reason="over_capacity"}
		p.closePublish(sc, 503, "over capacity, retry later")
		return
	}
	if err := pub.body.Start(req, p.cfg.MaxPublishBytes, pub.buf); err != nil {
		var pe *sse.ParseError
		if errors.As(err, &pe) && pe.Status == 413 {
			p.closePublish(sc, 413, "request body is larger than --max-publish-bytes ("+strconv.FormatInt(p.cfg.MaxPublishBytes, 10)+" bytes)")
			return
		}
		p.closePublish(sc, statusOf(err), err.Error())
		return
	}
	// Nothing is reserved for the Content-Length: a body counts against the budget as it
	// arrives (readBody), or 128 slow clients announcing 1 MiB each would hold it all.
	p.conns.beginPublish(sc)
	if pub.body.Done() { // Content-Length: 0
		p.bodyRead(sc)
	}

	// What the head alone can refuse (the stream and the query parameters of a single event;
	// a batch's lines are checked once it is read).
	if !pub.batch {
		if err := p.singleEventParams(pub, req); err != nil {
			p.refuse(sc, 400, err.Error())
			return
		}
	}
	tok := requestToken(req)
	switch {
	case tok == nil:
		p.refuse(sc, 401, noTokenReason(req, errNoPublishToken))
		return
	case !p.tok.running():
		p.refuse(sc, 401, "token authentication is not configured")
		return
	case crossSiteCookie(req, cors) && len(req.Origin) == 0:
		p.refuse(sc, 403, "a publish authorised by the pgsse_token cookie must come from the same site: this one says Sec-Fetch-Site: "+string(req.SecFetchSite)+" (send the token in Authorization, or from a page of one of --cors-origins)")
		return
	case crossSiteCookie(req, cors):
		p.refuse(sc, 403, "a publish authorised by the pgsse_token cookie must come from the same origin or one of --cors-origins")
		return
	}
	p.bodies.start(pub, tok)
	seq := pub.seq
	claims, err, verdict := p.tok.check(tok, func(claims *auth.Claims, err error) {
		p.onPublishVerdict(sc, seq, claims, err)
		p.readAhead(sc)
	})
	switch verdict {
	case tokenChecked:
		p.onPublishVerdict(sc, seq, claims, err)
	case tokenBusy:
		p.refuse(sc, 503, "token verification is overloaded; retry shortly")
	}
}

// singleEventParams checks and copies what POST /streams/{stream} takes from its head:
// the stream, and the query parameters event, audience and ephemeral.
func (p *publishing) singleEventParams(pub *publishConn, req *sse.Request) error {
	if err := names.CheckStream(req.Name); err != nil {
		return &store.EventError{Field: "stream", Err: err}
	}
	if req.HasEvent {
		if err := names.CheckEvent(req.Event); err != nil {
			return &store.EventError{Field: "event", Err: err}
		}
	}
	if err := names.CheckAudience(req.Audience); err != nil {
		return &store.EventError{Field: "audience", Err: err}
	}
	if pub.stream != string(req.Name) { // no allocation when a connection keeps its stream
		pub.stream = string(req.Name)
	}
	pub.event = ""
	if len(req.Event) > 0 {
		pub.event = string(req.Event)
	}
	pub.audience = pub.audience[:0]
	for _, t := range req.Audience {
		pub.audience = append(pub.audience, string(t))
	}
	pub.ephemeral = req.Ephemeral
	return nil
}

// onPublishVerdict takes the token's verdict for request seq (on the loop).
func (p *publishing) onPublishVerdict(sc *sseConn, seq uint32, claims *auth.Claims, err error) {
	pub := sc.publisher()
	if sc.closed || pub == nil || pub.seq != seq || sc.state != statePublishBody || pub.status != 0 {
		return // closed, answered or refused meanwhile
	}
	switch {
	case err != nil:
		p.refuse(sc, 401, err.Error())
		return
	case !pub.batch && !claims.AllowsPublish([]byte(pub.stream)):
		p.refuse(sc, 403, claims.NotGrantedPublish([]byte(pub.stream), "publishing to stream "+pub.stream))
		return
	}
	pub.claims, pub.granted = claims, true
	p.bodies.verified(pub, claims)
	if pub.bodyDone {
		p.submitPublish(sc)
		return
	}
	if pub.expect100 {
		p.conns.write(sc, p.ans.continue100())
	}
}

// readBody feeds the connection's input to the body decoder; it reports whether the
// connection moved on (body complete, or refused) so that requests.read goes on.
func (p *publishing) readBody(sc *sseConn) bool {
	pub := sc.publisher()
	if pub.bodyDone {
		// Waiting for the token's verdict; what follows is the next request, left in the
		// input (readAhead reads it once this one is answered) up to publishPipelineBytes.
		if sc.c.InboundBuffered() > publishPipelineBytes {
			p.conns.finish(sc, nil)
		}
		return false
	}
	in, _ := sc.c.Peek(-1)
	if len(in) == 0 {
		return false
	}
	n, done, err := pub.body.Decode(in)
	if err != nil {
		discard(sc.c, n)
		var pe *sse.ParseError
		if errors.As(err, &pe) && pe.Status == 413 {
			p.closePublish(sc, 413, "request body is larger than --max-publish-bytes ("+strconv.FormatInt(p.cfg.MaxPublishBytes, 10)+" bytes)")
		} else {
			p.closePublish(sc, statusOf(err), err.Error())
		}
		return true
	}
	// What the body holds now: its buffer, or, for a body that came whole in this input, the
	// copy bodyRead is about to make. A refused request's body is skipped, not kept.
	holds := int64(cap(pub.body.Buffer()))
	if done {
		holds = max(holds, int64(len(pub.body.Body())))
	}
	if pub.status == 0 {
		if why := p.bodies.grow(pub, holds-pub.held); why != "" {
			discard(sc.c, n)
			p.closePublish(sc, 503, why) // the buffer goes with the request (endPublish)
			return true
		}
	}
	if !done {
		discard(sc.c, n)
		return false
	}
	p.bodyRead(sc) // before discarding: the body may be a view into the input
	discard(sc.c, n)
	switch {
	case pub.status != 0:
		p.answerPublishError(sc, pub.status, pub.reason)
	case pub.granted:
		p.submitPublish(sc)
	}
	return true
}

// discard drops the first n bytes of the connection's input (gnet's Discard(0) would drop
// all of it).
func discard(c gnet.Conn, n int) {
	if n > 0 {
		_, _ = c.Discard(n)
	}
}

// bodyRead takes ownership of a complete body: a view into the connection's input is
// copied into the connection's buffer.
func (p *publishing) bodyRead(sc *sseConn) {
	pub := sc.publisher()
	body, buf := pub.body.Body(), pub.body.Buffer()
	if len(body) > 0 && (cap(buf) == 0 || &buf[:1][0] != &body[0]) {
		buf = append(buf[:0], body...)
		body = buf
		p.bodies.add(pub, int64(cap(buf))-pub.held) // the copy's rounding up: counted even over the budget
	}
	pub.buf = buf[:0]
	pub.data, pub.bodyDone = body, true
	pub.stamps.body = time.Now()
}

// headSeen notes that the loop is reading a request head of a connection that has published
// before (requests.readHead): the head stage starts at the first such reading.
func (p *publishing) headSeen(sc *sseConn) {
	if pub := sc.publisher(); pub != nil && !pub.stamps.seen {
		pub.stamps.headAt, pub.stamps.seen = time.Now(), true
	}
}

// observeStages records the stages of request pub, answered at answered after res.
func (p *publishing) observeStages(pub *publishConn, res *store.PublishResult, answered time.Time) {
	st, t := &pub.stamps, &res.Times
	c := p.stages
	c.observe(stageHead, st.head, st.parsed)
	c.observe(stageBody, st.parsed, st.body)
	c.observe(stageQueued, st.body, t.Queued)
	c.observe(stageSent, t.Queued, t.Sent)
	c.observe(stageCommitted, t.Sent, t.Committed)
	c.observe(stageAnswered, t.Committed, answered)
	if !pub.batch && !pub.ephemeral {
		c.committedHTTP(pub.stream, res.IDs[0], t.Committed)
	}
}

// submitPublish hands a request whose body is read and whose token allows it to the
// Publisher: publish-body → publish-commit, or an answer at once when it is refused.
func (p *publishing) submitPublish(sc *sseConn) {
	pub := sc.publisher()
	if pub.batch {
		events, err := store.ParseBatch(pub.data)
		if err != nil {
			p.answerPublishError(sc, 400, err.Error())
			return
		}
		for i := range events {
			if !pub.claims.AllowsPublish([]byte(events[i].Stream)) {
				p.answerPublishError(sc, 403, "line "+strconv.Itoa(i+1)+": "+pub.claims.NotGrantedPublish([]byte(events[i].Stream), "publishing to stream "+events[i].Stream))
				return
			}
		}
		pub.req = store.PublishRequest{Events: events, Batch: true}
	} else {
		pub.one[0] = store.PublishEvent{Stream: pub.stream, Data: pub.data, Event: pub.event, Audience: pub.audience, Ephemeral: pub.ephemeral}
		pub.req = store.PublishRequest{Events: pub.one[:]}
	}
	publisher := p.publisherFor()
	if publisher == nil {
		p.answerPublishError(sc, 503, "the server is shutting down; retry elsewhere")
		return
	}
	ca := &committedAnswer{sc: sc, seq: pub.seq}
	if err := publisher.Submit(&pub.req, func(res store.PublishResult) {
		ca.res = res
		p.answers.push(ca)
		p.tasks.push(func() { p.onCommitted(ca) })
	}); err != nil {
		status, reason := p.publishFailed(err)
		p.answerPublishError(sc, status, reason)
		return
	}
	if !pub.batch && !pub.ephemeral {
		p.stages.submitted(pub.stream)
	}
	p.bodies.release(pub) // the Publisher's own budget holds the data now
	p.conns.submitted(sc)
}

// committedAnswer is a Publisher's result for request seq of sc, waiting to be answered on
// the loop: by the fan-out between two slices of its writes (answerQueued), or by its own
// task (onCommitted), whichever comes first — a publisher's answer never waits for a fan-out
// round to end (docs/architecture.md, Publishing).
type committedAnswer struct {
	sc       *sseConn
	seq      uint32
	res      store.PublishResult
	answered bool
	early    []earlyEvent // its durable events for this process's subscribers (deliverEarly)
}

type earlyEvent struct {
	stream string
	ev     *event
}

// answerQueue hands committed results from the Publisher's goroutine to the loop apart from
// the task queue, so that the fan-out can answer them between slices of a round (waiting is
// what it polls: one atomic load per slice).
type answerQueue struct {
	mu      sync.Mutex
	q       []*committedAnswer
	waiting atomic.Bool
}

func (a *answerQueue) push(ca *committedAnswer) {
	a.mu.Lock()
	a.q = append(a.q, ca)
	a.waiting.Store(true)
	a.mu.Unlock()
}

func (a *answerQueue) take() []*committedAnswer {
	if !a.waiting.Load() {
		return nil
	}
	a.mu.Lock()
	q := a.q
	a.q = nil
	a.waiting.Store(false)
	a.mu.Unlock()
	return q
}

// answerQueued writes the answers of every committed request waiting, in commit order. It
// runs on the loop between slices of a fan-out round (fanout.between), so it touches nothing
// the round iterates: it writes to publisher connections only, encodes the early events
// without queueing them and reads no pipelined request (onCommitted does both).
func (p *publishing) answerQueued() {
	for _, ca := range p.answers.take() {
		p.answerCommitted(ca)
	}
}

// onCommitted is request ca's task: its answer, unless the fan-out wrote it already, then its
// events for the fan-out (deliverEarly) and the connection's next pipelined request, if any.
func (p *publishing) onCommitted(ca *committedAnswer) {
	p.answerQueued() // ca's answer and those committed before it, in order
	p.answerCommitted(ca)
	for _, e := range ca.early {
		p.fan.committed(e.stream, e.ev)
	}
	ca.early = nil
	sc := ca.sc
	if pub := sc.publisher(); pub != nil && pub.seq == ca.seq && !sc.closed {
		p.readAhead(sc) // (a request read since the answer was read by gnet's callback)
	}
}

// answerCommitted answers request ca once its transaction has committed (or failed), once.
func (p *publishing) answerCommitted(ca *committedAnswer) {
	if ca.answered {
		return
	}
	ca.answered = true
	sc, res := ca.sc, &ca.res
	pub := sc.publisher()
	if sc.closed || pub == nil || pub.seq != ca.seq || sc.state != statePublishCommit {
		p.metrics.publishRequestsFor(resultStatus(*res)).Inc() // the outcome is counted; the client has gone
		return
	}
	if res.Err != nil {
		status, reason := p.publishFailed(res.Err)
		p.answerPublishError(sc, status, reason)
		return
	}
	p.metrics.publishRequestsFor(200).Inc()
	keep := p.keepPublisher(pub)
	reply := sse.Reply{CORS: pub.cors(), KeepAlive: keep}
	var b []byte
	if pub.batch {
		b = p.ans.publishedBatch(res.IDs, reply)
	} else {
		b = p.ans.published([]byte(pub.stream), res.IDs[0], reply)
	}
	p.conns.answerPublish(sc, b, keep, false)
	p.observeStages(pub, res, time.Now())
	ca.early = p.deliverEarly(pub, res)
	p.endPublish(pub)
}

// deliverEarly encodes the request's committed durable events for this process's fan-out,
// which takes them once the answer is written (fanout.committed: when that keeps each
// stream's order), so that the answer does not wait for that fan-out either.
func (p *publishing) deliverEarly(pub *publishConn, res *store.PublishResult) []earlyEvent {
	if res.TimeUS <= 0 || len(res.IDs) != len(pub.req.Events) {
		return nil
	}
	var early []earlyEvent
	for i := range pub.req.Events {
		e := &pub.req.Events[i]
		if e.Ephemeral || res.IDs[i] <= 0 {
			continue
		}
		if ev := p.fan.earlyEvent(e.Stream, res.IDs[i], e.Event, e.Data, e.Audience, res.TimeUS, res.Times.Committed); ev != nil {
			early = append(early, earlyEvent{e.Stream, ev})
		}
	}
	return early
}

// readAhead reads what the client sent ahead of an answer decided off the read path — a
// token's verdict from the verifier pool, a COMMIT: the requests it pipelined are already in
// the input and are processed now, not once the client sends more bytes (issue 23: a refusal
// from the pool left them unanswered until the keep-alive timeout).
func (p *publishing) readAhead(sc *sseConn) {
	if !sc.closed {
		p.req.read(sc)
	}
}

// refusePublish refuses the request with status: at once and with a close when its body
// cannot be read first (Expect: 100-continue, or the body timed out, or the server is
// draining); otherwise the rest of the body is skipped and the answer, on a kept-alive
// connection, goes out when it is consumed.
func (p *publishing) refuse(sc *sseConn, status int, reason string) {
	pub := sc.publisher()
	switch {
	case pub.bodyDone:
		p.answerPublishError(sc, status, reason)
	case pub.expect100 || status == 408 || status == 503 || !pub.keepAlive:
		p.closePublish(sc, status, reason)
	default:
		pub.status, pub.reason = status, reason
		pub.body.Skip()
		p.bodies.release(pub)
	}
}

// answerPublishError answers a request whose body has been read with an error status.
func (p *publishing) answerPublishError(sc *sseConn, status int, reason string) {
	pub := sc.publisher()
	p.metrics.publishRequestsFor(status).Inc()
	keep := p.keepPublisher(pub)
	p.conns.answerPublish(sc, p.appendPublishError(status, reason, pub, keep), keep, false)
	p.endPublish(pub)
}

// closePublish answers with an error status and closes the connection, whose input is
// discarded until the client's EOF (linger).
func (p *publishing) closePublish(sc *sseConn, status int, reason string) {
	pub := sc.publisher()
	p.metrics.publishRequestsFor(status).Inc()
	p.conns.answerPublish(sc, p.appendPublishError(status, reason, pub, false), false, true)
	p.endPublish(pub)
}

func (p *publishing) appendPublishError(status int, reason string, pub *publishConn, keepAlive bool) []byte {
	r := sse.Reply{CORS: pub.cors(), KeepAlive: keepAlive}
	if status == 503 {
		r.RetryAfterSeconds = publishRetryAfterSeconds
	}
	return p.ans.reply(status, reason, r)
}

// keepPublisher decides whether the connection stays open after this answer.
func (p *publishing) keepPublisher(pub *publishConn) bool { return pub.keepAlive && !p.draining }

// endPublish releases what a request held once it is answered.
func (p *publishing) endPublish(pub *publishConn) {
	p.bodies.release(pub)
	if cap(pub.buf) > publishKeepBufBytes {
		pub.buf = nil
	}
	pub.body = sse.BodyDecoder{} // nor does the decoder keep a larger buffer, or a view into the input
	pub.data, pub.req, pub.one[0], pub.claims = nil, store.PublishRequest{}, store.PublishEvent{}, nil
}

// release drops a closed connection's request state (connTable.remove).
func (p *publishing) release(sc *sseConn) {
	if sc.publisher() != nil {
		p.bodies.release(sc.publisher())
		sc.setPublisher(nil) // a request still with the Publisher keeps its own data alive
	}
}

// bodyBudget is the memory that publish bodies being received may hold (docs/http.md,
// Publishing over HTTP). A body counts as its bytes arrive — the capacity of the buffer they
// are read into — never for the length its head announces, from its first byte until the
// Publisher has it (or it is refused); the bytes of one body that came in one read are counted
// at once. Three limits, each a 503 that says which: all bodies together at most total; the
// bodies of one subject — the token's sub claim, or the token itself when it has none, the key
// of --max-connections-per-subject — at most share, so that one client cannot take the budget
// from the others however many connections it opens; and while a token's verdict is not known
// yet (the pool verifies it) its bodies count under the token and also against unverified, the
// most all such bodies may hold together, so that tokens nobody has verified — a flood of
// forged ones — cannot take it either. A body's deadline counts from its head, whatever
// arrives meanwhile (publishBodyTimeoutMS), so a slow client holds what it has sent for at
// most that long.
type bodyBudget struct {
	total, share, unverifiedMax int64
	held                        int64            // all bodies
	unverified                  int64            // bodies whose token has no verdict yet
	byKey                       map[string]int64 // per subject (or token)
}

func newBodyBudget(maxPublishBytes int64) bodyBudget {
	total := max(publishMemoryBytes, 2*maxPublishBytes)
	return bodyBudget{
		total:         total,
		share:         max(total/publishShareDivisor, maxPublishBytes),
		unverifiedMax: max(total/publishUnverifiedDivisor, maxPublishBytes),
		byKey:         map[string]int64{},
	}
}

// The 503 texts of the three limits (docs/http.md, Publishing over HTTP).
const (
	bodiesFullText       = "too many publish bodies are being received; retry later"
	bodiesSubjectText    = "too many publish bodies are being received for this token's subject; retry later"
	bodiesUnverifiedText = "too many publish bodies are waiting for their tokens to be verified; retry later"
)

// start begins counting a request's body under its token tok, unverified (publishing.publish,
// before the token is checked; pub holds nothing yet).
func (b *bodyBudget) start(pub *publishConn, tok []byte) {
	if h := sha256.Sum256(tok); h != pub.tokenHash || pub.tokenKey == "" {
		pub.tokenHash = h
		pub.tokenKey = "token:" + string(h[:])
		pub.subjectKey = ""
	}
	pub.key, pub.verified = pub.tokenKey, false
}

// verified moves what a request holds from its token to its subject, once the token is
// known to be good (its grant checked): from then on the subject's share applies.
func (b *bodyBudget) verified(pub *publishConn, claims *auth.Claims) {
	if pub.verified {
		return
	}
	key := pub.tokenKey
	switch sub := claims.Subject; {
	case sub == "":
	case len(pub.subjectKey) == len("sub:")+len(sub) && pub.subjectKey[len("sub:"):] == sub:
		key = pub.subjectKey
	default:
		pub.subjectKey = subjectKey(claims, &pub.tokenHash)
		key = pub.subjectKey
	}
	n := pub.held
	b.uncount(pub)
	pub.key, pub.verified = key, true
	b.add(pub, n)
}

// grow counts n more bytes of pub's body; when a limit would be passed it counts nothing and
// returns the text of the refusal ("" = counted).
func (b *bodyBudget) grow(pub *publishConn, n int64) string {
	switch {
	case n <= 0:
		return ""
	case b.held+n > b.total:
		return bodiesFullText
	case b.byKey[pub.key]+n > b.share:
		return bodiesSubjectText
	case !pub.verified && b.unverified+n > b.unverifiedMax:
		return bodiesUnverifiedText
	}
	b.add(pub, n)
	return ""
}

// add counts n bytes pub already holds, whatever the limits say.
func (b *bodyBudget) add(pub *publishConn, n int64) {
	if n <= 0 {
		return
	}
	pub.held += n
	b.held += n
	b.byKey[pub.key] += n
	if !pub.verified {
		b.unverified += n
	}
}

// release drops everything pub's request holds.
func (b *bodyBudget) release(pub *publishConn) { b.uncount(pub) }

func (b *bodyBudget) uncount(pub *publishConn) {
	if pub.held == 0 {
		return
	}
	b.held -= pub.held
	if !pub.verified {
		b.unverified -= pub.held
	}
	if left := b.byKey[pub.key] - pub.held; left > 0 {
		b.byKey[pub.key] = left
	} else {
		delete(b.byKey, pub.key)
	}
	pub.held = 0
}

func (pub *publishConn) cors() sse.CORS {
	if len(pub.origin) == 0 {
		return sse.CORS{}
	}
	return sse.CORS{Origin: pub.origin, Credentials: true}
}

// statusOf is the status of a request-parsing error (400 when it names none).
func statusOf(err error) int {
	var pe *sse.ParseError
	if errors.As(err, &pe) {
		return pe.Status
	}
	return 400
}

// The answers to publishes the server could not carry out: fixed texts that say what happened
// and nothing of the server's configuration (docs/http.md, Publishing over HTTP) — the
// Publisher logs the cause with its details (the connection string's user and database,
// PostgreSQL's message).
const (
	publishUnavailableText = "PostgreSQL is unavailable; nothing was published"
	publishNotMigratedText = "the database is not set up for pgsse yet (its operator must run pgsse migrate); nothing was published"
	publishUnknownText     = "the connection to PostgreSQL was lost during COMMIT: the events may or may not have been published"
	publishQueueFullText   = "too many publishes are queued; retry shortly; nothing was published"
	publishClosedText      = "the server is shutting down; retry elsewhere"
	publishInternalText    = "the server could not publish the request (its log says why); nothing was published"
)

// publishErrorStatus maps the Publisher's errors to the statuses of docs/http.md, Publishing over
// HTTP. What names the request (its fields, its size) is answered as it is; anything about the
// server is answered with a fixed text.
func publishErrorStatus(err error) (int, string) {
	var ee *store.EventError
	switch {
	case errors.As(err, &ee) && errors.Is(err, store.ErrEventTooLarge):
		return 413, err.Error()
	case errors.As(err, &ee):
		return 400, err.Error()
	case errors.Is(err, store.ErrNotMigrated):
		return 503, publishNotMigratedText
	case errors.Is(err, store.ErrOutcomeUnknown):
		return 503, publishUnknownText
	case errors.Is(err, store.ErrUnavailable):
		return 503, publishUnavailableText
	case errors.Is(err, store.ErrPublishQueueFull):
		return 503, publishQueueFullText
	case errors.Is(err, store.ErrPublisherClosed):
		return 503, publishClosedText
	}
	return 500, publishInternalText // e.g. pgsse.max_event_bytes is not a number: publishFailed logs it
}

// publishFailed is publishErrorStatus for an answer about to be sent: a 500, which the
// Publisher has not explained in the log, is logged here (the repeat limiter keeps it to one
// line per cause per 30 s).
func (p *publishing) publishFailed(err error) (int, string) {
	status, reason := publishErrorStatus(err)
	if status == 500 {
		p.log.Error("publish failed; the request was answered 500", "err", err)
	}
	return status, reason
}

func resultStatus(res store.PublishResult) int {
	if res.Err == nil {
		return 200
	}
	status, _ := publishErrorStatus(res.Err)
	return status
}

// isPOST reports whether a request head that failed to parse is a POST (its answer then
// counts as a publish request and closes with a linger: a body may follow).
func isPOST(head []byte) bool { return bytes.HasPrefix(head, []byte("POST ")) }

// --- the Publisher -----------------------------------------------------------------------

// publisherFor is the server's Publisher, started by the first publish request (a server
// nobody publishes to holds no publishing connection); nil once the server is stopping.
func (p *publishing) publisherFor() *store.Publisher {
	if p.publisher != nil {
		return p.publisher
	}
	p.pubMu.Lock()
	defer p.pubMu.Unlock()
	if p.pubStopped {
		return nil
	}
	p.publisher = store.NewPublisher(store.PublisherConfig{
		DatabaseURL: p.cfg.DatabaseURL,
		Logger:      p.log,
		Observe:     p.metrics.observePublish,
	})
	p.pubShared = p.publisher
	return p.publisher
}

// stopPublisher publishes what is queued (until ctx is done) and closes the Publisher (Run,
// after the drain).
func (p *publishing) stopPublisher(ctx context.Context) {
	p.pubMu.Lock()
	p.pubStopped = true
	publisher := p.pubShared
	p.pubMu.Unlock()
	if publisher != nil {
		publisher.Close(ctx)
	}
}

// publishing is the loop's part for publishing over HTTP: the Publisher, the connections
// counted as publishers and the memory their bodies hold.
type publishing struct {
	*loopEnv
	conns *connTable
	req   *requests
	tok   *tokens
	adm   *admission
	ans   *httpAnswers
	fan   *fanout // early local delivery of committed events (deliverEarly)

	answers answerQueue // committed results, answered between fan-out slices or by their task

	// Shared by the loop (publisherFor) and Run (stopPublisher).
	pubMu      sync.Mutex
	pubStopped bool
	pubShared  *store.Publisher // guarded by pubMu

	// Loop-owned.
	publisher  *store.Publisher // the loop's copy of pubShared
	publishers int              // connections counted as publishers
	bodies     bodyBudget       // what publish bodies being received hold
	// publishBodyTimeoutMS is the constant of that name (a field so that tests can shorten it).
	publishBodyTimeoutMS int64
}

func newPublishing(env *loopEnv, conns *connTable, req *requests, tok *tokens, adm *admission, ans *httpAnswers, fan *fanout) publishing {
	return publishing{loopEnv: env, conns: conns, req: req, tok: tok, adm: adm, ans: ans, fan: fan,
		bodies: newBodyBudget(env.cfg.MaxPublishBytes), publishBodyTimeoutMS: publishBodyTimeoutMS}
}

// count is the number of connections counted as publishers.
func (p *publishing) count() int { return p.publishers }

// bodyTimeoutMS is how long a publish body may take to arrive.
func (p *publishing) bodyTimeoutMS() int64 { return p.publishBodyTimeoutMS }

// countConn counts a connection as a publisher from its first publish request on
// (connTable.beginPublish).
func (p *publishing) countConn(sc *sseConn) {
	if !sc.publisher().counted {
		sc.publisher().counted = true
		p.publishers++
		p.metrics.publishConns.Set(float64(p.publishers))
	}
}

// uncountConn stops counting a publisher connection that closed or turned into a subscriber.
func (p *publishing) uncountConn(sc *sseConn) {
	if sc.publisher() != nil && sc.publisher().counted {
		sc.publisher().counted = false
		p.publishers--
		p.metrics.publishConns.Set(float64(p.publishers))
	}
}
