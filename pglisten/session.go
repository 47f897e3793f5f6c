package pglisten

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgsse/pgsse/names"
)

// Errors reported to Listen's done callback.
var (
	ErrClosed          = errors.New("pglisten: session closed")
	ErrSessionLost     = errors.New("pglisten: LISTEN session lost while the command was in flight")
	ErrTooManyChannels = errors.New("pglisten: too many channels (MaxChannels)")
)

// Events are the consumer's callbacks. They are invoked from ONE session goroutine, strictly in
// protocol order (a Listen's done callback for channel X comes before any notification that
// PostgreSQL sent after answering that LISTEN), never concurrently. They must not block.
type Events interface {
	Notifications(b *Batch)
	Down(err error) // the session was lost (once per loss, only after it had been up)
	Resynced()      // (re)connected AND every channel with a live reference is LISTENed again; also after the first connect
}

// Config configures a Session. Zero fields take the defaults named.
type Config struct {
	DSN          string        // "" = libpq environment (PGHOST…); application_name is forced to AppName
	AppName      string        // default "pgsse-listen"
	Logger       *slog.Logger  // default slog.Default()
	PingInterval time.Duration // idle round trip, default 2s
	PingTimeout  time.Duration // default 3s: no answer → the session is dead
	BackoffMin   time.Duration // default 100ms
	BackoffMax   time.Duration // default 5s (exponential with jitter, capped)
	MaxChannels  int           // default 10000: Listen beyond it fails with ErrTooManyChannels

	ConnectTimeout time.Duration // one connection attempt, default 10s
	KeepAlive      time.Duration // TCP keepalive idle/interval, default 5s
	EventBuffer    int           // Direct only: queued events before dropping to one KindResync, default 4096
}

func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if c.AppName == "" {
		c.AppName = "pgsse-listen"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	def(&c.PingInterval, 2*time.Second)
	def(&c.PingTimeout, 3*time.Second)
	def(&c.BackoffMin, 100*time.Millisecond)
	def(&c.BackoffMax, 5*time.Second)
	if c.BackoffMax < c.BackoffMin {
		c.BackoffMax = c.BackoffMin
	}
	def(&c.ConnectTimeout, 10*time.Second)
	def(&c.KeepAlive, 5*time.Second)
	if c.MaxChannels <= 0 {
		c.MaxChannels = 10000
	}
	if c.EventBuffer <= 0 {
		c.EventBuffer = 4096
	}
	return c
}

// ParseConfig turns cfg into the pgconn configuration the session connects with:
// cfg.DSN (or the libpq environment when empty), application_name forced to cfg.AppName,
// TCP keepalive of cfg.KeepAlive. Exposed so callers can reject a bad DSN up front.
func ParseConfig(cfg Config) (*pgconn.Config, error) {
	cfg = cfg.withDefaults()
	pc, err := pgconn.ParseConfig(cfg.DSN)
	if err != nil {
		return nil, err
	}
	pc.RuntimeParams["application_name"] = cfg.AppName
	d := &net.Dialer{
		Timeout: cfg.ConnectTimeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: cfg.KeepAlive, Interval: cfg.KeepAlive, Count: 3,
		},
	}
	pc.DialFunc = d.DialContext
	if pc.ConnectTimeout <= 0 {
		pc.ConnectTimeout = cfg.ConnectTimeout
	}
	return pc, nil
}

type cmdKind uint8

const (
	cmdListen cmdKind = iota
	cmdUnlisten
	cmdPing
)

// command is one Query in flight; the FIFO of them is matched against C/I/E + Z.
type command struct {
	kind    cmdKind
	ch      *channel
	waiters []func(error)
	err     error // ErrorResponse received for it
	resync  bool  // last re-LISTEN after a connect: Resynced fires when it completes
	sentAt  time.Duration
}

// channel is the session's state for one PostgreSQL channel.
type channel struct {
	name      string
	refs      int           // holders (confirmed or waiting)
	sent      bool          // the last command sent for it on this connection was LISTEN
	confirmed bool          // a LISTEN completed on this connection and no UNLISTEN was sent since
	pending   int           // commands in flight for it
	listenCmd *command      // the in-flight LISTEN new Listens join (nil if none or superseded)
	waiters   []func(error) // Listens made while the session was down
}

