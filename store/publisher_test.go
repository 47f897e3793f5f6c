package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/names"
)

// groupLog records the Observe calls of a Publisher.
type groupLog struct {
	mu     sync.Mutex
	groups []PublishGroup
}

func (g *groupLog) observe(pg PublishGroup) {
	g.mu.Lock()
	g.groups = append(g.groups, pg)
	g.mu.Unlock()
}

func (g *groupLog) maxEvents() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	m := 0
	for _, pg := range g.groups {
		if pg.Err == nil {
			m = max(m, pg.Events)
		}
	}
	return m
}

// newTestPublisher starts a Publisher closed at test end.
func newTestPublisher(t testing.TB, cfg PublisherConfig, hooks testHooks) *Publisher {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	p := newPublisher(cfg, hooks)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		p.Close(ctx)
	})
	return p
}

// publishSync submits req and waits for its result; a Submit error is returned as the
// result's Err.
func publishSync(t testing.TB, p *Publisher, req *PublishRequest) PublishResult {
	t.Helper()
	ch := make(chan PublishResult, 1)
	if err := p.Submit(req, func(r PublishResult) { ch <- r }); err != nil {
		return PublishResult{Err: err}
	}
	select {
	case r := <-ch:
		return r
	case <-time.After(60 * time.Second):
		t.Fatal("no publish result within 60 s")
		return PublishResult{}
	}
}

func one(stream, data string) *PublishRequest {
	return &PublishRequest{Events: []PublishEvent{{Stream: stream, Data: []byte(data)}}}
}

func TestPublisherPublishes(t *testing.T) {
	dsn := migrated(t)
	l := listen(t, dsn)
	c := connect(t, dsn)
	p := newTestPublisher(t, PublisherConfig{DatabaseURL: dsn}, testHooks{})

	r := publishSync(t, p, one("pub/a", "first"))
	require.NoError(t, r.Err)
	assert.Equal(t, []int64{1}, r.IDs)
	pl, raw := l.nextParsed(t)
	assert.Equal(t, "D1 "+strconv.FormatInt(pl.TimeUS, 10)+" pub/a 1  0\nfirst", raw)

	r = publishSync(t, p, &PublishRequest{Batch: true, Events: []PublishEvent{
		{Stream: "pub/a", Data: []byte("a2"), Event: "ev", Audience: []string{"user:7", "with space"}},
		{Stream: "pub/b", Data: []byte("typing"), Ephemeral: true, Audience: []string{"u"}},
		{Stream: "pub/a", Data: []byte("a3")},
		{Stream: "pub/c", Data: []byte("c1\nline 2")},
	}})
	require.NoError(t, r.Err)
	assert.Equal(t, []int64{2, 0, 3, 1}, r.IDs)
	var kinds []string
	for range 3 {
		pl, _ := l.nextParsed(t)
		kinds = append(kinds, string(pl.Kind)+" "+string(pl.Stream)+" "+strconv.FormatInt(pl.ID, 10)+" "+string(pl.Data))
	}
	kinds[1] = kinds[1][:len("E pub/b")] + " typing" // the nonce varies
	assert.Equal(t, []string{"W pub/a 2 ", "E pub/b typing", "D pub/c 1 c1\nline 2"}, kinds)
	l.expectQuiet(t, c)
	assert.Equal(t, "1:first 2:a2:ev:{user:7,\"with space\"} 3:a3", pgtest.QueryValue(t, dsn,
		`SELECT string_agg(id || ':' || data || coalesce(':' || event, '') || coalesce(':' || audience::text, ''), ' ' ORDER BY id)
		 FROM pgsse.events WHERE stream = 'pub/a'`))

	max, err := p.MaxEventBytes()
	require.NoError(t, err)
	assert.EqualValues(t, DefaultMaxEventBytes, max)
}

