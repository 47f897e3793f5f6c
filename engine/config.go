package engine

import (
	"cmp"
	"errors"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/framing"
	"github.com/pgsse/pgsse/sse"
)

// Config is everything `pgsse serve` configures (docs/operations.md, Configuration). cmd/pgsse
// fills it from flags and PGSSE_* variables; New checks it and fills defaults for zero values.
type Config struct {
	DatabaseURL string // "" = libpq environment (PGHOST, …)

	Listen          string      // SSE address, default DefaultListen
	HubSocket       string      // Unix socket path for worker processes; "" = no hub
	HubSocketMode   os.FileMode // default DefaultHubSocketMode
	HubWorkerBuffer int         // bytes per worker outbound ring, default DefaultHubWorkerBuffer

	Auth          auth.Config
	PublicStreams []string // patterns that need no token
	CORSOrigins   []string // exact origins allowed to read streams cross-origin

	MaxConnections int // SSE-port connections (subscribers and publishers); default MaxConnectionsFor(FDLimit())
	// MaxConnectionsPerSubject caps the SSE connections of one token subject (docs/http.md,
	// Authorization: Per subject); default DefaultMaxConnectionsPerSubject, NoLimit for none.
	MaxConnectionsPerSubject int
	// MaxOutboundMemory bounds the bytes queued for all SSE connections together
	// (--max-outbound-memory, default DefaultMaxOutboundMemory; budget.go).
	MaxOutboundMemory int
	// SSESendBuffer bounds the bytes the kernel holds unsent for each SSE-port socket (its send
	// buffer: SO_SNDBUF, of which Linux counts twice what is set, so pgsse sets half), outside
	// MaxOutboundMemory: default DefaultSSESendBuffer, NoLimit for the kernel's autotuning.
	SSESendBuffer int
	// GoMemoryLimit lets the engine keep the Go runtime's soft memory limit in step with
	// MaxOutboundMemory while it runs (budget.go). The CLI sets it unless GOMEMLIMIT is set.
	GoMemoryLimit  bool
	MaxHeaderBytes int // request head limit, default DefaultMaxHeaderBytes
	// MaxStreamsPerConnection is the most streams one GET /streams?stream=…&stream=… may name
	// (--max-streams-per-connection; docs/http.md, Several streams on one connection), default
	// DefaultMaxStreamsPerConnection, at most MaxMaxStreamsPerConnection.
	MaxStreamsPerConnection int
	// MaxPublishBytes is the largest request body of POST /streams/{stream} and POST
	// /publish (--max-publish-bytes), default DefaultMaxPublishBytes.
	MaxPublishBytes int64
	Heartbeat       time.Duration // default DefaultHeartbeat
	Retry           time.Duration // the retry: field, default DefaultRetry
	Retention       time.Duration // prune events older than this; 0 = keep forever (the CLI's default is DefaultRetention)
	Demo            bool          // serve the demo page at /

	// Presence (docs/http.md, Presence; presence.go): the streams it is kept for
	// (--presence-streams, patterns as in a token; none = off), how often this process writes
	// its changes and sends presence events (--presence-interval, default
	// DefaultPresenceInterval), the most subjects GET /presence lists (--presence-max-list,
	// default DefaultPresenceMaxList), and this process's place in its key
	// (store.PresenceKey(host, bound --listen, PresenceIndex)): 0 for the first process of
	// --procs, the slot for a sibling. PresenceHost "" = os.Hostname().
	PresenceStreams  []string
	PresenceInterval time.Duration
	PresenceMaxList  int
	PresenceIndex    int
	PresenceHost     string

	ReplayPoolSize int // replay connections (application_name pgsse-replay), default DefaultReplayPoolSize

	// AdminMaxConnections caps the admin endpoint's connections (AdminListener), default
	// DefaultAdminMaxConnections.
	AdminMaxConnections int
	// ShareListen: other processes of this server (--procs) bind --listen too (SO_REUSEPORT);
	// without it an address another socket already holds is refused.
	ShareListen bool

	hubWorkers   int // the hub's worker cap, from the descriptor budget (withDefaults)
	acceptWindow int // connections in flight to the loop per listener, from the budget

	// SiblingHub makes this server a sibling process of --procs (docs/scaling.md, "Every core of
	// a host"; cmd/pgsse/procs.go starts them): instead of a LISTEN session of its own it reads
	// the first process's hub over this already-connected socket — one end of a socketpair the
	// first process made, so no outside worker can present it — and fails over to a session of
	// its own if the first process goes away (siblingsource.go). The first process enrols the other
	// end with AddSibling. A sibling sets ShareListen: the first process holds --listen already.
	SiblingHub net.Conn

	// Inherited makes this server a successor (handoff.go): it serves on the predecessor's
	// listeners instead of binding its own. cmd/pgsse sets it.
	Inherited *Inheritance

	Logger   *slog.Logger          // default slog.Default()
	Registry prometheus.Registerer // where metrics are registered; nil = a private registry

	// dbUnavailableAfterMS overrides the constant of that name (tests only: a test that holds
	// the LISTEN session down on purpose must not race the shed on a busy machine); 0 = it.
	dbUnavailableAfterMS int64
	// listenChannels overrides listenMaxChannels, the LISTEN session's channel limit, and with
	// it the shares derived from it (tests only: filling 10,000 channels takes 20,000
	// descriptors); 0 = it.
	listenChannels int
}

