package engine

import (
	"encoding/binary"
	"errors"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"

	"github.com/pgsse/pgsse/framing"
	"github.com/pgsse/pgsse/names"
	"github.com/pgsse/pgsse/ring"
)

// The hub (docs/hub-protocol.md): worker processes on the host connect to a Unix socket served by
// the same gnet loop as the SSE port and share its one LISTEN session.
//
// Everything here runs on the loop goroutine. A worker's outbound frames go through its own
// preallocated ring (--hub-worker-buffer) in PostgreSQL's delivery order, and from the ring
// straight to the socket (one writev, pump) — never into gnet's buffer, which would flush only
// once the loop is back in epoll_wait, so the ring, bounded and with the eviction and wake
// policies, is the only queue. Bytes are written as they are queued: at the end of each loop
// entry, and in the middle of a notification batch as soon as a worker's ring holds
// hubWriteMarkBytes, so a worker that reads as fast as it can is written as fast as it reads
// however long the batch (docs/hub-protocol.md, Modes and backpressure). A socket that is full
// is watched for room (writable_linux.go) and written again as soon as it has some.
//
// Stalls. A lossless notification that does not fit in a worker's ring even after writing
// what its socket takes does not evict that worker at once: the hub stalls — the rest of the
// notification batch, and whatever the LISTEN source reports after it (listen.go,
// sessionGate), waits until the stalled worker's socket has taken enough for the frame to fit
// — at most hubStallMaxMS, after which the workers still stalled are evicted (SPEC §5's rule),
// and only while the stall budget lasts (hubStallBudgetMS, regained at a tenth of the time):
// so a worker that reads is not evicted by a burst larger than its ring, and no worker delays
// anyone else's notifications by more than hubStallMaxMS at a time, hubStallBudgetMS in a
// burst, or a tenth of the time over a longer one. While stalled, a worker's own input waits
// too (its answers would overtake the stalled frame), up to hubStalledInputBytes.
//
// The ring's head may be inside a frame (a socket takes what it takes); worker.partial says
// how much of that frame is still to be written, so that a final STATUS always follows a whole
// frame.
//
// A new frame type: framing (the type, its encoder and decoder) and hubServer.frame below.

const (
	// The hub's share of the LISTEN session's channels (listenMaxChannels; channels.go,
	// channelShares): the workers together hold at most half of them, one worker at most a
	// fifth, so no single worker takes the whole share; SSE clients have the other half but the
	// stream channel. A SUB beyond either gets ACK LIMIT.
	hubMaxChannels          = listenMaxChannels / 2 // distinct channels all workers together
	hubMaxChannelsPerWorker = listenMaxChannels / 5 // channels one worker
	hubWriteMarkBytes       = 64 << 10              // a worker's ring holding this much is written at once, mid-batch
	hubHelloTimeoutMS       = 10_000                // a worker must say HELLO within this
	hubFinalGraceMS         = 10_000                // an evicted or failed worker has this long to read its last STATUS
	hubControlTextMaxLen    = 1024                  // bytes of text in an ACK or STATUS frame we send
	hubWaitingSubsMax       = 64                    // repeated SUBs of one channel waiting for its LISTEN, per worker
	hubRefusedLogEveryMS    = 10_000                // "refusing workers" at most this often
	// hubSiblingBufferBytes is the least outbound ring a sibling process gets (it takes every
	// stream notification of the host, in bursts while its own loop is busy fanning out).
	hubSiblingBufferBytes = 4 << 20
)

// The stall policy (see the top of this file; docs/hub-protocol.md, Modes and backpressure).
const (
	// hubStallMaxMS: one stall waits at most this long (plus a tick, tickFast) for the stalled
	// workers' sockets to take enough; then those still stalled are evicted. It is how long a
	// worker that stopped reading holds up everyone else, once.
	hubStallMaxMS = 100
	// hubStallBudgetMS: what stalls may take in a burst; the budget comes back at a tenth of
	// the time (hubStallRefill), and once it is used up a lossless notification that does not
	// fit evicts at once.
	hubStallBudgetMS = 1000
	hubStallRefill   = 10 // the budget regains 1 ms every hubStallRefill ms
	// hubStalledInputBytes: what a stalled worker may send meanwhile (its input waits); more
	// evicts it.
	hubStalledInputBytes = framing.HeaderLen + framing.MaxBody
)

