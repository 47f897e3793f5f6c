package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"

	"github.com/pgsse/pgsse/framing"
)

// The engine's side of a handoff (docs/operations.md, Upgrading without disconnects; SPEC §6):
// cmd/pgsse starts the successor process and carries descriptors and records between the two
// over an inherited socketpair; the engine gives up its listeners and connections
// (ListenerFiles, StopAcceptingAll, HandOver) and, in the successor, serves on the listeners
// it inherited (Config.Inherited) and takes the connections back onto its loop (Adopt) through
// gnet.Engine.Register, the path every accepted connection takes.
//
// What makes the move exact: a connection is handed over inside one loop task — its record
// (subscriptions, cursors, the bytes its socket has not taken) is made, its descriptor
// duplicated and the loop's own closed — so nothing is written to it after its record is
// made; the successor writes the record's tail first, then catches each stream up from the
// cursor, which is the last durable id written or queued. No byte is duplicated or lost.

const (
	handoffBatch = 64                    // connections per loop task
	handoffPoll  = 20 * time.Millisecond // while connections finish a request or flush gnet's buffer
)

// HandedConn is one connection on its way to a successor: its descriptor (a duplicate the
// caller of HandOver must not close: HandOver does, once send returned) and its record
// (framing.AppendHandoffConn).
type HandedConn struct {
	FD     int
	Record []byte
}

// Inheritance is what a successor process serves with instead of binding its own sockets:
// the predecessor's listeners, shared with it until it stops accepting.
type Inheritance struct {
	SSE net.Listener // --listen
	Hub net.Listener // --hub-socket (nil: none); its file is the predecessor's, kept in place
	// Accept is closed once the predecessor has stopped accepting: only then do this
	// server's acceptors start (nil: at once).
	Accept <-chan struct{}
}

// handBatch is what one loop task handed over, and how many connections are left.
type handBatch struct {
	conns   []HandedConn
	waiting int
}

// adoption is the context of a connection Adopt registers (handler.go: OnOpen).
type adoption struct{ conn framing.HandoffConn }

// ListenerFiles returns duplicates of the listening sockets — --listen and, if any, the hub
// socket — for a successor to inherit (os/exec ExtraFiles). Valid after Started.
func (s *Server) ListenerFiles() (sse, hub *os.File, err error) {
	ln, ok := s.sseLn.Load().(net.Listener)
	if !ok {
		return nil, nil, errors.New("engine: not serving")
	}
	tl, ok := ln.(interface{ File() (*os.File, error) })
	if !ok {
		return nil, nil, errors.New("engine: --listen cannot be shared")
	}
	if sse, err = tl.File(); err != nil {
		return nil, nil, fmt.Errorf("--listen: %w", err)
	}
	if hl, ok := s.hubLn.Load().(*net.UnixListener); ok {
		if hub, err = hl.File(); err != nil {
			_ = sse.Close()
			return nil, nil, fmt.Errorf("--hub-socket: %w", err)
		}
	}
	return sse, hub, nil
}

// StopAcceptingAll closes this process's descriptors of --listen and the hub socket, which
// a successor holds too: new connections go to it, none is refused, and the hub socket's file
// stays where it is (this server will not remove it as it stops). Connections already accepted
// are still handed to the loop.
func (s *Server) StopAcceptingAll() {
	s.handedOff.Store(true)
	if hl, ok := s.hubLn.Load().(*net.UnixListener); ok {
		hl.SetUnlinkOnClose(false)
		_ = hl.Close()
	}
	s.StopAccepting()
}

// HandOver gives every streaming SSE connection to a successor, handoffBatch per loop task,
// send carrying each batch (descriptors by SCM_RIGHTS); idle keep-alive publishers are closed
// between requests, and a connection in the middle of a request is waited for (a publish is
// answered here; a subscription is handed over once it streams). It returns when nothing is
// left to hand over, or when ctx ends (what is left is then drained as at SIGTERM), or when
// send fails. Call StopAcceptingAll first.
func (s *Server) HandOver(ctx context.Context, send func([]HandedConn) error) (handed int, err error) {
	var batch []HandedConn
	for {
		res := make(chan handBatch, 1)
		out := batch[:0]
		if !s.tasks.push(func() {
			conns, waiting := s.conns.handOverBatch(handoffBatch, out)
			res <- handBatch{conns, waiting}
		}) {
			return handed, errors.New("engine: stopped")
		}
		var r handBatch
		select {
		case r = <-res:
		case <-ctx.Done():
			// The task still runs: close what it hands over.
			go func() {
				for _, h := range (<-res).conns {
					_ = unix.Close(h.FD)
				}
			}()
			return handed, ctx.Err()
		}
		batch = r.conns
		if len(batch) > 0 {
			err := send(batch)
			for i, h := range batch {
				_ = unix.Close(h.FD)
				batch[i] = HandedConn{}
			}
			handed += len(batch)
			if err != nil {
				return handed, err
			}
			continue
		}
		if r.waiting == 0 {
			return handed, nil
		}
		t := time.NewTimer(handoffPoll)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return handed, ctx.Err()
		}
	}
}

// Adopt takes connections a predecessor handed over onto the loop, through the same
// gnet.Engine.Register path as accepted ones: fd is the received descriptor (Adopt owns it),
// record its state. It returns once the loop has them; a record that does not decode (another
// version, malformed) is refused and its connection closed.
func (s *Server) Adopt(fds []int, records [][]byte) error {
	select {
	case <-s.started:
	default:
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
		return errors.New("engine: Adopt before the server started")
	}
	var errs []error
	var results []<-chan gnet.RegisteredResult
	for i, fd := range fds {
		rec, err := framing.DecodeHandoff(records[i])
		if err == nil && rec.Kind != framing.HandoffSSE {
			err = fmt.Errorf("engine: handoff record of kind %d where an SSE connection was expected", rec.Kind)
		}
		if err != nil {
			_ = unix.Close(fd)
			errs = append(errs, err)
			continue
		}
		f := os.NewFile(uintptr(fd), "pgsse-handed-conn")
		c, err := net.FileConn(f)
		_ = f.Close()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ctx := gnet.NewNetConnContext(gnet.NewContext(context.Background(), &adoption{conn: rec.Conn}), c)
		res, err := s.eng.Register(ctx)
		if err != nil {
			_ = c.Close()
			errs = append(errs, err)
			continue
		}
		results = append(results, res)
	}
	for _, res := range results {
		if r := <-res; r.Err != nil {
			errs = append(errs, r.Err)
		}
	}
	return errors.Join(errs...)
}
