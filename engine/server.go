package engine

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/pglisten"
	"github.com/pgsse/pgsse/sse"
	"github.com/pgsse/pgsse/store"
)

// storeChannel is the one PostgreSQL channel all stream traffic travels on.
const storeChannel = store.Channel

// Server is one pgsse serve process: the gnet loop with its SSE listener and hub socket,
// the LISTEN session, the replay pool and the retention job.
//
// Every field below the "loop-owned" line is touched only on the loop goroutine
// (DESIGN invariant 1); other goroutines hand work over through tasks.
type Server struct {
	cfg      Config
	log      *slog.Logger
	metrics  *metrics
	verifier *auth.Verifier
	tasks    *taskQueue

	session  *pglisten.Session
	replayer *store.Replayer

	booted     chan struct{}
	loopsReady chan struct{}
	loopsOnce  sync.Once
	started    chan struct{}
	addr       net.Addr
	eng        gnet.Engine
	anchor     gnet.Conn
	anchorPeer net.Conn

	healthyAt atomic.Int64  // unix nanoseconds of the last tick the loop ran
	needPoll  atomic.Bool   // someone waits for a socket to drain: tick every 20 ms
	pollNow   chan struct{} // wakes the ticker when needPoll turns on
	listenOK  atomic.Bool
	schemaOK  atomic.Bool
	schemaMsg atomic.Value // string: why the schema is not ready

	// loop-owned
	parser        sse.Parser
	now           int64 // unix milliseconds, refreshed every tick
	lastSweep     int64
	conns         []*sseConn
	active        int // subscribed SSE connections
	streams       map[string]*stream
	channels      map[string]*channel
	dirtyStreams  []*stream
	dirtyChannels []*channel
	lagging       []*sseConn
	retryFetch    []*stream
	retryConns    []*sseConn
	reap          []*sseConn
	depth         int
	iov           [][]byte
	iovecs        []unix.Iovec
	iovCopy       [][]byte
	scratch       []byte
	payload       store.Payload
	listenUp      bool
	everUp        bool
	draining      bool
	hub           hubState
}

// New checks cfg and prepares a Server; nothing is started until Run.
func New(cfg Config) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:        cfg,
		log:        cfg.Logger,
		tasks:      newTaskQueue(),
		booted:     make(chan struct{}),
		loopsReady: make(chan struct{}),
		pollNow:    make(chan struct{}, 1),
		started:    make(chan struct{}),
		streams:    make(map[string]*stream),
		scratch:    make([]byte, 0, 64<<10),
		channels:   make(map[string]*channel),
	}
	s.tasks.enter, s.tasks.leave = s.enter, s.leave
	if len(cfg.Auth.Secret) > 0 || len(cfg.Auth.PublicKeyPEM) > 0 {
		v, err := auth.NewVerifier(cfg.Auth)
		if err != nil {
			return nil, err
		}
		s.verifier = v
	}
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	s.schemaMsg.Store("schema not checked yet")
	return s, nil
}

// Run serves until ctx is cancelled, then shuts down gracefully (SPEC §3 "Shutdown") and
// returns nil; it returns an error if the server cannot start or fails.
func (s *Server) Run(ctx context.Context) error {
	addrs := []string{"tcp://" + s.cfg.Listen}
	if s.cfg.HubSocket != "" {
		hubAddr, cleanup, err := s.prepareHubSocket()
		if err != nil {
			return err
		}
		defer cleanup()
		addrs = append(addrs, hubAddr)
	}

	// The session exists (not started) before the loop can accept anyone: a hub worker or
	// /channels/ client that subscribes at once must reach session.Listen, not a nil session.
	// Everything the loop reads must be in place before gnet accepts the first connection.
	s.now = time.Now().UnixMilli()
	s.replayer = store.NewReplayer(s.cfg.DatabaseURL, s.cfg.ReplayPoolSize, s.log)
	s.session = pglisten.NewSession(pglisten.Config{DSN: s.cfg.DatabaseURL, Logger: s.log}, sessionEvents{s})
	s.session.Listen(storeChannel, func(err error) {
		if err != nil {
			s.log.Error("LISTEN on the stream channel failed", "channel", storeChannel, "err", err)
		}
	})
	abort := func(err error) error {
		s.session.Close()
		s.replayer.Close()
		return err
	}

	gnetErr := make(chan error, 1)
	go func() {
		gnetErr <- gnet.Rotate(s, addrs,
			gnet.WithMulticore(false),
			gnet.WithNumEventLoop(1),
			gnet.WithLoadBalancing(gnet.LeastConnections),
			gnet.WithReuseAddr(true),
			// No gnet.WithTCPKeepAlive: gnet v2.9.7 applies it to the listener even when
			// the bind failed, replacing "address already in use" with EBADF. Heartbeat
			// writes find dead SSE peers anyway.
			gnet.WithTCPNoDelay(gnet.TCPNoDelay),
			gnet.WithLogger(gnetLogger{s.log}),
			gnet.WithTicker(true),
		)
	}()
	select {
	case err := <-gnetErr:
		return abort(fmt.Errorf("--listen %s: %w", s.cfg.Listen, err))
	case <-s.booted:
	}
	s.afterHubBind()
	select {
	case err := <-gnetErr:
		return abort(fmt.Errorf("--listen %s: %w", s.cfg.Listen, err))
	case <-s.loopsReady:
	}
	anchor, peer, err := registerAnchor(s.eng)
	if err != nil {
		_ = s.eng.Stop(context.Background())
		return abort(fmt.Errorf("engine: register loop anchor: %w", err))
	}
	s.anchor, s.anchorPeer = anchor, peer
	s.addr = s.boundAddr()
	s.healthyAt.Store(time.Now().UnixNano())
	s.tasks.start(anchor.EventLoop())

	s.session.Start()

	bg, stopBG := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.ticker(bg) }()
	go func() { defer wg.Done(); s.checkSchema(bg) }()
	if s.cfg.Retention > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); store.RunRetention(bg, s.cfg.DatabaseURL, s.cfg.Retention, s.log) }()
	}
	s.log.Debug("engine loop running", "listen", s.addr.String(), "hub", s.cfg.HubSocket,
		"max_connections", s.cfg.MaxConnections, "heartbeat", s.cfg.Heartbeat, "retention", s.cfg.Retention)
	close(s.started)

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-gnetErr:
		runErr = fmt.Errorf("engine: event loop stopped: %w", runErr)
	}
	if runErr == nil {
		s.drain()
	}
	stopBG()
	s.session.Close()
	s.replayer.Close()
	wg.Wait()
	s.tasks.close()
	stopCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.eng.Stop(stopCtx)
	if runErr == nil {
		<-gnetErr
	}
	_ = s.anchorPeer.Close()
	s.log.Debug("engine stopped")
	return runErr
}

