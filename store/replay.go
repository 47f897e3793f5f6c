package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgsse/pgsse/names"
)

// Replay limits.
const (
	DefaultReplayLimit = 500     // events per batch when ReadRequest.Limit is 0
	MaxReplayLimit     = 10000   // larger limits are clamped
	MaxBatchBytes      = 4 << 20 // data bytes per batch (a batch always holds at least one event)
	ReplayQueueSize    = 65536   // requests waiting for a connection
	ReplayAppName      = "pgsse-replay"
	replayConnTimeout  = 10 * time.Second
	replayQueryTimeout = 30 * time.Second
	replayStatement    = "pgsse_replay"
)

var (
	// ErrClosed is the result of requests still queued or running when the Replayer closes.
	ErrClosed = errors.New("store: replayer closed")
	// ErrBadRequest wraps what is wrong with a ReadRequest.
	ErrBadRequest = errors.New("store: bad replay request")
)

// Event is one durable event read from pgsse.events.
type Event struct {
	ID       int64
	Event    string   // "" = "message"
	Data     []byte   // owned by the result and never written again; what Encode made of it when the request has Encode
	Audience []string // nil = everyone
	TimeUS   int64    // created_at (the publishing transaction's start), µs since the epoch
}

// ReadRequest asks for one batch of a stream's events.
type ReadRequest struct {
	Stream       string
	After        int64    // events with id > After
	Tags         []string // the reader's tags: an event with a non-empty audience is returned only if it intersects Tags
	AllAudiences bool     // ignore Tags: return every event with its Audience (the engine filters per connection)
	Limit        int      // max events in this batch (0 = DefaultReplayLimit); HeadOnly returns none
	MaxBytes     int      // max data bytes in this batch (0 or more than MaxBatchBytes = MaxBatchBytes); a batch always holds at least one event
	HeadOnly     bool     // only Head/Oldest (and Done)
	// Encode, when set, turns each event into what the reader keeps — e.g. its SSE encoding —
	// straight from the connection's read buffer: Event.Data is then Encode's output (the
	// appended bytes) rather than a copy of the data, so a large event is held once, not twice.
	// It runs on a pool goroutine; event is a view valid during the call.
	Encode func(dst []byte, id int64, event, data []byte) []byte
	// OwnBuffers gives each event's Data an allocation of its own instead of a share of the
	// batch's chunks: for a reader that keeps some events much longer than others (one kept
	// event would otherwise keep its whole chunk alive).
	OwnBuffers bool
}

// Replay read buffers: events are copied (or encoded) into chunks of batchChunkBytes; an event
// larger than ownBufferBytes gets a buffer of its own, allocated to its size.
const (
	batchChunkBytes = 64 << 10
	ownBufferBytes  = 64 << 10
)

// ReadResult is one batch, read in one snapshot.
type ReadResult struct {
	Events []Event // ascending id
	Head   int64   // stream head in the same snapshot (0 = never published)
	Oldest int64   // smallest retained id in that snapshot; Head+1 if none retained
	Done   bool    // no further visible event with id ≤ Head remains after this batch (the caller may set its cursor to Head)
	Err    error
}

type replayJob struct {
	req  ReadRequest
	done func(ReadResult)
}

// Replayer reads durable events for the engine on a small pool of PostgreSQL
// connections (application_name pgsse-replay), off the event loop: Read queues a
// request and returns at once, a pool goroutine runs it and hands the result to the
// request's callback. Connections are opened on first use and re-opened after a
// failure.
type Replayer struct {
	cfg    *pgconn.Config
	cfgErr error
	logger *slog.Logger

	mu     sync.RWMutex // guards closed and sending on queue
	closed bool
	queue  chan *replayJob // pointers: a full-size queue of values would be 6 MB resident

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewReplayer starts poolSize workers (default 4 when ≤ 0) for the database dsn ("" =
// libpq environment). It opens no connection yet; a bad dsn is reported in every
// result's Err.
func NewReplayer(dsn string, poolSize int, logger *slog.Logger) *Replayer {
	return newReplayer(dsn, poolSize, logger, ReplayQueueSize)
}

func newReplayer(dsn string, poolSize int, logger *slog.Logger, queueSize int) *Replayer {
	if poolSize <= 0 {
		poolSize = 4
	}
	if logger == nil {
		logger = slog.Default()
	}
	r := &Replayer{logger: logger, queue: make(chan *replayJob, queueSize)}
	r.cfg, r.cfgErr = pgconn.ParseConfig(dsn)
	if r.cfgErr == nil {
		r.cfg.RuntimeParams["application_name"] = ReplayAppName
	} else {
		r.cfgErr = fmt.Errorf("store: replay: %w", r.cfgErr)
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.wg.Add(poolSize)
	for i := 0; i < poolSize; i++ {
		go r.worker()
	}
	return r
}

// Read queues req; done receives the result on a pool goroutine (it must not block
// for long: it holds a pool connection's turn). Read never blocks: it returns false,
// without calling done, when the queue is full or the Replayer is closed.
func (r *Replayer) Read(req ReadRequest, done func(ReadResult)) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed {
		return false
	}
	select {
	case r.queue <- &replayJob{req: req, done: done}:
		return true
	default:
		return false
	}
}

// Close stops accepting requests, cancels running queries, hands ErrClosed to every
// request still queued or running, closes the connections and waits for the workers.
func (r *Replayer) Close() {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.queue)
	}
	r.mu.Unlock()
	r.cancel()
	r.wg.Wait()
}

