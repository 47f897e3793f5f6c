package engine

import (
	"bytes"

	"github.com/pgsse/pgsse/sse"
	"github.com/pgsse/pgsse/store"
)

// The one file of engine/ that makes bytes with package sse: the SSE transport (transport.go)
// and the HTTP answers of the port (httpAnswers), which any transport on it would share.

// scratchBytes is each encoder's initial scratch.
const scratchBytes = 64 << 10

// sseTransport is Server-Sent Events (docs/http.md, The event stream).
type sseTransport struct {
	scratch []byte
	json    []byte                                               // a presence event's data, before it is made an event
	encode  func(dst []byte, id int64, name, data []byte) []byte // encodeEvent, made once
}

var _ transport = (*sseTransport)(nil)

func newSSETransport() sseTransport {
	return sseTransport{scratch: make([]byte, 0, scratchBytes), encode: encodeEvent}
}

// streamHead: 200 text/event-stream, then the retry field and a comment, so that the client
// sees the stream open at once.
func (t *sseTransport) streamHead(cors sse.CORS, retryMS int64) []byte {
	b := sse.AppendStreamHead(t.scratch[:0], cors)
	b = sse.AppendRetry(b, retryMS)
	b = sse.AppendComment(b, commentPgsse)
	b = append(b, '\n')
	t.scratch = b[:0]
	return b
}

var commentPgsse = []byte("pgsse")

func (t *sseTransport) event(dst []byte, id int64, name, data []byte) []byte {
	return sse.AppendEvent(dst, id, name, data)
}

// eventBody strips the "id: …" line sse.AppendEvent writes first for a durable event.
func (t *sseTransport) eventBody(enc []byte) []byte {
	if !bytes.HasPrefix(enc, idField) {
		return enc
	}
	if i := bytes.IndexByte(enc, '\n'); i >= 0 {
		return enc[i+1:]
	}
	return enc
}

var idField = []byte("id:")

// compositeID is "id: <k>:<c0>,…,<cK-1>".
func (t *sseTransport) compositeID(dst []byte, k int, cursors []int64) []byte {
	return sse.AppendCompositeID(dst, k, cursors)
}

func (t *sseTransport) replayEncoder() func(dst []byte, id int64, name, data []byte) []byte {
	return t.encode
}

// encodeEvent is the table reads' store.ReadRequest.Encode: an event's SSE encoding, made
// straight from the read buffer. Given no buffer (a large event), it allocates one of the
// encoding's size, so the event is held once.
func encodeEvent(dst []byte, id int64, name, data []byte) []byte {
	if dst == nil {
		lines := bytes.Count(data, []byte{'\n'}) + bytes.Count(data, []byte{'\r'}) + 1
		dst = make([]byte, 0, len(data)+len(name)+len("id: \nevent: \n\n")+20+lines*len("data: \n"))
	}
	return sse.AppendEvent(dst, id, name, data)
}

// gap is an event pgsse:gap without an id (docs/http.md, Cursors and gaps).
func (t *sseTransport) gap(stream []byte, after, resume int64) []byte {
	b := sse.AppendGap(t.scratch[:0], stream, after, resume)
	t.scratch = b[:0]
	return b
}

// heartbeat is a comment line.
func (t *sseTransport) heartbeat() []byte { return sseHeartbeat }

var sseHeartbeat = []byte(":\n")

// shed: 200 text/event-stream with the retry field and a comment line per why, then the close.
func (t *sseTransport) shed(cors sse.CORS, retryMS int64, why ...string) []byte {
	b := sse.AppendStreamHead(t.scratch[:0], cors)
	b = sse.AppendRetry(b, retryMS)
	for _, w := range why {
		b = sse.AppendComment(b, []byte(w))
	}
	b = append(b, '\n')
	t.scratch = b[:0]
	return b
}

// presenceFull is "event: pgsse:presence" with {"stream":…,"present":[…],"anonymous":n}, no id.
func (t *sseTransport) presenceFull(stream string, present []string, anonymous int64) []byte {
	t.json = sse.AppendPresenceFull(t.json[:0], stream, present, anonymous)
	return sse.AppendEvent(nil, 0, sse.PresenceEvent, t.json)
}

