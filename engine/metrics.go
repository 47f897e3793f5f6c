package engine

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Prometheus series of SPEC §4. Counters are updated from the loop in
// batches (one Add per fan-out, not per delivery).
type metrics struct {
	sseConns       prometheus.Gauge
	hubWorkers     prometheus.Gauge
	listenChannels prometheus.Gauge
	lagging        prometheus.Gauge
	notifications  prometheus.Counter
	deliveries     prometheus.Counter
	dropped        *prometheus.CounterVec
	rejected       *prometheus.CounterVec
	evictions      prometheus.Counter
	reconnects     prometheus.Counter
	replays        prometheus.Counter
	lag            prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		sseConns:       prometheus.NewGauge(prometheus.GaugeOpts{Name: "pgsse_sse_connections", Help: "Subscribed SSE connections."}),
		hubWorkers:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "pgsse_hub_workers", Help: "Worker processes connected to the hub socket."}),
		listenChannels: prometheus.NewGauge(prometheus.GaugeOpts{Name: "pgsse_listen_channels", Help: "Raw channels LISTENed for SSE clients and hub workers (besides the stream channel)."}),
		lagging:        prometheus.NewGauge(prometheus.GaugeOpts{Name: "pgsse_lagging_connections", Help: "Durable subscribers paused over the high watermark, waiting to drain."}),
		notifications:  prometheus.NewCounter(prometheus.CounterOpts{Name: "pgsse_notifications_total", Help: "Notifications received on the LISTEN session."}),
		deliveries:     prometheus.NewCounter(prometheus.CounterOpts{Name: "pgsse_deliveries_total", Help: "Events written to SSE clients and hub workers."}),
		dropped:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgsse_dropped_total", Help: "Deliveries or connections dropped, by reason."}, []string{"reason"}),
		rejected:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgsse_rejected_total", Help: "HTTP requests refused, by status."}, []string{"status"}),
		evictions:      prometheus.NewCounter(prometheus.CounterOpts{Name: "pgsse_evictions_total", Help: "Hub workers evicted for not reading."}),
		reconnects:     prometheus.NewCounter(prometheus.CounterOpts{Name: "pgsse_pg_reconnects_total", Help: "Times the LISTEN session was re-established."}),
		replays:        prometheus.NewCounter(prometheus.CounterOpts{Name: "pgsse_replay_reads_total", Help: "History reads issued for catching connections up."}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "pgsse_delivery_lag_seconds",
			Help:    "Publish (commit) to write, per live event.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}),
	}
	for _, c := range []prometheus.Collector{m.sseConns, m.hubWorkers, m.listenChannels, m.lagging, m.notifications,
		m.deliveries, m.dropped, m.rejected, m.evictions, m.reconnects, m.replays, m.lag} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, r := range []string{"slow_client", "over_capacity", "bad_payload", "hub_wake_coalesced"} {
		m.dropped.WithLabelValues(r)
	}
	return m, nil
}
