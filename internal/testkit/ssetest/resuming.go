package ssetest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

// A ResumingReader is an EventSource-like client that outlives the server it talks to: it
// reads the durable events of one stream and, whenever its connection ends, connects again
// with Last-Event-ID — wherever a load balancer or the kernel (SO_REUSEPORT) sends it. Tests
// of process and host failures use it to check docs/http.md's durable delivery guarantee end
// to end: every event once, in id order, across reconnects.
//
// Events published with PublishRange carry Data(id) as their data, so that a reader can tell
// an event from another one that merely has its id.

// reconnectDelay is how long a ResumingReader waits before connecting again (a browser waits for the
// retry: value; tests need not).
const reconnectDelay = 50 * time.Millisecond

// Data is the data PublishRange gives event id.
func Data(id int) string { return "e" + strconv.Itoa(id) }

// ResumingReader is one resuming subscriber. Its URL should ask for the history it needs on
// the first connection (e.g. ?since=0); later connections send Last-Event-ID, which wins over
// since.
type ResumingReader struct {
	URL, Token string

	mu       sync.Mutex
	lastID   string        // the last event ID, as a browser keeps it across connections
	ids      []int64       // every durable id received, in order
	bad      []string      // events whose data is not Data(id)
	connects int           // connections that got a 200 response head
	live     bool          // the current connection has its response head
	changed  chan struct{} // closed (and replaced) whenever one of the above changes
}

// changedLocked signals a change; r.mu is held.
func (r *ResumingReader) changedLocked() {
	if r.changed != nil {
		close(r.changed)
	}
	r.changed = make(chan struct{})
}

// waitUntil waits until cond (called with r.mu held) holds or deadline passes, woken by the
// reader's own changes rather than by polling.
func (r *ResumingReader) waitUntil(deadline time.Time, cond func() bool) bool {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		r.mu.Lock()
		if cond() {
			r.mu.Unlock()
			return true
		}
		if r.changed == nil {
			r.changed = make(chan struct{})
		}
		ch := r.changed
		r.mu.Unlock()
		select {
		case <-ch:
		case <-timer.C:
			r.mu.Lock()
			defer r.mu.Unlock()
			return cond()
		}
	}
}

// Run connects, reads and reconnects until ctx ends.
func (r *ResumingReader) Run(ctx context.Context, client *http.Client) {
	for ctx.Err() == nil {
		req, err := http.NewRequestWithContext(ctx, "GET", r.URL, nil)
		if err != nil {
			panic(err)
		}
		if r.Token != "" {
			req.Header.Set("Authorization", "Bearer "+r.Token)
		}
		r.mu.Lock()
		if r.lastID != "" {
			req.Header.Set("Last-Event-ID", r.lastID)
		}
		r.mu.Unlock()
		if resp, err := client.Do(req); err == nil {
			if resp.StatusCode == http.StatusOK {
				r.mu.Lock()
				r.connects++
				r.live = true
				r.changedLocked()
				r.mu.Unlock()
				r.read(resp.Body)
			}
			resp.Body.Close()
		}
		r.mu.Lock()
		r.live = false
		r.changedLocked()
		r.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(reconnectDelay):
		}
	}
}

// read records the durable events of one response body until it ends.
func (r *ResumingReader) read(body io.Reader) {
	s := NewStream(body, nil)
	for {
		ev, err := s.Next(0)
		if err != nil {
			return
		}
		if !ev.HasID {
			continue
		}
		n, err := strconv.ParseInt(ev.ID, 10, 64)
		r.mu.Lock()
		if err != nil || ev.Data != Data(int(n)) {
			r.bad = append(r.bad, fmt.Sprintf("id %q data %q", ev.ID, ev.Data))
		}
		r.ids = append(r.ids, n)
		r.lastID = ev.LastEventID
		r.changedLocked()
		r.mu.Unlock()
	}
}

// Count is the number of events received so far.
func (r *ResumingReader) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ids)
}

// Connects is the number of connections that got a response head.
func (r *ResumingReader) Connects() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.connects
}

// Live reports whether the current connection has its response head.
func (r *ResumingReader) Live() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.live
}

// StartResuming runs n ResumingReaders of url (with token, if not empty) until the test
// ends, and returns once every one of them is connected.
func StartResuming(t testing.TB, url, token string, n int, timeout time.Duration) []*ResumingReader {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: true, MaxConnsPerHost: 0}
	client := &http.Client{Transport: tr}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	rs := make([]*ResumingReader, n)
	for i := range rs {
		rs[i] = &ResumingReader{URL: url, Token: token}
		wg.Add(1)
		go func() { defer wg.Done(); rs[i].Run(ctx, client) }()
	}
	t.Cleanup(func() { cancel(); wg.Wait(); tr.CloseIdleConnections() })
	deadline := time.Now().Add(timeout)
	for i, r := range rs {
		if !r.waitUntil(deadline, func() bool { return r.live }) {
			t.Fatalf("reader %d of %d not connected within %s", i, n, timeout)
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
func RequireAll(t testing.TB, rs []*ResumingReader, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for _, r := range rs {
		r.waitUntil(deadline, func() bool { return len(r.ids) >= n })
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
