package engine

import (
	"errors"
	"log/slog"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/framing"
)

// Config is everything `pgsse serve` configures (SPEC §6). cmd/pgsse fills it from flags
// and PGSSE_* variables; New checks it and fills defaults for zero values.
type Config struct {
	DatabaseURL string // "" = libpq environment (PGHOST, …)

	Listen          string      // SSE address, default DefaultListen
	HubSocket       string      // Unix socket path for worker processes; "" = no hub
	HubSocketMode   os.FileMode // default DefaultHubSocketMode
	HubWorkerBuffer int         // bytes per worker outbound ring, default DefaultHubWorkerBuffer

	Auth          auth.Config
	PublicStreams []string // patterns that need no token
	CORSOrigins   []string // exact origins allowed to read streams cross-origin

	MaxConnections int // SSE connections; default MaxConnectionsFor(FDLimit())
	// MaxConnectionsPerSubject caps the SSE connections of one token subject (SPEC §3b);
	// default DefaultMaxConnectionsPerSubject, NoLimit for none.
	MaxConnectionsPerSubject int
	MaxHeaderBytes           int           // request head limit, default DefaultMaxHeaderBytes
	Heartbeat                time.Duration // default DefaultHeartbeat
	Retry                    time.Duration // the retry: field, default DefaultRetry
	Retention                time.Duration // prune events older than this; 0 = keep forever (the CLI's default is DefaultRetention)
	Demo                     bool          // serve the demo page at /

	ReplayPoolSize int // replay connections (application_name pgsse-replay), default DefaultReplayPoolSize

	Logger   *slog.Logger          // default slog.Default()
	Registry prometheus.Registerer // where metrics are registered; nil = a private registry
}

// Defaults (SPEC §6): the CLI's flag defaults, and what New fills in for a zero field.
const (
	DefaultListen                      = ":8080"
	DefaultHubSocketMode   os.FileMode = 0o600
	DefaultHubWorkerBuffer             = 1 << 20 // bytes
	DefaultMaxHeaderBytes              = 8192
	DefaultHeartbeat                   = 15 * time.Second
	DefaultRetry                       = 2 * time.Second
	DefaultRetention                   = 24 * time.Hour
	DefaultReplayPoolSize              = 4
	// DefaultMaxConnectionsPerSubject is --max-connections-per-subject's default (0 on the
	// command line is NoLimit).
	DefaultMaxConnectionsPerSubject = 256
)

// NoLimit in a Config limit field means "no limit" (the zero value means "the default").
const NoLimit = -1

// Bounds on Config values. New refuses values outside them; the CLI checks the same bounds
// first so that its message names the flag or variable that was set.
const (
	MinHubWorkerBuffer = 2 * (framing.HeaderLen + framing.MaxBody) // two maximal frames, bytes
	MaxHubWorkerBuffer = 1 << 30                                   // bytes
	MinMaxHeaderBytes  = 1024
	MaxMaxHeaderBytes  = 1 << 20
	MinHeartbeat       = 100 * time.Millisecond
	MinRetry           = time.Millisecond
	MaxInterval        = 24 * time.Hour // the longest --heartbeat and --retry
)

// The descriptor budget (SPEC §3b "Descriptors"). Of RLIMIT_NOFILE, FDReserve descriptors
// are kept for everything that is not an admitted SSE connection; the rest is the default
// --max-connections.
const (
	// fdOtherReserve covers the LISTEN session, the replay pool, hub workers, the listeners,
	// the admin server and files.
	fdOtherReserve = 512
	// shedSlack is how many connections beyond MaxConnections may be open at once while they
	// are told to retry elsewhere; beyond that a new connection is closed unread.
	shedSlack = 256
	// FDReserve is what MaxConnectionsFor keeps back from the descriptor limit.
	FDReserve = fdOtherReserve + shedSlack
	// fdLimitCap is where a huge limit (RLIM_INFINITY) stops counting.
	fdLimitCap = 1 << 24
	// unknownFDLimitConnections is the default when the limit cannot be read; the accept
	// path sheds on EMFILE anyway.
	unknownFDLimitConnections = 10_000
)