type op struct {
	listen bool
	name   string
	done   func(error)
}

// Session is the one LISTEN session of a host. See the package doc.
type Session struct {
	cfg   Config
	pgcfg *pgconn.Config
	perr  error
	ev    Events
	log   *slog.Logger
	epoch time.Time

	// shared with other goroutines
	mu                 sync.Mutex
	ops                []op
	started            bool
	closed             bool
	wake               chan struct{}
	closing            chan struct{}
	wg                 sync.WaitGroup
	up                 atomic.Bool
	pid                atomic.Uint32
	live               atomic.Int64
	connects, failures atomic.Uint64

	// owned by the session goroutine
	chans     map[string]*channel
	fifo      []*command
	conn      *connection
	out       []byte
	ping      *command
	attempt   int // consecutive failed connects
	connectC  chan connectResult
	dialing   bool
	retry     *time.Timer
	cancelCtx context.CancelFunc
	ctx       context.Context
	lastErr   error // cause of the current connection's end (FATAL ErrorResponse)
}

// NewSession returns a session; Start connects it.
func NewSession(cfg Config, ev Events) *Session {
	cfg = cfg.withDefaults()
	s := &Session{
		cfg:      cfg,
		ev:       ev,
		log:      cfg.Logger,
		epoch:    time.Now(),
		wake:     make(chan struct{}, 1),
		closing:  make(chan struct{}),
		chans:    make(map[string]*channel),
		connectC: make(chan connectResult),
	}
	s.pgcfg, s.perr = ParseConfig(cfg)
	s.ctx, s.cancelCtx = context.WithCancel(context.Background())
	return s
}

// Start connects in the background and keeps reconnecting until Close.
func (s *Session) Start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.closed {
		return
	}
	s.started = true
	s.wg.Add(1)
	go s.run()
}

// Listen adds a reference to channel. done(nil) is called once a LISTEN for it has completed on
// the current session (soon if it already is LISTENed and the session is up; with the in-flight
// LISTEN if one is in flight; after reconnect+re-LISTEN if the session is down). done(err) if the
// name is invalid, PostgreSQL rejects it, or the session is lost while that LISTEN was in flight
// (ErrSessionLost); on error the reference is dropped and must not be Unlistened. Never does I/O
// on the caller's goroutine, never blocks, never calls done inside Listen. done runs on the
// session goroutine, ordered with Events.
//
// To abandon a pending Listen, wait for its done and Unlisten if it reported nil.
func (s *Session) Listen(channel string, done func(error)) {
	s.enqueue(op{listen: true, name: channel, done: done})
}

// Unlisten drops one reference; the session sends UNLISTEN when the last one goes. Non-blocking.
func (s *Session) Unlisten(channel string) { s.enqueue(op{name: channel}) }

func (s *Session) enqueue(o op) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		if o.listen && o.done != nil {
			go o.done(ErrClosed) // never synchronously; nothing else runs after Close
		}
		return
	}
	s.ops = append(s.ops, o)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Up reports whether the session is connected.
func (s *Session) Up() bool { return s.up.Load() }

// PID is the backend pid of the current session (0 if down).
func (s *Session) PID() uint32 { return s.pid.Load() }

// Channels is the number of channels with a live reference.
func (s *Session) Channels() int { return int(s.live.Load()) }

// Connects is the number of successful connects so far (the first one included).
func (s *Session) Connects() uint64 { return s.connects.Load() }

// ConnectFailures is the number of failed connection attempts so far.
func (s *Session) ConnectFailures() uint64 { return s.failures.Load() }

// Close stops the session, closes the connection and waits for its goroutines. Pending done
// callbacks get ErrClosed (on the closing goroutine, before Close returns). No Events after Close
// returns.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	started := s.started
	s.mu.Unlock()
	close(s.closing)
	s.cancelCtx()
	if started {
		s.wg.Wait()
		return nil
	}
	s.mu.Lock()
	ops := s.ops
	s.ops = nil
	s.mu.Unlock()
	for _, o := range ops {
		if o.listen && o.done != nil {
			o.done(ErrClosed)
		}
	}
	return nil
}

