package metricstest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// registry is what a pgsse process exposes, in miniature.
func registry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "pgsse_hub_workers", Help: "h"})
	g.Set(0)
	dropped := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgsse_dropped_total", Help: "h"}, []string{"reason"})
	dropped.WithLabelValues("slow_client").Add(3)
	dropped.WithLabelValues("hub_wake_coalesced").Add(1)
	per := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pgsse_process_sse_connections", Help: "h"}, []string{"process"})
	per.WithLabelValues("0").Set(25)
	per.WithLabelValues("1").Set(15)
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "pgsse_delivery_lag_seconds", Help: "h", Buckets: []float64{0.005, 0.1}})
	h.Observe(0.001)
	h.Observe(0.05)
	reg.MustRegister(g, dropped, per, h)
	return reg
}

// recorder is a testing.TB whose Fatal stops only the helper it was given to.
type recorder struct {
	testing.TB
	mu    sync.Mutex
	fatal string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.fatal = fmt.Sprintf(format, args...)
	r.mu.Unlock()
	runtime.Goexit()
}

// fails runs f with a recorder and returns what it failed with ("" if it did not).
func fails(t *testing.T, f func(tb testing.TB)) string {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() { defer close(done); f(r) }()
	<-done
	return r.fatal
}

func TestMetricSelectsByLabels(t *testing.T) {
	srv := httptest.NewServer(promhttp.HandlerFor(registry(), promhttp.HandlerOpts{}))
	defer srv.Close()
	url := srv.URL + "/metrics"
	for _, tc := range []struct {
		selector string
		want     float64
	}{
		{"pgsse_hub_workers", 0},
		{`pgsse_dropped_total{reason="slow_client"}`, 3},
		{`pgsse_dropped_total{ reason = "hub_wake_coalesced" }`, 1},
		{`pgsse_process_sse_connections{process="1"}`, 15},
		{"pgsse_delivery_lag_seconds_count", 2},
		{"pgsse_delivery_lag_seconds_sum", 0.051},
		{`pgsse_delivery_lag_seconds_bucket{le="0.005"}`, 1},
		{`pgsse_delivery_lag_seconds_bucket{le="+Inf"}`, 2},
	} {
		assert.InDelta(t, tc.want, Metric(t, url, tc.selector), 1e-9, tc.selector)
	}
	s := Fetch(t, url)
	assert.Len(t, s.Series("pgsse_process_sse_connections"), 2)
	v, ok := s.MetricOrAbsent(t, `pgsse_dropped_total{reason="draining"}`)
	assert.False(t, ok, "absent, and the test says that is fine")
	assert.Zero(t, v)
}

// The point of the package: a missing series fails the test instead of reading as 0 (before,
// cmd/pgsse's `0 == metric("pgsse_hub_workers")` passed whether or not the series existed).
func TestMetricFailsOnAMissingSeries(t *testing.T) {
	srv := httptest.NewServer(promhttp.HandlerFor(registry(), promhttp.HandlerOpts{}))
	defer srv.Close()
	url := srv.URL + "/metrics"
	for _, tc := range []struct {
		selector, says string
	}{
		{"pgsse_hub_worker", "no family pgsse_hub_worker; families named pgsse_hub…: pgsse_hub_workers"},
		{`pgsse_dropped_total{reason="draining"}`, `the family has: pgsse_dropped_total{reason="hub_wake_coalesced"} 1; pgsse_dropped_total{reason="slow_client"} 3`},
		{`pgsse_hub_workers{process="0"}`, "no such series"},
		{"pgsse_delivery_lag_seconds", "is a histogram: select pgsse_delivery_lag_seconds_count"},
	} {
		msg := fails(t, func(tb testing.TB) { Metric(tb, url, tc.selector) })
		assert.Contains(t, msg, tc.says, tc.selector)
	}
	for _, tc := range []struct {
		selector, says string
	}{
		{"pgsse_dropped_total", "2 series match"},
		{`pgsse_dropped_total{reason=slow_client}`, `want label="value"`},
		{`pgsse_dropped_total{reason="x"`, "no closing }"},
	} {
		msg := fails(t, func(tb testing.TB) { MetricOrAbsent(tb, url, tc.selector) })
		assert.Contains(t, msg, tc.says, "%s: not merely absent", tc.selector)
	}
	notFound := httptest.NewServer(http.NotFoundHandler())
	defer notFound.Close()
	assert.Contains(t, fails(t, func(tb testing.TB) { Fetch(tb, notFound.URL+"/metrics") }), "404")
}

func TestValue(t *testing.T) {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "c", Help: "h"})
	c.Add(2)
	assert.Equal(t, 2.0, Value(t, c))
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h", Help: "h"})
	assert.Contains(t, fails(t, func(tb testing.TB) { Value(tb, h) }), "no single value",
		"a histogram read as a gauge was 0 whatever it held")
}

func TestGatherAndParse(t *testing.T) {
	s, err := Gather(registry(), "registry")
	require.NoError(t, err)
	v, err := s.Lookup(`pgsse_process_sse_connections{process="0"}`)
	require.NoError(t, err)
	assert.Equal(t, 25.0, v)
	twice, err := Parse(strings.NewReader("pgsse_x{a=\"1\"} 1\npgsse_x{a=\"1\"} 2\n"), "text")
	require.NoError(t, err)
	_, err = twice.Lookup(`pgsse_x{a="1"}`)
	assert.ErrorContains(t, err, "2 series match", "a repeated series is not one value")
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(registry(), promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	s, err = Parse(rec.Body, "text")
	require.NoError(t, err)
	assert.Equal(t, s.Families(), []string{"pgsse_delivery_lag_seconds", "pgsse_dropped_total", "pgsse_hub_workers", "pgsse_process_sse_connections"})
}
