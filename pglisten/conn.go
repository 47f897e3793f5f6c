package pglisten

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// connection is one hijacked PostgreSQL connection: a reader goroutine that parses what
// arrives and hands it to the session goroutine, and a writer goroutine that sends what the
// session goroutine queued, with a write deadline. Both end when stop closes the socket.
type connection struct {
	nc       net.Conn
	pid      uint32
	items    chan item
	quit     chan struct{}
	lastRecv atomic.Int64 // session clock (ns) of the last read that returned data

	wmu     sync.Mutex
	wbuf    []byte
	wspare  []byte
	wwake   chan struct{}
	timeout time.Duration

	now func() time.Duration
	log *slog.Logger
	wg  sync.WaitGroup
}

func newConnection(nc net.Conn, pid uint32, writeTimeout time.Duration, now func() time.Duration, log *slog.Logger) *connection {
	c := &connection{
		nc:      nc,
		pid:     pid,
		items:   make(chan item, 16),
		quit:    make(chan struct{}),
		wwake:   make(chan struct{}, 1),
		timeout: writeTimeout,
		now:     now,
		log:     log,
	}
	c.lastRecv.Store(int64(now()))
	return c
}

func (c *connection) start() {
	c.wg.Add(2)
	go c.readLoop()
	go c.writeLoop()
}

func (c *connection) readLoop() {
	defer c.wg.Done()
	emit := func(it item) bool {
		select {
		case c.items <- it:
			return true
		case <-c.quit:
			it.batch.Release()
			return false
		}
	}
	readStream(c.nc, emit, func() { c.lastRecv.Store(int64(c.now())) }, c.log)
}

// write queues p (copied) for the writer goroutine. Never blocks on I/O.
func (c *connection) write(p []byte) {
	c.wmu.Lock()
	c.wbuf = append(c.wbuf, p...)
	c.wmu.Unlock()
	select {
	case c.wwake <- struct{}{}:
	default:
	}
}

func (c *connection) writeLoop() {
	defer c.wg.Done()
	for {
		select {
		case <-c.quit:
			return
		case <-c.wwake:
		}
		c.wmu.Lock()
		buf := c.wbuf
		c.wbuf = c.wspare[:0]
		c.wmu.Unlock()
		if len(buf) == 0 {
			c.wspare = buf
			continue
		}
		_ = c.nc.SetWriteDeadline(time.Now().Add(c.timeout))
		_, err := c.nc.Write(buf)
		if err != nil {
			// The reader sees the closed socket and reports the loss in protocol order.
			c.log.Warn("pglisten: write failed", "pid", c.pid, "err", err)
			_ = c.nc.Close()
			return
		}
		c.wspare = buf[:0]
	}
}

// stop closes the socket, waits for both goroutines and releases undelivered batches.
func (c *connection) stop() {
	close(c.quit)
	_ = c.nc.Close()
	c.wg.Wait()
	for {
		select {
		case it := <-c.items:
			it.batch.Release()
		default:
			return
		}
	}
}
