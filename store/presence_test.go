package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os/exec"
	"slices"
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
)

// countingConn counts the statements a client sends: each simple Query ('Q') and each
// Execute ('E') of the extended protocol, read from the bytes on the wire.
type countingConn struct {
	net.Conn
	statements *atomic.Int64
	started    bool // the startup message (no type byte) was passed
	hdr        []byte
	skip       int // bytes of the current message's body still to pass
}

func (c *countingConn) Write(b []byte) (int, error) {
	for rest := b; len(rest) > 0; {
		if c.skip > 0 {
			n := min(c.skip, len(rest))
			c.skip -= n
			rest = rest[n:]
			continue
		}
		need := 5
		if !c.started {
			need = 4
		}
		n := min(need-len(c.hdr), len(rest))
		c.hdr = append(c.hdr, rest[:n]...)
		rest = rest[n:]
		if len(c.hdr) < need {
			continue
		}
		if !c.started {
			c.started = true
			c.skip = int(binary.BigEndian.Uint32(c.hdr)) - 4
		} else {
			if c.hdr[0] == 'Q' || c.hdr[0] == 'E' {
				c.statements.Add(1)
			}
			c.skip = int(binary.BigEndian.Uint32(c.hdr[1:])) - 4
		}
		c.hdr = c.hdr[:0]
	}
	return c.Conn.Write(b)
}

// countedConnect opens a connection whose statements are counted in n.
func countedConnect(t testing.TB, dsn string, n *atomic.Int64) *pgconn.PgConn {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.TLSConfig = nil
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: c, statements: n}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgconn.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// presenceListener collects the P notifications on channel pgsse and assembles their parts.
type presenceListener struct {
	t       testing.TB
	conn    *pgconn.PgConn
	mu      sync.Mutex
	changes []PresenceChange // complete changes, in arrival order
	partial map[string]*PresenceChange
	parts   map[string]int
	wakes   []string // streams whose change came as part 0 of 0
	bad     []string
	synced  string
}

func listenPresence(t testing.TB, dsn string) *presenceListener {
	t.Helper()
	l := &presenceListener{t: t, partial: map[string]*PresenceChange{}, parts: map[string]int{}}
	cfg, err := pgconn.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) {
		if n.Channel == syncChannel {
			l.mu.Lock()
			l.synced = n.Payload
			l.mu.Unlock()
			return
		}
		l.add(n.Payload)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l.conn, err = pgconn.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.conn.Close(context.Background()) })
	_, err = l.conn.Exec(ctx, "LISTEN "+Channel+"; LISTEN "+syncChannel).ReadAll()
	require.NoError(t, err)
	return l
}

func (l *presenceListener) add(raw string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var p Payload
	if err := ParsePayload([]byte(raw), &p); err != nil || p.Kind != KindPresence {
		l.bad = append(l.bad, fmt.Sprintf("%v: %q", err, raw))
		return
	}
	stream := string(p.Stream)
	if p.Parts == 0 {
		l.wakes = append(l.wakes, stream)
		l.changes = append(l.changes, PresenceChange{Stream: stream, Seq: p.ID, Prev: p.Prev, Anonymous: p.Anonymous})
		return
	}
	c := l.partial[stream]
	if p.Part == 1 {
		c = &PresenceChange{Stream: stream, Seq: p.ID, Prev: p.Prev, Anonymous: p.Anonymous}
		l.partial[stream] = c
		l.parts[stream] = 0
	}
	if c == nil || c.Seq != p.ID || l.parts[stream] != p.Part-1 {
		l.bad = append(l.bad, fmt.Sprintf("part out of order: %q", raw))
		return
	}
	l.parts[stream] = p.Part
	p.Joins(func(s []byte) bool { c.Joins = append(c.Joins, string(s)); return true })
	p.Leaves(func(s []byte) bool { c.Leaves = append(c.Leaves, string(s)); return true })
	if p.Part == p.Parts {
		l.changes = append(l.changes, *c)
		delete(l.partial, stream)
	}
}

