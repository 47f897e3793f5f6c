package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/engine"
)

// shortSecret is the length below which an HS256 secret is logged as weak. The defaults and
// bounds of the other flags are the engine's (engine.Default*, engine.Min*, engine.Max*).
const shortSecret = 32

// serveSetup is serve's validated configuration: everything that can be wrong with the
// flags is found while building it, before anything starts.
type serveSetup struct {
	cfg         engine.Config
	registry    *prometheus.Registry
	adminListen string
	pprof       bool
	logger      *slog.Logger
	redactor    *redactor // the secrets to keep out of logs and /debug/pprof/cmdline
	fdLimit     uint64
	algorithms  []string
	dbSource    string         // where the connection string came from: --database-url, DATABASE_URL, …
	shortSecret int            // bytes of an HS256 secret shorter than shortSecret, warned about once serving
	procs       int            // --procs: processes serving --listen (procs.go)
	sibling     *siblingMarker // this process is a sibling of --procs (set by asSibling)
	siblingCtl  *net.UnixConn  // a sibling's control socket with its first process (prochandoff.go)
	// siblingHandoffs: a successor's, the sockets its siblings take over on, by slot.
	siblingHandoffs map[int]*os.File
	cli             *cli // names each flag in errors as its value was given (cli.attribute)
}

