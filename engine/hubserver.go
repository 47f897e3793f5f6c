package engine

import (
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/pgsse/pgsse/framing"
	"github.com/pgsse/pgsse/names"
	"github.com/pgsse/pgsse/ring"
)

// The hub (docs/hub-protocol.md): worker processes on the host connect to a Unix socket served by
// the same gnet loop as the SSE port and share its one LISTEN session.
//
// Everything here runs on the loop goroutine. A worker's outbound frames go through its own
// preallocated ring (--hub-worker-buffer) in PostgreSQL's delivery order; bytes move from the
// ring to gnet only while gnet's own buffer for the socket is small, so the ring — bounded,
// with the eviction and wake policies — is the real queue, never gnet's unbounded buffer.
// The ring's head is always a frame boundary (whole frames are handed to gnet), so a final
// STATUS written straight to the socket always arrives as a frame.
//
// A new frame type: framing (the type, its encoder and decoder) and hubServer.frame below.

const (
	// The hub's share of the LISTEN session's channels (listenMaxChannels): the workers
	// together hold at most half of them, one worker at most a fifth, so SSE clients (whose
	// /channels/ subscriptions are capped per subject) always keep half, and no single worker
	// takes the whole share. A SUB beyond either gets ACK LIMIT.
	hubMaxChannels          = listenMaxChannels / 2 // distinct channels all workers together
	hubMaxChannelsPerWorker = listenMaxChannels / 5 // channels one worker
	hubWriteChunkBytes      = 64 << 10              // bytes handed to gnet per write
	hubOutboundLimitBytes   = 64 << 10              // hand more only while gnet buffers fewer bytes than this
	hubWritesPerPump        = 16                    // ≤ 1 MiB per worker per pump, so one worker cannot hog the loop
	hubHelloTimeoutMS       = 10_000                // a worker must say HELLO within this
	hubFinalGraceMS         = 10_000                // an evicted or failed worker has this long to read its last STATUS
	hubControlTextMaxLen    = 1024                  // bytes of text in an ACK or STATUS frame we send
	hubWaitingSubsMax       = 64                    // repeated SUBs of one channel waiting for its LISTEN, per worker
	hubRefusedLogEveryMS    = 10_000                // "refusing workers" at most this often
	// hubSiblingBufferBytes is the least outbound ring a sibling process gets (it takes every
	// stream notification of the host, in bursts while its own loop is busy fanning out).
	hubSiblingBufferBytes = 4 << 20
)

// hubServer is the hub server's loop-owned state: the workers, their subscriptions (on the
// shared channel table, channel.hub) and the scratch buffers frames are encoded into. It is a
// part of Server: it reaches the raw channels through their table (chans) and the LISTEN
// session's state through lsn.
type hubServer struct {
	*loopEnv
	chans     *channelTable
	lsn       *listenState
	workers   []*worker
	open      int          // workers whose socket is not closed yet (drain waits for 0)
	siblings  int          // of them, sibling processes (--procs): not hub workers in the caps and metrics
	openCount atomic.Int64 // open − siblings, for the hub socket's acceptor (its hard cap)
	// refusedLogMS: when "refusing workers" was last logged (at most every hubRefusedLogEveryMS)
	refusedLogMS int64
	// channels: distinct channels with at least one worker subscription; maxChannels and
	// maxWorkerChannels are their caps (hubMaxChannels, hubMaxChannelsPerWorker; tests lower them)
	channels                       int
	maxChannels, maxWorkerChannels int
	pending                        []*worker // workers with ring bytes not yet handed to gnet
	spare                          []*worker
	dead                           []*worker // closed during an iteration; removed on the way out
	leaving                        []*worker // sent a final STATUS during an iteration; unsubscribed on the way out
	lingering                      []*worker // sent a final STATUS; closed once it is flushed (closeLingering)
	iter                           int       // depth of iterations over workers or subscriptions (enter/leave)
	buf                            []byte    // control frame scratch (ACK, STATUS, PONG)
	msg                            []byte    // text scratch for control frames
	nbuf                           []byte    // NOTIFY scratch: one encoding for every subscriber
	iov                            [][]byte  // writev scratch
}

