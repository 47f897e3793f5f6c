package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/store"
)

// Shutdown and health timing.
const (
	drainTimeout      = 5 * time.Second       // told-to-retry clients and workers have this long to be flushed
	drainAskTimeout   = time.Second           // one "how many are left" question to the loop
	drainPollInterval = 20 * time.Millisecond // between those questions
	stopTimeout       = 5 * time.Second       // gnet's own stop
	healthyWithin     = 5 * time.Second       // /healthz: the loop ran a tick this recently
)

// Server is one pgsse serve process: the gnet loop with its SSE listener and hub socket,
// the LISTEN session, the replay pool and the retention job.
//
// The loop's state lives in its parts (docs/architecture.md, The engine in parts), each a
// type that owns its fields and reaches the others only through their methods; Server wires
// them together, runs the loop (gnet's callbacks, the task queue, the tick) and starts and
// stops the goroutines beside it. Every part is touched only on the loop goroutine
// (docs/architecture.md, invariant 1); other goroutines hand work over through tasks.
type Server struct {
	*loopEnv
	sseAddrs connAddrs // the SSE connections' addresses, made small (accept.go)

	// The parts.
	conns connTable     // the SSE port's connections and their state machine (sseconn.go)
	req   requests      // request heads: routing, authorisation (request.go)
	tok   tokens        // token checks off the loop (verify.go)
	adm   admission     // who becomes a subscriber, and when (admission.go)
	pub   publishing    // POST /streams/… and /publish (publish.go)
	subs  subscriptions // each subscription's cursor, catch-up, lagging and gaps (subscription.go, catchup.go)
	fan   fanout        // streams and channels: live events, encoded once, to their subscriptions (fanout.go)
	chans channelTable  // raw channels and their LISTEN (channels.go)
	lsn   listenState   // the LISTEN source and its events (listen.go)
	out   outbound      // the write path and the memory budget (outbound.go, budget.go)
	hub   hubServer     // the hub server (hubserver.go)
	tr    sseTransport  // how events become bytes (transport_sse.go)
	ans   httpAnswers   // the port's HTTP answers (transport_sse.go)
	pres  presenceTable // presence: counts, views, events, the writer (presence.go, presencewriter.go)

	hubSocket hubSocket // the hub's Unix socket file (hubsocket.go)

	loopsReady chan struct{}
	loopsOnce  sync.Once
	started    chan struct{}
	addr       net.Addr
	eng        gnet.Engine
	anchor     gnet.Conn
	anchorPeer net.Conn

	sseLn     atomic.Value  // net.Listener: --listen, once bound (StopAccepting)
	hubLn     atomic.Value  // net.Listener: the hub socket, once bound (StopAcceptingAll)
	handedOff atomic.Bool   // the listeners went to a successor (handoff.go): leave the hub socket's file
	healthyAt atomic.Int64  // unix nanoseconds of the last tick the loop ran
	needPoll  atomic.Bool   // someone waits for a socket to drain: tick fast (ticker)
	pollNow   chan struct{} // wakes the ticker when needPoll turns on
	schemaOK  atomic.Bool
	schemaMsg atomic.Value // string: why the schema is not ready
	// schemaLogged: when "not ready" was last logged (schema.go)
	schemaLogged atomic.Pointer[time.Time]

	// loop-owned
	lastSweepMS int64 // when the sweep last ran (tick)
	depth       int   // nesting of enter/leave
}