// A result's TimeUS is PostgreSQL's clock after the transaction's events were stored: no
// earlier than the publish time any of them carries, in its notification or its row, and not
// much later (the engine takes it for the latest publish time it accounted for when it
// delivers the events before their notifications).
func TestPublisherResultTimeUS(t *testing.T) {
	dsn := migrated(t)
	l := listen(t, dsn)
	p := newTestPublisher(t, PublisherConfig{DatabaseURL: dsn}, testHooks{})
	for i := range 3 {
		r := publishSync(t, p, &PublishRequest{Batch: true, Events: []PublishEvent{
			{Stream: "tus/a", Data: []byte("a" + strconv.Itoa(i))},
			{Stream: "tus/b", Data: []byte("b" + strconv.Itoa(i))},
			{Stream: "tus/a", Data: []byte("c" + strconv.Itoa(i))},
		}})
		require.NoError(t, r.Err)
		for range 2 { // W tus/a, D tus/b
			pl, _ := l.nextParsed(t)
			assert.GreaterOrEqual(t, r.TimeUS, pl.TimeUS, "notification %s %d", pl.Stream, pl.ID)
			assert.Less(t, r.TimeUS-pl.TimeUS, int64(5e6), "within seconds of the publish")
		}
		stored, err := strconv.ParseInt(pgtest.QueryValue(t, dsn,
			"SELECT max(floor(extract(epoch FROM created_at) * 1e6)::bigint) FROM pgsse.events WHERE stream IN ('tus/a', 'tus/b')"), 10, 64)
		require.NoError(t, err)
		assert.GreaterOrEqual(t, r.TimeUS, stored, "the rows' publish times")
	}
}

// Bad requests are refused by Submit, or by the publisher before the transaction, with
// the field and (for batches) the line; nothing of them is stored or notified.
func TestPublisherRejectsBadRequests(t *testing.T) {
	dsn := migrated(t)
	l := listen(t, dsn)
	c := connect(t, dsn)
	p := newTestPublisher(t, PublisherConfig{DatabaseURL: dsn}, testHooks{})
	// Until a connection has read pgsse.max_event_bytes, Submit leaves the size check to
	// the publisher goroutine; wait for it so the sizes below are refused by Submit.
	require.Eventually(t, func() bool { m, _ := p.MaxEventBytes(); return m >= 0 }, 10*time.Second, 5*time.Millisecond)
	good := PublishEvent{Stream: "ok", Data: []byte("x")}
	batch := func(bad PublishEvent) *PublishRequest {
		return &PublishRequest{Batch: true, Events: []PublishEvent{good, good, bad, good}}
	}
	tests := []struct {
		name  string
		req   *PublishRequest
		msg   string
		err   error
		later bool // refused by the publisher goroutine, not by Submit
	}{
		{"bad stream", one("a b", "x"), `field "stream": ` + names.ErrStreamChars.Error(), names.ErrStreamChars, false},
		{"bad stream in a batch", batch(PublishEvent{Stream: "", Data: []byte("x")}), `line 3, field "stream": stream name must be 1-200 bytes`, names.ErrStreamLength, false},
		{"bad event", batch(PublishEvent{Stream: "s", Event: "a/b"}), `line 3, field "event": ` + names.ErrEventChars.Error(), names.ErrEventChars, false},
		{"bad tag", batch(PublishEvent{Stream: "s", Audience: []string{"a\x01"}}), `line 3, field "audience": ` + names.ErrTagControl.Error(), names.ErrTagControl, false},
		{"too large", batch(PublishEvent{Stream: "s", Data: make([]byte, DefaultMaxEventBytes+1)}),
			`line 3, field "data": event data is 1048577 bytes, over pgsse.max_event_bytes (1048576 bytes)`, ErrEventTooLarge, false},
		{"ephemeral too large", batch(PublishEvent{Stream: "s", Data: make([]byte, 7970), Ephemeral: true}),
			`line 3, field "data": the notification payload of an ephemeral event could be 8015 bytes, over the 7999-byte NOTIFY limit; publish it as a durable event`, ErrEventTooLarge, false},
		{"no events", &PublishRequest{}, "a request holds at least one event", ErrEmptyRequest, false},
		{"too many events", &PublishRequest{Events: make([]PublishEvent, MaxBatchEvents+1)}, "a batch holds at most 1000 events", ErrTooManyEvents, false},
		{"data not UTF-8", batch(PublishEvent{Stream: "s", Data: []byte("a\xffb")}), `line 3, field "data": ` + ErrDataNotText.Error(), ErrDataNotText, true},
		{"data with NUL", batch(PublishEvent{Stream: "s", Data: []byte("a\x00b")}), `line 3, field "data": ` + ErrDataNotText.Error(), ErrDataNotText, true},
		{"tag not UTF-8", batch(PublishEvent{Stream: "s", Audience: []string{"\xc3"}}), `line 3, field "audience": ` + names.ErrTagUTF8.Error(), names.ErrTagUTF8, false},
	}
	t.Run("too large before the setting is known", func(t *testing.T) {
		p := newTestPublisher(t, PublisherConfig{DatabaseURL: dsn}, testHooks{})
		err := publishSync(t, p, batch(PublishEvent{Stream: "s", Data: make([]byte, DefaultMaxEventBytes+1)})).Err
		assert.Equal(t, `line 3, field "data": event data is 1048577 bytes, over pgsse.max_event_bytes (1048576 bytes)`, err.Error())
	})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			called := false
			err := p.Submit(tc.req, func(r PublishResult) { called = true })
			if !tc.later {
				require.Error(t, err)
				assert.False(t, called)
			} else {
				require.NoError(t, err)
				err = publishSync(t, p, tc.req).Err
			}
			assert.Equal(t, tc.msg, err.Error())
			assert.ErrorIs(t, err, tc.err)
		})
	}
	l.expectQuiet(t, c)
	assert.Equal(t, "0", pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.events"))
}

