package engine

import (
	"errors"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/pgsse/pgsse/framing"
	"github.com/pgsse/pgsse/names"
	"github.com/pgsse/pgsse/ring"
)

// The hub (SPEC §5): worker processes on the host connect to a Unix socket served by the same
// gnet loop as the SSE port and share its one LISTEN session.
//
// Everything here runs on the loop goroutine. A worker's outbound frames go through its own
// preallocated ring (--hub-worker-buffer) in PostgreSQL's delivery order; bytes move from the
// ring to gnet only while gnet's own buffer for the socket is small, so the ring — bounded,
// with the eviction and wake policies — is the real queue, never gnet's unbounded buffer.
// The ring's head is always a frame boundary (whole frames are handed to gnet), so a final
// STATUS written straight to the socket always arrives as a frame.

const (
	hubMaxWorkers     = 1024     // connected workers
	hubMaxChannels    = 4096     // channels per worker (SUB beyond it: ACK LIMIT)
	hubWriteChunk     = 64 << 10 // bytes handed to gnet per write
	hubOutboundLimit  = 64 << 10 // hand more only while gnet buffers less than this
	hubWritesPerPump  = 16       // ≤ 1 MiB per worker per pump, so one worker cannot hog the loop
	hubHelloTimeoutMS = 10_000   // a worker must say HELLO within this
	hubFinalGraceMS   = 10_000   // an evicted or failed worker has this long to read its last STATUS
)

// worker is one connected worker process (loop-owned).
type worker struct {
	c        gnet.Conn
	pid      uint32
	name     string
	hello    bool // HELLO received, READY queued
	gone     bool // OnClose ran
	closing  bool // Close requested: no more frames are queued or read
	draining bool // SHUTDOWN queued: close once everything is flushed
	// lingerUntil: a final STATUS (EVICTED, PROTOCOL_ERROR) is in gnet's buffer; close once it
	// is flushed or at this time (unix ms)
	lingerUntil int64
	queued      bool  // in hubState.pending
	opened      int64 // unix ms
	out         *ring.Ring
	subs        map[string]*hubSub
	marked      []*hubSub // wake subscriptions owing a RESYNC once the ring drains
	idx         int       // in hubState.workers
}

// hubSub is one worker's subscription to one channel.
type hubSub struct {
	w       *worker
	ch      *channel
	mode    framing.Mode
	acked   bool     // ACK OK sent: notifications flow
	reqs    []uint32 // SUBs waiting for the LISTEN to complete
	idx     int      // in ch.hub.subs
	marked  bool     // wake mode: notifications coalesced, RESYNC owed
	dropped bool
}

// hubState is the hub's loop-owned state (a field of Server).
type hubState struct {
	workers   []*worker
	open      int       // workers whose socket is not closed yet (drain waits for 0)
	pending   []*worker // workers with ring bytes not yet handed to gnet
	spare     []*worker
	dead      []*worker // closed during an iteration; removed on the way out
	lingering []*worker // sent a final STATUS; closed once it is flushed (hubCloseLingering)
	iter      int
	buf       []byte   // control frame scratch (ACK, STATUS, PONG)
	msg       []byte   // text scratch for control frames
	nbuf      []byte   // NOTIFY scratch: one encoding for every subscriber
	iov       [][]byte // writev scratch
	path      string
	umask     int
	umasked   bool
}

// count is the number of workers still connected.
// needsPoll reports whether a worker waits for its socket to drain (see Server.ticker).
func (h *hubState) needsPoll() bool { return len(h.pending) > 0 }

func (h *hubState) count() int { return h.open }

// hubChannel is a channel's hub side: its worker subscriptions, in a compact slice for fan-out.
type hubChannel struct {
	subs    []*hubSub
	waiting int    // subscriptions with SUBs waiting for the LISTEN
	name    []byte // the channel name as bytes, for encoding frames
}

// --- the socket -------------------------------------------------------------------------

