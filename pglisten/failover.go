package pglisten

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/pgsse/pgsse/names"
)

// FailoverConfig configures NewFailover: the hub to try first and the direct session to fall
// back to.
type FailoverConfig struct {
	Hub    HubConfig
	Direct Config       // the worker's own LISTEN session after a switch (DSN, AppName, …)
	Logger *slog.Logger // default slog.Default(); also used for Hub and Direct when they have none
}

// Failover is the Listener of docs/hub-protocol.md, What to do on each STATUS: hub first; on
// connect refused (or no socket), ACK timeout, EOF, eviction, protocol error, keepalive or write
// timeout, or SHUTDOWN it switches once and for good to a direct session, re-LISTENs every
// recorded channel, and then delivers one KindResync with Channel "" (everything may have been
// missed during the switch).
//
// Events from the hub are all delivered before the switch. A switch away from a hub that was
// connected is reported as a loss: one KindDown (unless the hub's last word was already
// LISTENER_DOWN) as soon as the hub is gone, and the KindResync once the direct session is
// live — notifications committed between the two may have been missed, exactly as after a
// LISTEN session loss. Close stops whichever side is running, including a switch in
// progress; nothing is left running.
type Failover struct {
	cfg FailoverConfig
	log *slog.Logger

	mu        sync.Mutex
	source    Source // where notifications come from: SourceHub, then SourceDirect
	hub       *hubClient
	direct    Listener
	chans     map[string]struct{} // recorded: Listen called (and not failed or Unlistened)
	reason    error               // why the switch happened
	switchErr error               // the direct session could not be started
	closed    bool
	switched  chan struct{} // closed once the direct Listener is installed (or on Close)

	events    chan Event
	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

// Source is where a Failover's notifications come from (Failover.Source).
type Source string

// Failover sources.
const (
	SourceHub    Source = "hub"    // pgsse's hub socket
	SourceDirect Source = "direct" // a PostgreSQL session of its own, after the switch
)

// NewFailover starts a failover Listener. It fails only for a configuration that cannot work
// (a bad DSN, a missing socket path); an unreachable hub is not an error — it switches to a
// direct session at once.
func NewFailover(cfg FailoverConfig) (Listener, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Hub.Logger == nil {
		cfg.Hub.Logger = cfg.Logger
	}
	if cfg.Direct.Logger == nil {
		cfg.Direct.Logger = cfg.Logger
	}
	if cfg.Hub.Socket == "" && cfg.Hub.Conn == nil {
		return nil, errors.New("pglisten: FailoverConfig.Hub.Socket (or Conn) is required")
	}
	if _, err := ParseConfig(cfg.Direct); err != nil {
		return nil, fmt.Errorf("pglisten: failover direct session: %w", err)
	}
	f := &Failover{
		cfg:      cfg,
		log:      cfg.Logger,
		source:   SourceHub,
		chans:    make(map[string]struct{}),
		switched: make(chan struct{}),
		events:   make(chan Event),
		done:     make(chan struct{}),
	}
	h, err := newHub(cfg.Hub)
	if err != nil {
		f.reason = err
	} else {
		f.hub = h
	}
	f.wg.Add(1)
	go f.pump()
	return f, nil
}

// Source is SourceHub while notifications come from the hub, SourceDirect once switched.
func (f *Failover) Source() Source {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.source
}

// Reason is why the Listener switched to direct (nil while on the hub).
func (f *Failover) Reason() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.source == SourceHub {
		return nil
	}
	return f.reason
}

// pump forwards the hub's events, then switches and forwards the direct session's.
func (f *Failover) pump() {
	defer f.wg.Done()
	defer close(f.events)
	reportDown := false
	if f.hub != nil {
		down, ok := f.forwardAll(f.hub.Events())
		if !ok {
			return
		}
		reason := f.hub.Err()
		if errors.Is(reason, ErrClosed) {
			return // Close
		}
		f.mu.Lock()
		f.reason = reason
		f.mu.Unlock()
		reportDown = !down
	}
	d := f.switchToDirect(reportDown)
	if d == nil {
		return
	}
	f.forwardDirect(d.Events())
}

