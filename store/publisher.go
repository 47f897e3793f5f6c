package store

import (
	"context"
	"crypto/md5"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// PublishAppName is the application_name of the Publisher's connections.
const PublishAppName = "pgsse-publish"

// Publisher defaults (PublisherConfig fields left zero).
const (
	DefaultPublishConns         = 1
	DefaultPublishQueueBytes    = 64 << 20 // queued and in-flight requests
	DefaultPublishQueueRequests = 4096
	DefaultPublishGroupEvents   = 5000    // events per transaction
	DefaultPublishGroupBytes    = 4 << 20 // data bytes per transaction (a larger request goes alone)
	DefaultSettingRefresh       = 5 * time.Second

	publishTxTimeout    = 60 * time.Second // one transaction, lock waits included
	publishConnTimeout  = 10 * time.Second
	publishRetryMin     = 100 * time.Millisecond
	publishRetryMax     = 5 * time.Second
	publishDownLogEvery = 30 * time.Second
	resolveTimeout      = 3 * time.Second // to learn whether a COMMIT whose answer was lost happened
	maxRetainedBuf      = 8 << 20
	publishStatement    = "pgsse_publish_many"
	// clock_timestamp() after the call (a FROM item runs before the target list): at or after
	// every publish time the call stored (PublishResult.TimeUS).
	publishSQL = "SELECT txid_current(), m.ids, clock_timestamp() FROM pgsse.publish_many($1) AS m(ids)"
)

// pgEpochUnixUS is PostgreSQL's epoch (2000-01-01 UTC) in µs since the Unix epoch: a binary
// timestamptz counts from it.
const pgEpochUnixUS = 946_684_800_000_000

var (
	// ErrUnavailable is matched (errors.Is) by every error that means "PostgreSQL could
	// not be reached or lost the connection": the caller answers 503 with Retry-After.
	ErrUnavailable = errors.New("PostgreSQL is unavailable")
	// ErrOutcomeUnknown is matched by the rare UnavailableError whose transaction lost
	// its connection during COMMIT and whose outcome could not be learned afterwards.
	ErrOutcomeUnknown = errors.New("the outcome of the publish is unknown")
	// ErrNotMigrated is matched by the UnavailableError of a publish into a database whose
	// pgsse schema is missing or older than SchemaVersion: `pgsse migrate` is the fix, and
	// nothing was published. (It matches ErrUnavailable too: retrying works once migrated.)
	ErrNotMigrated = fmt.Errorf("pgsse's schema is not installed in the database (or is older than version %d): run pgsse migrate", SchemaVersion)
	// ErrPublishQueueFull is returned by Submit when the queue is over its count or
	// byte budget (a 503 too: the server is overloaded, not broken).
	ErrPublishQueueFull = errors.New("store: publish queue full")
	// ErrPublisherClosed is returned by Submit after Close, and given to requests that
	// Close could not publish in time.
	ErrPublisherClosed = errors.New("store: publisher closed")
)

// UnavailableError says why PostgreSQL is unavailable. Unless Unknown is set, nothing of
// the request was published. errors.Is(err, ErrUnavailable) holds; with Unknown, also
// errors.Is(err, ErrOutcomeUnknown).
type UnavailableError struct {
	Cause   error
	Unknown bool // the connection was lost during COMMIT and its outcome is unknown
}

func (e *UnavailableError) Error() string {
	if e.Unknown {
		return "the connection to PostgreSQL was lost during COMMIT (" + e.Cause.Error() +
			") and could not be re-established to check the outcome: the events may or may not have been published"
	}
	if errors.Is(e.Cause, ErrNotMigrated) {
		return e.Cause.Error() + "; nothing was published"
	}
	return "PostgreSQL is unavailable (" + e.Cause.Error() + "); nothing was published"
}

func (e *UnavailableError) Unwrap() error { return e.Cause }

// Is matches ErrUnavailable, and ErrOutcomeUnknown when Unknown.
func (e *UnavailableError) Is(target error) bool {
	return target == ErrUnavailable || (e.Unknown && target == ErrOutcomeUnknown)
}

// PublishRequest is one caller's publish: one event (POST /streams) or a batch (POST
// /publish, an NDJSON file), published all or nothing in one transaction, each stream's
// events with contiguous ids in request order.
type PublishRequest struct {
	Events []PublishEvent
	Batch  bool // the events are lines of a batch: errors name line i+1
}

// PublishResult is the outcome of a request, given to its done callback.
type PublishResult struct {
	IDs []int64 // per event, in order; 0 for ephemeral events. Set only when Err is nil
	Err error
	// TimeUS is PostgreSQL's clock_timestamp() read after the transaction's pgsse.publish_many
	// (µs since the Unix epoch): no earlier than the publish time of any of its events, so a
	// reader that records it as the latest publish time it has accounted for takes the
	// events' own notifications for what they are (engine: early local delivery). Set
	// only when Err is nil.
	TimeUS int64
	// Times says when the request passed the publisher's stages (pgsse_publish_stage_seconds).
	Times PublishTimes
}

// PublishTimes are the moments a request passed the publisher's stages, as time.Now
// read them (monotonic). Queued is read once per request (in Submit), Sent and Committed
// once per transaction, shared by its requests: they cost nothing per event. Sent and
// Committed are set only when Err is nil; for a group retried (a conflict, a connection
// lost before COMMIT, a split) they are those of the transaction that committed it.
type PublishTimes struct {
	Queued    time.Time // Submit queued the request
	Sent      time.Time // its transaction's statement was handed to the connection
	Committed time.Time // PostgreSQL's answer to its COMMIT was read (or the outcome of a lost COMMIT learned)
}

// PublishGroup describes one transaction, for metrics (pgsse_publish_batch_size,
// pgsse_publish_commit_seconds).
type PublishGroup struct {
	Requests int
	Events   int
	Bytes    int64         // data bytes
	Commit   time.Duration // from sending the transaction to PostgreSQL's answer to COMMIT
	Err      error         // nil: committed
}

// PublisherConfig configures NewPublisher. Zero values take the defaults.
type PublisherConfig struct {
	DatabaseURL      string // "" = libpq environment
	Conns            int    // connections = transactions in flight at once (1 or 2 is plenty)
	MaxQueueBytes    int64  // budget for queued and in-flight requests (data, names, tags); one request alone may exceed it
	MaxQueueRequests int
	MaxGroupEvents   int           // events per transaction
	MaxGroupBytes    int64         // data bytes per transaction
	SettingRefresh   time.Duration // how often pgsse.max_event_bytes is re-read
	Logger           *slog.Logger
	// Observe, when set, is called from a publisher goroutine after each transaction.
	Observe func(PublishGroup)
}

// Publisher publishes events for the engine (POST /streams, POST /publish) and the CLI
// with group commit (docs/http.md, Publishing over HTTP): requests that arrive while a
// transaction is in flight are committed together in the next one, as one call of
// pgsse.publish_many (one NOTIFY per stream per transaction), and each request's callback runs
// only after COMMIT.
//
// Submit never blocks: it checks the request (names, sizes against pgsse.max_event_bytes
// as the publishing session sees it), queues it within a count and byte budget and
// returns. A few connections (application_name pgsse-publish) each take everything
// queued when they are free. A bad request never fails its neighbours: it is rejected
// by Submit, or before the transaction, or — should PostgreSQL reject what Go accepted —
// the group is retried one request per transaction. See the package documentation for
// what happens when PostgreSQL is unavailable.
type Publisher struct {
	cfg     PublisherConfig
	connCfg *pgconn.Config
	cfgErr  error
	log     *slog.Logger

	maxEventBytes atomic.Int64 // from the publishing sessions; -1 = not read yet
	settingErr    atomic.Pointer[error]
	down          atomic.Pointer[error] // set while PostgreSQL cannot be reached
	lastDownLog   time.Time             // guarded by mu

	mu           sync.Mutex
	shards       []publishShard // one per connection
	queued       int            // requests in all shards' queues
	pendingBytes int64          // queued and in flight
	closing      bool

	closeCh chan struct{} // closed by Close
	ctx     context.Context
	cancel  context.CancelFunc // aborts in-flight work when Close runs out of time
	wg      sync.WaitGroup

	testHooks
}

// testHooks are set by tests through newPublisher. testHook runs inside a transaction at
// stage "statement" (the answer with the xid has arrived, COMMIT not sent) and "commit"
// (COMMIT sent, its answer not read yet); testSkipTextCheck lets bad text reach PostgreSQL.
type testHooks struct {
	testHook          func(stage string, xid int64, conn *pgconn.PgConn)
	testSkipTextCheck bool
	testNoYield       bool // Submit does not yield to a waiting worker (BenchmarkPublisherSentStage)
}

// publishShard is one connection's queue. Requests go to the shard of their first
// event's stream, so one stream's requests are committed in the order they were
// submitted, and transactions in flight on two connections seldom wait for each other's
// counter rows.
type publishShard struct {
	queue []*pendingPublish // guarded by Publisher.mu
	wake  chan struct{}     // cap 1: the queue has work
	// waiting is set while the shard's worker waits for work (Submit hands it the CPU).
	waiting atomic.Bool
}

type pendingPublish struct {
	req    *PublishRequest
	done   func(PublishResult)
	bytes  int64
	queued time.Time
}

// NewPublisher starts the publisher's connections. A bad DatabaseURL is reported by
// every Submit.
func NewPublisher(cfg PublisherConfig) *Publisher { return newPublisher(cfg, testHooks{}) }

func newPublisher(cfg PublisherConfig, hooks testHooks) *Publisher {
	if cfg.Conns <= 0 {
		cfg.Conns = DefaultPublishConns
	}
	if cfg.MaxQueueBytes <= 0 {
		cfg.MaxQueueBytes = DefaultPublishQueueBytes
	}
	if cfg.MaxQueueRequests <= 0 {
		cfg.MaxQueueRequests = DefaultPublishQueueRequests
	}
	if cfg.MaxGroupEvents <= 0 {
		cfg.MaxGroupEvents = DefaultPublishGroupEvents
	}
	if cfg.MaxGroupBytes <= 0 {
		cfg.MaxGroupBytes = DefaultPublishGroupBytes
	}
	if cfg.SettingRefresh <= 0 {
		cfg.SettingRefresh = DefaultSettingRefresh
	}
	p := &Publisher{
		cfg:       cfg,
		log:       cfg.Logger,
		shards:    make([]publishShard, cfg.Conns),
		closeCh:   make(chan struct{}),
		testHooks: hooks,
	}
	if p.log == nil {
		p.log = slog.Default()
	}
	p.maxEventBytes.Store(-1) // unknown until a connection reads it: Submit skips the size check, the worker does it
	p.connCfg, p.cfgErr = pgconn.ParseConfig(cfg.DatabaseURL)
	if p.cfgErr != nil {
		p.cfgErr = fmt.Errorf("store: publish: %w", p.cfgErr)
		return p
	}
	p.connCfg.RuntimeParams["application_name"] = PublishAppName
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.wg.Add(cfg.Conns)
	for i := range p.shards {
		p.shards[i].wake = make(chan struct{}, 1)
		go (&publishWorker{p: p, shard: &p.shards[i]}).loop()
	}
	return p
}

// MaxEventBytes is pgsse.max_event_bytes as the publishing sessions last read it (-1
// before the first connection has read it), and the error when the setting is not a
// whole number of bytes.
func (p *Publisher) MaxEventBytes() (int64, error) {
	if e := p.settingErr.Load(); e != nil {
		return 0, *e
	}
	return p.maxEventBytes.Load(), nil
}

// Submit queues req. On nil, done will be called exactly once, from a publisher
// goroutine, after the request's transaction committed (or failed); req and its data
// must stay unchanged until then, and done must not block (the engine pushes a loop
// task). Otherwise done is never called and the error is one of:
// an *EventError (the request is bad: 400, or 413 when errors.Is ErrEventTooLarge),
// ErrPublishQueueFull, an UnavailableError, ErrPublisherClosed, or the setting's error.
// Submit does not block and is safe for concurrent use. When the worker it wakes was waiting
// for work, Submit yields the thread to it (runtime.Gosched), so that the transaction goes
// out at once instead of after another thread is woken; the caller goes on once the worker
// has sent it (tens of µs).
func (p *Publisher) Submit(req *PublishRequest, done func(PublishResult)) error {
	if p.cfgErr != nil {
		return p.cfgErr
	}
	if err := p.check(req); err != nil {
		return err
	}
	size := int64(0)
	for i := range req.Events {
		size += req.Events[i].size()
	}
	queued := time.Now()
	p.mu.Lock()
	switch {
	case p.closing:
		p.mu.Unlock()
		return ErrPublisherClosed
	case p.down.Load() != nil:
		cause := *p.down.Load()
		p.mu.Unlock()
		return &UnavailableError{Cause: cause}
	case p.queued >= p.cfg.MaxQueueRequests,
		p.pendingBytes > 0 && p.pendingBytes+size > p.cfg.MaxQueueBytes:
		p.mu.Unlock()
		return ErrPublishQueueFull
	}
	sh := &p.shards[shardOf(req.Events[0].Stream, len(p.shards))]
	sh.queue = append(sh.queue, &pendingPublish{req: req, done: done, bytes: size, queued: queued})
	p.queued++
	p.pendingBytes += size
	p.mu.Unlock()
	sh.signal()
	if sh.waiting.Load() && !p.testNoYield {
		// The worker is parked on sh.wake and now sits in this P's run queue: yielding
		// runs it here at once, where otherwise another thread would be woken to take
		// it (tens of µs on a small VM, the sent stage). The caller — the loop — goes
		// on in a moment, on this thread or that one.
		runtime.Gosched()
	}
	return nil
}

// check does the request's cheap checks (everything but the bytes of data).
func (p *Publisher) check(req *PublishRequest) error {
	if len(req.Events) == 0 {
		return &EventError{Err: ErrEmptyRequest}
	}
	if len(req.Events) > MaxBatchEvents {
		return &EventError{Err: ErrTooManyEvents}
	}
	max, err := p.MaxEventBytes()
	if err != nil {
		return err // pgsse.publish_many fails on it too, ephemeral events or not
	}
	for i := range req.Events {
		if err := req.Events[i].checkNames(max); err != nil {
			return withLine(err, req, i)
		}
	}
	return nil
}

// withLine sets the line of an *EventError about event i of req, when req is a batch.
func withLine(err error, req *PublishRequest, i int) error {
	var ee *EventError
	if req.Batch && errors.As(err, &ee) {
		ee.Line = i + 1
	}
	return err
}

// shardOf maps a stream name to one of n shards (FNV-1a).
func shardOf(stream string, n int) int {
	h := uint32(2166136261)
	for i := 0; i < len(stream); i++ {
		h = (h ^ uint32(stream[i])) * 16777619
	}
	return int(h % uint32(n))
}

func (sh *publishShard) signal() {
	select {
	case sh.wake <- struct{}{}:
	default:
	}
}

// Close stops accepting requests, publishes what is queued until ctx is done, then fails
// the rest with ErrPublisherClosed (aborting a transaction still in flight, whose
// requests may then get an UnavailableError), and closes the connections.
func (p *Publisher) Close(ctx context.Context) {
	p.mu.Lock()
	if p.closing {
		p.mu.Unlock()
		p.wg.Wait()
		return
	}
	p.closing = true
	p.mu.Unlock()
	close(p.closeCh)
	if p.cancel == nil { // bad config: no workers
		return
	}
	finished := make(chan struct{})
	go func() { p.wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-ctx.Done():
		p.cancel()
		<-finished
	}
	p.cancel()
	p.failQueued(ErrPublisherClosed)
}

// failQueued answers every queued request with err.
func (p *Publisher) failQueued(err error) {
	var q []*pendingPublish
	p.mu.Lock()
	for i := range p.shards {
		q = append(q, p.shards[i].queue...)
		clear(p.shards[i].queue)
		p.shards[i].queue = p.shards[i].queue[:0]
	}
	p.queued = 0
	p.mu.Unlock()
	for _, pp := range q {
		p.finish(pp, PublishResult{Err: err})
	}
}

// finish calls pp's callback and returns its bytes to the budget.
func (p *Publisher) finish(pp *pendingPublish, res PublishResult) {
	p.mu.Lock()
	p.pendingBytes -= pp.bytes
	p.mu.Unlock()
	res.Times.Queued = pp.queued
	pp.done(res)
}

// take removes the next group from sh's queue: FIFO, at least one request, then as many
// as fit in MaxGroupEvents and MaxGroupBytes.
func (p *Publisher) take(sh *publishShard) []*pendingPublish {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, events, bytes := 0, 0, int64(0)
	for _, pp := range sh.queue {
		e := len(pp.req.Events)
		if n > 0 && (events+e > p.cfg.MaxGroupEvents || bytes+pp.bytes > p.cfg.MaxGroupBytes) {
			break
		}
		n, events, bytes = n+1, events+e, bytes+pp.bytes
	}
	if n == 0 {
		return nil
	}
	group := make([]*pendingPublish, n)
	copy(group, sh.queue)
	rest := copy(sh.queue, sh.queue[n:])
	clear(sh.queue[rest:])
	sh.queue = sh.queue[:rest]
	p.queued -= n
	return group
}

// markDown records that PostgreSQL cannot be reached: Submit refuses requests until a
// connection succeeds again, and everything queued fails now.
func (p *Publisher) markDown(cause error) {
	p.down.Store(&cause)
	p.mu.Lock()
	logNow := time.Since(p.lastDownLog) >= publishDownLogEvery
	if logNow {
		p.lastDownLog = time.Now()
	}
	p.mu.Unlock()
	switch {
	case !logNow:
	case errors.Is(cause, ErrNotMigrated):
		p.log.Error("publish: the database is not migrated (run pgsse migrate); publish requests are answered 503 until it is",
			"err", cause)
	default:
		p.log.Warn("publish: cannot reach PostgreSQL; publish requests are answered 503 until it is back, reconnecting with backoff",
			"err", cause)
	}
	p.failQueued(&UnavailableError{Cause: cause})
}

func (p *Publisher) markUp() {
	if p.down.Swap(nil) != nil {
		p.log.Info("publish: connected to PostgreSQL again; accepting publish requests")
	}
}

func (p *Publisher) setSetting(raw string) {
	v, err := ParseMaxEventBytes(raw)
	if err != nil {
		if p.settingErr.Swap(&err) == nil {
			p.log.Error("publish: the PostgreSQL setting is invalid; durable publishes fail until it is fixed",
				"setting", SettingMaxEventBytes, "err", err)
		}
		return
	}
	p.maxEventBytes.Store(v)
	p.settingErr.Store(nil)
}

// publishWorker owns one connection and runs one transaction at a time.
type publishWorker struct {
	p           *Publisher
	shard       *publishShard
	conn        *pgconn.PgConn
	stmt        *pgconn.StatementDescription
	messageOID  uint32
	settingsKey string // fingerprint of the pg_db_role_setting rows for the setting at connect
	buf         []byte
	refresh     *time.Timer
	// refreshPending: the refresh timer fired while a chain of groups ran; the loop
	// re-reads the setting next.
	refreshPending bool
}

// setupSQL reads, on a new connection, the OID of pgsse.message, the setting and the
// fingerprint of where a new session would get it from (ALTER DATABASE/ROLE … SET).
const setupSQL = `SELECT 'pgsse.message'::regtype::oid, ` + refreshColumns

// refreshColumns: the session's pgsse.max_event_bytes, and a fingerprint of the
// pg_db_role_setting rows that a new session of this role in this database would take
// it from. A session keeps the value it started with, so when the fingerprint changes
// the worker reconnects to see the new value, and Go and SQL keep agreeing.
const refreshColumns = `coalesce(current_setting('pgsse.max_event_bytes', true), ''),
	(SELECT coalesce(string_agg(s.setdatabase::text || ':' || s.setrole::text || ':' || c, ',' ORDER BY s.setdatabase, s.setrole, c), '')
	 FROM pg_db_role_setting s, unnest(s.setconfig) AS c
	 WHERE c LIKE 'pgsse.max\_event\_bytes=%'
	   AND s.setdatabase IN (0, (SELECT oid FROM pg_database WHERE datname = current_database()))
	   AND s.setrole IN (0, (SELECT oid FROM pg_roles WHERE rolname = session_user)))`

func (w *publishWorker) loop() {
	p := w.p
	defer p.wg.Done()
	defer w.closeConn()
	w.refresh = time.NewTimer(p.cfg.SettingRefresh)
	defer w.refresh.Stop()
	backoff := publishRetryMin
	for p.ctx.Err() == nil {
		if w.conn == nil {
			if err := w.connect(); err != nil {
				p.markDown(err)
				if p.isClosing() || !w.sleep(backoff) {
					return
				}
				backoff = min(2*backoff, publishRetryMax)
				continue
			}
			backoff = publishRetryMin
			p.markUp()
		}
		if w.refreshDue() { // due even while busy
			w.refreshPending = false
			w.refreshSetting()
			w.refresh.Reset(p.cfg.SettingRefresh)
			continue
		}
		if group := p.take(w.shard); group != nil {
			w.publish(group)
			continue
		}
		if p.isClosing() {
			return
		}
		w.shard.waiting.Store(true)
		select {
		case <-w.shard.wake:
			w.shard.waiting.Store(false)
		case <-p.closeCh:
			w.shard.waiting.Store(false)
		case <-w.refresh.C:
			w.shard.waiting.Store(false)
			w.refreshSetting()
			w.refresh.Reset(p.cfg.SettingRefresh)
		}
	}
}

func (p *Publisher) isClosing() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closing
}