// Defaults (docs/operations.md, Configuration): the CLI's flag defaults, and what New fills in
// for a zero field.
const (
	DefaultListen                        = ":8080"
	DefaultHubSocketMode     os.FileMode = 0o600
	DefaultHubWorkerBuffer               = 1 << 20 // bytes
	DefaultMaxHeaderBytes                = 8192
	DefaultHeartbeat                     = 15 * time.Second
	DefaultRetry                         = 2 * time.Second
	DefaultRetention                     = 24 * time.Hour
	DefaultReplayPoolSize                = 4
	DefaultMaxOutboundMemory             = 256 << 20                  // bytes queued for all SSE connections together
	DefaultMaxPublishBytes               = sse.DefaultMaxPublishBytes // docs/http.md: 1 MiB
	// DefaultSSESendBuffer is what the kernel may hold unsent per SSE socket (docs/operations.md,
	// Memory). Left to itself Linux grows a send buffer to tcp_wmem's maximum (4 MiB here, at
	// once on loopback) for a client that does not read, and those bytes are outside
	// --max-outbound-memory: 2,000 such clients held 1.5 GB of the host's TCP memory (issue
	// 23). What a socket does not take waits in pgsse's queue instead, by reference and counted
	// against the budget, so the kernel needs only what keeps a reader busy between two wake-ups
	// of the loop: with 64 KiB, three readers of a flat-out publisher of 8 KiB events fell 6 s
	// behind on a loaded 2-core machine (each 64 KiB they read needed a wake-up of the loop),
	// with 256 KiB they kept up as with 4 MiB (TestSSESlowClient). 256 KiB also carries
	// 2.5 MB/s to a client 100 ms away; 10,000 clients that stop reading hold at most 2.5 GiB.
	DefaultSSESendBuffer = 256 << 10
	// DefaultMaxConnectionsPerSubject is --max-connections-per-subject's default (0 on the
	// command line is NoLimit).
	DefaultMaxConnectionsPerSubject = 256
	DefaultAdminMaxConnections      = 64
	DefaultMaxStreamsPerConnection  = 64 // streams on one connection (GET /streams?stream=…)
	DefaultProcs                    = 1  // --procs: processes serving the port; "auto" = ProcsAuto()
	// DefaultPresenceInterval is --presence-interval: how often a process writes its presence
	// changes (one statement) and sends each presence stream's join/leave event.
	DefaultPresenceInterval = time.Second
	// DefaultPresenceMaxList is --presence-max-list: the most subjects GET /presence lists.
	DefaultPresenceMaxList = 1000
)

// NoLimit in a Config limit field means "no limit" (the zero value means "the default").
const NoLimit = -1

// Bounds on Config values. New refuses values outside them; the CLI checks the same bounds
// first so that its message names the flag or variable that was set.
const (
	MinHubWorkerBuffer   = 2 * (framing.HeaderLen + framing.MaxBody) // two maximal frames, bytes
	MaxHubWorkerBuffer   = 1 << 30                                   // bytes
	MinMaxHeaderBytes    = 1024
	MaxMaxHeaderBytes    = 1 << 20
	MinHeartbeat         = 100 * time.Millisecond
	MinRetry             = time.Millisecond
	MaxInterval          = 24 * time.Hour // the longest --heartbeat and --retry
	MinMaxOutboundMemory = 1 << 20        // bytes
	MaxMaxOutboundMemory = 1 << 40        // bytes
	MinMaxPublishBytes   = 1
	MinSSESendBuffer     = 8 << 10  // bytes; the kernel's own floor is ≈ 4.5 KiB
	MaxSSESendBuffer     = 64 << 20 // bytes; Linux caps SO_SNDBUF at net.core.wmem_max anyway
	MaxMaxPublishBytes   = 1 << 30  // a batch of 1,000 events of 1 MiB
	MaxProcs             = 256      // the most --procs
	// MinPresenceInterval and MaxPresenceInterval bound --presence-interval.
	MinPresenceInterval = 10 * time.Millisecond
	MaxPresenceInterval = time.Hour
	// MaxPresenceMaxList is the highest --presence-max-list.
	MaxPresenceMaxList = 100_000
	// MaxMaxStreamsPerConnection is the highest --max-streams-per-connection: what a request's
	// parsed stream list holds (sse.MaxStreams).
	MaxMaxStreamsPerConnection = sse.MaxStreams
)

