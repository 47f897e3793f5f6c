package store

import (
	"context"
	"errors"
	"math/rand/v2"
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

// listener is a plain pgconn session LISTENing on channel pgsse, recording payloads
// in arrival order.
type listener struct {
	ch chan string
}

func listen(t *testing.T, dsn string) *listener {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dsn)
	require.NoError(t, err)
	l := &listener{ch: make(chan string, 4096)}
	cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) {
		if n.Channel == Channel {
			l.ch <- n.Payload
		}
	}
	conn, err := pgconn.ConnectConfig(context.Background(), cfg)
	require.NoError(t, err)
	_, err = conn.Exec(context.Background(), "LISTEN pgsse").ReadAll()
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for conn.WaitForNotification(ctx) == nil {
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = conn.Close(context.Background())
	})
	return l
}

// next returns the next payload, failing the test after 10 s.
func (l *listener) next(t *testing.T) string {
	t.Helper()
	select {
	case p := <-l.ch:
		return p
	case <-time.After(10 * time.Second):
		t.Fatal("no notification within 10 s")
		return ""
	}
}

// nextParsed returns the next payload parsed (its slices point into a private copy).
func (l *listener) nextParsed(t *testing.T) (Payload, string) {
	t.Helper()
	raw := l.next(t)
	var p Payload
	require.NoError(t, ParsePayload([]byte(raw), &p), "payload %q", raw)
	return p, raw
}

// none asserts nothing more arrives for a moment after a marker broadcast.
func (l *listener) expectQuiet(t *testing.T, c *pgconn.PgConn) {
	t.Helper()
	execSQL(t, c, "SELECT pgsse.broadcast('quiet.marker', 'end')")
	p, raw := l.nextParsed(t)
	assert.Equal(t, "quiet.marker", string(p.Stream), "unexpected notification %q", raw)
}

func TestPublishCommitOrder(t *testing.T) {
	for _, tc := range []struct {
		name         string
		rollbackRate float64
	}{{"all commit", 0}, {"with rollbacks", 0.25}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dsn := migrated(t)
			l := listen(t, dsn)
			const publishers, each = 8, 50
			var committed atomic.Int64
			var wg sync.WaitGroup
			conns := make([]*pgconn.PgConn, publishers)
			for i := range conns {
				conns[i] = connect(t, dsn)
			}
			errs := make(chan error, publishers)
			for i, c := range conns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx := context.Background()
					rng := rand.New(rand.NewPCG(uint64(i), 1))
					for n := 0; n < each; n++ {
						if _, err := c.Exec(ctx, "BEGIN").ReadAll(); err != nil {
							errs <- err
							return
						}
						if _, err := Publish(ctx, c, "order/s", "p"+strconv.Itoa(i)+"."+strconv.Itoa(n), "", nil); err != nil {
							errs <- err
							return
						}
						time.Sleep(time.Duration(rng.IntN(21)) * time.Millisecond) // the workload: hold the lock
						end := "COMMIT"
						if rng.Float64() < tc.rollbackRate {
							end = "ROLLBACK"
						}
						if _, err := c.Exec(ctx, end).ReadAll(); err != nil {
							errs <- err
							return
						}
						if end == "COMMIT" {
							committed.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			n := committed.Load()
			if tc.rollbackRate == 0 {
				require.EqualValues(t, publishers*each, n)
			} else {
				require.Less(t, n, int64(publishers*each), "some transactions rolled back")
			}
			// Notification order (= commit order) is exactly ascending id order 1..n.
			for want := int64(1); want <= n; want++ {
				p, raw := l.nextParsed(t)
				require.Equal(t, KindDurable, p.Kind, raw)
				require.Equal(t, want, p.ID, "notification #%d", want)
			}
			l.expectQuiet(t, conns[0])
			// The table holds exactly ids 1..n, and the head is n.
			ids := pgtest.QueryValue(t, dsn, "SELECT count(*) || ' ' || min(id) || ' ' || max(id) FROM pgsse.events WHERE stream = 'order/s'")
			assert.Equal(t, strconv.FormatInt(n, 10)+" 1 "+strconv.FormatInt(n, 10), ids)
			assert.Equal(t, strconv.FormatInt(n, 10), pgtest.QueryValue(t, dsn, "SELECT head FROM pgsse.streams WHERE stream = 'order/s'"))
		})
	}
}