// prepareHubSocket runs before gnet binds: it refuses a path another live process serves,
// replaces a stale socket file, and tightens the umask so that the bind creates the socket
// with no looser mode than --hub-socket-mode (gnet removes the path before binding, so the
// liveness check must come first). afterHubBind restores the umask and sets the exact mode.
func (s *Server) prepareHubSocket() (string, func(), error) {
	path := s.cfg.HubSocket
	flag := "--hub-socket " + path + ": "
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return "", nil, errors.New(flag + "exists and is not a socket; refusing to replace it")
		}
		c, err := net.Dial("unix", path)
		switch {
		case err == nil:
			_ = c.Close()
			return "", nil, errors.New(flag + "another process is serving it")
		case errors.Is(err, syscall.ECONNREFUSED):
			s.log.Info("hub: replacing a stale socket file", "path", path)
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return "", nil, errors.New(flag + "cannot remove the stale socket: " + err.Error())
			}
		case errors.Is(err, syscall.ENOENT):
		default:
			return "", nil, errors.New(flag + "cannot check whether it is in use: " + err.Error())
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", nil, errors.New(flag + err.Error())
	}
	mode := s.cfg.HubSocketMode.Perm()
	s.hub.path = path
	s.hub.umask = syscall.Umask(int(0o777 &^ mode))
	s.hub.umasked = true
	cleanup := func() {
		s.restoreUmask()
		if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() == os.ModeSocket {
			_ = os.Remove(path)
		}
	}
	return "unix://" + path, cleanup, nil
}

func (s *Server) restoreUmask() {
	if s.hub.umasked {
		syscall.Umask(s.hub.umask)
		s.hub.umasked = false
	}
}

// afterHubBind runs once the listeners are bound.
func (s *Server) afterHubBind() {
	if s.hub.path == "" {
		return
	}
	s.restoreUmask()
	if err := os.Chmod(s.hub.path, s.cfg.HubSocketMode.Perm()); err != nil {
		s.log.Error("hub: cannot set the socket's mode", "path", s.hub.path, "err", err)
	}
}

func (s *Server) isHubConn(c gnet.Conn) bool {
	if s.cfg.HubSocket == "" {
		return false
	}
	a := c.LocalAddr()
	return a != nil && a.Network() == "unix"
}

// --- connection life --------------------------------------------------------------------

func (s *Server) hubOpen(c gnet.Conn) ([]byte, gnet.Action) {
	h := &s.hub
	if s.draining {
		return framing.AppendStatus(nil, framing.StatusShutdown, nil, []byte("pgsse is shutting down")), gnet.Close
	}
	if len(h.workers) >= hubMaxWorkers {
		s.log.Warn("hub: refusing a worker: too many workers", "limit", hubMaxWorkers)
		return framing.AppendStatus(nil, framing.StatusShutdown, nil, []byte("too many workers (limit "+strconv.Itoa(hubMaxWorkers)+")")), gnet.Close
	}
	w := &worker{
		c:      c,
		opened: time.Now().UnixMilli(), // not s.now: Run writes that after the loop can accept
		out:    ring.New(s.cfg.HubWorkerBuffer),
		subs:   make(map[string]*hubSub),
		idx:    len(h.workers),
	}
	// Wake policy (SPEC §5): coalesce above half full, owe the RESYNCs below a quarter.
	w.out.SetWatermarks(w.out.Cap()/4, w.out.Cap()/2)
	h.workers = append(h.workers, w)
	h.open++
	s.metrics.hubWorkers.Set(float64(h.open))
	c.SetContext(w)
	return nil, gnet.None
}

// hubClose runs from OnClose (possibly in the middle of a hub iteration, when a write failed).
func (s *Server) hubClose(w *worker) {
	if w.gone {
		return
	}
	h := &s.hub
	w.gone, w.closing = true, true
	h.open--
	s.metrics.hubWorkers.Set(float64(h.open))
	if h.iter > 0 {
		h.dead = append(h.dead, w)
		return
	}
	s.hubRemove(w)
}

// hubRemove releases everything the worker held; only outside hub iterations.
func (s *Server) hubRemove(w *worker) {
	h := &s.hub
	for _, sub := range w.subs {
		s.hubDetach(sub)
	}
	w.subs = nil
	w.marked = nil
	if i, last := w.idx, len(h.workers)-1; i <= last && h.workers[i] == w {
		h.workers[i] = h.workers[last]
		h.workers[i].idx = i
		h.workers[last] = nil
		h.workers = h.workers[:last]
	}
	s.log.Debug("hub: worker gone", "pid", w.pid, "name", w.name)
}

