package engine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMaxConnectionsFor(t *testing.T) {
	assert.Equal(t, 20000-FDReserve, MaxConnectionsFor(20000))
	assert.Equal(t, 768, FDReserve, "README documents RLIMIT_NOFILE − 768")
	assert.Equal(t, 0, MaxConnectionsFor(FDReserve), "no room left")
	assert.Equal(t, 1, MaxConnectionsFor(FDReserve+1))
	assert.Equal(t, 1<<24-FDReserve, MaxConnectionsFor(1<<62), "RLIM_INFINITY is capped")
	assert.Equal(t, 10_000, MaxConnectionsFor(0), "unknown limit")
}

// New fills the same defaults the CLI shows, and refuses what is out of bounds with a
// message naming the flag.
func TestConfigDefaultsAndBounds(t *testing.T) {
	cfg, err := Config{}.withDefaults()
	require.NoError(t, err)
	assert.Equal(t, DefaultListen, cfg.Listen)
	assert.Equal(t, DefaultHubSocketMode, cfg.HubSocketMode)
	assert.Equal(t, DefaultHubWorkerBuffer, cfg.HubWorkerBuffer)
	assert.Equal(t, DefaultMaxHeaderBytes, cfg.MaxHeaderBytes)
	assert.Equal(t, DefaultHeartbeat, cfg.Heartbeat)
	assert.Equal(t, DefaultRetry, cfg.Retry)
	assert.Equal(t, DefaultReplayPoolSize, cfg.ReplayPoolSize)
	assert.Equal(t, int64(DefaultMaxPublishBytes), cfg.MaxPublishBytes)
	assert.Equal(t, DefaultMaxOutboundMemory, cfg.MaxOutboundMemory)
	assert.Equal(t, MaxConnectionsFor(FDLimit()), cfg.MaxConnections)
	assert.Zero(t, cfg.Retention, "zero keeps events forever")
	assert.NotNil(t, cfg.Logger)
	assert.NotNil(t, cfg.Registry)

	for _, tc := range []struct {
		tweak func(*Config)
		flag  string
	}{
		{func(c *Config) { c.MaxConnections = -1 }, "--max-connections"},
		{func(c *Config) { c.MaxHeaderBytes = MinMaxHeaderBytes - 1 }, "--max-header-bytes"},
		{func(c *Config) { c.MaxHeaderBytes = MaxMaxHeaderBytes + 1 }, "--max-header-bytes"},
		{func(c *Config) { c.Heartbeat = MinHeartbeat - 1 }, "--heartbeat"},
		{func(c *Config) { c.Heartbeat = MaxInterval + 1 }, "--heartbeat"},
		{func(c *Config) { c.Retry = -time.Second }, "--retry"},
		{func(c *Config) { c.Retention = -time.Second }, "--retention"},
		{func(c *Config) { c.HubWorkerBuffer = MinHubWorkerBuffer - 1 }, "--hub-worker-buffer"},
		{func(c *Config) { c.MaxPublishBytes = -1 }, "--max-publish-bytes"},
		{func(c *Config) { c.MaxPublishBytes = MaxMaxPublishBytes + 1 }, "--max-publish-bytes"},
		{func(c *Config) { c.MaxOutboundMemory = MinMaxOutboundMemory - 1 }, "--max-outbound-memory"},
		{func(c *Config) { c.MaxOutboundMemory = MaxMaxOutboundMemory + 1 }, "--max-outbound-memory"},
	} {
		var cfg Config
		tc.tweak(&cfg)
		_, err := cfg.withDefaults()
		if assert.Error(t, err, tc.flag) {
			assert.Contains(t, err.Error(), tc.flag+":")
		}
	}
	cfg = Config{MaxHeaderBytes: MinMaxHeaderBytes, Heartbeat: MinHeartbeat, Retry: MinRetry, HubWorkerBuffer: MinHubWorkerBuffer,
		MaxOutboundMemory: MinMaxOutboundMemory, MaxPublishBytes: MinMaxPublishBytes}
	_, err = cfg.withDefaults()
	assert.NoError(t, err, "the bounds themselves are allowed")
}