// holdPublish runs one transaction per connection, each publishing to streams[i] and
// holding the transaction open for hold, all at once; it returns the wall time.
func holdPublish(t *testing.T, dsn string, streams []string, hold time.Duration) time.Duration {
	conns := make([]*pgconn.PgConn, len(streams))
	for i := range conns {
		conns[i] = connect(t, dsn)
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make([]error, len(streams))
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ctx := context.Background()
			_, err := c.Exec(ctx, "BEGIN").ReadAll()
			if err == nil {
				_, err = Publish(ctx, c, streams[i], "x", "", nil)
			}
			if err == nil {
				time.Sleep(hold) // the workload: a long transaction
				_, err = c.Exec(ctx, "COMMIT").ReadAll()
			}
			errs[i] = err
		}()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	elapsed := time.Since(t0)
	for _, err := range errs {
		require.NoError(t, err)
	}
	return elapsed
}

func TestPublishDistinctStreamsDoNotSerialise(t *testing.T) {
	dsn := migrated(t)
	// Make the streams exist first: the steady state is an UPDATE of the counter row.
	streams := make([]string, 8)
	for i := range streams {
		streams[i] = "par/" + strconv.Itoa(i)
	}
	holdPublish(t, dsn, streams, 0)

	elapsed := holdPublish(t, dsn, streams, 200*time.Millisecond)
	t.Logf("8 streams × 200 ms transactions: %v", elapsed)
	assert.Less(t, elapsed, 800*time.Millisecond)

	// Control: the same stream does serialise, so the bound above means something.
	elapsed = holdPublish(t, dsn, []string{"one", "one", "one"}, 200*time.Millisecond)
	assert.GreaterOrEqual(t, elapsed, 600*time.Millisecond)
}

func TestPublishPayloadShapes(t *testing.T) {
	dsn := migrated(t)
	l := listen(t, dsn)
	c := connect(t, dsn)
	ctx := context.Background()

	tests := []struct {
		name     string
		stream   string
		data     string
		event    string
		audience []string
	}{
		{"newlines", "shapes/1", "line 1\nline 2\r\nline 3\r\n\n", "", nil},
		{"utf-8", "shapes/2", "héllo wörld € 𝄞 日本語", "note.v2", nil},
		{"audience", "shapes/3", "{}", "private", []string{"user:7", "role:admin", "with space"}},
		{"empty data", "shapes/4", "", "", nil},
		{"empty audience is everyone", "shapes/5", "x", "", []string{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id, err := Publish(ctx, c, tc.stream, tc.data, tc.event, tc.audience)
			require.NoError(t, err)
			p, _ := l.nextParsed(t)
			assert.Equal(t, KindDurable, p.Kind)
			assert.Equal(t, tc.stream, string(p.Stream))
			assert.Equal(t, id, p.ID)
			assert.Equal(t, tc.event, string(p.Event))
			assert.Equal(t, tc.data, string(p.Data))
			var tags []string
			p.Tags(func(tag []byte) bool { tags = append(tags, string(tag)); return true })
			if len(tc.audience) == 0 {
				assert.Empty(t, tags)
			} else {
				assert.Equal(t, tc.audience, tags)
			}
			assert.InDelta(t, time.Now().UnixMicro(), p.TimeUS, float64(10*time.Second/time.Microsecond))
		})
	}

	t.Run("100 KiB travels as a wake and reads back intact", func(t *testing.T) {
		big := strings.Repeat("0123456789abcdé\n", 100*1024/16)
		id, err := Publish(ctx, c, "shapes/big", big, "bulk", []string{"t"})
		require.NoError(t, err)
		p, raw := l.nextParsed(t)
		assert.Equal(t, KindWake, p.Kind)
		assert.Equal(t, "W1 "+strconv.FormatInt(p.TimeUS, 10)+" shapes/big "+strconv.FormatInt(id, 10)+"  0\n", raw)
		assert.Equal(t, big, pgtest.QueryValue(t, dsn, "SELECT data FROM pgsse.events WHERE stream = 'shapes/big' AND id = "+strconv.FormatInt(id, 10)))
	})

	t.Run("durable switches to wake above 7999 bytes", func(t *testing.T) {
		_, err := Publish(ctx, c, "edge", "x", "", nil) // id 1: measure the header
		require.NoError(t, err)
		_, raw := l.nextParsed(t)
		header := len(raw) - 1
		_, err = Publish(ctx, c, "edge", strings.Repeat("y", MaxPayload-header), "", nil) // id 2, same width
		require.NoError(t, err)
		p, raw := l.nextParsed(t)
		assert.Equal(t, KindDurable, p.Kind)
		assert.Len(t, raw, MaxPayload)
		_, err = Publish(ctx, c, "edge", strings.Repeat("y", MaxPayload-header+1), "", nil)
		require.NoError(t, err)
		p, _ = l.nextParsed(t)
		assert.Equal(t, KindWake, p.Kind)
		assert.EqualValues(t, 3, p.ID)
	})

	t.Run("broadcast limit", func(t *testing.T) {
		require.NoError(t, Broadcast(ctx, c, "bc", "x", "", nil))
		p, raw := l.nextParsed(t)
		assert.Equal(t, KindEphemeral, p.Kind)
		header := len(raw) - 1
		require.Less(t, p.ID, int64(8), "the next two nonces keep the width")

		require.NoError(t, Broadcast(ctx, c, "bc", strings.Repeat("z", MaxPayload-header), "", nil))
		p, raw = l.nextParsed(t)
		assert.Equal(t, KindEphemeral, p.Kind)
		assert.Len(t, raw, MaxPayload, "exactly at the limit passes")

		err := Broadcast(ctx, c, "bc", strings.Repeat("z", MaxPayload-header+1), "", nil)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		assert.Equal(t, "22023", pgErr.Code)
		assert.Contains(t, pgErr.Message, "8000 bytes")
		assert.Contains(t, pgErr.Message, "pgsse.publish")
		l.expectQuiet(t, c)
	})

	t.Run("identical broadcasts in one transaction are not folded", func(t *testing.T) {
		execSQL(t, c, "BEGIN; SELECT pgsse.broadcast('twice', 'same'); SELECT pgsse.broadcast('twice', 'same'); COMMIT")
		for i := 0; i < 2; i++ {
			p, _ := l.nextParsed(t)
			assert.Equal(t, "twice", string(p.Stream))
		}
	})
}