// hubDetach removes sub from its channel and drops the channel hold; only outside hub
// iterations over that channel.
func (s *Server) hubDetach(sub *hubSub) {
	if sub.dropped {
		return
	}
	sub.dropped = true
	ch := sub.ch
	if len(sub.reqs) > 0 {
		ch.hub.waiting--
		sub.reqs = nil
	}
	i, last := sub.idx, len(ch.hub.subs)-1
	if i <= last && ch.hub.subs[i] == sub {
		ch.hub.subs[i] = ch.hub.subs[last]
		ch.hub.subs[i].idx = i
		ch.hub.subs[last] = nil
		ch.hub.subs = ch.hub.subs[:last]
	}
	s.releaseChannel(ch)
}

func (h *hubState) enter() { h.iter++ }

func (s *Server) hubLeave() {
	h := &s.hub
	h.iter--
	if h.iter > 0 {
		return
	}
	for len(h.dead) > 0 {
		w := h.dead[len(h.dead)-1]
		h.dead[len(h.dead)-1] = nil
		h.dead = h.dead[:len(h.dead)-1]
		s.hubRemove(w)
	}
}

// --- input from workers -----------------------------------------------------------------

// hubTraffic decodes every complete frame gnet holds for the worker. A partial frame stays in
// gnet's inbound buffer until the rest arrives (at most one frame: framing rejects a length
// over the maximum as soon as the header is visible).
func (s *Server) hubTraffic(w *worker) {
	if w.closing {
		_, _ = w.c.Discard(-1)
		return
	}
	s.hub.enter()
	defer s.hubLeave()
	buf, _ := w.c.Peek(-1)
	off := 0
	for off < len(buf) && !w.closing {
		f, n, err := framing.Decode(buf[off:])
		if err == framing.ErrIncomplete {
			break
		}
		if err != nil {
			if n = s.hubBadChannel(w, buf[off:], err); n > 0 {
				off += n
				continue
			}
			s.hubProtocolError(w, err.Error())
			break
		}
		off += n
		s.hubFrame(w, &f)
	}
	if w.closing {
		_, _ = w.c.Discard(-1)
	} else {
		_, _ = w.c.Discard(off)
	}
	s.hubPump(w)
}

// hubBadChannel answers a complete, otherwise well-formed SUB/UNSUB whose channel breaks the
// name rules with ACK BAD_CHANNEL and returns the frame's length; 0 if err is anything else.
func (s *Server) hubBadChannel(w *worker, b []byte, err error) int {
	if !w.hello || !(errors.Is(err, names.ErrChannelEmpty) || errors.Is(err, names.ErrChannelLength) || errors.Is(err, names.ErrChannelNUL)) {
		return 0
	}
	req, n, ok := framing.PeekRequest(b)
	if !ok {
		return 0
	}
	s.hubAck(w, req, framing.AckBadChannel, err.Error())
	return n
}

func (s *Server) hubFrame(w *worker, f *framing.Frame) {
	if !w.hello {
		if f.Type != framing.TypeHello {
			s.hubProtocolError(w, "the first frame must be HELLO, got "+f.Type.String())
			return
		}
		w.hello = true
		w.pid = f.PID
		w.name = string(f.Name)
		s.log.Debug("hub: worker connected", "pid", w.pid, "name", w.name)
		s.hubPush(w, s.hubStatus(framing.StatusReady, nil, ""))
		return
	}
	switch f.Type {
	case framing.TypeSub:
		s.hubSub(w, f.Req, f.Mode, f.Channel)
	case framing.TypeUnsub:
		s.hubUnsub(w, f.Req, f.Channel)
	case framing.TypePing:
		s.hub.buf = framing.AppendPong(s.hub.buf[:0], f.Token)
		s.hubPush(w, s.hub.buf)
	case framing.TypeHello:
		s.hubProtocolError(w, "HELLO may be sent only once")
	default:
		s.hubProtocolError(w, f.Type.String()+" is a hub-to-worker frame")
	}
}

