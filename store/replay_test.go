package store

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/names"
)

func newTestReplayer(t *testing.T, dsn string, pool int) *Replayer {
	t.Helper()
	r := NewReplayer(dsn, pool, nil)
	t.Cleanup(r.Close)
	return r
}

// readSync runs one Read and waits for its result.
func readSync(t *testing.T, r *Replayer, req ReadRequest) ReadResult {
	t.Helper()
	ch := make(chan ReadResult, 1)
	require.True(t, r.Read(req, func(res ReadResult) { ch <- res }), "queued")
	select {
	case res := <-ch:
		return res
	case <-time.After(30 * time.Second):
		t.Fatal("no replay result within 30 s")
		return ReadResult{}
	}
}

// readAll reads batches from req.After as the engine's catch-up does — each batch after the
// last event of the one before — until a batch is Done or batch returns false; every result
// must succeed.
func readAll(t *testing.T, r *Replayer, req ReadRequest, batch func(ReadResult) bool) {
	t.Helper()
	for {
		res := readSync(t, r, req)
		require.NoError(t, res.Err)
		if !batch(res) || res.Done || len(res.Events) == 0 {
			return
		}
		req.After = res.Events[len(res.Events)-1].ID
	}
}

func ids(events []Event) []int64 {
	out := make([]int64, len(events))
	for i, e := range events {
		out[i] = e.ID
	}
	return out
}

func TestReplayCatchUpBacklog(t *testing.T) {
	dsn := migrated(t)
	const n = 5000
	pgtest.Exec(t, dsn, "SELECT pgsse.publish('backlog', 'event ' || g) FROM generate_series(1, "+strconv.Itoa(n)+") g")
	pgtest.Exec(t, dsn, "SELECT pgsse.publish('other', 'x') FROM generate_series(1, 10)")
	r := newTestReplayer(t, dsn, 2)

	var got []int64
	batches := 0
	var last ReadResult
	readAll(t, r, ReadRequest{Stream: "backlog", Limit: 500}, func(res ReadResult) bool {
		batches++
		assert.LessOrEqual(t, len(res.Events), 500)
		assert.EqualValues(t, n, res.Head)
		assert.EqualValues(t, 1, res.Oldest)
		for _, e := range res.Events {
			if !assert.Equal(t, "event "+strconv.FormatInt(e.ID, 10), string(e.Data)) {
				return false
			}
		}
		got = append(got, ids(res.Events)...)
		last = res
		return true
	})
	require.Len(t, got, n)
	for i, id := range got {
		require.EqualValues(t, i+1, id, "in order, no duplicates, no gaps")
	}
	assert.Equal(t, n/500, batches, "exactly ten batches: Done is known without an extra empty read")
	assert.True(t, last.Done)

	// A batch function may stop early.
	batches = 0
	readAll(t, r, ReadRequest{Stream: "backlog", After: 4000, Limit: 100},
		func(res ReadResult) bool { batches++; return batches < 3 })
	assert.Equal(t, 3, batches)
}

func TestReplayAudience(t *testing.T) {
	dsn := migrated(t)
	c := connect(t, dsn)
	ctx := context.Background()
	aud := [][]string{nil, {"user:1"}, {"user:2", "role:admin"}, {}, {"user:1", "user:2"}, {"user:3"}}
	for i, a := range aud {
		_, err := Publish(ctx, c, "aud", "e"+strconv.Itoa(i+1), "", a)
		require.NoError(t, err)
	}
	r := newTestReplayer(t, dsn, 1)

	tests := []struct {
		name string
		req  ReadRequest
		want []int64
		done bool
	}{
		{"no tags sees public only", ReadRequest{Stream: "aud"}, []int64{1, 4}, true},
		{"user:1", ReadRequest{Stream: "aud", Tags: []string{"user:1"}}, []int64{1, 2, 4, 5}, true},
		{"admin", ReadRequest{Stream: "aud", Tags: []string{"role:admin", "nobody"}}, []int64{1, 3, 4}, true},
		{"all audiences", ReadRequest{Stream: "aud", AllAudiences: true}, []int64{1, 2, 3, 4, 5, 6}, true},
		{"limit counts visible events", ReadRequest{Stream: "aud", Tags: []string{"user:2"}, Limit: 2}, []int64{1, 3}, false},
		{"after", ReadRequest{Stream: "aud", Tags: []string{"user:2"}, After: 3, Limit: 2}, []int64{4, 5}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := readSync(t, r, tc.req)
			require.NoError(t, res.Err)
			assert.Equal(t, tc.want, ids(res.Events))
			assert.Equal(t, tc.done, res.Done)
			assert.EqualValues(t, 6, res.Head)
		})
	}
	res := readSync(t, r, ReadRequest{Stream: "aud", AllAudiences: true})
	for i, e := range res.Events {
		if len(aud[i]) == 0 {
			assert.Nil(t, e.Audience, "id %d", e.ID)
		} else {
			assert.Equal(t, aud[i], e.Audience, "id %d", e.ID)
		}
	}
}

