package engine

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/metricstest"
	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/store"
)

// gathered is the value of the one sample of family name in reg, and whether reg has it
// (internal/testkit/metricstest; several samples fail the test).
func gathered(t testing.TB, reg prometheus.Gatherer, name string) (float64, bool) {
	t.Helper()
	s, err := metricstest.Gather(reg, "registry")
	require.NoError(t, err)
	return s.MetricOrAbsent(t, name)
}

// The state series the alerts of deploy/prometheus/ read (docs/operations.md, Alerts):
// pgsse_ready, pgsse_listen_up and pgsse_schema_ok follow what /readyz answers and why —
// the LISTEN session lost, the schema rolled back — and pgsse_outbound_budget_bytes is
// --max-outbound-memory.
func TestMetricsStateFollowsReadiness(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	ts := startServer(t, "", func(c *Config) { c.Registry = reg; c.MaxOutboundMemory = 48 << 20 })
	value := func(name string) float64 {
		t.Helper()
		v, ok := gathered(t, reg, name)
		require.True(t, ok, "%s is registered", name)
		return v
	}
	state := func() [3]float64 {
		return [3]float64{value("pgsse_ready"), value("pgsse_listen_up"), value("pgsse_schema_ok")}
	}
	waitFor(t, 10*time.Second, "ready", ts.Ready)
	assert.Equal(t, [3]float64{1, 1, 1}, state(), "ready, listen up, schema ok")
	assert.Equal(t, float64(48<<20), value("pgsse_outbound_budget_bytes"))

	release := holdListenDown(t, ts)
	assert.Equal(t, [3]float64{0, 0, 1}, state(), "the LISTEN session is down, the schema is fine")
	release()
	waitFor(t, 20*time.Second, "ready again", ts.Ready)
	assert.Equal(t, [3]float64{1, 1, 1}, state())

	version := strconv.Itoa(store.SchemaVersion)
	pgtest.Exec(t, ts.DSN, "DELETE FROM pgsse.schema_version WHERE version = "+version)
	waitFor(t, 3*schemaCheckInterval, "not ready once the schema is behind", func() bool { return !ts.Ready() })
	assert.Equal(t, [3]float64{0, 1, 0}, state(), "the schema is behind, the LISTEN session is fine")
	pgtest.Exec(t, ts.DSN, "INSERT INTO pgsse.schema_version (version) VALUES ("+version+")")
	waitFor(t, 3*schemaCheckInterval, "ready again", ts.Ready)
	assert.Equal(t, [3]float64{1, 1, 1}, state())
}

// pgsse_notify_queue_usage is PostgreSQL's pg_notification_queue_usage(): a listener that
// stops consuming (LISTEN, then a transaction left open) holds the queue's tail, NOTIFYs
// fill pages behind it, and the gauge shows it at the next schema check.
func TestMetricsNotifyQueueUsage(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	ts := startServer(t, "", func(c *Config) { c.Registry = reg })
	_, ok := gathered(t, reg, "pgsse_notify_queue_usage")
	require.True(t, ok, "pgsse_notify_queue_usage is registered")

	stuck := connect(t, ts.DSN)
	ctx := context.Background()
	_, err := stuck.Exec(ctx, "LISTEN metrics_queue_test").ReadAll() // in effect once this commits
	require.NoError(t, err)
	_, err = stuck.Exec(ctx, "BEGIN; SELECT 1").ReadAll() // in a transaction it reads no notification
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = stuck.Exec(context.Background(), "ROLLBACK; UNLISTEN *").ReadAll() })
	pub := connect(t, ts.DSN)
	payload := []byte(strings.Repeat("q", 7000))
	for i := 0; i < 20; i++ { // 20 notifications of 7 kB: the queue's head moves over several 8 kB pages
		pgNotify(t, pub, "metrics_queue_test", payload)
	}
	usage, err := strconv.ParseFloat(pgtest.QueryValue(t, ts.DSN, "SELECT pg_notification_queue_usage()"), 64)
	require.NoError(t, err)
	require.Positive(t, usage, "the stuck listener holds the queue")
	waitFor(t, 3*schemaCheckInterval, "pgsse_notify_queue_usage > 0", func() bool {
		v, _ := gathered(t, reg, "pgsse_notify_queue_usage")
		return v > 0
	})
	v, _ := gathered(t, reg, "pgsse_notify_queue_usage")
	assert.LessOrEqual(t, v, 1.0, "a fraction")
}

// A sibling of --procs exports none of the state series: the first process's /metrics sums
// every pgsse_* series over the processes, and there they must come from the first process
// alone (cmd/pgsse's TestProcsShareOneListenSession checks the sum).
func TestMetricsSiblingHasNoStateSeries(t *testing.T) {
	primary := startHub(t, nil)
	reg := prometheus.NewRegistry()
	sib := startSibling(t, primary, func(c *Config) { c.Registry = reg })
	waitFor(t, 10*time.Second, "the sibling ready", sib.Ready)
	for _, name := range []string{"pgsse_ready", "pgsse_listen_up", "pgsse_schema_ok", "pgsse_notify_queue_usage"} {
		_, ok := gathered(t, reg, name)
		assert.False(t, ok, "a sibling registers no %s", name)
	}
	_, ok := gathered(t, reg, "pgsse_outbound_budget_bytes")
	assert.True(t, ok, "each process has its own outbound budget, summed with the others'")
}
