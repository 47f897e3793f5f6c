// Package ssetest gives tests an EventSource-like client that outlives the server it talks to:
// a Reader reads the durable events of one stream and, whenever its connection ends, connects
// again with Last-Event-ID — wherever a load balancer or the kernel (SO_REUSEPORT) sends it.
// Tests of process and host failures use it to check docs/http.md's durable delivery guarantee
// end to end: every event once, in id order, across reconnects.
//
// Events published with PublishRange carry Data(id) as their data, so that a Reader can tell
// an event from another one that merely has its id.
package ssetest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/scripts/pgtest"
)

// reconnectDelay is how long a Reader waits before connecting again (a browser waits for the
// retry: value; tests need not).
const reconnectDelay = 50 * time.Millisecond

// Data is the data PublishRange gives event id.
func Data(id int) string { return "e" + strconv.Itoa(id) }

// Reader is one resuming subscriber. Its URL should ask for the history it needs on the first
// connection (e.g. ?since=0); later connections send Last-Event-ID, which wins over since.
type Reader struct {
	URL, Token string

	mu       sync.Mutex
	ids      []int64  // every durable id received, in order
	bad      []string // events whose data is not Data(id)
	connects int      // connections that got a 200 response head
	live     bool     // the current connection has its response head
}

// Run connects, reads and reconnects until ctx ends.
func (r *Reader) Run(ctx context.Context, client *http.Client) {
	for ctx.Err() == nil {
		req, err := http.NewRequestWithContext(ctx, "GET", r.URL, nil)
		if err != nil {
			panic(err)
		}
		if r.Token != "" {
			req.Header.Set("Authorization", "Bearer "+r.Token)
		}
		r.mu.Lock()
		if n := len(r.ids); n > 0 {
			req.Header.Set("Last-Event-ID", strconv.FormatInt(r.ids[n-1], 10))
		}
		r.mu.Unlock()
		if resp, err := client.Do(req); err == nil {
			if resp.StatusCode == http.StatusOK {
				r.mu.Lock()
				r.connects++
				r.live = true
				r.mu.Unlock()
				r.read(resp.Body)
			}
			resp.Body.Close()
		}
		r.mu.Lock()
		r.live = false
		r.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(reconnectDelay):
		}
	}
}

// read records the durable events of one response body until it ends.
func (r *Reader) read(body io.Reader) {
	sc := bufio.NewScanner(body)
	id, data := "", ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "id: "):
			id = line[len("id: "):]
		case strings.HasPrefix(line, "data: "):
			data = line[len("data: "):]
		case line == "" && id != "":
			n, err := strconv.ParseInt(id, 10, 64)
			r.mu.Lock()
			if err != nil || data != Data(int(n)) {
				r.bad = append(r.bad, fmt.Sprintf("id %q data %q", id, data))
			}
			r.ids = append(r.ids, n)
			r.mu.Unlock()
			id, data = "", ""
		}
	}
}

// Count is the number of events received so far.
func (r *Reader) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ids)
}

// Connects is the number of connections that got a response head.
func (r *Reader) Connects() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.connects
}

// Live reports whether the current connection has its response head.
func (r *Reader) Live() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.live
}

// Start runs n Readers of url (with token, if not empty) until the test ends, and returns
// once every one of them is connected.
func Start(t testing.TB, url, token string, n int, timeout time.Duration) []*Reader {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: true, MaxConnsPerHost: 0}
	client := &http.Client{Transport: tr}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	rs := make([]*Reader, n)
	for i := range rs {
		rs[i] = &Reader{URL: url, Token: token}
		wg.Add(1)
		go func() { defer wg.Done(); rs[i].Run(ctx, client) }()
	}
	t.Cleanup(func() { cancel(); wg.Wait(); tr.CloseIdleConnections() })
	deadline := time.Now().Add(timeout)
	for _, r := range rs {
		for !r.Live() {
			if time.Now().After(deadline) {
				t.Fatalf("not every reader connected within %s", timeout)
			}
			time.Sleep(10 * time.Millisecond) // polling: a reader has no signal for "connected"
		}
	}
	return rs
}

// PublishRange publishes durable events first … last on stream with pgsse.publish, one
// transaction each, with Data(id) as data; it requires the ids PostgreSQL assigns to be
// exactly those. after(id), if not nil, runs once event id has committed.
func PublishRange(t testing.TB, dsn, stream string, first, last int, after func(id int)) {
	t.Helper()
	conn := pgtest.Connect(t, dsn)
	for i := first; i <= last; i++ {
		res := conn.ExecParams(context.Background(), "SELECT pgsse.publish($1, $2)",
			[][]byte{[]byte(stream), []byte(Data(i))}, nil, nil, nil).Read()
		require.NoError(t, res.Err)
		require.Equal(t, strconv.Itoa(i), string(res.Rows[0][0]), "ids follow the test's count")
		if after != nil {
			after(i)
		}
	}
}

// RequireAll waits until every reader has n events, then checks that each has events 1 … n,
// once each, in order, with the data PublishRange gave them.
func RequireAll(t testing.TB, rs []*Reader, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for _, r := range rs {
		for r.Count() < n && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond) // polling: events arrive on the readers' goroutines
		}
	}
	for i, r := range rs {
		r.mu.Lock()
		assert.Empty(t, r.bad, "reader %d: events with the wrong data", i)
		ok := len(r.ids) == n
		for j := 0; ok && j < n; j++ {
			ok = r.ids[j] == int64(j+1)
		}
		if !ok {
			t.Errorf("reader %d (%d connections): want ids 1 … %d once each in order, got %d ids, %s",
				i, r.connects, n, len(r.ids), departure(r.ids))
		}
		r.mu.Unlock()
	}
}

// departure shows where a sequence of ids departs from 1, 2, 3, …
func departure(ids []int64) string {
	for j, id := range ids {
		if id != int64(j+1) {
			return fmt.Sprintf("first departure at index %d: …%v…", j, ids[max(j-3, 0):min(j+4, len(ids))])
		}
	}
	return "a prefix of 1, 2, 3, …"
}
