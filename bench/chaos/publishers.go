//go:build linux

package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Publishers. Each has its own number (the Key's publisher) and sequence, publishes one
// transaction or request at a time, and records every attempt with what it learned. They
// pace themselves to their rate; under a slow machine they simply publish less.

type publisher struct {
	w    *workload
	pub  int
	seq  int64
	rng  *rand.Rand
	rate float64 // operations per second
	// op is the context of each operation: the run's, not the one that stops the publisher,
	// so that stopping never cuts a publish in half (which would only add unknown outcomes).
	op context.Context
}

func (p *publisher) next() Key {
	p.seq++
	return MakeKey(p.pub, p.seq)
}

// pace sleeps about 1/rate (jittered); false once ctx ends.
func (p *publisher) pace(ctx context.Context) bool {
	d := time.Duration(float64(time.Second) / p.rate * (0.5 + p.rng.Float64()))
	return sleepCtx(ctx, d) == nil
}

func (p *publisher) stream() string { return p.w.durable[p.rng.IntN(len(p.w.durable))] }

func audienceLiteral(aud []string) []byte {
	if len(aud) == 0 {
		return nil
	}
	return []byte("{" + strings.Join(aud, ",") + "}")
}

func nullable(s string) []byte {
	if s == "" {
		return nil
	}
	return []byte(s)
}

// sqlPublisher publishes with pgsse.publish in explicit transactions of 1–3 events (on one
// or several streams), some with a pg_notify to a hub channel beside them, one in five rolled
// back.
type sqlPublisher struct {
	publisher
	conn *pgconn.PgConn
}

func (p *sqlPublisher) run(ctx context.Context) {
	defer func() {
		if p.conn != nil {
			p.conn.Close(context.Background())
		}
	}()
	for p.pace(ctx) {
		if p.conn == nil {
			cctx, cancel := context.WithTimeout(p.op, 5*time.Second)
			c, err := pgconn.Connect(cctx, p.w.db.URL)
			cancel()
			if err != nil {
				continue
			}
			p.conn = c
		}
		p.once(ctx)
	}
}

func (p *sqlPublisher) once(ctx context.Context) {
	rec := &PubRecord{Via: "sql"}
	defer p.w.addPub(rec)
	cctx, cancel := context.WithTimeout(p.op, 30*time.Second)
	defer cancel()
	fail := func(err error) {
		rec.Outcome, rec.Detail = NotCommitted, err.Error()
		p.conn.Close(context.Background())
		p.conn = nil
	}
	if _, err := p.conn.Exec(cctx, "BEGIN").ReadAll(); err != nil {
		fail(err)
		return
	}
	for range 1 + p.rng.IntN(3) {
		stream, k := p.stream(), p.next()
		sh := ShapeOf(k)
		res := p.conn.ExecParams(cctx, "SELECT pgsse.publish($1, $2, $3, $4)",
			[][]byte{[]byte(stream), []byte(DurableData(stream, k)), nullable(sh.Event), audienceLiteral(sh.Audience)},
			nil, nil, nil).Read()
		ev := PubEvent{Stream: stream, Key: k}
		rec.Events = append(rec.Events, ev)
		if res.Err != nil {
			fail(res.Err)
			return
		}
		if len(res.Rows) == 1 {
			rec.Events[len(rec.Events)-1].ID, _ = strconv.ParseInt(string(res.Rows[0][0]), 10, 64)
		}
	}
	if p.rng.IntN(10) < 3 {
		ch, k := p.w.hubChannels[p.rng.IntN(len(p.w.hubChannels))], p.next()
		rec.Notes = append(rec.Notes, PubNote{Channel: ch, Key: k})
		if _, err := p.conn.ExecParams(cctx, "SELECT pg_notify($1, $2)", [][]byte{[]byte(ch), []byte(NotifyPayload(ch, k))},
			nil, nil, nil).Close(); err != nil {
			fail(err)
			return
		}
	}
	if err := p.endTx(cctx, p.conn, rec, 5); err != nil {
		if rec.Outcome == Unknown {
			rec.Detail, rec.Acked = "COMMIT: "+err.Error(), 0
		}
		p.conn.Close(context.Background())
		p.conn = nil
	}
}

// endTx ends rec's transaction on conn — ROLLBACK one time in oneIn, else COMMIT — and records
// when the end was sent and answered, and the outcome (Unknown for a COMMIT without an answer).
// An error means conn is broken.
func (p *publisher) endTx(ctx context.Context, conn *pgconn.PgConn, rec *PubRecord, oneIn int) error {
	rollback := p.rng.IntN(oneIn) == 0
	end := "COMMIT"
	if rollback {
		end = "ROLLBACK"
	}
	rec.Sent = p.w.now()
	_, err := conn.Exec(ctx, end).ReadAll()
	rec.Acked = p.w.now()
	switch {
	case rollback:
		rec.Outcome, rec.Detail = NotCommitted, "rolled back"
	case err != nil:
		rec.Outcome = Unknown
	default:
		rec.Outcome = Committed
	}
	return err
}

// httpPublisher publishes over HTTP on one keep-alive connection: POST /streams/{stream}
// (one event; some ephemeral if ephemeral is set) or, with batch, POST /publish (NDJSON of
// 1–12 lines over several streams, some ephemeral).
type httpPublisher struct {
	publisher
	batch     bool
	ephemeral bool // broadcaster: every event is ephemeral
	client    *http.Client
}

func newHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConnsPerHost:   1,
		ResponseHeaderTimeout: 60 * time.Second,
		DisableCompression:    true,
	}, Timeout: 90 * time.Second}
}

