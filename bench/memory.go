//go:build linux

package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgsse/pgsse/internal/testkit/ssetest"
)

// The memory scenarios (issue 11, "memory follows a budget"): 4 with --max-outbound-memory
// (Params.OutboundBudget) reports the RSS against the budget; 7 (stalled) and 8 (large event)
// are below. They run against pgsse builds only: Target.Old marks a build from before
// --max-outbound-memory (e.g. main, for the before/after ratio), which is not given the flag.

// MemoryParams sizes scenarios 7 and 8.
type MemoryParams struct {
	StalledConns    int           // 7: durable subscribers that never read
	StalledDuration time.Duration // 7: publish flat out this long
	StalledData     int           // 7: bytes of data per event

	LargeBytes       int // 8: bytes of data of the one large event
	LargeSubscribers int // 8: subscribers that read it
}

// budgetArgs is the --max-outbound-memory argument for t, if any.
func budgetArgs(t Target, p Params) []string {
	if t.Name != "pgsse" || t.Old || p.OutboundBudget <= 0 {
		return nil
	}
	return []string{"--max-outbound-memory", strconv.FormatInt(p.OutboundBudget, 10)}
}

// startPgsse starts a pgsse build for a memory scenario, with the budget of p.
func (e *Env) startPgsse(ctx context.Context, t Target, p Params, scenario int) (*run, error) {
	if t.Name != "pgsse" {
		return nil, fmt.Errorf("scenario %d runs against pgsse builds only", scenario)
	}
	t.ExtraArgs = append(append([]string(nil), t.ExtraArgs...), budgetArgs(t, p)...)
	return e.start(ctx, t, p)
}

// serverMetric reads one series of the server's /metrics (metricstest's selector); a
// series that is not there is an error, not a 0.
func (r *run) serverMetric(ctx context.Context, selector string) (float64, error) {
	m, err := r.srv.Metrics(ctx)
	if err != nil {
		return 0, err
	}
	return m.Lookup(selector)
}

// Stalled is scenario 7: p.Memory.StalledConns durable subscribers on one stream connect and
// never read (SO_RCVBUF p.SlowRcvBuf), one subscriber reads, and one publisher commits flat
// out for p.Memory.StalledDuration → the server's RSS growth, and whether the reading
// subscriber got every event in order.
func Stalled(ctx context.Context, e *Env, t Target, p Params) (*Result, error) {
	r, err := e.startPgsse(ctx, t, p, 7)
	if err != nil {
		return nil, err
	}
	defer r.stop()
	mp := p.Memory
	const maxSeq = 1 << 20
	c, err := r.client("stalled", 1, p, maxSeq)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if err := c.Connect(mp.StalledConns, true); err != nil {
		return nil, fmt.Errorf("connect %d stalled subscribers: %w", mp.StalledConns, err)
	}
	pub, err := NewPublisher(ctx, r.db.URL, "stalled", mp.StalledData, maxSeq)
	if err != nil {
		return nil, err
	}
	defer pub.Close()
	time.Sleep(500 * time.Millisecond)
	rss0, err := r.srv.RSS()
	if err != nil {
		return nil, err
	}
	peak := r.sampleRSS()
	w0 := time.Now()
	for time.Since(w0) < mp.StalledDuration {
		if _, err := pub.Publish(ctx); err != nil {
			peak.done()
			return nil, err
		}
	}
	wall := time.Since(w0)
	last := pub.Seq
	// The reading subscriber catches up (it is live: nothing should be owed to it for long).
	caught := c.WaitHave(last, 1, 30*time.Second)
	rssPeak := peak.done()
	r.heapProfile(ctx, "7-stalled")
	var queued, watermark float64
	var metricsErr error
	if t.Name == "pgsse" && !t.Old {
		queued, metricsErr = r.serverMetric(ctx, "pgsse_outbound_bytes")
		if metricsErr == nil {
			watermark, metricsErr = r.serverMetric(ctx, "pgsse_outbound_watermark_bytes")
		}
	}
	if err := r.alive(); err != nil {
		return nil, err
	}
	closed := c.drainSlow()
	c.Close()
	st := c.Stats()
	res := &Result{Scenario: "7 stalled", Target: t.label()}
	res.add("subscribers not reading", "", float64(mp.StalledConns), false)
	res.add("events published", "events/s", float64(last)/wall.Seconds(), false)
	res.add("event data", "B", float64(mp.StalledData), false)
	res.add("server RSS idle", "MiB", float64(rss0)/(1<<20), true)
	res.add("server RSS peak", "MiB", float64(rssPeak)/(1<<20), true)
	res.add("server RSS growth", "MiB", float64(rssPeak-rss0)/(1<<20), true)
	res.add("server RSS growth per stalled subscriber", "KiB", float64(rssPeak-rss0)/1024/float64(mp.StalledConns), true)
	switch {
	case metricsErr != nil: // the figures are missing from the result (a test asking for them fails)
		res.note("server metrics: %v", metricsErr)
	case t.Name == "pgsse" && !t.Old:
		res.add("bytes queued at the end (pgsse_outbound_bytes)", "MiB", queued/(1<<20), true)
		res.add("high watermark at the end", "KiB", watermark/1024, false)
	}
	res.add("stalled subscribers closed by the server", "", float64(closed), false)
	res.add("reading subscriber: events received", "", float64(st.Events), false)
	res.add("reading subscriber: sequence gaps", "", float64(st.Gaps), true)
	if !caught {
		res.note("the reading subscriber did not have all %d events 30 s after the publisher stopped", last)
	}
	return res, nil
}