// docs/http.md, Publishing over HTTP (group commit), issue 13: 64 concurrent submitters over 4
// streams through one Publisher: each stream's ids are exactly 1..n, in the order its
// notifications arrive (commit order), each submitter sees its ids of a stream rise, and
// transactions hold several requests.
func TestPublisherGroupCommit(t *testing.T) {
	dsn := migrated(t)
	l := listen(t, dsn)
	var groups groupLog
	p := newTestPublisher(t, PublisherConfig{DatabaseURL: dsn, Observe: groups.observe}, testHooks{})
	const submitters, each = 64, 25
	streams := []string{"gc/0", "gc/1", "gc/2", "gc/3"}
	var wg sync.WaitGroup
	errs := make(chan error, submitters)
	for i := range submitters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := map[string]int64{}
			for n := range each {
				s := streams[(i+n)%len(streams)]
				r := publishSync(t, p, one(s, fmt.Sprintf("%d.%d", i, n)))
				if r.Err != nil {
					errs <- r.Err
					return
				}
				if r.IDs[0] <= last[s] {
					errs <- fmt.Errorf("submitter %d got id %d on %s after %d", i, r.IDs[0], s, last[s])
					return
				}
				last[s] = r.IDs[0]
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	perStream := submitters * each / len(streams)
	for _, s := range streams {
		assert.Equal(t, fmt.Sprintf("%d 1 %d", perStream, perStream),
			pgtest.QueryValue(t, dsn, "SELECT count(*) || ' ' || min(id) || ' ' || max(id) FROM pgsse.events WHERE stream = '"+s+"'"))
	}
	// In notification (= commit) order, each stream's notifications name consecutive runs.
	next := map[string]int64{}
	notes := map[string]int{}
	for done := 0; done < len(streams); {
		pl, raw := l.nextParsed(t)
		s := string(pl.Stream)
		notes[s]++
		require.Equal(t, next[s]+1, pl.ID, "%s: %q", s, raw)
		next[s] = pl.ID
		if pl.Kind == KindWake {
			next[s] = lastOfRun(t, dsn, s, pl.ID)
		}
		if next[s] == int64(perStream) {
			done++
		}
	}
	for _, s := range streams {
		assert.Equal(t, pgtest.QueryValue(t, dsn, "SELECT count(DISTINCT xmin::text) FROM pgsse.events WHERE stream = '"+s+"'"),
			strconv.Itoa(notes[s]), "%s: one notification per transaction", s)
	}
	t.Logf("largest transaction: %d events", groups.maxEvents())
	assert.Greater(t, groups.maxEvents(), 1, "concurrent requests share transactions")
}

// A group whose statement PostgreSQL rejects (here: text that is not UTF-8, let through
// Go's check by a test hook) is retried one request per transaction: only the bad request
// fails, its neighbours are published.
func TestPublisherBadRequestFailsAlone(t *testing.T) {
	dsn := migrated(t)
	blocker := connect(t, dsn)
	var groups groupLog
	p := newTestPublisher(t, PublisherConfig{DatabaseURL: dsn, Observe: groups.observe}, testHooks{testSkipTextCheck: true})
	// Hold the counter row of "held" so the publisher's first transaction waits and the
	// next requests queue up behind it and go into one group.
	execSQL(t, blocker, "BEGIN; SELECT pgsse.publish('held', 'x')")
	results := make(chan PublishResult, 4)
	submit := func(req *PublishRequest) {
		require.NoError(t, p.Submit(req, func(r PublishResult) { results <- r }))
	}
	submit(one("held", "waits"))
	require.Eventually(t, func() bool {
		return pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgsse-publish' AND wait_event_type = 'Lock'") == "1"
	}, 10*time.Second, 10*time.Millisecond)
	good1, bad, good2 := one("g/1", "good 1"), one("g/bad", "bad \xff"), one("g/2", "good 2")
	submit(good1)
	submit(bad)
	submit(good2)
	execSQL(t, blocker, "COMMIT")
	got := map[string]PublishResult{}
	for range 4 {
		r := <-results
		key := "held"
		switch {
		case r.Err != nil:
			key = "bad"
		case len(r.IDs) == 1 && r.IDs[0] == 1:
			key = "one of the goods"
			if _, ok := got[key]; ok {
				key = "other good"
			}
		}
		got[key] = r
	}
	assert.NoError(t, got["held"].Err)
	assert.Contains(t, got, "one of the goods")
	assert.Contains(t, got, "other good")
	// PostgreSQL refused it (22021); alone, it gets the error Go's check gives.
	assert.ErrorIs(t, got["bad"].Err, ErrDataNotText)
	assert.Equal(t, "g/1:good 1 g/2:good 2 held:x held:waits", pgtest.QueryValue(t, dsn,
		"SELECT string_agg(stream || ':' || data, ' ' ORDER BY stream, id) FROM pgsse.events"))
	groups.mu.Lock()
	defer groups.mu.Unlock()
	sawGroup := false
	for _, g := range groups.groups {
		sawGroup = sawGroup || (g.Requests == 3 && g.Err != nil)
	}
	assert.True(t, sawGroup, "the three queued requests were tried as one group first: %+v", groups.groups)
}

// pgsse.max_event_bytes as the publishing session sees it: Go refuses exactly what SQL
// refuses, with the same message, and follows ALTER DATABASE … SET.
func TestPublisherMaxEventBytes(t *testing.T) {
	dsn := migrated(t)
	db := pgtest.QueryValue(t, dsn, "SELECT current_database()")
	pgtest.Exec(t, dsn, "ALTER DATABASE "+db+" SET pgsse.max_event_bytes = 1000")
	c := connect(t, dsn)
	p := newTestPublisher(t, PublisherConfig{DatabaseURL: dsn, SettingRefresh: 50 * time.Millisecond}, testHooks{})
	require.Eventually(t, func() bool { m, _ := p.MaxEventBytes(); return m == 1000 }, 10*time.Second, 10*time.Millisecond)

	r := publishSync(t, p, one("mb", strings.Repeat("v", 1000)))
	require.NoError(t, r.Err, "exactly the limit")
	r = publishSync(t, p, one("mb", strings.Repeat("v", 1001)))
	require.ErrorIs(t, r.Err, ErrEventTooLarge)
	_, sqlErr := c.Exec(context.Background(), "SELECT pgsse.publish('mb', repeat('v', 1001))").ReadAll()
	var pgErr *pgconn.PgError
	require.ErrorAs(t, sqlErr, &pgErr)
	assert.Equal(t, `field "data": `+pgErr.Message, r.Err.Error())
	execSQL(t, c, "SELECT pgsse.publish('mb', repeat('v', 1000))")

	pgtest.Exec(t, dsn, "ALTER DATABASE "+db+" SET pgsse.max_event_bytes = 2000")
	require.Eventually(t, func() bool { m, _ := p.MaxEventBytes(); return m == 2000 }, 10*time.Second, 10*time.Millisecond,
		"a new session sees the new value, so the publisher renews its connection")
	require.NoError(t, publishSync(t, p, one("mb", strings.Repeat("v", 2000))).Err)
	require.ErrorIs(t, publishSync(t, p, one("mb", strings.Repeat("v", 2001))).Err, ErrEventTooLarge)

	pgtest.Exec(t, dsn, "ALTER DATABASE "+db+" SET pgsse.max_event_bytes = 'lots'")
	require.Eventually(t, func() bool { _, err := p.MaxEventBytes(); return err != nil }, 10*time.Second, 10*time.Millisecond)
	err := p.Submit(one("mb", "x"), func(PublishResult) {})
	assert.ErrorContains(t, err, `pgsse.max_event_bytes must be a whole number of bytes, not "lots"`)
	assert.Equal(t, "3", pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.events"))
}

// The connection is lost after COMMIT was sent: the publisher learns from txid_status
// whether it committed, and answers accordingly (issue 13: nothing half-published, no
// success for what was not published).
func TestPublisherCommitLost(t *testing.T) {
	dsn := migrated(t)
	killer := connect(t, dsn)
	var stage atomic.Value // which loss to simulate next: "after-commit", "before-commit" or ""
	hook := func(at string, xid int64, conn *pgconn.PgConn) {
		switch {
		case at == "commit" && stage.Load() == "after-commit":
			stage.Store("")
			// Wait until the commit has happened, then cut the connection before its answer is read.
			require.Eventually(t, func() bool {
				return pgtest.QueryValue(t, dsn, "SELECT txid_status("+strconv.FormatInt(xid, 10)+")") == "committed"
			}, 10*time.Second, 5*time.Millisecond)
			_ = conn.Conn().Close()
		case at == "statement" && stage.Load() == "before-commit":
			stage.Store("")
			// The backend dies with the transaction open: it must abort.
			execSQL(t, killer, "SELECT pg_terminate_backend("+strconv.FormatUint(uint64(conn.PID()), 10)+")")
		}
	}
	var groups groupLog
	p := newTestPublisher(t, PublisherConfig{DatabaseURL: dsn, Observe: groups.observe}, testHooks{testHook: hook})

	stage.Store("after-commit")
	r := publishSync(t, p, one("cl", "committed"))
	require.NoError(t, r.Err, "txid_status said committed")
	assert.Equal(t, []int64{1}, r.IDs)

	stage.Store("before-commit")
	r = publishSync(t, p, one("cl", "retried"))
	require.NoError(t, r.Err, "aborted, then retried once on a new connection")
	assert.Equal(t, []int64{2}, r.IDs)
	assert.Equal(t, "1:committed 2:retried", pgtest.QueryValue(t, dsn, "SELECT string_agg(id || ':' || data, ' ' ORDER BY id) FROM pgsse.events"))
}

// A chain of groups (publishChain): the next group's statement is sent together with the
// previous group's COMMIT. When the connection is lost right after that write, the
// committed group is answered as committed, and the chained group — whose transaction
// never got its COMMIT — is published again on a new connection, once.
func TestPublisherChainCommitLost(t *testing.T) {
	dsn := migrated(t)
	var p *Publisher
	var step atomic.Int32
	var chained atomic.Bool
	second := make(chan PublishResult, 1)
	hook := func(at string, xid int64, conn *pgconn.PgConn) {
		switch {
		case at == "statement" && step.CompareAndSwap(0, 1):
			// The first group's statement is answered: queue a second request, so that it
			// goes out with the first group's COMMIT.
			require.NoError(t, p.Submit(one("ch", "second"), func(r PublishResult) { second <- r }))
		case at == "commit" && step.CompareAndSwap(1, 2):
			p.mu.Lock()
			chained.Store(p.queued == 0) // taken from the queue and sent with the COMMIT
			p.mu.Unlock()
			require.Eventually(t, func() bool {
				return pgtest.QueryValue(t, dsn, "SELECT txid_status("+strconv.FormatInt(xid, 10)+")") == "committed"
			}, 10*time.Second, 5*time.Millisecond)
			_ = conn.Conn().Close()
		}
	}
	var groups groupLog
	p = newTestPublisher(t, PublisherConfig{DatabaseURL: dsn, Observe: groups.observe}, testHooks{testHook: hook})
	r := publishSync(t, p, one("ch", "first"))
	require.NoError(t, r.Err, "txid_status said committed")
	assert.Equal(t, []int64{1}, r.IDs)
	select {
	case r = <-second:
	case <-time.After(30 * time.Second):
		t.Fatal("the chained request was not answered")
	}
	require.NoError(t, r.Err, "not committed, so published again on a new connection")
	assert.Equal(t, []int64{2}, r.IDs)
	assert.Equal(t, int32(2), step.Load())
	assert.True(t, chained.Load(), "the second request was chained behind the first")
	assert.Equal(t, "1:first 2:second", pgtest.QueryValue(t, dsn, "SELECT string_agg(id || ':' || data, ' ' ORDER BY id) FROM pgsse.events"))
}

// PostgreSQL stopped mid-run: callers get ErrUnavailable, nothing is half-published
// (every request is all or nothing, every acknowledged id is stored, nothing else is
// stored unless its outcome was reported unknown), and publishing resumes after restart.
func TestPublisherPostgresStopped(t *testing.T) {
	cluster := pgtest.StartCluster(t, pgtest.ClusterOptions{})
	dsn := cluster.NewDatabase(t)
	_, _, err := Migrate(context.Background(), connect(t, dsn))
	require.NoError(t, err)
	p := newTestPublisher(t, PublisherConfig{DatabaseURL: dsn}, testHooks{})

	type outcome struct {
		ids []int64
		err error
	}
	var mu sync.Mutex
	outcomes := map[string]outcome{} // request tag → outcome
	var acked, unavailable atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				tag := fmt.Sprintf("w%d.%d", w, n)
				req := &PublishRequest{Batch: true}
				for k := range 3 {
					req.Events = append(req.Events, PublishEvent{Stream: "down/" + strconv.Itoa(rng.IntN(4)), Data: []byte(tag + "." + strconv.Itoa(k))})
				}
				r := publishSync(t, p, req)
				mu.Lock()
				outcomes[tag] = outcome{r.IDs, r.Err}
				mu.Unlock()
				switch {
				case r.Err == nil:
					acked.Add(1)
				case errors.Is(r.Err, ErrUnavailable):
					unavailable.Add(1)
					time.Sleep(5 * time.Millisecond) // a client's Retry-After
				default:
					t.Errorf("request %s: unexpected error %v", tag, r.Err)
					return
				}
			}
		}()
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		require.Eventually(t, cond, 60*time.Second, 5*time.Millisecond, what)
	}
	waitFor("publishing", func() bool { return acked.Load() > 50 })
	cluster.Stop()
	waitFor("503s", func() bool { return unavailable.Load() > 20 })
	ackedWhileDown := acked.Load()
	cluster.Start()
	waitFor("publishing resumes", func() bool { return acked.Load() > ackedWhileDown+50 })
	close(stop)
	wg.Wait()

	// Compare the table with what the callers were told.
	rows := pgtest.Exec(t, dsn, "SELECT stream, id, data FROM pgsse.events ORDER BY stream, id")[0].Rows
	stored := map[string][]string{} // tag → "stream:id" of its stored events, in event order
	for _, row := range rows {
		data := string(row[2])
		tag := data[:strings.LastIndexByte(data, '.')]
		stored[tag] = append(stored[tag], string(row[0])+":"+string(row[1]))
	}
	unknown := 0
	for tag, o := range outcomes {
		switch {
		case o.err == nil:
			require.Len(t, stored[tag], 3, "acknowledged %s is stored", tag)
		case errors.Is(o.err, ErrOutcomeUnknown):
			unknown++
			assert.Contains(t, []int{0, 3}, len(stored[tag]), "%s: all or nothing", tag)
		default:
			assert.Empty(t, stored[tag], "%s failed (%v) but is stored", tag, o.err)
		}
		delete(stored, tag)
	}
	assert.Empty(t, stored, "stored events nobody submitted")
	// Each stream's ids are contiguous from 1.
	assert.Equal(t, "", pgtest.QueryValue(t, dsn, `SELECT coalesce(string_agg(stream, ','), '') FROM
		(SELECT stream FROM pgsse.events GROUP BY stream HAVING count(*) <> max(id) OR min(id) <> 1) s`))
	t.Logf("acknowledged %d, unavailable %d (outcome unknown: %d)", acked.Load(), unavailable.Load(), unknown)
}