func (s *Server) hubSub(w *worker, req uint32, mode framing.Mode, channel []byte) {
	if sub := w.subs[string(channel)]; sub != nil {
		sub.mode = mode // idempotent: the mode is updated, the subscription kept
		if sub.acked {
			s.hubAck(w, req, framing.AckOK, "")
		} else {
			sub.reqs = append(sub.reqs, req) // answered with the LISTEN in flight
		}
		return
	}
	if string(channel) == storeChannel {
		s.hubAck(w, req, framing.AckBadChannel, "channel "+storeChannel+" is reserved for pgsse streams")
		return
	}
	if len(w.subs) >= hubMaxChannels {
		s.hubAck(w, req, framing.AckLimit, "at most "+strconv.Itoa(hubMaxChannels)+" channels per worker")
		return
	}
	// Register before LISTEN (DESIGN invariant 4); ACK once it completed on this session.
	ch := s.holdChannel(string(channel))
	if ch.hub.name == nil {
		ch.hub.name = []byte(ch.name)
	}
	sub := &hubSub{w: w, ch: ch, mode: mode, idx: len(ch.hub.subs)}
	ch.hub.subs = append(ch.hub.subs, sub)
	w.subs[ch.name] = sub
	if ch.listening && s.listenUp {
		sub.acked = true
		s.hubAck(w, req, framing.AckOK, "")
		return
	}
	sub.reqs = append(sub.reqs, req)
	ch.hub.waiting++
}

func (s *Server) hubUnsub(w *worker, req uint32, channel []byte) {
	sub := w.subs[string(channel)]
	if sub == nil {
		s.hubAck(w, req, framing.AckNotSubscribed, "not subscribed to "+string(channel))
		return
	}
	for _, r := range sub.reqs {
		s.hubAck(w, r, framing.AckListenFailed, "UNSUB arrived before the LISTEN completed")
	}
	delete(w.subs, sub.ch.name)
	s.hubDetach(sub)
	s.hubAck(w, req, framing.AckOK, "")
}

func (s *Server) hubAck(w *worker, req uint32, code framing.AckCode, msg string) {
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	h := &s.hub
	h.msg = append(h.msg[:0], msg...)
	h.buf = framing.AppendAck(h.buf[:0], req, code, h.msg)
	s.hubPush(w, h.buf)
}

// hubStatus encodes a STATUS frame into the control scratch buffer (valid until the next
// control frame is encoded).
func (s *Server) hubStatus(code framing.StatusCode, channel []byte, text string) []byte {
	h := &s.hub
	h.msg = append(h.msg[:0], text...)
	h.buf = framing.AppendStatus(h.buf[:0], code, channel, h.msg)
	return h.buf
}

// hubProtocolError answers bad input (best effort) and closes that worker only.
func (s *Server) hubProtocolError(w *worker, reason string) {
	if w.closing {
		return
	}
	s.log.Warn("hub: protocol error; closing the worker", "pid", w.pid, "name", w.name, "err", reason)
	if len(reason) > 1024 {
		reason = reason[:1024]
	}
	s.hubFinal(w, s.hubStatus(framing.StatusProtocolError, nil, reason), hubFinalGraceMS)
}

// hubEvict closes a worker that does not read fast enough for its lossless subscriptions.
func (s *Server) hubEvict(w *worker) {
	if w.closing {
		return
	}
	s.metrics.evictions.Inc()
	s.log.Warn("hub: evicting a worker that does not read its notifications", "pid", w.pid, "name", w.name,
		"buffered", w.out.Len(), "buffer", w.out.Cap(), "gnet", w.c.OutboundBuffered())
	w.out.Reset() // the worker stopped reading: nothing queued would reach it in time
	s.hubFinal(w, s.hubStatus(framing.StatusEvicted, nil,
		"outbound buffer of "+strconv.Itoa(w.out.Cap())+" bytes full: read faster or subscribe in wake mode"), hubFinalGraceMS)
}

// hubFinal hands what the ring holds (whole frames) and then frame to gnet, stops reading and
// queueing, and closes once gnet has flushed it all — or after a grace period if the worker
// never reads it (gnet's close does not wait for a slow peer).
func (s *Server) hubFinal(w *worker, frame []byte, graceMS int64) {
	w.closing = true
	if !w.gone {
		a, b := w.out.Peek()
		h := &s.hub
		h.iov = append(h.iov[:0], a, b, frame)
		_, err := w.c.Writev(h.iov)
		clear(h.iov)
		if err == nil && !w.gone {
			if w.c.OutboundBuffered() == 0 {
				_ = w.c.Close()
			} else {
				w.lingerUntil = s.now + graceMS
				h.lingering = append(h.lingering, w)
			}
		}
	}
	w.out.Reset()
}