// sleep waits d, or less when Close starts; false means the publisher is being aborted.
func (w *publishWorker) sleep(d time.Duration) bool { return w.wait(d, w.p.closeCh) }

// pause waits d even while closing; false means the publisher is being aborted.
func (w *publishWorker) pause(d time.Duration) bool { return w.wait(d, nil) }

func (w *publishWorker) wait(d time.Duration, early <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-early:
		return true
	case <-w.p.ctx.Done():
		return false
	}
}

func (w *publishWorker) closeConn() {
	if w.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = w.conn.Close(ctx)
		cancel()
		w.conn = nil
	}
}

// connect opens the worker's connection, reads the setting and prepares the statement.
func (w *publishWorker) connect() error { return w.connectWithin(publishConnTimeout) }

func (w *publishWorker) connectWithin(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(w.p.ctx, timeout)
	defer cancel()
	conn, err := pgconn.ConnectConfig(ctx, w.p.connCfg)
	if err != nil {
		return err
	}
	res, err := conn.Exec(ctx, setupSQL).ReadAll()
	if err == nil && (len(res) != 1 || len(res[0].Rows) != 1) {
		err = errors.New("unexpected answer to the setup query")
	}
	var oid uint64
	if err == nil {
		row := res[0].Rows[0]
		oid, err = strconv.ParseUint(string(row[0]), 10, 32)
		w.p.setSetting(string(row[1]))
		w.settingsKey = string(row[2])
	}
	if err == nil {
		w.stmt, err = conn.Prepare(ctx, publishStatement, publishSQL, nil)
	}
	if err != nil {
		_ = conn.Close(context.Background())
		var pe *pgconn.PgError
		if errors.As(err, &pe) && (pe.Code == "42704" || pe.Code == "42883" || pe.Code == "3F000") {
			return fmt.Errorf("%w (%w)", ErrNotMigrated, err)
		}
		return err
	}
	w.conn, w.messageOID = conn, uint32(oid)
	w.refresh.Reset(w.p.cfg.SettingRefresh)
	return nil
}

