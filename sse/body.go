package sse

// BodyDecoder reads one request body, framed by Content-Length or chunked
// transfer coding (RFC 9112 §6, §7.1), from input that arrives in pieces.
//
// It is an explicit state machine fed whatever the socket delivered so far:
// each Decode call takes bytes from the front of its input, says how many it
// consumed, and keeps its place for the next call, so nothing is scanned
// twice and a body split at any byte decodes exactly as one delivered at
// once. It stops at the body's last byte: what follows in the same input
// (the next pipelined request's head) is left for the caller.
//
// The body is a view into the input of the final Decode call when it arrived
// in one piece there (a whole Content-Length body, or a chunked body whose
// data is one chunk), and otherwise is assembled in the buffer the caller
// gave Start. Data beyond the limit given to Start is refused with a 413 as
// soon as it is announced (a Content-Length before anything is read, a
// chunk size as its digits arrive). Chunk syntax is strict: hex sizes of at
// most MaxChunkSizeDigits digits, extensions (ignored) of at most
// MaxChunkExtBytes per body and free of control characters, CRLF after
// every line and every chunk's data, trailer fields (ignored) of at most
// MaxTrailerBytes in all, each a well-formed field line.
//
// A BodyDecoder is reusable (Start resets it) and not safe for concurrent
// use; its zero value is ready for Start. It never allocates unless the
// caller's buffer must grow to hold a body that arrived in pieces.
type BodyDecoder struct {
	state   bodyState
	max     int64  // the most data bytes accepted
	remain  int64  // data bytes left in the current chunk or Content-Length body
	size    int64  // data bytes so far, chunk sizes included as soon as announced
	digits  int    // hex digits of the current chunk size
	ext     int    // chunk-extension bytes so far, over the whole body
	extSemi bool   // the current chunk line's extension has begun with ';'
	trailer int    // trailer-section bytes so far
	buf     []byte // caller-owned: where a body in pieces is assembled
	body    []byte // the body, once done
	pending []byte // a data segment of the current input not yet copied to buf
	pieces  bool   // some data has been copied to buf: the body cannot be a view
	skip    bool   // Skip was called: data is consumed, not kept
}

type bodyState uint8

const (
	bodyIdle     bodyState = iota // before Start
	bodyDone                      // the whole body has been consumed
	bodyFailed                    // a framing error: the connection must close
	bodyLength                    // Content-Length data
	chunkSize                     // chunk-size hex digits
	chunkExt                      // chunk-ext, up to the CR
	chunkSizeLF                   // the LF ending a chunk-size line
	chunkData                     // chunk data
	chunkDataCR                   // the CR after chunk data
	chunkDataLF                   // the LF after chunk data
	trailerStart                  // start of a trailer line, or the CR of the final CRLF
	trailerName                   // a trailer field name
	trailerValue                  // a trailer field value, up to the CR
	trailerLF                     // the LF ending a trailer line
	bodyEndLF                     // the LF of the final CRLF
)

// Bounds on chunked framing.
const (
	MaxChunkSizeDigits = 16   // hex digits in one chunk-size, leading zeros included
	MaxChunkExtBytes   = 1024 // chunk-extension bytes over a whole body
	MaxTrailerBytes    = 4096 // trailer-section bytes, CRLFs included
)

// DefaultMaxPublishBytes is the default --max-publish-bytes (docs/operations.md, Configuration).
const DefaultMaxPublishBytes = 1 << 20

// maxBodyLimit caps the limit Start accepts, so that chunk-size arithmetic
// (at most 16 times the limit) cannot overflow.
const maxBodyLimit = 1 << 56

// Body errors. A Decode error means the body's framing is broken: answer it
// and close the connection, since the next request cannot be found.
var (
	errLengthRequired = &ParseError{Status: 411, Reason: "a POST needs Content-Length or Transfer-Encoding: chunked"}
	errBodyTooLarge   = &ParseError{Status: 413, Reason: "request body is larger than the limit"}
	errChunkSize      = badRequest("chunk size must be hex digits")
	errChunkSizeLong  = badRequest("chunk size has more than 16 hex digits")
	errChunkExt       = badRequest("invalid chunk extension")
	errChunkExtLong   = badRequest("chunk extensions are longer than the limit")
	errChunkCRLF      = badRequest("chunk line must end in CRLF")
	errChunkDataCRLF  = badRequest("chunk data must be followed by CRLF")
	errTrailer        = badRequest("invalid trailer field")
	errTrailerLong    = badRequest("trailer section is longer than the limit")
)

