package engine

import (
	"syscall"
	"unsafe"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"
)

// maxIOV bounds one writev (Linux IOV_MAX is 1024).
const maxIOV = 1024

// writevConn writes bs to c in one writev syscall without allocating: gnet's Writev goes
// through unix.Writev, which builds a fresh iovec array per call. When gnet still holds
// unsent bytes for c, order requires appending behind them, so gnet takes the data;
// whatever the kernel does not take now is handed to gnet's outbound buffer.
//
// bs is never modified: it may be shared by every subscriber of a channel, and gnet's
// Writev rewrites its argument on a partial write, so gnet only ever gets a copy.
//
// Called on the loop goroutine only (iovecs and iovCopy are loop-owned scratch).
func (s *Server) writevConn(c gnet.Conn, bs [][]byte) {
	for len(bs) > maxIOV {
		s.writevConn(c, bs[:maxIOV])
		bs = bs[maxIOV:]
	}
	if c.OutboundBuffered() > 0 {
		s.gnetWritev(c, bs, 0)
		return
	}
	iov := s.iovecs[:0]
	total := 0
	for _, b := range bs {
		if len(b) == 0 {
			continue
		}
		iov = append(iov, unix.Iovec{Base: &b[0], Len: uint64(len(b))})
		total += len(b)
	}
	s.iovecs = iov[:0]
	if total == 0 {
		return
	}
	n, _, errno := syscall.Syscall(syscall.SYS_WRITEV, uintptr(c.Fd()), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	for i := range iov {
		iov[i].Base = nil
	}
	switch {
	case errno == syscall.EAGAIN:
		n = 0
	case errno != 0:
		// Let gnet see the error on its own write path: it closes the connection.
		s.gnetWritev(c, bs, 0)
		return
	}
	sent := int(n)
	if sent >= total {
		return
	}
	// Hand gnet the unsent tail (gnet copies it into its outbound buffer and polls for
	// writability).
	s.gnetWritev(c, bs, sent)
}

// gnetWritev hands bs, minus its first skip bytes, to gnet's Writev as a copy.
func (s *Server) gnetWritev(c gnet.Conn, bs [][]byte, skip int) {
	cp := s.iovCopy[:0]
	for _, b := range bs {
		if skip >= len(b) {
			skip -= len(b)
			continue
		}
		cp = append(cp, b[skip:])
		skip = 0
	}
	if len(cp) > 0 {
		_, _ = c.Writev(cp)
	}
	for i := range cp {
		cp[i] = nil
	}
	s.iovCopy = cp[:0]
}
