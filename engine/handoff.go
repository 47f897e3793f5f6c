package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"

	"github.com/pgsse/pgsse/framing"
)

// The engine's side of a handoff (docs/operations.md, Upgrading without disconnects; SPEC §6):
// cmd/pgsse starts the successor process and carries descriptors and records between the two
// over an inherited socketpair; the engine gives up its listeners and connections
// (ListenerFDs, StopAcceptingAll, HandOver) and, in the successor, serves on the listeners
// it inherited (Config.Inherited) and takes the connections back onto its loop (Adopt) through
// gnet.Engine.Register, the path every accepted connection takes.
//
// What makes the move exact: a connection is handed over inside one loop task — its record
// (subscriptions, cursors, the bytes its socket has not taken) is made, its descriptor
// duplicated and the loop's own closed — so nothing is written to it after its record is
// made; the successor writes the record's tail first, then catches each stream up from the
// cursor, which is the last durable id written or queued. No byte is duplicated or lost.
//
// Raw channels (docs/architecture.md, Handoff positions): before anything is handed over, the
// successor LISTENs every channel the predecessor holds (ListenedChannels → HoldChannels),
// then the predecessor notifies a channel of its own, the mark (BeginHandoff, MarkHandoff),
// which both sessions LISTEN: from it each side counts each channel's notifications, so a
// record says where each channel subscription stood in the count, and the successor — which
// keeps what arrives meanwhile — gives it what it missed, no more, no less.

// A loop task hands over every connection that is ready, at least handoffTaskMin of them and
// after that for as long as its budget lasts (handoffBudget), up to handoffTaskMax: recording a connection costs a few
// microseconds, but a loop task waits its turn behind a delivery round to every connection
// still here — at 15,000 connections, one batch of 64 per task made the move 235 turns of
// tens of milliseconds each (bench/RESULTS.md, scenario 17), past the 30 s move timeout.
// What one task hands over goes to the successor handoffBatch at a time (one message of
// descriptors each).
const (
	handoffBatch      = 64                    // connections per send
	handoffTaskMin    = 4 * handoffBatch      // connections per loop task at least (if ready)
	handoffTaskMax    = 16 * handoffBatch     // and at most: each holds a second descriptor until sent
	handoffTaskBudget = 4 * time.Millisecond  // loop time per task, once handoffTaskMin are moved, at least
	handoffPoll       = 20 * time.Millisecond // while connections finish a request or flush gnet's buffer
)

// handoffBudget is a loop task's time to hand over in, once handoffTaskMin are moved, after it
// waited its turn for waited: handoffTaskBudget, or half of what it waited — the loop's rounds
// (a delivery round to every connection still here) come between the tasks, and the longer
// they take, the more each task moves (at 15,000 connections on a loaded host, tasks of about
// 256 waited 420 ms each: bench/RESULTS.md, scenario 17, task deployscale).
func handoffBudget(waited time.Duration) time.Duration { return max(handoffTaskBudget, waited/2) }

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

// adoption is the context of a connection Adopt registers (handler.go: OnOpen): an SSE
// connection or a hub worker (rec.Kind).
type adoption struct{ rec framing.HandoffRecord }

// ListenerFDs returns duplicates (close-on-exec) of the listening sockets — --listen and,
// if any (else -1), the hub socket — for a successor to receive (SCM_RIGHTS). They are raw
// descriptors on purpose: os.File.Fd, which os/exec's ExtraFiles calls, turns a socket
// blocking — for the file description this process's acceptors share. Valid after Started.
func (s *Server) ListenerFDs() (sse, hub int, err error) {
	ln, ok := s.sseLn.Load().(net.Listener)
	if !ok {
		return -1, -1, errors.New("engine: not serving")
	}
	if sse, err = dupListener(ln); err != nil {
		return -1, -1, fmt.Errorf("--listen: %w", err)
	}
	hub = -1
	if hl, ok := s.hubLn.Load().(*net.UnixListener); ok {
		if hub, err = dupListener(hl); err != nil {
			_ = unix.Close(sse)
			return -1, -1, fmt.Errorf("--hub-socket: %w", err)
		}
	}
	return sse, hub, nil
}

// dupListener duplicates ln's descriptor without touching its flags.
func dupListener(ln net.Listener) (int, error) {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return -1, errors.New("cannot be shared")
	}
	return DupFD(sc)
}