// hubCloseLingering closes final-frame workers whose last bytes left, or whose grace ran out.
func (s *Server) hubCloseLingering() {
	h := &s.hub
	keep := h.lingering[:0]
	for _, w := range h.lingering {
		switch {
		case w.gone:
		case w.c.OutboundBuffered() == 0 || s.now >= w.lingerUntil:
			_ = w.c.Close()
		default:
			keep = append(keep, w)
			continue
		}
	}
	clear(h.lingering[len(keep):])
	h.lingering = keep
}

// --- output to workers ------------------------------------------------------------------

// hubPush queues one frame for w; a frame that does not fit evicts the worker (it is not
// reading). Returns false if w is (now) closing.
func (s *Server) hubPush(w *worker, frame []byte) bool {
	if w.closing {
		return false
	}
	if !w.out.Push(frame) {
		s.hubEvict(w)
		return false
	}
	s.hubQueue(w)
	return true
}

func (s *Server) hubQueue(w *worker) {
	if !w.queued {
		w.queued = true
		s.hub.pending = append(s.hub.pending, w)
	}
}

// hubPump hands whole frames from w's ring to gnet while gnet's buffer for the socket is
// small, and queues owed wake RESYNCs once the ring has drained below a quarter.
func (s *Server) hubPump(w *worker) {
	for writes := 0; writes < hubWritesPerPump && !w.closing; writes++ {
		if len(w.marked) > 0 && w.out.BelowLow() {
			s.hubOweResyncs(w)
		}
		if w.out.Len() == 0 || w.c.OutboundBuffered() >= hubOutboundLimit {
			break
		}
		a, b := w.out.Peek()
		n := framing.WholeFrames(a, b, hubWriteChunk)
		var err error
		if n <= len(a) {
			_, err = w.c.Write(a[:n])
		} else {
			h := &s.hub
			h.iov = append(h.iov[:0], a, b[:n-len(a)])
			_, err = w.c.Writev(h.iov)
			clear(h.iov)
		}
		if err != nil || w.gone {
			return // the socket is gone; OnClose has run
		}
		w.out.Consume(n)
	}
	if w.draining && !w.closing && w.out.Len() == 0 && w.c.OutboundBuffered() == 0 {
		w.closing = true
		_ = w.c.Close()
	}
}

// hubOweResyncs queues one STATUS RESYNC per channel whose wake notifications were coalesced.
func (s *Server) hubOweResyncs(w *worker) {
	marked := w.marked
	w.marked = w.marked[:0]
	for i, sub := range marked {
		marked[i] = nil
		if sub.dropped || !sub.marked {
			continue
		}
		sub.marked = false
		if !s.hubPush(w, s.hubStatus(framing.StatusResync, sub.ch.hub.name, "")) {
			return
		}
	}
}

// hubPumpPending pumps every worker with queued bytes.
func (s *Server) hubPumpPending() {
	h := &s.hub
	if len(h.pending) == 0 {
		return
	}
	h.enter()
	list := h.pending
	h.pending = h.spare[:0]
	for i, w := range list {
		list[i] = nil
		w.queued = false
		if w.closing {
			continue
		}
		s.hubPump(w)
		if !w.closing && (w.out.Len() > 0 || w.draining) {
			s.hubQueue(w) // retried on the next tick
		}
	}
	h.spare = list[:0]
	s.hubLeave()
}

// --- events from the session ------------------------------------------------------------

// hubNotify queues a notification for the channel's workers: encoded once, copied into each
// ring. payload is valid only during the call.
func (s *Server) hubNotify(ch *channel, pid uint32, payload []byte) {
	if len(ch.hub.subs) == 0 {
		return
	}
	h := &s.hub
	h.enter()
	frame := framing.AppendNotify(h.nbuf[:0], pid, ch.hub.name, payload)
	h.nbuf = frame
	delivered, coalesced := 0, 0
	for _, sub := range ch.hub.subs {
		w := sub.w
		if !sub.acked || w.closing || w.draining {
			continue
		}
		if sub.mode == framing.ModeWake {
			if sub.marked {
				coalesced++
				continue
			}
			if w.out.AboveHigh() || w.out.Free() < len(frame) {
				s.hubPump(w) // a long batch may fill the ring of a worker that does read
				if w.closing {
					continue
				}
			}
			if w.out.AboveHigh() || w.out.Free() < len(frame) {
				sub.marked = true
				w.marked = append(w.marked, sub)
				coalesced++
				continue
			}
		}
		if !w.out.Push(frame) {
			s.hubPump(w)
			if w.closing {
				continue
			}
			if !w.out.Push(frame) {
				s.hubEvict(w) // lossless and it does not fit: this worker only
				continue
			}
		}
		delivered++
		s.hubQueue(w)
	}
	if delivered > 0 {
		s.metrics.deliveries.Add(float64(delivered))
	}
	if coalesced > 0 {
		s.metrics.dropped.WithLabelValues("hub_wake_coalesced").Add(float64(coalesced))
	}
	s.hubLeave()
}

