package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/pglisten"
	"github.com/pgsse/pgsse/sse"
	"github.com/pgsse/pgsse/store"
)

// Shutdown and health timing.
const (
	drainTimeout      = 5 * time.Second       // told-to-retry clients and workers have this long to be flushed
	drainAskTimeout   = time.Second           // one "how many are left" question to the loop
	drainPollInterval = 20 * time.Millisecond // between those questions
	stopTimeout       = 5 * time.Second       // gnet's own stop
	healthyWithin     = 5 * time.Second       // /healthz: the loop ran a tick this recently
	scratchBytes      = 64 << 10              // initial encoding scratch
)

// Server is one pgsse serve process: the gnet loop with its SSE listener and hub socket,
// the LISTEN session, the replay pool and the retention job.
//
// Every field below the "loop-owned" line is touched only on the loop goroutine
// (docs/architecture.md, invariant 1); other goroutines hand work over through tasks.
type Server struct {
	cfg      Config
	log      *slog.Logger
	metrics  *metrics
	verifier *auth.Verifier
	pool     *auth.Pool // the verifier pool (verify.go), from Run; nil without a token key
	tasks    *taskQueue

	listen   listenSource // the LISTEN session (listen.go)
	replayer *store.Replayer

	publishState // the Publisher and publisher connections (publish.go)

	loopsReady chan struct{}
	loopsOnce  sync.Once
	started    chan struct{}
	addr       net.Addr
	eng        gnet.Engine
	anchor     gnet.Conn
	anchorPeer net.Conn

	sseOpen   atomic.Int64  // SSE connections open on the loop (the acceptor's hard cap)
	sseLn     atomic.Value  // net.Listener: --listen, once bound (StopAccepting)
	healthyAt atomic.Int64  // unix nanoseconds of the last tick the loop ran
	needPoll  atomic.Bool   // someone waits for a socket to drain: tick fast (ticker)
	pollNow   chan struct{} // wakes the ticker when needPoll turns on
	listenOK  atomic.Bool
	schemaOK  atomic.Bool
	schemaMsg atomic.Value // string: why the schema is not ready
	// schemaLogged: when "not ready" was last logged (schema.go)
	schemaLogged atomic.Pointer[time.Time]

	outboundTotal atomic.Int64  // outbound.total as of the last tick, for keepMemory
	relieved      chan struct{} // the loop tells keepMemory that the outbound pressure passed
	batchSlots    chan struct{} // notification batches queued for the loop (listen.go)
	stopping      chan struct{} // closed when Run stops the goroutines beside the loop

	// loop-owned
	parser        sse.Parser
	nowMS         int64 // the loop clock: unix milliseconds, refreshed every tick
	lastSweepMS   int64 // when sweepConns last ran
	conns         []*sseConn
	active        int // admitted SSE connections
	streams       map[string]*stream
	channels      map[string]*channel
	dirtyStreams  []*stream
	dirtyChannels []*channel
	lagging       []*sseConn
	laggingSpare  []*sseConn
	retryFetch    []*stream
	retryConns    []*sseConn
	reap          []*sseConn
	depth         int      // nesting of enter/leave
	evs           []*event // scratch: the events one connection gets in one write
	out           outbound // the write path's queues and budget (outbound.go, budget.go)
	scratch       []byte
	payload       store.Payload
	listenUp      bool
	everUp        bool
	draining      bool
	// listenDownSinceMS: when the LISTEN session went down (or Run started it)
	listenDownSinceMS int64
	admitQ            connFIFO         // authorised connections waiting to be admitted (admission.go)
	subjects          map[string]int32 // connections per subject (--max-connections-per-subject)
	hub               hub
}