// drain tells every client to come back later (jittered), flushes and closes, within a
// bounded time.
func (s *Server) drain() {
	done := make(chan struct{})
	s.tasks.push(func() {
		s.enter()
		defer s.leave()
		s.log.Info("shutting down: telling clients to retry", "connections", s.active, "hub_workers", s.hub.count())
		s.draining = true
		for _, sc := range s.conns {
			switch sc.state {
			case stateHead:
				_ = sc.c.Close()
			case statePending:
				s.shed(sc)
			default:
				s.closeWithRetry(sc)
			}
		}
		s.hubShutdown()
		close(done)
	})
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		left := make(chan int, 1)
		if !s.tasks.push(func() { left <- len(s.conns) + s.hub.count() }) {
			return
		}
		select {
		case n := <-left:
			if n == 0 {
				return
			}
		case <-time.After(time.Second):
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Started is closed once the listeners are bound and the loop runs.
func (s *Server) Started() <-chan struct{} { return s.started }

// Addr is the bound SSE address (useful with ":0"); valid after Started.
func (s *Server) Addr() net.Addr { return s.addr }

// Healthy reports whether the event loop has run recently (/healthz).
func (s *Server) Healthy() bool {
	return time.Now().UnixNano()-s.healthyAt.Load() < int64(5*time.Second)
}

// Ready reports whether the LISTEN session is up and the schema is at the expected
// version (/readyz).
func (s *Server) Ready() bool { return s.listenOK.Load() && s.schemaOK.Load() }

// NotReadyReason says why Ready is false, in one line.
func (s *Server) NotReadyReason() string {
	switch {
	case !s.listenOK.Load():
		return "LISTEN session is down"
	case !s.schemaOK.Load():
		return s.schemaMsg.Load().(string)
	}
	return ""
}

func (s *Server) boundAddr() net.Addr {
	fd, err := s.eng.DupListener("tcp", s.cfg.Listen)
	if err != nil {
		return &net.TCPAddr{}
	}
	defer syscall.Close(fd)
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		return &net.TCPAddr{}
	}
	switch a := sa.(type) {
	case *syscall.SockaddrInet4:
		return &net.TCPAddr{IP: net.IP(a.Addr[:]), Port: a.Port}
	case *syscall.SockaddrInet6:
		return &net.TCPAddr{IP: net.IP(a.Addr[:]), Port: a.Port}
	}
	return &net.TCPAddr{}
}

// ticker hands the loop its periodic work: heartbeats, deadlines and retries every
// 250 ms, and every 20 ms only while a lagging client or hub worker waits for its socket
// to drain (gnet has no writable callback). Waking the loop costs more than the tick's
// work — each wake pulls the loop's thread out of epoll_wait — so an idle server wakes
// it 4 times a second, not 50.
func (s *Server) ticker(ctx context.Context) {
	const fast, slow = 20 * time.Millisecond, 250 * time.Millisecond
	t := time.NewTimer(slow)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.pollNow:
		case <-t.C:
		}
		now := time.Now()
		if s.needPoll.Load() || now.Sub(last) >= slow-fast {
			last = now
			s.tasks.push(s.tick)
		}
		d := slow - now.Sub(last)
		if s.needPoll.Load() || d < fast {
			d = fast
		}
		t.Reset(d)
	}
}