// worker is one connected worker process (loop-owned).
type worker struct {
	c        gnet.Conn
	pid      uint32
	name     string
	sibling  bool // a sibling process (--procs) on a socket this process handed it: may SUB the stream channel
	hello    bool // HELLO received, READY queued
	gone     bool // OnClose ran
	closing  bool // Close requested: no more frames are queued or read
	draining bool // SHUTDOWN queued: close once everything is flushed
	// lingerUntilMS: a final STATUS (EVICTED, PROTOCOL_ERROR) is in gnet's buffer; close once
	// it is flushed or at this time
	lingerUntilMS int64
	queued        bool  // in hub.pending
	openedMS      int64 // unix ms
	out           *ring.Ring
	subs          map[string]*hubSub
	marked        []*hubSub // wake subscriptions owing a RESYNC once the ring drains
	idx           int32     // in hub.workers
}

// hubSub is one worker's subscription to one channel.
type hubSub struct {
	w       *worker
	ch      *channel
	mode    framing.Mode
	acked   bool     // ACK OK sent: notifications flow
	reqs    []uint32 // SUBs waiting for the LISTEN to complete
	idx     int32    // in ch.hub.subs
	marked  bool     // wake mode: notifications coalesced, RESYNC owed
	dropped bool
}

// hubChannel is a channel's hub side: its worker subscriptions, in a compact slice for fan-out.
type hubChannel struct {
	subs    []*hubSub
	workers int    // of subs, those of outside workers (not siblings): the hub's channel share counts these
	waiting int    // subscriptions with SUBs waiting for the LISTEN
	name    []byte // the channel name as bytes, for encoding frames
}

func workerIndex(w *worker) *int32   { return &w.idx }
func hubSubIndex(sub *hubSub) *int32 { return &sub.idx }

func newHubServer(env *loopEnv, chans *channelTable, lsn *listenState) hubServer {
	return hubServer{loopEnv: env, chans: chans, lsn: lsn, maxChannels: hubMaxChannels, maxWorkerChannels: hubMaxChannelsPerWorker}
}

// count is the number of workers still connected.
func (h *hubServer) count() int { return h.open }

// openCounter is the count of open worker connections the hub socket's acceptor caps.
func (h *hubServer) openCounter() *atomic.Int64 { return &h.openCount }

// needsPoll reports whether a worker waits for its socket to drain (see Server.ticker).
func (h *hubServer) needsPoll() bool { return len(h.pending) > 0 }

// enter and leave bracket every iteration over workers or subscriptions: a worker closed
// meanwhile (gnet closes a socket synchronously when a write fails) is removed only on the
// way out of the outermost one.
func (h *hubServer) enter() { h.iter++ }

func (h *hubServer) leave() {
	h.iter--
	if h.iter > 0 {
		return
	}
	for len(h.leaving) > 0 {
		w := h.leaving[len(h.leaving)-1]
		h.leaving[len(h.leaving)-1] = nil
		h.leaving = h.leaving[:len(h.leaving)-1]
		h.unsubscribeAll(w)
	}
	for len(h.dead) > 0 {
		w := h.dead[len(h.dead)-1]
		h.dead[len(h.dead)-1] = nil
		h.dead = h.dead[:len(h.dead)-1]
		h.remove(w)
	}
}

// --- connection life --------------------------------------------------------------------

// accept admits a worker's connection (OnOpen); it must say HELLO first. sibling marks a
// sibling process of --procs, on a socket this process made and handed it (AddSibling):
// the only kind of worker that may subscribe to the stream channel.
func (h *hubServer) accept(c gnet.Conn, sibling bool) ([]byte, gnet.Action) {
	s := h.loopEnv
	if s.draining {
		return framing.AppendStatus(nil, framing.StatusShutdown, nil, []byte("pgsse is shutting down")), gnet.Close
	}
	if limit := s.cfg.hubWorkers; !sibling && len(h.workers)-h.siblings >= limit {
		if s.nowMS-h.refusedLogMS >= hubRefusedLogEveryMS {
			h.refusedLogMS = s.nowMS
			s.log.Warn("hub: refusing workers: too many connected (the cap follows the descriptor budget; pgsse doctor shows it)", "limit", limit)
		}
		return framing.AppendStatus(nil, framing.StatusShutdown, nil, []byte("too many workers (limit "+strconv.Itoa(limit)+")")), gnet.Close
	}
	size := s.cfg.HubWorkerBuffer
	if sibling {
		size = max(size, hubSiblingBufferBytes)
	}
	w := &worker{
		c:        c,
		sibling:  sibling,
		openedMS: time.Now().UnixMilli(),
		out:      ring.New(size),
		subs:     make(map[string]*hubSub),
		idx:      int32(len(h.workers)),
	}
	// Wake policy (docs/hub-protocol.md, Modes and backpressure): coalesce above half full, owe
	// the RESYNCs below a quarter.
	w.out.SetWatermarks(w.out.Cap()/4, w.out.Cap()/2)
	h.workers = append(h.workers, w)
	h.open++
	if sibling {
		h.siblings++
	}
	h.openCount.Store(int64(h.open - h.siblings))
	s.metrics.hubWorkers.Set(float64(h.open - h.siblings))
	c.SetContext(w)
	return nil, gnet.None
}

