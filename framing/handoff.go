package framing

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Handoff records (docs/operations.md, Upgrading without disconnects): what a process handing
// everything it serves to its successor (SIGUSR2) says about one connection, beside the
// connection's descriptor (SCM_RIGHTS). Big-endian, versioned, strict like the hub frames:
//
//	u8  version (HandoffVersion)
//	u8  kind    (1 SSE connection, 2 hub worker, 3 channels)
//
// an SSE connection (kind 1):
//
//	u8  flags          bit 0: composite ids (GET /streams); bit 1: a presence watcher
//	                   (presence=1: it gets its presence streams' pgsse:presence events)
//	i64 expires        the token's exp, unix ms (0 = none)
//	u16 len, subject   its key in the per-subject count ("" = none)
//	u16 len, presence  the subject it counts under on presence streams (its sub claim;
//	                   "" = anonymous), for the successor to count it the same way
//	u16 n, n × (u16 len, tag)
//	u8  n (1–255), n × subscription:
//	    u8 kind (1 stream, 2 channel), u8 state (HandoffLive…), u8 flags (bit 0: cursor
//	    checked against the table), i64 cursor, u16 len, name
//	    (a channel's cursor is its handoff position: how many of the channel's notifications
//	    after the handoff mark the predecessor had written or queued for it; −1: not counted)
//	u32 len, tail      the bytes the predecessor has not written yet (the unsent remainder
//	                   of a partly written event first), which the successor writes first
//
// a hub worker (kind 2):
//
//	u32 pid, u8 flags (bit 0: a --procs sibling), u16 len, name,
//	u16 n, n × (u8 mode, i64 position (as a channel subscription's cursor above), u16 len, channel),
//	u32 partial        bytes of tail's first frame that are the rest of a frame the
//	                   predecessor had begun writing (0: tail starts at a frame)
//	u32 len, tail      the hub frames the predecessor had not written yet
//
// the raw channels a predecessor holds (kind 3), sent before it hands anything over so that
// its successor LISTENs them first:
//
//	u16 len, mark      the handoff mark's channel (docs/architecture.md, Handoff positions)
//	u32 n (≤ HandoffMaxChannels), n × (u16 len, channel)
//
// Nothing may follow. Decoding copies (records cross a process boundary once per connection
// and deploy; they are not on a hot path) and never panics (fuzz: FuzzHandoffRecord).

// HandoffVersion is the record version this binary writes and reads. A record from any other
// version is refused with ErrHandoffVersion: a successor that does not speak the same
// version takes nothing over (the predecessor keeps serving). Version 2 added the channels
// record and the handoff positions of channels; version 3 an SSE connection's presence
// subject and watcher flag (a successor counts a moved connection in presence as its
// predecessor did).
const HandoffVersion = 3

// Record kinds.
const (
	HandoffSSE      = 1
	HandoffWorker   = 2
	HandoffChannels = 3
)

// Subscription kinds and states in a record.
const (
	HandoffStream  = 1
	HandoffChannel = 2

	HandoffCatchUp = 1 // reading history from the table
	HandoffLive    = 2 // taking live writes
	HandoffLagging = 3 // paused over the high watermark
)

// Bounds a decoder enforces.
const (
	HandoffMaxSubs = 255
	HandoffMaxTags = 4096
	HandoffMaxName = 4096
	HandoffMaxTail = 1 << 30
	// HandoffMaxChannels bounds a channels record: more than one LISTEN session holds.
	HandoffMaxChannels = 1 << 16
	// HandoffNoPosition is the position of a channel the predecessor did not count.
	HandoffNoPosition = -1
)

var (
	// ErrHandoffVersion: the record is from another handoff version.
	ErrHandoffVersion = errors.New("framing: handoff record of another version")
	// ErrHandoffRecord: the record is malformed (truncated, a bad kind, state or bound, or
	// bytes after its end).
	ErrHandoffRecord = errors.New("framing: malformed handoff record")
)

// HandoffSub is one subscription of an SSE connection.
type HandoffSub struct {
	Kind    uint8 // HandoffStream or HandoffChannel
	State   uint8 // HandoffCatchUp, HandoffLive, HandoffLagging
	Checked bool  // the cursor has been checked against the table (no gap check again)
	Cursor  int64
	Name    string
}

// HandoffConn is an SSE connection's state.
type HandoffConn struct {
	Composite bool
	ExpiresMS int64
	Subject   string
	// PresenceSub is the subject the connection counts under on presence streams ("" =
	// anonymous: no sub claim, or none of its streams keeps presence); PresenceWatch: it
	// asked for presence events (presence=1).
	PresenceSub   string
	PresenceWatch bool
	Tags          []string
	Subs          []HandoffSub
	Tail          []byte
}