func (s *Server) tick() {
	s.enter()
	defer s.leave()
	now := time.Now()
	s.now = now.UnixMilli()
	s.healthyAt.Store(now.UnixNano())
	s.resumeLagging()
	s.hubTick()
	if s.now-s.lastSweep < 240 {
		return
	}
	s.lastSweep = s.now
	if len(s.retryFetch) > 0 {
		retry := s.retryFetch
		s.retryFetch = nil
		for _, st := range retry {
			if s.streams[st.name] == st {
				s.startFetch(st)
			}
		}
	}
	s.runReadRetries()
	hb := s.cfg.Heartbeat.Milliseconds()
	nowSec := now.Unix()
	for _, sc := range s.conns {
		if sc.closed {
			continue
		}
		switch sc.state {
		case stateHead:
			if s.now >= sc.deadline*1000 {
				sc.state = stateClosing
				_ = sc.c.Close()
			}
		case statePending:
			if s.now-sc.lastWrite > 30_000 && sc.lastWrite > 0 {
				s.shed(sc)
			} else if sc.lastWrite == 0 {
				sc.lastWrite = s.now
			}
		case stateLive, stateCatchUp, stateLagging:
			if sc.deadline > 0 && nowSec >= sc.deadline {
				s.closeWithRetry(sc) // token expired
				continue
			}
			if s.now-sc.lastWrite >= hb {
				sc.write(s, heartbeat)
			}
		}
	}
}

var heartbeat = []byte(":\n")

func (s *Server) checkSchema(ctx context.Context) {
	check := func() {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		conn, err := pgconn.Connect(cctx, s.cfg.DatabaseURL)
		if err != nil {
			s.schemaMsg.Store("cannot check schema: " + firstLine(err.Error()))
			return
		}
		defer conn.Close(context.Background())
		v, err := store.Version(cctx, conn)
		switch {
		case err != nil:
			s.schemaMsg.Store("cannot check schema: " + firstLine(err.Error()))
		case v != store.SchemaVersion:
			msg := fmt.Sprintf("schema at version %d, expected %d: run `pgsse migrate`", v, store.SchemaVersion)
			if s.schemaOK.Swap(false) || s.schemaMsg.Load() != msg {
				s.log.Error("not ready: " + msg)
			}
			s.schemaMsg.Store(msg)
			return
		default:
			s.schemaOK.Store(true)
			s.schemaMsg.Store("")
			return
		}
	}
	check()
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if !s.schemaOK.Load() {
				check()
			}
		}
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// sessionEvents hands the LISTEN session's callbacks to the loop, in order.
type sessionEvents struct{ s *Server }

func (e sessionEvents) Notifications(b *pglisten.Batch) {
	if !e.s.tasks.push(func() { e.s.onBatch(b) }) {
		b.Release()
	}
}
func (e sessionEvents) Down(err error) { e.s.tasks.push(func() { e.s.onDown(err) }) }
func (e sessionEvents) Resynced()      { e.s.tasks.push(e.s.onResynced) }

func (s *Server) onBatch(b *pglisten.Batch) {
	s.enter()
	defer s.leave()
	s.metrics.notifications.Add(float64(len(b.Notes)))
	for i := range b.Notes {
		n := &b.Notes[i]
		if string(n.Channel) == storeChannel {
			if err := store.ParsePayload(n.Payload, &s.payload); err != nil {
				s.metrics.dropped.WithLabelValues("bad_payload").Inc()
				s.log.Debug("ignoring a payload on the stream channel that is not pgsse's", "err", err, "pid", n.PID)
			} else {
				s.onPayload(&s.payload)
			}
		}
		if ch := s.channels[string(n.Channel)]; ch != nil {
			s.onChannelNotify(ch, n.PID, n.Payload)
		}
	}
	b.Release() // everything above copied what it keeps; leave() writes it out
}

func (s *Server) onDown(err error) {
	s.enter()
	defer s.leave()
	s.listenUp = false
	s.listenOK.Store(false)
	s.log.Warn("LISTEN session lost; clients keep their connections and will be caught up", "err", err)
	for _, ch := range s.channels {
		ch.listening = false
	}
	s.hubListenerDown()
}

func (s *Server) onResynced() {
	s.enter()
	defer s.leave()
	wasUp := s.everUp
	s.listenUp, s.everUp = true, true
	s.listenOK.Store(true)
	if wasUp {
		s.metrics.reconnects.Inc()
		s.log.Info("LISTEN session back; catching streams up from the table", "streams", len(s.streams), "channels", len(s.channels))
	}
	for _, ch := range s.channels {
		if ch.ref == refHeld { // a failed or still-pending LISTEN is not live
			s.channelLive(ch)
		}
	}
	s.resyncStreams()
	if wasUp {
		s.hubResync()
	}
}