// hubFlush runs at the end of each notification batch: one write per worker per batch.
func (s *Server) hubFlush() { s.hubPumpPending() }

// hubChannelLive answers the SUBs waiting for this channel's LISTEN.
func (s *Server) hubChannelLive(ch *channel) {
	if ch.hub.waiting == 0 {
		return
	}
	s.hub.enter()
	for _, sub := range ch.hub.subs {
		if len(sub.reqs) == 0 {
			continue
		}
		sub.acked = true
		for _, r := range sub.reqs {
			s.hubAck(sub.w, r, framing.AckOK, "")
		}
		sub.reqs = sub.reqs[:0]
		ch.hub.waiting--
	}
	s.hubLeave()
	s.hubPumpPending()
}

// hubChannelFailed answers the SUBs waiting for this channel's LISTEN with LISTEN_FAILED and
// drops them (the session dropped the reference).
func (s *Server) hubChannelFailed(ch *channel, err error) {
	if ch.hub.waiting == 0 {
		return
	}
	var failed []*hubSub
	for _, sub := range ch.hub.subs {
		if len(sub.reqs) > 0 {
			failed = append(failed, sub)
		}
	}
	msg := firstLine(err.Error())
	s.hub.enter()
	for _, sub := range failed {
		for _, r := range sub.reqs {
			s.hubAck(sub.w, r, framing.AckListenFailed, msg)
		}
		if sub.w.subs != nil && sub.w.subs[ch.name] == sub {
			delete(sub.w.subs, ch.name)
		}
		s.hubDetach(sub)
	}
	s.hubLeave()
	s.hubPumpPending()
}

// hubBroadcast queues a STATUS for every worker that said HELLO.
func (s *Server) hubBroadcast(code framing.StatusCode, text string) {
	h := &s.hub
	h.enter()
	for _, w := range h.workers {
		if w.hello && !w.closing && !w.draining {
			s.hubPush(w, s.hubStatus(code, nil, text))
		}
	}
	s.hubLeave()
	s.hubPumpPending()
}

// hubListenerDown tells every worker the LISTEN session was lost.
func (s *Server) hubListenerDown() {
	s.hubBroadcast(framing.StatusListenerDown, "LISTEN session lost; reconnecting")
}

// hubResync tells every worker the session is back and every channel LISTENed again.
func (s *Server) hubResync() {
	s.hubBroadcast(framing.StatusResync, "LISTEN session re-established: re-read your state")
}

// hubShutdown sends SHUTDOWN to every worker; each is closed once flushed (hubPump).
func (s *Server) hubShutdown() {
	h := &s.hub
	h.enter()
	for _, w := range h.workers {
		if w.closing {
			continue
		}
		if !w.hello {
			w.closing = true
			_ = w.c.Close()
			continue
		}
		frame := s.hubStatus(framing.StatusShutdown, nil, "pgsse is shutting down: fail over now")
		if !w.out.Push(frame) {
			s.hubFinal(w, frame, hubFinalGraceMS)
			continue
		}
		w.draining = true
		s.hubQueue(w)
	}
	s.hubLeave()
	s.hubPumpPending()
}

// hubTick runs every 20 ms: retry flushing (gnet has no "writable" callback) and close workers
// that never said HELLO.
func (s *Server) hubTick() {
	s.hubPumpPending()
	h := &s.hub
	h.enter()
	s.hubCloseLingering()
	for _, w := range h.workers {
		if !w.hello && !w.closing && s.now-w.opened > hubHelloTimeoutMS {
			s.hubProtocolError(w, "no HELLO within "+strconv.Itoa(hubHelloTimeoutMS/1000)+"s")
		}
	}
	s.hubLeave()
}