// New checks cfg and prepares a Server; nothing is started until Run.
func New(cfg Config) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:        cfg,
		log:        slog.New(newRepeatLimiter(cfg.Logger.Handler(), logRepeatEvery)),
		tasks:      newTaskQueue(),
		loopsReady: make(chan struct{}),
		pollNow:    make(chan struct{}, 1),
		relieved:   make(chan struct{}, 1),
		batchSlots: make(chan struct{}, listenBatchesQueued),
		stopping:   make(chan struct{}),
		started:    make(chan struct{}),
		streams:    make(map[string]*stream),
		scratch:    make([]byte, 0, scratchBytes),
		channels:   make(map[string]*channel),
		subjects:   make(map[string]int32),
	}
	s.publishBudget = max(publishMemoryBytes, 2*cfg.MaxPublishBytes)
	s.publishBodyTimeoutMS = publishBodyTimeoutMS
	s.hub.srv = s
	s.hub.maxChannels, s.hub.maxWorkerChannels = hubMaxChannels, hubMaxChannelsPerWorker
	s.out.epfd = -1
	s.tasks.enter, s.tasks.leave = s.enter, s.leave
	s.tasks.between = s.admitRound
	if len(cfg.Auth.Secret) > 0 || len(cfg.Auth.PublicKeyPEM) > 0 {
		v, err := auth.NewVerifier(cfg.Auth)
		if err != nil {
			return nil, err
		}
		s.verifier = v
	}
	m, err := newMetrics(cfg.Registry, s)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	s.schemaMsg.Store("schema not checked yet")
	return s, nil
}

// Run serves until ctx is cancelled, then shuts down gracefully (docs/http.md, Responses and
// errors: SIGTERM) and returns nil; it returns an error if the server cannot start or fails.
func (s *Server) Run(ctx context.Context) error {
	// Bind first, each socket under its own flag's name: nothing else has started if one fails.
	sseLn, err := listenSSE(s.cfg.Listen, s.cfg.ShareListen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", s.cfg.Listen, bindError(err))
	}
	defer sseLn.Close()
	s.sseLn.Store(sseLn)
	var hubLn net.Listener
	if s.cfg.HubSocket != "" {
		cleanup, err := s.hub.socket.prepare(s.cfg.HubSocket, s.cfg.HubSocketMode, s.log)
		if err != nil {
			return err
		}
		defer cleanup()
		hubLn, err = net.Listen("unix", s.cfg.HubSocket)
		s.hub.socket.bound(s.log)
		if err != nil {
			return fmt.Errorf("--hub-socket %s: %w", s.cfg.HubSocket, bindError(err))
		}
		defer hubLn.Close()
	}
	// The database, before anything runs on it: a refusal retrying cannot fix (no such
	// database, authentication) ends the start here, with one line.
	if err := s.checkDatabase(ctx, startCheckTimeout, true); err != nil {
		return err
	}
	placeholder, err := newPlaceholder()
	if err != nil {
		return fmt.Errorf("engine: the loop's placeholder socket: %w", err)
	}

	// The LISTEN source exists (not started) before the loop can accept anyone: a hub worker
	// or /channels/ client that subscribes at once must reach Listen, not a nil source.
	// Everything the loop reads must be in place before the first connection is handed over.
	s.nowMS = time.Now().UnixMilli()
	s.listenDownSinceMS = s.nowMS
	if err := s.out.init(); err != nil {
		return fmt.Errorf("engine: epoll set for SSE writes: %w", err)
	}
	defer s.out.close()
	s.startVerifier()
	defer s.stopVerifier()
	s.replayer = store.NewReplayer(s.cfg.DatabaseURL, s.cfg.ReplayPoolSize, s.log)
	s.listen = s.newListenSource()
	s.listen.Listen(storeChannel, func(err error) {
		if err != nil && !errors.Is(err, pglisten.ErrClosed) { // closed: the server is stopping
			s.log.Error("LISTEN on the stream channel failed", "channel", storeChannel, "err", err)
		}
	})
	abort := func(err error) error {
		close(s.stopping)
		_ = s.listen.Close()
		s.replayer.Close()
		return err
	}

	gnetErr := make(chan error, 1)
	go func() {
		gnetErr <- gnet.Rotate(s, []string{placeholder.addr()},
			gnet.WithMulticore(false),
			gnet.WithNumEventLoop(1),
			gnet.WithLoadBalancing(gnet.LeastConnections), // Engine.Register needs one other than RoundRobin
			gnet.WithLogger(gnetLogger{s.log}),
			gnet.WithTicker(true),
		)
	}()
	select {
	case err := <-gnetErr:
		return abort(fmt.Errorf("engine: event loop: %w", err))
	case <-s.loopsReady:
	}
	if err := placeholder.seal(s.eng); err != nil {
		_ = s.eng.Stop(context.Background())
		return abort(fmt.Errorf("engine: the loop's placeholder socket: %w", err))
	}
	anchor, peer, err := registerAnchor(s.eng)
	if err != nil {
		_ = s.eng.Stop(context.Background())
		return abort(fmt.Errorf("engine: register loop anchor: %w", err))
	}
	s.anchor, s.anchorPeer = anchor, peer
	s.addr = sseLn.Addr()
	s.healthyAt.Store(time.Now().UnixNano())
	s.tasks.start(anchor.EventLoop())

	acceptors := []*acceptor{s.newAcceptor("--listen "+s.addr.String(), sseLn, originSSE, &s.sseOpen,
		func() int64 { return int64(s.cfg.MaxConnections + shedSlack) })}
	if hubLn != nil {
		acceptors = append(acceptors, s.newAcceptor("--hub-socket "+s.cfg.HubSocket, hubLn, originHub, &s.hub.openCount,
			func() int64 { return int64(s.cfg.hubWorkers + hubShedSlack) }))
	}
	for _, a := range acceptors {
		a.start()
	}

	s.listen.Start()

	bg, stopBG := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(4)
	go func() { defer wg.Done(); s.ticker(bg) }()
	go func() { defer wg.Done(); s.checkSchema(bg) }()
	go func() { defer wg.Done(); s.keepMemory(bg) }()
	go func() { defer wg.Done(); s.watchWritable(bg) }()
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
		s.drain() // new connections meanwhile are told the server is draining
	}
	for _, a := range acceptors {
		a.close()
	}
	pubCtx, pubCancel := context.WithTimeout(context.Background(), drainTimeout)
	s.stopPublisher(pubCtx) // what is still queued is committed (and answered, if its client waited)
	pubCancel()
	stopBG()
	close(s.stopping)
	s.out.stopWatching()
	_ = s.listen.Close()
	s.replayer.Close()
	wg.Wait()
	s.tasks.close()
	stopCtx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	_ = s.eng.Stop(stopCtx)
	if runErr == nil {
		<-gnetErr
	}
	// gnet keeps every engine in a process-wide map by address until the (deprecated) global
	// Stop deletes it; each server has its own placeholder address, so without this every
	// stopped server of a process (tests) would stay in memory.
	_ = gnet.Stop(context.Background(), placeholder.addr()) //nolint:staticcheck // the only way to delete the entry
	_ = s.anchorPeer.Close()
	s.log.Debug("engine stopped")
	return runErr
}