// closed runs from OnClose (possibly in the middle of a hub iteration, when a write failed).
func (h *hubServer) closed(w *worker) {
	if w.gone {
		return
	}
	w.gone, w.closing = true, true
	h.open--
	if w.sibling {
		h.siblings--
	}
	h.openCount.Store(int64(h.open - h.siblings))
	h.metrics.hubWorkers.Set(float64(h.open - h.siblings))
	if h.iter > 0 {
		h.dead = append(h.dead, w)
		return
	}
	h.remove(w)
}

// remove releases everything the worker held; only outside hub iterations.
func (h *hubServer) remove(w *worker) {
	h.unsubscribeAll(w)
	h.workers = swapRemove(h.workers, w, workerIndex)
	h.log.Debug("hub: worker gone", "pid", w.pid, "name", w.name)
}

// unsubscribeAll drops every subscription of w (a channel nobody else holds is UNLISTENed);
// only outside hub iterations.
func (h *hubServer) unsubscribeAll(w *worker) {
	for _, sub := range w.subs {
		h.detach(sub)
	}
	w.subs = nil
	w.marked = nil
}

// detach removes sub from its channel and drops the channel hold; only outside hub
// iterations over that channel.
func (h *hubServer) detach(sub *hubSub) {
	if sub.dropped {
		return
	}
	sub.dropped = true
	ch := sub.ch
	if len(sub.reqs) > 0 {
		ch.hub.waiting--
		sub.reqs = nil
	}
	ch.hub.subs = swapRemove(ch.hub.subs, sub, hubSubIndex)
	if !sub.w.sibling {
		if ch.hub.workers--; ch.hub.workers == 0 {
			h.channels--
		}
	}
	h.chans.release(ch)
}

// --- input from workers -----------------------------------------------------------------

// traffic decodes every complete frame gnet holds for the worker (OnTraffic). A partial frame
// stays in gnet's inbound buffer until the rest arrives (at most one frame: framing rejects a
// length over the maximum as soon as the header is visible).
func (h *hubServer) traffic(w *worker) {
	if w.closing {
		_, _ = w.c.Discard(-1)
		return
	}
	h.enter()
	defer h.leave()
	buf, _ := w.c.Peek(-1)
	off := 0
	for off < len(buf) && !w.closing {
		f, n, err := framing.Decode(buf[off:])
		if err == framing.ErrIncomplete {
			break
		}
		if err != nil {
			if n = h.badChannel(w, buf[off:], err); n > 0 {
				off += n
				continue
			}
			h.protocolError(w, err.Error())
			break
		}
		off += n
		h.frame(w, &f)
	}
	if w.closing {
		_, _ = w.c.Discard(-1)
	} else {
		discard(w.c, off) // a partial frame at the start stays for the next read
	}
	h.pump(w)
}

// badChannel answers a complete, otherwise well-formed SUB/UNSUB whose channel breaks the
// name rules with ACK BAD_CHANNEL and returns the frame's length; 0 if err is anything else.
func (h *hubServer) badChannel(w *worker, b []byte, err error) int {
	if !w.hello || !(errors.Is(err, names.ErrChannelEmpty) || errors.Is(err, names.ErrChannelLength) || errors.Is(err, names.ErrChannelNUL)) {
		return 0
	}
	req, n, ok := framing.PeekRequest(b)
	if !ok {
		return 0
	}
	h.ack(w, req, framing.AckBadChannel, err.Error())
	return n
}