// DupFD duplicates c's descriptor (close-on-exec) without touching its flags.
func DupFD(c syscall.Conn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var derr error
	if err := rc.Control(func(f uintptr) { fd, derr = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return -1, err
	}
	return fd, derr
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

// HandOver gives every streaming SSE connection and every hub worker (not --procs siblings)
// to a successor, as many per loop task as are ready within its budget (handoffTaskMin,
// handoffTaskBudget), send carrying each batch of at most handoffBatch (descriptors by
// SCM_RIGHTS); idle keep-alive publishers are closed between requests, and a connection in
// the middle of a request is waited for (a publish is answered here; a subscription is handed
// over once it streams). It returns when nothing is left to hand over, or when ctx ends (what
// is left is then drained as at SIGTERM), or when send fails (what that task handed over and
// was not sent is closed). Call StopAcceptingAll first.
func (s *Server) HandOver(ctx context.Context, send func([]HandedConn) error) (handed int, err error) {
	var batch []HandedConn
	for {
		res := make(chan handBatch, 1)
		out := batch[:0]
		pushed := time.Now()
		if !s.tasks.push(func() {
			now := time.Now()
			conns, waiting := s.handOverConns(handoffTaskMin, now.Add(handoffBudget(now.Sub(pushed))), out)
			conns, more := s.hub.handOverBatch(len(conns)+handoffBatch, conns)
			res <- handBatch{conns, waiting + more}
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
			var err error
			for rest := batch; len(rest) > 0; rest = rest[min(handoffBatch, len(rest)):] {
				part := rest[:min(handoffBatch, len(rest))]
				if err == nil {
					err = send(part)
					handed += len(part)
				}
				// After a failed send the rest are closed unsent: the loop let go of them.
				for i, h := range part {
					_ = unix.Close(h.FD)
					part[i] = HandedConn{}
				}
			}
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
func (s *Server) Adopt(fds []int, records [][]byte) error { return <-s.AdoptAsync(fds, records) }

// AdoptAsync is Adopt without waiting for the loop: it returns once every connection is on
// its way to the loop (registered with gnet), and the channel gets what Adopt would return
// once the loop has them all. A successor reads the next batch meanwhile, so that the
// connections still in the predecessor's batches do not wait, each batch, for the loop to
// take the one before (the delivery pause of a handoff: docs/operations.md).
func (s *Server) AdoptAsync(fds []int, records [][]byte) <-chan error {
	done := make(chan error, 1)
	select {
	case <-s.started:
	default:
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
		done <- errors.New("engine: Adopt before the server started")
		return done
	}
	var errs []error
	var results []<-chan gnet.RegisteredResult
	for i, fd := range fds {
		rec, err := framing.DecodeHandoff(records[i])
		if err == nil && rec.Kind == framing.HandoffWorker && rec.Worker.Sibling {
			err = errors.New("engine: a --procs sibling cannot be handed over")
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
		s.sseAddrs.share(c) // as an accepted connection's (accept.go: connAddrs)
		ctx := gnet.NewNetConnContext(gnet.NewContext(context.Background(), &adoption{rec: rec}), c)
		res, err := s.eng.Register(ctx)
		if err != nil {
			_ = c.Close()
			errs = append(errs, err)
			continue
		}
		results = append(results, res)
	}
	go func() {
		for _, res := range results {
			if r := <-res; r.Err != nil {
				errs = append(errs, r.Err)
			}
		}
		done <- errors.Join(errs...)
	}()
	return done
}

// handOverConns hands over the streaming connections — at least `least` of them (as many as are
// ready), then more until the loop's clock passes until (handoffTaskMax at most) — appending each one's record and
// descriptor to out; idle keep-alive publishers are closed between requests (docs/operations.md:
// they reconnect to the successor). waiting counts the connections left that may still be
// handed over or finish here (a request in progress, a response not yet sent).
func (s *Server) handOverConns(least int, until time.Time, out []HandedConn) ([]HandedConn, int) {
	waiting := 0
	full := false
	for _, sc := range s.conns.all() {
		if sc.closed {
			continue
		}
		switch sc.state {
		case stateStreaming:
			if !full && (len(out) >= handoffTaskMax || len(out) >= least && !time.Now().Before(until)) {
				full = true
			}
			if full {
				waiting++
				continue
			}
			rec, fd, ok := s.conns.handOver(sc, nil)
			if !ok {
				waiting++
				continue
			}
			out = append(out, HandedConn{FD: fd, Record: rec})
		case stateIdle:
			s.conns.finish(sc, nil)
		case stateHandedOver:
		default:
			waiting++
		}
	}
	return out, waiting
}

// loopDo runs f on the loop and waits for it (or ctx).
func (s *Server) loopDo(ctx context.Context, f func()) error {
	done := make(chan struct{})
	if !s.tasks.push(func() { f(); close(done) }) {
		return errors.New("engine: stopped")
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// loopWait runs start on the loop, which calls its argument (on the loop) when done; it
// waits for that (or ctx).
func (s *Server) loopWait(ctx context.Context, start func(done func(error))) error {
	res := make(chan error, 1)
	tell := func(err error) {
		select {
		case res <- err:
		default: // told once; never block the loop
		}
	}
	if err := s.loopDo(ctx, func() { start(tell) }); err != nil {
		return err
	}
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ListenedChannels (a predecessor) is the raw channels this server holds — SSE channel
// subscriptions', hub workers', the handoff mark's — for its successor to LISTEN
// (HoldChannels) before it takes anything over. Read on the loop.
func (s *Server) ListenedChannels(ctx context.Context) ([]string, error) {
	var names []string
	err := s.loopDo(ctx, func() { names = s.chans.listened() })
	return names, err
}

// BeginHandoff (a predecessor) LISTENs a channel of its own, the handoff mark's (a random
// name no one else uses), and returns its name once the LISTEN is complete; its successor
// LISTENs it too (it is among ListenedChannels). EndHandoff lets go of it if the handoff
// fails.
func (s *Server) BeginHandoff(ctx context.Context) (string, error) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	name := "pgsse_handoff_" + hex.EncodeToString(b[:])
	return name, s.loopWait(ctx, func(done func(error)) { s.chans.beginMark(name, done) })
}

// MarkHandoff (a predecessor, once its successor has LISTENed every channel: after its last
// ready) notifies the mark's channel and returns once this server's loop has seen the mark:
// from there each channel's notifications are counted, and a record handed over says where
// each channel subscription stands in that count (its handoff position).
func (s *Server) MarkHandoff(ctx context.Context, mark string) error {
	cfg, err := pgconn.ParseConfig(s.cfg.DatabaseURL)
	if err != nil {
		return err
	}
	cfg.RuntimeParams["application_name"] = "pgsse-handoff"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if res := conn.ExecParams(ctx, "SELECT pg_notify($1, '')", [][]byte{[]byte(mark)}, nil, nil, nil).Read(); res.Err != nil {
		return res.Err
	}
	return s.loopWait(ctx, func(done func(error)) { s.chans.awaitMark(func() { done(nil) }) })
}

// EndHandoff (a predecessor whose handoff failed) lets go of the mark.
func (s *Server) EndHandoff() { s.tasks.push(s.chans.endMark) }

// HoldChannels (a successor) holds and LISTENs the channels its predecessor holds
// (ListenedChannels) and the mark's, and returns once every LISTEN is complete (or the first
// failed): only then may it say ready. From the mark on it keeps what those channels get
// (bounded: handoffKeepBytes) for the subscriptions that will be handed over. It may be called
// again with the channels the predecessor took on meanwhile. The holds are released by
// ReleaseHeldChannels, once every connection is adopted, or after handoffHoldMS.
func (s *Server) HoldChannels(ctx context.Context, mark string, names []string) error {
	return s.loopWait(ctx, func(done func(error)) { s.chans.holdFor(mark, names, done) })
}

// ReleaseHeldChannels (a successor) lets go of the holds HoldChannels took: the adopted
// connections hold their channels themselves.
func (s *Server) ReleaseHeldChannels() { s.tasks.push(s.chans.releaseHeld) }

// TakeOverPresence (a successor, once every connection is adopted — or the predecessor went
// away) lets this server's presence writer register, which it holds back until then: the
// registration replaces the predecessor's entries (the same process key) with this server's
// counts, the adopted connections' among them, in one statement, so that no moved client is
// absent from presence and none is counted twice (presence.go: adopted, closed). It returns
// once that write has an outcome, or when ctx ends; at once without presence.
func (s *Server) TakeOverPresence(ctx context.Context) error {
	var registered <-chan struct{}
	if err := s.loopDo(ctx, func() { registered = s.pres.takenOver() }); err != nil {
		return err
	}
	if registered == nil {
		return nil
	}
	select {
	case <-registered:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
