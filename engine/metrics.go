package engine

import (
	"context"
	"strconv"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/store"
)

// metrics are the Prometheus series of docs/operations.md, Health, metrics and logs. Counters are
// updated from the loop in batches (one Add per fan-out, not per delivery), and every label value
// is bound once here: no call site looks a series up by its labels.
//
// A new metric: a field here, its registration in newMetrics, and its call site.
type metrics struct {
	sseConns       prometheus.Gauge
	hubWorkers     prometheus.Gauge
	listenChannels prometheus.Gauge
	lagging        prometheus.Gauge
	notifications  prometheus.Counter
	deliveries     prometheus.Counter
	evictions      prometheus.Counter
	// earlyDeliveries: HTTP-published durable events delivered here at their COMMIT's answer (fanout.committed)
	earlyDeliveries prometheus.Counter
	// hubStallSeconds: time notification delivery waited for hub workers' sockets (hubserver.go, stalls)
	hubStallSeconds prometheus.Counter
	reconnects      prometheus.Counter
	replays         prometheus.Counter
	lag             prometheus.Histogram

	outboundBytes     prometheus.Gauge // bytes queued for SSE connections (budget.go)
	outboundWatermark prometheus.Gauge // a durable subscriber's high watermark at the moment
	outboundBudget    prometheus.Gauge // --max-outbound-memory, for alerting on bytes ÷ budget

	// pgsse_notify_queue_usage: pg_notification_queue_usage() as the schema check last read it
	// (schema.go, every schemaCheckInterval). nil in a sibling of --procs, which exports none of
	// the state series (newMetrics).
	notifyQueue prometheus.Gauge

	// pgsse_dropped_total{reason}
	droppedSlowClient    prometheus.Counter // an ephemeral or channel subscriber over its buffer limit, closed
	droppedBadPayload    prometheus.Counter // a payload on the stream channel that is not pgsse's
	droppedWakeCoalesced prometheus.Counter // wake-mode hub notifications folded into a RESYNC

	// pgsse_dropped_total{reason}: connections shed before their response head, by why
	// (over_capacity, draining, database_unavailable, subject_limit)
	shed [shedReasons]prometheus.Counter

	// pgsse_accept_errors_total{reason}: accept (or handing to the loop) failed (accept.go)
	acceptErrors [acceptReasons]prometheus.Counter

	// The verifier pool's counters (auth.Stats), read when scraped; nil until Run starts it.
	verifyStats atomic.Pointer[auth.Stats]

	// pgsse_rejected_total{status}: one bound counter per status pgsse answers with;
	// rejectedOther keeps the vector for any other.
	rejected      map[int]prometheus.Counter
	rejectedOther *prometheus.CounterVec

	// Publishing (docs/http.md, Publishing over HTTP). pgsse_publish_requests_total{status}
	// counts the answers to POST /streams/… and POST /publish (their refusals are not in
	// pgsse_rejected_total).
	publishConns         prometheus.Gauge
	publishRequests      map[int]prometheus.Counter
	publishRequestsOther *prometheus.CounterVec
	publishBatch         prometheus.Histogram // events per committed transaction
	publishCommit        prometheus.Histogram // seconds from sending a transaction to its COMMIT's answer
	// pgsse_publish_stage_seconds{stage}: the publish path's stages (stages.go).
	publishStages *prometheus.HistogramVec

	// Presence (presence.go): the (stream, subject) pairs this process counts, its writer's
	// statements, and the processes whose lapsed lease its writes removed.
	presenceSubjects     prometheus.Gauge
	presenceWrites       prometheus.Counter
	presenceLeaseExpired prometheus.Counter
}

// publishStageBuckets are pgsse_publish_stage_seconds' buckets: ten per decade (the R10
// series, each ≈ 1.26× the one before) from 10 µs to 10 ms, where the stages of a publish
// lie, so that histogram_quantile reads a stage's quantiles to within one bucket, and its
// median within 15 % even when every observation is one value
// (TestPublishStageBucketsResolveMedians); then 25 ms … 5 s as before.
var publishStageBuckets = []float64{
	.00001, .0000125, .000016, .00002, .000025, .0000315, .00004, .00005, .000063, .00008,
	.0001, .000125, .00016, .0002, .00025, .000315, .0004, .0005, .00063, .0008,
	.001, .00125, .0016, .002, .0025, .00315, .004, .005, .0063, .008,
	.01, .025, .05, .1, .25, .5, 1, 2.5, 5,
}

