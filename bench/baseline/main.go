// Command baseline is the SSE server a competent Go developer would write without pgsse,
// used by the benchmarks (bench/) as the honest point of comparison.
//
// Shape: net/http, one goroutine per SSE connection (the handler), http.Flusher; one pgconn
// session LISTENing on channel "pgsse" (the same SQL publish path as pgsse: payloads parsed by
// store.ParsePayload, each event encoded once with sse.AppendEvent and the same bytes queued to
// every subscriber); per subscriber a buffered channel, and an event that meets a full channel
// is dropped for that subscriber (counted). Subscribers of a stream sit in a map guarded by an
// RWMutex. Each connection writes what is queued in one batch, then flushes once, under a write
// deadline; a ticker per connection writes the heartbeat comment. GET /streams/{stream} answers
// with the same headers and preamble (retry + comment) as pgsse. No authentication (the
// benchmarks run both servers without tokens).
//
// Nothing here is made slow on purpose. What a careful engineer would still improve:
//   - durability: no replay from pgsse.events (Last-Event-ID/since ignored), and an event that
//     meets a full channel is lost for that subscriber instead of being caught up from the table;
//     events too big for NOTIFY (wakes) are read from the table with one query each;
//   - the LISTEN session is not re-established after a loss (the process exits instead);
//   - memory per connection: net/http keeps a bufio reader and writer, a chunked-encoding writer
//     and a goroutine stack per connection (≈ 20–30 KiB); a ticker per connection for the
//     heartbeat instead of one wheel;
//   - fan-out takes the RWMutex and does one channel send per subscriber per event, iterating a
//     map (a slice would be faster); the per-connection goroutine wakes and does one
//     write+flush syscall per batch;
//   - no connection limit, no load shedding, no metrics, no audience filtering, no CORS.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	_ "net/http/pprof" // served on --pprof only
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgsse/pgsse/names"
	"github.com/pgsse/pgsse/sse"
	"github.com/pgsse/pgsse/store"
)

func main() {
	var (
		dsn       = flag.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL DSN")
		listen    = flag.String("listen", ":8081", "SSE listen address")
		pprofAddr = flag.String("pprof", "", "serve /debug/pprof/ on this address (empty = off)")
		heartbeat = flag.Duration("heartbeat", 15*time.Second, "comment line interval")
		retry     = flag.Duration("retry", 2*time.Second, "the retry: field")
		buffer    = flag.Int("buffer", 64, "events queued per subscriber before dropping")
	)
	flag.Parse()
	if *buffer < 1 {
		log.Fatal("baseline: --buffer must be at least 1")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *dsn, *listen, *pprofAddr, *heartbeat, *retry, *buffer); err != nil {
		log.Fatalf("baseline: %v", err)
	}
}