func (s *Session) now() time.Duration { return time.Since(s.epoch) }

// ---- the session goroutine ----

func (s *Session) run() {
	defer s.wg.Done()
	tick := min(s.cfg.PingInterval, s.cfg.PingTimeout) / 4
	tick = max(tick, 10*time.Millisecond)
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	s.retry = time.NewTimer(0) // first attempt at once
	defer s.retry.Stop()
	for {
		var items <-chan item
		if s.conn != nil {
			items = s.conn.items
		}
		select {
		case <-s.closing:
			s.shutdown()
			return
		case <-s.wake:
			s.processOps()
		case it := <-items:
			s.handleItem(it)
		case res := <-s.connectC:
			s.dialing = false
			s.onConnect(res)
		case <-s.retry.C:
			s.dial()
		case <-ticker.C:
			s.checkLiveness()
		}
		s.flush()
	}
}

func (s *Session) processOps() {
	s.mu.Lock()
	ops := s.ops
	s.ops = nil
	s.mu.Unlock()
	for _, o := range ops {
		if o.listen {
			s.opListen(o.name, o.done)
		} else {
			s.opUnlisten(o.name)
		}
	}
}

func (s *Session) opListen(name string, done func(error)) {
	if done == nil {
		done = func(error) {}
	}
	if err := names.CheckChannel(name); err != nil {
		done(fmt.Errorf("pglisten: LISTEN: %w", err))
		return
	}
	ch := s.chans[name]
	if ch == nil || ch.refs == 0 {
		if s.live.Load() >= int64(s.cfg.MaxChannels) {
			done(ErrTooManyChannels)
			return
		}
		if ch == nil {
			ch = &channel{name: name}
			s.chans[name] = ch
		}
		s.live.Add(1)
	}
	ch.refs++
	switch {
	case s.conn == nil:
		ch.waiters = append(ch.waiters, done)
	case ch.listenCmd != nil:
		ch.listenCmd.waiters = append(ch.listenCmd.waiters, done)
	case ch.confirmed:
		done(nil)
	default:
		s.sendListen(ch, []func(error){done})
	}
}

func (s *Session) opUnlisten(name string) {
	ch := s.chans[name]
	if ch == nil || ch.refs == 0 {
		s.log.Warn("pglisten: Unlisten without a matching Listen", "channel", name)
		return
	}
	ch.refs--
	if ch.refs > 0 {
		return
	}
	s.live.Add(-1)
	if s.conn != nil && ch.sent {
		s.send(&command{kind: cmdUnlisten, ch: ch}, "UNLISTEN")
		ch.sent, ch.confirmed, ch.listenCmd = false, false, nil
	}
	s.maybeForget(ch)
}

func (s *Session) maybeForget(ch *channel) {
	if ch.refs == 0 && ch.pending == 0 && !ch.sent && len(ch.waiters) == 0 && s.chans[ch.name] == ch {
		delete(s.chans, ch.name)
	}
}

func (s *Session) sendListen(ch *channel, waiters []func(error)) *command {
	c := &command{kind: cmdListen, ch: ch, waiters: waiters}
	s.send(c, "LISTEN")
	ch.sent, ch.listenCmd = true, c
	return c
}

func (s *Session) send(c *command, verb string) {
	c.sentAt = s.now()
	if c.kind == cmdPing {
		s.out = appendPing(s.out)
	} else {
		c.ch.pending++
		s.out = appendQuery(s.out, verb, c.ch.name)
	}
	s.fifo = append(s.fifo, c)
}

func (s *Session) flush() {
	if len(s.out) == 0 || s.conn == nil {
		s.out = s.out[:0]
		return
	}
	s.conn.write(s.out)
	s.out = s.out[:0]
}

func (s *Session) handleItem(it item) {
	if it.batch != nil {
		s.ev.Notifications(it.batch)
	}
	for _, m := range it.ctl {
		if s.conn == nil {
			return // lost below while handling an earlier message
		}
		s.handleCtl(m)
	}
	if it.err != nil && s.conn != nil {
		err := it.err
		if s.lastErr != nil {
			err = fmt.Errorf("%w (after: %w)", err, s.lastErr)
		}
		s.lose(err)
	}
}

