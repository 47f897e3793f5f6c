package pglisten

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgsse/pgsse/framing"
	"github.com/pgsse/pgsse/names"
)

// HubConfig configures a hub client (NewHub). Zero fields take the defaults named.
type HubConfig struct {
	Socket       string        // path of pgsse's hub socket (--hub-socket); required unless Conn is set
	Name         string        // worker name sent in HELLO (≤ 64 bytes), default the program's name
	Mode         framing.Mode  // SUB mode for every Listen: framing.ModeLossless (default) or framing.ModeWake (a lagging channel's notifications collapse into one KindResync for it)
	DialTimeout  time.Duration // connect + HELLO → READY, default 2s
	AckTimeout   time.Duration // SUB/UNSUB → ACK, default 5s; a missed deadline fails the client
	WriteTimeout time.Duration // one frame write, default 5s; a missed deadline fails the client
	PingInterval time.Duration // keepalive PING, default 5s, negative = off; two silent intervals fail the client
	EventBuffer  int           // events queued for the application, default 4096
	Logger       *slog.Logger  // default slog.Default()

	// Conn is an already-connected socket to the hub — e.g. one end of a socketpair a pgsse
	// process handed to a sibling it started (--procs) — used instead of dialling Socket. The
	// client owns it from then on (closes it on failure and on Close).
	Conn net.Conn
}