func parseServe(args []string, env func(string) (string, bool), stdout, stderr io.Writer) (*serveSetup, error) {
	c := newCLI("serve", "[flags]", env)
	dbURL := c.dbFlag()
	listen := c.String("listen", engine.DefaultListen, "SSE listen `ADDR`")
	adminListen := c.String("admin-listen", "127.0.0.1:9090", "admin `ADDR` for /metrics, /healthz, /readyz (empty = off)")
	adminMax := c.Int("admin-max-connections", engine.DefaultAdminMaxConnections, "admin connections open at once; beyond them the admin port stops accepting")
	hubSocket := c.String("hub-socket", "", "Unix socket `PATH` for worker processes (empty = no hub)")
	hubMode := c.Mode("hub-socket-mode", engine.DefaultHubSocketMode, "permissions of the hub socket, octal")
	hubBuffer := c.Size("hub-worker-buffer", engine.DefaultHubWorkerBuffer, "outbound buffer per hub worker")
	jwtSecret := c.String("jwt-secret", "", "HS256 `SECRET` (prefer --jwt-secret-file or the variable)")
	jwtSecretFile := c.String("jwt-secret-file", "", "`FILE` holding the HS256 secret")
	jwtPubFile := c.String("jwt-public-key-file", "", "PEM public key `FILE` for RS256, ES256 (P-256) or EdDSA tokens")
	jwtIssuer := c.String("jwt-issuer", "", "required `ISS` claim")
	jwtAudience := c.String("jwt-audience", "", "required `AUD` claim")
	jwtNoExp := c.Bool("jwt-allow-no-exp", "accept tokens without exp")
	publicStreams := c.List("public-streams", "stream patterns readable without a token, comma-separated")
	corsOrigins := c.List("cors-origins", "exact origins allowed cross-origin, comma-separated")
	limit := engine.FDLimit()
	maxConns := c.Int("max-connections", 0, fmt.Sprintf("SSE connection limit (default: what RLIMIT_NOFILE leaves after the other consumers, pgsse doctor shows the budget; now %d without --hub-socket and --presence-streams)", engine.MaxConnectionsFor(limit)))
	perSubject := c.Int("max-connections-per-subject", engine.DefaultMaxConnectionsPerSubject, "SSE connections one token subject (sub, else the token) may hold at once (0 = no limit)")
	maxStreams := c.Int("max-streams-per-connection", engine.DefaultMaxStreamsPerConnection, fmt.Sprintf("streams one GET /streams?stream=…&stream=… may follow (1-%d)", engine.MaxMaxStreamsPerConnection))
	maxHeader := c.Size("max-header-bytes", engine.DefaultMaxHeaderBytes, "request head limit")
	maxPublish := c.Size("max-publish-bytes", engine.DefaultMaxPublishBytes, "request body limit of POST /streams/… and POST /publish")
	maxOutbound := c.Size("max-outbound-memory", engine.DefaultMaxOutboundMemory, "bytes queued for all SSE connections together; per-connection limits shrink as it fills")
	heartbeat := c.Duration("heartbeat", engine.DefaultHeartbeat, "comment line after this long without writes")
	retry := c.Duration("retry", engine.DefaultRetry, "the SSE retry: value sent first")
	retention := c.Duration("retention", engine.DefaultRetention, "prune durable events older than this (0 = keep)")
	pprofOn := c.Bool("pprof", "serve /debug/pprof/ on the admin address")
	logLevel := c.String("log-level", "info", "`LEVEL`: debug, info, warn or error")
	logFormat := c.String("log-format", "text", "`FORMAT`: text or json")
	demo := c.Bool("demo", "serve a demo page at /")
	presenceStreams := c.List("presence-streams", "stream patterns to keep presence for (GET /presence/…, presence=1, pgsse.presence), comma-separated")
	presenceInterval := c.Duration("presence-interval", engine.DefaultPresenceInterval, "how often each process writes its presence changes (one statement) and sends join/leave events")
	presenceMaxList := c.Int("presence-max-list", engine.DefaultPresenceMaxList, fmt.Sprintf("the most subjects GET /presence/… lists (1-%d)", engine.MaxPresenceMaxList))
	procs := c.Procs("processes serving --listen (SO_REUSEPORT), each with its own event loop and replay pool, sharing one LISTEN session; auto = one per CPU")
	c.exclusive("jwt-secret", "jwt-secret-file")

	pos, err := c.parse(args)
	if err != nil {
		return nil, c.helpTo(stdout, err)
	}
	if err := c.noArgs(pos); err != nil {
		return nil, err
	}

	s := &serveSetup{adminListen: *adminListen, pprof: *pprofOn, fdLimit: limit, procs: *procs, redactor: &redactor{}, cli: c}
	if *procs > 1 && !procsSupported {
		return nil, configErrorf("%s: more than one process needs Linux (elsewhere SO_REUSEPORT does not spread connections over processes)", c.source("procs"))
	}

	var level slog.Level
	switch strings.ToLower(*logLevel) {
	case "debug":
		level = slog.LevelDebug
	case "info":
		level = slog.LevelInfo
	case "warn", "warning":
		level = slog.LevelWarn
	case "error":
		level = slog.LevelError
	default:
		return nil, configErrorf("%s: must be debug, info, warn or error", c.source("log-level"))
	}
	opts := &slog.HandlerOptions{Level: level}
	var handler slog.Handler
	switch *logFormat {
	case "text":
		handler = slog.NewTextHandler(stderr, opts)
	case "json":
		handler = slog.NewJSONHandler(stderr, opts)
	default:
		return nil, configErrorf("%s: must be text or json", c.source("log-format"))
	}
	// Every line is redacted; the secrets are registered below, before anything is logged.
	s.logger = slog.New(redactingHandler{inner: handler, r: s.redactor})

	dsn, pgcfg, err := c.database(*dbURL)
	if err != nil {
		return nil, err
	}
	s.dbSource = c.dbSource
	s.redactor.add(pgcfg.Password)
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok {
			s.redactor.add(pw)
		}
	}

	if err := checkHostPort(*listen); err != nil {
		return nil, configErrorf("%s: %v", c.source("listen"), err)
	}
	if *adminListen != "" {
		if err := checkHostPort(*adminListen); err != nil {
			return nil, configErrorf("%s: %v", c.source("admin-listen"), err)
		}
	} else if *pprofOn {
		return nil, configErrorf("%s needs an admin address (--admin-listen)", c.source("pprof"))
	}
	if *hubSocket != "" && len(*hubSocket) > 107 {
		return nil, configErrorf("%s: path is %d bytes; Unix socket paths are limited to 107", c.source("hub-socket"), len(*hubSocket))
	}
	if *hubBuffer < engine.MinHubWorkerBuffer || *hubBuffer > engine.MaxHubWorkerBuffer {
		return nil, configErrorf("%s: must be between %d (two maximum frames) and %s", c.source("hub-worker-buffer"), engine.MinHubWorkerBuffer, formatSize(engine.MaxHubWorkerBuffer))
	}
	if *maxOutbound < engine.MinMaxOutboundMemory || *maxOutbound > engine.MaxMaxOutboundMemory {
		return nil, configErrorf("%s: must be between %s and %s", c.source("max-outbound-memory"), formatSize(engine.MinMaxOutboundMemory), formatSize(engine.MaxMaxOutboundMemory))
	}
	if *maxStreams < 1 || *maxStreams > engine.MaxMaxStreamsPerConnection {
		return nil, configErrorf("%s: must be between 1 and %d", c.source("max-streams-per-connection"), engine.MaxMaxStreamsPerConnection)
	}
	if *maxHeader < engine.MinMaxHeaderBytes || *maxHeader > engine.MaxMaxHeaderBytes {
		return nil, configErrorf("%s: must be between %d and %d", c.source("max-header-bytes"), engine.MinMaxHeaderBytes, engine.MaxMaxHeaderBytes)
	}
	if *maxPublish < engine.MinMaxPublishBytes || *maxPublish > engine.MaxMaxPublishBytes {
		return nil, configErrorf("%s: must be between %d and %s", c.source("max-publish-bytes"), engine.MinMaxPublishBytes, formatSize(engine.MaxMaxPublishBytes))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
		zero bool
	}{{"heartbeat", *heartbeat, false}, {"retry", *retry, false}, {"retention", *retention, true}} {
		switch {
		case d.v < 0 || (d.v == 0 && !d.zero):
			return nil, configErrorf("%s: must be positive", c.source(d.name))
		case d.name == "retry" && d.v < engine.MinRetry:
			return nil, configErrorf("%s: must be at least %s", c.source(d.name), engine.MinRetry)
		case d.name == "heartbeat" && d.v < engine.MinHeartbeat:
			return nil, configErrorf("%s: must be at least %s", c.source(d.name), engine.MinHeartbeat)
		case d.name != "retention" && d.v > engine.MaxInterval:
			return nil, configErrorf("%s: must be at most %s", c.source(d.name), engine.MaxInterval)
		}
	}

	for _, p := range *presenceStreams {
		if err := checkStreamPattern(p); err != nil {
			return nil, configErrorf("%s: %v", c.source("presence-streams"), err)
		}
	}
	if *presenceInterval < engine.MinPresenceInterval || *presenceInterval > engine.MaxPresenceInterval {
		return nil, configErrorf("%s: must be between %s and %s", c.source("presence-interval"), engine.MinPresenceInterval, engine.MaxPresenceInterval)
	}
	if *presenceMaxList < 1 || *presenceMaxList > engine.MaxPresenceMaxList {
		return nil, configErrorf("%s: must be between 1 and %d", c.source("presence-max-list"), engine.MaxPresenceMaxList)
	}

	if *adminMax < 1 {
		return nil, configErrorf("%s: must be at least 1", c.source("admin-max-connections"))
	}

	// The connection limit: what the fd limit allows after every other consumer's share.
	budget := engine.Config{HubSocket: *hubSocket, AdminMaxConnections: *adminMax, PresenceStreams: *presenceStreams}.FDBudget(limit)
	allowed := budget.MaxConnections
	conns := *maxConns
	if c.isSet("max-connections") {
		switch {
		case conns < 1:
			return nil, configErrorf("%s: must be at least 1", c.source("max-connections"))
		case limit > 0 && conns > allowed:
			return nil, configErrorf("%s: %d exceeds what the file-descriptor limit allows (RLIMIT_NOFILE %d − %d reserved = %d; pgsse doctor shows the budget); raise the limit (ulimit -n, LimitNOFILE=)",
				c.source("max-connections"), conns, limit, budget.Reserved(), allowed)
		}
	} else {
		if allowed < 1 {
			return nil, configErrorf("file-descriptor limit %d is too low: need more than %d (ulimit -n, LimitNOFILE=; pgsse doctor shows the budget)", limit, budget.Reserved())
		}
		conns = allowed
	}

	if *perSubject < 0 {
		return nil, configErrorf("%s: must not be negative (0 = no limit)", c.source("max-connections-per-subject"))
	}
	if *perSubject == 0 {
		*perSubject = engine.NoLimit
	}

	// Authorization.
	secret, err := c.secret(*jwtSecret, *jwtSecretFile)
	if err != nil {
		return nil, err
	}
	s.redactor.add(string(secret))
	var pub []byte
	if *jwtPubFile != "" {
		if pub, err = c.readKeyFile("jwt-public-key-file", *jwtPubFile); err != nil {
			return nil, err
		}
		if _, _, err := auth.ParsePublicKeyPEM(pub); err != nil {
			return nil, configErrorf("%s: %v", c.source("jwt-public-key-file"), err)
		}
	}
	for _, p := range *publicStreams {
		if err := checkStreamPattern(p); err != nil {
			return nil, configErrorf("%s: %v", c.source("public-streams"), err)
		}
	}
	if secret == nil && pub == nil && len(*publicStreams) == 0 {
		return nil, configErrorf("no JWT key: set --jwt-secret, --jwt-secret-file or --jwt-public-key-file (or --public-streams for token-free streams)")
	}
	ac := auth.Config{Secret: secret, PublicKeyPEM: pub, Issuer: *jwtIssuer, Audience: *jwtAudience, AllowNoExp: *jwtNoExp}
	if secret != nil || pub != nil {
		v, err := auth.NewVerifier(ac)
		if err != nil {
			return nil, configErrorf("%v", err)
		}
		s.algorithms = v.Algorithms()
	}
	if secret != nil && len(secret) < shortSecret {
		s.shortSecret = len(secret) // warned once serving: a start that fails says one line only
	}
	for _, o := range *corsOrigins {
		if err := checkOrigin(o); err != nil {
			return nil, configErrorf("%s: %v", c.source("cors-origins"), err)
		}
	}

	s.registry = prometheus.NewRegistry()
	s.registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	s.cfg = engine.Config{
		DatabaseURL:              dsn,
		Listen:                   *listen,
		HubSocket:                *hubSocket,
		HubSocketMode:            *hubMode,
		HubWorkerBuffer:          int(*hubBuffer),
		Auth:                     ac,
		PublicStreams:            *publicStreams,
		CORSOrigins:              *corsOrigins,
		MaxConnections:           conns,
		MaxConnectionsPerSubject: *perSubject,
		AdminMaxConnections:      *adminMax,
		MaxStreamsPerConnection:  *maxStreams,
		MaxHeaderBytes:           int(*maxHeader),
		MaxPublishBytes:          *maxPublish,
		// The Go heap follows the budget unless the operator chose a memory limit.
		MaxOutboundMemory: int(*maxOutbound),
		GoMemoryLimit:     os.Getenv("GOMEMLIMIT") == "",
		Heartbeat:         *heartbeat,
		Retry:             *retry,
		Retention:         *retention,
		Demo:              *demo,
		PresenceStreams:   *presenceStreams,
		PresenceInterval:  *presenceInterval,
		PresenceMaxList:   *presenceMaxList,
		Logger:            s.logger,
		Registry:          s.registry,
	}
	return s, nil
}

