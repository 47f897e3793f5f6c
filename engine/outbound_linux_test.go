//go:build linux

package engine

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pgsse/pgsse/sse"
)

// drainWritable does what watchWritable and its task do, for a Server that is not running.
func drainWritable(t *testing.T, s *Server) {
	events := make([]unix.EpollEvent, 16)
	n, err := unix.EpollWait(s.out.epfd, events, 0)
	require.NoError(t, err)
	var fds []int32
	for _, ev := range events[:n] {
		fds = append(fds, ev.Fd)
	}
	s.out.flushReady(fds)
}

// What the queues hold is counted exactly: a shared encoding once however many queues hold
// it, private bytes per queue, plus outItemBytes per piece; transient bytes are copied; the
// queues drain in order once the sockets have room (the writability set), and a closed
// connection's queue is given back.
func TestOutboundQueueAccounting(t *testing.T) {
	s, cs, scs := queueServer(t, 3)
	var prefix [3][]byte
	for i, sc := range scs {
		prefix[i] = fill(s, sc)
	}
	base := s.out.total
	require.Equal(t, 3, s.out.queued)

	ev := &event{id: 1, enc: sse.AppendEvent(nil, 1, nil, bytes.Repeat([]byte("x"), 10_000))}
	for _, sc := range scs {
		s.conns.writeEvents(sc, []*event{ev})
	}
	assert.Equal(t, base+len(ev.enc)+3*outItemBytes, s.out.total, "a shared encoding counts once")
	assert.EqualValues(t, 3, ev.queued)

	scratch := []byte("private bytes\n")
	s.conns.write(scs[0], scratch)
	copy(scratch, "XXXXXXXXXXXXXX") // the caller reuses its scratch at once
	assert.Equal(t, base+len(ev.enc)+len("private bytes\n")+4*outItemBytes, s.out.total, "transient bytes are copied and count per queue")

	// Connection 2 goes away: its queue is dropped, the shared encoding is still held by two.
	s.OnClose(scs[2].c, nil)
	assert.EqualValues(t, 2, ev.queued)
	assert.Equal(t, 2, s.out.queued)

	// The peers read; the tick's epoll set reports the sockets and the queues drain in order.
	want := []string{string(prefix[0]) + string(ev.enc) + "private bytes\n", string(prefix[1]) + string(ev.enc)}
	for i := range 2 {
		var got string
		waitFor(t, 10*time.Second, "connection "+strconv.Itoa(i)+" drained", func() bool {
			got = cs[i].text()
			drainWritable(t, s)
			return scs[i].pending() == 0 && strings.HasSuffix(cs[i].text(), "\n")
		})
		got = cs[i].text()
		head := strings.Index(got, string(prefix[i][:10]))
		require.GreaterOrEqual(t, head, 0)
		assert.Equal(t, want[i], got[head:], "connection %d: everything, in order", i)
	}
	assert.Zero(t, s.out.queued)
	assert.Zero(t, s.out.total, "nothing held once every queue drained")
	assert.Zero(t, ev.queued)
}

// A connection closed while its socket has taken part of an event: that event is completed,
// what was queued after it is dropped, and the last bytes (retry:) follow; the socket closes
// once they have left. A client never sees half an event run into the retry field.
func TestOutboundFinishCompletesTheBegunEvent(t *testing.T) {
	s, cs, scs := queueServer(t, 1)
	c, sc := cs[0], scs[0]
	first := &event{id: 1, enc: sse.AppendEvent(nil, 1, nil, bytes.Repeat([]byte("a"), 100_000))}
	second := &event{id: 2, enc: sse.AppendEvent(nil, 2, nil, []byte("dropped"))}
	s.conns.writeEvents(sc, []*event{first})
	require.True(t, sc.queue() != nil && sc.queue().begun, "the socket took part of the first event")
	s.conns.writeEvents(sc, []*event{second})
	s.conns.closeWithRetry(sc)
	assert.Equal(t, stateClosing, sc.state)
	assert.False(t, c.closed, "the close waits for the last bytes")
	assert.Zero(t, second.queued, "what was queued after the begun event is dropped")
	waitFor(t, 10*time.Second, "the queue drained and the socket closed", func() bool {
		c.text()
		drainWritable(t, s)
		return c.closed
	})
	got := c.text()
	got = got[strings.Index(got, "\r\n\r\n")+4:] // after the response head
	got = got[strings.Index(got, "\n\n")+2:]     // and its retry/comment block
	require.True(t, strings.HasPrefix(got, string(first.enc)), "the first event whole: %.60q", got)
	rest := got[len(first.enc):]
	assert.True(t, strings.HasPrefix(rest, "retry: ") && strings.HasSuffix(rest, "\n\n") && !strings.Contains(rest, "dropped"), "then the retry field: %q", rest)
	assert.Zero(t, s.out.total)
}