// bindError is the cause of a failed listen, without the net package's "listen tcp …"
// prefix (the caller names the flag and address): "bind: address already in use".
func bindError(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err
	}
	return err
}

// admitRound is one round of admissions after a round of tasks that took taskTime
// (taskQueue.between); it reports whether more connections wait.
func (s *Server) admitRound(taskTime time.Duration) bool {
	if s.admitQ.len() == 0 {
		return false
	}
	s.enter()
	defer s.leave()
	return s.admitQueued(admitBudget(taskTime))
}

// drain tells every client to come back later (jittered) and every worker to fail over,
// flushes and closes, within drainTimeout. A publisher waiting for its COMMIT is answered
// (and closed) when it comes.
func (s *Server) drain() {
	done := make(chan struct{})
	s.tasks.push(func() {
		s.enter()
		defer s.leave()
		s.log.Info("shutting down: telling clients to retry", "connections", s.active, "hub_workers", s.hub.count())
		s.draining = true
		for _, sc := range s.conns {
			s.retryLater(sc, shedDraining)
		}
		s.hub.shutdown()
		close(done)
	})
	select {
	case <-done:
	case <-time.After(drainTimeout):
	}
	deadline := time.Now().Add(drainTimeout)
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
		case <-time.After(drainAskTimeout):
		}
		time.Sleep(drainPollInterval)
	}
}

// StopAccepting closes --listen: the connections open are served on, new ones go to whoever
// else listens on the port. An orphaned --procs sibling calls it (docs/scaling.md), so that a new
// set of processes can bind the port while it drains. Valid after Started.
func (s *Server) StopAccepting() {
	if ln, ok := s.sseLn.Load().(net.Listener); ok {
		_ = ln.Close() // its acceptor sees net.ErrClosed and stops
	}
}

// Started is closed once the listeners are bound and the loop runs.
func (s *Server) Started() <-chan struct{} { return s.started }

// Addr is the bound SSE address (useful with ":0"); valid after Started.
func (s *Server) Addr() net.Addr { return s.addr }

// Healthy reports whether the event loop has run recently (/healthz).
func (s *Server) Healthy() bool {
	return time.Now().UnixNano()-s.healthyAt.Load() < int64(healthyWithin)
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