func run(ctx context.Context, dsn, listen, pprofAddr string, heartbeat, retry time.Duration, buffer int) error {
	b := &broker{streams: make(map[string]map[*subscriber]struct{}), buffer: buffer}
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return err
	}
	cfg.RuntimeParams["application_name"] = "baseline-listen"
	// OnNotification runs inside WaitForNotification, on the listen goroutine.
	cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) { b.notification(ctx, dsn, n) }
	lc, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	if _, err := lc.Exec(ctx, "LISTEN pgsse").ReadAll(); err != nil {
		return fmt.Errorf("LISTEN: %w", err)
	}
	listenErr := make(chan error, 1)
	go func() {
		for {
			if err := lc.WaitForNotification(ctx); err != nil {
				listenErr <- err
				return
			}
		}
	}()

	preamble := sse.AppendComment(sse.AppendRetry(nil, retry.Milliseconds()), []byte("ok"))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /streams/{stream...}", func(w http.ResponseWriter, r *http.Request) {
		b.serve(w, r, preamble, heartbeat)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 8 << 10}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	if pprofAddr != "" {
		go func() { log.Println(http.ListenAndServe(pprofAddr, nil)) }() // DefaultServeMux has pprof
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	log.Printf("baseline: serving on %s", ln.Addr())
	select {
	case <-ctx.Done():
	case err = <-listenErr:
		err = fmt.Errorf("LISTEN session: %w", err)
	case err = <-serveErr:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	_ = lc.Close(sctx)
	log.Printf("baseline: delivered %d, dropped %d", b.delivered.Load(), b.dropped.Load())
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// writeTimeout bounds one batch write+flush to a client that stopped reading.
const writeTimeout = 10 * time.Second

var heartbeatLine = []byte(":\n")

type subscriber struct {
	ch chan []byte // encoded events; the bytes are shared and never modified
}

type broker struct {
	mu        sync.RWMutex
	streams   map[string]map[*subscriber]struct{}
	buffer    int
	delivered atomic.Int64
	dropped   atomic.Int64

	fetch *pgconn.PgConn // wake reads, used only on the listen goroutine
}

func (b *broker) subscribe(stream string) *subscriber {
	s := &subscriber{ch: make(chan []byte, b.buffer)}
	b.mu.Lock()
	m := b.streams[stream]
	if m == nil {
		m = make(map[*subscriber]struct{})
		b.streams[stream] = m
	}
	m[s] = struct{}{}
	b.mu.Unlock()
	return s
}

func (b *broker) unsubscribe(stream string, s *subscriber) {
	b.mu.Lock()
	if m := b.streams[stream]; m != nil {
		delete(m, s)
		if len(m) == 0 {
			delete(b.streams, stream)
		}
	}
	b.mu.Unlock()
}

// notification parses one NOTIFY on "pgsse", encodes the event once and queues it to every
// subscriber of its stream, dropping it for subscribers whose channel is full.
func (b *broker) notification(ctx context.Context, dsn string, n *pgconn.Notification) {
	var p store.Payload
	if err := store.ParsePayload([]byte(n.Payload), &p); err != nil {
		log.Printf("baseline: bad payload: %v", err)
		return
	}
	var id int64
	event, data := p.Event, p.Data
	switch p.Kind {
	case store.KindDurable:
		id = p.ID
	case store.KindWake:
		id = p.ID
		var err error
		if event, data, err = b.readEvent(ctx, dsn, p.Stream, p.ID); err != nil {
			log.Printf("baseline: read %s/%d: %v", p.Stream, p.ID, err)
			return
		}
	}
	enc := sse.AppendEvent(nil, id, event, data)
	b.mu.RLock()
	for s := range b.streams[string(p.Stream)] {
		select {
		case s.ch <- enc:
			b.delivered.Add(1)
		default:
			b.dropped.Add(1)
		}
	}
	b.mu.RUnlock()
}

// readEvent reads a durable event that travelled as a wake (too big for NOTIFY).
func (b *broker) readEvent(ctx context.Context, dsn string, stream []byte, id int64) (event, data []byte, err error) {
	if b.fetch == nil {
		if b.fetch, err = pgconn.Connect(ctx, dsn); err != nil {
			return nil, nil, err
		}
	}
	res := b.fetch.ExecParams(ctx, "SELECT coalesce(event, ''), data FROM pgsse.events WHERE stream = $1 AND id = $2",
		[][]byte{stream, strconv.AppendInt(nil, id, 10)}, nil, nil, nil).Read()
	if res.Err != nil {
		return nil, nil, res.Err
	}
	if len(res.Rows) != 1 {
		return nil, nil, errors.New("event not found (pruned?)")
	}
	return res.Rows[0][0], res.Rows[0][1], nil
}

func (b *broker) serve(w http.ResponseWriter, r *http.Request, preamble []byte, heartbeat time.Duration) {
	stream := r.PathValue("stream")
	if err := names.CheckStream(stream); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rc := http.NewResponseController(w)
	s := b.subscribe(stream) // live before the head goes out
	defer b.unsubscribe(stream, s)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache, no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(preamble); err != nil {
		return
	}
	if rc.Flush() != nil {
		return
	}
	tick := time.NewTicker(heartbeat)
	defer tick.Stop()
	done := r.Context().Done()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
			_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
			if _, err := w.Write(heartbeatLine); err != nil {
				return
			}
		case enc := <-s.ch:
			_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
			if _, err := w.Write(enc); err != nil {
				return
			}
			// Take whatever else is queued so it leaves in the same flush.
			for more := true; more; {
				select {
				case enc = <-s.ch:
					if _, err := w.Write(enc); err != nil {
						return
					}
				default:
					more = false
				}
			}
		}
		if rc.Flush() != nil {
			return
		}
	}
}