// testLogger logs through t.Log.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tLogWriter{t}, nil))
}

type tLogWriter struct{ t testing.TB }

func (w tLogWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// Issue 20: each result says when its request was queued, when its transaction went to
// PostgreSQL and when the COMMIT was answered (pgsse_publish_stage_seconds), in that
// order; the requests of one transaction share the two transaction moments.
func TestPublisherResultTimes(t *testing.T) {
	dsn := migrated(t)
	held, release := make(chan struct{}), make(chan struct{})
	var first sync.Once
	hook := func(stage string, _ int64, _ *pgconn.PgConn) {
		if stage == "statement" {
			first.Do(func() { close(held); <-release })
		}
	}
	p := newTestPublisher(t, PublisherConfig{DatabaseURL: dsn}, testHooks{testHook: hook})
	results := make(chan PublishResult, 4)
	submit := func(data string) {
		require.NoError(t, p.Submit(one("times/a", data), func(r PublishResult) { results <- r }))
	}
	before := time.Now()
	submit("0")
	<-held // the first transaction's statement has run; its COMMIT waits for release
	for i := 1; i <= 3; i++ {
		submit(strconv.Itoa(i))
	}
	require.Eventually(t, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.queued == 3
	}, 10*time.Second, time.Millisecond)
	released := time.Now()
	close(release)

	var got []PublishResult
	for range 4 {
		select {
		case r := <-results:
			require.NoError(t, r.Err)
			got = append(got, r)
		case <-time.After(30 * time.Second):
			t.Fatal("no result within 30 s")
		}
	}
	for i, r := range got {
		tm := r.Times
		require.False(t, tm.Queued.IsZero() || tm.Sent.IsZero() || tm.Committed.IsZero(), "result %d: %+v", i, tm)
		assert.False(t, tm.Queued.Before(before), "result %d", i)
		assert.False(t, tm.Sent.Before(tm.Queued), "result %d: sent before queued", i)
		assert.True(t, tm.Committed.After(tm.Sent), "result %d: committed after sent", i)
		assert.True(t, tm.Committed.After(released), "result %d: the COMMIT was answered after the hold", i)
	}
	assert.Equal(t, []int64{1}, got[0].IDs)
	assert.True(t, got[0].Times.Sent.Before(released), "the first transaction went out before the hold")
	for _, r := range got[2:] {
		assert.Equal(t, got[1].Times.Sent, r.Times.Sent, "one transaction: one Sent")
		assert.Equal(t, got[1].Times.Committed, r.Times.Committed, "one transaction: one Committed")
	}
	assert.True(t, got[1].Times.Sent.After(released), "the second transaction went out after the first statement was answered")
}

