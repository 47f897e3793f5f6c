package store

import (
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/names"
)

func TestPublishManyIDsAndNotifications(t *testing.T) {
	dsn := migrated(t)
	l := listen(t, dsn)
	c := connect(t, dsn)
	execSQL(t, c, "SELECT pgsse.publish('m/a', 'a1')")
	_, _ = l.nextParsed(t)

	big := strings.Repeat("x", 8000)
	res := execSQL(t, c, `SELECT pgsse.publish_many(ARRAY[
		pgsse.message('m/a', 'a2'),
		pgsse.message('m/b', 'b1', 'ev', ARRAY['u:1', 'r 2']),
		pgsse.message('m/a', 'a3', NULL, '{}'),
		pgsse.message('m/c', 'c-eph', 'typing', ARRAY['u:1'], true),
		pgsse.message('m/a', 'a4'),
		pgsse.message('m/d', '`+big+`'),
		pgsse.message('m/c', 'c-eph', 'typing', ARRAY['u:1'], NULL)])`)
	assert.Equal(t, "{2,1,3,NULL,4,1,1}", string(res[0].Rows[0][0]),
		"ids in array order; NULL ephemeral; a NULL ephemeral flag is durable")

	type note struct {
		kind   Kind
		stream string
		id     int64
		event  string
		data   string
	}
	var got []note
	for range 5 {
		p, _ := l.nextParsed(t)
		n := note{p.Kind, string(p.Stream), p.ID, string(p.Event), string(p.Data)}
		if p.Kind == KindEphemeral {
			n.id = 0
		}
		got = append(got, n)
	}
	assert.Equal(t, []note{
		{KindWake, "m/a", 2, "", ""},        // three events: a wake naming the first
		{KindDurable, "m/b", 1, "ev", "b1"}, // one event: inline
		{KindEphemeral, "m/c", 0, "typing", "c-eph"},
		{KindWake, "m/d", 1, "", ""}, // one event too big for NOTIFY
		{KindDurable, "m/c", 1, "typing", "c-eph"},
	}, got)
	l.expectQuiet(t, c)
	assert.Equal(t, "m/a 1 a1 | m/a 2 a2 | m/a 3 a3 | m/a 4 a4 | m/b 1 b1 {u:1,\"r 2\"} | m/c 1 c-eph {u:1} | m/d 1 8000",
		pgtest.QueryValue(t, dsn, `SELECT string_agg(stream || ' ' || id || ' ' || CASE WHEN length(data) > 100 THEN length(data)::text ELSE data END
			|| coalesce(' ' || audience::text, ''), ' | ' ORDER BY stream, id) FROM pgsse.events`))

	// Rolled back: nothing stored, nothing delivered, the ids are handed out again.
	execSQL(t, c, "BEGIN; SELECT pgsse.publish_many(ARRAY[pgsse.message('m/a', 'r'), pgsse.message('m/e', 'r')]); ROLLBACK")
	assert.Equal(t, "{5,1}", pgtest.QueryValue(t, dsn,
		"SELECT pgsse.publish_many(ARRAY[pgsse.message('m/a', 'a5'), pgsse.message('m/e', 'e1')])"))
	p, _ := l.nextParsed(t)
	assert.Equal(t, "m/a", string(p.Stream))
	assert.EqualValues(t, 5, p.ID)
	p, _ = l.nextParsed(t)
	assert.Equal(t, "m/e", string(p.Stream))

	// One message (the pgsse.publish shortcut): durable with an audience, then ephemeral.
	assert.Equal(t, "{1}", pgtest.QueryValue(t, dsn, "SELECT pgsse.publish_many(ARRAY[pgsse.message('m/f', 'f1', 'ev', ARRAY['t:1'])])"))
	_, raw := l.nextParsed(t)
	assert.Regexp(t, `^D1 \d+ m/f 1 ev 1 3:t:1\nf1$`, raw)
	assert.Equal(t, "{NULL}", pgtest.QueryValue(t, dsn, "SELECT pgsse.publish_many(ARRAY[pgsse.message('m/f', 'f2', ephemeral => true)])"))
	_, raw = l.nextParsed(t)
	assert.Regexp(t, `^E1 \d+ m/f \d+  0\nf2$`, raw)
	assert.Equal(t, "{}", pgtest.QueryValue(t, dsn, "SELECT pgsse.publish_many('{}')"))
	assert.Equal(t, "", pgtest.QueryValue(t, dsn, "SELECT pgsse.publish_many(NULL)"))
	_, err := c.Exec(context.Background(), "SELECT pgsse.publish_many(ARRAY[[pgsse.message('m/a', 'x')]])").ReadAll()
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "22023", pgErr.Code)
	_, err = c.Exec(context.Background(), "SELECT pgsse.publish_many(ARRAY[pgsse.message('m/a', repeat('x', 8000), ephemeral => true)])").ReadAll()
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "22023", pgErr.Code)
	assert.Contains(t, pgErr.Message, "7999-byte NOTIFY limit")
	assert.Equal(t, "messages[1]", pgErr.Detail)
}

