package engine

import (
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgsse/pgsse/auth"
)

// Config is everything `pgsse serve` configures (SPEC §6). cmd/pgsse fills it from flags
// and PGSSE_* variables; New checks it and fills defaults for zero values.
type Config struct {
	DatabaseURL string // "" = libpq environment (PGHOST, …)

	Listen          string      // SSE address, default ":8080"
	HubSocket       string      // Unix socket path for worker processes; "" = no hub
	HubSocketMode   os.FileMode // default 0600
	HubWorkerBuffer int         // bytes per worker outbound ring, default 1 MiB

	Auth          auth.Config
	PublicStreams []string // patterns that need no token
	CORSOrigins   []string // exact origins allowed to read streams cross-origin

	MaxConnections int           // SSE connections; default derived from the fd limit
	MaxHeaderBytes int           // request head limit, default 8192
	Heartbeat      time.Duration // default 15s
	Retry          time.Duration // the retry: field, default 2s
	Retention      time.Duration // prune events older than this; 0 = keep forever; default 24h
	Demo           bool          // serve the demo page at /

	ReplayPoolSize int // replay connections (application_name pgsse-replay), default 4

	Logger   *slog.Logger          // default slog.Default()
	Registry prometheus.Registerer // where metrics are registered; nil = a private registry
}
