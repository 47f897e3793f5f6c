package pglisten

import "sync"

// Notification is one NotificationResponse. Channel and Payload are views into the buffer of
// the Batch that carries it: valid until that Batch is released. Copy what must outlive it.
type Notification struct {
	PID     uint32 // notifying backend
	Channel []byte // views into the batch's buffer
	Payload []byte
}

// Batch holds notifications parsed from one or more socket reads, copied into one buffer the
// batch owns. Pooled: the consumer owns it until Release, and must not touch it (or any
// Notification's bytes) afterwards.
type Batch struct {
	Notes []Notification
	buf   []byte // the socket bytes the notes point into; the reader reads straight into it
}

// batchBufSize is one read's worth; a batch never holds more than this unless one message is
// bigger. A variable only so the split-read fuzz target can make every message straddle reads.
var batchBufSize = 64 << 10

const batchKeepMax = 256 << 10 // buffers grown beyond this (for one huge message) are not pooled

var batchPool = sync.Pool{New: func() any { return &Batch{} }}

func getBatch() *Batch {
	b := batchPool.Get().(*Batch)
	if b.buf == nil || cap(b.buf) < 5 {
		b.buf = make([]byte, 0, max(batchBufSize, 5))
	}
	return b
}

// Release returns the batch to the pool. Notes and their bytes are invalid afterwards.
func (b *Batch) Release() {
	if b == nil {
		return
	}
	clear(b.Notes) // drop views so a pooled batch pins nothing but its own buffer
	b.Notes = b.Notes[:0]
	if cap(b.buf) > batchKeepMax {
		b.buf = nil
	} else {
		b.buf = b.buf[:0]
	}
	batchPool.Put(b)
}