// Bad arguments raise SQLSTATE 22023 in SQL with the rule in the message (the same
// wording as names), and the Go wrappers reject them before the round trip.
func TestPublishRejectsBadArguments(t *testing.T) {
	dsn := migrated(t)
	c := connect(t, dsn)
	ctx := context.Background()
	tooMany := make([]string, 65)
	for i := range tooMany {
		tooMany[i] = "t" + strconv.Itoa(i)
	}
	tests := []struct {
		name     string
		args     string // SQL arguments of publish/broadcast
		stream   string
		event    string
		audience []string
		err      error
	}{
		{"empty stream", `'', 'd'`, "", "", nil, names.ErrStreamLength},
		{"long stream", `repeat('a', 201), 'd'`, strings.Repeat("a", 201), "", nil, names.ErrStreamLength},
		{"stream with space", `'a b', 'd'`, "a b", "", nil, names.ErrStreamChars},
		{"stream with non-ASCII", `'café', 'd'`, "café", "", nil, names.ErrStreamChars},
		{"stream with newline", `E'a\nb', 'd'`, "a\nb", "", nil, names.ErrStreamChars},
		{"empty event", `'s', 'd', ''`, "s", "", nil, nil},
		{"long event", `'s', 'd', repeat('e', 65)`, "s", strings.Repeat("e", 65), nil, names.ErrEventLength},
		{"event with slash", `'s', 'd', 'a/b'`, "s", "a/b", nil, names.ErrEventChars},
		{"too many tags", `'s', 'd', NULL, array(SELECT 't' || g FROM generate_series(1, 65) g)`, "s", "", tooMany, names.ErrAudienceCount},
		{"empty tag", `'s', 'd', NULL, '{""}'`, "s", "", []string{""}, names.ErrTagLength},
		{"long tag", `'s', 'd', NULL, array[repeat('t', 201)]`, "s", "", []string{strings.Repeat("t", 201)}, names.ErrTagLength},
		{"tag with newline", `'s', 'd', NULL, array[E'a\nb']`, "s", "", []string{"a\nb"}, names.ErrTagControl},
		{"NULL tag", `'s', 'd', NULL, array[NULL::text]`, "", "", nil, errors.New("audience tags must not be NULL")},
		{"2-D audience", `'s', 'd', NULL, '{{a},{b}}'`, "", "", nil, errors.New("audience must be a one-dimensional array")},
		{"NULL data", `'s', NULL`, "", "", nil, errors.New("data must not be NULL")},
		{"NULL stream", `NULL, 'd'`, "", "", nil, names.ErrStreamLength},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wantMsg := names.ErrEventLength.Error()
			if tc.err != nil {
				wantMsg = tc.err.Error()
			}
			for _, fn := range []string{"publish", "broadcast"} {
				_, err := c.Exec(ctx, "SELECT pgsse."+fn+"("+tc.args+")").ReadAll()
				var pgErr *pgconn.PgError
				require.ErrorAs(t, err, &pgErr, fn)
				assert.Equal(t, "22023", pgErr.Code, fn)
				assert.Equal(t, wantMsg, pgErr.Message, fn)
			}
			// publish_many raises the same, naming the message, durable or ephemeral.
			for _, eph := range []string{"false", "true"} {
				_, err := c.Exec(ctx, "SELECT pgsse.publish_many(ARRAY[pgsse.message('ok', 'd'), pgsse.message("+
					tc.args+", ephemeral => "+eph+")])").ReadAll()
				var pgErr *pgconn.PgError
				require.ErrorAs(t, err, &pgErr, "publish_many ephemeral=%s", eph)
				assert.Equal(t, "22023", pgErr.Code)
				assert.Equal(t, wantMsg, pgErr.Message)
				assert.True(t, strings.HasPrefix(pgErr.Detail, "messages[2]"), pgErr.Detail)
			}
			if tc.stream == "" && tc.err != names.ErrStreamLength {
				return // not expressible through the Go API
			}
			if tc.name == "empty event" {
				return // Go's "" means NULL
			}
			_, err := Publish(ctx, c, tc.stream, "d", tc.event, tc.audience)
			assert.ErrorIs(t, err, tc.err)
			assert.ErrorIs(t, Broadcast(ctx, c, tc.stream, "d", tc.event, tc.audience), tc.err)
		})
	}
	assert.Equal(t, "0", pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.events"))
}

