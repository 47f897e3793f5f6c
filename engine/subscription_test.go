package engine

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/store"
)

// An idle connection costs what sseConn costs, with its first subscription inline: at most
// 80 bytes, an 80-byte size class (issue 25; 168 B in a 176-byte one before subscriptions had
// a type of their own, 112 B before its cold pointers became one). What only some connections
// hold hangs off one pointer (ext): the request until the response head is sent, a
// publisher's state, the queue only while the socket is behind, a token's tags, subject and
// exp, further subscriptions.
func TestIdleConnSize(t *testing.T) {
	t.Logf("sseConn %d B (subscription %d B inline), subRequest %d B until the response head, outQueue %d B while queued, "+
		"connExt %d B for a token's tags, subject or exp or several streams, subSet %d B + %d B a stream after the first, publishConn %d B for a publisher",
		unsafe.Sizeof(sseConn{}), unsafe.Sizeof(subscription{}), unsafe.Sizeof(subRequest{}), unsafe.Sizeof(outQueue{}),
		unsafe.Sizeof(connExt{}), unsafe.Sizeof(subSet{}), unsafe.Sizeof(subscription{}), unsafe.Sizeof(publishConn{}))
	// 80 B (a size class of its own): the queue, a publisher's state, the request, what a token
	// brings and the subscriptions after the first hang off ext; one time field serves the time
	// rules and the heartbeats; a subscription's stream or channel is one pointer (issue 25).
	assert.LessOrEqual(t, unsafe.Sizeof(sseConn{}), uintptr(80))
	assert.LessOrEqual(t, unsafe.Sizeof(subscription{}), uintptr(32))
	// The request and the extension it holds while the connection sets up: garbage once the
	// response head is sent, so in a size class of its own (208 B), not beside a lasting one
	// (the 7 later subscriptions of an 8-stream connection are 224 B).
	assert.Equal(t, uintptr(208), unsafe.Sizeof(subRequest{}))
}

