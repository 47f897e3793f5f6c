package engine

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/auth"
)

// expectShed reads a shed response's body to EOF: 200 (checked by the caller's dial), a
// retry field and the one comment that says why (docs/http.md, Responses and errors: never one
// reason for another).
func (c *sseClient) expectShed(why string) {
	c.t.Helper()
	require.Equal(c.t, 200, c.Status, c.Body)
	_ = c.conn.SetReadDeadline(time.Now().Add(15 * time.Second))
	body, err := io.ReadAll(c.r)
	require.NoError(c.t, err, "the server closes a shed connection")
	assert.Contains(c.t, string(body), "retry: ")
	assert.Contains(c.t, string(body), "\n:"+why+"\n", "shed comment")
	for _, other := range shedComments {
		if string(other) != why {
			assert.NotContains(c.t, string(body), ":"+string(other)+"\n")
		}
	}
}

// The task drain runs the tasks queued so far, then one round of admissions, then the tasks
// that arrived meanwhile (deliveries), then the next round: admissions never hold up a
// delivery for more than one round.
func TestTaskDrainInterleavesAdmissions(t *testing.T) {
	q := newTaskQueue()
	var order []string
	rounds := 0
	q.between = func(time.Duration) bool {
		rounds++
		order = append(order, "admit "+strconv.Itoa(rounds))
		if rounds <= 2 {
			q.push(func() { order = append(order, "deliver "+strconv.Itoa(rounds)) }) // a notification arrives
		}
		return rounds < 3
	}
	q.push(func() { order = append(order, "task") })
	q.drain()
	assert.Equal(t, []string{"task", "admit 1", "deliver 1", "admit 2", "deliver 2", "admit 3"}, order)
	assert.False(t, q.scheduled, "the drain ends when neither has work")
}

// An admission round lasts about half the task round before it (deliveries slow down by at
// most half during a storm), at least admitMinRound.
func TestAdmitBudget(t *testing.T) {
	assert.Equal(t, admitMinRound, admitBudget(0))
	assert.Equal(t, admitMinRound, admitBudget(time.Millisecond))
	assert.Equal(t, 50*time.Millisecond, admitBudget(100*time.Millisecond))
}

