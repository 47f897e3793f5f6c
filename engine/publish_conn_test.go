package engine

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/metricstest"
	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

// The publisher connection (docs/http.md, Publishing over HTTP): keep-alive, pipelining in order,
// Expect: 100-continue, CORS, the body deadline, capacity, and the metrics.

// Pipelined requests are answered in order, each after its COMMIT; a GET after them on the
// same connection turns it into an event stream.
func TestPublishPipelined(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	authz := bearerH(publishToken(t, "pl/*"))
	c := dialPub(t, addr)
	var raw strings.Builder
	for i := 1; i <= 10; i++ {
		if i%2 == 0 {
			raw.WriteString(postChunked("/streams/pl/a", []string{"d", strconv.Itoa(i)}, authz))
		} else {
			raw.WriteString(post("/streams/pl/a", "d"+strconv.Itoa(i), authz))
		}
	}
	raw.WriteString(post("/streams/pl/a?event=x%20y", "bad", authz)) // refused, connection kept
	raw.WriteString(post("/publish", `{"stream":"pl/b","data":"b1"}`+"\n"+`{"stream":"pl/a","data":"a11"}`, authz, "Content-Type: application/x-ndjson"))
	c.send(raw.String()) // all at once: one write, many requests
	for i := 1; i <= 10; i++ {
		p := decodePublished(t, c.read())
		assert.Equal(t, int64(i), *p.ID, "answers in request order")
	}
	r := c.read()
	assert.Equal(t, 400, r.Status, r.Body)
	assert.Equal(t, []int64{1, 11}, decodeIDs(t, c.read()))
	for i := 1; i <= 10; i++ {
		assert.Equal(t, "d"+strconv.Itoa(i), pgtest.QueryValue(t, ts.DSN, "SELECT data FROM pgsse.events WHERE stream = 'pl/a' AND id = "+strconv.Itoa(i)))
	}

	// The same connection may subscribe afterwards: the event stream ends it.
	c.send(request("GET", "/streams/pl/a", bearerH(allStreams(t)), "Last-Event-ID: 10"))
	resp, err := http.ReadResponse(c.r, &http.Request{Method: "GET"})
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode)
	sc := &sseClient{t: t, conn: c.conn, r: c.r}
	sc.readIDs(11, 11, 10*time.Second)

	// A client asking to close gets Connection: close, and the close.
	c2 := dialPub(t, addr)
	r = c2.do(post("/streams/pl/a", "last", authz, "Connection: close"))
	require.Equal(t, 200, r.Status, r.Body)
	assert.True(t, r.Close, "Connection: close")
	c2.expectEOF()
}

// Expect: 100-continue: the interim answer only once the head passed every check that
// needs no body (the token and its grant included); a refusal instead ends the connection.
func TestPublishExpectContinue(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	authz := bearerH(publishToken(t, "ec/*"))

	c := dialPub(t, addr)
	c.send(request("POST", "/streams/ec/1", authz, "Expect: 100-continue", "Content-Length: 5"))
	cont, err := http.ReadResponse(c.r, nil)
	require.NoError(t, err)
	assert.Equal(t, 100, cont.StatusCode)
	c.send("hello")
	assert.Equal(t, int64(1), *decodePublished(t, c.read()).ID)

	// Not granted: 403 at once, before any body, and the connection closes.
	c = dialPub(t, addr)
	c.send(request("POST", "/streams/other", authz, "Expect: 100-continue", "Content-Length: 5"))
	r := c.read()
	assert.Equal(t, 403, r.Status, r.Body)
	assert.True(t, r.Close, "Connection: close")
	c.expectEOF()
}