// Start prepares d for the body of req: at most maxBytes data bytes
// (maxBytes <= 0 means DefaultMaxPublishBytes), assembled when needed in buf
// (its contents are dropped; its capacity is reused). It returns a
// *ParseError when the answer is known before any body byte: 411 for a POST
// without Content-Length or chunked coding, 413 for a Content-Length over
// the limit. A request with no body (not a POST, or Content-Length: 0) is
// done at once: Done reports true and Body is empty.
func (d *BodyDecoder) Start(req *Request, maxBytes int64, buf []byte) error {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxPublishBytes
	}
	maxBytes = min(maxBytes, maxBodyLimit)
	*d = BodyDecoder{state: bodyDone, max: maxBytes, buf: buf[:0]}
	switch req.Framing {
	case BodyNone:
		if req.Method == MethodPOST {
			d.state = bodyFailed
			return errLengthRequired
		}
	case BodyLength:
		if req.ContentLength > maxBytes {
			d.state = bodyFailed
			return errBodyTooLarge
		}
		if req.ContentLength > 0 {
			d.state, d.remain = bodyLength, req.ContentLength
		}
	case BodyChunked:
		d.state = chunkSize
	}
	d.body = d.buf[:0:0]
	return nil
}

// Skip makes d consume the rest of the body without keeping it: for a
// request already answered (401, 403, a bad parameter) whose connection
// stays open for the next one. The limit still applies. The buffer given to
// Start (and what it grew to) is dropped, so that a refused body that is
// still arriving holds no memory: Buffer is empty afterwards.
func (d *BodyDecoder) Skip() {
	d.skip = true
	d.pending = nil
	d.buf = nil
}

// Done reports whether the whole body has been consumed.
func (d *BodyDecoder) Done() bool { return d.state == bodyDone }

// Body returns the body once Done: a view into the input of the final
// Decode call (valid as long as that input is) or into the buffer given to
// Start. It has no spare capacity. It is empty after Skip.
func (d *BodyDecoder) Body() []byte { return d.body }

// Buffer returns the buffer given to Start, grown if a body needed it, for
// the caller to keep and pass to the next Start.
func (d *BodyDecoder) Buffer() []byte { return d.buf[:0] }

// Decode consumes body bytes from the front of in and reports how many
// (n), and whether the body is now complete (done). When it is not, all of
// in was consumed and more input is needed. An error is a *ParseError (400
// for broken framing, 413 over the limit); after one, d stays failed.
func (d *BodyDecoder) Decode(in []byte) (n int, done bool, err error) {
	if d.state == bodyDone {
		return 0, true, nil
	}
	if d.state == bodyFailed || d.state == bodyIdle {
		return 0, false, errBodyState
	}
	i, err := d.scan(in)
	if err != nil {
		d.state, d.pending, d.body = bodyFailed, nil, nil
		return i, false, err
	}
	if d.state == bodyDone {
		switch {
		case d.skip:
			d.body = d.buf[:0:0]
		case d.pending != nil && !d.pieces:
			d.body = d.pending[:len(d.pending):len(d.pending)]
		default:
			d.flush()
			d.body = d.buf[:len(d.buf):len(d.buf)]
		}
		d.pending = nil
		return i, true, nil
	}
	d.flush() // the input is the caller's again once Decode returns
	return i, false, nil
}

// errBodyState is a caller's mistake: Decode without Start, or after an error.
var errBodyState = &ParseError{Status: 500, Reason: "body decoder used without Start or after an error"}

// data takes the next data segment, seg, of the body (in's bytes): the first
// segment of a body is remembered as a view, anything more is copied.
func (d *BodyDecoder) data(seg []byte) {
	if d.skip || len(seg) == 0 {
		return
	}
	if d.pending == nil && !d.pieces {
		d.pending = seg
		return
	}
	d.flush()
	d.buf = append(d.buf, seg...)
}