// Event names starting with "pgsse:" are pgsse's own (pgsse:gap, pgsse:presence): every
// publishing function refuses them with SQLSTATE 22023 naming the rule, durable or
// ephemeral, alone or in a batch; names that only look alike are ordinary names.
func TestPublishRefusesReservedEventNames(t *testing.T) {
	dsn := migrated(t)
	c := connect(t, dsn)
	ctx := context.Background()
	const rule = "event names starting with pgsse: are reserved"
	for _, event := range []string{"pgsse:gap", "pgsse:presence", "pgsse:", "pgsse:x.y"} {
		for _, sql := range []string{
			"SELECT pgsse.publish('s', 'd', '" + event + "')",
			"SELECT pgsse.broadcast('s', 'd', '" + event + "')",
			"SELECT pgsse.publish_many(ARRAY[pgsse.message('s', 'd', '" + event + "')])",
			"SELECT pgsse.publish_many(ARRAY[pgsse.message('s', 'd'), pgsse.message('s', 'd', '" + event + "', ephemeral => true)])",
			"SELECT pgsse.publish_many(ARRAY[pgsse.message('t', 'd'), pgsse.message('s', 'd', '" + event + "', ARRAY['tag'])])",
		} {
			_, err := c.Exec(ctx, sql).ReadAll()
			var pgErr *pgconn.PgError
			if assert.ErrorAs(t, err, &pgErr, sql) {
				assert.Equal(t, "22023", pgErr.Code, sql)
				assert.Equal(t, rule, pgErr.Message, sql)
			}
		}
		// From Go: refused (by names.CheckEvent or by PostgreSQL), never published.
		_, err := Publish(ctx, c, "s", "d", event, nil)
		require.Error(t, err)
		assert.Contains(t, err.Error(), rule)
	}
	assert.Equal(t, "0", pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.events"))
	for _, event := range []string{"pgsse", "PGSSE:gap", "x.pgsse:gap", "pgsse.gap", "pgss:e"} {
		_, err := Publish(ctx, c, "s", "d", event, nil)
		assert.NoError(t, err, event)
		assert.NoError(t, Broadcast(ctx, c, "s", "d", event, nil), event)
	}
}