// CORS for POST from --cors-origins: the preflight allows POST and Content-Type, the answer
// carries the origin.
func TestPublishCORS(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", func(c *Config) { c.CORSOrigins = []string{"https://app.example"} })
	addr := ts.Addr().String()
	for path, methods := range map[string]string{"/streams/o/1": "GET, POST, OPTIONS", "/publish": "POST, OPTIONS"} {
		r := exchange(t, addr, "OPTIONS", request("OPTIONS", path,
			"Origin: https://app.example", "Access-Control-Request-Method: POST"))
		require.Equal(t, 204, r.Status, r.Body)
		assert.Equal(t, methods, r.Header.Get("Access-Control-Allow-Methods"), path)
		assert.Equal(t, "https://app.example", r.Header.Get("Access-Control-Allow-Origin"))
		ach := strings.ToLower(r.Header.Get("Access-Control-Allow-Headers"))
		assert.Contains(t, ach, "content-type")
		assert.Contains(t, ach, "authorization")
	}
	c := dialPub(t, addr)
	authz := bearerH(publishToken(t, "o/*"))
	r := c.do(post("/streams/o/1", "x", authz, "Origin: https://app.example"))
	require.Equal(t, 200, r.Status, r.Body)
	assert.Equal(t, "https://app.example", r.Header.Get("Access-Control-Allow-Origin"))
	assert.Equal(t, "true", r.Header.Get("Access-Control-Allow-Credentials"))
	r = c.do(post("/streams/x/1", "x", authz, "Origin: https://app.example"))
	require.Equal(t, 403, r.Status, r.Body)
	assert.Equal(t, "https://app.example", r.Header.Get("Access-Control-Allow-Origin"), "errors carry CORS too: the page can read them")
	r = c.do(post("/streams/o/1", "x", authz, "Origin: https://evil.example"))
	require.Equal(t, 200, r.Status, r.Body)
	assert.Empty(t, r.Header.Get("Access-Control-Allow-Origin"))
}