// flush copies a remembered view into buf: from now on the body is in pieces.
func (d *BodyDecoder) flush() {
	if d.pending != nil {
		d.buf = append(d.buf, d.pending...)
		d.pending = nil
	}
	if len(d.buf) > 0 {
		d.pieces = true
	}
}

// scan is the state machine; it returns how much of in it consumed.
func (d *BodyDecoder) scan(in []byte) (int, error) {
	i := 0
	for i < len(in) {
		switch d.state {
		case bodyLength, chunkData:
			k := int(min(d.remain, int64(len(in)-i)))
			d.data(in[i : i+k])
			i += k
			d.remain -= int64(k)
			if d.remain > 0 {
				continue
			}
			if d.state == bodyLength {
				d.state = bodyDone
				return i, nil
			}
			d.state = chunkDataCR

		case chunkSize:
			c := in[i]
			if v := unhex[c]; v >= 0 {
				if d.digits++; d.digits > MaxChunkSizeDigits {
					return i, errChunkSizeLong
				}
				d.remain = d.remain<<4 | int64(v)
				if d.size+d.remain > d.max {
					return i, errBodyTooLarge
				}
				i++
				continue
			}
			if d.digits == 0 {
				return i, errChunkSize
			}
			switch c {
			case '\r':
				d.state = chunkSizeLF
			case ';', ' ', '\t':
				d.state = chunkExt
				continue // the extension's first byte is checked there
			case '\n':
				return i, errChunkCRLF
			default:
				return i, errChunkSize
			}
			i++

		case chunkExt:
			// chunk-ext = *( BWS ";" BWS name [ BWS "=" BWS value ] ): ignored,
			// but it must start with ';' after optional whitespace and hold no
			// control character (a CR ends it; a bare LF is an error). Every
			// byte counts against MaxChunkExtBytes.
			for ; i < len(in); i++ {
				c := in[i]
				if c == '\r' {
					break
				}
				if d.ext++; d.ext > MaxChunkExtBytes {
					return i, errChunkExtLong
				}
				switch {
				case c == ';':
					d.extSemi = true
				case c == ' ' || c == '\t':
				case !isFieldVChar[c] || !d.extSemi:
					return i, errChunkExt
				}
			}
			if i < len(in) {
				if !d.extSemi {
					return i, errChunkExt // whitespace, then the end of the line
				}
				d.state = chunkSizeLF
				i++
			}

		case chunkSizeLF:
			if in[i] != '\n' {
				return i, errChunkCRLF
			}
			i++
			d.digits, d.extSemi = 0, false
			if d.remain == 0 {
				d.state = trailerStart // the last chunk
				continue
			}
			d.size += d.remain
			d.state = chunkData

		case chunkDataCR:
			if in[i] != '\r' {
				return i, errChunkDataCRLF
			}
			d.state = chunkDataLF
			i++

		case chunkDataLF:
			if in[i] != '\n' {
				return i, errChunkDataCRLF
			}
			d.state = chunkSize
			i++

		case trailerStart, trailerName, trailerValue, trailerLF:
			// Trailer fields are ignored; they count against MaxTrailerBytes.
			c := in[i]
			if d.trailer++; d.trailer > MaxTrailerBytes {
				return i, errTrailerLong
			}
			switch d.state {
			case trailerStart:
				switch {
				case c == '\r':
					d.state = bodyEndLF
				case isToken[c]:
					d.state = trailerName
				default:
					return i, errTrailer // includes obs-fold and bare LF
				}
			case trailerName:
				switch {
				case c == ':':
					d.state = trailerValue
				case !isToken[c]:
					return i, errTrailer
				}
			case trailerValue:
				switch {
				case c == '\r':
					d.state = trailerLF
				case !isFieldVChar[c] && c != ' ' && c != '\t':
					return i, errTrailer
				}
			case trailerLF:
				if c != '\n' {
					return i, errTrailer
				}
				d.state = trailerStart
			}
			i++

		case bodyEndLF:
			if in[i] != '\n' {
				return i, errChunkCRLF
			}
			d.state = bodyDone
			return i + 1, nil
		}
	}
	return i, nil
}
