package engine

import (
	"github.com/panjf2000/gnet/v2"
)

// connState is where an SSE connection is in its life.
type connState uint8

const (
	stateHead    connState = iota // reading the request head (10 s deadline)
	statePending                  // authorised and registered; waiting for LISTEN or the head query before the response head
	stateCatchUp                  // response sent; reading history from the table (live events are not written)
	stateLive                     // taking live writes
	stateLagging                  // over the high watermark; waits for its buffer to drain, then catches up
	stateClosing                  // a final write is queued; the socket closes once it is flushed
)

// sseConn is one SSE client. It lives on the loop goroutine only. Kept small: an idle
// connection should cost well under 1 KiB including gnet's own state.
type sseConn struct {
	c      gnet.Conn
	state  connState
	isChan bool // /channels/ (else /streams/)
	closed bool // OnClose ran: late replay results are ignored
	// replaying is set while a replay read for this connection is in flight.
	replaying bool
	// gapChecked is set once the client's cursor has been checked against the table.
	gapChecked bool
	counted    bool  // counted in server.active (subscribed)
	retries    uint8 // consecutive failed history reads
	corsAny    bool  // cors holds "*" (no credentials)

	all    int32 // index in server.conns
	subIdx int32 // index in stream.subs or channel.sse

	cursor    int64 // last durable id written (or skipped) for this connection
	lastWrite int64 // unix milliseconds of the last write (heartbeats)
	deadline  int64 // unix seconds: head deadline while reading the head, else token exp (0 = none)

	stream *stream
	ch     *channel
	tags   []string // token tags (audience)
	cors   []byte   // allowed Origin to echo in the response head, until it is sent
}

func (sc *sseConn) write(s *Server, b []byte) {
	_, _ = sc.c.Write(b)
	sc.lastWrite = s.now
}

func (sc *sseConn) writev(s *Server, bs [][]byte) {
	s.writevConn(sc.c, bs)
	sc.lastWrite = s.now
}

// visible reports whether an event with this audience reaches the connection.
func (sc *sseConn) visible(audience []string) bool {
	if len(audience) == 0 {
		return true
	}
	for _, a := range audience {
		for _, t := range sc.tags {
			if a == t {
				return true
			}
		}
	}
	return false
}

// swapRemove removes sc from list, where pos(sc) records its index, by moving the last
// element into its place (subscriber lists are compact slices, order does not matter).
func swapRemove(list []*sseConn, sc *sseConn, pos func(*sseConn) *int32) []*sseConn {
	i, last := int(*pos(sc)), len(list)-1
	if i > last || list[i] != sc {
		return list
	}
	list[i] = list[last]
	*pos(list[i]) = int32(i)
	list[last] = nil
	return list[:last]
}

// subIndex is sc's position in its stream's or channel's subscriber list.
func subIndex(sc *sseConn) *int32 { return &sc.subIdx }
