package engine

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/store"
)

// docs/http.md's durable delivery guarantee: every committed event with id > cursor reaches every
// connected client exactly once, in order, including events committed while the LISTEN
// session was down.

// faultClient reads one stream's ids in the background, reconnecting with Last-Event-ID
// only if the server closed it after a retry: field (which it records).
type faultClient struct {
	t        testing.TB
	addr     string
	path     string
	headers  []string
	mu       sync.Mutex
	ids      []int64
	problems []string
	reconns  int
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

func (fc *faultClient) halt() {
	fc.stopOnce.Do(func() { close(fc.stop) })
	<-fc.done
}

func startFaultClient(t testing.TB, addr, path string, headers ...string) *faultClient {
	t.Helper()
	fc := &faultClient{t: t, addr: addr, path: path, headers: headers, stop: make(chan struct{}), done: make(chan struct{})}
	c := dial(t, addr, path, headers...)
	require.Equal(t, 200, c.Status, c.Body)
	go fc.run(c)
	t.Cleanup(fc.halt)
	return fc
}

func (fc *faultClient) run(c *sseClient) {
	defer close(fc.done)
	var last int64 = -1
	sawRetry := false
	for {
		select {
		case <-fc.stop:
			return
		default:
		}
		ev, err := c.next(200 * time.Millisecond)
		if err != nil {
			if isTimeout(err) {
				continue
			}
			if !isEOF(err) || !sawRetry {
				fc.problem("connection ended without a retry: field first: " + err.Error())
				return
			}
			// Closed with a retry: reconnect with Last-Event-ID, as a browser would.
			fc.mu.Lock()
			fc.reconns++
			fc.mu.Unlock()
			hs := fc.headers
			if last >= 0 {
				hs = append(append([]string(nil), hs...), "Last-Event-ID: "+strconv.FormatInt(last, 10))
			}
			nc, derr := tryDial(fc.t, fc.addr, fc.path, hs...)
			if derr != nil {
				fc.problem("reconnect: " + derr.Error())
				return
			}
			c = nc
			sawRetry = false
			continue
		}
		if ev.Retry != "" && !ev.HasID && ev.Data == "" {
			sawRetry = true
			continue
		}
		if ev.Event == "pgsse:gap" {
			fc.problem("unexpected gap: " + ev.Data)
			continue
		}
		if !ev.HasID {
			fc.problem("event without id: " + ev.String())
			continue
		}
		fc.mu.Lock()
		fc.ids = append(fc.ids, ev.id())
		fc.mu.Unlock()
		last = ev.id()
	}
}

func (fc *faultClient) problem(s string) {
	fc.mu.Lock()
	fc.problems = append(fc.problems, s)
	fc.mu.Unlock()
}

func (fc *faultClient) count() int {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return len(fc.ids)
}

func (fc *faultClient) lastID() int64 {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if len(fc.ids) == 0 {
		return 0
	}
	return fc.ids[len(fc.ids)-1]
}

// finish waits until the client has id head (or timeout), stops it and checks ids are
// exactly from..head.
func (fc *faultClient) finish(t *testing.T, name string, from, head int64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for fc.lastID() < head && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	fc.halt()
	fc.mu.Lock()
	defer fc.mu.Unlock()
	for _, p := range fc.problems {
		t.Errorf("%s: %s", name, p)
	}
	if fc.reconns > 0 {
		t.Logf("%s: the server closed the connection with retry: %d time(s); reconnected with Last-Event-ID", name, fc.reconns)
	}
	want := from
	for i, id := range fc.ids {
		if id != want {
			t.Errorf("%s: at position %d want id %d, got %d (ids must be contiguous, exactly once)", name, i, want, id)
			return
		}
		want++
	}
	assert.Equal(t, head, want-1, "%s: received ids %d..%d, committed head %d", name, from, want-1, head)
}

func tryDial(t testing.TB, addr, path string, headers ...string) (*sseClient, error) {
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := conn.Write([]byte(request("GET", path, headers...))); err != nil {
		return nil, err
	}
	c := &sseClient{t: t, conn: conn, r: bufio.NewReaderSize(conn, 64<<10)}
	_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		return nil, err
	}
	_ = conn.SetReadDeadline(time.Time{})
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("reconnect answered %d", resp.StatusCode)
	}
	c.Status, c.Header = resp.StatusCode, resp.Header
	return c, nil
}