// memoryLimitSource says who sets the Go runtime's soft memory limit.
func memoryLimitSource(engineSets bool) string {
	if engineSets {
		return "follows --max-outbound-memory"
	}
	return "GOMEMLIMIT"
}

func checkHostPort(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("invalid address %q (want host:port, e.g. :8080)", addr)
	}
	if _, err := net.LookupPort("tcp", port); err != nil {
		return fmt.Errorf("invalid port in %q", addr)
	}
	return nil
}

// probe is what the admin endpoints ask of the engine.
type probe interface {
	Healthy() bool
	Ready() bool
}

// notReadyReason is optional: an engine that can say why it is not ready.
type notReadyReason interface{ NotReadyReason() string }

// adminHandler serves docs/operations.md, Health, metrics and logs: /metrics, /healthz, /readyz
// and, with pprof, /debug/pprof/ (whose cmdline is redacted with red).
func adminHandler(p probe, g prometheus.Gatherer, withPprof bool, red *redactor) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if !p.Healthy() {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "event loop not responding\n")
			return
		}
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if !p.Ready() {
			reason := "not ready: LISTEN session down or schema not at the expected version"
			if r, ok := p.(notReadyReason); ok {
				if s := r.NotReadyReason(); s != "" {
					reason = "not ready: " + oneLine(s)
				}
			}
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, reason+"\n")
			return
		}
		io.WriteString(w, "ok\n")
	})
	if withPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", cmdlineHandler(red))
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// cmdServe runs `pgsse serve`: 0 after a graceful stop, 1 on a runtime error. With --procs
// N > 1 it also supervises N−1 sibling processes; in a sibling (siblingEnv set) it serves
// without an admin endpoint, fed by the first process's hub (procs.go).
func cmdServe(ctx context.Context, args []string, env func(string) (string, bool), stdout, stderr io.Writer) error {
	s, err := parseServe(args, env, stdout, stderr)
	if err != nil {
		return err
	}
	marker, err := readSiblingMarker(env)
	var su *successor
	if err == nil && marker != nil {
		err = s.asSibling(marker)
		if err == nil && marker.Handoff {
			switch os.Getenv(handoffSiblingExitEnv) {
			case "":
			case "hang":
				time.Sleep(time.Hour) // never ready: the predecessor's readiness timeout ends it
			default:
				return configErrorf("%s is set: this sibling exits at once", handoffSiblingExitEnv)
			}
			su, err = s.asSuccessor(siblingHandoffFD, siblingSuccessorMarker(marker))
		}
	}
	if err == nil && marker == nil {
		var hm *handoffMarker
		if hm, err = readHandoffMarker(env); err == nil && hm != nil {
			su, err = s.asSuccessor(handoffCtrlFD, hm)
		}
	}
	if err != nil {
		return configErrorf("%v", err)
	}
	log := s.logger
	slog.SetDefault(log)

	srv, err := engine.New(s.cfg)
	if err != nil {
		return configErrorf("%s", s.cli.attribute(oneLine(err.Error())))
	}

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	usr2 := make(chan os.Signal, 1) // SIGUSR2: hand everything to a successor (handoff.go)
	signal.Notify(usr2, syscall.SIGUSR2)
	defer signal.Stop(usr2)

	var sup *supervisor
	gatherer := prometheus.Gatherer(s.registry)
	if s.procs > 1 {
		if sup, err = newSupervisor(s.procs, args, os.Environ(), stdout, stderr, log, s.registry); err != nil {
			log.Error("cannot prepare the sibling processes", "err", err)
			return errReported
		}
		defer sup.stop()
		sup.setHandoffs(s.siblingHandoffs)
		gatherer = procsGatherer{own: s.registry, sup: sup}
	}

	var admin *http.Server
	adminDone := make(chan error, 1)
	adminAddr := ""
	var adminRaw net.Listener
	if s.adminListen != "" {
		var ln net.Listener
		var err error
		if su != nil && su.admin != nil {
			ln = su.admin // the predecessor's, inherited
		} else {
			ln, err = net.Listen("tcp", s.adminListen)
		}
		if err != nil {
			// One line naming the flag, as the engine's for --listen and --hub-socket.
			var op *net.OpError
			if errors.As(err, &op) {
				err = op.Err // "bind: address already in use", without net's "listen tcp ADDR: "
			}
			log.Error("pgsse cannot start", "err", fmt.Sprintf("%s %s: admin server cannot listen: %v", s.cli.source("admin-listen"), s.adminListen, err))
			return errReported
		}
		adminAddr = ln.Addr().String()
		adminRaw = ln
		conns := newAdminConns()
		adminLn, err := newEvictingListener(ln, srv.AdminListener(ln), s.cfg.AdminMaxConnections, conns)
		if err != nil {
			_ = ln.Close()
			log.Error("pgsse cannot start", "err", fmt.Sprintf("%s %s: %v", s.cli.source("admin-listen"), s.adminListen, err))
			return errReported
		}
		admin = &http.Server{
			Handler:           adminHandler(srv, gatherer, s.pprof, s.redactor),
			ReadHeaderTimeout: adminReadHeaderTimeout,
			IdleTimeout:       adminIdleTimeout,
			MaxHeaderBytes:    16 << 10,
			ConnState:         conns.connState,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		}
		go func() { adminDone <- admin.Serve(adminLn) }()
	}
	var orphaned <-chan struct{}
	if s.sibling != nil {
		gone, stopWatch := watchParent(s.sibling.Parent, log)
		defer stopWatch()
		orphaned = gone
	}

	// The engine runs until told: on SIGTERM the siblings are drained before it.
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRun()
	runDone := make(chan error, 1)
	go func() { runDone <- srv.Run(runCtx) }()

	var runErr error
	started := false
	select {
	case <-srv.Started():
		started = true
		addr := s.cfg.Listen
		if a := srv.Addr(); a != nil {
			addr = a.String()
		}
		log.Info("pgsse serving", "pid", os.Getpid(),
			"listen", addr, "admin", adminAddr, "hub_socket", s.cfg.HubSocket, "procs", s.procs,
			"max_connections", s.cfg.MaxConnections, "fd_limit", s.fdLimit,
			"max_header_bytes", s.cfg.MaxHeaderBytes, "hub_worker_buffer", s.cfg.HubWorkerBuffer,
			"max_outbound_memory", s.cfg.MaxOutboundMemory, "go_memory_limit", memoryLimitSource(s.cfg.GoMemoryLimit),
			"heartbeat", s.cfg.Heartbeat.String(), "retry", s.cfg.Retry.String(), "retention", s.cfg.Retention.String(),
			"jwt", strings.Join(s.algorithms, ","), "public_streams", len(s.cfg.PublicStreams))
		if s.shortSecret > 0 && s.sibling == nil {
			log.Warn("the HS256 secret is short; use at least 32 random bytes", "bytes", s.shortSecret)
		}
		if s.cli.dbNone && s.sibling == nil {
			log.Warn(noDatabaseHint, "trying", s.cli.triedDefaults())
		}
		if sup != nil {
			sup.start(srv, siblingListen(s.cfg.Listen, srv.Addr()))
		}
		if s.sibling != nil {
			// Only now: a sibling in the first process's metrics is one that serves.
			if stopMetrics, err := serveSiblingMetrics(s.sibling, s.registry, log); err != nil {
				log.Error("cannot serve the sibling's metrics; the first process's /metrics will leave this process out", "err", err)
			} else {
				defer stopMetrics()
			}
		}
		handed := make(chan bool, 1)
		var ho *handoffer
		if s.sibling == nil {
			ho = &handoffer{log: log, srv: srv, adminLn: adminRaw, procs: s.procs, sup: sup,
				stdout: fileOr(stdout, os.Stdout), stderr: fileOr(stderr, os.Stderr)}
		}
		var sh *siblingHandoff
		if s.siblingCtl != nil {
			sh = &siblingHandoff{log: log, srv: srv, ctl: s.siblingCtl, cmds: make(chan byte, 1), handed: handed}
			sh.busy.Store(su != nil) // no handover of ours while we take over
			go sh.serve()
			defer s.siblingCtl.Close()
		}
		if su != nil {
			if ho != nil {
				ho.busy.Store(true) // no handoff of ours while we take over
			}
			go func() {
				su.takeOver(srv, log, stop)
				if ho != nil {
					ho.busy.Store(false)
				}
				if sh != nil {
					sh.busy.Store(false)
				}
				if sup != nil {
					sup.releaseRestarts()
				}
			}()
		} else if s.sibling == nil {
			handoffNotify("READY=1", log)
		}
		var ended bool
		runErr, ended = waitServe(ctx, stop, runDone, orphaned, srv, s.sibling, log, usr2, ho, handed)
		if sup != nil {
			sup.stop() // the siblings drain first: none of them fails over on the way down
		}
		if !ended {
			stopRun()
			runErr = <-runDone
		}
	case runErr = <-runDone:
	case err := <-adminDone:
		log.Error("admin server failed", "err", err)
		stop()
		stopRun()
		<-runDone
		return errReported
	}

	if admin != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = admin.Shutdown(sctx)
		cancel()
	}
	if errors.Is(runErr, engine.ErrDatabaseRefused) {
		runErr = fmt.Errorf("%s: %w", s.dbSource, runErr) // the one line names where the database came from
	}
	if runErr != nil {
		msg := "pgsse stopped"
		if !started {
			msg = "pgsse cannot start"
		}
		// The engine names --listen and --hub-socket; attribute says which came from a variable.
		log.Error(msg, "err", s.cli.attribute(runErr.Error()))
		return errReported
	}
	return nil
}