func TestReplayEventFields(t *testing.T) {
	dsn := migrated(t)
	c := connect(t, dsn)
	ctx := context.Background()
	big := strings.Repeat("€ü\n", 100*1024/6)
	before := time.Now()
	_, err := Publish(ctx, c, "fields", "a\nb", "custom.ev", nil)
	require.NoError(t, err)
	_, err = Publish(ctx, c, "fields", big, "", nil)
	require.NoError(t, err)
	r := newTestReplayer(t, dsn, 1)
	res := readSync(t, r, ReadRequest{Stream: "fields"})
	require.NoError(t, res.Err)
	require.Len(t, res.Events, 2)
	assert.Equal(t, "custom.ev", res.Events[0].Event)
	assert.Equal(t, "a\nb", string(res.Events[0].Data))
	assert.Equal(t, "", res.Events[1].Event, "NULL event = message")
	assert.Equal(t, big, string(res.Events[1].Data), "100 KiB reads back intact")
	assert.InDelta(t, before.UnixMicro(), res.Events[0].TimeUS, float64(5*time.Second/time.Microsecond))
}

func TestReplayHeadOldest(t *testing.T) {
	dsn := migrated(t)
	r := newTestReplayer(t, dsn, 1)

	res := readSync(t, r, ReadRequest{Stream: "never/published"})
	require.NoError(t, res.Err)
	assert.Equal(t, ReadResult{Head: 0, Oldest: 1, Done: true}, res)

	pgtest.Exec(t, dsn, "SELECT pgsse.publish('ho', 'x') FROM generate_series(1, 3)")
	res = readSync(t, r, ReadRequest{Stream: "ho", HeadOnly: true})
	require.NoError(t, res.Err)
	assert.Equal(t, ReadResult{Head: 3, Oldest: 1, Done: false}, res, "HeadOnly: no events, more remain")
	res = readSync(t, r, ReadRequest{Stream: "ho", HeadOnly: true, After: 3})
	assert.Equal(t, ReadResult{Head: 3, Oldest: 1, Done: true}, res)
	res = readSync(t, r, ReadRequest{Stream: "ho", After: 10})
	assert.Equal(t, ReadResult{Head: 3, Oldest: 1, Done: true}, res, "a cursor past the head")
}

func TestReplayBatchBytes(t *testing.T) {
	dsn := migrated(t)
	pgtest.Exec(t, dsn, "SELECT pgsse.publish('bytes', repeat('x', 1024*1024)) FROM generate_series(1, 6)")
	r := newTestReplayer(t, dsn, 1)
	var sizes []int
	readAll(t, r, ReadRequest{Stream: "bytes"}, func(res ReadResult) bool {
		sizes = append(sizes, len(res.Events))
		return true
	})
	assert.Equal(t, []int{4, 2}, sizes, "≤ 4 MiB of data per batch")
}