// frame handles one decoded frame from a worker: one case per worker-to-hub frame type.
func (h *hubServer) frame(w *worker, f *framing.Frame) {
	if !w.hello {
		if f.Type != framing.TypeHello {
			h.protocolError(w, "the first frame must be HELLO, got "+f.Type.String())
			return
		}
		w.hello = true
		w.pid = f.PID
		w.name = string(f.Name)
		h.log.Debug("hub: worker connected", "pid", w.pid, "name", w.name, "sibling", w.sibling)
		h.push(w, h.status(framing.StatusReady, nil, ""))
		return
	}
	switch f.Type {
	case framing.TypeSub:
		h.sub(w, f.Req, f.Mode, f.Channel)
	case framing.TypeUnsub:
		h.unsub(w, f.Req, f.Channel)
	case framing.TypePing:
		h.buf = framing.AppendPong(h.buf[:0], f.Token)
		h.push(w, h.buf)
	case framing.TypeHello:
		h.protocolError(w, "HELLO may be sent only once")
	default:
		h.protocolError(w, f.Type.String()+" is a hub-to-worker frame")
	}
}

func (h *hubServer) sub(w *worker, req uint32, mode framing.Mode, channel []byte) {
	if sub := w.subs[string(channel)]; sub != nil {
		sub.mode = mode // idempotent: the mode is updated, the subscription kept
		switch {
		case sub.acked:
			h.ack(w, req, framing.AckOK, "")
		case len(sub.reqs) >= hubWaitingSubsMax: // nothing a worker sends is kept without bound
			h.ack(w, req, framing.AckLimit, "at most "+strconv.Itoa(hubWaitingSubsMax)+" SUBs of one channel wait for its LISTEN")
		default:
			sub.reqs = append(sub.reqs, req) // answered with the LISTEN in flight
		}
		return
	}
	if reservedChannel(channel) && !w.sibling {
		h.ack(w, req, framing.AckBadChannel, errReservedChannel.Error())
		return
	}
	// The caps are the hub's share of the LISTEN session for outside workers. A sibling's
	// channels are its SSE clients' (capped per subject there), bounded like the first
	// process's own by the session's limit.
	if len(w.subs) >= h.maxWorkerChannels && !w.sibling {
		h.ack(w, req, framing.AckLimit, "at most "+strconv.Itoa(h.maxWorkerChannels)+" channels per worker")
		return
	}
	if existing := h.chans.lookup(channel); (existing == nil || existing.hub.workers == 0) && h.channels >= h.maxChannels && !w.sibling {
		h.ack(w, req, framing.AckLimit, "the hub's workers hold "+strconv.Itoa(h.maxChannels)+
			" channels together, their share of the LISTEN session (the rest is kept for SSE clients)")
		return
	}
	// Register before LISTEN (docs/architecture.md, invariant 4); ACK once it completed on this
	// session.
	ch := h.chans.hold(string(channel))
	if !w.sibling {
		if ch.hub.workers == 0 {
			h.channels++
		}
		ch.hub.workers++
	}
	if ch.hub.name == nil {
		ch.hub.name = []byte(ch.name)
	}
	sub := &hubSub{w: w, ch: ch, mode: mode, idx: int32(len(ch.hub.subs))}
	ch.hub.subs = append(ch.hub.subs, sub)
	w.subs[ch.name] = sub
	if h.chans.isLive(ch) {
		sub.acked = true
		h.ack(w, req, framing.AckOK, "")
		return
	}
	sub.reqs = append(sub.reqs, req)
	ch.hub.waiting++
}

func (h *hubServer) unsub(w *worker, req uint32, channel []byte) {
	sub := w.subs[string(channel)]
	if sub == nil {
		h.ack(w, req, framing.AckNotSubscribed, "not subscribed to "+string(channel))
		return
	}
	for _, r := range sub.reqs {
		h.ack(w, r, framing.AckListenFailed, "UNSUB arrived before the LISTEN completed")
	}
	delete(w.subs, sub.ch.name)
	h.detach(sub)
	h.ack(w, req, framing.AckOK, "")
}

// controlText is text for an ACK or STATUS frame, cut to hubControlTextMaxLen bytes.
func controlText(text string) string {
	if len(text) > hubControlTextMaxLen {
		return text[:hubControlTextMaxLen]
	}
	return text
}

func (h *hubServer) ack(w *worker, req uint32, code framing.AckCode, msg string) {
	h.msg = append(h.msg[:0], controlText(msg)...)
	h.buf = framing.AppendAck(h.buf[:0], req, code, h.msg)
	h.push(w, h.buf)
}