// A live write whose events are led by bytes of the connection's own (an id line of its own,
// docs/http.md: a connection following several streams) sends each lead with its event and
// holds both back together; the shared bytes are never copied, and the lead is copied only
// when it has to be queued.
func TestOutboundLiveLimitWithLeads(t *testing.T) {
	s, c, scs := queueServer(t, 1)
	sc := scs[0]
	body := func(id int64) *event {
		return &event{id: id, enc: []byte("id: " + strconv.FormatInt(id, 10) + "\ndata: " + strings.Repeat("x", 2000) + "\n\n")}
	}
	lead := func(evs ...*event) []outItem {
		var items []outItem
		for _, ev := range evs {
			id := []byte("id: 0:" + strconv.FormatInt(ev.id, 10) + "\n")
			items = append(items, leadItem(id), sharedBodyItem(ev, s.tr.eventBody(ev.enc)))
		}
		return items
	}
	fill(s, sc)
	before := sc.pending()
	a, b, d := body(1), body(2), body(3)
	eph := &event{enc: []byte("data: e\n\n")}
	items := append(lead(a, b), sharedItem(eph))
	items = append(items, lead(d)...)
	unit := len("id: 0:1\n") + len(s.tr.eventBody(a.enc))
	n := s.conns.writeLive(sc, items, before+unit)
	assert.Equal(t, 2, n, "the second event's lead is where the write stops")
	assert.Equal(t, b, cutEvent(items, n), "the event held back")
	assert.Equal(t, 2, writtenBefore(items, n), "one durable event and the ephemeral one were written")
	assert.Equal(t, before+unit+len(eph.enc), sc.pending(), "the first event with its lead, and the ephemeral one, are queued")
	assert.EqualValues(t, 1, a.queued)
	assert.Zero(t, b.queued)
	assert.Zero(t, d.queued, "nothing durable after the cut")
	for sc.pending() > 0 {
		c[0].text()
		drainWritable(t, s)
	}
	got := c[0].text()
	assert.True(t, strings.HasSuffix(got, "id: 0:1\n"+string(s.tr.eventBody(a.enc))+string(eph.enc)), "the lead, then the shared body, in order")
}

// A connection's own id line in front of shared encodings (what a connection following several
// streams writes: docs/http.md) costs no allocation and no copy per delivery when the socket
// takes it: the lead and the shared body go in one writev.
func TestLeadWritesAllocateNothing(t *testing.T) {
	s, cs, scs := queueServer(t, 1)
	c, sc := cs[0], scs[0]
	require.NoError(t, unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 1<<20))
	evs := make([]*event, 8)
	for i := range evs {
		evs[i] = &event{id: int64(i + 1), enc: s.tr.event(nil, int64(i+1), nil, []byte("shared by every subscriber"))}
	}
	ids := make([]byte, 0, 512)
	items := make([]outItem, 0, 2*len(evs))
	buf := make([]byte, 64<<10)
	c.text()
	allocs := testing.AllocsPerRun(500, func() {
		ids, items = ids[:0], items[:0]
		for _, ev := range evs {
			start := len(ids)
			ids = append(ids, "id: 3:"...)
			ids = strconv.AppendInt(ids, ev.id, 10)
			ids = append(ids, '\n')
			items = append(items, leadItem(ids[start:]), sharedBodyItem(ev, s.tr.eventBody(ev.enc)))
		}
		if n := s.conns.writeLive(sc, items, durableHighBytes); n != len(items) {
			panic("the socket did not take it all")
		}
		for {
			if n, _ := unix.Read(c.peer, buf); n <= 0 {
				break
			}
		}
	})
	assert.Zero(t, allocs, "allocations per write of 8 led events")
	assert.Zero(t, sc.pending())
	assert.Zero(t, s.out.total, "nothing queued, nothing copied")
}