// forwardDirect forwards the direct session's events after the switch's own KindResync. The
// session reports a KindResync after its first connect too; the switch's one already told the
// application to re-read everything, after every recorded channel was LISTENed, so that first
// one is dropped (a worker would otherwise re-read its whole state twice for one switch). A
// KindResync after a KindDown, or for one channel, is a new loss and is forwarded.
func (f *Failover) forwardDirect(in <-chan Event) {
	firstConnect := true
	for {
		select {
		case ev, ok := <-in:
			if !ok {
				return
			}
			switch {
			case ev.Kind == KindDown:
				firstConnect = false
			case ev.Kind == KindResync && ev.Channel == "" && firstConnect:
				firstConnect = false
				continue
			}
			if !f.forward(ev) {
				return
			}
		case <-f.done:
			return
		}
	}
}

// forwardAll forwards from in until it is closed (ok) or Close is called (!ok); down reports
// whether the last state event forwarded was a KindDown not yet followed by a KindResync.
func (f *Failover) forwardAll(in <-chan Event) (down, ok bool) {
	for {
		select {
		case ev, open := <-in:
			if !open {
				return down, true
			}
			switch {
			case ev.Kind == KindDown:
				down = true
			case ev.Kind == KindResync && ev.Channel == "":
				down = false
			}
			if !f.forward(ev) {
				return down, false
			}
		case <-f.done:
			return down, false
		}
	}
}

func (f *Failover) forward(ev Event) bool {
	select {
	case f.events <- ev:
		return true
	case <-f.done:
		return false
	}
}

// switchToDirect runs once, on the pump goroutine: it starts the direct session, delivers the
// KindDown if reportDown, re-LISTENs the recorded channels, and delivers the KindResync. It
// returns nil if Close came first. Listens waiting for the switch are released before any
// event is delivered, so an application that reads Events only between its Listens cannot
// deadlock here.
func (f *Failover) switchToDirect(reportDown bool) Listener {
	f.mu.Lock()
	reason, h := f.reason, f.hub
	f.mu.Unlock()
	f.log.Warn("pglisten: hub unusable; switching to an own LISTEN session for good", "reason", reason)
	if h != nil {
		_ = h.Close()
	}
	d, err := NewDirect(f.cfg.Direct)
	f.mu.Lock()
	if err != nil || f.closed {
		if err != nil {
			f.switchErr = fmt.Errorf("pglisten: failover: cannot start the direct session: %w", err)
			f.hub = nil
			close(f.switched)
		}
		f.mu.Unlock()
		if d != nil {
			_ = d.Close()
		}
		if err != nil {
			f.log.Error("pglisten: cannot start the direct session", "err", err)
		}
		return nil
	}
	f.direct, f.source = d, SourceDirect
	f.hub = nil
	todo := make([]string, 0, len(f.chans))
	for c := range f.chans {
		todo = append(todo, c)
	}
	close(f.switched)
	f.mu.Unlock()
	if reportDown && !f.forward(Event{Kind: KindDown}) {
		return nil
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-f.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	for _, c := range todo {
		if !f.recorded(c) {
			continue
		}
		err := d.Listen(ctx, c)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			f.log.Error("pglisten: re-LISTEN on the direct session failed", "channel", c, "err", err)
			f.forget(c)
		case !f.recorded(c):
			_ = d.Unlisten(ctx, c) // Unlistened while this LISTEN was in flight
		}
	}
	f.log.Info("pglisten: direct session live; resyncing", "channels", len(todo))
	if !f.forward(Event{Kind: KindResync}) {
		return nil
	}
	return d
}

func (f *Failover) recorded(c string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.chans[c]
	return ok
}

func (f *Failover) forget(c string) {
	f.mu.Lock()
	delete(f.chans, c)
	f.mu.Unlock()
}