// FDLimit is the soft RLIMIT_NOFILE (the Go runtime has already raised it to the hard limit
// at start-up), or 0 if it cannot be read.
func FDLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	return rl.Cur
}

// MaxConnectionsFor is the default --max-connections for a descriptor limit: the limit
// (capped at 2^24) minus FDReserve; 0 when the limit leaves no room; 10,000 when the limit is
// unknown (0). `pgsse serve`, `pgsse doctor` and New all derive it here.
func MaxConnectionsFor(fdLimit uint64) int {
	switch {
	case fdLimit == 0:
		return unknownFDLimitConnections
	case fdLimit > fdLimitCap:
		fdLimit = fdLimitCap
	}
	if fdLimit <= FDReserve {
		return 0
	}
	return int(fdLimit - FDReserve)
}

// withDefaults fills zero fields and checks the bounds; the error names the flag.
func (cfg Config) withDefaults() (Config, error) {
	orDefault(&cfg.Listen, DefaultListen)
	orDefault(&cfg.HubSocketMode, DefaultHubSocketMode)
	orDefault(&cfg.HubWorkerBuffer, DefaultHubWorkerBuffer)
	orDefault(&cfg.MaxHeaderBytes, DefaultMaxHeaderBytes)
	orDefault(&cfg.Heartbeat, DefaultHeartbeat)
	orDefault(&cfg.Retry, DefaultRetry)
	orDefault(&cfg.ReplayPoolSize, DefaultReplayPoolSize)
	orDefault(&cfg.MaxConnectionsPerSubject, DefaultMaxConnectionsPerSubject)
	if cfg.MaxConnections == 0 {
		limit := FDLimit()
		if cfg.MaxConnections = MaxConnectionsFor(limit); cfg.MaxConnections < 1 {
			return cfg, errors.New("--max-connections: the file-descriptor limit " + strconv.FormatUint(limit, 10) +
				" leaves no room after the " + strconv.Itoa(FDReserve) + " reserved")
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	switch {
	case cfg.MaxConnections < 1:
		return cfg, errors.New("--max-connections: must be at least 1")
	case cfg.MaxConnectionsPerSubject < NoLimit:
		return cfg, errors.New("--max-connections-per-subject: must not be negative")
	case cfg.MaxHeaderBytes < MinMaxHeaderBytes || cfg.MaxHeaderBytes > MaxMaxHeaderBytes:
		return cfg, errors.New("--max-header-bytes: must be between " + strconv.Itoa(MinMaxHeaderBytes) + " and " + strconv.Itoa(MaxMaxHeaderBytes))
	case cfg.Heartbeat < MinHeartbeat || cfg.Heartbeat > MaxInterval:
		return cfg, errors.New("--heartbeat: must be between " + MinHeartbeat.String() + " and " + MaxInterval.String())
	case cfg.Retry < MinRetry || cfg.Retry > MaxInterval:
		return cfg, errors.New("--retry: must be between " + MinRetry.String() + " and " + MaxInterval.String())
	case cfg.Retention < 0:
		return cfg, errors.New("--retention: must not be negative")
	case cfg.HubWorkerBuffer < MinHubWorkerBuffer || cfg.HubWorkerBuffer > MaxHubWorkerBuffer:
		return cfg, errors.New("--hub-worker-buffer: must hold at least two maximal frames (" + strconv.Itoa(MinHubWorkerBuffer) +
			" bytes) and at most " + strconv.Itoa(MaxHubWorkerBuffer))
	}
	return cfg, nil
}

// orDefault sets *field to def when it is the zero value.
func orDefault[T comparable](field *T, def T) {
	var zero T
	if *field == zero {
		*field = def
	}
}