// A body trickled slower than the deadline is answered 408 and closed; the head deadline
// applies to a keep-alive connection's next request too.
func TestPublishSlowBody(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	ts.onLoop(t, func() { ts.pub.publishBodyTimeoutMS = 1000 })
	addr := ts.Addr().String()
	authz := bearerH(publishToken(t, "*"))
	c := dialPub(t, addr)
	c.send(request("POST", "/streams/slow", authz, "Content-Length: 100"))
	done := make(chan struct{})
	go func() { // one byte every 100 ms: 10 s for the body
		defer close(done)
		for range 100 {
			if _, err := c.conn.Write([]byte("x")); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	start := time.Now()
	r := c.read()
	assert.Equal(t, 408, r.Status, r.Body)
	assert.Less(t, time.Since(start), 8*time.Second, "the deadline, not the body, ended it")
	c.expectEOF()
	<-done
	assert.Equal(t, "0", pgtest.QueryValue(t, ts.DSN, "SELECT count(*) FROM pgsse.events"))
}

// Publishers count against --max-connections: over it, 503 with Retry-After.
func TestPublishOverCapacity(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", func(c *Config) { c.MaxConnections = 2 })
	addr := ts.Addr().String()
	authz := bearerH(publishToken(t, "*"))
	a, b := dialPub(t, addr), dialPub(t, addr)
	require.Equal(t, 200, a.do(post("/streams/cap", "a", authz)).Status)
	require.Equal(t, 200, b.do(post("/streams/cap", "b", authz)).Status)
	c := dialPub(t, addr)
	r := c.do(post("/streams/cap", "c", authz))
	require.Equal(t, 503, r.Status, r.Body)
	assert.NotEmpty(t, r.Header.Get("Retry-After"))
	assertErrorBody(t, r)
	// A subscriber is shed too (200 + retry: docs/http.md's status table), while the publishers
	// hold the places.
	s := dial(t, addr, "/streams/cap", bearerH(allStreams(t)))
	require.Equal(t, 200, s.Status)
	s.expectRetryEOF(10 * time.Second)
	// The kept-alive publishers go on.
	assert.Equal(t, 200, a.do(post("/streams/cap", "a2", authz)).Status)
	a.conn.Close()
	waitFor(t, 10*time.Second, "a place freed", func() bool {
		r, err := exchangeErr(addr, post("/streams/cap", "d", authz))
		return err == nil && r.Status == 200
	})
}

// The publish metrics (docs/operations.md's metric names): requests by status, batch size, commit
// time, and the publisher connections.
func TestPublishMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	ts := startServer(t, "", func(c *Config) { c.Registry = reg })
	addr := ts.Addr().String()
	authz := bearerH(publishToken(t, "m/*"))
	c := dialPub(t, addr)
	for range 3 {
		require.Equal(t, 200, c.do(post("/streams/m/1", "x", authz)).Status)
	}
	require.Equal(t, 403, c.do(post("/streams/x", "x", authz)).Status)
	require.Equal(t, 401, c.do(post("/streams/m/1", "x")).Status)
	// metricstest fails the test on a missing series: the 403 counter of pgsse_rejected_total
	// is bound at start, so its 0 below is read, not the zero value of a missing map key.
	got, err := metricstest.Gather(reg, "registry")
	require.NoError(t, err)
	assert.Equal(t, 3.0, got.Metric(t, `pgsse_publish_requests_total{status="200"}`))
	assert.Equal(t, 1.0, got.Metric(t, `pgsse_publish_requests_total{status="403"}`))
	assert.Equal(t, 1.0, got.Metric(t, `pgsse_publish_requests_total{status="401"}`))
	assert.Equal(t, 3.0, got.Metric(t, "pgsse_publish_batch_size_count"))
	assert.Equal(t, 3.0, got.Metric(t, "pgsse_publish_batch_size_sum"), "one event per transaction, sent one after the other")
	assert.Equal(t, 3.0, got.Metric(t, "pgsse_publish_commit_seconds_count"))
	assert.Greater(t, got.Metric(t, "pgsse_publish_commit_seconds_sum"), 0.0)
	assert.Equal(t, 1.0, got.Metric(t, "pgsse_publish_connections"))
	assert.Zero(t, got.Metric(t, `pgsse_rejected_total{status="403"}`), "publish refusals are counted as publish requests")
}

// Group commit (docs/http.md, Publishing over HTTP), end to end: 64 concurrent keep-alive
// publishers × n events over 4 streams → each stream's ids are exactly 1..(its events), each
// publisher's ids of a stream rise, and each subscriber sees all of its stream's events once, in
// order.
func TestPublishConcurrentKeepAlive(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	const publishers, each = 64, 20
	streams := []string{"gc/0", "gc/1", "gc/2", "gc/3"}
	perStream := publishers * each / len(streams)
	subTok := bearerH(allStreams(t))
	var subs []*sseClient
	for _, st := range streams {
		for range 2 {
			c := dial(t, addr, "/streams/"+st, subTok, "Last-Event-ID: 0")
			require.Equal(t, 200, c.Status, c.Body)
			subs = append(subs, c)
		}
	}
	authz := bearerH(publishToken(t, "gc/*"))
	var mu sync.Mutex
	seen := map[string]map[int64]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, publishers)
	for i := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close()
			r := bufio.NewReader(conn)
			last := map[string]int64{}
			for n := range each {
				st := streams[(i+n)%len(streams)]
				_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
				if _, err := conn.Write([]byte(post("/streams/"+st, fmt.Sprintf("%d.%d", i, n), authz))); err != nil {
					errs <- err
					return
				}
				resp, err := http.ReadResponse(r, &http.Request{Method: "POST"})
				if err != nil {
					errs <- err
					return
				}
				var body strings.Builder
				_, _ = bufioCopy(&body, resp)
				if resp.StatusCode != 200 {
					errs <- fmt.Errorf("publisher %d: %d %s", i, resp.StatusCode, body.String())
					return
				}
				id, err := strconv.ParseInt(strings.TrimSuffix(strings.SplitN(body.String(), `"id":`, 2)[1], "}"), 10, 64)
				if err != nil {
					errs <- err
					return
				}
				if id <= last[st] {
					errs <- fmt.Errorf("publisher %d: id %d of %s after %d", i, id, st, last[st])
				}
				last[st] = id
				mu.Lock()
				if seen[st] == nil {
					seen[st] = map[int64]bool{}
				}
				if seen[st][id] {
					errs <- fmt.Errorf("id %d of %s given twice", id, st)
				}
				seen[st][id] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for _, st := range streams {
		require.Len(t, seen[st], perStream, st)
		for id := int64(1); id <= int64(perStream); id++ {
			require.True(t, seen[st][id], "%s: id %d missing", st, id)
		}
	}
	for _, c := range subs {
		c.readIDs(1, int64(perStream), 30*time.Second)
		c.expectSilence(200 * time.Millisecond)
	}
	// Group commit happened: fewer transactions than requests (the stream heads prove the
	// counts; the transactions are the Publisher's, measured by the store's own tests).
	for _, st := range streams {
		assert.Equal(t, int64(perStream), streamHead(t, ts.DSN, st))
	}
}

func bufioCopy(dst *strings.Builder, resp *http.Response) (int64, error) {
	defer resp.Body.Close()
	b := make([]byte, 512)
	var n int64
	for {
		k, err := resp.Body.Read(b)
		dst.Write(b[:k])
		n += int64(k)
		if err != nil {
			return n, nil
		}
	}
}

// exchangeErr is exchange without failing the test (for polling).
func exchangeErr(addr, raw string) (httpResult, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return httpResult{}, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write([]byte(raw)); err != nil {
		return httpResult{}, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: "POST"})
	if err != nil {
		return httpResult{}, err
	}
	var body strings.Builder
	_, _ = bufioCopy(&body, resp)
	return httpResult{Status: resp.StatusCode, Header: resp.Header, Body: body.String()}, nil
}