// hubStall is the hub's stall: the NOTIFY the stalled workers have not queued yet (one
// notification: the batch stopped at it), who they are, and the budget.
type hubStall struct {
	frame   []byte
	workers []*worker
	began   time.Time
	until   time.Time
	// credit: what stalls may still take (at most hubStallBudgetMS), as of creditAt
	credit   time.Duration
	creditAt time.Time
	timer    *time.Timer // ends a stall at until (stallTimeout), more precisely than the tick
}

// hubServer is the hub server's loop-owned state: the workers, their subscriptions (on the
// shared channel table, channel.hub) and the scratch buffers frames are encoded into. It is a
// part of Server: it reaches the raw channels through their table (chans), the LISTEN
// session's state through lsn and the writability set through out.
type hubServer struct {
	*loopEnv
	chans     *channelTable
	lsn       *listenState
	out       *outbound
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
	pending                        []*worker // workers with ring bytes not yet written
	spare                          []*worker
	dead                           []*worker // closed during an iteration; removed on the way out
	leaving                        []*worker // sent a final STATUS during an iteration; unsubscribed on the way out
	lingering                      []*worker // sent a final STATUS; closed once it is flushed (tick)
	iter                           int       // depth of iterations over workers or subscriptions (enter/leave)
	buf                            []byte    // control frame scratch (ACK, STATUS, PONG)
	msg                            []byte    // text scratch for control frames
	nbuf                           []byte    // NOTIFY scratch: one encoding for every subscriber
	tail                           []byte    // scratch for the rest of a begun frame (keepPartial)
	iov                            [2]unix.Iovec
	stall                          hubStall
}