// refreshSetting re-reads the setting; when a new session would see another value
// (ALTER DATABASE/ROLE … SET), it drops the connection so the next one sees it.
func (w *publishWorker) refreshSetting() {
	if w.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(w.p.ctx, publishConnTimeout)
	defer cancel()
	res, err := w.conn.Exec(ctx, "SELECT "+refreshColumns).ReadAll()
	if err != nil || len(res) != 1 || len(res[0].Rows) != 1 {
		w.p.log.Warn("publish: re-reading the setting failed; reconnecting", "setting", SettingMaxEventBytes, "err", err)
		w.closeConn()
		return
	}
	row := res[0].Rows[0]
	if string(row[1]) != w.settingsKey {
		w.p.log.Info("publish: the setting changed for new sessions; renewing the publishing connection", "setting", SettingMaxEventBytes)
		w.closeConn() // the next session starts with the new value
		return
	}
	w.p.setSetting(string(row[0]))
}

// publish runs one group, and the groups queued behind it (publishChain): checks the
// data, then one transaction per group (retried or split as a failure requires), then
// answers every request.
func (w *publishWorker) publish(group []*pendingPublish) {
	if ok := w.checkGroup(group); len(ok) > 0 {
		w.publishChain(ok)
	}
}

// checkGroup answers the requests of group whose data fails the checks Submit leaves to
// the publisher goroutine, and returns the others.
func (w *publishWorker) checkGroup(group []*pendingPublish) []*pendingPublish {
	p := w.p
	max, settingErr := p.MaxEventBytes()
	ok := group[:0]
	for _, pp := range group {
		if err := checkRequestData(pp.req, max, settingErr, p.testSkipTextCheck); err != nil {
			p.finish(pp, PublishResult{Err: err})
			continue
		}
		ok = append(ok, pp)
	}
	return ok
}