// MaxBytes cuts a batch (never below one event); Encode turns each event into what the reader
// keeps, read straight from the row; events share chunks unless OwnBuffers, and a large event
// has a buffer of its own either way.
func TestReplayEncodeMaxBytesAndBuffers(t *testing.T) {
	dsn := migrated(t)
	pgtest.Exec(t, dsn, "SELECT pgsse.publish('enc', g::text || repeat('x', 999), 'e') FROM generate_series(1, 10) g; SELECT pgsse.publish('enc', repeat('L', 200000))")
	r := newTestReplayer(t, dsn, 1)
	encode := func(dst []byte, id int64, event, data []byte) []byte {
		dst = strconv.AppendInt(dst, id, 10)
		dst = append(dst, ' ')
		dst = append(dst, event...)
		dst = append(dst, ' ')
		return append(dst, data[:4]...)
	}
	res := readSync(t, r, ReadRequest{Stream: "enc", MaxBytes: 3000, Encode: encode})
	require.NoError(t, res.Err)
	assert.Equal(t, []int64{1, 2, 3}, ids(res.Events), "3000 bytes of data: three 1000-byte events")
	assert.False(t, res.Done)
	assert.Equal(t, "1 e 1xxx", string(res.Events[0].Data))
	assert.Equal(t, "3 e 3xxx", string(res.Events[2].Data))
	// Chunked: the events' bytes are adjacent in one array.
	a, b := res.Events[0].Data, res.Events[1].Data
	assert.Equal(t, uintptr(unsafe.Pointer(&a[0]))+uintptr(len(a)), uintptr(unsafe.Pointer(&b[0])), "events share a chunk")

	res = readSync(t, r, ReadRequest{Stream: "enc", After: 9, Encode: encode, OwnBuffers: true})
	require.NoError(t, res.Err)
	require.Equal(t, []int64{10, 11}, ids(res.Events))
	a, b = res.Events[0].Data, res.Events[1].Data
	assert.NotEqual(t, uintptr(unsafe.Pointer(&a[0]))+uintptr(len(a)), uintptr(unsafe.Pointer(&b[0])), "own buffers")
	assert.Equal(t, "11  LLLL", string(b))

	res = readSync(t, r, ReadRequest{Stream: "enc", After: 10})
	require.NoError(t, res.Err)
	require.Len(t, res.Events, 1)
	assert.Equal(t, 200000, len(res.Events[0].Data))
	assert.Equal(t, 200000, cap(res.Events[0].Data), "a large event: a buffer of its size")
}

func TestPruneKeepsLastAndOldest(t *testing.T) {
	dsn := migrated(t)
	c := connect(t, dsn)
	ctx := context.Background()
	pgtest.Exec(t, dsn, `SELECT pgsse.publish('p/a', 'x') FROM generate_series(1, 10);
		SELECT pgsse.publish('p/b', 'x') FROM generate_series(1, 3);
		SELECT pgsse.publish('p/c', 'x') FROM generate_series(1, 10);
		UPDATE pgsse.events SET created_at = now() - interval '2 hours';
		-- p/c: id 4 started late (young) but ids 5-10 are old: only ids 1-3 may go
		UPDATE pgsse.events SET created_at = now() WHERE stream = 'p/c' AND id = 4;`)
	r := newTestReplayer(t, dsn, 1)

	n, err := Prune(ctx, c, time.Hour, 4)
	require.NoError(t, err)
	// p/a: 1-6 deleted (keep 7-10); p/b: keeps all 3; p/c: 1-3 deleted (4 is young).
	assert.EqualValues(t, 6+0+3, n)
	for _, tc := range []struct {
		stream       string
		head, oldest int64
	}{{"p/a", 10, 7}, {"p/b", 3, 1}, {"p/c", 10, 4}} {
		res := readSync(t, r, ReadRequest{Stream: tc.stream})
		require.NoError(t, res.Err)
		assert.Equal(t, tc.head, res.Head, tc.stream)
		assert.Equal(t, tc.oldest, res.Oldest, tc.stream)
		assert.Equal(t, tc.oldest, res.Events[0].ID, tc.stream)
	}

	n, err = Prune(ctx, c, time.Hour, 4)
	require.NoError(t, err)
	assert.Zero(t, n, "nothing more to prune")

	// keep_last 0 and a zero age: everything goes; Oldest becomes Head+1.
	n, err = Prune(ctx, c, 0, 0)
	require.NoError(t, err)
	assert.EqualValues(t, 4+3+7, n)
	res := readSync(t, r, ReadRequest{Stream: "p/a"})
	assert.Equal(t, ReadResult{Head: 10, Oldest: 11, Done: true}, res)
	// Ids continue after a full prune.
	id, err := Publish(ctx, c, "p/a", "y", "", nil)
	require.NoError(t, err)
	assert.EqualValues(t, 11, id)

	_, err = Prune(ctx, c, -time.Second, 0)
	assert.ErrorIs(t, err, ErrNegativeAge)
	_, err = Prune(ctx, c, time.Second, -1)
	assert.ErrorIs(t, err, ErrNegativeKeep)
	_, err = c.Exec(ctx, "SELECT pgsse.prune('1 hour', NULL)").ReadAll()
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "22023", pgErr.Code)
}