// worker is one connected worker process (loop-owned).
type worker struct {
	c        gnet.Conn
	fd       int    // c's descriptor (the writability set knows it by it)
	onRoom   func() // what the writability set runs when the socket has room (set in accept)
	pid      uint32
	name     string
	sibling  bool // a sibling process (--procs) on a socket this process handed it: may SUB the stream channel
	hello    bool // HELLO received, READY queued
	gone     bool // OnClose ran
	closing  bool // Close requested: no more frames are queued or read
	draining bool // SHUTDOWN queued: close once everything is flushed
	full     bool // the socket did not take everything last time: written again once it has room
	stalled  bool // owes the hub's stalled NOTIFY (hubServer.stall)
	watched  bool // the socket is in the writability set (outbound.watchOnce)
	// lingerUntilMS: a final STATUS (EVICTED, PROTOCOL_ERROR) is queued; close once it is
	// written or at this time
	lingerUntilMS int64
	queued        bool  // in hubServer.pending
	openedMS      int64 // unix ms
	out           *ring.Ring
	partial       int // bytes of the frame at the ring's head still to be written (0: a frame boundary)
	pumped        int // what the ring held after the last write (notify writes again hubWriteMarkBytes later)
	subs          map[string]*hubSub
	marked        []*hubSub // wake subscriptions owing a RESYNC once the ring drains
	idx           int32     // in hubServer.workers
	// adopting: channels of a worker handed over by a predecessor (handoff.go) not resumed
	// here yet (their LISTEN, or the notification at their handoff position, is awaited);
	// once none is left it gets one RESYNC if one of them was not resumed exactly (inexact).
	adopting int
	inexact  bool
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
	client  bool // a sibling's subscription, counted in the SSE side's share (channels.go)
	// adopting: handed over by a predecessor; acknowledged (silently) once the LISTEN here
	// completed (channelLive)
	adopting bool
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

func newHubServer(env *loopEnv, chans *channelTable, lsn *listenState, out *outbound) hubServer {
	all, perWorker := hubShares(listenChannelLimit(env.cfg))
	return hubServer{loopEnv: env, chans: chans, lsn: lsn, out: out, maxChannels: all, maxWorkerChannels: perWorker}
}

// count is the number of workers still connected.
func (h *hubServer) count() int { return h.open }

// channelCount is the number of distinct channels outside workers hold (the hub's share).
func (h *hubServer) channelCount() int { return h.channels }

// openCounter is the count of open worker connections the hub socket's acceptor caps.
func (h *hubServer) openCounter() *atomic.Int64 { return &h.openCount }

// needsPoll reports whether a worker waits for its socket to drain, or the hub for a stalled
// worker (see Server.ticker: the tick retries writes and ends a stall at its deadline).
func (h *hubServer) needsPoll() bool {
	return len(h.pending) > 0 || len(h.lingering) > 0 || h.stalled()
}

// stalled reports whether notification delivery waits for a stalled worker.
func (h *hubServer) stalled() bool { return len(h.stall.workers) > 0 }

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
		fd:       c.Fd(),
		sibling:  sibling,
		openedMS: time.Now().UnixMilli(),
		out:      ring.New(size),
		subs:     make(map[string]*hubSub),
		idx:      int32(len(h.workers)),
	}
	// Wake policy (docs/hub-protocol.md, Modes and backpressure): coalesce above half full, owe
	// the RESYNCs below a quarter.
	w.out.SetWatermarks(w.out.Cap()/4, w.out.Cap()/2)
	w.onRoom = func() { // the socket has room again (the writability set)
		if w.gone {
			return
		}
		h.enter()
		w.full = false
		if w.closing {
			h.pump(w) // a final frame; tick closes it once it has left
		} else {
			h.service(w)
		}
		h.leave()
	}
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
	h.unstallDrop(w)
	if w.watched {
		h.out.forget(w.fd)
	}
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
	if sub.adopting {
		sub.adopting = false
		ch.hub.waiting--
	}
	ch.hub.subs = swapRemove(ch.hub.subs, sub, hubSubIndex)
	if !sub.w.sibling {
		if ch.hub.workers--; ch.hub.workers == 0 {
			h.channels--
		}
	}
	if sub.client {
		h.chans.releaseClient(ch)
	} else {
		h.chans.release(ch)
	}
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
	if w.stalled {
		// Its answers would overtake the NOTIFY it owes: its input waits (unstall reads it).
		if w.c.InboundBuffered() > hubStalledInputBytes {
			h.evict(w, "it sent more than "+strconv.Itoa(hubStalledInputBytes)+" bytes while the hub waited for it to read")
		}
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
	case framing.TypeNotify:
		// A sibling telling the host of a rewind it found (rewinds.go); from anyone else, as
		// any hub-to-worker frame, a protocol error.
		if !w.sibling || string(f.Channel) != storeChannel || !h.lsn.fromSibling(f.Text) {
			h.protocolError(w, f.Type.String()+" is a hub-to-worker frame")
		}
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
	// The rule the SSE side answers 400 with: PostgreSQL refuses to LISTEN on a name that is
	// not UTF-8 (22021), so asking it would only cost a round trip on the one session.
	if err := names.CheckChannelUTF8(channel); err != nil {
		h.ack(w, req, framing.AckBadChannel, err.Error())
		return
	}
	// The caps are the hub's share of the LISTEN session for outside workers. A sibling's
	// channels are its SSE clients' (capped per subject there): they count in the SSE side's
	// share (channels.go, channelShares), like this process's own clients', the stream channel
	// in neither.
	client := w.sibling && !reservedChannel(channel)
	if client && h.chans.sseShareFull(channel) {
		h.chans.logLimit("SSE clients (with sibling processes')", h.chans.sseShare())
		h.ack(w, req, framing.AckLimit, "SSE clients hold "+strconv.Itoa(h.chans.sseShare())+
			" channels together, their share of the LISTEN session")
		return
	}
	if len(w.subs) >= h.maxWorkerChannels && !w.sibling {
		h.ack(w, req, framing.AckLimit, "at most "+strconv.Itoa(h.maxWorkerChannels)+" channels per worker")
		return
	}
	if existing := h.chans.lookup(channel); (existing == nil || existing.hub.workers == 0) && h.channels >= h.maxChannels && !w.sibling {
		h.chans.logLimit("hub workers", h.maxChannels)
		h.ack(w, req, framing.AckLimit, "the hub's workers hold "+strconv.Itoa(h.maxChannels)+
			" channels together, their share of the LISTEN session (the rest is kept for SSE clients)")
		return
	}
	// Register before LISTEN (docs/architecture.md, invariant 4); ACK once it completed on this
	// session.
	hold := h.chans.hold
	if client {
		hold = h.chans.holdClient
	}
	ch := hold(string(channel))
	if !w.sibling {
		if ch.hub.workers == 0 {
			h.channels++
		}
		ch.hub.workers++
	}
	if ch.hub.name == nil {
		ch.hub.name = []byte(ch.name)
	}
	sub := &hubSub{w: w, ch: ch, mode: mode, client: client, idx: int32(len(ch.hub.subs))}
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

// evict closes a worker that does not read fast enough for its lossless subscriptions; why
// is for the log.
func (h *hubServer) evict(w *worker, why string) {
	if w.closing {
		return
	}
	h.metrics.evictions.Inc()
	h.log.Warn("hub: evicting a worker that does not read its notifications: "+why, "pid", w.pid, "name", w.name,
		"buffered", w.out.Len(), "buffer", w.out.Cap())
	// The worker stopped reading: nothing queued would reach it in time (but the rest of a
	// frame its socket has begun, so that EVICTED arrives as a frame).
	h.tail = w.keepPartial(h.tail)
	h.final(w, h.status(framing.StatusEvicted, nil,
		"outbound buffer of "+strconv.Itoa(w.out.Cap())+" bytes full: read faster or subscribe in wake mode"), hubFinalGraceMS)
}

// final queues frame behind what the ring holds (or, if it does not fit, behind the rest of a
// begun frame only), stops reading and queueing, and closes once it is all written — or after
// a grace period if the worker never reads it. The worker leaves its channels now, not at the
// close (docs/hub-protocol.md: eviction releases them like a disconnect).
func (h *hubServer) final(w *worker, frame []byte, graceMS int64) {
	w.closing = true
	w.draining = false
	h.unstallDrop(w)
	if h.iter > 0 {
		h.leaving = append(h.leaving, w)
	} else {
		h.unsubscribeAll(w)
	}
	if w.gone {
		w.out.Reset()
		return
	}
	if w.out.Free() < len(frame) {
		h.tail = w.keepPartial(h.tail)
	}
	w.out.Push(frame) // fits: the ring holds two maximal frames, one of them begun at most
	h.pump(w)
	if w.gone {
		return
	}
	if w.out.Len() == 0 {
		_ = w.c.Close()
		return
	}
	w.lingerUntilMS = h.nowMS + graceMS
	h.lingering = append(h.lingering, w)
}

// --- output to workers ------------------------------------------------------------------

// push queues one frame for w; a frame that does not fit evicts the worker (it is not
// reading). Returns false if w is (now) closing.
func (h *hubServer) push(w *worker, frame []byte) bool {
	if w.closing {
		return false
	}
	if !w.out.Push(frame) {
		h.pump(w)
		if w.closing || !w.out.Push(frame) {
			h.evict(w, "its answers do not fit")
			return false
		}
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

// pump writes what w's ring holds to its socket, as much as the socket takes now: one writev,
// straight to the socket. What it does not take stays in the ring, and the socket is watched
// for room (outbound.watchOnce); a socket that failed is closed.
func (h *hubServer) pump(w *worker) {
	if w.gone || w.out.Len() == 0 {
		return
	}
	a, b := w.out.Peek()
	h.iov[0] = unix.Iovec{Base: &a[0], Len: uint64(len(a))}
	k := 1
	if len(b) > 0 {
		h.iov[1] = unix.Iovec{Base: &b[0], Len: uint64(len(b))}
		k = 2
	}
	n, _, errno := syscall.Syscall(syscall.SYS_WRITEV, uintptr(w.c.Fd()), uintptr(unsafe.Pointer(&h.iov[0])), uintptr(k))
	for errno == syscall.EINTR {
		n, _, errno = syscall.Syscall(syscall.SYS_WRITEV, uintptr(w.c.Fd()), uintptr(unsafe.Pointer(&h.iov[0])), uintptr(k))
	}
	h.iov = [2]unix.Iovec{} // no pointers into the ring are kept
	switch {
	case errno == syscall.EAGAIN:
		n = 0
	case errno != 0:
		// The worker is gone (EPIPE, ECONNRESET): gnet's close runs OnClose, which drops the rest.
		w.closing = true
		h.unstallDrop(w)
		w.out.Reset()
		_ = w.c.Close()
		return
	}
	w.consume(int(n))
	w.pumped = w.out.Len()
	if w.full = w.pumped > 0; w.full && !w.gone {
		w.watched = h.out.watchOnce(w.fd, w.onRoom) || w.watched
	}
}

// service writes what w has queued and does what that makes possible: the RESYNCs it is owed,
// the NOTIFY it stalled on (unstall), the close of a drained SHUTDOWN.
func (h *hubServer) service(w *worker) {
	if w.closing {
		return
	}
	h.pump(w)
	if len(w.marked) > 0 && w.out.BelowLow() && !w.closing {
		h.oweResyncs(w)
		h.pump(w)
	}
	if w.stalled && !w.closing && w.out.Free() >= len(h.stall.frame) {
		h.unstall(w)
	}
	if w.draining && !w.closing && w.out.Len() == 0 {
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

// flush writes to every worker with queued bytes: at the end of each loop entry (one write per
// worker per notification batch, unless a ring filled past hubWriteMarkBytes meanwhile) and on
// every tick (a safety net under the writability set, and all there is without one).
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
		h.service(w)
		if !w.closing && (w.out.Len() > 0 || w.draining || w.stalled) {
			h.queue(w) // retried once the socket has room, and on the next tick
		}
	}
	h.spare = list[:0]
	h.leave()
}

// --- stalls ------------------------------------------------------------------------------

// unstall queues the NOTIFY w owed, now that it fits, and reads what w sent meanwhile; the
// last one to do so ends the stall.
func (h *hubServer) unstall(w *worker) {
	w.out.Push(h.stall.frame)
	if !w.sibling {
		h.metrics.deliveries.Inc()
	}
	h.unstallDrop(w)
	h.queue(w)
	h.pump(w)
	if w.c.InboundBuffered() > 0 && !w.closing {
		h.traffic(w)
	}
}

// unstallDrop takes w off the stall (unstalled, evicted or gone); the last one ends it, and
// the LISTEN source's events go on (listenState.resume).
func (h *hubServer) unstallDrop(w *worker) {
	if !w.stalled {
		return
	}
	w.stalled = false
	if waited, over := h.stall.drop(w); over {
		h.metrics.hubStallSeconds.Add(waited.Seconds())
		h.tasks.push(h.lsn.resume)
	}
}

// stallTimeout evicts the workers still stalled once the stall's time is up (from the stall's
// timer, as a task, and the tick).
func (h *hubServer) stallTimeout() {
	if !h.stalled() || time.Now().Before(h.stall.until) {
		return
	}
	h.enter()
	for _, w := range append([]*worker(nil), h.stall.workers...) {
		h.evict(w, "it did not take a lossless notification within "+strconv.Itoa(hubStallMaxMS)+" ms")
	}
	h.leave()
}

// begin starts a stall on frame, a lossless NOTIFY a worker cannot take now, unless one is
// on already (more workers stall on the same frame) — or reports false when the stall budget
// is used up. timeout runs as a loop task (tasks) once the stall's time is up.
func (st *hubStall) begin(frame []byte, tasks *taskQueue, timeout func()) bool {
	if len(st.workers) > 0 {
		return true
	}
	now := time.Now()
	if st.creditAt.IsZero() {
		st.credit = hubStallBudgetMS * time.Millisecond
	} else {
		st.credit = min(hubStallBudgetMS*time.Millisecond, st.credit+now.Sub(st.creditAt)/hubStallRefill)
	}
	st.creditAt = now
	if st.credit <= 0 {
		return false
	}
	st.began = now
	wait := min(hubStallMaxMS*time.Millisecond, st.credit)
	st.until = now.Add(wait)
	st.frame = append(st.frame[:0], frame...)
	if st.timer == nil {
		st.timer = time.AfterFunc(wait, func() { tasks.push(timeout) })
	} else {
		st.timer.Reset(wait)
	}
	return true
}

// drop takes w off the stall; when it was the last, the stall is over: it reports how long it
// took, charged to the budget.
func (st *hubStall) drop(w *worker) (waited time.Duration, over bool) {
	for i, x := range st.workers {
		if x == w {
			st.workers = append(st.workers[:i], st.workers[i+1:]...)
			st.workers = st.workers[:len(st.workers):cap(st.workers)]
			break
		}
	}
	clear(st.workers[len(st.workers):cap(st.workers)])
	if len(st.workers) > 0 {
		return 0, false
	}
	waited = time.Since(st.began)
	st.credit -= waited
	return waited, true
}

// keepPartial drops what w's ring holds but the rest of the frame its socket has begun; tail
// is scratch space, returned.
func (w *worker) keepPartial(tail []byte) []byte {
	if w.partial == 0 {
		w.out.Reset()
		return tail
	}
	a, b := w.out.Peek()
	tail = append(tail[:0], a[:min(len(a), w.partial)]...)
	if rest := w.partial - len(tail); rest > 0 {
		tail = append(tail, b[:rest]...)
	}
	w.out.Reset()
	w.out.Push(tail)
	return tail
}

// consume drops n written bytes from the front of w's ring, keeping w.partial.
func (w *worker) consume(n int) {
	for n > 0 {
		if w.partial == 0 {
			a, b := w.out.Peek()
			var hdr [framing.HeaderLen]byte
			if k := copy(hdr[:], a); k < len(hdr) {
				copy(hdr[k:], b)
			}
			w.partial = framing.HeaderLen + int(binary.BigEndian.Uint32(hdr[:]))
		}
		k := min(n, w.partial)
		w.out.Consume(k)
		w.partial -= k
		n -= k
	}
}

// --- events from the LISTEN session ------------------------------------------------------

// notify queues a notification for the channel's workers: encoded once, copied into each
// ring, written at once to a worker whose ring has filled past hubWriteMarkBytes. payload is
// valid only during the call. It reports whether a lossless worker could not take it (a
// stall: the caller's batch waits, listenState.pause).
func (h *hubServer) notify(ch *channel, pid uint32, payload []byte) (stalled bool) {
	if len(ch.hub.subs) == 0 {
		return false
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
		if w.stalled { // not while its batch waits for it: a NOTIFY behind the one it owes
			h.evict(w, "a notification arrived while it owed one")
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
				// Lossless and it does not fit: wait for this worker's socket, within the
				// stall's bounds; beyond them, this worker only is evicted.
				if !h.stall.begin(frame, h.tasks, h.stallTimeout) {
					h.evict(w, "its buffer is full and the hub's stall budget is used up")
					continue
				}
				// w owes frame; the hub waits for it (see the top of this file).
				w.stalled = true
				h.stall.workers = append(h.stall.workers, w)
				h.queue(w)
				continue
			}
		}
		if !w.sibling { // a sibling's own deliveries are counted by the sibling
			delivered++
		}
		if n := w.out.Len(); n >= hubWriteMarkBytes && (!w.full || n-w.pumped >= hubWriteMarkBytes) {
			// Write as it is queued: a fast reader need not wait for the batch's end, nor for
			// the report that its socket has room (a task behind this batch) — a full socket
			// is tried again each hubWriteMarkBytes.
			h.pump(w)
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
	return h.stalled()
}

// channelLive answers the SUBs waiting for this channel's LISTEN.
func (h *hubServer) channelLive(ch *channel) {
	if ch.hub.waiting == 0 {
		return
	}
	h.enter()
	for _, sub := range ch.hub.subs {
		if sub.adopting { // its handoff position was not known here: it is told to re-read
			sub.adopting, sub.acked = false, true
			ch.hub.waiting--
			sub.w.inexact = true
			if sub.w.adoptedOne() {
				h.push(sub.w, h.status(framing.StatusResync, nil, adoptedResync))
			}
		}
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
		if len(sub.reqs) > 0 || sub.adopting {
			failed = append(failed, sub)
		}
	}
	msg := firstLine(err.Error())
	h.enter()
	for _, sub := range failed {
		if sub.adopting { // handed over: the worker asked on the predecessor; it is told to re-read
			sub.adopting = false
			ch.hub.waiting--
			sub.w.inexact = true
			if sub.w.adoptedOne() {
				h.push(sub.w, h.status(framing.StatusResync, nil, adoptedResync))
			}
		}
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

// sessionStatus tells every worker the LISTEN session was lost (up false), or is back with
// every channel LISTENed again (up true: RESYNC).
func (h *hubServer) sessionStatus(up bool) {
	if !up {
		h.broadcast(framing.StatusListenerDown, "LISTEN session lost; reconnecting")
		return
	}
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
		if w.stalled || !w.out.Push(frame) { // a stalled worker fails over without the NOTIFY it owed
			h.final(w, frame, hubFinalGraceMS)
			continue
		}
		w.draining = true
		h.queue(w)
	}
	h.leave()
	h.flush()
}

// tick runs on every tick (every 20 ms while a worker waits to drain or the hub for a stalled
// one): retry writing, end a stall whose time is up, close workers whose final frame left, or
// that never said HELLO.
func (h *hubServer) tick() {
	h.flush()
	h.enter()
	h.stallTimeout()
	// Write the final frames still queued; close the workers whose last bytes left, or whose
	// grace ran out.
	keep := h.lingering[:0]
	for _, w := range h.lingering {
		if w.gone {
			continue
		}
		h.pump(w)
		if w.gone {
			continue
		}
		if w.out.Len() == 0 || h.nowMS >= w.lingerUntilMS {
			_ = w.c.Close()
			continue
		}
		keep = append(keep, w)
	}
	clear(h.lingering[len(keep):])
	h.lingering = keep
	for _, w := range h.workers {
		if !w.hello && !w.closing && h.nowMS-w.openedMS > hubHelloTimeoutMS {
			h.protocolError(w, "no HELLO within "+strconv.Itoa(hubHelloTimeoutMS/1000)+"s")
		}
	}
	h.leave()
}

// --- handoff (handoff.go) -------------------------------------------------------------------

// handOverBatch hands over up to max hub workers to a successor: each one's record (its pid,
// name, channels and modes, the frames its ring had not written, the rest of a begun frame
// first) and a duplicate of its descriptor, appended to out; the loop lets go of it (closed
// here without a word: the successor holds the socket). A worker in the middle of something
// — no HELLO yet, a SUB waiting for its LISTEN, a stall, input not yet read, bytes in gnet's
// buffer — is waited for (waiting). Siblings of --procs are not handed over: they drain with
// this process.
func (h *hubServer) handOverBatch(max int, out []HandedConn) ([]HandedConn, int) {
	waiting := 0
	h.enter()
	defer h.leave()
	for _, w := range h.workers {
		if w.closing || w.gone || w.sibling {
			continue
		}
		if len(out) >= max || !w.hello || w.stalled || w.draining || w.adopting > 0 ||
			w.c.OutboundBuffered() > 0 || w.c.InboundBuffered() > 0 || w.subWaiting() {
			waiting++
			continue
		}
		rec := framing.HandoffWorkerRec{PID: w.pid, Name: w.name, Partial: uint32(w.partial)}
		for name, sub := range w.subs {
			pos := h.chans.hubPosition(sub.ch)
			if sub.marked {
				pos = framing.HandoffNoPosition // it owes a RESYNC: the successor sends one
			}
			rec.Channels = append(rec.Channels, framing.HandoffChan{Mode: uint8(sub.mode), Pos: pos, Name: name})
		}
		fd, err := unix.FcntlInt(uintptr(w.c.Fd()), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			waiting++
			continue
		}
		a, b := w.out.Peek()
		rec.Tail = append(append(rec.Tail, a...), b...)
		w.out.Reset()
		w.partial = 0
		w.closing = true
		h.unstallDrop(w)
		_ = w.c.Close()
		out = append(out, HandedConn{FD: fd, Record: framing.AppendHandoffWorker(nil, &rec)})
	}
	return out, waiting
}

// subWaiting reports whether one of w's SUBs waits for its LISTEN.
func (w *worker) subWaiting() bool {
	for _, sub := range w.subs {
		if len(sub.reqs) > 0 || !sub.acked {
			return true
		}
	}
	return false
}

// adopt registers a worker a predecessor handed over (handoff.go) as it stood there: HELLO
// said, its channels held (LISTENed here if they are not yet — the worker is not asked
// again), the frames the predecessor had not written queued first, each channel resumed at
// its handoff position (channelTable.resumeAt: the notifications it missed between the two
// processes, then live). If one of them cannot be resumed exactly — its position is not
// known here, or what it missed was not kept — it gets one RESYNC once every channel is
// live here: notifications that fell between the two sessions may be missing
// (docs/hub-protocol.md; docs/architecture.md, Handoff positions).
func (h *hubServer) adopt(c gnet.Conn, rec *framing.HandoffWorkerRec) {
	if _, act := h.accept(c, false); act != gnet.None {
		_ = c.Close()
		return
	}
	w, _ := c.Context().(*worker)
	if w == nil {
		return
	}
	w.hello, w.pid, w.name = true, rec.PID, rec.Name
	if len(rec.Tail) > 0 && w.out.Push(rec.Tail) {
		w.partial = int(rec.Partial)
	}
	h.enter()
	w.adopting++ // adopted's own count: the RESYNC goes out once, after the loop
	for _, hc := range rec.Channels {
		ch := h.chans.hold(hc.Name)
		if ch.hub.workers == 0 {
			h.channels++
		}
		ch.hub.workers++
		if ch.hub.name == nil {
			ch.hub.name = []byte(ch.name)
		}
		sub := &hubSub{w: w, ch: ch, mode: framing.Mode(hc.Mode), idx: int32(len(ch.hub.subs))}
		ch.hub.subs = append(ch.hub.subs, sub)
		w.subs[ch.name] = sub
		sub.adopting = true
		ch.hub.waiting++
		w.adopting++
		h.chans.resumeAt(ch, hc.Pos, func(notes []heldNote, exact bool) { sub.resume(h, notes, exact) })
	}
	if w.adoptedOne() && w.inexact {
		h.push(w, h.status(framing.StatusResync, nil, adoptedResync))
	}
	h.leave()
	h.flush()
}

// resume starts a handed-over worker's subscription (channelTable.resumeAt): the
// notifications it missed between the two processes first, then live — unless its LISTEN
// here is not complete yet (channelLive starts it then, owing a RESYNC).
func (sub *hubSub) resume(h *hubServer, notes []heldNote, exact bool) {
	w := sub.w
	if sub.dropped || !sub.adopting || w.closing {
		return
	}
	if !exact {
		w.inexact = true
	}
	if !h.chans.isLive(sub.ch) {
		return
	}
	sub.adopting, sub.acked = false, true
	sub.ch.hub.waiting--
	for _, n := range notes {
		frame := framing.AppendNotify(h.nbuf[:0], n.pid, sub.ch.hub.name, n.payload)
		h.nbuf = frame
		if !w.out.Push(frame) {
			h.pump(w)
			if w.closing || !w.out.Push(frame) {
				w.inexact = true // its ring cannot take what it missed: it re-reads instead
				break
			}
		}
	}
	h.queue(w)
	if w.adoptedOne() && w.inexact {
		h.push(w, h.status(framing.StatusResync, nil, adoptedResync))
	}
}

// adoptedOne counts down a handed-over worker's channels not resumed here yet; true at
// none: the caller queues its one RESYNC (adoptedResync) if the worker is inexact.
func (w *worker) adoptedOne() bool {
	w.adopting--
	return w.adopting == 0 && !w.closing
}

// adoptedResync is the RESYNC a handed-over worker gets once its channels are live here, if
// one of them could not be resumed at its handoff position (channelTable.resumeAt).
const adoptedResync = "handed over to a new pgsse process: re-read your state"