// LargeEvent is scenario 8: with pgsse.max_event_bytes raised for the database,
// p.Memory.LargeSubscribers subscribers read one event of p.Memory.LargeBytes → RSS growth as a
// multiple of the event, time until the last subscriber had it whole. First it checks that
// the default limit refuses 300 MB with SQLSTATE 22023 (through SELECT pgsse.publish).
func LargeEvent(ctx context.Context, e *Env, t Target, p Params) (*Result, error) {
	r, err := e.startPgsse(ctx, t, p, 8)
	if err != nil {
		return nil, err
	}
	defer r.stop()
	mp := p.Memory
	refused, err := refuses300MB(ctx, r.db.URL)
	if err != nil {
		return nil, err
	}
	if err := execSQL(ctx, r.db.URL, "ALTER DATABASE "+r.db.name+" SET pgsse.max_event_bytes = "+strconv.Itoa(mp.LargeBytes)); err != nil {
		return nil, err
	}
	subs := make([]*largeReader, mp.LargeSubscribers)
	for i := range subs {
		if subs[i], err = dialLarge(r.srv.SSE.String(), "/streams/large"); err != nil {
			return nil, err
		}
		defer subs[i].conn.Close()
	}
	time.Sleep(500 * time.Millisecond)
	rss0, err := r.srv.RSS()
	if err != nil {
		return nil, err
	}
	peak := r.sampleRSS()
	var wg sync.WaitGroup
	for _, s := range subs {
		wg.Add(1)
		go func() { defer wg.Done(); s.read(1, 120*time.Second) }()
	}
	start := time.Now()
	conn, err := pgconn.Connect(ctx, r.db.URL)
	if err != nil {
		peak.done()
		return nil, err
	}
	_, err = conn.Exec(ctx, "SELECT pgsse.publish('large', repeat('v', "+strconv.Itoa(mp.LargeBytes)+"))").ReadAll()
	conn.Close(context.Background())
	if err != nil {
		peak.done()
		return nil, fmt.Errorf("publish %d bytes: %w", mp.LargeBytes, err)
	}
	wg.Wait()
	took := time.Since(start)
	time.Sleep(300 * time.Millisecond) // the sampler sees the state after the last write
	rssPeak := peak.done()
	if err := r.alive(); err != nil {
		return nil, err
	}
	whole := 0
	var problems []string
	for i, s := range subs {
		if s.err == nil && s.sizes[0] == mp.LargeBytes {
			whole++
		} else if len(problems) < 3 {
			problems = append(problems, fmt.Sprintf("subscriber %d: %v (sizes %v)", i, s.err, s.sizes))
		}
	}
	res := &Result{Scenario: "8 large event", Target: t.label()}
	res.add("event data", "MiB", float64(mp.LargeBytes)/(1<<20), false)
	res.add("subscribers", "", float64(mp.LargeSubscribers), false)
	res.add("subscribers that received it whole", "", float64(whole), false)
	res.add("time until the last had it", "s", took.Seconds(), true)
	res.add("server RSS idle", "MiB", float64(rss0)/(1<<20), true)
	res.add("server RSS peak", "MiB", float64(rssPeak)/(1<<20), true)
	res.add("server RSS growth", "MiB", float64(rssPeak-rss0)/(1<<20), true)
	res.add("server RSS growth ÷ event size", "×", float64(rssPeak-rss0)/float64(mp.LargeBytes), true)
	res.add("300 MB refused with SQLSTATE 22023 by default", "", boolValue(refused), false)
	for _, pr := range problems {
		res.note("%s", pr)
	}
	return res, nil
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// refuses300MB reports whether SELECT pgsse.publish of 300 MB fails with SQLSTATE 22023 under
// the default pgsse.max_event_bytes.
func refuses300MB(ctx context.Context, dsn string) (bool, error) {
	conn, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		return false, err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "SELECT pgsse.publish('large', repeat('v', 300000000))").ReadAll()
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "22023", nil
	}
	if err != nil {
		return false, err
	}
	return false, nil
}

// largeReader is one subscriber of scenario 8: it records the data size of each event.
type largeReader struct {
	conn  net.Conn
	r     *bufio.Reader
	sizes []int
	err   error
}

func dialLarge(addr, path string) (*largeReader, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, "GET "+path+" HTTP/1.1\r\nHost: bench\r\n\r\n"); err != nil {
		conn.Close()
		return nil, err
	}
	l := &largeReader{conn: conn, r: bufio.NewReaderSize(conn, 64<<10)}
	for {
		line, err := l.r.ReadString('\n')
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("response head: %w", err)
		}
		if !strings.HasPrefix(line, "HTTP/1.1 200 ") && l.sizes == nil && strings.HasPrefix(line, "HTTP/") {
			conn.Close()
			return nil, fmt.Errorf("response %q", strings.TrimSpace(line))
		}
		if line == "\r\n" {
			break
		}
	}
	_ = conn.SetDeadline(time.Time{})
	return l, nil
}

// read reads until n events have arrived (data sizes in l.sizes) or the timeout passes.
// The decoder only counts data (DiscardData), so a 50 MiB event costs the reader no 50 MiB
// buffer.
func (l *largeReader) read(n int, timeout time.Duration) {
	_ = l.conn.SetReadDeadline(time.Now().Add(timeout))
	d := ssetest.Decoder{DiscardData: true}
	buf := make([]byte, 64<<10)
	for len(l.sizes) < n {
		m, err := l.r.Read(buf)
		d.Feed(buf[:m], func(b *ssetest.Block) {
			if b.HasData && b.DataLen > 0 {
				l.sizes = append(l.sizes, b.DataLen)
			}
		})
		if err != nil {
			if len(l.sizes) < n {
				l.err = err
			}
			return
		}
	}
}