// current returns the Listener to use now; after a hub failure (or with no hub) it waits for
// the switch to install the direct session.
func (f *Failover) current(ctx context.Context, waitSwitch bool) (Listener, bool, error) {
	for {
		f.mu.Lock()
		closed, d, h, serr := f.closed, f.direct, f.hub, f.switchErr
		f.mu.Unlock()
		switch {
		case closed:
			return nil, false, ErrClosed
		case serr != nil:
			return nil, false, serr
		case d != nil:
			return d, false, nil
		case h != nil && !waitSwitch:
			return h, true, nil
		}
		select {
		case <-f.switched:
			waitSwitch = false
		case <-f.done:
			return nil, false, ErrClosed
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
}

// Listen records channel (so a switch re-LISTENs it) and listens on the current side; when the
// hub fails meanwhile it waits for the switch and listens on the direct session.
func (f *Failover) Listen(ctx context.Context, channel string) error {
	if err := names.CheckChannel(channel); err != nil {
		return fmt.Errorf("pglisten: LISTEN: %w", err)
	}
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return ErrClosed
	}
	_, had := f.chans[channel]
	f.chans[channel] = struct{}{}
	f.mu.Unlock()
	hubFailed := false
	for {
		l, onHub, err := f.current(ctx, hubFailed)
		if err == nil {
			err = l.Listen(ctx, channel)
			if err != nil && onHub && isHubFailure(err) {
				hubFailed = true
				continue
			}
		}
		if err != nil && !had {
			f.forget(channel)
		}
		return err
	}
}

// Unlisten forgets channel and unlistens it on the current side.
func (f *Failover) Unlisten(ctx context.Context, channel string) error {
	f.mu.Lock()
	_, had := f.chans[channel]
	delete(f.chans, channel)
	f.mu.Unlock()
	if !had {
		return ErrNotListening
	}
	hubFailed := false
	for {
		l, onHub, err := f.current(ctx, hubFailed)
		if err != nil {
			return err
		}
		err = l.Unlisten(ctx, channel)
		switch {
		case err != nil && onHub && isHubFailure(err):
			hubFailed = true
			continue
		case errors.Is(err, ErrNotListening):
			return nil // the switch has not re-LISTENed it yet, and now will not
		}
		return err
	}
}

// Events delivers the hub's events, then (after a switch) one KindResync and the direct
// session's events. Closed by Close.
func (f *Failover) Events() <-chan Event { return f.events }

// Close stops the hub client or the direct session (and a switch in progress) and waits for
// every goroutine.
func (f *Failover) Close() error {
	f.closeOnce.Do(func() {
		f.mu.Lock()
		f.closed = true
		h := f.hub
		f.mu.Unlock()
		close(f.done)
		if h != nil {
			_ = h.Close()
		}
		f.wg.Wait()
		f.mu.Lock()
		d := f.direct
		f.mu.Unlock()
		if d != nil {
			_ = d.Close()
		}
	})
	return nil
}

// ErrNotOnHub: NotifyHub was called on a Failover that has switched to a direct session (or
// never reached the hub).
var ErrNotOnHub = errors.New("pglisten: not connected to the hub")

// NotifyHub sends the hub a NOTIFY frame (channel, payload) in the worker-to-hub direction,
// which is not a frame of the hub protocol for workers (docs/hub-protocol.md): pgsse's hub
// takes it only from the --procs sibling processes it started, on the socket it handed each
// (a sibling tells the others of a stream whose ids a crash reused), and cuts off any other
// worker that sends one for a protocol error. It blocks for at most the hub's WriteTimeout;
// ErrNotOnHub once the Listener has switched to a direct session.
func (f *Failover) NotifyHub(channel string, payload []byte) error {
	f.mu.Lock()
	h, d, closed := f.hub, f.direct, f.closed
	f.mu.Unlock()
	switch {
	case closed:
		return ErrClosed
	case h == nil || d != nil:
		return ErrNotOnHub
	}
	return h.notifyHub(channel, payload)
}
