package framing

import "encoding/binary"

// Decoder decodes a byte stream that arrives in arbitrary pieces, such as the
// reads of a Unix socket. It decodes in place from the piece the caller fed
// and copies into its own buffer only the bytes of a frame that is split
// across pieces (the nats-server argBuf idea), so that buffer never holds
// more than one frame (HeaderLen+MaxBody bytes) when the Decoder is used as
// intended:
//
//	d.Feed(p)
//	for {
//		f, err := d.Next()
//		if err == framing.ErrIncomplete {
//			break // p may now be reused
//		}
//		if err != nil {
//			// protocol error: send STATUS PROTOCOL_ERROR and close
//		}
//		handle(f) // f's views are valid until the next Feed or Next
//	}
//
// A Decoder is not safe for concurrent use. The zero value is ready to use.
type Decoder struct {
	buf []byte // owned; buf[off:] are bytes copied from earlier pieces, not yet decoded
	off int
	in  []byte // borrowed: the unread rest of the last piece fed
	err error  // sticky protocol error
}

// Feed hands the decoder the next piece of the stream. The decoder reads p in
// place: the caller must not modify p until Next has returned an error
// (ErrIncomplete included) or Feed is called again — by then every byte of p
// has been either decoded or copied. Calling Feed before Next has drained the
// previous piece is allowed and correct, but copies that piece's unread rest,
// and doing it repeatedly grows the buffer beyond one frame.
func (d *Decoder) Feed(p []byte) {
	if len(d.in) > 0 {
		d.stash(d.in)
	}
	d.in = p
}

// Next returns the next complete frame. It returns ErrIncomplete when it
// needs more input; the bytes of a partial frame are kept for the next
// Feed. The frame's views point into the fed piece or into the decoder's
// buffer and are valid until the next call to Feed or Next. Any other error
// is a protocol error; it is sticky — every later Next returns it until Reset.
func (d *Decoder) Next() (Frame, error) {
	if d.err != nil {
		return Frame{}, d.err
	}
	// Slow path: finish the frame whose start was copied from an earlier piece.
	for d.off < len(d.buf) {
		p := d.buf[d.off:]
		f, n, err := Decode(p)
		switch {
		case err == nil:
			d.off += n
			return f, nil
		case err != ErrIncomplete:
			return d.fail(err)
		case len(d.in) == 0:
			return Frame{}, ErrIncomplete
		}
		// Move just enough of the new piece to complete the header, then the frame.
		want := HeaderLen
		if len(p) >= HeaderLen {
			want += int(binary.BigEndian.Uint32(p)) // ≤ MaxBody: Decode checked
		}
		k := min(want-len(p), len(d.in))
		d.stash(d.in[:k])
		d.in = d.in[k:]
	}
	// Fast path: decode in place from the caller's piece.
	d.buf, d.off = d.buf[:0], 0
	f, n, err := Decode(d.in)
	switch {
	case err == nil:
		d.in = d.in[n:]
		return f, nil
	case err == ErrIncomplete:
		d.stash(d.in)
		d.in = nil
		return Frame{}, ErrIncomplete
	}
	return d.fail(err)
}

// Buffered returns the number of bytes received but not yet returned as frames.
func (d *Decoder) Buffered() int { return len(d.buf) - d.off + len(d.in) }

// Reset forgets all input and any error, keeping the buffer's memory.
func (d *Decoder) Reset() {
	d.buf, d.off, d.in, d.err = d.buf[:0], 0, nil, nil
}

func (d *Decoder) fail(err error) (Frame, error) {
	d.err = err
	d.in = nil
	return Frame{}, err
}

// stash appends p to the pending bytes, first moving them to the front of the
// buffer so that it never grows past what is pending.
func (d *Decoder) stash(p []byte) {
	if len(p) == 0 {
		return
	}
	if d.off > 0 {
		n := copy(d.buf, d.buf[d.off:])
		d.buf, d.off = d.buf[:n], 0
	}
	d.buf = append(d.buf, p...)
}