// ProcsAuto is --procs auto: one process per CPU this process may run on, at most MaxProcs.
func ProcsAuto() int { return min(max(runtime.NumCPU(), 1), MaxProcs) }

// The descriptor budget (docs/operations.md, Many connections: limits and kernel settings). Every
// consumer of file descriptors gets its share of RLIMIT_NOFILE at start-up and SSE connections
// get what is left: Config.FDBudget computes it (the one place), New derives the default
// --max-connections and the hub's worker cap from it, `pgsse serve` checks --max-connections
// against it and `pgsse doctor` prints it. Should accept still meet EMFILE (another process's
// descriptors, ENFILE), the acceptors shed (accept.go).
const (
	// fdRuntime: standard streams, Go's and gnet's pollers and their wake-up descriptors,
	// /proc and log files, DNS lookups.
	fdRuntime = 32
	// fdListeners: --listen, the hub socket, the admin listener, gnet's placeholder, the loop's
	// anchor connection and its peer, one reserve descriptor per acceptor.
	fdListeners = 10
	// fdPostgresFixed: PostgreSQL sessions besides the replay pool — the LISTEN session, the
	// schema check, retention, the publisher (two transactions in flight and an outcome check).
	fdPostgresFixed = 6
	// fdPresence: presence's writer session (application_name pgsse-presence), with
	// --presence-streams.
	fdPresence = 1
	// shedSlack is how many connections beyond MaxConnections may be open at once while they
	// are told to retry elsewhere; beyond that a new connection is closed unread.
	shedSlack = 256
	// hubShedSlack: workers beyond the hub's cap that may be open while they are told so.
	hubShedSlack = 16
	// fdLimitCap is where a huge limit (RLIM_INFINITY) stops counting.
	fdLimitCap = 1 << 24
	// unknownFDLimitConnections is the default when the limit cannot be read; the acceptors
	// shed on EMFILE anyway.
	unknownFDLimitConnections = 10_000
)

// Hub worker cap: an eighth of the descriptor limit, between these bounds.
const (
	hubMinWorkers = 16
	hubMaxWorkers = 1024
)

// FDShare is one consumer's share of the descriptor budget.
type FDShare struct {
	Consumer string
	FDs      int
}

// FDBudget is how RLIMIT_NOFILE is shared out.
type FDBudget struct {
	Limit          uint64    // RLIMIT_NOFILE (capped at 2^24); 0 = unknown
	Shares         []FDShare // every consumer but the admitted SSE connections
	HubWorkers     int       // the hub's worker cap (0 without a hub)
	AcceptWindow   int       // connections being handed to the loop at once, per listener
	MaxConnections int       // what is left for SSE connections; ≤ 0 = no room
}

// Reserved is what the budget keeps back from SSE connections.
func (b FDBudget) Reserved() int {
	n := 0
	for _, sh := range b.Shares {
		n += sh.FDs
	}
	return n
}

// FDBudget shares a descriptor limit out among this configuration's consumers (zero fields
// count as their defaults; MaxConnections is ignored: it is the result).
func (cfg Config) FDBudget(fdLimit uint64) FDBudget {
	replay := cmp.Or(cfg.ReplayPoolSize, DefaultReplayPoolSize)
	admin := cmp.Or(cfg.AdminMaxConnections, DefaultAdminMaxConnections)
	b := FDBudget{Limit: min(fdLimit, fdLimitCap)}
	if cfg.HubSocket != "" {
		b.HubWorkers = hubMaxWorkers
		if fdLimit > 0 {
			b.HubWorkers = min(max(int(b.Limit/8), hubMinWorkers), hubMaxWorkers)
		}
	}
	b.AcceptWindow = acceptWindowMax
	if fdLimit > 0 {
		b.AcceptWindow = min(max(int(b.Limit/32), acceptWindowMin), acceptWindowMax)
	}
	listeners := 1
	if cfg.HubSocket != "" {
		listeners++
	}
	b.Shares = []FDShare{
		{"runtime and files", fdRuntime},
		{"listeners, loop anchor, reserve descriptors", fdListeners},
		{"PostgreSQL sessions (LISTEN, " + strconv.Itoa(replay) + " replay, schema check, retention, 3 publishing)", fdPostgresFixed + replay},
		{"admin connections (--admin-max-connections)", admin},
		{"connections being handed to the loop (" + strconv.Itoa(b.AcceptWindow) + " per listener)", listeners * b.AcceptWindow},
		{"SSE connections told to retry (over --max-connections)", shedSlack},
	}
	if len(cfg.PresenceStreams) > 0 {
		b.Shares = append(b.Shares, FDShare{"PostgreSQL session for presence (--presence-streams)", fdPresence})
	}
	if b.HubWorkers > 0 {
		b.Shares = append(b.Shares, FDShare{"hub workers (" + strconv.Itoa(b.HubWorkers) + ", and " + strconv.Itoa(hubShedSlack) + " being refused)", b.HubWorkers + hubShedSlack})
	}
	if fdLimit == 0 {
		b.MaxConnections = unknownFDLimitConnections
		return b
	}
	b.MaxConnections = int(b.Limit) - b.Reserved()
	return b
}