func (r *Replayer) worker() {
	defer r.wg.Done()
	var conn *pgconn.PgConn
	defer func() {
		if conn != nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(ctx)
			cancel()
		}
	}()
	for job := range r.queue {
		var res ReadResult
		if r.ctx.Err() != nil {
			res.Err = ErrClosed
		} else {
			res = r.read(&conn, job.req)
			if res.Err != nil && r.ctx.Err() != nil {
				res = ReadResult{Err: ErrClosed}
			}
		}
		job.done(res)
	}
}

func checkRequest(req *ReadRequest) error {
	if err := names.CheckStream(req.Stream); err != nil {
		return fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	if req.After < 0 {
		return fmt.Errorf("%w: After must be ≥ 0", ErrBadRequest)
	}
	if req.Limit < 0 {
		return fmt.Errorf("%w: Limit must be ≥ 0", ErrBadRequest)
	}
	return nil
}

// read runs one request on *conn, opening it if needed. A failure on a connection
// that had been idle in the pool (the server may have closed it meanwhile) is retried
// once on a fresh one; the query only reads, so retrying is always safe.
func (r *Replayer) read(conn **pgconn.PgConn, req ReadRequest) ReadResult {
	if r.cfgErr != nil {
		return ReadResult{Err: r.cfgErr}
	}
	if err := checkRequest(&req); err != nil {
		return ReadResult{Err: err}
	}
	for attempt := 0; ; attempt++ {
		fresh := false
		if *conn == nil {
			c, err := r.connect()
			if err != nil {
				var pe *prepareError
				if errors.As(err, &pe) {
					// Connected, but the history query is not there: not migrated, most likely.
					r.logger.Warn("replay: cannot prepare the history query (is the schema migrated? pgsse migrate)", "err", pe.err)
					return ReadResult{Err: fmt.Errorf("store: replay: %w", pe.err)}
				}
				r.logger.Warn("replay: cannot connect to PostgreSQL", "err", err)
				return ReadResult{Err: fmt.Errorf("store: replay connect: %w", err)}
			}
			*conn, fresh = c, true
		}
		res := r.query(*conn, &req)
		if res.Err == nil {
			return res
		}
		// A dead session: closed, a network error, or FATAL (e.g. terminated by an
		// administrator or a server restart, reported on our next query).
		var pgErr *pgconn.PgError
		broken := (*conn).IsClosed() || !errors.As(res.Err, &pgErr) ||
			pgErr.Severity == "FATAL" || pgErr.Severity == "PANIC"
		// After any error the connection is replaced: cheap, and it can never be left
		// in a half-read state or with a stale prepared statement.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = (*conn).Close(ctx)
		cancel()
		*conn = nil
		if fresh || attempt > 0 || !broken || r.ctx.Err() != nil {
			return res
		}
		r.logger.Debug("replay: connection failed, retrying on a new one", "err", res.Err)
	}
}

// replaySQL reads one batch through pgsse.replay (one statement, so one snapshot).
const replaySQL = `SELECT head, oldest, id, event, data, audience, time_us, included
FROM pgsse.replay($1, $2, $3, $4, $5, $6)`

func (r *Replayer) connect() (*pgconn.PgConn, error) {
	ctx, cancel := context.WithTimeout(r.ctx, replayConnTimeout)
	defer cancel()
	c, err := pgconn.ConnectConfig(ctx, r.cfg)
	if err != nil {
		return nil, err
	}
	if _, err := c.Prepare(ctx, replayStatement, replaySQL,
		[]uint32{oidText, oidInt8, oidTextArray, oidBool, oidInt4, oidInt8}); err != nil {
		_ = c.Close(ctx)
		return nil, &prepareError{err}
	}
	return c, nil
}

// prepareError: the session was opened but the history query could not be prepared.
type prepareError struct{ err error }

func (e *prepareError) Error() string { return "prepare pgsse.replay: " + e.err.Error() }
func (e *prepareError) Unwrap() error { return e.err }

var replayResultFormats = []int16{1, 1, 1, 1, 1, 1, 1, 1} // all binary

func (r *Replayer) query(conn *pgconn.PgConn, req *ReadRequest) ReadResult {
	limit := req.Limit
	switch {
	case req.HeadOnly:
		limit = 0
	case limit == 0:
		limit = DefaultReplayLimit
	case limit > MaxReplayLimit:
		limit = MaxReplayLimit
	}
	all := "f"
	if req.AllAudiences {
		all = "t"
	}
	maxBytes := req.MaxBytes
	if maxBytes <= 0 || maxBytes > MaxBatchBytes {
		maxBytes = MaxBatchBytes
	}
	params := [][]byte{
		[]byte(req.Stream),
		strconv.AppendInt(nil, req.After, 10),
		appendTextArray(nil, req.Tags),
		[]byte(all),
		strconv.AppendInt(nil, int64(limit), 10),
		strconv.AppendInt(nil, int64(maxBytes), 10),
	}
	ctx, cancel := context.WithTimeout(r.ctx, replayQueryTimeout)
	defer cancel()
	rr := conn.ExecPrepared(ctx, replayStatement, params, nil, replayResultFormats)

	var (
		res      ReadResult
		meta     bool
		excluded bool
		chunk    []byte // the current buffer small events are copied (or encoded) into
		decErr   error
	)
	// A chunk need not be larger than the batch can be (plus what an encoding adds).
	chunkBytes := min(batchChunkBytes, maxBytes+maxBytes/4+1024)
	for rr.NextRow() {
		v := rr.Values()
		if len(v) != 8 {
			decErr = errors.New("store: replay: unexpected column count")
			continue
		}
		if v[2] == nil { // the head/oldest row
			res.Head, decErr = int8Value(v[0])
			if decErr == nil {
				res.Oldest, decErr = int8Value(v[1])
			}
			meta = true
			continue
		}
		if len(v[7]) != 1 || v[7][0] == 0 {
			excluded = true
			continue
		}
		var ev Event
		var err error
		if ev.ID, err = int8Value(v[2]); err != nil {
			decErr = err
			continue
		}
		if v[3] != nil {
			ev.Event = string(v[3])
		}
		if ev.TimeUS, err = int8Value(v[6]); err != nil {
			decErr = err
			continue
		}
		if v[5] != nil {
			if ev.Audience, err = textArrayValue(v[5]); err != nil {
				decErr = err
				continue
			}
		}
		ev.Data, chunk = keepData(chunk, chunkBytes, req.OwnBuffers, req.Encode, ev.ID, v[3], v[4])
		res.Events = append(res.Events, ev)
	}
	if _, err := rr.Close(); err != nil {
		return ReadResult{Err: err}
	}
	if decErr == nil && !meta {
		decErr = errors.New("store: replay: no head row")
	}
	if decErr != nil {
		return ReadResult{Err: decErr}
	}
	if !slices.IsSortedFunc(res.Events, func(a, b Event) int { return cmpInt64(a.ID, b.ID) }) {
		slices.SortFunc(res.Events, func(a, b Event) int { return cmpInt64(a.ID, b.ID) })
	}
	res.Done = !excluded
	return res
}

// keepData copies data — or what encode makes of it — into chunk, or into a new chunk (of
// chunkBytes, or the event's size if larger) when it does not fit (earlier events keep
// theirs: nothing already read is copied again); with own, or for an event larger than
// ownBufferBytes, into a buffer of its own (encode is given nil and sizes it). It
// returns the kept bytes and the chunk to continue with.
func keepData(chunk []byte, chunkBytes int, own bool, encode func(dst []byte, id int64, event, data []byte) []byte, id int64, event, data []byte) (kept, next []byte) {
	if own || len(data) > ownBufferBytes {
		if encode != nil {
			kept = encode(nil, id, event, data)
		} else {
			kept = append([]byte(nil), data...)
		}
		return kept[:len(kept):len(kept)], chunk
	}
	need := len(data)
	if encode != nil {
		need += len(event) + 64
	}
	if cap(chunk)-len(chunk) < need {
		chunk = make([]byte, 0, max(chunkBytes, need))
	}
	start := len(chunk)
	if encode != nil {
		chunk = encode(chunk, id, event, data) // a longer encoding than need moves the chunk: earlier events keep the old one
	} else {
		chunk = append(chunk, data...)
	}
	return chunk[start:len(chunk):len(chunk)], chunk
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func int8Value(b []byte) (int64, error) {
	if len(b) != 8 {
		return 0, errors.New("store: replay: bad bigint value")
	}
	return int64(binary.BigEndian.Uint64(b)), nil
}

// textArrayValue decodes a one-dimensional text[] in PostgreSQL's binary format:
// ndim, has-null flag, element OID, per dimension (length, lower bound), then per
// element a 4-byte length (-1 = NULL) and the bytes.
func textArrayValue(b []byte) ([]string, error) {
	bad := errors.New("store: replay: bad text[] value")
	if len(b) < 12 {
		return nil, bad
	}
	ndim := binary.BigEndian.Uint32(b)
	if ndim == 0 {
		return nil, nil
	}
	if ndim != 1 || len(b) < 20 {
		return nil, bad
	}
	n := int(int32(binary.BigEndian.Uint32(b[12:])))
	b = b[20:]
	if n < 0 || n > len(b)/4 {
		return nil, bad
	}
	out := make([]string, 0, n)
	for i := 0; i < n; i++ {
		if len(b) < 4 {
			return nil, bad
		}
		l := int(int32(binary.BigEndian.Uint32(b)))
		b = b[4:]
		if l == -1 {
			continue // a NULL tag (only possible if written around pgsse.publish) matches no one
		}
		if l < 0 || l > len(b) {
			return nil, bad
		}
		out = append(out, string(b[:l]))
		b = b[l:]
	}
	return out, nil
}