func (p *httpPublisher) run(ctx context.Context) {
	p.client = newHTTPClient()
	defer p.client.CloseIdleConnections()
	for p.pace(ctx) {
		if p.batch {
			p.postBatch(ctx)
		} else {
			p.postOne(ctx)
		}
	}
}

type ndjsonLine struct {
	Stream    string   `json:"stream"`
	Data      string   `json:"data"`
	Event     string   `json:"event,omitempty"`
	Audience  []string `json:"audience,omitempty"`
	Ephemeral bool     `json:"ephemeral,omitempty"`
}

func (p *httpPublisher) postOne(ctx context.Context) {
	rec := &PubRecord{Via: "http"}
	defer p.w.addPub(rec)
	var stream, data string
	k := p.next()
	q := url.Values{}
	eph := p.ephemeral
	if eph {
		rec.Via = "broadcast-http"
		stream = p.w.ephTargets[p.rng.IntN(len(p.w.ephTargets))]
		data = EphemeralData(stream, k)
		q.Set("ephemeral", "1")
	} else {
		stream = p.stream()
		data = DurableData(stream, k)
		sh := ShapeOf(k)
		if sh.Event != "" {
			q.Set("event", sh.Event)
		}
		for _, a := range sh.Audience {
			q.Add("audience", a)
		}
	}
	rec.Events = []PubEvent{{Stream: stream, Key: k, Ephemeral: eph}}
	u := "http://" + p.w.addr + "/streams/" + stream
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	status, body, err := p.post(ctx, rec, u, "text/plain; charset=utf-8", []byte(data))
	if err != nil || status != 200 {
		return
	}
	var ans struct {
		Stream string `json:"stream"`
		ID     *int64 `json:"id"`
	}
	if err := json.Unmarshal(body, &ans); err != nil || ans.Stream != stream || (ans.ID == nil) != eph {
		rec.Detail = "answer " + clip(string(body))
		p.w.fail(FailHTTPStatus, "http publisher", "POST /streams/%s answered 200 with %s", stream, clip(string(body)))
		return
	}
	if ans.ID != nil {
		rec.Events[0].ID = *ans.ID
	}
}

