package engine

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/store"
)

// A multi-event wake (store/doc.go "W"): pgsse.publish_many stores several events of one
// stream in one transaction and announces them with one W payload naming the first new
// id. Every subscriber of the stream gets all of them, in order, once: one already live,
// one catching up from the table while the W arrives, and one on a stream the engine has
// never had a notification for — its own first read is held back (a lock on
// pgsse.events) until the W commits, so the W is how the engine learns the stream's ids.
func TestMultiEventWake(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	ctx := context.Background()

	pub := connect(t, ts.DSN)
	require.Equal(t, int64(1), publish(t, pub, "mw/seen", "before", "", nil))
	live := dial(t, addr, "/streams/mw/seen", tok) // live from the head (id 1)
	require.Equal(t, 200, live.Status, live.Body)

	// Our own LISTEN, to check that the events really travel as W payloads.
	cfg, err := pgconn.ParseConfig(ts.DSN)
	require.NoError(t, err)
	payloads := make(chan string, 16)
	cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) { payloads <- n.Payload }
	notes, err := pgconn.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { notes.Close(context.Background()) })
	_, err = notes.Exec(ctx, "LISTEN "+storeChannel).ReadAll()
	require.NoError(t, err)

	// Hold every history read back until the publishing transaction commits.
	tx := connect(t, ts.DSN)
	_, err = tx.Exec(ctx, "BEGIN; LOCK TABLE pgsse.events IN ACCESS EXCLUSIVE MODE").ReadAll()
	require.NoError(t, err)
	catchUp := dial(t, addr, "/streams/mw/seen", tok, "Last-Event-ID: 0")
	first := dial(t, addr, "/streams/mw/first", tok, "Last-Event-ID: 0")
	for _, c := range []*sseClient{catchUp, first} {
		require.Equal(t, 200, c.Status, c.Body)
	}
	waitFor(t, 15*time.Second, "both history reads waiting for the lock", func() bool {
		v := pgQuery(t, pub, "SELECT count(*) FROM pg_stat_activity WHERE application_name = '"+
			store.ReplayAppName+"' AND wait_event_type = 'Lock'")
		return v == "2"
	})

	const n = 5
	var msgs []string
	for i := 1; i <= n; i++ {
		msgs = append(msgs, "pgsse.message('mw/seen', 's"+strconv.Itoa(i)+"')", "pgsse.message('mw/first', 'f"+strconv.Itoa(i)+"')")
	}
	_, err = tx.Exec(ctx, "SELECT pgsse.publish_many(ARRAY["+strings.Join(msgs, ", ")+"]); COMMIT").ReadAll()
	require.NoError(t, err)

	// The premise: one W per stream, naming the first new id.
	var kinds []string
	for range 2 {
		if len(payloads) == 0 {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			require.NoError(t, notes.WaitForNotification(wctx))
			cancel()
		}
		var p store.Payload
		require.NoError(t, store.ParsePayload([]byte(<-payloads), &p))
		kinds = append(kinds, string(rune(p.Kind))+" "+string(p.Stream)+" "+strconv.FormatInt(p.ID, 10))
	}
	assert.ElementsMatch(t, []string{"W mw/seen 2", "W mw/first 1"}, kinds)

	live.readIDs(2, n+1, 15*time.Second)
	catchUp.readIDs(1, n+1, 15*time.Second)
	first.readIDs(1, n, 15*time.Second)
	for _, c := range []*sseClient{live, catchUp, first} {
		c.expectSilence(300 * time.Millisecond) // once: nothing repeated after the last
	}
}

// pgQuery returns the first column of the first row of sql on conn.
func pgQuery(t testing.TB, conn *pgconn.PgConn, sql string) string {
	t.Helper()
	res, err := conn.Exec(context.Background(), sql).ReadAll()
	require.NoError(t, err)
	require.NotEmpty(t, res)
	require.NotEmpty(t, res[0].Rows)
	return string(res[0].Rows[0][0])
}