// checkRequestData runs the checks Submit leaves to the publisher goroutine: the bytes
// of data and tags, and the names again against the current setting.
func checkRequestData(req *PublishRequest, max int64, settingErr error, skipText bool) error {
	if settingErr != nil {
		return settingErr
	}
	for i := range req.Events {
		ev := &req.Events[i]
		if err := ev.checkNames(max); err != nil {
			return withLine(err, req, i)
		}
		if err := ev.checkText(); err != nil && !skipText {
			return withLine(err, req, i)
		}
	}
	return nil
}

// Failure kinds of one transaction.
type txFailure int

const (
	txOK         txFailure = iota
	txNotSent              // the connection failed before COMMIT: nothing published, safe to retry
	txCommitLost           // the connection was lost after COMMIT was sent: outcome unknown
	txRejected             // PostgreSQL rejected the statement (class 22/23; connection fine)
	txConflict             // deadlock or serialization failure: retry
	txFailed               // anything else PostgreSQL refused (NOTIFY queue full, timeout, …)
)

const maxConflictRetries = 3

// attempt counts the retries of one group.
type attempt struct {
	conflicts   int
	reconnected bool
}

// txGroup is one group's transaction: its events in order and the ids they get.
type txGroup struct {
	group  []*pendingPublish
	events []*PublishEvent
	ids    []int64
	data   int64     // data bytes
	start  time.Time // the statement was handed to the connection (PublishTimes.Sent)
	timeUS int64     // PostgreSQL's clock after publish_many (PublishResult.TimeUS)
}