// A connection's own lead (a composite id line) and the event it leads are one event to the
// client: once the socket has taken the lead — whole or in part — the event is begun, and a
// finish (trimQueue) keeps the rest of it, or the client gets an id line followed by the
// retry field: a block with an id and no data (chaos seed 3, multi05-slow-k3). One the
// socket has not begun goes whole.
func TestOutboundFinishKeepsTheEventOfABegunLead(t *testing.T) {
	s, _, scs := queueServer(t, 4)
	ev := &event{id: 7, enc: sse.AppendEvent(nil, 7, nil, []byte("the event"))}
	lead := []byte("id: 1:3,7\n")
	body := ev.enc[bytes.IndexByte(ev.enc, '\n')+1:] // the shared encoding without its id line
	items := func() []outItem { return []outItem{leadItem(lead), sharedBodyItem(ev, body)} }
	kept := func(sc *sseConn) string {
		var b []byte
		if sc.queue() != nil {
			for _, it := range sc.queue().items[sc.queue().head:] {
				b = append(b, it.b...)
			}
		}
		return string(b)
	}

	// The socket took the whole lead (send's keep after a partial writev).
	s.out.keep(scs[0], items(), len(lead))
	s.out.trimQueue(scs[0])
	require.Equal(t, string(body), kept(scs[0]), "the lead was written: its event stays")

	// The lead was queued and then written whole (flushQueue's consume).
	s.out.keep(scs[1], items(), 0)
	s.out.consume(scs[1].queue(), len(lead))
	s.out.trimQueue(scs[1])
	require.Equal(t, string(body), kept(scs[1]), "the lead was flushed: its event stays")

	// Part of the lead was written: the rest of it and its event stay.
	s.out.keep(scs[2], items(), 4)
	s.out.trimQueue(scs[2])
	require.Equal(t, string(lead[4:])+string(body), kept(scs[2]))

	// Nothing of it was written: it goes whole.
	s.out.keep(scs[3], items(), 0)
	s.out.trimQueue(scs[3])
	require.Equal(t, "", kept(scs[3]), "an event not begun is dropped with its lead")

	for _, sc := range scs {
		s.out.dropQueue(sc)
	}
	require.Zero(t, s.out.total, "every byte accounted for")
}

// A socket that falls behind and catches up, again and again, allocates nothing: its queue
// comes from the emptied ones, and so does the connection extension that holds it (issue 25:
// the queue moved into the extension, which would otherwise be made anew each time).
func TestFallingBehindAndCatchingUpAllocatesNothing(t *testing.T) {
	s, cs, scs := queueServer(t, 1)
	c, sc := cs[0], scs[0]
	ev := &event{id: 1, enc: s.tr.event(nil, 1, nil, []byte(strings.Repeat("x", 64<<10)))}
	items := make([]outItem, 1)
	fds := []int32{int32(c.fd)}
	buf := make([]byte, 256<<10)
	cycle := func() {
		items[0] = sharedItem(ev)
		s.conns.writeLive(sc, items, durableHighBytes)
		if sc.queue() == nil {
			panic("the socket took 64 KiB at once: nothing queued")
		}
		for sc.pending() > 0 {
			for {
				if n, _ := unix.Read(c.peer, buf); n <= 0 {
					break
				}
			}
			s.out.flushReady(fds)
		}
	}
	cycle() // the first queue and extension are made here
	require.Nil(t, sc.ext, "a caught-up public connection holds no extension")
	allocs := testing.AllocsPerRun(50, cycle)
	assert.Zero(t, allocs, "allocations per falling behind and catching up")
}