// sync waits until every notification committed so far has arrived (it sends one of its
// own on another channel and reads until that one comes) and returns the complete changes
// since the last sync.
func (l *presenceListener) sync(dsn string) []PresenceChange {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	token := strconv.FormatInt(time.Now().UnixNano(), 10)
	pgtest.Exec(l.t, dsn, "NOTIFY "+syncChannel+", '"+token+"'")
	for {
		l.mu.Lock()
		got := l.synced == token
		l.mu.Unlock()
		if got {
			break
		}
		require.NoError(l.t, l.conn.WaitForNotification(ctx))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	require.Empty(l.t, l.bad, "bad presence payloads")
	out := l.changes
	l.changes = nil
	return out
}

const syncChannel = "pgsse_test_sync"

// newPresence returns a writer whose lease outlasts the test: tests of lapsing leases
// make their own, the others must not depend on the pace of a loaded machine.
func newPresence(t testing.TB, key string) *Presence {
	t.Helper()
	p, err := NewPresence(PresenceConfig{Key: key, Interval: time.Second, Lease: time.Hour})
	require.NoError(t, err)
	return p
}

func flush(t testing.TB, p *Presence, c *pgconn.PgConn, changes ...PresenceCount) PresenceFlush {
	t.Helper()
	res, err := p.Flush(context.Background(), c, changes)
	require.NoError(t, err)
	return res
}

// sqlPresence is pgsse.presence(stream) as "sub:connections,…" ("" when empty).
func sqlPresence(t testing.TB, dsn, stream string) string {
	t.Helper()
	return pgtest.QueryValue(t, dsn, "SELECT coalesce(string_agg(sub || ':' || connections, ',' ORDER BY sub COLLATE \"C\"), '') FROM pgsse.presence('"+stream+"')")
}

// joinsAndLeaves counts, over changes, how often sub joined and left stream.
func joinsAndLeaves(changes []PresenceChange, stream, sub string) (joins, leaves int) {
	for _, c := range changes {
		if c.Stream != stream {
			continue
		}
		joins += countOf(c.Joins, sub)
		leaves += countOf(c.Leaves, sub)
	}
	return joins, leaves
}

func countOf(list []string, s string) (n int) {
	for _, x := range list {
		if x == s {
			n++
		}
	}
	return n
}

// A subject connected to process A, then to B, then leaving A is present throughout and
// joins once; it leaves once, when its last connection (on B) closes. The NOTIFYs say
// exactly what the Flush results say, and each change follows the one before it.
func TestPresenceJoinOnceAcrossProcesses(t *testing.T) {
	dsn := migrated(t)
	l := listenPresence(t, dsn)
	a, b := newPresence(t, "host-a :8080 #0"), newPresence(t, "host-b :8080 #0")
	ca, cb := connect(t, dsn), connect(t, dsn)
	var flushed []PresenceChange
	step := func(p *Presence, c *pgconn.PgConn, n int, want string) {
		t.Helper()
		res := flush(t, p, c, PresenceCount{"doc/1", "user:7", n})
		require.Equal(t, 1, res.Statements)
		flushed = append(flushed, res.Changes...)
		assert.Equal(t, want, sqlPresence(t, dsn, "doc/1"))
	}
	step(a, ca, 1, "user:7:1")
	step(b, cb, 1, "user:7:2")
	step(a, ca, 0, "user:7:1")
	step(b, cb, 0, "")

	notified := l.sync(dsn)
	assert.Equal(t, flushed, notified)
	j, lv := joinsAndLeaves(notified, "doc/1", "user:7")
	assert.Equal(t, [2]int{1, 1}, [2]int{j, lv}, "one join and one leave in all: %+v", notified)
	require.Len(t, notified, 2)
	assert.Equal(t, []string{"user:7"}, notified[0].Joins)
	assert.Equal(t, []string{"user:7"}, notified[1].Leaves)
	assert.Zero(t, notified[0].Prev)
	assert.Equal(t, notified[0].Seq, notified[1].Prev, "the leave follows the join")
	assert.Greater(t, notified[1].Seq, notified[1].Prev)
	// Nobody is on the stream: its row is gone and its number reads 0.
	seqs, err := ReadPresenceSeqs(context.Background(), ca, []string{"doc/1"})
	require.NoError(t, err)
	assert.Equal(t, []int64{0}, seqs)
	assert.Equal(t, "0", pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.presence_entries"))
}

// Two processes flip the same subject in and out concurrently, many times: the changes
// of the stream form one chain (each one's prev is the one before), joins and leaves
// alternate, and the last one agrees with what is in the table.
func TestPresenceConcurrentWritersChain(t *testing.T) {
	dsn := migrated(t)
	l := listenPresence(t, dsn)
	const rounds = 40
	var wg sync.WaitGroup
	for w := 0; w < 2; w++ {
		p := newPresence(t, "host-"+strconv.Itoa(w)+" :8080 #0")
		c := connect(t, dsn)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < rounds; i++ {
				for _, n := range []int{1, 0} {
					if _, err := p.Flush(context.Background(), c, []PresenceCount{{"race", "x", n}, {"race", "", n}}); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	changes := l.sync(dsn)
	require.NotEmpty(t, changes)
	present, anon := false, int64(0)
	prev := int64(0)
	for i, c := range changes {
		// Each change follows the one before; after one that left nobody on the stream
		// (its row is gone), the next one has prev 0.
		if !(c.Prev == prev || c.Prev == 0 && !present && anon == 0) {
			require.Failf(t, "broken chain", "change %d (prev %d) does not follow change %d (seq %d)", i, c.Prev, i-1, prev)
		}
		require.Greater(t, c.Seq, c.Prev)
		prev = c.Seq
		if len(c.Joins) > 0 {
			require.False(t, present, "change %d: a join of a present subject", i)
			present = true
		}
		if len(c.Leaves) > 0 {
			require.True(t, present, "change %d: a leave of an absent subject", i)
			present = false
		}
		require.NotEqual(t, anon, c.Anonymous, "change %d changes something", i)
		anon = c.Anonymous
	}
	assert.False(t, present)
	assert.Zero(t, anon)
	assert.Equal(t, "", sqlPresence(t, dsn, "race"))
}

// A writer that stops renewing: pgsse.presence leaves its entries out once its lease
// lapses (2 intervals after its last renewal), and the other writer's next flush removes
// them and reports its subjects as leaves, except the ones the other writer still holds.
func TestPresenceReapsLapsedProcess(t *testing.T) {
	dsn := migrated(t)
	l := listenPresence(t, dsn)
	const interval = 200 * time.Millisecond
	// a renews rarely in this test, so its lease is long; b has the default, 2 intervals.
	a, err := NewPresence(PresenceConfig{Key: "host-a :8080 #0", Interval: interval, Lease: time.Hour})
	require.NoError(t, err)
	b, err := NewPresence(PresenceConfig{Key: "host-b :8080 #0", Interval: interval})
	require.NoError(t, err)
	ca, cb := connect(t, dsn), connect(t, dsn)
	flush(t, a, ca, PresenceCount{"room", "shared", 1})
	// b's last flush: b "dies" here. Taken before the flush: its lease runs from the flush
	// statement's clock_timestamp(), which is after this and before flush returns (taken
	// after it, the wait measured 399.4 ms of a 400 ms lease once under the CI's load).
	lastRenewal := time.Now()
	flush(t, b, cb, PresenceCount{"room", "shared", 1}, PresenceCount{"room", "only-b", 2},
		PresenceCount{"room", "", 3}, PresenceCount{"other", "only-b", 1})
	require.Equal(t, "only-b:2,shared:2", sqlPresence(t, dsn, "room"))
	l.sync(dsn)

	// Until a survivor flushes, b's entries are in the table but, once its lease has
	// lapsed by PostgreSQL's clock, not in pgsse.presence.
	for pgtest.QueryValue(t, dsn, "SELECT bool_or(expires_at < clock_timestamp()) FROM pgsse.presence_processes WHERE process = 'host-b :8080 #0'") != "t" {
		time.Sleep(interval / 10)
	}
	assert.GreaterOrEqual(t, time.Since(lastRenewal), PresenceLeaseIntervals*interval, "the lease lasts 2 intervals")
	assert.Equal(t, "shared:1", sqlPresence(t, dsn, "room"), "a lapsed lease does not count in SQL")
	snap, err := ReadPresence(context.Background(), ca, "room", NoLimit)
	require.NoError(t, err)
	assert.Equal(t, int64(2), snap.Total, "until it is removed, the entries are there for the notifications' consumers")

	reaped := flush(t, a, ca)
	require.Len(t, reaped.Reaped, 1)
	assert.Equal(t, "host-b :8080 #0", reaped.Reaped[0].Key)
	assert.Equal(t, b.Incarnation(), reaped.Reaped[0].Incarnation)
	assert.EqualValues(t, 4, reaped.Reaped[0].Entries)
	require.Len(t, reaped.Changes, 2)
	assert.Equal(t, PresenceChange{Stream: "other", Seq: reaped.Changes[0].Seq, Prev: reaped.Changes[0].Prev, Leaves: []string{"only-b"}}, reaped.Changes[0])
	assert.Equal(t, "room", reaped.Changes[1].Stream)
	assert.Equal(t, []string{"only-b"}, reaped.Changes[1].Leaves, "shared is still on a")
	assert.Empty(t, reaped.Changes[1].Joins)
	assert.Zero(t, reaped.Changes[1].Anonymous)
	assert.Equal(t, reaped.Changes, l.sync(dsn), "the NOTIFYs say the same")
	assert.Equal(t, "shared:1", sqlPresence(t, dsn, "room"))
	assert.Equal(t, "1", pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.presence_entries"))

	// b comes back (it was only slow): its lease is gone, so it writes everything again
	// under a new incarnation, in the same Flush.
	old := b.Incarnation()
	var n atomic.Int64
	back, err := b.Flush(context.Background(), countedConnect(t, dsn, &n), nil)
	require.NoError(t, err)
	assert.True(t, back.LeaseLost)
	assert.True(t, back.Registered)
	assert.Equal(t, 2, back.Statements)
	assert.EqualValues(t, 2, n.Load(), "statements on the wire")
	assert.NotEqual(t, old, b.Incarnation())
	assert.Equal(t, "only-b:2,shared:2", sqlPresence(t, dsn, "room"))
	changes := l.sync(dsn)
	j, _ := joinsAndLeaves(changes, "room", "only-b")
	assert.Equal(t, 1, j)
	j, _ = joinsAndLeaves(changes, "room", "shared")
	assert.Equal(t, 0, j, "shared never left")
}

// A survivor flushing once per interval removes a process that stopped renewing, and
// announces its leaves, by its third flush after that process's last renewal: the lease
// lasts 2 intervals, and the survivor's next flush after that comes within one more.
func TestPresenceReapedWithinThreeIntervals(t *testing.T) {
	dsn := migrated(t)
	l := listenPresence(t, dsn)
	const interval = 300 * time.Millisecond
	a, err := NewPresence(PresenceConfig{Key: "survivor :1 #0", Interval: interval, Lease: time.Hour})
	require.NoError(t, err)
	b, err := NewPresence(PresenceConfig{Key: "victim :1 #0", Interval: interval})
	require.NoError(t, err)
	ca, cb := connect(t, dsn), connect(t, dsn)
	flush(t, a, ca)
	flush(t, b, cb, PresenceCount{"room", "gone", 1})
	lastRenewal := time.Now()
	for i := 1; ; i++ {
		time.Sleep(time.Until(lastRenewal.Add(time.Duration(i) * interval)))
		res := flush(t, a, ca)
		if len(res.Reaped) == 0 {
			require.Less(t, i, 3, "not reaped by the survivor's 3rd flush after the last renewal")
			continue
		}
		t.Logf("reaped by flush %d, %v after the last renewal", i, time.Since(lastRenewal))
		require.Len(t, res.Changes, 1)
		assert.Equal(t, []string{"gone"}, res.Changes[0].Leaves)
		break
	}
	changes := l.sync(dsn)
	j, lv := joinsAndLeaves(changes, "room", "gone")
	assert.Equal(t, [2]int{1, 1}, [2]int{j, lv})
}

// A process that restarts (same key, new writer) clears what the old one held at once, in
// its first flush, announcing only what really changed; the old writer, should it still
// run, finds itself superseded and stops writing.
func TestPresenceRestartClearsOldEntries(t *testing.T) {
	dsn := migrated(t)
	l := listenPresence(t, dsn)
	c := connect(t, dsn)
	const key = "host-a :8080 #1"
	old := newPresence(t, key)
	flush(t, old, c, PresenceCount{"s", "x", 1}, PresenceCount{"s", "y", 1}, PresenceCount{"t", "x", 1})
	l.sync(dsn)

	restarted := newPresence(t, key)
	res := flush(t, restarted, c, PresenceCount{"s", "y", 2}, PresenceCount{"s", "z", 1})
	assert.True(t, res.Registered)
	assert.Equal(t, 1, res.Statements)
	require.Len(t, res.Replaced, 1)
	assert.Equal(t, PresenceProcess{Key: key, Incarnation: old.Incarnation(), Entries: 3}, res.Replaced[0])
	require.Len(t, res.Changes, 2)
	assert.Equal(t, []string{"z"}, res.Changes[0].Joins)
	assert.Equal(t, []string{"x"}, res.Changes[0].Leaves)
	assert.Equal(t, "t", res.Changes[1].Stream)
	assert.Equal(t, []string{"x"}, res.Changes[1].Leaves)
	assert.Equal(t, res.Changes, l.sync(dsn))
	assert.Equal(t, "y:2,z:1", sqlPresence(t, dsn, "s"))
	assert.Equal(t, "", sqlPresence(t, dsn, "t"))
	assert.Equal(t, "0", pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.presence_entries WHERE incarnation = "+strconv.FormatInt(old.Incarnation(), 10)))

	var n atomic.Int64
	oc := countedConnect(t, dsn, &n)
	_, err := old.Flush(context.Background(), oc, []PresenceCount{{"s", "x", 0}})
	require.ErrorIs(t, err, ErrPresenceSuperseded)
	assert.EqualValues(t, 1, n.Load())
	_, err = old.Flush(context.Background(), oc, []PresenceCount{{"s", "x", 1}})
	require.ErrorIs(t, err, ErrPresenceSuperseded)
	assert.EqualValues(t, 1, n.Load(), "a superseded writer sends nothing")
	assert.Equal(t, "y:2,z:1", sqlPresence(t, dsn, "s"))
	l.sync(dsn)
}

// Anonymous connections are counted, never listed, and a change of their count alone
// is a change (with no joins or leaves).
func TestPresenceAnonymous(t *testing.T) {
	dsn := migrated(t)
	l := listenPresence(t, dsn)
	a, b := newPresence(t, "a :1 #0"), newPresence(t, "b :1 #0")
	ca, cb := connect(t, dsn), connect(t, dsn)
	flush(t, a, ca, PresenceCount{"pub", "", 5})
	flush(t, b, cb, PresenceCount{"pub", "", 2}, PresenceCount{"pub", "user:1", 1})
	flush(t, a, ca, PresenceCount{"pub", "", 4})
	flush(t, a, ca, PresenceCount{"pub", "", 4}) // no change: nothing sent
	changes := l.sync(dsn)
	require.Len(t, changes, 3)
	for i, want := range []int64{5, 7, 6} {
		assert.Equal(t, want, changes[i].Anonymous, "change %d", i)
	}
	assert.Empty(t, changes[0].Joins)
	assert.Equal(t, []string{"user:1"}, changes[1].Joins)
	assert.Empty(t, changes[2].Joins)

	assert.Equal(t, "user:1:1", sqlPresence(t, dsn, "pub"), "anonymous connections are not listed in SQL")
	snap, err := ReadPresence(context.Background(), ca, "pub", NoLimit)
	require.NoError(t, err)
	assert.Equal(t, PresenceSnapshot{Stream: "pub", Seq: changes[2].Seq, Connections: 7, Anonymous: 6,
		Subjects: []PresenceSubject{{"user:1", 1}}, Total: 1}, snap)
}

// GET /presence's read: subjects sorted bytewise, at most the limit, Truncated beyond it.
func TestReadPresenceLimit(t *testing.T) {
	dsn := migrated(t)
	c := connect(t, dsn)
	p := newPresence(t, "a :1 #0")
	var changes []PresenceCount
	for _, sub := range []string{"b", "a", "B", "é", "a b", `q"\`, "user:10", "user:9"} {
		changes = append(changes, PresenceCount{"s", sub, 1})
	}
	changes = append(changes, PresenceCount{"s", "", 3})
	flush(t, p, c, changes...)
	all, err := ReadPresence(context.Background(), c, "s", NoLimit)
	require.NoError(t, err)
	var got []string
	for _, s := range all.Subjects {
		got = append(got, s.Sub)
	}
	assert.Equal(t, []string{"B", "a", "a b", "b", `q"\`, "user:10", "user:9", "é"}, got)
	assert.False(t, all.Truncated)
	assert.EqualValues(t, 11, all.Connections)

	three, err := ReadPresence(context.Background(), c, "s", 3)
	require.NoError(t, err)
	assert.Equal(t, all.Subjects[:3], three.Subjects)
	assert.True(t, three.Truncated)
	assert.EqualValues(t, 8, three.Total)
	assert.Equal(t, all.Seq, three.Seq)

	none, err := ReadPresence(context.Background(), c, "s", 0)
	require.NoError(t, err)
	assert.Empty(t, none.Subjects)
	assert.True(t, none.Truncated)

	empty, err := ReadPresence(context.Background(), c, "nobody/here", 10)
	require.NoError(t, err)
	assert.Equal(t, PresenceSnapshot{Stream: "nobody/here", Subjects: []PresenceSubject{}}, empty)
	_, err = ReadPresence(context.Background(), c, "bad name", 10)
	assert.Error(t, err)
	assert.Equal(t, "", sqlPresence(t, dsn, "nobody/here"))
}

// 10,000 joins in one interval are one statement on the wire (10,000 leaves too), and
// the whole state written again after PostgreSQL lost it is two.
func TestPresenceStatementsPerFlush(t *testing.T) {
	dsn := migrated(t)
	l := listenPresence(t, dsn)
	var n atomic.Int64
	c := countedConnect(t, dsn, &n)
	p := newPresence(t, "a :1 #0")
	counts := func(c int) []PresenceCount {
		out := make([]PresenceCount, 10000)
		for i := range out {
			out[i] = PresenceCount{"big", "user:" + strconv.Itoa(i), c}
		}
		return out
	}
	res, err := p.Flush(context.Background(), c, counts(1))
	require.NoError(t, err)
	assert.Equal(t, 1, res.Statements)
	assert.EqualValues(t, 1, n.Load())
	require.Len(t, res.Changes, 1)
	assert.Len(t, res.Changes[0].Joins, 10000)
	got := l.sync(dsn)
	require.Len(t, got, 1)
	assert.Equal(t, res.Changes, got, "the notification parts add up to the change")
	assert.Equal(t, "10000", pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.presence('big')"))

	// PostgreSQL loses the unlogged rows (as after a crash): the next flush finds its lease
	// gone and writes its 10,000 entries again.
	pgtest.Exec(t, dsn, "TRUNCATE pgsse.presence_processes, pgsse.presence_entries, pgsse.presence_streams")
	res, err = p.Flush(context.Background(), c, nil)
	require.NoError(t, err)
	assert.True(t, res.LeaseLost)
	assert.Equal(t, 2, res.Statements)
	assert.EqualValues(t, 3, n.Load())
	require.Len(t, res.Changes, 1)
	assert.Len(t, res.Changes[0].Joins, 10000)
	assert.Zero(t, res.Changes[0].Prev)
	assert.Equal(t, "10000", pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.presence('big')"))

	res, err = p.Flush(context.Background(), c, counts(0))
	require.NoError(t, err)
	assert.Equal(t, 1, res.Statements)
	assert.EqualValues(t, 4, n.Load())
	assert.Len(t, res.Changes[0].Leaves, 10000)
	assert.Equal(t, "0", pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.presence_entries"))
	l.sync(dsn)
}

// 100 streams × 1,000 subjects held over repeated flushes: the rows stay the same rows
// (nothing rewritten: the same ctids), the table does not grow, nothing is notified, and
// each flush is one statement.
func TestPresenceManyStreamsStable(t *testing.T) {
	dsn := migrated(t)
	l := listenPresence(t, dsn)
	var n atomic.Int64
	c := countedConnect(t, dsn, &n)
	p := newPresence(t, "a :1 #0")
	var all []PresenceCount
	for s := 0; s < 100; s++ {
		for u := 0; u < 1000; u++ {
			all = append(all, PresenceCount{"doc/" + strconv.Itoa(s), "user:" + strconv.Itoa(u), 1 + u%3})
		}
	}
	res, err := p.Flush(context.Background(), c, all)
	require.NoError(t, err)
	require.Len(t, res.Changes, 100)
	assert.Len(t, l.sync(dsn), 100)
	const fingerprint = "SELECT count(*) || ' ' || md5(string_agg(ctid::text, ',' ORDER BY ctid)) FROM pgsse.presence_entries"
	rows := pgtest.QueryValue(t, dsn, fingerprint)
	assert.True(t, strings.HasPrefix(rows, "100000 "), rows)
	size := pgtest.QueryValue(t, dsn, "SELECT pg_total_relation_size('pgsse.presence_entries')")
	before := n.Load()
	for i := 0; i < 20; i++ {
		res, err := p.Flush(context.Background(), c, nil)
		require.NoError(t, err)
		assert.Equal(t, 1, res.Statements)
		assert.Empty(t, res.Changes)
	}
	assert.EqualValues(t, 20, n.Load()-before, "one statement per flush")
	assert.Equal(t, rows, pgtest.QueryValue(t, dsn, fingerprint), "the same rows, not rewritten")
	assert.Equal(t, size, pgtest.QueryValue(t, dsn, "SELECT pg_total_relation_size('pgsse.presence_entries')"))
	assert.Equal(t, "1", pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.presence_processes"))
	assert.Equal(t, "100", pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.presence_streams"))
	assert.Empty(t, l.sync(dsn), "nothing changed, nothing notified")

	// A count that moves between positive values is written but announces nothing.
	res, err = p.Flush(context.Background(), c, []PresenceCount{{"doc/5", "user:5", 9}})
	require.NoError(t, err)
	assert.Empty(t, res.Changes)
	assert.Equal(t, "user:5:9", pgtest.QueryValue(t, dsn, "SELECT sub || ':' || connections FROM pgsse.presence('doc/5') WHERE sub = 'user:5'"))
	assert.Empty(t, l.sync(dsn))
}

// A change too long for one notification is split into parts of at most 7999 bytes,
// in order; one that would need more than 64 parts is sent as part 0 of 0 (re-read).
func TestPresenceNotifyParts(t *testing.T) {
	dsn := migrated(t)
	c := connect(t, dsn)
	raw := listen(t, dsn)
	p := newPresence(t, "a :1 #0")
	stream := strings.Repeat("s", 200)
	var joins []PresenceCount
	for i := 0; i < 300; i++ {
		joins = append(joins, PresenceCount{stream, fmt.Sprintf("%03d", i) + strings.Repeat("€", 65), 1}) // 198 bytes
	}
	res := flush(t, p, c, joins...)
	require.Len(t, res.Changes, 1)
	var got []string
	parts := 0
	for {
		payload := raw.next(t)
		require.LessOrEqual(t, len(payload), MaxPayload)
		var pl Payload
		require.NoError(t, ParsePayload([]byte(payload), &pl))
		parts++
		assert.Equal(t, parts, pl.Part)
		assert.Equal(t, res.Changes[0].Seq, pl.ID)
		pl.Joins(func(s []byte) bool { got = append(got, string(s)); return true })
		if pl.Part == pl.Parts {
			break
		}
	}
	assert.Greater(t, parts, 7, "300 × 203 bytes need 8 parts or more")
	assert.Equal(t, res.Changes[0].Joins, got)
	assert.True(t, slices.IsSorted(got))

	// 3,000 subjects of 200 bytes do not fit in 64 parts: one part 0 of 0.
	var many []PresenceCount
	for i := 0; i < 3000; i++ {
		many = append(many, PresenceCount{"wide", fmt.Sprintf("%04d", i) + strings.Repeat("x", 196), 1})
	}
	res = flush(t, p, c, many...)
	require.Len(t, res.Changes, 1)
	assert.Len(t, res.Changes[0].Joins, 3000, "Flush's result still lists them")
	var pl Payload
	payload := raw.next(t)
	require.NoError(t, ParsePayload([]byte(payload), &pl))
	assert.Equal(t, [4]int{0, 0, 0, 0}, [4]int{pl.Part, pl.Parts, pl.NJoin, pl.NLeave}, "%q", payload)
	assert.Equal(t, res.Changes[0].Seq, pl.ID)
	raw.expectQuiet(t, c)
}

// Retire removes everything of the process at once, announcing the leaves.
func TestPresenceRetire(t *testing.T) {
	dsn := migrated(t)
	l := listenPresence(t, dsn)
	c := connect(t, dsn)
	a, b := newPresence(t, "a :1 #0"), newPresence(t, "b :1 #0")
	flush(t, a, c, PresenceCount{"s", "x", 1}, PresenceCount{"s", "y", 1})
	flush(t, b, c, PresenceCount{"s", "y", 1})
	l.sync(dsn)
	res, err := a.Retire(context.Background(), c)
	require.NoError(t, err)
	require.Len(t, res.Changes, 1)
	assert.Equal(t, []string{"x"}, res.Changes[0].Leaves)
	assert.Equal(t, res.Changes, l.sync(dsn))
	assert.Equal(t, "y:1", sqlPresence(t, dsn, "s"))
	procs, err := ReadPresenceProcesses(context.Background(), c)
	require.NoError(t, err)
	require.Len(t, procs, 1)
	assert.Equal(t, "b :1 #0", procs[0].Key)
	_, err = a.Flush(context.Background(), c, nil)
	assert.ErrorIs(t, err, ErrPresenceRetired)
}

// What `pgsse doctor` lists: every process holding a lease, its age and entries.
func TestReadPresenceProcesses(t *testing.T) {
	dsn := migrated(t)
	c := connect(t, dsn)
	a, err := NewPresence(PresenceConfig{Key: "a :1 #0", Interval: time.Second})
	require.NoError(t, err)
	flush(t, a, c, PresenceCount{"s", "x", 1}, PresenceCount{"s", "", 2}, PresenceCount{"t", "x", 1})
	procs, err := ReadPresenceProcesses(context.Background(), c)
	require.NoError(t, err)
	require.Len(t, procs, 1)
	pp := procs[0]
	assert.Equal(t, "a :1 #0", pp.Key)
	assert.Equal(t, a.Incarnation(), pp.Incarnation)
	assert.Equal(t, time.Second, pp.Interval)
	assert.True(t, pp.Live)
	assert.EqualValues(t, 3, pp.Entries)
	assert.Equal(t, PresenceLeaseIntervals*time.Second, pp.Expires.Sub(pp.Renewed), "the default lease")
	assert.Less(t, pp.Age, time.Minute)
	assert.WithinDuration(t, time.Now(), pp.Started, time.Minute)
}

// Bad input is refused before anything is recorded, in Go and in SQL.
func TestPresenceRejectsBadInput(t *testing.T) {
	dsn := migrated(t)
	c := connect(t, dsn)
	p := newPresence(t, "a :1 #0")
	for _, tc := range []struct {
		name string
		in   PresenceCount
		want string
	}{
		{"bad stream", PresenceCount{"a b", "x", 1}, "stream name may contain only"},
		{"long sub", PresenceCount{"s", strings.Repeat("x", 201), 1}, "sub must be 1-200 bytes"},
		{"control character", PresenceCount{"s", "a\nb", 1}, "sub must not contain control characters"},
		{"invalid UTF-8", PresenceCount{"s", "\xff", 1}, "sub must be valid UTF-8"},
		{"negative", PresenceCount{"s", "x", -1}, "out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := p.Flush(context.Background(), c, []PresenceCount{{"s", "ok", 1}, tc.in})
			require.Error(t, err)
			assert.Contains(t, err.Error(), "changes[1]")
			assert.Contains(t, err.Error(), tc.want)
			assert.Zero(t, p.Held())
		})
	}
	for _, cfg := range []PresenceConfig{
		{Key: "", Interval: time.Second},
		{Key: "a\tb", Interval: time.Second},
		{Key: "k", Interval: 0},
		{Key: "k", Interval: time.Second, Lease: time.Millisecond},
	} {
		_, err := NewPresence(cfg)
		assert.Error(t, err, "%+v", cfg)
	}
	for _, args := range []string{
		"'', 1, 1000, 2000, 'flush', '{}', '{}', '{}'",
		"'k', 0, 1000, 2000, 'flush', '{}', '{}', '{}'",
		"'k', 1, 1000, 999, 'flush', '{}', '{}', '{}'",
		"'k', 1, 1000, 2000, 'nonsense', '{}', '{}', '{}'",
		"'k', 1, 1000, 2000, 'register', '{s}', '{}', '{}'",
		"'k', 1, 1000, 2000, 'register', '{\"a b\"}', '{x}', '{1}'",
		"'k', 1, 1000, 2000, 'register', '{s}', ARRAY[repeat('x', 201)], '{1}'",
		"'k', 1, 1000, 2000, 'register', '{s}', ARRAY[E'a\\nb'], '{1}'",
		"'k', 1, 1000, 2000, 'register', '{s}', '{x}', '{-1}'",
		"'k', 1, 1000, 2000, 'register', '{s}', '{NULL}', '{1}'",
	} {
		_, err := c.Exec(context.Background(), "SELECT * FROM pgsse.presence_flush("+args+")").ReadAll()
		var pgErr *pgconn.PgError
		if assert.ErrorAs(t, err, &pgErr, args) {
			assert.Equal(t, "22023", pgErr.Code, args)
		}
	}
	assert.Equal(t, "0", pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.presence_processes"))
	// A (stream, sub) given twice is refused by the key (the Go writer never sends one).
	_, err := c.Exec(context.Background(), "SELECT * FROM pgsse.presence_flush('k', 1, 1000, 2000, 'register', '{s,s}', '{x,x}', '{1,2}')").ReadAll()
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "23505", pgErr.Code)
	assert.Equal(t, "0", pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.presence_processes"))
}

// A real crash of PostgreSQL (a backend killed with SIGKILL: the postmaster restarts every
// backend and runs crash recovery) empties the unlogged presence tables. The writer's
// next flush finds its lease gone and writes its whole state again, with prev 0, so a
// consumer holding an older change number knows to re-read.
func TestPresenceSurvivesPostgresCrash(t *testing.T) {
	cl := pgtest.StartCluster(t, pgtest.ClusterOptions{})
	dsn := cl.NewDatabase(t)
	c := connect(t, dsn)
	_, _, err := Migrate(context.Background(), c)
	require.NoError(t, err)
	p := newPresence(t, "a :1 #0")
	first := flush(t, p, c, PresenceCount{"s", "x", 1}, PresenceCount{"s", "", 1})
	require.Len(t, first.Changes, 1)
	// The test cluster commits asynchronously; this commit waits for its WAL.
	pgtest.Exec(t, dsn, "SET synchronous_commit = on; SELECT pgsse.publish('durable', 'kept')")

	victim := connect(t, dsn)
	pid := execSQL(t, victim, "SELECT pg_backend_pid()")[0].Rows[0][0]
	require.NoError(t, exec.Command("kill", "-9", string(pid)).Run())
	// The postmaster ends every other backend (c's too) before it runs crash recovery, and
	// accepts connections only once that is done: wait for c to fail, then connect.
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := c.Exec(context.Background(), "SELECT 1").ReadAll(); err != nil {
			break
		}
		require.True(t, time.Now().Before(deadline), "the other backends were not ended")
		time.Sleep(50 * time.Millisecond)
	}
	var c2 *pgconn.PgConn
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c2, err = pgconn.Connect(ctx, dsn)
		cancel()
		if err == nil {
			break
		}
		require.True(t, time.Now().Before(deadline), "PostgreSQL did not come back: %v", err)
		time.Sleep(100 * time.Millisecond)
	}
	defer c2.Close(context.Background())
	assert.Equal(t, "0", pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.presence_entries"), "crash recovery empties unlogged tables")
	assert.Equal(t, "kept", pgtest.QueryValue(t, dsn, "SELECT data FROM pgsse.events"), "durable events are not unlogged")

	res, err := p.Flush(context.Background(), c2, nil)
	require.NoError(t, err)
	assert.True(t, res.LeaseLost)
	require.Len(t, res.Changes, 1)
	assert.Zero(t, res.Changes[0].Prev)
	assert.Greater(t, res.Changes[0].Seq, first.Changes[0].Seq, "change numbers come from a logged sequence and keep growing")
	assert.Equal(t, []string{"x"}, res.Changes[0].Joins)
	assert.Equal(t, "x:1", sqlPresence(t, dsn, "s"))
}

// A process holding many entries that loses its lease twice, with the statistics of the
// presence tables taken while an earlier incarnation held them all (as autovacuum leaves
// them): removing it and writing it again stays a matter of seconds. The planner once
// took the incarnation index for a probe by (stream, sub), which then walked every row of
// the process for each of its subjects — 20,000 × 20,000 — and a write ran for minutes.
func TestPresenceLostLeaseWithManyEntriesStaysFast(t *testing.T) {
	dsn := migrated(t)
	c := connect(t, dsn)
	const interval = 50 * time.Millisecond
	p, err := NewPresence(PresenceConfig{Key: "big :1 #0", Interval: interval, Lease: interval})
	require.NoError(t, err)
	var all []PresenceCount
	for s := 0; s < 20; s++ {
		for u := 0; u < 1000; u++ {
			all = append(all, PresenceCount{"doc/" + strconv.Itoa(s), "user:" + strconv.Itoa(u), 1})
		}
	}
	flush(t, p, c, all...)
	pgtest.Exec(t, dsn, "ANALYZE pgsse.presence_entries; ANALYZE pgsse.presence_streams; ANALYZE pgsse.presence_processes")
	for round := 0; round < 2; round++ {
		for pgtest.QueryValue(t, dsn, "SELECT bool_and(expires_at < clock_timestamp()) FROM pgsse.presence_processes") != "t" {
			time.Sleep(interval)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		start := time.Now()
		res, err := p.Flush(ctx, c, nil)
		cancel()
		require.NoError(t, err, "round %d", round)
		t.Logf("round %d: lost and written again in %v", round, time.Since(start))
		assert.True(t, res.LeaseLost)
		require.Len(t, res.Changes, 40, "20 streams left and joined again")
	}
	assert.Equal(t, "20000", pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.presence_entries"))
}
