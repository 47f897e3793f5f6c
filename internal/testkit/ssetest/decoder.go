package ssetest

import "bytes"

// Decoder decodes a text/event-stream body as a browser's EventSource interprets it (the
// WHATWG HTML standard, "Interpreting an event stream"), incrementally: bytes go in as they
// arrive, split anywhere — inside a line, between a CR and its LF, inside a chunk header — and
// each block (the lines up to a blank line) comes out as a Block.
//
//   - A line ends at CRLF, LF or CR; one UTF-8 byte order mark at the very start is dropped.
//   - A line starting with ':' is a comment. Otherwise the field name is what precedes the
//     first ':' (the whole line when there is none) and the value what follows it, one
//     leading space removed.
//   - data lines are joined with LF; an id whose value holds a NUL does not change the last
//     event ID; a blank line ends the block, which an EventSource dispatches as an event only
//     if it had a data line; bytes after the last line break are not a line yet.
//
// It is written from the standard, not from pgsse's encoder (package sse), so that tests and
// fuzz targets can hold one against the other. Bytes are not UTF-8 decoded: Data is what the
// server sent.
//
// A Decoder allocates only while its buffers grow to the largest block it has seen (0
// allocations per event after that), so bench/ decodes 10,000 connections' events with it.
// The zero value is ready to use; set the options before the first Feed.
type Decoder struct {
	// Chunked: the bytes fed are an HTTP/1.1 body in chunked transfer coding (what a
	// net/http server sends); Feed removes that coding first. Ended reports its last chunk.
	Chunked bool
	// Eager reports a comment line or a retry field as a Block of its own as soon as the line
	// is complete (and leaves it out of the block it is in), as a browser acts on a retry at
	// once: for tests that wait for the preamble or a heartbeat, which no blank line follows.
	Eager bool
	// DiscardData: data values are measured (Block.DataLen), not kept (Block.Data is nil),
	// so that an event of many MiB costs the reader no buffer of its size.
	DiscardData bool
	// MaxLine bounds a line in bytes (0: no bound). A longer line is dropped and counted in
	// Bad.
	MaxLine int

	Comments int64 // comment lines so far (heartbeats, the preamble, reasons for a shed)
	Bad      int64 // lines over MaxLine, malformed chunk framing
	Ended    bool  // Chunked: the last chunk (size 0) was read

	// chunked transfer coding
	cstate    uint8
	chunkLeft int

	// lines
	started    bool   // the first line is complete (the BOM check is done)
	afterCR    bool   // the last line ended in CR: a LF next is the rest of its end
	skipping   bool   // the current line is over MaxLine: dropped
	discarding bool   // DiscardData: the current line is a data line, its value counted in discardN
	discardN   int    //
	buf        []byte // the current block's complete lines, then the current line from lineStart
	lineStart  int    //
	lines      []span // the current block's complete lines
	data       []byte // several data lines joined
	lastID     []byte // the last event ID buffer (it outlives blocks)
	blk        Block
}

// Block is one block of the stream: what the lines up to a blank line said. Its byte slices
// are views into the Decoder, valid only during the callback that receives it.
type Block struct {
	ID       []byte // the last id field of the block (HasID: there was one)
	HasID    bool
	Type     []byte // the last event field (HasType: there was one); "" is a "message"
	HasType  bool
	Data     []byte // the data lines joined by LF (nil with DiscardData)
	DataLen  int    // len(Data), also with DiscardData
	HasData  bool   // at least one data line: an EventSource dispatches the block as an event
	Retry    []byte // the last retry field (HasRetry: there was one)
	HasRetry bool
	Comments [][]byte // each comment line's text after the ':'
	Fields   []Field  // every field line in order (not the comments)
	// LastEventID is the stream's last event ID once this block is read: what a browser
	// sends as Last-Event-ID when it reconnects.
	LastEventID []byte
}

// Field is one field line: its name and value (for a data line with DiscardData, the value
// is nil).
type Field struct {
	Name, Value []byte
}

// span is a complete line of the current block in buf; n ≥ 0 marks a data line whose value
// (n bytes) was discarded.
type span struct {
	start, end int
	n          int
}

var bom = []byte("\xEF\xBB\xBF")

// Feed decodes b. It calls on for every block that b completes (and, with Eager, for every
// comment line and retry field); the Block is valid only during the call. on may be nil.
func (d *Decoder) Feed(b []byte, on func(*Block)) {
	if !d.Chunked {
		d.body(b, on)
		return
	}
	for len(b) > 0 {
		switch d.cstate {
		case chunkSize, chunkExt:
			c := b[0]
			b = b[1:]
			switch {
			case c == '\n':
				if d.chunkLeft == 0 {
					d.cstate, d.Ended = chunkDone, true
					return
				}
				d.cstate = chunkData
			case c == '\r':
			case d.cstate == chunkExt:
			case c == ';':
				d.cstate = chunkExt
			default:
				h := unhex(c)
				if h < 0 || d.chunkLeft > 1<<26 {
					d.Bad++
					d.cstate = chunkDone
					return
				}
				d.chunkLeft = d.chunkLeft<<4 | h
			}
		case chunkData:
			n := min(d.chunkLeft, len(b))
			d.body(b[:n], on)
			b = b[n:]
			d.chunkLeft -= n
			if d.chunkLeft == 0 {
				d.cstate = chunkCRLF
			}
		case chunkCRLF:
			c := b[0]
			b = b[1:]
			if c == '\n' {
				d.cstate = chunkSize
			} else if c != '\r' {
				d.Bad++
				d.cstate = chunkDone
				return
			}
		case chunkDone:
			return
		}
	}
}