func (c HubConfig) withDefaults() HubConfig {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.Name == "" {
		c.Name = filepath.Base(os.Args[0])
	}
	if len(c.Name) > framing.MaxName {
		c.Name = c.Name[:framing.MaxName]
	}
	def(&c.DialTimeout, 2*time.Second)
	def(&c.AckTimeout, 5*time.Second)
	def(&c.WriteTimeout, 5*time.Second)
	def(&c.PingInterval, 5*time.Second)
	if c.EventBuffer <= 0 {
		c.EventBuffer = 4096
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Reasons a hub client stops. Each one makes the failover Listener switch to a direct session.
var (
	ErrHubUnavailable = errors.New("pglisten: hub socket unavailable")
	ErrHubAckTimeout  = errors.New("pglisten: hub did not acknowledge within the ACK deadline")
	ErrHubTimeout     = errors.New("pglisten: hub stopped answering (keepalive or write deadline)")
	ErrHubEvicted     = errors.New("pglisten: evicted by the hub (worker did not read fast enough)")
	ErrHubShutdown    = errors.New("pglisten: hub is shutting down")
	ErrHubProtocol    = errors.New("pglisten: hub protocol error")
	ErrHubClosed      = errors.New("pglisten: hub closed the connection")
)

// HubFailure is how a hub client reports that it has stopped: Reason is one of the ErrHub*
// errors above (errors.Is works on the HubFailure), Detail what the hub or the socket said.
type HubFailure struct {
	Reason error
	Detail string
}

func (e *HubFailure) Error() string {
	if e.Detail == "" {
		return e.Reason.Error()
	}
	return e.Reason.Error() + ": " + e.Detail
}

func (e *HubFailure) Unwrap() error { return e.Reason }

// AckError is a SUB or UNSUB the hub refused (BAD_CHANNEL, LISTEN_FAILED, LIMIT). The client
// stays usable.
type AckError struct {
	Channel string
	Code    framing.AckCode
	Message string
}

func (e *AckError) Error() string {
	return fmt.Sprintf("pglisten: hub refused %q: %s: %s", e.Channel, e.Code, e.Message)
}

// isHubFailure reports whether err means the hub client is gone (as opposed to a refused SUB,
// a bad name or a cancelled context).
func isHubFailure(err error) bool {
	var hf *HubFailure
	return errors.As(err, &hf)
}

type ackResult struct {
	code framing.AckCode
	msg  string
}

type pendingAck struct {
	channel string
	unsub   bool
	c       chan ackResult // buffered 1
	// abandoned: the caller stopped waiting (context); an ACK OK for a SUB is undone with UNSUB
	abandoned bool
}

// hubClient is a Listener over the host's pgsse hub socket (docs/hub-protocol.md).
//
// One reader goroutine decodes frames (framing.Decoder) and delivers events to a bounded
// channel; when the application stops reading, the reader blocks, the socket fills and the hub
// applies its policy (evicts a lossless worker, coalesces a wake-mode one). A pinger goroutine
// sends keepalive PINGs. Writes happen on callers' goroutines under a mutex with a deadline.
type hubClient struct {
	cfg  HubConfig
	log  *slog.Logger
	conn net.Conn

	writeMu sync.Mutex
	wbuf    []byte

	mu      sync.Mutex
	subs    map[string]string // channel → the same string (interned for events)
	pending map[uint32]*pendingAck
	nextReq uint32
	err     error // why the client stopped (a *HubFailure), or ErrClosed

	failed    chan struct{} // closed by fail
	failOnce  sync.Once
	closeOnce sync.Once
	events    chan Event
	wg        sync.WaitGroup

	lastRecv   atomic.Int64 // unix nanos of the last read from the socket
	delivering atomic.Bool  // the reader is blocked handing an event to the application
	pingSent   atomic.Int64 // unix nanos of the outstanding PING, 0 = none
}

// NewHub connects to the hub socket, says HELLO and waits for READY. It fails (with a
// *HubFailure wrapping ErrHubUnavailable, ErrHubShutdown, …) if the hub is not there or does not
// accept the worker; nothing is left running then.
func NewHub(cfg HubConfig) (Listener, error) {
	return newHub(cfg)
}

func newHub(cfg HubConfig) (*hubClient, error) {
	cfg = cfg.withDefaults()
	conn := cfg.Conn
	if conn == nil {
		if cfg.Socket == "" {
			return nil, errors.New("pglisten: HubConfig.Socket (or Conn) is required")
		}
		var err error
		if conn, err = net.DialTimeout("unix", cfg.Socket, cfg.DialTimeout); err != nil {
			return nil, &HubFailure{Reason: ErrHubUnavailable, Detail: err.Error()}
		}
	}
	h := &hubClient{
		cfg:     cfg,
		log:     cfg.Logger,
		conn:    conn,
		subs:    make(map[string]string),
		pending: make(map[uint32]*pendingAck),
		failed:  make(chan struct{}),
		events:  make(chan Event, cfg.EventBuffer),
	}
	var dec framing.Decoder
	buf := make([]byte, 64<<10)
	if err := h.handshake(&dec, buf); err != nil {
		conn.Close()
		return nil, err
	}
	h.lastRecv.Store(time.Now().UnixNano())
	h.wg.Add(1)
	go h.read(&dec, buf)
	if cfg.PingInterval > 0 {
		h.wg.Add(1)
		go h.ping()
	}
	return h, nil
}

// handshake sends HELLO and reads frames until STATUS READY, within DialTimeout.
func (h *hubClient) handshake(dec *framing.Decoder, buf []byte) error {
	deadline := time.Now().Add(h.cfg.DialTimeout)
	_ = h.conn.SetDeadline(deadline)
	defer h.conn.SetDeadline(time.Time{})
	hello := framing.AppendHello(nil, uint32(os.Getpid()), []byte(h.cfg.Name))
	if _, err := h.conn.Write(hello); err != nil {
		return &HubFailure{Reason: ErrHubUnavailable, Detail: "HELLO: " + err.Error()}
	}
	for {
		n, err := h.conn.Read(buf)
		if n > 0 {
			dec.Feed(buf[:n])
			f, derr := dec.Next()
			switch {
			case derr == framing.ErrIncomplete:
			case derr != nil:
				return &HubFailure{Reason: ErrHubProtocol, Detail: derr.Error()}
			case f.Type == framing.TypeStatus && f.Status == framing.StatusReady:
				return nil // frames after READY stay in dec for the reader
			case f.Type == framing.TypeStatus:
				return statusFailure(f)
			default:
				return &HubFailure{Reason: ErrHubProtocol, Detail: "expected STATUS READY, got " + f.Type.String()}
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return &HubFailure{Reason: ErrHubClosed, Detail: "before READY"}
			}
			return &HubFailure{Reason: ErrHubUnavailable, Detail: "waiting for READY: " + err.Error()}
		}
	}
}

func statusFailure(f framing.Frame) *HubFailure {
	detail := string(f.Text)
	switch f.Status {
	case framing.StatusEvicted:
		return &HubFailure{Reason: ErrHubEvicted, Detail: detail}
	case framing.StatusShutdown:
		return &HubFailure{Reason: ErrHubShutdown, Detail: detail}
	case framing.StatusProtocolError:
		return &HubFailure{Reason: ErrHubProtocol, Detail: "hub says: " + detail}
	}
	return &HubFailure{Reason: ErrHubProtocol, Detail: "unexpected STATUS " + f.Status.String()}
}

// fail stops the client for err (the first reason wins) and closes the socket, which ends the
// reader; pending Listens return err.
func (h *hubClient) fail(err error) {
	h.failOnce.Do(func() {
		h.mu.Lock()
		if h.err == nil {
			h.err = err
		}
		h.mu.Unlock()
		close(h.failed)
		_ = h.conn.Close()
	})
}

// Err is why the client stopped (nil while it runs): a *HubFailure, or ErrClosed after Close.
func (h *hubClient) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

func (h *hubClient) read(dec *framing.Decoder, buf []byte) {
	defer h.wg.Done()
	defer close(h.events)
	for {
		for {
			f, err := dec.Next()
			if err == framing.ErrIncomplete {
				break
			}
			if err != nil {
				h.fail(&HubFailure{Reason: ErrHubProtocol, Detail: err.Error()})
				return
			}
			if !h.handle(f) {
				return
			}
		}
		n, err := h.conn.Read(buf)
		if n > 0 {
			h.lastRecv.Store(time.Now().UnixNano())
			dec.Feed(buf[:n])
		}
		if err != nil {
			if n > 0 {
				continue // decode what arrived first; the error repeats on the next Read
			}
			select {
			case <-h.failed:
				return // we closed the socket ourselves
			default:
			}
			detail := err.Error()
			if errors.Is(err, io.EOF) {
				detail = "EOF"
			}
			h.fail(&HubFailure{Reason: ErrHubClosed, Detail: detail})
			return
		}
	}
}

// handle processes one frame on the reader goroutine; false ends the reader.
func (h *hubClient) handle(f framing.Frame) bool {
	switch f.Type {
	case framing.TypeNotify:
		h.mu.Lock()
		name, ok := h.subs[string(f.Channel)]
		h.mu.Unlock()
		if !ok {
			return true // unsubscribed while it was in flight
		}
		return h.deliver(Event{Kind: KindNotification, Channel: name, PID: f.PID, Payload: append([]byte(nil), f.Text...)})
	case framing.TypeAck:
		h.mu.Lock()
		p := h.pending[f.Req]
		delete(h.pending, f.Req)
		undo := false
		if p != nil && !p.unsub && f.Ack == framing.AckOK {
			// Subscribed from this frame on: a NOTIFY right behind the ACK must not be dropped
			// while the Listen caller is still waking up.
			if p.abandoned {
				undo = h.subs[p.channel] == ""
			} else {
				h.subs[p.channel] = p.channel
			}
		}
		h.mu.Unlock()
		if p == nil {
			return true
		}
		p.c <- ackResult{code: f.Ack, msg: string(f.Text)}
		if undo {
			h.wg.Add(1) // the reader holds the group, so this Add cannot race Close's Wait
			go func() {
				defer h.wg.Done()
				h.abandonSub(p.channel)
			}()
		}
		return true
	case framing.TypeStatus:
		switch f.Status {
		case framing.StatusListenerDown:
			return h.deliver(Event{Kind: KindDown})
		case framing.StatusResync:
			ev := Event{Kind: KindResync}
			if len(f.Channel) > 0 {
				h.mu.Lock()
				name, ok := h.subs[string(f.Channel)]
				h.mu.Unlock()
				if !ok {
					return true
				}
				ev.Channel = name
			}
			return h.deliver(ev)
		case framing.StatusReady:
			return true
		}
		h.fail(statusFailure(f))
		return false
	case framing.TypePong:
		h.pingSent.Store(0)
		return true
	}
	h.fail(&HubFailure{Reason: ErrHubProtocol, Detail: "unexpected " + f.Type.String() + " frame from the hub"})
	return false
}

// abandonSub undoes a SUB whose Listen gave up before its ACK OK arrived.
func (h *hubClient) abandonSub(channel string) {
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.AckTimeout)
	defer cancel()
	_, _ = h.request(ctx, channel, true, 0)
}

func (h *hubClient) deliver(ev Event) bool {
	select {
	case h.events <- ev:
		return true
	default:
	}
	h.delivering.Store(true)
	defer h.delivering.Store(false)
	select {
	case h.events <- ev:
		return true
	case <-h.failed:
		return false
	}
}

// ping sends a keepalive PING every PingInterval and fails the client when a PING stays
// unanswered while nothing at all arrived for two whole intervals (the reader blocked on a
// slow application does not count: that is the hub's business, not a dead hub).
func (h *hubClient) ping() {
	defer h.wg.Done()
	t := time.NewTicker(h.cfg.PingInterval)
	defer t.Stop()
	var token uint64
	var lastSeen int64
	stale := 0
	for {
		select {
		case <-h.failed:
			return
		case <-t.C:
		}
		recv := h.lastRecv.Load()
		if h.pingSent.Load() != 0 && recv == lastSeen && !h.delivering.Load() {
			stale++
			if stale >= 2 {
				h.fail(&HubFailure{Reason: ErrHubTimeout, Detail: "no answer to PING"})
				return
			}
			continue
		}
		stale, lastSeen = 0, recv
		if h.pingSent.Load() == 0 {
			token++
			h.pingSent.Store(time.Now().UnixNano())
			if err := h.write(func(b []byte) []byte { return framing.AppendPing(b, token) }); err != nil {
				return
			}
		}
	}
}

// write encodes one frame with enc and writes it within WriteTimeout.
func (h *hubClient) write(enc func([]byte) []byte) error {
	h.writeMu.Lock()
	defer h.writeMu.Unlock()
	select {
	case <-h.failed:
		return h.Err()
	default:
	}
	h.wbuf = enc(h.wbuf[:0])
	_ = h.conn.SetWriteDeadline(time.Now().Add(h.cfg.WriteTimeout))
	if _, err := h.conn.Write(h.wbuf); err != nil {
		f := &HubFailure{Reason: ErrHubTimeout, Detail: "write: " + err.Error()}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			f.Reason = ErrHubClosed
		}
		h.fail(f)
		return h.Err()
	}
	return nil
}

