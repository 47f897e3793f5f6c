//go:build linux

package chaos

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pgsse/pgsse/internal/testkit/ssetest"
)

// block is one dispatched SSE block: what a browser's EventSource would turn into an event
// (id, event, data), or a block of only a retry field.
type block struct {
	id      string
	hasID   bool
	event   string
	data    string
	hasData bool
	retry   string
}

// sseConn is one SSE connection decoded by the test kit's EventSource decoder
// (ssetest.Decoder, written from the HTML standard) over a pacedReader (which can be slowed
// or stalled). The bytes read are fed a line at a time, so that a client reset can land in
// the middle of an event: between two lines of a block or inside a long data line (longer
// than a read).
type sseConn struct {
	c     net.Conn
	stop  func() bool // ends the context's hold on c
	r     *pacedReader
	br    *bufio.Reader // the response head was read through it; it may hold the body's start
	dec   ssetest.Decoder
	buf   []byte  // the last read
	rest  []byte  // what of buf is not fed yet
	ready []block // blocks decoded and not yet returned
}

// pacedReader reads the socket at most rate bytes per second (0 = as fast as it can), and
// not at all until stallUntil (UnixNano) has passed.
type pacedReader struct {
	c          net.Conn
	ctx        context.Context
	rate       *atomic.Int64
	stallUntil *atomic.Int64
}

func (p *pacedReader) Read(b []byte) (int, error) {
	for {
		until := p.stallUntil.Load()
		now := time.Now().UnixNano()
		if until <= now {
			break
		}
		if err := sleepCtx(p.ctx, min(time.Duration(until-now), 200*time.Millisecond)); err != nil {
			return 0, err
		}
	}
	rate := p.rate.Load()
	if rate > 0 && len(b) > 1024 {
		b = b[:1024]
	}
	n, err := p.c.Read(b)
	if rate > 0 && n > 0 {
		if e := sleepCtx(p.ctx, time.Duration(int64(n)*int64(time.Second)/rate)); e != nil && err == nil {
			err = e
		}
	}
	return n, err
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// response is a request's answer head (and, for a non-200, the first line of its body).
type response struct {
	status int
	reason string // the body's first line for a non-200
	at     time.Time
}

// errReset is returned by next when the client reset the connection on purpose.
var errReset = errors.New("reset by the client")

// dialSSE connects to addr, sends a GET for target with the given extra header lines and
// reads the response head. rcvBuf > 0 sets SO_RCVBUF before connecting (a small receive
// buffer keeps what a slow reader has not taken in the server). On a 200 the connection is
// returned ready for next; otherwise it is closed.
func dialSSE(ctx context.Context, addr, target string, header []string, rcvBuf int,
	rate, stall *atomic.Int64) (*sseConn, response, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	if rcvBuf > 0 {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) {
				_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvBuf)
			})
		}
	}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, response{}, err
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	ok := false
	defer func() {
		if !ok {
			stop()
			_ = c.Close()
		}
	}()
	var req bytes.Buffer
	fmt.Fprintf(&req, "GET %s HTTP/1.1\r\nHost: %s\r\nAccept: text/event-stream\r\n", target, addr)
	for _, h := range header {
		req.WriteString(h)
		req.WriteString("\r\n")
	}
	req.WriteString("\r\n")
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Write(req.Bytes()); err != nil {
		return nil, response{}, err
	}
	pr := &pacedReader{c: c, ctx: ctx, rate: rate, stallUntil: stall}
	br := bufio.NewReaderSize(pr, 4096)
	var resp response
	first := true
	contentLength := -1
	for {
		ln, err := br.ReadString('\n')
		if err != nil {
			return nil, resp, fmt.Errorf("reading the response head: %w", err)
		}
		ln = strings.TrimRight(ln, "\r\n")
		if first {
			first = false
			f := strings.SplitN(ln, " ", 3)
			if len(f) < 2 || !strings.HasPrefix(f[0], "HTTP/1.") {
				return nil, resp, fmt.Errorf("bad status line %q", ln)
			}
			if resp.status, err = strconv.Atoi(f[1]); err != nil {
				return nil, resp, fmt.Errorf("bad status line %q", ln)
			}
			continue
		}
		if ln == "" {
			break
		}
		if k, v, ok := strings.Cut(ln, ":"); ok && strings.EqualFold(k, "Content-Length") {
			contentLength, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	resp.at = time.Now()
	if resp.status != 200 {
		n := contentLength
		if n < 0 || n > 4096 {
			n = 4096
		}
		body := make([]byte, n)
		m, _ := io.ReadFull(br, body)
		resp.reason, _, _ = strings.Cut(string(body[:m]), "\n")
		return nil, resp, nil
	}
	_ = c.SetDeadline(time.Time{})
	ok = true
	// stop stays registered until close: a cancelled run ends every connection's read at once.
	return &sseConn{c: c, stop: stop, r: pr, br: br}, resp, nil
}

// next returns the next dispatched block. resetMid, when it returns true while a block is
// in progress, makes next reset the connection (RST) and return errReset.
func (s *sseConn) next(resetMid func() bool) (block, error) {
	for len(s.ready) == 0 {
		if len(s.rest) == 0 {
			if s.buf == nil {
				s.buf = make([]byte, 4096)
			}
			n, err := s.br.Read(s.buf)
			s.rest = s.buf[:n]
			if n == 0 && err != nil {
				return block{}, err
			}
		}
		// A line at a time (or what there is of one); a block that completes ends the feed.
		for len(s.rest) > 0 && len(s.ready) == 0 {
			k := bytes.IndexByte(s.rest, '\n') + 1
			if k == 0 {
				k = len(s.rest)
			}
			s.dec.Feed(s.rest[:k], s.keep)
			s.rest = s.rest[k:]
			if len(s.ready) == 0 && s.dec.InBlock() && resetMid != nil && resetMid() {
				s.reset()
				return block{}, errReset
			}
		}
	}
	b := s.ready[0]
	s.ready = s.ready[1:]
	return b, nil
}

// keep records a decoded block that an EventSource acts on: an event, or a retry field.
func (s *sseConn) keep(b *ssetest.Block) {
	if !b.HasData && !b.HasID && !b.HasType && !b.HasRetry {
		return // comments only (a heartbeat)
	}
	blk := block{event: string(b.Type), data: string(b.Data), hasData: b.HasData, retry: string(b.Retry)}
	if b.HasID && bytes.IndexByte(b.ID, 0) < 0 { // an id holding NUL is ignored (the standard)
		blk.id, blk.hasID = string(b.ID), true
	}
	s.ready = append(s.ready, blk)
}

// reset closes the connection with an RST (SO_LINGER 0): what the server was writing is lost.
func (s *sseConn) reset() {
	if tc, ok := s.c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	s.close()
}

func (s *sseConn) close() {
	s.stop()
	_ = s.c.Close()
}