func (s *Session) handleCtl(m ctlMsg) {
	if len(s.fifo) == 0 {
		if m.typ == MsgError {
			// FATAL without a command: pg_terminate_backend, shutdown, idle timeout. The read
			// error follows; remember why.
			s.lastErr = m.err
			s.log.Warn("pglisten: PostgreSQL ended the session", "code", m.err.Code, "message", m.err.Message)
			return
		}
		s.lose(fmt.Errorf("%w: %q with no command in flight", errUnexpectedMessage, m.typ))
		return
	}
	head := s.fifo[0]
	switch m.typ {
	case MsgError:
		if head.err == nil {
			head.err = m.err
		}
		if m.err.Severity == "FATAL" || m.err.Severity == "PANIC" || m.err.SeverityUnlocalized == "FATAL" {
			s.lastErr = m.err // the session ends; say why in Down
		}
	case MsgReady:
		s.fifo[0] = nil
		s.fifo = s.fifo[1:]
		if len(s.fifo) == 0 {
			s.fifo = s.fifo[:0:0] // let the backing array go once drained
		}
		s.complete(head)
	}
}

// complete runs when a command's ReadyForQuery arrived.
func (s *Session) complete(c *command) {
	switch c.kind {
	case cmdPing:
		if s.ping == c {
			s.ping = nil
		}
		if c.err != nil {
			s.log.Warn("pglisten: ping failed", "err", c.err)
		}
		return
	case cmdUnlisten:
		c.ch.pending--
		if c.err != nil {
			s.log.Warn("pglisten: UNLISTEN failed", "channel", c.ch.name, "err", c.err)
		}
		s.maybeForget(c.ch)
		return
	}
	ch := c.ch
	ch.pending--
	if c.err != nil {
		err := fmt.Errorf("pglisten: LISTEN %q: %w", ch.name, c.err)
		if ch.listenCmd == c {
			ch.listenCmd, ch.sent = nil, false
		}
		s.dropRefs(ch, len(c.waiters))
		if c.resync || len(c.waiters) == 0 {
			s.log.Error("pglisten: re-LISTEN failed", "channel", ch.name, "err", c.err)
		}
		for _, w := range c.waiters {
			w(err)
		}
	} else {
		if ch.listenCmd == c {
			ch.listenCmd, ch.confirmed = nil, true
		}
		for _, w := range c.waiters {
			w(nil)
		}
	}
	if c.resync {
		s.log.Info("pglisten: resynced", "pid", s.pid.Load(), "channels", s.live.Load())
		s.ev.Resynced()
	}
	s.maybeForget(ch)
}

func (s *Session) dropRefs(ch *channel, n int) {
	if n == 0 || ch.refs == 0 {
		return
	}
	ch.refs -= min(n, ch.refs)
	if ch.refs == 0 {
		s.live.Add(-1)
		if s.conn != nil && ch.sent {
			s.send(&command{kind: cmdUnlisten, ch: ch}, "UNLISTEN")
			ch.sent, ch.confirmed, ch.listenCmd = false, false, nil
		}
	}
}

func (s *Session) checkLiveness() {
	if s.conn == nil {
		return
	}
	now := s.now()
	if s.ping != nil {
		if now-s.ping.sentAt > s.cfg.PingTimeout {
			s.lose(fmt.Errorf("pglisten: no answer to ping within %v (half-open or stalled session)", s.cfg.PingTimeout))
		}
		return
	}
	if now-time.Duration(s.conn.lastRecv.Load()) >= s.cfg.PingInterval {
		s.ping = &command{kind: cmdPing}
		s.send(s.ping, "")
	}
}

// lose tears the current connection down, fails what was in flight, and schedules a reconnect.
func (s *Session) lose(err error) {
	c := s.conn
	s.conn = nil
	s.up.Store(false)
	s.pid.Store(0)
	s.lastErr = nil
	s.out = s.out[:0]
	c.stop()
	s.log.Warn("pglisten: session lost", "pid", c.pid, "err", err)
	s.failInflight(fmt.Errorf("%w: %w", ErrSessionLost, err))
	s.ev.Down(err)
	s.scheduleRetry(s.cfg.BackoffMin)
}