// status encodes a STATUS frame into the control scratch buffer (valid until the next
// control frame is encoded).
func (h *hubServer) status(code framing.StatusCode, channel []byte, text string) []byte {
	h.msg = append(h.msg[:0], controlText(text)...)
	h.buf = framing.AppendStatus(h.buf[:0], code, channel, h.msg)
	return h.buf
}

// protocolError answers bad input (best effort) and closes that worker only.
func (h *hubServer) protocolError(w *worker, reason string) {
	if w.closing {
		return
	}
	h.log.Warn("hub: protocol error; closing the worker", "pid", w.pid, "name", w.name, "err", reason)
	h.final(w, h.status(framing.StatusProtocolError, nil, reason), hubFinalGraceMS)
}

// evict closes a worker that does not read fast enough for its lossless subscriptions.
func (h *hubServer) evict(w *worker) {
	if w.closing {
		return
	}
	h.metrics.evictions.Inc()
	h.log.Warn("hub: evicting a worker that does not read its notifications", "pid", w.pid, "name", w.name,
		"buffered", w.out.Len(), "buffer", w.out.Cap(), "gnet", w.c.OutboundBuffered())
	w.out.Reset() // the worker stopped reading: nothing queued would reach it in time
	h.final(w, h.status(framing.StatusEvicted, nil,
		"outbound buffer of "+strconv.Itoa(w.out.Cap())+" bytes full: read faster or subscribe in wake mode"), hubFinalGraceMS)
}

// final hands what the ring holds (whole frames) and then frame to gnet, stops reading and
// queueing, and closes once gnet has flushed it all — or after a grace period if the worker
// never reads it (gnet's close does not wait for a slow peer). The worker leaves its
// channels now, not at the close (docs/hub-protocol.md: eviction releases them like a disconnect).
func (h *hubServer) final(w *worker, frame []byte, graceMS int64) {
	w.closing = true
	if h.iter > 0 {
		h.leaving = append(h.leaving, w)
	} else {
		h.unsubscribeAll(w)
	}
	if !w.gone {
		a, b := w.out.Peek()
		h.iov = append(h.iov[:0], a, b, frame)
		_, err := w.c.Writev(h.iov)
		clear(h.iov)
		if err == nil && !w.gone {
			if w.c.OutboundBuffered() == 0 {
				_ = w.c.Close()
			} else {
				w.lingerUntilMS = h.nowMS + graceMS
				h.lingering = append(h.lingering, w)
			}
		}
	}
	w.out.Reset()
}