// request sends SUB (or UNSUB) for channel and waits for its ACK, the ACK deadline, the
// caller's context or the client's end.
func (h *hubClient) request(ctx context.Context, channel string, unsub bool, mode framing.Mode) (ackResult, error) {
	h.mu.Lock()
	if h.err != nil {
		err := h.err
		h.mu.Unlock()
		return ackResult{}, err
	}
	h.nextReq++
	req := h.nextReq
	p := &pendingAck{channel: channel, unsub: unsub, c: make(chan ackResult, 1)}
	h.pending[req] = p
	h.mu.Unlock()
	err := h.write(func(b []byte) []byte {
		if unsub {
			return framing.AppendUnsub(b, req, []byte(channel))
		}
		return framing.AppendSub(b, req, mode, []byte(channel))
	})
	if err != nil {
		return ackResult{}, err
	}
	timer := time.NewTimer(h.cfg.AckTimeout)
	defer timer.Stop()
	select {
	case r := <-p.c:
		return r, nil
	case <-h.failed:
		select {
		case r := <-p.c:
			return r, nil
		default:
		}
		return ackResult{}, h.Err()
	case <-timer.C:
		h.fail(&HubFailure{Reason: ErrHubAckTimeout, Detail: fmt.Sprintf("no ACK for %q within %v", channel, h.cfg.AckTimeout)})
		return ackResult{}, h.Err()
	case <-ctx.Done():
		h.mu.Lock()
		p.abandoned = true
		h.mu.Unlock()
		select {
		case r := <-p.c:
			return r, nil
		default:
		}
		return ackResult{}, ctx.Err()
	}
}

