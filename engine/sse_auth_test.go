package engine

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/auth"
)

// SPEC §3 Authorization: header, else ?token=, else cookie pgsse_token.
func TestSSETokenSources(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	good := token(t, auth.Claims{Streams: []string{"s"}}, time.Hour)
	wrong := token(t, auth.Claims{Streams: []string{"other"}}, time.Hour) // valid, no grant
	bad := "bad.token.value"

	cases := []struct {
		name    string
		query   string
		headers []string
		status  int
	}{
		{"header", "", []string{bearerH(good)}, 200},
		{"header lower-case scheme", "", []string{"Authorization: bearer " + good}, 200},
		{"query", "?token=" + good, nil, 200},
		{"query with since", "?since=0&token=" + good, nil, 200},
		{"cookie", "", []string{"Cookie: pgsse_token=" + good}, 200},
		{"cookie among others", "", []string{"Cookie: a=b; pgsse_token=" + good + "; c=d"}, 200},
		{"cookie of another name", "", []string{"Cookie: xpgsse_token=" + good}, 401},
		// header > query > cookie
		{"header wins over query (bad header)", "?token=" + good, []string{bearerH(bad)}, 401},
		{"header wins over query (good header)", "?token=" + bad, []string{bearerH(good)}, 200},
		{"header wins over query (grant)", "?token=" + good, []string{bearerH(wrong)}, 403},
		{"header wins over cookie", "", []string{bearerH(good), "Cookie: pgsse_token=" + bad}, 200},
		{"header wins over cookie (bad header)", "", []string{bearerH(bad), "Cookie: pgsse_token=" + good}, 401},
		{"query wins over cookie (good query)", "?token=" + good, []string{"Cookie: pgsse_token=" + bad}, 200},
		{"query wins over cookie (bad query)", "?token=" + bad, []string{"Cookie: pgsse_token=" + good}, 401},
		{"query wins over cookie (grant)", "?token=" + wrong, []string{"Cookie: pgsse_token=" + good}, 403},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.status == 200 {
				c := dial(t, addr, "/streams/s"+tc.query, tc.headers...)
				require.Equal(t, 200, c.Status, c.Body)
				assert.Equal(t, "2000", c.mustNext(5*time.Second).Retry)
				return
			}
			r := get(t, addr, "/streams/s"+tc.query, tc.headers...)
			require.Equal(t, tc.status, r.Status, r.Body)
			if tc.status == 401 {
				assert.Contains(t, r.Header.Get("WWW-Authenticate"), "Bearer")
			}
		})
	}
}

func TestSSEPublicStreams(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", func(c *Config) { c.PublicStreams = []string{"news", "public/*"} })
	addr := ts.Addr().String()
	pub := connect(t, ts.DSN)

	for _, s := range []string{"news", "public/a", "public/b/c"} {
		c := dial(t, addr, "/streams/"+s)
		require.Equal(t, 200, c.Status, "%s: %s", s, c.Body)
		id := publish(t, pub, s, "hello "+s, "", nil)
		ev := c.mustNextData(5 * time.Second)
		assert.Equal(t, sseEvent{HasID: true, IDValue: strconv.FormatInt(id, 10), Data: "hello " + s}, ev)
	}
	for _, s := range []string{"newsx", "publicx", "other"} {
		r := get(t, addr, "/streams/"+s)
		assert.Equal(t, 401, r.Status, "%s is not public: %s", s, r.Body)
	}
	// Public streams do not open raw channels.
	r := get(t, addr, "/channels/news")
	assert.Equal(t, 401, r.Status, r.Body)
}

// SPEC §3: a stream closes (retry + close, as at shutdown) when its token's exp passes.
func TestSSETokenExpiryCloses(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", func(c *Config) { c.Retry = 1234 * time.Millisecond })
	addr := ts.Addr().String()
	pub := connect(t, ts.DSN)
	// Both connections share one token and are read after it expired; subtests are not
	// parallel so that nothing delays the dial past exp.
	now := time.Now()
	tok, err := auth.Mint(auth.MintKey{Secret: []byte(testSecret)}, auth.Claims{Streams: []string{"*"}, Channels: []string{"*"}}, 2*time.Second, "", "", now)
	require.NoError(t, err)
	exp := now.Add(2 * time.Second).Truncate(time.Second) // JWT exp has second precision
	stream := dial(t, addr, "/streams/exp", bearerH(tok))
	channel := dial(t, addr, "/channels/exp", bearerH(tok))
	require.Equal(t, 200, stream.Status, stream.Body)
	require.Equal(t, 200, channel.Status, channel.Body)
	for _, c := range []*sseClient{stream, channel} {
		assert.Equal(t, "1234", c.mustNext(5*time.Second).Retry)
	}
	publish(t, pub, "exp", "before expiry", "", nil)
	assert.Equal(t, "before expiry", stream.mustNextData(5*time.Second).Data)

	retry := stream.expectRetryEOF(6 * time.Second)
	closedAt := time.Now()
	assertJitteredRetry(t, retry)
	assert.False(t, closedAt.Before(exp), "closed at %v, before exp %v", closedAt, exp)
	assert.Less(t, closedAt.Sub(exp), 2*time.Second, "closed promptly after exp")
	assertJitteredRetry(t, channel.expectRetryEOF(3*time.Second))

	// A fresh request with the expired token is refused.
	r := get(t, addr, "/streams/exp", bearerH(tok))
	assert.Equal(t, 401, r.Status)
}
