package bench

import "bytes"

// Stream decodes one SSE response body as it arrives: optional HTTP/1.1 chunked transfer
// coding (net/http's choice; pgsse's bodies are close-delimited), then lines. For every
// `data: ` line it calls onData with the line's value; comment lines (heartbeats) are counted.
// It keeps only a partial line between calls, capped at maxLine bytes (an over-long line is an
// error for the benchmark, counted in Bad).
type Stream struct {
	Chunked bool

	state     uint8 // chunked: 0 size line, 1 data, 2 CRLF after data, 3 extension, 4 done
	chunkLeft int
	line      []byte

	Comments int64 // comment lines (":" …), i.e. heartbeats and the preamble comment
	Bad      int64 // over-long lines or malformed chunk framing
	Ended    bool  // the last chunk (size 0) was read
}

const maxLine = 64 << 10

const (
	chunkSize = iota
	chunkData
	chunkCRLF
	chunkExt
	chunkDone
)

// Feed decodes b (raw socket bytes). onData's argument is valid only during the call.
func (s *Stream) Feed(b []byte, onData func(value []byte)) {
	if !s.Chunked {
		s.body(b, onData)
		return
	}
	for len(b) > 0 {
		switch s.state {
		case chunkSize, chunkExt:
			c := b[0]
			b = b[1:]
			switch {
			case c == '\n':
				if s.chunkLeft == 0 {
					s.state = chunkDone
					s.Ended = true
					return
				}
				s.state = chunkData
			case c == '\r':
			case s.state == chunkExt:
			case c == ';':
				s.state = chunkExt
			default:
				d := unhex(c)
				if d < 0 || s.chunkLeft > 1<<26 {
					s.Bad++
					s.state = chunkDone
					return
				}
				s.chunkLeft = s.chunkLeft<<4 | d
			}
		case chunkData:
			n := min(s.chunkLeft, len(b))
			s.body(b[:n], onData)
			b = b[n:]
			s.chunkLeft -= n
			if s.chunkLeft == 0 {
				s.state = chunkCRLF
			}
		case chunkCRLF:
			c := b[0]
			b = b[1:]
			if c == '\n' {
				s.state = chunkSize
			} else if c != '\r' {
				s.Bad++
				s.state = chunkDone
				return
			}
		case chunkDone:
			return
		}
	}
}

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

func (s *Stream) body(b []byte, onData func([]byte)) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			if len(s.line)+len(b) > maxLine {
				s.Bad++
				s.line = s.line[:0]
				return
			}
			s.line = append(s.line, b...)
			return
		}
		ln := b[:i]
		if len(s.line) > 0 {
			s.line = append(s.line, ln...)
			ln = s.line
		}
		s.handleLine(ln, onData)
		s.line = s.line[:0]
		b = b[i+1:]
	}
}

func (s *Stream) handleLine(ln []byte, onData func([]byte)) {
	if n := len(ln); n > 0 && ln[n-1] == '\r' {
		ln = ln[:n-1]
	}
	switch {
	case len(ln) == 0:
	case ln[0] == ':':
		s.Comments++
	case bytes.HasPrefix(ln, []byte("data: ")):
		onData(ln[6:])
	}
}

// AppendData appends the benchmark's event data: "<seq> <sendUnixNano>" padded with 'x' to
// size bytes (never shorter than the two numbers).
func AppendData(dst []byte, seq, sendNs int64, size int) []byte {
	start := len(dst)
	dst = appendInt(dst, seq)
	dst = append(dst, ' ')
	dst = appendInt(dst, sendNs)
	for len(dst)-start < size {
		dst = append(dst, 'x')
	}
	return dst
}

// ParseData reads what AppendData wrote; ok is false for anything else.
func ParseData(v []byte) (seq, sendNs int64, ok bool) {
	i := 0
	seq, i, ok = parseDigits(v, i)
	if !ok || i >= len(v) || v[i] != ' ' {
		return 0, 0, false
	}
	sendNs, _, ok = parseDigits(v, i+1)
	return seq, sendNs, ok
}

func parseDigits(v []byte, i int) (int64, int, bool) {
	start := i
	var n int64
	for i < len(v) && v[i] >= '0' && v[i] <= '9' && i-start < 19 {
		n = n*10 + int64(v[i]-'0')
		i++
	}
	return n, i, i > start
}

func appendInt(dst []byte, n int64) []byte {
	var b [20]byte
	i := len(b)
	if n == 0 {
		return append(dst, '0')
	}
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return append(dst, b[i:]...)
}