// waitServe waits while the engine serves: for a signal (stop makes a second one kill the
// process the default way), the engine's own end (ended, with its error), a handoff that has
// handed everything over (handed: SIGUSR2 in the first process, its 'P' in a sibling), or — in
// a sibling — the first process's death plus orphanGrace. An orphaned sibling stops accepting at once
// (srv.StopAccepting) and serves the connections it has until then, so that a new set of
// processes started meanwhile can bind --listen (docs/scaling.md).
func waitServe(ctx context.Context, stop func(), runDone <-chan error, orphaned <-chan struct{}, srv interface{ StopAccepting() }, m *siblingMarker, log *slog.Logger,
	usr2 <-chan os.Signal, ho *handoffer, handed chan bool) (err error, ended bool) {
	var graceOver <-chan time.Time
	for {
		select {
		case <-usr2:
			if ho == nil {
				log.Warn("SIGUSR2 ignored: the first process of --procs hands over (docs/operations.md, Upgrading without disconnects)")
				continue
			}
			ho.start(handed)
		case ok := <-handed:
			if ok {
				return nil, false // the successor serves everything: drain what is left, exit 0
			}
		case <-ctx.Done():
			stop()
			return nil, false
		case err := <-runDone:
			if err == nil {
				err = errors.New("engine: stopped unasked")
			}
			return err, true
		case <-orphaned:
			orphaned = nil
			srv.StopAccepting()
			log.Warn("the first process is gone: no longer accepting on --listen (a new pgsse serve may bind it); serving our connections on with a LISTEN session of our own, then draining",
				"err", errOrphan, "parent", m.Parent, "drain_in", orphanGrace)
			graceOver = time.After(orphanGrace)
		case <-graceOver:
			log.Info("draining: the first process has been gone for the grace period", "grace", orphanGrace)
			return nil, false
		}
	}
}

var _ probe = (*engine.Server)(nil)

// fileOr is w if it is a file (a successor inherits it), else def.
func fileOr(w io.Writer, def *os.File) *os.File {
	if f, ok := w.(*os.File); ok {
		return f
	}
	return def
}