// New checks cfg and prepares a Server; nothing is started until Run.
func New(cfg Config) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	env := &loopEnv{
		cfg:   cfg,
		log:   slog.New(newRepeatLimiter(cfg.Logger.Handler(), logRepeatEvery)),
		tasks: newTaskQueue(),
	}
	s := &Server{
		loopEnv:    env,
		loopsReady: make(chan struct{}),
		pollNow:    make(chan struct{}, 1),
		started:    make(chan struct{}),
	}
	if env.metrics, err = newMetrics(cfg.Registry, s); err != nil {
		return nil, err
	}
	env.stages = newStageClock(env.metrics.publishStages)
	var verifier *auth.Verifier
	if len(cfg.Auth.Secret) > 0 || len(cfg.Auth.PublicKeyPEM) > 0 {
		if verifier, err = auth.NewVerifier(cfg.Auth); err != nil {
			return nil, err
		}
	}
	s.tr = newSSETransport()
	s.ans = newHTTPAnswers()
	s.conns = connTable{loopEnv: env, out: &s.out, tr: &s.tr, adm: &s.adm, pub: &s.pub, subs: &s.subs, lsn: &s.lsn, pres: &s.pres}
	s.req = requests{loopEnv: env, conns: &s.conns, adm: &s.adm, tok: &s.tok, pub: &s.pub, ans: &s.ans, pres: &s.pres}
	s.tok = tokens{loopEnv: env, verifier: verifier}
	s.adm = admission{loopEnv: env, conns: &s.conns, subs: &s.subs, pub: &s.pub, lsn: &s.lsn, pres: &s.pres, subjects: make(map[string]int32)}
	s.pub = newPublishing(env, &s.conns, &s.req, &s.tok, &s.adm, &s.ans, &s.fan)
	s.subs = subscriptions{loopEnv: env, conns: &s.conns, out: &s.out, fan: &s.fan, chans: &s.chans, lsn: &s.lsn, tr: &s.tr}
	s.fan = fanout{loopEnv: env, subs: &s.subs, chans: &s.chans, out: &s.out, tr: &s.tr, lsn: &s.lsn, streams: make(map[string]*stream), between: s.pub.answerQueued, sliceSubs: flushSliceSubs}
	s.chans = newChannelTable(env, &s.lsn, &s.fan, &s.hub)
	s.lsn = newListenState(env, &s.fan, &s.chans, &s.hub, &s.pres)
	s.pres = newPresenceTable(env, &s.conns, &s.tr, &s.ans)
	s.out = newOutbound(env, &s.conns)
	s.hub = newHubServer(env, &s.chans, &s.lsn, &s.out)
	s.tasks.enter, s.tasks.leave = s.enter, s.leave
	s.tasks.between = s.admitRound
	s.schemaMsg.Store("schema not checked yet")
	return s, nil
}

