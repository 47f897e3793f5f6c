package engine

import (
	"io"
	neturl "net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

// What clients are told when something is wrong on the server's side (issue 26): what
// happened and what to do, and nothing of the server's configuration.

// rawUntilEOF reads what the server sends until it closes the connection.
func (c *sseClient) rawUntilEOF(timeout time.Duration) string {
	c.t.Helper()
	_ = c.conn.SetReadDeadline(time.Now().Add(timeout))
	defer c.conn.SetReadDeadline(time.Time{})
	b, err := io.ReadAll(c.r)
	require.NoError(c.t, err, "the server must close the connection (read so far %q)", b)
	return string(b)
}

// An unmigrated database: a subscriber is shed with SPEC's reason `:database unavailable`,
// unchanged on its own line so that clients matching it keep working, and a second comment
// line saying the schema is not installed; a publisher gets 503 saying the same — before, both
// were told only that the database (or PostgreSQL) was unavailable, while doctor and /readyz
// said "run pgsse migrate".
func TestUnmigratedDatabaseIsNamed(t *testing.T) {
	t.Parallel()
	ts := startServer(t, pgtest.NewDatabase(t), nil)
	addr := ts.Addr().String()

	// Live only: the stream's head cannot be read, so the subscription never starts (shed);
	// from a cursor: the subscription is live, and its history cannot be read (closed).
	live := dial(t, addr, "/streams/orders/1", bearerH(allStreams(t)))
	replay := dial(t, addr, "/streams/orders/1?since=0", bearerH(allStreams(t)))
	for _, c := range []*sseClient{live, replay} {
		require.Equal(t, 200, c.Status, c.Body)
		body := c.rawUntilEOF(30 * time.Second)
		assert.Regexp(t, `(^|\n)retry: \d+\n:database unavailable\n:schema not installed: the server's operator must run pgsse migrate\n\n$`, body)
	}

	r := exchange(t, addr, "POST", post("/streams/orders/1", "x", bearerH(publishToken(t, "*"))))
	assert.Equal(t, 503, r.Status)
	assertErrorBody(t, r)
	assert.Equal(t, "the database is not set up for pgsse yet (its operator must run pgsse migrate); nothing was published\n", r.Body)
	assert.NotEmpty(t, r.Header.Get("Retry-After"))
}

// A 503 publish answer showed the connection string's user and database ("failed to connect to
// `user=postgres database=pgsse_test_…`") to any HTTP client; now it is a fixed text, and the
// cause is in the log.
func TestPublishUnavailableRevealsNothing(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	u, err := neturl.Parse(ts.DSN)
	require.NoError(t, err)
	db := strings.TrimPrefix(u.Path, "/")
	// The LISTEN session is connected; new connections — the Publisher's first — are refused.
	pgtest.Exec(t, pgtest.URL(t), `ALTER DATABASE "`+db+`" ALLOW_CONNECTIONS false`)
	t.Cleanup(func() { pgtest.Exec(t, pgtest.URL(t), `ALTER DATABASE "`+db+`" ALLOW_CONNECTIONS true`) })

	r := exchange(t, ts.Addr().String(), "POST", post("/streams/s", "x", bearerH(publishToken(t, "*"))))
	assert.Equal(t, 503, r.Status)
	assertErrorBody(t, r)
	assert.Equal(t, "PostgreSQL is unavailable; nothing was published\n", r.Body)
	assert.NotContains(t, r.Body, db)
	assert.NotContains(t, r.Body, u.User.Username())
}

// A connection closed at its token's exp said only `retry:`; it now says why, with a comment
// `:token expired` before the close (docs/http.md, Authorization) — on a stream and a channel.
func TestTokenExpiryIsNamed(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	tok, err := auth.Mint(auth.MintKey{Secret: []byte(testSecret)}, auth.Claims{Streams: []string{"*"}, Channels: []string{"*"}}, 2*time.Second, "", "", time.Now())
	require.NoError(t, err)
	stream, channel := dial(t, addr, "/streams/exp", bearerH(tok)), dial(t, addr, "/channels/exp", bearerH(tok))
	multi := dial(t, addr, "/streams?stream=exp&stream=exp2", bearerH(tok)) // as on one stream (docs/http.md)
	for _, c := range []*sseClient{stream, channel, multi} {
		require.Equal(t, 200, c.Status, c.Body)
		assert.Regexp(t, `\nretry: \d+\n:token expired\n\n$`, c.rawUntilEOF(8*time.Second))
	}
}