// Listen sends SUB and returns once the hub acknowledged it — which the hub does only after
// the LISTEN completed on its PostgreSQL session.
func (h *hubClient) Listen(ctx context.Context, channel string) error {
	if err := names.CheckChannel(channel); err != nil {
		return fmt.Errorf("pglisten: LISTEN: %w", err)
	}
	h.mu.Lock()
	_, ok := h.subs[channel]
	h.mu.Unlock()
	if ok {
		return nil
	}
	r, err := h.request(ctx, channel, false, h.cfg.Mode)
	if err != nil {
		return err
	}
	if r.code != framing.AckOK {
		return &AckError{Channel: channel, Code: r.code, Message: r.msg}
	}
	return nil // the reader recorded the subscription when it read the ACK
}

// Unlisten sends UNSUB; notifications for channel stop at once (late ones are dropped here).
func (h *hubClient) Unlisten(ctx context.Context, channel string) error {
	h.mu.Lock()
	_, ok := h.subs[channel]
	delete(h.subs, channel)
	h.mu.Unlock()
	if !ok {
		return ErrNotListening
	}
	r, err := h.request(ctx, channel, true, 0)
	if err != nil {
		return err
	}
	if r.code != framing.AckOK && r.code != framing.AckNotSubscribed {
		return &AckError{Channel: channel, Code: r.code, Message: r.msg}
	}
	return nil
}

// Events delivers notifications, KindDown (LISTENER_DOWN) and KindResync (RESYNC); it is
// closed when the client stops — by Close or by a failure (see Err).
func (h *hubClient) Events() <-chan Event { return h.events }

// Close closes the socket and waits for the client's goroutines.
func (h *hubClient) Close() error {
	h.closeOnce.Do(func() {
		h.fail(ErrClosed)
		h.wg.Wait()
	})
	return nil
}

// Channels returns the channels this client is subscribed to (for logs and tests).
func (h *hubClient) Channels() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]string, 0, len(h.subs))
	for c := range h.subs {
		out = append(out, c)
	}
	return out
}

// notifyHub writes a NOTIFY frame to the hub (Failover.NotifyHub).
func (h *hubClient) notifyHub(channel string, payload []byte) error {
	if err := names.CheckChannel(channel); err != nil {
		return fmt.Errorf("pglisten: NOTIFY to the hub: %w", err)
	}
	if 1+4+1+len(channel)+len(payload) > framing.MaxBody {
		return errors.New("pglisten: NOTIFY to the hub: payload too large for a frame")
	}
	return h.write(func(b []byte) []byte {
		return framing.AppendNotify(b, uint32(os.Getpid()), []byte(channel), payload)
	})
}