// A round with no time to spare admits admitMinPerRound queued connections; the rest wait, in
// order.
func TestAdmitQueuedBoundedPerRound(t *testing.T) {
	s, err := New(Config{Heartbeat: time.Second, MaxConnections: 1000, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	s.lsn.up = true
	const n = admitMinPerRound*2 + 5
	conns := make([]*sseConn, n)
	for i := range conns {
		conns[i] = s.conns.open(newRecordConn(t))
		queueFor(s, conns[i], &subRequest{name: "s" + strconv.Itoa(i)}, 0)
	}
	conns[3].closed = true // gone while it waited: skipped, not counted
	states := func() (queued, pending int) {
		for _, sc := range conns {
			if sc.closed {
				continue
			}
			switch sc.state {
			case stateQueued:
				queued++
			case statePending:
				pending++
			}
		}
		return
	}
	require.True(t, s.adm.round(0), "more wait after the first round")
	q, p := states()
	assert.Equal(t, admitMinPerRound, p)
	assert.Equal(t, n-1-admitMinPerRound, q)
	assert.Equal(t, statePending, conns[admitMinPerRound].state, "FIFO: the oldest first")
	assert.Equal(t, stateQueued, conns[admitMinPerRound+1].state)
	require.True(t, s.adm.round(0))
	require.False(t, s.admitRound(0), "the last round (2 ms) empties the queue")
	q, p = states()
	assert.Equal(t, 0, q)
	assert.Equal(t, n-1, p)
	assert.Equal(t, n-1, s.conns.active)
}

// docs/http.md, Authorization: signatures are checked on the verifier pool, and a token seen
// before is answered from its cache: a second connection with the same token costs no
// verification.
func TestTokenVerifiedOnPoolThenCached(t *testing.T) {
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	stats := ts.tok.pool.Stats()
	tok := token(t, auth.Claims{Streams: []string{"cached"}, Subject: "pool"}, time.Hour)

	c1 := dial(t, addr, "/streams/cached", bearerH(tok))
	require.Equal(t, 200, c1.Status, c1.Body)
	assert.Equal(t, uint64(1), stats.Verified.Load(), "the first sight of a token is verified on the pool")
	c2 := dial(t, addr, "/streams/cached", bearerH(tok))
	require.Equal(t, 200, c2.Status, c2.Body)
	assert.Equal(t, uint64(1), stats.Verified.Load(), "the second is answered from the cache")
	assert.Equal(t, uint64(1), stats.Hits.Load())

	// A forged token (same claims, another key) is refused on the pool, then from the cache.
	forged, err := auth.Mint(auth.MintKey{Secret: []byte("another-secret-0123456789abcdefgh")},
		auth.Claims{Streams: []string{"cached"}, Subject: "pool"}, time.Hour, "", "", time.Now())
	require.NoError(t, err)
	for i := 0; i < 2; i++ {
		r := get(t, addr, "/streams/cached", bearerH(forged))
		assert.Equal(t, 401, r.Status)
		assert.Equal(t, auth.ErrSignature.Error()+"\n", r.Body)
	}
	assert.Equal(t, uint64(1), stats.Failed.Load())
	assert.Equal(t, uint64(1), stats.FailureHits.Load())

	// Both subscribers are live.
	pub := connect(t, ts.DSN)
	publish(t, pub, "cached", "hello", "", nil)
	assert.Equal(t, "hello", c1.mustNextData(5*time.Second).Data)
	assert.Equal(t, "hello", c2.mustNextData(5*time.Second).Data)
}

// Many new connections with tokens the cache has not seen, all at once, while a subscriber
// receives events: every one is answered (200 and live), and the subscriber misses nothing.
func TestConnectionStormWithFreshTokens(t *testing.T) {
	const storm = 300
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	pub := connect(t, ts.DSN)
	watcher := dial(t, addr, "/streams/storm", bearerH(allStreams(t)))
	require.Equal(t, 200, watcher.Status)
	watcher.mustNext(5 * time.Second)

	toks := make([]string, storm)
	for i := range toks {
		toks[i] = token(t, auth.Claims{Streams: []string{"storm"}, Subject: "u" + strconv.Itoa(i)}, time.Hour)
	}
	// The whole storm is sent before any answer is read: every request is on the wire at once
	// (one goroutine; the race detector's cost grows with the goroutines a test ever ran).
	stormers := make([]*sseClient, storm)
	for i, tok := range toks {
		conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		_, err = conn.Write([]byte(request("GET", "/streams/storm", bearerH(tok))))
		require.NoError(t, err)
		stormers[i] = &sseClient{t: t, conn: conn, r: bufio.NewReaderSize(conn, 4<<10)}
	}
	for i := 1; i <= 20; i++ {
		publish(t, pub, "storm", "e"+strconv.Itoa(i), "", nil)
	}
	for _, c := range stormers {
		c.readHead()
		require.Equal(t, 200, c.Status, c.Body)
	}
	for i := 1; i <= 20; i++ {
		ev := watcher.mustNextData(10 * time.Second)
		require.Equal(t, "e"+strconv.Itoa(i), ev.Data)
	}
	// Every stormer is live: the next event reaches each.
	publish(t, pub, "storm", "after", "", nil)
	for _, c := range stormers {
		for {
			ev := c.mustNextData(10 * time.Second)
			if ev.Data == "after" {
				break
			}
		}
	}
	assert.GreaterOrEqual(t, ts.tok.pool.Stats().Verified.Load(), uint64(storm))
}

// docs/http.md, Authorization (Per subject): --max-connections-per-subject caps the connections
// of one sub (or, without sub, of one token); over it the client is shed with a comment saying
// why.
func TestSubjectLimit(t *testing.T) {
	ts := startServer(t, "", func(c *Config) { c.MaxConnectionsPerSubject = 2 })
	addr := ts.Addr().String()
	alice := token(t, auth.Claims{Streams: []string{"*"}, Channels: []string{"*"}, Subject: "alice"}, time.Hour)
	// Another token of alice's (other grants): the same subject.
	alice2 := token(t, auth.Claims{Streams: []string{"x"}, Subject: "alice"}, time.Hour)
	bob := token(t, auth.Claims{Streams: []string{"*"}, Subject: "bob"}, time.Hour)

	a1 := dial(t, addr, "/streams/x", bearerH(alice))
	require.Equal(t, 200, a1.Status)
	a2 := dial(t, addr, "/channels/x", bearerH(alice))
	require.Equal(t, 200, a2.Status)
	dial(t, addr, "/streams/x", bearerH(alice2)).expectShed("too many connections for this subject")
	b := dial(t, addr, "/streams/x", bearerH(bob))
	require.Equal(t, 200, b.Status, "another subject is not affected")

	// Closing one of alice's frees a place.
	a1.conn.Close()
	waitFor(t, 10*time.Second, "alice's place back", func() bool {
		n := -1
		ts.onLoop(t, func() { n = int(ts.adm.subjects["sub:alice"]) })
		return n == 1
	})
	a3 := dial(t, addr, "/streams/x", bearerH(alice2))
	require.Equal(t, 200, a3.Status)

	// Without sub, the token itself is the subject: a second token with the same claims
	// (minted a second later) is someone else.
	anon := token(t, auth.Claims{Streams: []string{"*"}}, time.Hour)
	for i := 0; i < 2; i++ {
		c := dial(t, addr, "/streams/y", bearerH(anon))
		require.Equal(t, 200, c.Status)
	}
	dial(t, addr, "/streams/y", bearerH(anon)).expectShed("too many connections for this subject")
	anonOther, err := auth.Mint(auth.MintKey{Secret: []byte(testSecret)}, auth.Claims{Streams: []string{"*"}}, time.Hour, "", "", time.Now().Add(time.Second))
	require.NoError(t, err)
	require.NotEqual(t, anon, anonOther)
	c := dial(t, addr, "/streams/y", bearerH(anonOther))
	require.Equal(t, 200, c.Status)
	assert.Equal(t, float64(2), metricValue(t, ts.metrics.shed[shedSubjectLimit]))
}

// Over --max-connections a client is shed as over capacity; while the server drains, a
// queued one is shed as draining.
func TestShedOverCapacityAndDraining(t *testing.T) {
	ts := startServer(t, "", func(c *Config) { c.MaxConnections = 1 })
	addr := ts.Addr().String()
	tok := allStreams(t)
	first := dial(t, addr, "/streams/full", bearerH(tok))
	require.Equal(t, 200, first.Status)
	dial(t, addr, "/streams/full", bearerH(tok)).expectShed("over capacity")
	assert.Equal(t, float64(1), metricValue(t, ts.metrics.shed[shedOverCapacity]))

	s, c, sc := openAt(t, 1_000_000)
	s.lsn.up = true
	queueFor(s, sc, &subRequest{name: "s"}, 0)
	s.draining = true
	s.admitRound(0)
	assert.Equal(t, stateClosing, sc.state)
	assert.Contains(t, c.text(), "\n:draining\n")
	assert.Equal(t, float64(1), metricValue(t, s.metrics.shed[shedDraining]))
}

// A drain that has run for drainSlice with tasks still coming gives the loop back to gnet
// (so sockets are served between rounds of deliveries) and resumes later; it stays scheduled
// meanwhile, so a push does not start a second one.
func TestTaskDrainYields(t *testing.T) {
	q := newTaskQueue()
	rounds := 0
	var slow func()
	slow = func() {
		rounds++
		time.Sleep(drainSlice) // a round of deliveries as long as the slice
		q.push(slow)           // and the next one is already waiting
	}
	q.push(slow)
	q.mu.Lock()
	q.scheduled = true // as wake would have set it
	q.mu.Unlock()
	q.drain()
	assert.Equal(t, 1, rounds, "one round, then the loop goes back to gnet")
	q.mu.Lock()
	assert.Len(t, q.tasks, 1, "the next round waits")
	q.mu.Unlock()
	waitFor(t, 5*time.Second, "the resume (without a loop it only clears scheduled)", func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return !q.scheduled
	})
}