// HandoffChannel is one channel a hub worker holds.
type HandoffChan struct {
	Mode uint8 // 0 lossless, 1 wake
	Pos  int64 // the handoff position (HandoffNoPosition: not counted)
	Name string
}

// HandoffWorkerRec is a hub worker's state.
type HandoffWorkerRec struct {
	PID      uint32
	Sibling  bool
	Name     string
	Channels []HandoffChan
	Partial  uint32
	Tail     []byte
}

// HandoffChannelList is the channels record: the raw channels a predecessor holds, and the
// channel its handoff mark is notified on.
type HandoffChannelList struct {
	Mark  string
	Names []string
}

// HandoffRecord is one decoded record: Kind says which of Conn, Worker and Channels is set.
type HandoffRecord struct {
	Kind     uint8
	Conn     HandoffConn
	Worker   HandoffWorkerRec
	Channels HandoffChannelList
}

func bin32(dst []byte, v uint32) []byte { return binary.BigEndian.AppendUint32(dst, v) }

func appendStr16(dst []byte, s string) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(s)))
	return append(dst, s...)
}

// AppendHandoffConn appends c's record to dst. Names, tags and the subject must be within
// the decoder's bounds (the engine's own values always are).
func AppendHandoffConn(dst []byte, c *HandoffConn) []byte {
	dst = append(dst, HandoffVersion, HandoffSSE)
	var flags byte
	if c.Composite {
		flags |= 1
	}
	if c.PresenceWatch {
		flags |= 2
	}
	dst = append(dst, flags)
	dst = binary.BigEndian.AppendUint64(dst, uint64(c.ExpiresMS))
	dst = appendStr16(dst, c.Subject)
	dst = appendStr16(dst, c.PresenceSub)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(c.Tags)))
	for _, t := range c.Tags {
		dst = appendStr16(dst, t)
	}
	dst = append(dst, byte(len(c.Subs)))
	for _, s := range c.Subs {
		var f byte
		if s.Checked {
			f = 1
		}
		dst = append(dst, s.Kind, s.State, f)
		dst = binary.BigEndian.AppendUint64(dst, uint64(s.Cursor))
		dst = appendStr16(dst, s.Name)
	}
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(c.Tail)))
	return append(dst, c.Tail...)
}

// AppendHandoffWorker appends w's record to dst.
func AppendHandoffWorker(dst []byte, w *HandoffWorkerRec) []byte {
	dst = append(dst, HandoffVersion, HandoffWorker)
	dst = binary.BigEndian.AppendUint32(dst, w.PID)
	var flags byte
	if w.Sibling {
		flags |= 1
	}
	dst = append(dst, flags)
	dst = appendStr16(dst, w.Name)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(w.Channels)))
	for _, c := range w.Channels {
		dst = append(dst, c.Mode)
		dst = binary.BigEndian.AppendUint64(dst, uint64(c.Pos))
		dst = appendStr16(dst, c.Name)
	}
	dst = bin32(dst, w.Partial)
	dst = bin32(dst, uint32(len(w.Tail)))
	return append(dst, w.Tail...)
}

// AppendHandoffChannels appends the channels record l to dst. Names must be within the
// decoder's bounds (at most HandoffMaxChannels, each 1–HandoffMaxName bytes).
func AppendHandoffChannels(dst []byte, l *HandoffChannelList) []byte {
	dst = append(dst, HandoffVersion, HandoffChannels)
	dst = appendStr16(dst, l.Mark)
	dst = bin32(dst, uint32(len(l.Names)))
	for _, n := range l.Names {
		dst = appendStr16(dst, n)
	}
	return dst
}

// recReader reads a record's fields; the first failure sticks.
type recReader struct {
	b   []byte
	bad bool
}

func (r *recReader) n(k int) []byte {
	if r.bad || len(r.b) < k {
		r.bad = true
		return nil
	}
	v := r.b[:k]
	r.b = r.b[k:]
	return v
}

func (r *recReader) u8() uint8 {
	if v := r.n(1); v != nil {
		return v[0]
	}
	return 0
}

func (r *recReader) u16() int {
	if v := r.n(2); v != nil {
		return int(binary.BigEndian.Uint16(v))
	}
	return 0
}