func TestReplayBadRequests(t *testing.T) {
	dsn := migrated(t)
	r := newTestReplayer(t, dsn, 1)
	res := readSync(t, r, ReadRequest{Stream: "bad stream"})
	assert.ErrorIs(t, res.Err, ErrBadRequest)
	assert.ErrorIs(t, res.Err, names.ErrStreamChars)
	res = readSync(t, r, ReadRequest{Stream: "s", After: -1})
	assert.ErrorIs(t, res.Err, ErrBadRequest)
	res = readSync(t, r, ReadRequest{Stream: "s", Limit: -1})
	assert.ErrorIs(t, res.Err, ErrBadRequest)

	bad := NewReplayer("postgres://%zz", 1, nil)
	defer bad.Close()
	res = readSync(t, bad, ReadRequest{Stream: "s"})
	assert.Error(t, res.Err)
}

// Connections are opened lazily with application_name pgsse-replay, and a killed
// connection is replaced without the caller seeing an error.
func TestReplayReconnects(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	r := newTestReplayer(t, dsn, 1)
	countReplay := "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgsse-replay' AND datname = current_database()"
	assert.Equal(t, "0", pgtest.QueryValue(t, dsn, countReplay), "lazy")

	res := readSync(t, r, ReadRequest{Stream: "s"})
	var pgErr *pgconn.PgError
	require.ErrorAs(t, res.Err, &pgErr, "not migrated yet")

	_, _, err := Migrate(context.Background(), connect(t, dsn))
	require.NoError(t, err)
	pgtest.Exec(t, dsn, "SELECT pgsse.publish('s', 'x')")
	res = readSync(t, r, ReadRequest{Stream: "s"})
	require.NoError(t, res.Err, "re-opened after the failure")
	assert.Len(t, res.Events, 1)
	assert.Equal(t, "1", pgtest.QueryValue(t, dsn, countReplay))

	assert.Equal(t, "t", pgtest.QueryValue(t, dsn, "SELECT bool_and(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'pgsse-replay' AND datname = current_database()"))
	res = readSync(t, r, ReadRequest{Stream: "s"})
	require.NoError(t, res.Err, "retried on a fresh connection")
	assert.Len(t, res.Events, 1)
}

func TestReplayerQueueFullAndClose(t *testing.T) {
	dsn := migrated(t)
	r := newReplayer(dsn, 1, nil, 2)
	entered, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	var results [3]ReadResult
	wg.Add(3)
	require.True(t, r.Read(ReadRequest{Stream: "s"}, func(res ReadResult) {
		results[0] = res
		close(entered)
		<-release // hold the only worker
		wg.Done()
	}))
	<-entered
	for i := 1; i <= 2; i++ {
		require.True(t, r.Read(ReadRequest{Stream: "s"}, func(res ReadResult) { results[i] = res; wg.Done() }))
	}
	assert.False(t, r.Read(ReadRequest{Stream: "s"}, func(ReadResult) { t.Error("a refused request must not call done") }), "queue full")

	closed := make(chan struct{})
	go func() { r.Close(); close(closed) }()
	require.Eventually(t, func() bool {
		r.mu.RLock()
		defer r.mu.RUnlock()
		return r.closed
	}, 5*time.Second, time.Millisecond)
	assert.False(t, r.Read(ReadRequest{Stream: "s"}, func(ReadResult) {}), "closed")
	close(release)
	<-closed
	wg.Wait()
	assert.NoError(t, results[0].Err)
	assert.ErrorIs(t, results[1].Err, ErrClosed)
	assert.ErrorIs(t, results[2].Err, ErrClosed)
	r.Close() // idempotent
}