const (
	chunkSize = iota
	chunkData
	chunkCRLF
	chunkExt
	chunkDone
)

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// InBlock reports whether a block has begun and is not dispatched yet: a line of it is
// complete, or part of a line has been fed.
func (d *Decoder) InBlock() bool {
	return len(d.lines) > 0 || len(d.buf) > d.lineStart || d.discarding || d.skipping
}

// LastEventID is the stream's last event ID so far (a view, valid until the next Feed).
func (d *Decoder) LastEventID() []byte { return d.lastID }

// body splits event-stream bytes into lines.
func (d *Decoder) body(b []byte, on func(*Block)) {
	for len(b) > 0 {
		if d.afterCR {
			d.afterCR = false
			if b[0] == '\n' {
				b = b[1:]
				continue
			}
		}
		end := bytes.IndexByte(b, '\n')
		upTo := b
		if end >= 0 {
			upTo = b[:end]
		}
		if cr := bytes.IndexByte(upTo, '\r'); cr >= 0 {
			end = cr
		}
		if end < 0 {
			d.partial(b)
			return
		}
		d.partial(b[:end])
		d.afterCR = b[end] == '\r'
		b = b[end+1:]
		d.endLine(on)
	}
}

// partial adds bytes of the current line.
func (d *Decoder) partial(seg []byte) {
	switch {
	case d.skipping:
		return
	case d.discarding:
		d.discardN += len(seg)
		return
	}
	if have := len(d.buf) - d.lineStart; d.DiscardData && d.started && have < 6 {
		// The line's first 6 bytes say whether it is a data line: then "data:" and the
		// optional space stay, and the value is only counted.
		k := min(6-have, len(seg))
		d.buf = append(d.buf, seg[:k]...)
		seg = seg[k:]
		if line := d.buf[d.lineStart:]; len(line) == 6 && string(line[:5]) == "data:" {
			keep := 5
			if line[5] == ' ' {
				keep = 6
			}
			d.discarding, d.discardN = true, len(line)-keep+len(seg)
			d.buf = d.buf[:d.lineStart+keep]
			return
		}
	}
	if d.MaxLine > 0 && len(d.buf)-d.lineStart+len(seg) > d.MaxLine {
		d.skipping = true
		d.buf = d.buf[:d.lineStart]
		d.Bad++
		return
	}
	d.buf = append(d.buf, seg...)
}

// endLine handles a complete line.
func (d *Decoder) endLine(on func(*Block)) {
	if d.skipping {
		d.skipping = false
		return
	}
	if !d.started {
		d.started = true
		if line := d.buf[d.lineStart:]; bytes.HasPrefix(line, bom) {
			n := copy(line, line[len(bom):])
			d.buf = d.buf[:d.lineStart+n]
		}
	}
	s := span{start: d.lineStart, end: len(d.buf), n: -1}
	if d.discarding {
		s.n = d.discardN
		d.discarding, d.discardN = false, 0
	}
	if s.start == s.end {
		d.dispatch(on)
		return
	}
	if d.buf[s.start] == ':' {
		d.Comments++
	}
	if d.Eager && s.n < 0 {
		line := d.buf[s.start:s.end]
		if line[0] == ':' || bytes.HasPrefix(line, []byte("retry")) && (len(line) == 5 || line[5] == ':') {
			d.lines = append(d.lines, s)
			d.report(on, len(d.lines)-1)
			d.lines = d.lines[:len(d.lines)-1]
			d.buf = d.buf[:s.start]
			return
		}
	}
	d.lines = append(d.lines, s)
	d.lineStart = len(d.buf)
}

// dispatch ends the block at a blank line.
func (d *Decoder) dispatch(on func(*Block)) {
	if len(d.lines) > 0 {
		d.report(on, 0)
	}
	d.lines = d.lines[:0]
	d.buf = d.buf[:0]
	d.lineStart = 0
}

// report builds the Block of lines[from:] and hands it to on.
func (d *Decoder) report(on func(*Block), from int) {
	blk := &d.blk
	*blk = Block{Comments: blk.Comments[:0], Fields: blk.Fields[:0]}
	var first []byte // the only data value, while there is one
	datas := 0
	for _, s := range d.lines[from:] {
		line := d.buf[s.start:s.end]
		if line[0] == ':' {
			blk.Comments = append(blk.Comments, line[1:])
			continue
		}
		name, value := line, []byte(nil)
		if c := bytes.IndexByte(line, ':'); c >= 0 {
			name, value = line[:c], line[c+1:]
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
		}
		vlen := len(value)
		if s.n >= 0 {
			value, vlen = nil, s.n
		}
		blk.Fields = append(blk.Fields, Field{Name: name, Value: value})
		switch string(name) {
		case "data":
			datas++
			if datas > 1 {
				blk.DataLen++ // the LF that joins it to the line before
			}
			blk.DataLen += vlen
			if d.DiscardData {
				break
			}
			switch datas {
			case 1:
				first = value
			case 2:
				d.data = append(append(append(d.data[:0], first...), '\n'), value...)
			default:
				d.data = append(append(d.data, '\n'), value...)
			}
		case "event":
			blk.Type, blk.HasType = value, true
		case "id":
			blk.ID, blk.HasID = value, true
			if bytes.IndexByte(value, 0) < 0 {
				d.lastID = append(d.lastID[:0], value...)
			}
		case "retry":
			blk.Retry, blk.HasRetry = value, true
		}
	}
	blk.HasData = datas > 0
	switch {
	case d.DiscardData || datas == 0:
	case datas == 1:
		blk.Data = first
		if blk.Data == nil {
			blk.Data = []byte{} // "data" alone: an empty event, not none
		}
	default:
		blk.Data = d.data
	}
	blk.LastEventID = d.lastID
	if on != nil {
		on(blk)
	}
}
