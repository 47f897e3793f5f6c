package engine

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

// TestChannelChurnKeepsSessionReferencesConsistent: clients that come and go while the
// channel's LISTEN is still in flight must neither leak a LISTEN nor drop one that a
// remaining client needs (the session may only be told to drop references it confirmed).
func TestChannelChurnKeepsSessionReferencesConsistent(t *testing.T) {
	ts := startServer(t, "", nil)
	tok := token(t, auth.Claims{Channels: []string{"churn"}}, time.Hour)
	req := "GET /channels/churn HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + tok + "\r\n\r\n"
	for i := 0; i < 40; i++ {
		c, err := net.Dial("tcp", ts.Addr().String())
		require.NoError(t, err)
		_, err = c.Write([]byte(req))
		require.NoError(t, err)
		if i%2 == 0 {
			c.Close() // gone before the LISTEN is answered, most of the time
		} else {
			defer c.Close()
			buf := make([]byte, 1)
			_, _ = c.Read(buf) // head written: the LISTEN completed
			c.Close()
		}
	}
	// A client that stays must get notifications.
	live := dial(t, ts.Addr().String(), "/channels/churn", "Authorization: Bearer "+tok)
	require.Equal(t, 200, live.Status, live.Body)
	live.mustNext(5 * time.Second) // retry/comment block
	pgtest.Exec(t, ts.DSN, "SELECT pg_notify('churn', 'still here')")
	ev := live.mustNextData(5 * time.Second)
	assert.Equal(t, "still here", ev.Data)
	assert.False(t, ev.HasID)

	// When the last one leaves, the session runs UNLISTEN.
	live.conn.Close()
	waitFor(t, 10*time.Second, "UNLISTEN by the listen session", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c := connect(t, ts.DSN)
		res, err := c.Exec(ctx, "SELECT query FROM pg_stat_activity WHERE application_name = 'pgsse-listen' AND datname = current_database()").ReadAll()
		return err == nil && len(res[0].Rows) == 1 && string(res[0].Rows[0][0]) == `UNLISTEN "churn"`
	})
	gone := make(chan int, 1)
	ts.tasks.push(func() { gone <- len(ts.chans.byName) })
	assert.Equal(t, 0, <-gone, "no channel left in the table")
}

// TestChannelNotUTF8: a channel name PostgreSQL would refuse (not UTF-8) is a bad request,
// 400 naming the rule (docs/http.md's status table; issue 11 saw 200 + ":over capacity"), and
// costs no one else anything.
func TestChannelNotUTF8(t *testing.T) {
	ts := startServer(t, "", nil)
	tok := token(t, auth.Claims{Channels: []string{"*"}}, time.Hour)
	for _, path := range []string{"/channels/bad%FFname", "/channels/%FF%FE"} {
		r := get(t, ts.Addr().String(), path, "Authorization: Bearer "+tok)
		assert.Equal(t, 400, r.Status, path)
		assert.Equal(t, "channel name must be valid UTF-8\n", r.Body, path)
	}
	good := dial(t, ts.Addr().String(), "/channels/good", "Authorization: Bearer "+tok)
	require.Equal(t, 200, good.Status)
	good.mustNext(5 * time.Second)
	pgtest.Exec(t, ts.DSN, "SELECT pg_notify('good', 'ok')")
	assert.Equal(t, "ok", good.mustNextData(5*time.Second).Data)
}