func (p *httpPublisher) postBatch(ctx context.Context) {
	rec := &PubRecord{Via: "batch"}
	defer p.w.addPub(rec)
	var body bytes.Buffer
	enc := json.NewEncoder(&body)
	for range 1 + p.rng.IntN(12) {
		k := p.next()
		var ln ndjsonLine
		if p.rng.IntN(6) == 0 {
			ln.Stream = p.w.ephTargets[p.rng.IntN(len(p.w.ephTargets))]
			ln.Data, ln.Ephemeral = EphemeralData(ln.Stream, k), true
		} else {
			ln.Stream = p.stream()
			ln.Data = DurableData(ln.Stream, k)
			sh := ShapeOf(k)
			ln.Event, ln.Audience = sh.Event, sh.Audience
		}
		rec.Events = append(rec.Events, PubEvent{Stream: ln.Stream, Key: k, Ephemeral: ln.Ephemeral})
		_ = enc.Encode(ln)
	}
	status, ans, err := p.post(ctx, rec, "http://"+p.w.addr+"/publish", "application/x-ndjson", body.Bytes())
	if err != nil || status != 200 {
		return
	}
	var a struct {
		IDs []*int64 `json:"ids"`
	}
	if err := json.Unmarshal(ans, &a); err != nil || len(a.IDs) != len(rec.Events) {
		rec.Detail = "answer " + clip(string(ans))
		p.w.fail(FailHTTPStatus, "batch publisher", "POST /publish of %d lines answered 200 with %s", len(rec.Events), clip(string(ans)))
		return
	}
	for i, id := range a.IDs {
		if (id == nil) != rec.Events[i].Ephemeral {
			p.w.fail(FailHTTPStatus, "batch publisher", "POST /publish line %d: id %v for an event with ephemeral=%v", i+1, id, rec.Events[i].Ephemeral)
		}
		if id != nil {
			rec.Events[i].ID = *id
		}
	}
}