func isTimeout(err error) bool {
	type timeout interface{ Timeout() bool }
	te, ok := err.(timeout)
	return ok && te.Timeout()
}

// terminateListen kills the server's LISTEN backend in its own database only (the
// shared cluster runs other tests' servers too).
func terminateListen(t testing.TB, dsn string) int {
	t.Helper()
	v := pgtest.QueryValue(t, dsn, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = 'pgsse-listen' AND datname = current_database()`)
	n, err := strconv.Atoi(v)
	require.NoError(t, err)
	return n
}

// holdListenDown makes the server's database refuse new connections and terminates its
// LISTEN backend, so the LISTEN session stays down until release is called. Existing
// connections (publishers, the replay pool) keep working.
func holdListenDown(t testing.TB, ts *testServer) (release func()) {
	t.Helper()
	admin := connect(t, pgtest.URL(t)) // another database: ours cannot be altered from inside
	db := pgtest.QueryValue(t, ts.DSN, "SELECT current_database()")
	exec := func(sql string) string {
		t.Helper()
		res, err := admin.Exec(context.Background(), sql).ReadAll()
		require.NoError(t, err)
		if len(res) > 0 && len(res[0].Rows) > 0 {
			return string(res[0].Rows[0][0])
		}
		return ""
	}
	quoted := `"` + strings.ReplaceAll(db, `"`, `""`) + `"`
	exec("ALTER DATABASE " + quoted + " ALLOW_CONNECTIONS false")
	released := false
	release = func() {
		if !released {
			released = true
			exec("ALTER DATABASE " + quoted + " ALLOW_CONNECTIONS true")
		}
	}
	t.Cleanup(release)
	n := exec(`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = 'pgsse-listen' AND datname = '` + strings.ReplaceAll(db, "'", "''") + `'`)
	require.Equal(t, "1", n, "one LISTEN backend in our database")
	waitFor(t, 5*time.Second, "LISTEN session down", func() bool { return !ts.lsn.ok() })
	return release
}

func TestSSEFaultListenTerminated(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	pub := connect(t, ts.DSN)
	publishN(t, pub, "f", "pre", 3)

	clients := []*faultClient{
		startFaultClient(t, addr, "/streams/f", tok),                     // live from head 3
		startFaultClient(t, addr, "/streams/f?since=0", tok),             // replay 1.. then live
		startFaultClient(t, addr, "/streams/f", tok, "Last-Event-ID: 2"), // replay 3.. then live
	}
	froms := []int64{4, 1, 3}
	p := startPublisher(t, ts.DSN, "f", 50*time.Millisecond)
	waitFor(t, 10*time.Second, "events flowing", func() bool { return clients[0].count() > 5 })

	for round := 0; round < 3; round++ {
		if round == 1 {
			// Held down while events are committed and nobody listens.
			release := holdListenDown(t, ts)
			before := p.last.Load()
			waitFor(t, 20*time.Second, "events committed during the outage", func() bool { return p.last.Load() > before+5 })
			require.False(t, ts.lsn.ok(), "the LISTEN session is still down")
			release()
		} else {
			require.Equal(t, 1, terminateListen(t, ts.DSN), "one LISTEN backend in our database")
			waitFor(t, 5*time.Second, "LISTEN session noticed down", func() bool { return !ts.lsn.ok() })
		}
		before := clients[0].count()
		waitFor(t, 20*time.Second, "LISTEN session back", func() bool { return ts.lsn.ok() })
		waitFor(t, 10*time.Second, "events flowing again", func() bool { return clients[0].count() > before+5 })
	}
	p.Stop()
	head := streamHead(t, ts.DSN, "f")
	t.Logf("published up to id %d (%d publish errors)", head, p.errors.Load())
	for i, fc := range clients {
		fc.finish(t, "client "+strconv.Itoa(i), froms[i], head, 15*time.Second)
	}
}

// The LISTEN session goes down and events are published while it is down, and nothing
// is published after it comes back: the catch-up alone must deliver them.
func TestSSEFaultOutageCatchUpWithoutLaterTraffic(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	pub := connect(t, ts.DSN)
	c := dial(t, addr, "/streams/o", tok)
	require.Equal(t, 200, c.Status)
	publish(t, pub, "o", "before", "", nil)
	c.readIDs(1, 1, 5*time.Second)

	release := holdListenDown(t, ts)
	publishN(t, pub, "o", "during", 5) // committed when it returns
	require.NoError(t, store.Broadcast(context.Background(), pub, "o", "lost ephemeral", "", nil))
	require.False(t, ts.lsn.ok(), "the LISTEN session is still down")
	release()
	c.readIDs(2, 6, 20*time.Second)
	// Live again afterwards.
	publish(t, pub, "o", "after", "", nil)
	c.readIDs(7, 7, 5*time.Second)
}

func TestSSEFaultPostgresRestart(t *testing.T) {
	t.Parallel()
	cluster := pgtest.StartCluster(t, pgtest.ClusterOptions{})
	dsn := migrated(t, cluster.NewDatabase(t))
	ts := startServer(t, dsn, nil)
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))

	pub := connectPlain(dsn)
	require.NotNil(t, pub)
	for i := 0; i < 3; i++ {
		_, err := store.Publish(context.Background(), pub, "pg", "pre", "", nil)
		require.NoError(t, err)
	}
	pub.Close(context.Background())

	clients := []*faultClient{
		startFaultClient(t, addr, "/streams/pg", tok),
		startFaultClient(t, addr, "/streams/pg?since=0", tok),
		startFaultClient(t, addr, "/streams/pg", tok, "Last-Event-ID: 1"),
	}
	froms := []int64{4, 1, 2}
	p := startPublisher(t, dsn, "pg", 50*time.Millisecond)
	waitFor(t, 10*time.Second, "events flowing", func() bool { return clients[0].count() > 5 })

	for round := 0; round < 3; round++ {
		before := p.last.Load()
		if round == 2 {
			// Down for a while: clients keep their connections through it.
			cluster.Stop()
			time.Sleep(2 * time.Second)
			cluster.Start()
		} else {
			cluster.Restart()
		}
		waitFor(t, 30*time.Second, "publisher publishing again", func() bool { return p.last.Load() > before+3 })
		waitFor(t, 30*time.Second, "LISTEN session back", func() bool { return ts.lsn.ok() })
		n := clients[0].count()
		waitFor(t, 15*time.Second, "events flowing again", func() bool { return clients[0].count() > n+5 })
	}
	p.Stop()
	head, err := strconv.ParseInt(pgtest.QueryValue(t, dsn, "SELECT head FROM pgsse.streams WHERE stream = 'pg'"), 10, 64)
	require.NoError(t, err)
	t.Logf("published up to id %d (%d publish errors during restarts)", head, p.errors.Load())
	for i, fc := range clients {
		fc.finish(t, "client "+strconv.Itoa(i), froms[i], head, 20*time.Second)
	}
}