// failInflight fails every command in flight with err and resets per-connection channel state.
func (s *Session) failInflight(err error) {
	fifo := s.fifo
	s.fifo, s.ping = nil, nil
	for _, c := range fifo {
		if c.kind == cmdListen {
			s.dropRefs(c.ch, len(c.waiters))
			for _, w := range c.waiters {
				w(err)
			}
		}
	}
	for _, ch := range s.chans {
		ch.sent, ch.confirmed, ch.pending, ch.listenCmd = false, false, 0, nil
		s.maybeForget(ch)
	}
}

func (s *Session) scheduleRetry(d time.Duration) {
	s.retry.Reset(d)
}

// backoff is the delay after the n-th consecutive failure: full jitter between BackoffMin and
// min(BackoffMax, BackoffMin·2^n).
func (s *Session) backoff(n int) time.Duration {
	lo, hi := s.cfg.BackoffMin, s.cfg.BackoffMax
	ceil := lo
	for i := 0; i < n && ceil < hi; i++ {
		ceil *= 2
	}
	ceil = min(ceil, hi)
	if ceil <= lo {
		return lo
	}
	return lo + rand.N(ceil-lo+1)
}

type connectResult struct {
	hc  *pgconn.HijackedConn
	err error
}

func (s *Session) dial() {
	if s.conn != nil || s.dialing {
		return
	}
	if s.perr != nil {
		s.onConnect(connectResult{err: s.perr})
		return
	}
	s.dialing = true
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		hc, err := connect(s.ctx, s.pgcfg)
		select {
		case s.connectC <- connectResult{hc, err}:
		case <-s.closing:
			if hc != nil {
				_ = hc.Conn.Close()
			}
		}
	}()
}

func connect(ctx context.Context, pc *pgconn.Config) (*pgconn.HijackedConn, error) {
	ctx, cancel := context.WithTimeout(ctx, pc.ConnectTimeout)
	defer cancel()
	pg, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	if err := pg.SyncConn(ctx); err != nil {
		_ = pg.Close(context.Background())
		return nil, err
	}
	hc, err := pg.Hijack()
	if err != nil {
		_ = pg.Close(context.Background())
		return nil, err
	}
	return hc, nil
}

func (s *Session) onConnect(res connectResult) {
	if res.err != nil {
		s.attempt++
		s.failures.Add(1)
		d := s.backoff(s.attempt)
		s.log.Warn("pglisten: connect failed", "attempt", s.attempt, "retry_in", d, "err", res.err)
		s.scheduleRetry(d)
		return
	}
	s.attempt = 0
	s.connects.Add(1)
	hc := res.hc
	_, isTLS := hc.Conn.(*tls.Conn)
	s.conn = newConnection(hc.Conn, hc.PID, s.cfg.PingTimeout, s.now, s.log)
	s.conn.start()
	s.up.Store(true)
	s.pid.Store(hc.PID)
	s.log.Info("pglisten: session up", "pid", hc.PID, "addr", hc.Conn.RemoteAddr().String(), "tls", isTLS, "channels", s.live.Load())
	var last *command
	for _, ch := range s.chans {
		if ch.refs == 0 {
			continue
		}
		last = s.sendListen(ch, ch.waiters)
		ch.waiters = nil
	}
	if last != nil {
		last.resync = true
		return
	}
	s.log.Info("pglisten: resynced", "pid", hc.PID, "channels", 0)
	s.ev.Resynced()
}

func (s *Session) shutdown() {
	if s.conn != nil {
		s.conn.stop()
		s.conn = nil
		s.up.Store(false)
		s.pid.Store(0)
	}
	fifo := s.fifo
	s.fifo = nil
	for _, c := range fifo {
		for _, w := range c.waiters {
			w(ErrClosed)
		}
	}
	for _, ch := range s.chans {
		for _, w := range ch.waiters {
			w(ErrClosed)
		}
		ch.waiters = nil
	}
	s.mu.Lock()
	ops := s.ops
	s.ops = nil
	s.mu.Unlock()
	for _, o := range ops {
		if o.listen && o.done != nil {
			o.done(ErrClosed)
		}
	}
	// A dial in flight sees s.closing (its context is cancelled) and exits; run's caller waits.
}