// rejectedStatuses are the error statuses the SSE port answers (docs/http.md's status table).
var rejectedStatuses = []int{400, 401, 403, 404, 405, 431}

// publishStatuses are the statuses publish requests are answered with (docs/http.md, Publishing
// over HTTP).
var publishStatuses = []int{200, 400, 401, 403, 408, 411, 413, 415, 417, 431, 500, 501, 503}

// newMetrics registers the series of s (whose cfg is complete) on reg.
//
// The state series — pgsse_ready, pgsse_listen_up, pgsse_schema_ok (read from s's atomics
// when scraped) and pgsse_notify_queue_usage — are registered only by a server that owns its
// LISTEN session and answers /readyz, never by a sibling of --procs: the first process's
// /metrics sums every pgsse_* series over the processes, and a readiness of 2 means nothing.
func newMetrics(reg prometheus.Registerer, s *Server) (*metrics, error) {
	dropped := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgsse_dropped_total", Help: "Deliveries or connections dropped, by reason."}, []string{"reason"})
	rejected := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgsse_rejected_total", Help: "HTTP requests refused, by status."}, []string{"status"})
	m := &metrics{
		sseConns:       prometheus.NewGauge(prometheus.GaugeOpts{Name: "pgsse_sse_connections", Help: "Subscribed SSE connections."}),
		hubWorkers:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "pgsse_hub_workers", Help: "Worker processes connected to the hub socket."}),
		listenChannels: prometheus.NewGauge(prometheus.GaugeOpts{Name: "pgsse_listen_channels", Help: "Raw channels LISTENed for SSE clients and hub workers (besides the stream channel)."}),
		lagging:        prometheus.NewGauge(prometheus.GaugeOpts{Name: "pgsse_lagging_connections", Help: "Durable subscribers paused over the high watermark, waiting to drain."}),
		notifications:  prometheus.NewCounter(prometheus.CounterOpts{Name: "pgsse_notifications_total", Help: "Notifications received on the LISTEN session."}),
		deliveries:     prometheus.NewCounter(prometheus.CounterOpts{Name: "pgsse_deliveries_total", Help: "Events written to SSE clients and hub workers."}),
		evictions:      prometheus.NewCounter(prometheus.CounterOpts{Name: "pgsse_evictions_total", Help: "Hub workers evicted for not reading."}),
		earlyDeliveries: prometheus.NewCounter(prometheus.CounterOpts{Name: "pgsse_early_deliveries_total",
			Help: "Durable events published over HTTP to this process and delivered to its subscribers as soon as their COMMIT was answered, before their notification."}),
		hubStallSeconds: prometheus.NewCounter(prometheus.CounterOpts{Name: "pgsse_hub_stall_seconds_total",
			Help: "Time notification delivery waited for hub workers whose buffer was full to take a lossless notification (at most 0.1 s per wait)."}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{Name: "pgsse_pg_reconnects_total", Help: "Times the LISTEN session was re-established."}),
		replays:    prometheus.NewCounter(prometheus.CounterOpts{Name: "pgsse_replay_reads_total", Help: "History reads issued for catching connections up."}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "pgsse_delivery_lag_seconds",
			Help:    "Publish (commit) to write, per live event.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}),
		outboundBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "pgsse_outbound_bytes",
			Help: "Bytes queued for SSE connections that their sockets have not taken yet (shared event encodings counted once); bounded by --max-outbound-memory."}),
		outboundWatermark: prometheus.NewGauge(prometheus.GaugeOpts{Name: "pgsse_outbound_watermark_bytes",
			Help: "The queued bytes over which a live durable subscriber stops taking live writes; shrinks from 256 KiB once pgsse_outbound_bytes passes a quarter of the budget, to its floor at half."}),
		outboundBudget: prometheus.NewGauge(prometheus.GaugeOpts{Name: "pgsse_outbound_budget_bytes",
			Help: "--max-outbound-memory: the bytes pgsse_outbound_bytes may reach; the queues settle below half of it."}),
		droppedSlowClient:    dropped.WithLabelValues("slow_client"),
		droppedBadPayload:    dropped.WithLabelValues("bad_payload"),
		droppedWakeCoalesced: dropped.WithLabelValues("hub_wake_coalesced"),
		rejected:             make(map[int]prometheus.Counter, len(rejectedStatuses)),
		rejectedOther:        rejected,
	}
	for _, status := range rejectedStatuses {
		m.rejected[status] = rejected.WithLabelValues(strconv.Itoa(status))
	}
	for why, label := range [shedReasons]string{
		shedOverCapacity: "over_capacity", shedDraining: "draining",
		shedDatabaseUnavailable: "database_unavailable", shedSubjectLimit: "subject_limit",
		shedChannelLimit: "channel_limit",
	} {
		m.shed[why] = dropped.WithLabelValues(label)
	}
	acceptErrors := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgsse_accept_errors_total",
		Help: "Connections that could not be accepted or handed to the loop (and were shed), by reason."}, []string{"reason"})
	for reason, label := range acceptReasonLabels {
		m.acceptErrors[reason] = acceptErrors.WithLabelValues(label)
	}
	published := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgsse_publish_requests_total", Help: "Answers to POST /streams/… and POST /publish, by status."}, []string{"status"})
	m.publishConns = prometheus.NewGauge(prometheus.GaugeOpts{Name: "pgsse_publish_connections", Help: "Connections on the SSE port counted as publishers (keep-alive)."})
	m.publishRequests = make(map[int]prometheus.Counter, len(publishStatuses))
	m.publishRequestsOther = published
	for _, status := range publishStatuses {
		m.publishRequests[status] = published.WithLabelValues(strconv.Itoa(status))
	}
	m.publishBatch = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "pgsse_publish_batch_size",
		Help:    "Events per committed publishing transaction (group commit: all requests that arrived while the previous one was in flight).",
		Buckets: []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000},
	})
	m.publishCommit = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "pgsse_publish_commit_seconds",
		Help:    "Time from sending a publishing transaction to PostgreSQL to the answer to its COMMIT.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
	})
	m.publishStages = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "pgsse_publish_stage_seconds",
		Help:    "The publish path's stages, each from the boundary before it: head (request head parsed), body (complete), queued (for commit), sent (transaction sent), committed (COMMIT answered), answered (publisher's answer written), notified (commit answered → notification received), written (notification received → first subscriber written).",
		Buckets: publishStageBuckets,
	}, []string{"stage"})
	m.presenceSubjects = prometheus.NewGauge(prometheus.GaugeOpts{Name: "pgsse_presence_subjects",
		Help: "Subjects this process counts on presence streams (one per stream and sub claim; anonymous connections not included)."})
	m.presenceWrites = prometheus.NewCounter(prometheus.CounterOpts{Name: "pgsse_presence_writes_total",
		Help: "Statements this process's presence writer sent to PostgreSQL (one per --presence-interval; two when its lease had been lost)."})
	m.presenceLeaseExpired = prometheus.NewCounter(prometheus.CounterOpts{Name: "pgsse_presence_lease_expiries_total",
		Help: "Other pgsse processes whose presence lease lapsed (died without cleaning up) and whose entries this process removed, announcing their subjects as leaves."})
	stat := func(read func(*auth.Stats) uint64) func() float64 {
		return func() float64 {
			if st := m.verifyStats.Load(); st != nil {
				return float64(read(st))
			}
			return 0
		}
	}
	tokens := []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "pgsse_token_cache_hits_total",
			Help: "Tokens answered from the verifier cache (verified or refused) without a signature check."},
			stat(func(st *auth.Stats) uint64 { return st.Hits.Load() + st.FailureHits.Load() })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "pgsse_token_verifications_total",
			Help: "Signature checks run on the verifier pool, by result.", ConstLabels: prometheus.Labels{"result": "ok"}},
			stat(func(st *auth.Stats) uint64 { return st.Verified.Load() })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "pgsse_token_verifications_total",
			Help: "Signature checks run on the verifier pool, by result.", ConstLabels: prometheus.Labels{"result": "failed"}},
			stat(func(st *auth.Stats) uint64 { return st.Failed.Load() })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "pgsse_token_queue_full_total",
			Help: "Requests shed because the verifier pool's queue was full."},
			stat(func(st *auth.Stats) uint64 { return st.QueueFull.Load() })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "pgsse_token_rescued_total",
			Help: "Tokens verified at the process's priority because they waited over 1 s for the lowered verifier threads (the host's CPU is busy with more than pgsse)."},
			stat(func(st *auth.Stats) uint64 { return st.Rescued.Load() })),
	}
	m.outboundBudget.Set(float64(s.cfg.MaxOutboundMemory))
	collectors := append([]prometheus.Collector{m.sseConns, m.hubWorkers, m.listenChannels, m.lagging, m.notifications,
		m.deliveries, m.earlyDeliveries, dropped, rejected, acceptErrors, m.evictions, m.hubStallSeconds, m.reconnects, m.replays, m.lag, m.outboundBytes, m.outboundWatermark,
		m.outboundBudget, m.publishConns, published, m.publishBatch, m.publishCommit, m.publishStages,
		m.presenceSubjects, m.presenceWrites, m.presenceLeaseExpired}, tokens...)
	if s.cfg.SiblingHub == nil {
		m.notifyQueue = prometheus.NewGauge(prometheus.GaugeOpts{Name: "pgsse_notify_queue_usage",
			Help: "PostgreSQL's NOTIFY queue in use, 0 to 1 (pg_notification_queue_usage(), read every 10 s); at 1 every NOTIFY, and so every publish, fails at commit."})
		up := func(ok func() bool) func() float64 {
			return func() float64 {
				if ok() {
					return 1
				}
				return 0
			}
		}
		collectors = append(collectors, m.notifyQueue,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "pgsse_ready",
				Help: "1 while /readyz answers 200 (the LISTEN session is up and the schema is at the expected version), else 0."}, up(s.Ready)),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "pgsse_listen_up",
				Help: "1 while the LISTEN session is up, else 0 (clients are told to retry and publishing answers 503)."}, up(s.lsn.ok)),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "pgsse_schema_ok",
				Help: "1 while the database's pgsse schema is at the version this binary expects (checked every 10 s), else 0."}, up(s.schemaOK.Load)),
		)
	}
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// readNotifyQueue sets pgsse_notify_queue_usage from pg_notification_queue_usage() on conn
// (the schema check's connection; a failed query leaves the last value). Nothing in a sibling.
func (m *metrics) readNotifyQueue(ctx context.Context, conn *pgconn.PgConn) {
	if m.notifyQueue == nil {
		return
	}
	res, err := conn.Exec(ctx, "SELECT pg_notification_queue_usage()").ReadAll()
	if err != nil || len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 1 {
		return
	}
	if u, err := strconv.ParseFloat(string(res[0].Rows[0][0]), 64); err == nil {
		m.notifyQueue.Set(u)
	}
}

// rejectedFor is the pgsse_rejected_total counter of one status.
func (m *metrics) rejectedFor(status int) prometheus.Counter {
	if c, ok := m.rejected[status]; ok {
		return c
	}
	return m.rejectedOther.WithLabelValues(strconv.Itoa(status))
}

// publishRequestsFor is the pgsse_publish_requests_total counter of one status.
func (m *metrics) publishRequestsFor(status int) prometheus.Counter {
	if c, ok := m.publishRequests[status]; ok {
		return c
	}
	return m.publishRequestsOther.WithLabelValues(strconv.Itoa(status))
}

// observePublish records one publishing transaction (store.PublisherConfig.Observe, called
// from a publisher goroutine; histograms are safe for that).
func (m *metrics) observePublish(g store.PublishGroup) {
	if g.Err != nil {
		return
	}
	m.publishBatch.Observe(float64(g.Events))
	m.publishCommit.Observe(g.Commit.Seconds())
}