// A /channels/ client that connects while the LISTEN session is down gets its response
// head only once the LISTEN has completed on the new session; a NOTIFY sent right after
// the head then arrives.
func TestSSEFaultChannelHeadWaitsForListen(t *testing.T) {
	t.Parallel()
	// The session's reconnect backoff after the hold can outlast dbUnavailableAfterMS on a
	// busy machine; the client would then be shed (":database unavailable", a rule of its own
	// with its own test) instead of waiting for the LISTEN this test is about.
	ts := startServer(t, "", func(c *Config) { c.dbUnavailableAfterMS = time.Minute.Milliseconds() })
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	pub := connect(t, ts.DSN)
	release := holdListenDown(t, ts)

	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.Write([]byte(request("GET", "/channels/outage", tok)))
	require.NoError(t, err)
	_ = conn.SetReadDeadline(time.Now().Add(700 * time.Millisecond))
	n, err := conn.Read(make([]byte, 1))
	require.Zero(t, n, "no response head while the LISTEN session is down")
	require.True(t, isTimeout(err), "%v", err)

	release()
	c := &sseClient{t: t, conn: conn, r: bufio.NewReader(conn)}
	c.readHead()
	require.Equal(t, 200, c.Status)
	_, err = pub.Exec(context.Background(), "SELECT pg_notify('outage', 'after head')").ReadAll()
	require.NoError(t, err)
	assert.Equal(t, sseEvent{Data: "after head"}, c.mustNextData(5*time.Second))
}