// FDLimit is the soft RLIMIT_NOFILE (the Go runtime has already raised it to the hard limit
// at start-up), or 0 if it cannot be read.
func FDLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	return rl.Cur
}

// MaxConnectionsFor is the default --max-connections of `pgsse serve` with default flags (no
// hub, the default admin cap) for a descriptor limit: Config{}.FDBudget(fdLimit), at least 0.
// 10,000 when the limit is unknown (0).
func MaxConnectionsFor(fdLimit uint64) int {
	return max(Config{}.FDBudget(fdLimit).MaxConnections, 0)
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
	orDefault(&cfg.AdminMaxConnections, DefaultAdminMaxConnections)
	orDefault(&cfg.MaxStreamsPerConnection, DefaultMaxStreamsPerConnection)
	orDefault(&cfg.PresenceInterval, DefaultPresenceInterval)
	orDefault(&cfg.PresenceMaxList, DefaultPresenceMaxList)
	budget := cfg.FDBudget(FDLimit())
	orDefault(&cfg.MaxOutboundMemory, DefaultMaxOutboundMemory)
	orDefault(&cfg.MaxPublishBytes, DefaultMaxPublishBytes)
	orDefault(&cfg.SSESendBuffer, DefaultSSESendBuffer)
	if cfg.MaxConnections == 0 {
		if cfg.MaxConnections = budget.MaxConnections; cfg.MaxConnections < 1 {
			return cfg, errors.New("--max-connections: the file-descriptor limit " + strconv.FormatUint(budget.Limit, 10) +
				" leaves no room after the " + strconv.Itoa(budget.Reserved()) + " reserved")
		}
	}
	cfg.hubWorkers = cmp.Or(budget.HubWorkers, hubMaxWorkers) // without a hub socket nobody connects anyway
	cfg.acceptWindow = budget.AcceptWindow
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
	case cfg.MaxStreamsPerConnection < 1 || cfg.MaxStreamsPerConnection > MaxMaxStreamsPerConnection:
		return cfg, errors.New("--max-streams-per-connection: must be between 1 and " + strconv.Itoa(MaxMaxStreamsPerConnection))
	case cfg.MaxHeaderBytes < MinMaxHeaderBytes || cfg.MaxHeaderBytes > MaxMaxHeaderBytes:
		return cfg, errors.New("--max-header-bytes: must be between " + strconv.Itoa(MinMaxHeaderBytes) + " and " + strconv.Itoa(MaxMaxHeaderBytes))
	case cfg.Heartbeat < MinHeartbeat || cfg.Heartbeat > MaxInterval:
		return cfg, errors.New("--heartbeat: must be between " + MinHeartbeat.String() + " and " + MaxInterval.String())
	case cfg.Retry < MinRetry || cfg.Retry > MaxInterval:
		return cfg, errors.New("--retry: must be between " + MinRetry.String() + " and " + MaxInterval.String())
	case cfg.MaxPublishBytes < MinMaxPublishBytes || cfg.MaxPublishBytes > MaxMaxPublishBytes:
		return cfg, errors.New("--max-publish-bytes: must be between " + strconv.Itoa(MinMaxPublishBytes) + " and " + strconv.Itoa(MaxMaxPublishBytes))
	case cfg.MaxOutboundMemory < MinMaxOutboundMemory || cfg.MaxOutboundMemory > MaxMaxOutboundMemory:
		return cfg, errors.New("--max-outbound-memory: must be between 1MiB and 1TiB")
	case cfg.SSESendBuffer != NoLimit && (cfg.SSESendBuffer < MinSSESendBuffer || cfg.SSESendBuffer > MaxSSESendBuffer):
		return cfg, errors.New("SSESendBuffer: must be between 8KiB and 64MiB, or NoLimit")
	case cfg.PresenceInterval < MinPresenceInterval || cfg.PresenceInterval > MaxPresenceInterval:
		return cfg, errors.New("--presence-interval: must be between " + MinPresenceInterval.String() + " and " + MaxPresenceInterval.String())
	case cfg.PresenceMaxList < 1 || cfg.PresenceMaxList > MaxPresenceMaxList:
		return cfg, errors.New("--presence-max-list: must be between 1 and " + strconv.Itoa(MaxPresenceMaxList))
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