// Run serves until ctx is cancelled, then shuts down gracefully (docs/http.md, Responses and
// errors: SIGTERM) and returns nil; it returns an error if the server cannot start or fails.
func (s *Server) Run(ctx context.Context) error {
	// Bind first, each socket under its own flag's name: nothing else has started if one fails.
	inh := s.cfg.Inherited
	var sseLn net.Listener
	var err error
	if inh != nil {
		sseLn = inh.SSE
	} else if sseLn, err = listenSSE(s.cfg.Listen, s.cfg.ShareListen, s.cfg.SSESendBuffer); err != nil {
		return fmt.Errorf("--listen %s: %w", s.cfg.Listen, bindError(err))
	}
	defer sseLn.Close()
	s.sseLn.Store(sseLn)
	var hubLn net.Listener
	if inh != nil && inh.Hub != nil {
		// The predecessor's hub socket: its file is in place; it is ours to remove as we stop
		// for good (not when we hand it on in turn).
		hubLn = inh.Hub
		s.hubLn.Store(hubLn)
		defer hubLn.Close()
		defer func() {
			if !s.handedOff.Load() {
				_ = os.Remove(s.cfg.HubSocket)
			}
		}()
	} else if s.cfg.HubSocket != "" {
		cleanup, err := s.hubSocket.prepare(s.cfg.HubSocket, s.cfg.HubSocketMode, s.log)
		if err != nil {
			return err
		}
		defer func() {
			if !s.handedOff.Load() {
				cleanup()
			}
		}()
		hubLn, err = net.Listen("unix", s.cfg.HubSocket)
		s.hubSocket.bound(s.log)
		if err != nil {
			return fmt.Errorf("--hub-socket %s: %w", s.cfg.HubSocket, bindError(err))
		}
		if ul, ok := hubLn.(*net.UnixListener); ok {
			s.hubLn.Store(ul)
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
	s.lsn.downSince(s.nowMS)
	if err := s.out.init(); err != nil {
		return fmt.Errorf("engine: epoll set for SSE writes: %w", err)
	}
	defer s.out.close()
	s.tok.start()
	defer s.tok.stop()
	s.replayer = store.NewReplayer(s.cfg.DatabaseURL, s.cfg.ReplayPoolSize, s.log)
	if s.pres.enabled() {
		if err := s.pres.newWriter(sseLn.Addr()); err != nil {
			s.replayer.Close()
			return fmt.Errorf("--presence-streams: %w", err)
		}
	}
	s.lsn.open()
	abort := func(err error) error {
		s.lsn.close()
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

	acceptors := []*acceptor{s.newAcceptor("--listen "+s.addr.String(), sseLn, originSSE, s.conns.openCounter(),
		func() int64 { return int64(s.cfg.MaxConnections + shedSlack) })}
	if hubLn != nil {
		acceptors = append(acceptors, s.newAcceptor("--hub-socket "+s.cfg.HubSocket, hubLn, originHub, s.hub.openCounter(),
			func() int64 { return int64(s.cfg.hubWorkers + hubShedSlack) }))
	}
	gate := startAcceptors(acceptors, inh)

	s.lsn.start()

	bg, stopBG := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(4)
	go func() { defer wg.Done(); s.ticker(bg) }()
	go func() { defer wg.Done(); s.checkSchema(bg) }()
	go func() { defer wg.Done(); s.out.keepMemory(bg) }()
	go func() { defer wg.Done(); s.out.watchWritable(bg) }()
	if s.pres.writing() {
		wg.Add(1)
		go func() { defer wg.Done(); s.pres.runWriter(bg) }()
	}
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
	gate.close()
	for _, a := range acceptors {
		a.close()
	}
	pubCtx, pubCancel := context.WithTimeout(context.Background(), drainTimeout)
	s.pub.stopPublisher(pubCtx) // what is still queued is committed (and answered, if its client waited)
	pubCancel()
	stopBG()
	s.out.stopWatching()
	s.lsn.close()
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

// acceptGate starts the acceptors, at once or — in a successor — once the predecessor has
// stopped accepting (Inheritance.Accept); close settles it before the acceptors are closed.
type acceptGate struct {
	mu      sync.Mutex
	settled bool
	stop    chan struct{}
}

func startAcceptors(acceptors []*acceptor, inh *Inheritance) *acceptGate {
	g := &acceptGate{stop: make(chan struct{})}
	run := func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.settled {
			return
		}
		g.settled = true
		for _, a := range acceptors {
			a.start()
		}
	}
	if inh == nil || inh.Accept == nil {
		run()
		return g
	}
	go func() {
		select {
		case <-inh.Accept:
			run()
		case <-g.stop:
		}
	}()
	return g
}

func (g *acceptGate) close() {
	close(g.stop)
	g.mu.Lock()
	g.settled = true
	g.mu.Unlock()
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
	if s.adm.waiting() == 0 {
		return false
	}
	s.enter()
	defer s.leave()
	return s.adm.round(admitBudget(taskTime))
}

// drain tells every client to come back later (jittered) and every worker to fail over,
// flushes and closes, within drainTimeout. A publisher waiting for its COMMIT is answered
// (and closed) when it comes.
func (s *Server) drain() {
	done := make(chan struct{})
	s.tasks.push(func() {
		if n, w := s.conns.subscribers(), s.hub.count(); n > 0 || w > 0 {
			s.log.Info("shutting down: telling clients to retry", "connections", n, "hub_workers", w)
		} else {
			s.log.Info("shutting down: no client left to tell") // after a handoff, the usual case
		}
		s.draining = true
		s.conns.retryAll(shedDraining)
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
		if !s.tasks.push(func() { left <- s.conns.count() + s.hub.count() }) {
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

// AddSibling enrols c — this process's end of a socketpair whose other end a sibling
// process of --procs inherited (Config.SiblingHub there) — as a hub worker allowed to
// subscribe to the stream channel. Nothing but that socket carries the privilege: an outside
// worker can only reach the hub through --hub-socket. Call it after Started; c is closed
// (gnet keeps a duplicate).
func (s *Server) AddSibling(c net.Conn) error {
	select {
	case <-s.started:
	default:
		_ = c.Close()
		return errors.New("engine: AddSibling before the server started")
	}
	res, err := s.eng.Register(gnet.NewNetConnContext(gnet.NewContext(context.Background(), originSibling), c))
	if err != nil {
		_ = c.Close()
		return fmt.Errorf("engine: enrol a sibling's hub connection: %w", err)
	}
	if r := <-res; r.Err != nil {
		return fmt.Errorf("engine: enrol a sibling's hub connection: %w", r.Err)
	}
	return nil
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
func (s *Server) Ready() bool { return s.lsn.ok() && s.schemaOK.Load() }

// NotReadyReason says why Ready is false, in one line.
func (s *Server) NotReadyReason() string {
	switch {
	case !s.lsn.ok():
		return "LISTEN session is down"
	case !s.schemaOK.Load():
		return s.schemaMsg.Load().(string)
	}
	return ""
}
