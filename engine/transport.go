package engine

import "github.com/pgsse/pgsse/sse"

// The transport seam: how what the loop sends a subscriber becomes bytes. The loop decides
// what to send and when — an event, a gap, a heartbeat, a shed, the last bytes before a close,
// the response head — and the transport says how it looks on the wire; the loop code holds no
// wire literals of its own. SSE (transport_sse.go, over package sse) is the one
// implementation; another transport would be a second one, chosen by the request routing
// (request.go). A presence event (docs/http.md, Presence) is made once per stream and
// interval and shared like an event (presence.go).
//
// Encode once, write many (docs/architecture.md, invariant 2): event's bytes are made once and
// shared by every connection that takes the event, by reference. An encoding starts with its
// id line (for a durable event); eventBody is the rest, so that a connection that needs an id
// of its own (one following several streams: docs/http.md) writes its own id bytes and then
// the shared body in one writev — leadItem and sharedBodyItem (outbound.go) — with no copy
// and no allocation per delivery.
//
// Methods that take no dst return bytes in the transport's scratch, valid until its next call:
// the caller writes them at once (a write copies what the socket does not take).
type transport interface {
	// streamHead is the response head of a stream that is live: the status line and
	// headers, then what the client reads first (for SSE: the retry field and a comment).
	streamHead(cors sse.CORS, retryMS int64) []byte
	// event appends an event's encoding to dst: id 0 is an event without an id (ephemeral, or a
	// channel notification), name nil the default event.
	event(dst []byte, id int64, name, data []byte) []byte
	// eventBody is an encoding made by event (or the replay encoder) without its id line.
	eventBody(enc []byte) []byte
	// compositeID appends to dst the id line that leads eventBody on a connection following
	// several streams (docs/http.md, Several streams on one connection): k is the position of
	// the event's own stream, cursors every stream's cursor once the event is written.
	compositeID(dst []byte, k int, cursors []int64) []byte
	// replayEncoder is what table reads encode each row with, straight from the read buffer
	// (store.ReadRequest.Encode): the same bytes as event.
	replayEncoder() func(dst []byte, id int64, name, data []byte) []byte
	// gap tells a subscriber that stream's events after `after` up to resume are gone (pruned,
	// or its cursor was newer than the head): delivery continues after resume.
	gap(stream []byte, after, resume int64) []byte
	// heartbeat is what keeps an idle stream's connection alive (after --heartbeat).
	heartbeat() []byte
	// shed is a whole response that sends a client away before its stream started, with the
	// time to come back and why, in one or more lines (docs/http.md: 200, so that EventSource
	// retries).
	shed(cors sse.CORS, retryMS int64, why ...string) []byte
	// presenceFull and presenceChange are presence events (docs/http.md, Presence) in bytes of
	// their own (shared by every watcher of the stream, like an event's encoding): who is
	// present, or who joined and left since the last one; both with the anonymous count.
	presenceFull(stream string, present []string, anonymous int64) []byte
	presenceChange(stream string, joins, leaves []string, anonymous int64) []byte
	// retry is the last bytes of a stream that ends (shutdown, token expiry, too slow):
	// when to come back, and why (perhaps nothing).
	retry(retryMS int64, why ...string) []byte
}