// subServer is a Server that is not running (no table reads: catch-ups stop where they would
// read), its LISTEN session "up", and one admitted connection over a socket pair.
func subServer(t *testing.T) (*Server, *recordConn, *sseConn) {
	t.Helper()
	s, err := New(Config{Heartbeat: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	s.lsn.up = true
	c := newRecordConn(t)
	sc := s.conns.open(c)
	admitNow(s, sc, 0)
	return s, c, sc
}

// notify hands the fan-out one durable (id > 0) or ephemeral (id 0) notification on stream and
// flushes it, as a loop entry does.
func notify(s *Server, stream string, id int64, data string) {
	kind := store.KindDurable
	if id == 0 {
		kind = store.KindEphemeral
	}
	s.fan.onPayload(&store.Payload{Kind: kind, Stream: []byte(stream), ID: id, Data: []byte(data)})
	s.fan.flush()
}

// A connection holds any number of subscriptions, each on its own stream and in its own
// state; the response head waits until none is starting, and removing the connection takes
// every one of them off its stream.
func TestConnectionHoldsSubscriptions(t *testing.T) {
	s, c, sc := subServer(t)
	const k = 3
	s.subs.hold(sc, k, false)
	require.Equal(t, k, sc.subCount())
	for i := range k {
		require.Same(t, sc, sc.sub(i).conn)
	}
	assert.NotSame(t, sc.sub(1), sc.sub(2))
	s.subs.subscribeStream(sc.sub(0), "a", 0, true) // a cursor: catch-up
	s.subs.subscribeStream(sc.sub(1), "b", 5, true)
	s.subs.subscribeChannel(sc.sub(2), "jobs") // its LISTEN has not completed
	assert.Equal(t, subCatchUp, sc.sub(0).state)
	assert.Equal(t, subStarting, sc.sub(2).state)
	s.subs.started(sc)
	assert.Equal(t, statePending, sc.state, "one subscription is still starting: no response head")
	assert.Empty(t, c.text())

	ch := s.chans.lookup([]byte("jobs"))
	require.NotNil(t, ch)
	ch.listening = true // as channelTable.live does once the LISTEN completed
	s.fan.channelLive(ch)
	assert.Equal(t, stateStreaming, sc.state)
	assert.Equal(t, subLive, sc.sub(2).state)
	assert.True(t, strings.HasPrefix(c.text(), "HTTP/1.1 200 "), "the response head once every subscription started: %q", c.text())

	require.Len(t, s.fan.streams, 2)
	s.OnClose(sc.c, nil)
	assert.Empty(t, s.fan.streams, "the streams nobody follows are dropped")
	assert.Nil(t, s.chans.lookup([]byte("jobs")), "the channel's last holder left")
	for i := range k {
		assert.Equal(t, subNone, sc.sub(i).state)
	}
}

// Delivery, cursors and lag are per subscription: two streams on one connection each advance
// their own cursor, and one subscription lagging stops live durable writes on its stream only.
func TestDeliveryPerSubscription(t *testing.T) {
	s, c, sc := subServer(t)
	s.subs.hold(sc, 2, false)
	a, b := sc.sub(0), sc.sub(1)
	s.subs.subscribeStream(a, "a", 0, true)
	s.subs.subscribeStream(b, "b", 0, true)
	s.subs.started(sc)
	require.Equal(t, stateStreaming, sc.state)
	head := len(c.text())
	s.subs.tryJoin(a) // the table said nothing (none running): from the ring, at 0
	s.subs.tryJoin(b)
	require.Equal(t, subLive, a.state)
	require.Equal(t, subLive, b.state)

	notify(s, "a", 1, "a1")
	notify(s, "b", 1, "b1")
	notify(s, "a", 2, "a2")
	assert.EqualValues(t, 2, a.cursor)
	assert.EqualValues(t, 1, b.cursor)
	assert.Equal(t, "id: 1\ndata: a1\n\nid: 1\ndata: b1\n\nid: 2\ndata: a2\n\n", c.text()[head:])

	s.subs.pause(b) // as deliver does when the connection is over its high watermark
	head = len(c.text())
	notify(s, "b", 2, "b2")
	notify(s, "a", 3, "a3")
	notify(s, "b", 0, "typing") // ephemeral events still reach a lagging subscription
	assert.EqualValues(t, 1, b.cursor, "b2 is left for b's catch-up to read from the table")
	assert.EqualValues(t, 3, a.cursor)
	assert.Equal(t, "id: 3\ndata: a3\n\ndata: typing\n\n", c.text()[head:])

	// b drains and bridges from its stream's ring: b2 exactly once.
	head = len(c.text())
	s.subs.resumeLagging()
	assert.Equal(t, subLive, b.state)
	assert.EqualValues(t, 2, b.cursor)
	assert.Equal(t, "id: 2\ndata: b2\n\n", c.text()[head:])
}

// A stream's ring bridges a subscription that has read the table up to c when it reaches back
// to c; a stream whose head is not known yet starts where the subscription is.
func TestStreamBridge(t *testing.T) {
	st := &stream{name: "s", last: -1}
	ring, ok := st.bridge(7)
	assert.True(t, ok)
	assert.Empty(t, ring)
	assert.EqualValues(t, 7, st.head(), "the stream starts at the first subscription's cursor")
	for id := int64(8); id <= 10; id++ {
		st.ring = append(st.ring, &event{id: id})
		st.last = id
	}
	for _, tc := range []struct {
		c  int64
		ok bool
	}{{6, false}, {7, true}, {9, true}, {10, true}} {
		_, ok := st.bridge(tc.c)
		assert.Equal(t, tc.ok, ok, "cursor %d", tc.c)
		assert.Equal(t, tc.ok, st.inRing(tc.c), "cursor %d", tc.c)
	}
}

// A connection following several streams (GET /streams) gets what one loop pass brings on
// all of them in one write, in the order the events arrived, each durable event with its
// composite id — its stream's position and every stream's cursor once it is written — and
// ephemeral events without one.
func TestMultiStreamArrivalOrderAndCompositeIDs(t *testing.T) {
	s, c, sc := subServer(t)
	s.subs.hold(sc, 3, true)
	for i, name := range []string{"a", "b", "c"} {
		s.subs.subscribeStream(sc.sub(i), name, int64(i), true) // cursors 0, 1, 2
	}
	s.subs.started(sc)
	require.Equal(t, stateStreaming, sc.state)
	for i := range 3 {
		s.subs.tryJoin(sc.sub(i))
		require.Equal(t, subLive, sc.sub(i).state)
	}
	head := len(c.text())
	for _, p := range []struct {
		stream string
		id     int64
		data   string
	}{{"a", 1, "a1"}, {"b", 2, "b2"}, {"c", 0, "typing"}, {"a", 2, "a2"}, {"c", 3, "c3"}} {
		kind := store.KindDurable
		if p.id == 0 {
			kind = store.KindEphemeral
		}
		s.fan.onPayload(&store.Payload{Kind: kind, Stream: []byte(p.stream), ID: p.id, Data: []byte(p.data)})
	}
	s.fan.flush()
	assert.Equal(t, "id: 0:1,1,2\ndata: a1\n\nid: 1:1,2,2\ndata: b2\n\ndata: typing\n\nid: 0:2,2,2\ndata: a2\n\nid: 2:2,2,3\ndata: c3\n\n",
		c.text()[head:], "in arrival order across streams, whatever order the streams are flushed in")

	// One stream alone, on a composite connection of one stream, still says its position.
	s2, c2, sc2 := subServer(t)
	s2.subs.hold(sc2, 1, true)
	s2.subs.subscribeStream(sc2.sub(0), "a", 5, true)
	s2.subs.started(sc2)
	s2.subs.tryJoin(sc2.sub(0))
	head = len(c2.text())
	notify(s2, "a", 6, "six")
	assert.Equal(t, "id: 0:6\ndata: six\n\n", c2.text()[head:])
}

// Setting up allocates no extension of its own: while the request is held, the connection's
// extension is the one inside it, and what outlives the setup (a token's tags) moves to an
// extension of its own when the response head lets the request go (issue 25: an 80-byte
// garbage connExt per connection kept the sseConns' spans resident).
func TestSetupExtensionLivesInTheRequest(t *testing.T) {
	public, req := &sseConn{}, &subRequest{}
	public.setRequest(req)
	require.Same(t, &req.ext, public.ext)
	require.Same(t, req, public.request())
	public.setRequest(nil)
	assert.Nil(t, public.ext, "a public connection holds nothing once it streams")

	tagged, req2 := &sseConn{}, &subRequest{}
	tagged.setPublisher(&publishConn{}) // a keep-alive publisher turning subscriber keeps what it had
	tagged.setRequest(req2)
	require.Same(t, &req2.ext, tagged.ext)
	require.NotNil(t, tagged.publisher())
	tagged.setPublisher(nil)
	tagged.extended().tags = []string{"team-a"}
	tagged.setRequest(nil)
	require.NotNil(t, tagged.ext)
	assert.NotSame(t, &req2.ext, tagged.ext, "the tags moved out of the request")
	assert.Equal(t, []string{"team-a"}, tagged.tags())
	assert.Nil(t, tagged.request())
}