// presenceChange is "event: pgsse:presence" with {"stream":…,"join":[…],"leave":[…],"anonymous":n}.
func (t *sseTransport) presenceChange(stream string, joins, leaves []string, anonymous int64) []byte {
	t.json = sse.AppendPresenceChange(t.json[:0], stream, joins, leaves, anonymous)
	return sse.AppendEvent(nil, 0, sse.PresenceEvent, t.json)
}

// retry is a retry field, then a comment line per why, as its own block.
func (t *sseTransport) retry(retryMS int64, why ...string) []byte {
	b := sse.AppendRetry(t.scratch[:0], retryMS)
	for _, w := range why {
		b = sse.AppendComment(b, []byte(w))
	}
	b = append(b, '\n')
	t.scratch = b[:0]
	return b
}

// httpAnswers encodes the port's HTTP answers that are not a stream: errors, 405, preflights,
// and the answers to publish requests. Like the transport's, its bytes are valid until its
// next call.
type httpAnswers struct {
	scratch []byte
	json    []byte // a JSON body, before it is wrapped in its answer
}

func newHTTPAnswers() httpAnswers { return httpAnswers{scratch: make([]byte, 0, scratchBytes)} }

func (a *httpAnswers) keep(b []byte) []byte { a.scratch = b[:0]; return b }

// error is status with a one-line text/plain body, and a close.
func (a *httpAnswers) error(status int, reason string, cors sse.CORS) []byte {
	return a.keep(sse.AppendError(a.scratch[:0], status, reason, cors))
}

// errorHead is error's head alone (the answer to a HEAD request).
func (a *httpAnswers) errorHead(status int, reason string, cors sse.CORS) []byte {
	return a.keep(sse.AppendErrorHead(a.scratch[:0], status, reason, cors))
}

// unauthorized is 401 with the Bearer challenge.
func (a *httpAnswers) unauthorized(reason string, cors sse.CORS) []byte {
	return a.keep(sse.AppendUnauthorized(a.scratch[:0], reason, false, cors))
}

// reply is status with a text/plain line and r's headers.
func (a *httpAnswers) reply(status int, reason string, r sse.Reply) []byte {
	return a.keep(sse.AppendReply(a.scratch[:0], status, reason, r))
}

// replyHead is reply's head alone (HEAD).
func (a *httpAnswers) replyHead(status int, reason string, r sse.Reply) []byte {
	return a.keep(sse.AppendReplyHead(a.scratch[:0], status, reason, r))
}

// preflight is 204 with the Access-Control-* headers for methods.
func (a *httpAnswers) preflight(cors sse.CORS, allowHeaders []byte, methods string) []byte {
	return a.keep(sse.AppendPreflightMethods(a.scratch[:0], cors, allowHeaders, methods))
}

// continue100 is the interim 100 Continue.
func (a *httpAnswers) continue100() []byte { return a.keep(sse.AppendContinue(a.scratch[:0])) }

// published is 200 {"stream":…,"id":…} (id 0: an ephemeral event, no id).
func (a *httpAnswers) published(stream []byte, id int64, r sse.Reply) []byte {
	a.json = sse.AppendPublished(a.json[:0], stream, id)
	return a.keep(sse.AppendJSON(a.scratch[:0], 200, a.json, r))
}

// presence is 200 with GET /presence/{stream}'s JSON (docs/http.md, Presence), in bytes of its
// own (it is made off the loop's turn, by the writer's answer).
func (a *httpAnswers) presence(snap *store.PresenceSnapshot, cors sse.CORS) []byte {
	subs := make([]sse.PresenceSubject, len(snap.Subjects))
	for i, s := range snap.Subjects {
		subs[i] = sse.PresenceSubject{Sub: s.Sub, Connections: s.Connections}
	}
	body := sse.AppendPresenceList(nil, snap.Stream, snap.Connections, snap.Anonymous, subs, snap.Truncated)
	return sse.AppendJSON(nil, 200, body, sse.Reply{CORS: cors})
}

// publishedBatch is 200 {"ids":[…]}.
func (a *httpAnswers) publishedBatch(ids []int64, r sse.Reply) []byte {
	a.json = sse.AppendPublishedBatch(a.json[:0], ids)
	return a.keep(sse.AppendJSON(a.scratch[:0], 200, a.json, r))
}