func newTxGroup(group []*pendingPublish) *txGroup {
	g := &txGroup{group: group}
	for _, pp := range group {
		for i := range pp.req.Events {
			g.events = append(g.events, &pp.req.Events[i])
			g.data += int64(len(pp.req.Events[i].Data))
		}
	}
	g.ids = make([]int64, len(g.events))
	return g
}

// publishGroup runs group as one transaction and answers it.
func (w *publishWorker) publishGroup(group []*pendingPublish, try attempt) {
	g := newTxGroup(group)
	g.start = time.Now()
	failure, xid, err := w.transaction(g)
	w.settle(g, failure, xid, err, try)
}

// settle answers a group's transaction by its outcome: the ids, or an error — after
// learning the outcome of a lost COMMIT, retrying a conflict or a transaction that never
// reached COMMIT once, or splitting a group PostgreSQL refused into one transaction per
// request. It may run transactions, so the connection must not be in a pipeline.
func (w *publishWorker) settle(g *txGroup, failure txFailure, xid int64, err error, try attempt) {
	p, group := w.p, g.group
	if failure == txCommitLost {
		failure, err = w.resolve(g, xid, err)
	}
	answered := time.Now() // the one reading of "commit answered" for the whole group
	stats := PublishGroup{Requests: len(group), Events: len(g.events), Bytes: g.data, Commit: answered.Sub(g.start), Err: err}
	observe := func() {
		if p.cfg.Observe != nil {
			p.cfg.Observe(stats)
		}
	}
	switch failure {
	case txOK:
		observe()
		off := 0
		for _, pp := range group {
			n := len(pp.req.Events)
			p.finish(pp, PublishResult{IDs: g.ids[off : off+n : off+n], TimeUS: g.timeUS, Times: PublishTimes{Sent: g.start, Committed: answered}})
			off += n
		}
		return
	case txConflict:
		if try.conflicts < maxConflictRetries {
			observe()
			try.conflicts++
			w.publishGroup(group, try)
			return
		}
		err = &UnavailableError{Cause: err}
	case txRejected:
		if len(group) > 1 {
			// PostgreSQL refused what Go accepted (say the setting changed meanwhile):
			// one request per transaction, so that the bad one fails alone.
			observe()
			for _, pp := range group {
				w.publishGroup([]*pendingPublish{pp}, attempt{})
			}
			return
		}
		err = w.rejected(group[0].req, err)
	case txNotSent:
		// Nothing was published: once more, on a new connection if need be.
		if !try.reconnected && p.ctx.Err() == nil && (w.conn != nil || w.connect() == nil) {
			observe()
			try.reconnected = true
			w.publishGroup(group, try)
			return
		}
		err = &UnavailableError{Cause: err}
	case txFailed:
		err = &UnavailableError{Cause: err}
	case txCommitLost:
		// err is an UnavailableError with Unknown set.
	}
	stats.Err = err
	observe()
	for _, pp := range group {
		p.finish(pp, PublishResult{Err: err})
	}
}

