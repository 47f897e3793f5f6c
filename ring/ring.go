package ring

// Ring is a fixed-capacity FIFO of bytes. The zero value has capacity 0;
// use New. Not safe for concurrent use.
type Ring struct {
	buf  []byte
	head int // index of the first buffered byte
	n    int // number of buffered bytes
	low  int // watermarks (SetWatermarks)
	high int
}

// New returns a ring holding up to capacity bytes, allocating them once.
// The watermarks start at 0 (low) and capacity (high), so BelowLow and
// AboveHigh are false until SetWatermarks moves them. It panics if capacity
// is negative.
func New(capacity int) *Ring {
	if capacity < 0 {
		panic("ring: negative capacity")
	}
	return &Ring{buf: make([]byte, capacity), high: capacity}
}

// Len returns the number of buffered bytes.
func (r *Ring) Len() int { return r.n }

// Cap returns the ring's fixed capacity in bytes.
func (r *Ring) Cap() int { return len(r.buf) }

// Free returns how many more bytes fit.
func (r *Ring) Free() int { return len(r.buf) - r.n }

// Push appends frame whole, or, if fewer than len(frame) bytes are free,
// writes nothing and returns false.
func (r *Ring) Push(frame []byte) bool {
	if len(frame) > r.Free() {
		return false
	}
	r.write(frame)
	return true
}

// write copies p to the tail; the caller has checked that it fits.
func (r *Ring) write(p []byte) {
	if len(p) == 0 {
		return
	}
	tail := r.head + r.n
	if tail >= len(r.buf) {
		tail -= len(r.buf)
	}
	k := copy(r.buf[tail:], p) // up to the end of the buffer
	copy(r.buf, p[k:])         // the rest wraps to the front
	r.n += len(p)
}

// Peek returns every buffered byte, in order, as at most two contiguous
// views into the ring: second is non-empty only when the data wraps around
// the end of the buffer. The views are valid until the next Push, Consume or
// Reset; they suit a vectored write (writev).
func (r *Ring) Peek() (first, second []byte) {
	end := r.head + r.n
	if end <= len(r.buf) {
		return r.buf[r.head:end:end], nil
	}
	end -= len(r.buf)
	return r.buf[r.head:], r.buf[:end:end]
}

// Consume drops n bytes from the front; n may end inside a frame. It panics
// if n is negative or more than Len.
func (r *Ring) Consume(n int) {
	if n < 0 || n > r.n {
		panic("ring: Consume beyond Len")
	}
	r.n -= n
	if r.n == 0 {
		r.head = 0 // empty: restart at the front so the next data is contiguous
		return
	}
	r.head += n
	if r.head >= len(r.buf) {
		r.head -= len(r.buf)
	}
}

// Reset drops all buffered bytes. Capacity and watermarks are kept.
func (r *Ring) Reset() { r.head, r.n = 0, 0 }

// SetWatermarks sets the low and high watermarks in bytes. It panics unless
// 0 ≤ low ≤ high ≤ Cap().
func (r *Ring) SetWatermarks(low, high int) {
	if low < 0 || low > high || high > len(r.buf) {
		panic("ring: watermarks must satisfy 0 <= low <= high <= Cap()")
	}
	r.low, r.high = low, high
}

// AboveHigh reports whether more than the high watermark is buffered.
func (r *Ring) AboveHigh() bool { return r.n > r.high }

// BelowLow reports whether less than the low watermark is buffered.
func (r *Ring) BelowLow() bool { return r.n < r.low }