// post sends one publish and classifies the answer into rec. It returns the status and body
// of a 200 (or err when there was none).
func (p *httpPublisher) post(ctx context.Context, rec *PubRecord, u, ctype string, body []byte) (int, []byte, error) {
	req, _ := http.NewRequestWithContext(p.op, "POST", u, bytes.NewReader(body))
	req.Header.Set("Content-Type", ctype)
	req.Header.Set("Authorization", "Bearer "+p.w.publishToken)
	rec.Sent = p.w.now()
	resp, err := p.client.Do(req)
	if err != nil {
		rec.Outcome, rec.Detail = NoAnswer, err.Error()
		return 0, nil, err
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	rec.Acked = p.w.now()
	if err != nil {
		rec.Outcome, rec.Detail, rec.Acked = NoAnswer, "reading the answer: "+err.Error(), 0
		return 0, nil, err
	}
	switch {
	case resp.StatusCode == 200:
		rec.Outcome = Committed
	case resp.StatusCode == 503 && strings.Contains(string(b), "may or may not"):
		rec.Outcome, rec.Detail = Unknown, "503 "+strings.TrimSpace(string(b))
	case resp.StatusCode == 503:
		rec.Outcome, rec.Detail = NotCommitted, "503 "+strings.TrimSpace(string(b))
	default:
		rec.Outcome, rec.Detail = NotCommitted, fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
		p.w.fail(FailHTTPStatus, rec.Via+" publisher", "%s answered %d: %s", u, resp.StatusCode, clip(string(b)))
	}
	return resp.StatusCode, b, nil
}

// sqlBroadcaster sends ephemeral events with pgsse.broadcast, one or two per transaction,
// some rolled back (they must never arrive).
type sqlBroadcaster struct {
	publisher
	conn *pgconn.PgConn
}

func (p *sqlBroadcaster) run(ctx context.Context) {
	defer func() {
		if p.conn != nil {
			p.conn.Close(context.Background())
		}
	}()
	for p.pace(ctx) {
		if p.conn == nil {
			cctx, cancel := context.WithTimeout(p.op, 5*time.Second)
			c, err := pgconn.Connect(cctx, p.w.db.URL)
			cancel()
			if err != nil {
				continue
			}
			p.conn = c
		}
		rec := &PubRecord{Via: "broadcast-sql"}
		var params [][]byte
		for range 1 + p.rng.IntN(2) {
			stream, k := p.w.ephTargets[p.rng.IntN(len(p.w.ephTargets))], p.next()
			rec.Events = append(rec.Events, PubEvent{Stream: stream, Key: k, Ephemeral: true})
			params = append(params, []byte(stream), []byte(EphemeralData(stream, k)))
		}
		p.exec(ctx, rec, params)
		p.w.addPub(rec)
	}
}

func (p *sqlBroadcaster) exec(ctx context.Context, rec *PubRecord, params [][]byte) {
	cctx, cancel := context.WithTimeout(p.op, 30*time.Second)
	defer cancel()
	broken := func(err error) {
		p.conn.Close(context.Background())
		p.conn = nil
		rec.Detail = err.Error()
	}
	if _, err := p.conn.Exec(cctx, "BEGIN").ReadAll(); err != nil {
		rec.Outcome = NotCommitted
		broken(err)
		return
	}
	for i := 0; i < len(params); i += 2 {
		if _, err := p.conn.ExecParams(cctx, "SELECT pgsse.broadcast($1, $2)", params[i:i+2], nil, nil, nil).Close(); err != nil {
			rec.Outcome = NotCommitted
			broken(err)
			return
		}
	}
	if err := p.endTx(cctx, p.conn, rec, 6); err != nil {
		broken(err)
	}
}

// notifier sends raw notifications (pg_notify) to the hub workers' and the /channels/
// subscribers' channels: 1–4 per transaction, one in ten rolled back, and now and then a
// burst of hundreds in one transaction on one channel (what fills a worker's ring).
type notifier struct {
	publisher
	conn *pgconn.PgConn
}

func (p *notifier) run(ctx context.Context) {
	defer func() {
		if p.conn != nil {
			p.conn.Close(context.Background())
		}
	}()
	chans := append(append([]string(nil), p.w.hubChannels...), p.w.sseChannels...)
	for p.pace(ctx) {
		if p.conn == nil {
			cctx, cancel := context.WithTimeout(p.op, 5*time.Second)
			c, err := pgconn.Connect(cctx, p.w.db.URL)
			cancel()
			if err != nil {
				continue
			}
			p.conn = c
		}
		rec := &PubRecord{Via: "notify"}
		n := 1 + p.rng.IntN(4)
		burst := p.rng.IntN(300) == 0
		if burst {
			n = 300 + p.rng.IntN(1200)
			rec.Via = "notify-burst"
		}
		var sql strings.Builder
		sql.WriteString("SELECT ")
		var params [][]byte
		ch := chans[p.rng.IntN(len(chans))]
		for i := range n {
			if !burst {
				ch = chans[p.rng.IntN(len(chans))]
			}
			k := p.next()
			rec.Notes = append(rec.Notes, PubNote{Channel: ch, Key: k})
			if i > 0 {
				sql.WriteString(", ")
			}
			fmt.Fprintf(&sql, "pg_notify($%d, $%d)", 2*i+1, 2*i+2)
			params = append(params, []byte(ch), []byte(NotifyPayload(ch, k)))
		}
		p.exec(ctx, rec, sql.String(), params)
		p.w.addPub(rec)
	}
}

func (p *notifier) exec(ctx context.Context, rec *PubRecord, sql string, params [][]byte) {
	cctx, cancel := context.WithTimeout(p.op, 30*time.Second)
	defer cancel()
	broken := func(err error) {
		p.conn.Close(context.Background())
		p.conn = nil
		rec.Detail = err.Error()
	}
	if _, err := p.conn.Exec(cctx, "BEGIN").ReadAll(); err != nil {
		rec.Outcome = NotCommitted
		broken(err)
		return
	}
	if _, err := p.conn.ExecParams(cctx, sql, params, nil, nil, nil).Close(); err != nil {
		rec.Outcome = NotCommitted
		broken(err)
		return
	}
	if err := p.endTx(cctx, p.conn, rec, 10); err != nil {
		broken(err)
	}
}