// Connections calling publish_many on overlapping streams in random orders never
// deadlock, and each stream's ids are 1..n in the order its notifications arrive.
func TestPublishManyConcurrent(t *testing.T) {
	dsn := migrated(t)
	l := listen(t, dsn)
	const conns, calls = 6, 40
	streams := []string{"cc/a", "cc/b", "cc/c", "cc/d"}
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for i := range conns {
		c := connect(t, dsn)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for range calls {
				var msgs []string
				for _, j := range rng.Perm(len(streams)) {
					for range 1 + rng.IntN(3) {
						msgs = append(msgs, "pgsse.message('"+streams[j]+"', 'x')")
					}
				}
				sql := "BEGIN; SELECT pgsse.publish_many(ARRAY[" + strings.Join(msgs, ",") + "]); SELECT pg_sleep(0.002); COMMIT"
				if _, err := c.Exec(context.Background(), sql).ReadAll(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	heads := map[string]int64{}
	for _, s := range streams {
		h, err := strconv.ParseInt(pgtest.QueryValue(t, dsn, "SELECT head FROM pgsse.streams WHERE stream = '"+s+"'"), 10, 64)
		require.NoError(t, err)
		heads[s] = h
		assert.Equal(t, strconv.FormatInt(h, 10)+" 1 "+strconv.FormatInt(h, 10),
			pgtest.QueryValue(t, dsn, "SELECT count(*) || ' ' || min(id) || ' ' || max(id) FROM pgsse.events WHERE stream = '"+s+"'"))
	}
	// Per stream, each notification starts right after the previous one's events.
	next := map[string]int64{}
	for range conns * calls * len(streams) {
		p, raw := l.nextParsed(t)
		s := string(p.Stream)
		require.Equal(t, next[s]+1, p.ID, "%s: %q", s, raw)
		next[s] = p.ID
		if p.Kind == KindWake {
			next[s] = lastOfRun(t, dsn, s, p.ID)
		}
	}
	for _, s := range streams {
		assert.Equal(t, heads[s], next[s], s)
	}
	l.expectQuiet(t, connect(t, dsn))
}

// lastOfRun returns the last id of the run a W payload starts: the events of one
// transaction (same xmin).
func lastOfRun(t *testing.T, dsn, stream string, first int64) int64 {
	v := pgtest.QueryValue(t, dsn, "SELECT max(id) FROM pgsse.events WHERE stream = '"+stream+
		"' AND xmin = (SELECT xmin FROM pgsse.events WHERE stream = '"+stream+"' AND id = "+strconv.FormatInt(first, 10)+")")
	last, err := strconv.ParseInt(v, 10, 64)
	require.NoError(t, err)
	return last
}

func TestMaxEventBytesSQL(t *testing.T) {
	dsn := migrated(t)
	c := connect(t, dsn)
	ctx := context.Background()
	pgErrOf := func(sql string) *pgconn.PgError {
		t.Helper()
		_, err := c.Exec(ctx, sql).ReadAll()
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, sql)
		return pgErr
	}

	t.Run("default refuses 300 MB at once", func(t *testing.T) {
		// Building the argument is most of the time (repeat() alone takes seconds on a
		// busy machine); the refusal must add little to it.
		start := time.Now()
		execSQL(t, c, "SELECT length(repeat('v', 300000000))")
		build := time.Since(start)
		start = time.Now()
		e := pgErrOf("SELECT pgsse.publish('big', repeat('v', 300000000))")
		refuse := time.Since(start)
		t.Logf("repeat() alone %v, refused in %v", build, refuse)
		assert.Less(t, refuse, 2*build+2*time.Second)
		assert.Equal(t, "22023", e.Code)
		assert.Equal(t, "event data is 300000000 bytes, over pgsse.max_event_bytes (1048576 bytes)", e.Message)
		e = pgErrOf("SELECT pgsse.publish_many(ARRAY[pgsse.message('ok', 'x'), pgsse.message('big', repeat('v', 20000000))])")
		assert.Equal(t, "event data is 20000000 bytes, over pgsse.max_event_bytes (1048576 bytes)", e.Message)
		assert.Equal(t, "messages[2]", e.Detail)
		assert.Equal(t, "0", pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.events"))
	})

	t.Run("exact limit accepted, one more byte refused", func(t *testing.T) {
		execSQL(t, c, "SELECT pgsse.publish('edge', repeat('v', 1048576))")
		execSQL(t, c, "SELECT pgsse.publish_many(ARRAY[pgsse.message('edge', repeat('v', 1048576))])")
		e := pgErrOf("SELECT pgsse.publish('edge', repeat('v', 1048576) || 'é')")
		assert.Equal(t, "event data is 1048578 bytes, over pgsse.max_event_bytes (1048576 bytes)", e.Message, "bytes, not characters")
		pgErrOf("SELECT pgsse.publish('edge', repeat('v', 1048577))")
		assert.Equal(t, "2", pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.events WHERE stream = 'edge'"))
	})

	t.Run("raised per database for new sessions", func(t *testing.T) {
		db := strings.TrimPrefix(pgtest.QueryValue(t, dsn, "SELECT current_database()"), "")
		pgtest.Exec(t, dsn, "ALTER DATABASE "+db+" SET pgsse.max_event_bytes = 52428800")
		c2 := connect(t, dsn)
		res, err := c2.Exec(ctx, "SELECT pgsse.max_event_bytes(); SELECT pgsse.publish('fifty', repeat('v', 52428800))").ReadAll()
		require.NoError(t, err)
		assert.Equal(t, "52428800", string(res[0].Rows[0][0]))
		_, err = c2.Exec(ctx, "SELECT pgsse.publish('fifty', repeat('v', 52428801))").ReadAll()
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		assert.Equal(t, "event data is 52428801 bytes, over pgsse.max_event_bytes (52428800 bytes)", pgErr.Message)
		assert.Equal(t, "52428800", pgtest.QueryValue(t, dsn, "SELECT octet_length(data) FROM pgsse.events WHERE stream = 'fifty'"))
	})

	t.Run("a bad setting fails durable publishes naming it", func(t *testing.T) {
		for _, bad := range []string{"1MB", "-1", " 5", "1234567890123456789"} {
			execSQL(t, c, "SET pgsse.max_event_bytes = '"+bad+"'")
			e := pgErrOf("SELECT pgsse.publish('s', 'x')")
			assert.Equal(t, "22023", e.Code)
			assert.Contains(t, e.Message, "pgsse.max_event_bytes must be a whole number of bytes", bad)
			_, err := ParseMaxEventBytes(bad)
			assert.Error(t, err, bad)
		}
		execSQL(t, c, "SET pgsse.max_event_bytes = ''")
		execSQL(t, c, "SELECT pgsse.publish('s', 'x')")
		execSQL(t, c, "SET pgsse.max_event_bytes = '0'")
		execSQL(t, c, "SELECT pgsse.publish('s', '')")
		pgErrOf("SELECT pgsse.publish('s', 'x')")
		execSQL(t, c, "RESET pgsse.max_event_bytes")
	})
}

// The quick checks (valid_names, valid_audience) agree with check_args, which raises
// the rule, and with Go's names package (names.CheckAudience), on many near-miss inputs.
func TestQuickChecksAgreeWithCheckArgs(t *testing.T) {
	dsn := migrated(t)
	c := connect(t, dsn)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(11, 13))
	alphabet := []string{"a", "Z", "0", ".", "_", ":", "@", "/", "=", "+", "~", "-", " ", "é", "\n", "\t", "*", "'", "\\", "\x7f", "\x01", "ü€"}
	word := func(maxLen int) string {
		var b strings.Builder
		n := rng.IntN(maxLen + 2)
		if rng.IntN(4) == 0 {
			n = maxLen - 1 + rng.IntN(3) // around the limit
		}
		for b.Len() < n {
			if rng.IntN(3) == 0 {
				b.WriteString(alphabet[rng.IntN(len(alphabet))])
			} else {
				b.WriteByte("abcXYZ019"[rng.IntN(9)])
			}
		}
		return b.String()
	}
	sqlOK := func(sql string, args ...[]byte) (bool, string) {
		oids := make([]uint32, len(args))
		for i := range oids {
			oids[i] = oidText
		}
		res := c.ExecParams(ctx, sql, args, oids, nil, nil).Read()
		if res.Err != nil {
			var pgErr *pgconn.PgError
			require.ErrorAs(t, res.Err, &pgErr)
			require.Equal(t, "22023", pgErr.Code, pgErr.Message)
			return false, pgErr.Message
		}
		return true, string(res.Rows[0][0])
	}
	for i := 0; i < 400; i++ {
		stream, event := word(names.MaxStream), word(names.MaxEvent)
		if i%3 == 0 {
			event = strings.Repeat("e", 1+rng.IntN(70))
		}
		var eventArg []byte
		if i%5 != 0 {
			eventArg = []byte(event)
		}
		_, quick := sqlOK("SELECT pgsse.valid_names($1, $2)", []byte(stream), eventArg)
		checkOK, msg := sqlOK("SELECT pgsse.check_args($1, 'd', $2, NULL)::text", []byte(stream), eventArg)
		ev := PublishEvent{Stream: stream, Event: string(eventArg)}
		goErr := ev.checkNames(1 << 20)
		assert.Equal(t, checkOK, quick == "t", "valid_names(%q, %q) = %s, check_args: %s", stream, eventArg, quick, msg)
		assert.Equal(t, checkOK, goErr == nil, "Go (%v) vs check_args (%s) for %q %q", goErr, msg, stream, eventArg)
		if goErr != nil && !checkOK {
			assert.Equal(t, msg, goErr.(*EventError).Err.Error())
		}
	}
	for i := 0; i < 200; i++ {
		tags := make([]string, rng.IntN(3))
		if i%17 == 0 {
			tags = make([]string, 63+rng.IntN(3))
		}
		for j := range tags {
			tags[j] = word(names.MaxTag)
		}
		arr := appendTextArray(nil, tags)
		res := c.ExecParams(ctx, "SELECT pgsse.valid_audience($1)", [][]byte{arr}, []uint32{oidTextArray}, nil, nil).Read()
		require.NoError(t, res.Err)
		checkOK, msg := sqlOK("SELECT pgsse.check_args('s', 'd', NULL, $1::text[])::text", arr)
		goErr := names.CheckAudience(tags)
		assert.Equal(t, checkOK, string(res.Rows[0][0]) == "t", "valid_audience(%q): %s", tags, msg)
		assert.Equal(t, checkOK, goErr == nil, "Go (%v) vs check_args (%s) for %q", goErr, msg, tags)
	}
}

// Go's bound on an ephemeral payload (maxEphemeralPayload) is the exact size of the E
// payload SQL builds when the nonce has 19 digits, and never smaller otherwise.
func TestEphemeralPayloadBound(t *testing.T) {
	dsn := migrated(t)
	c := connect(t, dsn)
	ev := PublishEvent{Stream: "eph/b", Event: "typing", Audience: []string{"user:7", "r"}, Ephemeral: true}
	ev.Data = []byte(strings.Repeat("d", MaxPayload-ev.maxEphemeralPayload()))
	require.Equal(t, MaxPayload, ev.maxEphemeralPayload())
	require.NoError(t, ev.checkNames(DefaultMaxEventBytes))
	call := func(data string) error {
		_, err := c.Exec(context.Background(), "SELECT pgsse.publish_many(ARRAY[pgsse.message('eph/b', '"+data+
			"', 'typing', ARRAY['user:7', 'r'], true)])").ReadAll()
		return err
	}
	require.NoError(t, call(string(ev.Data)), "a short nonce: fits with room to spare")
	execSQL(t, c, "SELECT setval('pgsse.broadcast_nonce', 1000000000000000000)") // 19 digits from here
	require.NoError(t, call(string(ev.Data)), "the widest nonce: exactly 7999 bytes")
	err := call(string(ev.Data) + "d")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Contains(t, pgErr.Message, "would be 8000 bytes")
	ev.Data = append(ev.Data, 'd')
	assert.ErrorIs(t, ev.checkNames(DefaultMaxEventBytes), ErrEventTooLarge)
}