// TestPublisherIdleWorkerRunsAtSubmit: a request submitted to an idle publisher has its
// transaction sent before Submit returns — Submit yields to the worker it woke, which then
// runs on the caller's thread instead of waiting for another one to be woken (issue 20, the
// sent stage: ≈ 60 µs on the 2-core VM). A caller that keeps running after Submit (the loop)
// would otherwise see Times.Sent after its return in nearly every request.
func TestPublisherIdleWorkerRunsAtSubmit(t *testing.T) {
	dsn := migrated(t)
	p := newTestPublisher(t, PublisherConfig{DatabaseURL: dsn}, testHooks{})
	require.NoError(t, publishSync(t, p, one("idle/a", "warm")).Err) // connected
	const n = 50
	early := 0
	for i := range n {
		// Wait for the worker to park again after the previous answer.
		deadline := time.Now().Add(10 * time.Second)
		for !p.shards[0].waiting.Load() {
			require.True(t, time.Now().Before(deadline), "the worker did not go back to waiting")
			runtime.Gosched()
		}
		res := make(chan PublishResult, 1)
		require.NoError(t, p.Submit(one("idle/a", strconv.Itoa(i)), func(r PublishResult) { res <- r }))
		returned := time.Now()
		r := <-res
		require.NoError(t, r.Err)
		if r.Times.Sent.Before(returned) {
			early++
		}
	}
	// Without the yield 0 of 50 were; with it 39–50 (CI, with -race and the other packages'
	// tests beside it, saw 39): a quarter leaves the scheduler its margin and still fails on 0.
	assert.GreaterOrEqual(t, early, n/4, "of %d requests to an idle publisher, %d were sent before Submit returned", n, early)
}