// closeLingering closes final-frame workers whose last bytes left, or whose grace ran out.
func (h *hubServer) closeLingering() {
	keep := h.lingering[:0]
	for _, w := range h.lingering {
		switch {
		case w.gone:
		case w.c.OutboundBuffered() == 0 || h.nowMS >= w.lingerUntilMS:
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

// push queues one frame for w; a frame that does not fit evicts the worker (it is not
// reading). Returns false if w is (now) closing.
func (h *hubServer) push(w *worker, frame []byte) bool {
	if w.closing {
		return false
	}
	if !w.out.Push(frame) {
		h.evict(w)
		return false
	}
	h.queue(w)
	return true
}

func (h *hubServer) queue(w *worker) {
	if !w.queued {
		w.queued = true
		h.pending = append(h.pending, w)
	}
}

// pump hands whole frames from w's ring to gnet while gnet's buffer for the socket is small,
// and queues owed wake RESYNCs once the ring has drained below its low watermark.
func (h *hubServer) pump(w *worker) {
	for writes := 0; writes < hubWritesPerPump && !w.closing; writes++ {
		if len(w.marked) > 0 && w.out.BelowLow() {
			h.oweResyncs(w)
		}
		if w.out.Len() == 0 || w.c.OutboundBuffered() >= hubOutboundLimitBytes {
			break
		}
		a, b := w.out.Peek()
		n := framing.WholeFrames(a, b, hubWriteChunkBytes)
		var err error
		if n <= len(a) {
			_, err = w.c.Write(a[:n])
		} else {
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

// oweResyncs queues one STATUS RESYNC per channel whose wake notifications were coalesced.
func (h *hubServer) oweResyncs(w *worker) {
	marked := w.marked
	w.marked = w.marked[:0]
	for i, sub := range marked {
		marked[i] = nil
		if sub.dropped || !sub.marked {
			continue
		}
		sub.marked = false
		if !h.push(w, h.status(framing.StatusResync, sub.ch.hub.name, "")) {
			return
		}
	}
}

// flush pumps every worker with queued bytes: at the end of each loop entry (one write per
// worker per notification batch) and on every tick (gnet has no "writable" callback).
func (h *hubServer) flush() {
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
		h.pump(w)
		if !w.closing && (w.out.Len() > 0 || w.draining) {
			h.queue(w) // retried on the next tick
		}
	}
	h.spare = list[:0]
	h.leave()
}

// --- events from the LISTEN session ------------------------------------------------------

// notify queues a notification for the channel's workers: encoded once, copied into each
// ring. payload is valid only during the call.
func (h *hubServer) notify(ch *channel, pid uint32, payload []byte) {
	if len(ch.hub.subs) == 0 {
		return
	}
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
				h.pump(w) // a long batch may fill the ring of a worker that does read
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
			h.pump(w)
			if w.closing {
				continue
			}
			if !w.out.Push(frame) {
				h.evict(w) // lossless and it does not fit: this worker only
				continue
			}
		}
		if !w.sibling { // a sibling's own deliveries are counted by the sibling
			delivered++
		}
		h.queue(w)
	}
	if delivered > 0 {
		h.metrics.deliveries.Add(float64(delivered))
	}
	if coalesced > 0 {
		h.metrics.droppedWakeCoalesced.Add(float64(coalesced))
	}
	h.leave()
}

// channelLive answers the SUBs waiting for this channel's LISTEN.
func (h *hubServer) channelLive(ch *channel) {
	if ch.hub.waiting == 0 {
		return
	}
	h.enter()
	for _, sub := range ch.hub.subs {
		if len(sub.reqs) == 0 {
			continue
		}
		sub.acked = true
		for _, r := range sub.reqs {
			h.ack(sub.w, r, framing.AckOK, "")
		}
		sub.reqs = sub.reqs[:0]
		ch.hub.waiting--
	}
	h.leave()
	h.flush()
}

// channelFailed answers the SUBs waiting for this channel's LISTEN with LISTEN_FAILED and
// drops them (the session dropped the reference).
func (h *hubServer) channelFailed(ch *channel, err error) {
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
	h.enter()
	for _, sub := range failed {
		for _, r := range sub.reqs {
			h.ack(sub.w, r, framing.AckListenFailed, msg)
		}
		if sub.w.subs != nil && sub.w.subs[ch.name] == sub {
			delete(sub.w.subs, ch.name)
		}
		h.detach(sub)
	}
	h.leave()
	h.flush()
}

// broadcast queues a STATUS for every worker that said HELLO.
func (h *hubServer) broadcast(code framing.StatusCode, text string) {
	h.enter()
	for _, w := range h.workers {
		if w.hello && !w.closing && !w.draining {
			h.push(w, h.status(code, nil, text))
		}
	}
	h.leave()
	h.flush()
}

// listenerDown tells every worker the LISTEN session was lost.
func (h *hubServer) listenerDown() {
	h.broadcast(framing.StatusListenerDown, "LISTEN session lost; reconnecting")
}

// resync tells every worker the session is back and every channel LISTENed again.
func (h *hubServer) resync() {
	h.broadcast(framing.StatusResync, "LISTEN session re-established: re-read your state")
}

// shutdown sends SHUTDOWN to every worker; each is closed once flushed (pump).
func (h *hubServer) shutdown() {
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
		frame := h.status(framing.StatusShutdown, nil, "pgsse is shutting down: fail over now")
		if !w.out.Push(frame) {
			h.final(w, frame, hubFinalGraceMS)
			continue
		}
		w.draining = true
		h.queue(w)
	}
	h.leave()
	h.flush()
}

// tick runs on every tick (every 20 ms while a worker waits to drain): retry flushing and
// close workers whose final frame left, or that never said HELLO.
func (h *hubServer) tick() {
	h.flush()
	h.enter()
	h.closeLingering()
	for _, w := range h.workers {
		if !w.hello && !w.closing && h.nowMS-w.openedMS > hubHelloTimeoutMS {
			h.protocolError(w, "no HELLO within "+strconv.Itoa(hubHelloTimeoutMS/1000)+"s")
		}
	}
	h.leave()
}
