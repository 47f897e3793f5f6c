package engine

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/auth"
)

// docs/http.md, Authorization: header, else ?token=, else cookie pgsse_token.
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

// docs/http.md, Authorization: a stream closes (retry + close, as at shutdown) when its token's
// exp passes.
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

// docs/http.md, Authorization (token contents): a token whose tags or grants break the name rules
// is refused with 401 naming the claim; a tag holding NUL (which made every replay read fail in
// PostgreSQL, issue 11) never reaches a replay query.
func TestSSETokenContentsRules(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", func(c *Config) { c.PublicStreams = []string{"open/*"} })
	addr := ts.Addr().String()
	// Minted by hand: auth.Mint refuses to sign such claims.
	bad := func(pgsseClaim string) string {
		return signHS256(t, `{"exp":`+strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)+`,"pgsse":`+pgsseClaim+`}`)
	}
	cases := []struct{ claim, body string }{
		{`{"streams":["*"],"tags":["ok","a\u0000b"]}`, "token claim pgsse.tags[1]: audience tag must not contain control characters\n"},
		{`{"streams":["a b"]}`, "token claim pgsse.streams[0]: stream name may contain only A-Z a-z 0-9 and . _ : @ / = + ~ -\n"},
		{`{"channels":["x\u0000"]}`, "token claim pgsse.channels[0]: channel name must not contain a NUL byte\n"},
	}
	for _, tc := range cases {
		r := get(t, addr, "/streams/s?since=0", bearerH(bad(tc.claim)))
		assert.Equal(t, 401, r.Status, tc.claim)
		assert.Equal(t, tc.body, r.Body, tc.claim)
	}

	// On a public stream the same token is ignored: the connection is anonymous, and its
	// history reads work (events for everyone arrive; audience-only ones do not).
	pub := connect(t, ts.DSN)
	publish(t, pub, "open/x", "for everyone", "", nil)
	publish(t, pub, "open/x", "for ok only", "", []string{"ok"})
	publish(t, pub, "open/x", "for everyone again", "", nil)
	c := dial(t, addr, "/streams/open/x?since=0", bearerH(bad(cases[0].claim)))
	require.Equal(t, 200, c.Status, c.Body)
	assert.Equal(t, "for everyone", c.mustNextData(5*time.Second).Data)
	assert.Equal(t, "for everyone again", c.mustNextData(5*time.Second).Data)
}

// The public-stream token rule (auth.OnPublicStream): a token there only adds tags. An
// expired or forged one is ignored (anonymous, never closed at an exp); a valid one with
// tags sees its audience and ends at its exp; a valid one without tags adds nothing, so its
// exp does not end the connection either.
func TestSSEPublicStreamTokenRule(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", func(c *Config) { c.PublicStreams = []string{"pub"} })
	addr := ts.Addr().String()
	pub := connect(t, ts.DSN)
	mint := func(tags []string, ttl time.Duration, at time.Time) string {
		tok, err := auth.Mint(auth.MintKey{Secret: []byte(testSecret)}, auth.Claims{Tags: tags}, ttl, "", "", at)
		require.NoError(t, err)
		return tok
	}
	now := time.Now()
	expired := mint([]string{"vip"}, time.Second, now.Add(-time.Hour))
	tagged := mint([]string{"vip"}, 2*time.Second, now)
	untagged := mint(nil, 2*time.Second, now)

	cExpired := dial(t, addr, "/streams/pub", bearerH(expired))
	cTagged := dial(t, addr, "/streams/pub", bearerH(tagged))
	cUntagged := dial(t, addr, "/streams/pub", bearerH(untagged))
	for _, c := range []*sseClient{cExpired, cTagged, cUntagged} {
		require.Equal(t, 200, c.Status, c.Body)
		c.mustNext(5 * time.Second)
	}
	publish(t, pub, "pub", "vip news", "", []string{"vip"})
	publish(t, pub, "pub", "news", "", nil)
	assert.Equal(t, "vip news", cTagged.mustNextData(5*time.Second).Data, "a valid token's tags count")
	assert.Equal(t, "news", cTagged.mustNextData(5*time.Second).Data)
	assert.Equal(t, "news", cExpired.mustNextData(5*time.Second).Data, "an expired token is ignored: anonymous")
	assert.Equal(t, "news", cUntagged.mustNextData(5*time.Second).Data)

	cTagged.expectRetryEOF(10 * time.Second) // closed at exp: what it may see changes
	// The others outlive the tokens' exp (2 s): an event published after it reaches them.
	waitFor(t, 10*time.Second, "the tokens' exp to pass", func() bool { return time.Now().After(now.Add(3 * time.Second)) })
	publish(t, pub, "pub", "later", "", nil)
	assert.Equal(t, "later", cExpired.mustNextData(5*time.Second).Data)
	assert.Equal(t, "later", cUntagged.mustNextData(5*time.Second).Data)
}

// signHS256 signs a raw JWT payload with the test secret (for claims auth.Mint refuses).
func signHS256(t testing.TB, payload string) string {
	t.Helper()
	enc := base64.RawURLEncoding
	unsigned := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." + enc.EncodeToString([]byte(payload))
	mac := hmac.New(sha256.New, []byte(testSecret))
	mac.Write([]byte(unsigned))
	return unsigned + "." + enc.EncodeToString(mac.Sum(nil))
}

// A request whose Authorization header is not "Bearer <token>" — the token alone, as a new
// user pastes it, or another scheme — is told what the header must look like rather than
// that a token is required, which it believes it sent; without the header the line is as
// before. Subscribing and publishing alike.
func TestNoTokenNamesTheAuthorizationHeaderForm(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	good := token(t, auth.Claims{Streams: []string{"s"}}, time.Hour)
	const form = `the Authorization header must be "Bearer <token>"`
	for _, tc := range []struct {
		name    string
		headers []string
		sub     string // the subscriber's 401 line
		pub     string // the publisher's
	}{
		{"no header", nil, errNoToken, errNoPublishToken},
		{"the token alone", []string{"Authorization: " + good}, form, form},
		{"another scheme", []string{"Authorization: Basic dXNlcjpwYXNz"}, form, form},
		{"Bearer without a token", []string{"Authorization: Bearer "}, form, form},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := get(t, addr, "/streams/s", tc.headers...)
			require.Equal(t, 401, r.Status, r.Body)
			assert.Contains(t, r.Body, tc.sub)
			assert.Contains(t, r.Header.Get("WWW-Authenticate"), "Bearer")
			p := dialPub(t, addr).do(post("/streams/s", "x", tc.headers...))
			require.Equal(t, 401, p.Status, p.Body)
			assert.Contains(t, p.Body, tc.pub)
		})
	}
}

// The usual mistake behind a 403 — a publish token used to subscribe, a subscribe token used
// to publish — is named in the refusal, with the grant that is needed; a token that grants
// neither is refused as before. A token that is not a JWT at all is told what one looks like.
func TestNotGrantedNamesTheOtherKindOfGrant(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	pubOnly := token(t, auth.Claims{Publish: []string{"s"}}, time.Hour)
	subOnly := token(t, auth.Claims{Streams: []string{"s"}}, time.Hour)
	neither := token(t, auth.Claims{Streams: []string{"other"}, Publish: []string{"other"}}, time.Hour)

	r := get(t, addr, "/streams/s?token="+pubOnly)
	require.Equal(t, 403, r.Status, r.Body)
	assert.Contains(t, r.Body, `token does not grant stream s (it grants publishing to it, not subscribing: subscribing needs "streams" under "pgsse"`)
	r = get(t, addr, "/streams?stream=x&stream=s&token="+token(t, auth.Claims{Streams: []string{"x"}, Publish: []string{"s"}}, time.Hour))
	require.Equal(t, 403, r.Status, r.Body)
	assert.Contains(t, r.Body, `token does not grant stream s (stream[1]) (it grants publishing to it, not subscribing`)
	r = get(t, addr, "/streams/s?token="+neither)
	require.Equal(t, 403, r.Status, r.Body)
	assert.Equal(t, "token does not grant stream s", strings.TrimSpace(r.Body))

	p := dialPub(t, addr).do(post("/streams/s", "x", "Authorization: Bearer "+subOnly))
	require.Equal(t, 403, p.Status, p.Body)
	assert.Contains(t, p.Body, `token does not grant publishing to stream s (it grants subscribing to it, not publishing: publishing needs "publish" under "pgsse"`)
	p = dialPub(t, addr).do(post("/streams/s", "x", "Authorization: Bearer "+neither))
	require.Equal(t, 403, p.Status, p.Body)
	assert.Equal(t, "token does not grant publishing to stream s", strings.TrimSpace(p.Body))

	r = get(t, addr, "/streams/s?token=not-a-token")
	require.Equal(t, 401, r.Status, r.Body)
	assert.Contains(t, r.Body, "token is malformed: a JWT is three base64url parts, header.claims.signature")
}

// Several streams written as one path (/streams/a,b) are refused with the endpoint that
// follows several streams; a bad name without a comma is refused as before.
func TestCommaInStreamPathNamesTheMultiStreamEndpoint(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	tok := token(t, auth.Claims{Streams: []string{"*"}}, time.Hour)
	r := get(t, addr, "/streams/a,b?token="+tok)
	require.Equal(t, 400, r.Status, r.Body)
	assert.Contains(t, r.Body, "stream name may contain only")
	assert.Contains(t, r.Body, "(to follow several streams on one connection: /streams?stream=a&stream=b)")
	r = get(t, addr, "/streams/a%20b?token="+tok)
	require.Equal(t, 400, r.Status, r.Body)
	assert.NotContains(t, r.Body, "several streams")
}