// ownsFirstEvent reports whether the group's first durable event is stored under the id the
// transaction gave it, inserted by xid (xmin holds its low 32 bits), with the same data.
// Without a durable event it reports true: nothing tells the transaction apart.
func (w *publishWorker) ownsFirstEvent(g *txGroup, xid int64) (bool, error) {
	for i, e := range g.events {
		if e.Ephemeral || g.ids[i] <= 0 {
			continue
		}
		sum := md5.Sum(e.Data)
		ctx, cancel := context.WithTimeout(w.p.ctx, resolveTimeout)
		defer cancel()
		res := w.conn.ExecParams(ctx,
			"SELECT count(*) FROM pgsse.events WHERE stream = $1 AND id = $2 AND xmin = $3::xid AND md5(data) = $4",
			[][]byte{[]byte(e.Stream), []byte(strconv.FormatInt(g.ids[i], 10)),
				[]byte(strconv.FormatInt(xid&0xffffffff, 10)), []byte(hex.EncodeToString(sum[:]))},
			nil, nil, nil).Read()
		if res.Err != nil {
			return false, res.Err
		}
		return len(res.Rows) == 1 && string(res.Rows[0][0]) == "1", nil
	}
	return true, nil
}

// rejected words a PostgreSQL rejection of a single request: the Go check's error when
// the setting changed meanwhile, else the PostgreSQL error as a bad request.
func (w *publishWorker) rejected(req *PublishRequest, err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code[:2] != "22" {
		return err
	}
	w.refreshSetting()
	max, settingErr := w.p.MaxEventBytes()
	if cerr := checkRequestData(req, max, settingErr, false); cerr != nil {
		return cerr
	}
	return &EventError{Err: err}
}

