package engine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The descriptor budget (docs/operations.md, Many connections): every consumer has its share of
// RLIMIT_NOFILE and SSE connections get exactly what is left, so the shares never add up to more
// than the limit.
func TestFDBudget(t *testing.T) {
	noHub := Config{}.FDBudget(20000)
	reserved := noHub.Reserved()
	assert.Equal(t, 20000-reserved, noHub.MaxConnections)
	assert.Equal(t, 0, noHub.HubWorkers)
	assert.Equal(t, noHub.MaxConnections, MaxConnectionsFor(20000), "MaxConnectionsFor is the budget with default flags")
	tiny := Config{}.FDBudget(100).Reserved() // the smallest shares (the window at its minimum)
	assert.Equal(t, 0, MaxConnectionsFor(uint64(tiny)), "no room left")
	assert.Equal(t, 1, MaxConnectionsFor(uint64(tiny)+1))
	assert.Equal(t, 1<<24-reserved, MaxConnectionsFor(1<<62), "RLIM_INFINITY is capped")
	assert.Equal(t, 10_000, MaxConnectionsFor(0), "unknown limit")
	assert.Equal(t, 628, reserved, "docs/operations.md documents RLIMIT_NOFILE − 628 without a hub")

	// The admin cap, the replay pool and the hub's workers are counted.
	more := Config{AdminMaxConnections: 1000, ReplayPoolSize: 20}.FDBudget(20000)
	assert.Equal(t, reserved+(1000-DefaultAdminMaxConnections)+(20-DefaultReplayPoolSize), more.Reserved())
	hub := Config{HubSocket: "/run/pgsse/hub.sock"}.FDBudget(20000)
	assert.Equal(t, hubMaxWorkers, hub.HubWorkers)
	assert.Equal(t, acceptWindowMax, hub.AcceptWindow)
	assert.Equal(t, reserved+acceptWindowMax+hubMaxWorkers+hubShedSlack, hub.Reserved())
	small := Config{HubSocket: "/run/pgsse/hub.sock"}.FDBudget(1200)
	assert.Equal(t, 150, small.HubWorkers, "an eighth of a small limit")
	assert.Equal(t, 1200, small.Reserved()+small.MaxConnections)
	assert.Positive(t, small.MaxConnections)
	assert.Equal(t, 37, small.AcceptWindow, "a thirty-second of a small limit")
	assert.Equal(t, hubMinWorkers, Config{HubSocket: "h"}.FDBudget(100).HubWorkers)
	presence := Config{PresenceStreams: []string{"room/*"}}.FDBudget(20000)
	assert.Equal(t, reserved+1, presence.Reserved(), "presence's writer session is counted")
	assert.Equal(t, 20000-reserved-1, presence.MaxConnections)
	assert.Equal(t, acceptWindowMin, Config{}.FDBudget(100).AcceptWindow)
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
	assert.Equal(t, DefaultSSESendBuffer, cfg.SSESendBuffer)
	assert.Equal(t, 64, cfg.MaxStreamsPerConnection, "docs/http.md: 64 streams per connection by default")
	assert.Equal(t, time.Second, cfg.PresenceInterval, "SPEC §3d: --presence-interval 1s")
	assert.Equal(t, 1000, cfg.PresenceMaxList, "SPEC §3d: --presence-max-list 1000")
	assert.Empty(t, cfg.PresenceStreams, "no presence unless asked for")
	assert.Equal(t, MaxConnectionsFor(FDLimit()), cfg.MaxConnections)
	assert.Zero(t, cfg.Retention, "zero keeps events forever")
	assert.NotNil(t, cfg.Logger)
	assert.NotNil(t, cfg.Registry)

	for _, tc := range []struct {
		tweak func(*Config)
		flag  string
	}{
		{func(c *Config) { c.MaxConnections = -1 }, "--max-connections"},
		{func(c *Config) { c.MaxStreamsPerConnection = -1 }, "--max-streams-per-connection"},
		{func(c *Config) { c.MaxStreamsPerConnection = MaxMaxStreamsPerConnection + 1 }, "--max-streams-per-connection"},
		{func(c *Config) { c.MaxHeaderBytes = MinMaxHeaderBytes - 1 }, "--max-header-bytes"},
		{func(c *Config) { c.MaxHeaderBytes = MaxMaxHeaderBytes + 1 }, "--max-header-bytes"},
		{func(c *Config) { c.Heartbeat = MinHeartbeat - 1 }, "--heartbeat"},
		{func(c *Config) { c.Heartbeat = MaxInterval + 1 }, "--heartbeat"},
		{func(c *Config) { c.Retry = -time.Second }, "--retry"},
		{func(c *Config) { c.Retention = -time.Second }, "--retention"},
		{func(c *Config) { c.PresenceInterval = MinPresenceInterval - 1 }, "--presence-interval"},
		{func(c *Config) { c.PresenceInterval = MaxPresenceInterval + 1 }, "--presence-interval"},
		{func(c *Config) { c.PresenceMaxList = -1 }, "--presence-max-list"},
		{func(c *Config) { c.PresenceMaxList = MaxPresenceMaxList + 1 }, "--presence-max-list"},
		{func(c *Config) { c.HubWorkerBuffer = MinHubWorkerBuffer - 1 }, "--hub-worker-buffer"},
		{func(c *Config) { c.MaxPublishBytes = -1 }, "--max-publish-bytes"},
		{func(c *Config) { c.MaxPublishBytes = MaxMaxPublishBytes + 1 }, "--max-publish-bytes"},
		{func(c *Config) { c.MaxOutboundMemory = MinMaxOutboundMemory - 1 }, "--max-outbound-memory"},
		{func(c *Config) { c.MaxOutboundMemory = MaxMaxOutboundMemory + 1 }, "--max-outbound-memory"},
		{func(c *Config) { c.SSESendBuffer = MinSSESendBuffer - 1 }, "SSESendBuffer"},
		{func(c *Config) { c.SSESendBuffer = MaxSSESendBuffer + 1 }, "SSESendBuffer"},
	} {
		var cfg Config
		tc.tweak(&cfg)
		_, err := cfg.withDefaults()
		if assert.Error(t, err, tc.flag) {
			assert.Contains(t, err.Error(), tc.flag+":")
		}
	}
	cfg = Config{MaxHeaderBytes: MinMaxHeaderBytes, Heartbeat: MinHeartbeat, Retry: MinRetry, HubWorkerBuffer: MinHubWorkerBuffer,
		MaxOutboundMemory: MinMaxOutboundMemory, MaxPublishBytes: MinMaxPublishBytes, SSESendBuffer: MinSSESendBuffer}
	_, err = cfg.withDefaults()
	assert.NoError(t, err, "the bounds themselves are allowed")
	_, err = Config{SSESendBuffer: NoLimit}.withDefaults()
	assert.NoError(t, err, "NoLimit leaves the send buffers to the kernel")
}
