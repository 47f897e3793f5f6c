package ssetest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"time"
)

// Event is a Block copied out of the Decoder, with the time it was read: one block of the
// stream — its id, event, data and retry fields and its comments.
type Event struct {
	ID       string // the id field ("" with HasID false when the block has none)
	HasID    bool
	Type     string // the event field; "" is a "message" (Name)
	Data     string // the data lines joined by LF
	HasData  bool   // at least one data line: an EventSource dispatches this block
	Retry    string // the retry field ("" when none)
	Comments []string
	// LastEventID is the stream's last event ID once this block was read (what a browser
	// sends on reconnecting).
	LastEventID string
	At          time.Time // when the block's last line was read
}

// Event copies the block.
func (b *Block) Event() Event {
	e := Event{
		ID: string(b.ID), HasID: b.HasID, Type: string(b.Type), Data: string(b.Data),
		HasData: b.HasData, Retry: string(b.Retry), LastEventID: string(b.LastEventID),
	}
	for _, c := range b.Comments {
		e.Comments = append(e.Comments, string(c))
	}
	return e
}

// Name is the event's type as an EventSource dispatches it: "message" unless an event
// field said otherwise.
func (e Event) Name() string {
	if e.Type == "" {
		return "message"
	}
	return e.Type
}

// IsEvent reports whether the block carries an event (data, an id or an event name), as
// opposed to only a retry field or comments.
func (e Event) IsEvent() bool { return e.HasData || e.HasID || e.Type != "" }

func (e Event) String() string {
	s := fmt.Sprintf("{id:%q event:%q data:%q", e.ID, e.Type, e.Data)
	if e.Retry != "" {
		s += fmt.Sprintf(" retry:%q", e.Retry)
	}
	if len(e.Comments) > 0 {
		s += fmt.Sprintf(" comments:%q", e.Comments)
	}
	return s + "}"
}

// Stream reads the blocks of an event stream from R, one at a time. It consumes R only up to
// the end of the block it returns (a line at a time), so a test may go on reading R itself
// afterwards. With Conn set, Next's timeout is a read deadline on it.
type Stream struct {
	R    *bufio.Reader
	Conn net.Conn // optional: for Next's timeout
	// Eager: comments and retry fields come as blocks of their own, at once (Decoder.Eager).
	Eager bool

	dec    Decoder
	queue  []Event
	inited bool
}

// NewStream reads r (an HTTP response body, say); conn, if not nil, is the connection under
// it, for timeouts.
func NewStream(r io.Reader, conn net.Conn) *Stream {
	br, ok := r.(*bufio.Reader)
	if !ok {
		br = bufio.NewReaderSize(r, 64<<10)
	}
	return &Stream{R: br, Conn: conn}
}

// Next returns the next block. timeout > 0 needs Conn; the error is then the connection's
// (a net.Error whose Timeout() is true when nothing complete arrived in time; what did
// arrive is kept for the next call). At the end of the stream it is io.EOF (a block the
// server did not end with a blank line is not an event, as for a browser).
func (s *Stream) Next(timeout time.Duration) (Event, error) {
	if !s.inited {
		s.inited = true
		s.dec.Eager = s.Eager
	}
	if timeout > 0 {
		if s.Conn == nil {
			panic("ssetest: Stream.Next with a timeout needs Conn")
		}
		_ = s.Conn.SetReadDeadline(time.Now().Add(timeout))
		defer s.Conn.SetReadDeadline(time.Time{})
	}
	for len(s.queue) == 0 {
		line, err := s.R.ReadSlice('\n')
		if len(line) > 0 {
			now := time.Now()
			s.dec.Feed(line, func(b *Block) {
				e := b.Event()
				e.At = now
				s.queue = append(s.queue, e)
			})
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil && len(s.queue) == 0 {
			return Event{}, err
		}
	}
	e := s.queue[0]
	s.queue = s.queue[1:]
	return e, nil
}

// NextEvent is Next skipping blocks that carry no event (only a retry field or comments).
func (s *Stream) NextEvent(timeout time.Duration) (Event, error) {
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	for {
		left := time.Duration(0)
		if timeout > 0 {
			if left = time.Until(deadline); left <= 0 {
				left = time.Nanosecond
			}
		}
		e, err := s.Next(left)
		if err != nil || e.IsEvent() {
			return e, err
		}
	}
}

// LastEventID is the stream's last event ID so far.
func (s *Stream) LastEventID() string { return string(s.dec.LastEventID()) }

// Parse decodes a whole stream (what a test captured) into its blocks.
func Parse(stream []byte) []Event {
	var d Decoder
	var out []Event
	d.Feed(stream, func(b *Block) { out = append(out, b.Event()) })
	return out
}