// transaction runs `SELECT txid_current(), pgsse.publish_many($1)` as an implicit
// transaction in two steps: the statement with a Flush (its answer carries the xid while
// the transaction is still open), then Sync, which commits. A lost connection in the
// first step means nothing was published; in the second, resolve asks PostgreSQL.
func (w *publishWorker) transaction(g *txGroup) (txFailure, int64, error) {
	if w.conn == nil {
		return txNotSent, 0, errors.New("no connection")
	}
	defer w.trimBuf()
	ctx, cancel := context.WithTimeout(w.p.ctx, publishTxTimeout)
	defer cancel()
	pl := w.conn.StartPipeline(ctx)
	w.sendStatement(pl, g.events)
	if err := pl.Flush(); err != nil {
		return w.lost(pl, txNotSent, 0, err)
	}
	xid, err := w.readStatement(pl, g)
	if err != nil {
		return w.abortStatement(pl, err)
	}
	if w.p.testHook != nil {
		w.p.testHook("statement", xid, w.conn)
	}
	pl.SendPipelineSync()
	if err := pl.Flush(); err != nil {
		return w.lost(pl, txCommitLost, xid, err)
	}
	if w.p.testHook != nil {
		w.p.testHook("commit", xid, w.conn)
	}
	if _, err := pl.GetResults(); err != nil {
		if w.conn.IsClosed() {
			return w.lost(pl, txCommitLost, xid, err)
		}
		_ = pl.Close()
		return classifyRejection(err), 0, err // e.g. the NOTIFY queue is full: not committed
	}
	if err := pl.Close(); err != nil {
		return w.lost(pl, txCommitLost, xid, err)
	}
	return txOK, xid, nil
}

// publishChainMax bounds how long one pipeline chains groups (its context's deadline is
// publishTxTimeout).
const publishChainMax = 5 * time.Second

// publishChain publishes group, then the groups queued behind it, without a round trip
// between them: the next group's statement goes out in the same write as this group's
// Sync (its COMMIT), so PostgreSQL starts on it as soon as the COMMIT is done while the
// publisher answers the committed group. Each group is still its own implicit
// transaction whose statement's answer, carrying its xid, arrives before its Sync is
// sent: a connection lost after a Sync went out is resolved as in transaction, and the
// next group's statement, which had no Sync, was not committed. The chain ends when
// nothing is queued, after publishChainMax, when the setting is due to be re-read, or on
// a failure; failed groups are settled as publishGroup would, once the pipeline is
// closed.
func (w *publishWorker) publishChain(group []*pendingPublish) {
	if w.conn == nil {
		w.publishGroup(group, attempt{})
		return
	}
	type outcome struct {
		g   *txGroup
		f   txFailure
		xid int64
		err error
	}
	var failed []outcome // settled once the pipeline is closed: settling may run transactions
	defer func() {
		for _, o := range failed {
			w.settle(o.g, o.f, o.xid, o.err, attempt{})
		}
	}()
	defer w.trimBuf()
	ctx, cancel := context.WithTimeout(w.p.ctx, publishTxTimeout)
	defer cancel()
	chainStart := time.Now()
	cur := newTxGroup(group)
	cur.start = chainStart
	pl := w.conn.StartPipeline(ctx)
	w.sendStatement(pl, cur.events)
	if err := pl.Flush(); err != nil {
		f, xid, err := w.lost(pl, txNotSent, 0, err)
		failed = append(failed, outcome{cur, f, xid, err})
		return
	}
	for {
		xid, err := w.readStatement(pl, cur)
		if err != nil {
			f, xid, err := w.abortStatement(pl, err)
			failed = append(failed, outcome{cur, f, xid, err})
			return
		}
		if w.p.testHook != nil {
			w.p.testHook("statement", xid, w.conn)
		}
		var next *txGroup
		if time.Since(chainStart) < publishChainMax && !w.refreshDue() {
			if queued := w.p.take(w.shard); queued != nil {
				if ok := w.checkGroup(queued); len(ok) > 0 {
					next = newTxGroup(ok)
				}
			}
		}
		pl.SendPipelineSync()
		if next != nil {
			next.start = time.Now()
			w.sendStatement(pl, next.events)
		}
		if err := pl.Flush(); err != nil {
			f, xid, err := w.lost(pl, txCommitLost, xid, err)
			failed = append(failed, outcome{cur, f, xid, err})
			if next != nil {
				failed = append(failed, outcome{next, txNotSent, 0, err})
			}
			return
		}
		if w.p.testHook != nil {
			w.p.testHook("commit", xid, w.conn)
		}
		if _, err := pl.GetResults(); err != nil {
			if w.conn.IsClosed() {
				f, xid, err := w.lost(pl, txCommitLost, xid, err)
				failed = append(failed, outcome{cur, f, xid, err})
				if next != nil {
					failed = append(failed, outcome{next, txNotSent, 0, err})
				}
				return
			}
			// COMMIT refused (e.g. the NOTIFY queue is full): not committed. Its
			// ReadyForQuery follows; the next statement runs in a transaction of its own.
			failed = append(failed, outcome{cur, classifyRejection(err), 0, err})
			if _, err := pl.GetResults(); err != nil {
				f, xid, err := w.lost(pl, txNotSent, 0, err)
				if next != nil {
					failed = append(failed, outcome{next, f, xid, err})
				}
				return
			}
		} else {
			w.settle(cur, txOK, xid, nil, attempt{}) // answers only: no statement runs
		}
		if next == nil {
			if err := pl.Close(); err != nil {
				w.closeConn() // everything was answered; the next group reconnects
			}
			return
		}
		cur = next
	}
}

// refreshDue reports whether the setting is due to be re-read (the timer fired).
func (w *publishWorker) refreshDue() bool {
	select {
	case <-w.refresh.C:
		w.refreshPending = true
	default:
	}
	return w.refreshPending
}

// trimBuf drops a message buffer that grew beyond maxRetainedBuf.
func (w *publishWorker) trimBuf() {
	if cap(w.buf) > maxRetainedBuf {
		w.buf = nil
	}
}