// After the LISTEN session is lost and re-established, /channels/ clients keep their
// connection and receive notifications again (their channels are LISTENed again).
func TestSSEFaultChannelRelisten(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	pub := connect(t, ts.DSN)
	names := []string{"plain", `q"uote`, "semi;colon--", "UPPER", "select"}
	clients := make([]*sseClient, len(names))
	notify := func(ch, payload string) {
		t.Helper()
		res := pub.ExecParams(context.Background(), "SELECT pg_notify($1, $2)", [][]byte{[]byte(ch), []byte(payload)}, nil, nil, nil).Read()
		require.NoError(t, res.Err)
	}
	for i, n := range names {
		clients[i] = dial(t, addr, "/channels/"+strings.NewReplacer(`"`, "%22", ";", "%3B").Replace(n), tok)
		require.Equal(t, 200, clients[i].Status, "%s: %s", n, clients[i].Body)
		notify(n, "before "+n)
		assert.Equal(t, sseEvent{Data: "before " + n}, clients[i].mustNextData(5*time.Second))
	}
	for round := 0; round < 2; round++ {
		require.Equal(t, 1, terminateListen(t, ts.DSN))
		waitFor(t, 5*time.Second, "LISTEN down", func() bool { return !ts.lsn.ok() })
		waitFor(t, 20*time.Second, "LISTEN back", func() bool { return ts.lsn.ok() })
		for i, n := range names {
			p := fmt.Sprintf("round %d %s", round, n)
			notify(n, p)
			assert.Equal(t, sseEvent{Data: p}, clients[i].mustNextData(5*time.Second))
		}
	}
}

// docs/http.md, Responses and errors: with PostgreSQL down a new subscriber is told so at once —
// ":database unavailable", not ":over capacity" after ≈15 s (issue 11) — while connected clients
// keep their connections and are caught up once it is back.
func TestShedDatabaseUnavailable(t *testing.T) {
	t.Parallel()
	cluster := pgtest.StartCluster(t, pgtest.ClusterOptions{})
	dsn := migrated(t, cluster.NewDatabase(t))
	ts := startServer(t, dsn, nil)
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	live := dial(t, addr, "/streams/db", tok)
	require.Equal(t, 200, live.Status)

	cluster.Stop()
	waitFor(t, 20*time.Second, "the server to know PostgreSQL is down", func() bool {
		down := false
		ts.onLoop(t, func() { down = ts.lsn.databaseUnavailable() })
		return down
	})
	for _, path := range []string{"/streams/db", "/streams/db?since=0", "/channels/db"} {
		start := time.Now()
		dial(t, addr, path, tok).expectShed("database unavailable")
		assert.Less(t, time.Since(start), 5*time.Second, "%s: told at once", path)
	}
	assert.Equal(t, float64(3), metricValue(t, ts.metrics.shed[shedDatabaseUnavailable]))

	cluster.Start()
	waitFor(t, 30*time.Second, "the LISTEN session back", func() bool { return ts.lsn.ok() })
	c := dial(t, addr, "/streams/db", tok)
	require.Equal(t, 200, c.Status)
	pub := connectPlain(dsn)
	require.NotNil(t, pub)
	defer pub.Close(context.Background())
	_, err := store.Publish(context.Background(), pub, "db", "back", "", nil)
	require.NoError(t, err)
	assert.Equal(t, "back", live.mustNextData(10*time.Second).Data, "the connected client stayed")
	assert.Equal(t, "back", c.mustNextData(10*time.Second).Data)
}
