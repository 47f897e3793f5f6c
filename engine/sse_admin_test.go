package engine

import (
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/metricstest"
	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/store"
)

// docs/operations.md, Health, metrics and logs, through the engine API (cmd/pgsse serves it over
// HTTP): readiness follows the LISTEN session and the schema version; the metrics count what
// clients see.
func TestSSEReadinessAndMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	ts := startServer(t, "", func(c *Config) { c.Registry = reg })
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	waitFor(t, 10*time.Second, "ready", ts.Ready)
	assert.True(t, ts.Healthy())
	assert.Empty(t, ts.NotReadyReason())

	a := dial(t, addr, "/streams/m", tok)
	b := dial(t, addr, "/channels/m", tok)
	require.Equal(t, 200, a.Status)
	require.Equal(t, 200, b.Status)
	gauge := func(selector string) float64 { // a missing series fails the test
		t.Helper()
		s, err := metricstest.Gather(reg, "registry")
		require.NoError(t, err)
		return s.Metric(t, selector)
	}
	waitFor(t, 5*time.Second, "pgsse_sse_connections = 2", func() bool { return gauge("pgsse_sse_connections") == 2 })
	assert.Equal(t, 1.0, gauge("pgsse_listen_channels"))
	pub := connect(t, ts.DSN)
	publish(t, pub, "m", "x", "", nil)
	a.mustNextData(5 * time.Second)
	// Counters move right after the write the client may already have read.
	waitFor(t, 5*time.Second, "pgsse_deliveries_total >= 1", func() bool { return gauge("pgsse_deliveries_total") >= 1 })
	assert.GreaterOrEqual(t, gauge("pgsse_notifications_total"), 1.0)
	r := get(t, addr, "/nope")
	require.Equal(t, 404, r.Status)
	assert.Equal(t, 1.0, gauge(`pgsse_rejected_total{status="404"}`))

	release := holdListenDown(t, ts)
	assert.False(t, ts.Ready())
	assert.Contains(t, ts.NotReadyReason(), "LISTEN")
	release()
	waitFor(t, 20*time.Second, "ready again", ts.Ready)
	assert.Equal(t, 1.0, gauge("pgsse_pg_reconnects_total"))

	a.conn.Close()
	b.conn.Close()
	waitFor(t, 5*time.Second, "pgsse_sse_connections = 0", func() bool { return gauge("pgsse_sse_connections") == 0 })
	waitFor(t, 5*time.Second, "pgsse_listen_channels = 0", func() bool { return gauge("pgsse_listen_channels") == 0 })
}

func TestSSENotReadyWithoutSchema(t *testing.T) {
	t.Parallel()
	ts := startServer(t, pgtest.NewDatabase(t), nil) // not migrated
	waitFor(t, 5*time.Second, "a reason naming migrate", func() bool {
		return ts.NotReadyReason() != "" && ts.NotReadyReason() != "schema not checked yet"
	})
	assert.False(t, ts.Ready(), "the schema was checked and found missing")
	assert.Contains(t, ts.NotReadyReason(), "migrate")
}

// docs/operations.md, Health: /readyz is 200 only while the schema is at the expected
// version — also when it stops being so under a running server (a schema rolled back or
// dropped), not only at start.
func TestSSENotReadyWhenSchemaRollsBack(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	waitFor(t, 10*time.Second, "ready", ts.Ready)
	version := strconv.Itoa(store.SchemaVersion)
	pgtest.Exec(t, ts.DSN, "DELETE FROM pgsse.schema_version WHERE version = "+version)
	waitFor(t, 3*schemaCheckInterval, "not ready once the schema is behind", func() bool { return !ts.Ready() })
	assert.Contains(t, ts.NotReadyReason(), "run `pgsse migrate`")
	pgtest.Exec(t, ts.DSN, "INSERT INTO pgsse.schema_version (version) VALUES ("+version+")")
	waitFor(t, 3*schemaCheckInterval, "ready again", ts.Ready)
}