// sendStatement queues the statement for events, and a Flush request, on pl.
func (w *publishWorker) sendStatement(pl *pgconn.Pipeline, events []*PublishEvent) {
	w.buf = appendMessageArray(w.buf[:0], w.messageOID, events)
	pl.SendQueryStatement(w.stmt, [][]byte{w.buf}, []int16{1}, []int16{1, 1, 1})
	pl.SendFlushRequest()
}

// readStatement reads the statement's answer: the transaction's xid, and the ids and
// PostgreSQL's clock after them into g.
func (w *publishWorker) readStatement(pl *pgconn.Pipeline, g *txGroup) (int64, error) {
	var xid int64
	res, err := pl.GetResults()
	if err != nil {
		return 0, err
	}
	rr, _ := res.(*pgconn.ResultReader)
	if rr == nil {
		return 0, errors.New("no result for pgsse.publish_many")
	}
	rows := 0
	for rr.NextRow() {
		rows++
		v := rr.Values()
		if len(v) != 3 || len(v[0]) != 8 || len(v[2]) != 8 {
			err = errors.New("unexpected row from pgsse.publish_many")
			continue
		}
		xid = int64(binary.BigEndian.Uint64(v[0]))
		g.timeUS = int64(binary.BigEndian.Uint64(v[2])) + pgEpochUnixUS
		err = parseIDArray(v[1], g.ids)
	}
	if _, cerr := rr.Close(); cerr != nil {
		return 0, cerr
	}
	if err == nil && rows != 1 {
		err = errors.New("no row from pgsse.publish_many")
	}
	return xid, err
}

// abortStatement ends a pipeline whose statement failed: its implicit transaction is
// aborted (nothing was published) and the failure classified.
func (w *publishWorker) abortStatement(pl *pgconn.Pipeline, err error) (txFailure, int64, error) {
	if w.conn.IsClosed() {
		return w.lost(pl, txNotSent, 0, err)
	}
	pl.SendPipelineSync()
	_ = pl.Flush()
	_ = pl.Close()
	if w.conn.IsClosed() {
		return w.lost(pl, txNotSent, 0, err)
	}
	return classifyRejection(err), 0, err
}

// lost drops the connection after a failure.
func (w *publishWorker) lost(pl *pgconn.Pipeline, f txFailure, xid int64, err error) (txFailure, int64, error) {
	_ = pl.Close()
	w.closeConn()
	return f, xid, err
}

func classifyRejection(err error) txFailure {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case pe.Code == "40001" || pe.Code == "40P01":
			return txConflict
		case pe.Code[:2] == "22" || pe.Code[:2] == "23":
			return txRejected
		}
	}
	return txFailed
}

// resolve learns the outcome of a transaction whose COMMIT lost its answer, from a new
// connection: txid_status(xid) is 'committed' or 'aborted' once the old backend is gone.
//
// 'committed' is not the whole answer: if PostgreSQL crashed (or a replica was promoted)
// before anything of the transaction reached the WAL, recovery hands its xid out again, and
// another transaction may have committed under it by now. So a committed xid is confirmed by
// the group's first durable event: stored under the id it was given, by that xid, with the
// same data (ownsFirstEvent). A group without a durable event has nothing to confirm by.
func (w *publishWorker) resolve(g *txGroup, xid int64, cause error) (txFailure, error) {
	deadline := time.Now().Add(resolveTimeout)
	for time.Now().Before(deadline) {
		if w.conn == nil {
			if err := w.connectWithin(time.Until(deadline)); err != nil {
				if !w.pause(publishRetryMin) {
					break
				}
				continue
			}
		}
		ctx, cancel := context.WithTimeout(w.p.ctx, resolveTimeout)
		res := w.conn.ExecParams(ctx, "SELECT txid_status($1)", [][]byte{[]byte(strconv.FormatInt(xid, 10))},
			[]uint32{oidInt8}, nil, nil).Read()
		cancel()
		var pe *pgconn.PgError
		if errors.As(res.Err, &pe) && pe.Code == "22023" { // "transaction ID … is in the future"
			// No transaction has had this xid since PostgreSQL restarted: it never committed.
			w.p.log.Warn("publish: the connection was lost during COMMIT and PostgreSQL restarted without the transaction; publishing it again",
				"cause", cause, "xid", xid)
			return txNotSent, cause
		}
		if res.Err != nil {
			w.closeConn()
			continue
		}
		if len(res.Rows) == 1 && string(res.Rows[0][0]) == "committed" {
			owns, err := w.ownsFirstEvent(g, xid)
			if err != nil {
				w.closeConn()
				continue
			}
			if !owns {
				w.p.log.Warn("publish: the connection was lost during COMMIT and PostgreSQL restarted: the transaction's xid was handed out again after recovery and its events are not stored; publishing them again",
					"cause", cause, "xid", xid)
				return txNotSent, cause
			}
		}
		if len(res.Rows) == 1 {
			switch string(res.Rows[0][0]) {
			case "committed":
				w.p.log.Info("publish: the connection was lost during COMMIT; the transaction had committed", "cause", cause)
				return txOK, nil
			case "aborted":
				return txNotSent, cause
			case "in progress": // the old backend has not noticed yet
				if !w.pause(20 * time.Millisecond) {
					return txCommitLost, &UnavailableError{Cause: cause, Unknown: true}
				}
				continue
			}
		}
		break
	}
	w.p.log.Warn("publish: the connection was lost during COMMIT and the outcome could not be learned; the requests get an outcome-unknown 503",
		"cause", cause, "xid", xid)
	return txCommitLost, &UnavailableError{Cause: cause, Unknown: true}
}