func (r *recReader) u32() uint32 {
	if v := r.n(4); v != nil {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

func (r *recReader) i64() int64 {
	if v := r.n(8); v != nil {
		return int64(binary.BigEndian.Uint64(v))
	}
	return 0
}

func (r *recReader) str16(max int) string {
	k := r.u16()
	if k > max {
		r.bad = true
		return ""
	}
	return string(r.n(k))
}

// DecodeHandoff decodes one record, which must be all of src. A record of another version
// is refused with an error that wraps ErrHandoffVersion and names both versions; anything
// else malformed wraps ErrHandoffRecord. The result does not refer to src.
func DecodeHandoff(src []byte) (HandoffRecord, error) {
	var rec HandoffRecord
	if len(src) < 2 {
		return rec, fmt.Errorf("%w: %d bytes", ErrHandoffRecord, len(src))
	}
	if src[0] != HandoffVersion {
		return rec, fmt.Errorf("%w: version %d, this binary speaks %d", ErrHandoffVersion, src[0], HandoffVersion)
	}
	r := recReader{b: src[2:]}
	rec.Kind = src[1]
	switch rec.Kind {
	case HandoffSSE:
		decodeConn(&r, &rec.Conn)
	case HandoffWorker:
		decodeWorker(&r, &rec.Worker)
	case HandoffChannels:
		decodeChannels(&r, &rec.Channels)
	default:
		return HandoffRecord{}, fmt.Errorf("%w: kind %d", ErrHandoffRecord, rec.Kind)
	}
	if r.bad || len(r.b) > 0 {
		return HandoffRecord{}, fmt.Errorf("%w: kind %d, truncated or with trailing bytes", ErrHandoffRecord, rec.Kind)
	}
	return rec, nil
}

func decodeConn(r *recReader, c *HandoffConn) {
	flags := r.u8()
	if flags&^3 != 0 {
		r.bad = true
	}
	c.Composite = flags&1 != 0
	c.PresenceWatch = flags&2 != 0
	c.ExpiresMS = r.i64()
	c.Subject = r.str16(HandoffMaxName)
	c.PresenceSub = r.str16(HandoffMaxName)
	nt := r.u16()
	if nt > HandoffMaxTags || nt*2 > len(r.b) {
		r.bad = true
		return
	}
	for range nt {
		c.Tags = append(c.Tags, r.str16(HandoffMaxName))
	}
	ns := int(r.u8())
	if ns == 0 || ns*13 > len(r.b) {
		r.bad = true
		return
	}
	c.Subs = make([]HandoffSub, 0, ns)
	for range ns {
		var s HandoffSub
		s.Kind, s.State = r.u8(), r.u8()
		f := r.u8()
		s.Checked = f&1 != 0
		s.Cursor = r.i64()
		s.Name = r.str16(HandoffMaxName)
		if f&^1 != 0 || (s.Kind != HandoffStream && s.Kind != HandoffChannel) ||
			s.State < HandoffCatchUp || s.State > HandoffLagging || s.Name == "" {
			r.bad = true
			return
		}
		c.Subs = append(c.Subs, s)
	}
	nb := r.u32()
	if nb > HandoffMaxTail {
		r.bad = true
		return
	}
	if tail := r.n(int(nb)); len(tail) > 0 {
		c.Tail = append([]byte(nil), tail...)
	}
}

func decodeWorker(r *recReader, w *HandoffWorkerRec) {
	w.PID = r.u32()
	flags := r.u8()
	if flags&^1 != 0 {
		r.bad = true
	}
	w.Sibling = flags&1 != 0
	w.Name = r.str16(HandoffMaxName)
	nc := r.u16()
	if nc*11 > len(r.b) {
		r.bad = true
		return
	}
	for range nc {
		c := HandoffChan{Mode: r.u8(), Pos: r.i64(), Name: r.str16(HandoffMaxName)}
		if c.Mode > 1 || c.Name == "" || c.Pos < HandoffNoPosition {
			r.bad = true
			return
		}
		w.Channels = append(w.Channels, c)
	}
	w.Partial = r.u32()
	nb := r.u32()
	if nb > HandoffMaxTail || w.Partial > nb {
		r.bad = true
		return
	}
	if tail := r.n(int(nb)); len(tail) > 0 {
		w.Tail = append([]byte(nil), tail...)
	}
}

func decodeChannels(r *recReader, l *HandoffChannelList) {
	l.Mark = r.str16(HandoffMaxName)
	n := r.u32()
	if n > HandoffMaxChannels || int(n)*2 > len(r.b) {
		r.bad = true
		return
	}
	if n > 0 {
		l.Names = make([]string, 0, n)
	}
	for range n {
		name := r.str16(HandoffMaxName)
		if name == "" {
			r.bad = true
			return
		}
		l.Names = append(l.Names, name)
	}
}
