package pglisten

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/pgsse/pgsse/names"
)

// EventKind says what an Event reports.
type EventKind uint8

const (
	KindNotification EventKind = iota + 1 // a NOTIFY on a channel this Listener listens to
	KindDown                              // the session was lost; notifications may be missed until KindResync
	KindResync                            // the session is back (or events were dropped): re-read state for Channel ("" = all)
)

func (k EventKind) String() string {
	switch k {
	case KindNotification:
		return "notification"
	case KindDown:
		return "down"
	case KindResync:
		return "resync"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event is what a Listener delivers.
type Event struct {
	Kind    EventKind
	Channel string // "" with KindResync = all
	PID     uint32 // notifying backend (KindNotification)
	Payload []byte // owned by the receiver
}

// Listener is the worker-facing API: one interface whether notifications come from an own
// PostgreSQL session (NewDirect), the host's pgsse hub, or a failover between the two.
type Listener interface {
	// Listen returns once LISTEN completed: every notification committed after it returns is
	// delivered (or covered by a KindResync). Idempotent per channel.
	Listen(ctx context.Context, channel string) error
	// Unlisten stops delivery for channel; ErrNotListening if it was not listened.
	Unlisten(ctx context.Context, channel string) error
	// Events delivers notifications, KindDown on session loss, KindResync after it is back;
	// closed by Close.
	Events() <-chan Event
	Close() error
}

// ErrNotListening is returned by Unlisten for a channel the Listener does not listen to.
var ErrNotListening = errors.New("pglisten: channel is not listened")

// direct is a Listener on its own Session.
//
// Events are queued in a bounded queue (Config.EventBuffer) that a pump goroutine moves to the
// Events channel. When the application does not keep up and the queue is full, further
// notifications are dropped and, once the queue has drained, one KindResync with Channel ""
// is delivered in their place: the application must then re-read its state.
type direct struct {
	s *Session

	mu       sync.Mutex
	subs     map[string]*sub
	queue    []Event
	max      int
	overflow bool
	closed   bool
	wake     chan struct{}

	events chan Event
	done   chan struct{}
	pumpWG sync.WaitGroup
}

type sub struct {
	name      string
	ready     chan struct{}
	err       error
	waiting   int  // Listen calls blocked on ready
	abandoned bool // every waiting Listen gave up (or Unlisten came first); Unlisten once LISTEN completes
}

// NewDirect returns a Listener with its own LISTEN session (see Session), connecting in the
// background. It fails only for a configuration that cannot work (a bad DSN).
func NewDirect(cfg Config) (Listener, error) {
	cfg = cfg.withDefaults()
	if _, err := ParseConfig(cfg); err != nil {
		return nil, err
	}
	d := &direct{
		subs:   make(map[string]*sub),
		max:    cfg.EventBuffer,
		wake:   make(chan struct{}, 1),
		events: make(chan Event),
		done:   make(chan struct{}),
	}
	d.s = NewSession(cfg, d)
	d.pumpWG.Add(1)
	go d.pump()
	d.s.Start()
	return d, nil
}

func (d *direct) Listen(ctx context.Context, channel string) error {
	if err := names.CheckChannel(channel); err != nil {
		return fmt.Errorf("pglisten: LISTEN: %w", err)
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return ErrClosed
	}
	sb, ok := d.subs[channel]
	if !ok {
		sb = &sub{name: channel, ready: make(chan struct{})}
		d.subs[channel] = sb
		d.s.Listen(channel, func(err error) { d.listened(sb, err) })
	}
	sb.waiting++
	d.mu.Unlock()
	select {
	case <-sb.ready:
		return sb.err
	case <-ctx.Done():
		d.mu.Lock()
		defer d.mu.Unlock()
		select {
		case <-sb.ready:
			return sb.err
		default:
		}
		sb.waiting--
		if sb.waiting == 0 {
			sb.abandoned = true
			if d.subs[channel] == sb {
				delete(d.subs, channel)
			}
		}
		return ctx.Err()
	}
}

// listened runs on the session goroutine when the LISTEN for sb completed.
func (d *direct) listened(sb *sub, err error) {
	d.mu.Lock()
	sb.err = err
	if err != nil && d.subs[sb.name] == sb {
		delete(d.subs, sb.name)
	}
	abandoned := sb.abandoned
	close(sb.ready)
	d.mu.Unlock()
	if err == nil && abandoned {
		d.s.Unlisten(sb.name)
	}
}

func (d *direct) Unlisten(ctx context.Context, channel string) error {
	d.mu.Lock()
	sb, ok := d.subs[channel]
	if !ok {
		d.mu.Unlock()
		return ErrNotListening
	}
	delete(d.subs, channel)
	select {
	case <-sb.ready:
		d.mu.Unlock()
		if sb.err == nil {
			d.s.Unlisten(channel)
		}
		return nil
	default:
		sb.abandoned = true // the pending Listen's done will Unlisten
		d.mu.Unlock()
		return nil
	}
}

func (d *direct) Events() <-chan Event { return d.events }

func (d *direct) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	err := d.s.Close()
	close(d.done)
	d.pumpWG.Wait()
	return err
}

// Notifications copies each notification for a channel this Listener listens to.
func (d *direct) Notifications(b *Batch) {
	d.mu.Lock()
	for i := range b.Notes {
		n := &b.Notes[i]
		sb, ok := d.subs[string(n.Channel)]
		if !ok {
			continue // unlistened while the UNLISTEN was in flight
		}
		d.pushLocked(Event{Kind: KindNotification, Channel: sb.name, PID: n.PID, Payload: append([]byte(nil), n.Payload...)})
	}
	d.mu.Unlock()
	b.Release()
	d.signal()
}

func (d *direct) Down(error) {
	d.mu.Lock()
	d.pushLocked(Event{Kind: KindDown})
	d.mu.Unlock()
	d.signal()
}

func (d *direct) Resynced() {
	d.mu.Lock()
	d.pushLocked(Event{Kind: KindResync})
	d.mu.Unlock()
	d.signal()
}

func (d *direct) pushLocked(e Event) {
	if d.overflow || len(d.queue) >= d.max {
		d.overflow = true // one KindResync replaces everything dropped
		return
	}
	d.queue = append(d.queue, e)
}

func (d *direct) signal() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

func (d *direct) pump() {
	defer d.pumpWG.Done()
	defer close(d.events)
	var batch []Event
	for {
		d.mu.Lock()
		batch, d.queue = d.queue, batch[:0]
		resync := false
		if len(batch) == 0 && d.overflow {
			d.overflow, resync = false, true
		}
		d.mu.Unlock()
		if resync {
			batch = append(batch, Event{Kind: KindResync})
		}
		for i := range batch {
			select {
			case d.events <- batch[i]:
				batch[i] = Event{}
			case <-d.done:
				return
			}
		}
		if len(batch) > 0 {
			continue
		}
		select {
		case <-d.wake:
		case <-d.done:
			return
		}
	}
}
