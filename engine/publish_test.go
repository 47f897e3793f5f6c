package engine

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

// docs/http.md, Publishing over HTTP: POST /streams/{stream} publishes one event; the answer
// comes after COMMIT and names its id; subscribers get it like any pgsse.publish.
func TestPublishOneEvent(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	sub := dial(t, addr, "/streams/orders/42", bearerH(allStreams(t, "user:7")))
	require.Equal(t, 200, sub.Status, sub.Body)
	c := dialPub(t, addr)
	authz := bearerH(publishToken(t, "orders/*"))

	p := decodePublished(t, c.do(post("/streams/orders/42", `{"total":3}`, authz, "Content-Type: application/json")))
	assert.Equal(t, "orders/42", p.Stream)
	require.NotNil(t, p.ID)
	assert.Equal(t, int64(1), *p.ID)
	// The answer came after COMMIT: the row is there now.
	assert.Equal(t, `{"total":3}`, pgtest.QueryValue(t, ts.DSN, "SELECT data FROM pgsse.events WHERE stream = 'orders/42' AND id = 1"))
	assert.Equal(t, sseEvent{HasID: true, IDValue: "1", Data: `{"total":3}`}, sub.mustNextData(10*time.Second))

	// event= and audience=, any Content-Type but multipart, a body with line breaks.
	p = decodePublished(t, c.do(post("/streams/orders/42?event=created&audience=user:7&audience=role%3Aadmin", "a\nb", authz, "Content-Type: text/plain")))
	assert.Equal(t, int64(2), *p.ID)
	assert.Equal(t, sseEvent{HasID: true, IDValue: "2", Event: "created", Data: "a\nb"}, sub.mustNextData(10*time.Second))
	assert.Equal(t, "{user:7,role:admin}", pgtest.QueryValue(t, ts.DSN, "SELECT audience::text FROM pgsse.events WHERE stream = 'orders/42' AND id = 2"))

	// An empty body is an empty event; no Content-Type at all is fine.
	p = decodePublished(t, c.do(post("/streams/orders/42", "", authz)))
	assert.Equal(t, int64(3), *p.ID)

	// ephemeral=1 is a broadcast: no id, nothing stored, delivered without id:.
	r := c.do(post("/streams/orders/42?ephemeral=1", "typing", authz))
	require.Equal(t, 200, r.Status, r.Body)
	assert.Equal(t, `{"stream":"orders/42"}`, r.Body)
	assert.Equal(t, "3", pgtest.QueryValue(t, ts.DSN, "SELECT count(*) FROM pgsse.events"))
	ev := sub.mustNextData(10 * time.Second)
	assert.Equal(t, "3", ev.IDValue) // the empty event
	ev = sub.mustNextData(10 * time.Second)
	assert.Equal(t, sseEvent{Data: "typing"}, ev)

	// Chunked bodies.
	p = decodePublished(t, c.do(postChunked("/streams/orders/42", []string{"chu", "nk", "ed"}, authz)))
	assert.Equal(t, int64(4), *p.ID)
	assert.Equal(t, "chunked", sub.mustNextData(10*time.Second).Data)
	// Keep-alive all along: the same connection served every request.
	assert.Equal(t, "keep-alive", r.Header.Get("Connection"))
}

// docs/http.md, Publishing over HTTP: POST /publish is an NDJSON batch, all or nothing in one
// transaction; the answer lists the ids in line order, null for ephemeral lines.
func TestPublishBatch(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	sub := dial(t, addr, "/streams/b/1", bearerH(allStreams(t)))
	require.Equal(t, 200, sub.Status, sub.Body)
	c := dialPub(t, addr)
	authz := bearerH(publishToken(t, "b/*"))
	nd := "Content-Type: application/x-ndjson"

	batch := `{"stream":"b/1","data":"one"}
{"stream":"b/2","data":{"x":1},"event":"e"}
{"stream":"b/1","data":"eph","ephemeral":true}
{"stream":"b/1","data":"two","audience":["user:7"]}
`
	assert.Equal(t, []int64{1, 1, 0, 2}, decodeIDs(t, c.do(post("/publish", batch, authz, nd))))
	// Id 2 is for user:7 only. Two durable events of b/1 in one transaction travel as a
	// wake (read from the table), so the ephemeral one may overtake them.
	assert.ElementsMatch(t, []sseEvent{{HasID: true, IDValue: "1", Data: "one"}, {Data: "eph"}},
		[]sseEvent{sub.mustNextData(10 * time.Second), sub.mustNextData(10 * time.Second)})
	assert.Equal(t, `{"x":1}`, pgtest.QueryValue(t, ts.DSN, "SELECT data FROM pgsse.events WHERE stream = 'b/2'"))

	// One bad line: 400 naming the line and the field; nothing is stored or delivered.
	bad := `{"stream":"b/1","data":"x"}
{"stream":"b/1","data":"y","event":"no spaces"}
`
	r := c.do(post("/publish", bad, authz, nd))
	require.Equal(t, 400, r.Status, r.Body)
	assertErrorBody(t, r)
	assert.Contains(t, r.Body, `line 2, field "event"`)
	r = c.do(post("/publish", `{"stream":"b/1","data":"x"}`+"\n"+`{"stream":"b/1"}`, authz, nd))
	require.Equal(t, 400, r.Status, r.Body)
	assert.Contains(t, r.Body, `line 2, field "data"`)
	r = c.do(post("/publish", "{\"stream\":\"b/1\",\"data\":\"x\"}\nnot json\n", authz, nd))
	require.Equal(t, 400, r.Status, r.Body)
	assert.Contains(t, r.Body, "line 2")
	// A line whose stream the token does not grant: 403 naming the line.
	r = c.do(post("/publish", `{"stream":"b/1","data":"x"}`+"\n"+`{"stream":"other","data":"y"}`, authz, nd))
	require.Equal(t, 403, r.Status, r.Body)
	assert.Contains(t, r.Body, "line 2")
	assert.Equal(t, "3", pgtest.QueryValue(t, ts.DSN, "SELECT count(*) FROM pgsse.events"))
	sub.expectSilence(300 * time.Millisecond)

	// The connection stayed usable after the refusals.
	assert.Equal(t, []int64{2}, decodeIDs(t, c.do(post("/publish", `{"stream":"b/2","data":"z"}`, authz, nd))))

	// More than 1,000 lines.
	var many strings.Builder
	for range 1001 {
		many.WriteString(`{"stream":"b/1","data":"x"}` + "\n")
	}
	r = c.do(post("/publish", many.String(), authz, nd))
	require.Equal(t, 400, r.Status, r.Body)
	assert.Contains(t, r.Body, "1000")
	// Not NDJSON.
	r = exchange(t, addr, "POST", post("/publish", `{"stream":"b/1","data":"x"}`, authz, "Content-Type: application/json"))
	assert.Equal(t, 415, r.Status, r.Body)
}

// docs/http.md, Publishing over HTTP (authorization): a publish grant; subscribe grants do not
// allow publishing and publish grants do not allow subscribing.
func TestPublishAuthorization(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", func(c *Config) { c.PublicStreams = []string{"public/*"} })
	addr := ts.Addr().String()
	pubTok := publishToken(t, "p/*", "public/*")
	expired, err := auth.Mint(auth.MintKey{Secret: []byte(testSecret)}, auth.Claims{Publish: []string{"p/*"}}, time.Hour, "", "", time.Now().Add(-2*time.Hour))
	require.NoError(t, err)
	subTok := allStreams(t)
	cases := []struct {
		name    string
		target  string
		headers []string
		status  int
	}{
		{"no token", "/streams/p/1", nil, 401},
		{"no token on a public stream", "/streams/public/1", nil, 401},
		{"bad token", "/streams/p/1", []string{bearerH("bad.token.value")}, 401},
		{"expired token", "/streams/p/1", []string{bearerH(expired)}, 401},
		{"subscribe grant only", "/streams/p/1", []string{bearerH(subTok)}, 403},
		{"publish grant elsewhere", "/streams/q/1", []string{bearerH(pubTok)}, 403},
		{"granted", "/streams/p/1", []string{bearerH(pubTok)}, 200},
		{"granted, public stream", "/streams/public/1", []string{bearerH(pubTok)}, 200},
		{"token in the query", "/streams/p/1?token=" + pubTok, nil, 200},
		{"token in the cookie", "/streams/p/1", []string{"Cookie: pgsse_token=" + pubTok}, 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dialPub(t, addr)
			r := c.do(post(tc.target, "x", tc.headers...))
			require.Equal(t, tc.status, r.Status, r.Body)
			if tc.status == 401 {
				assert.Contains(t, r.Header.Get("WWW-Authenticate"), "Bearer")
			}
			if tc.status != 200 {
				assertErrorBody(t, r)
				// A refusal after the body was read keeps the connection.
				assert.Equal(t, 200, c.do(post("/streams/p/1", "after", bearerH(pubTok))).Status)
			}
		})
	}
	// A publish grant does not allow subscribing.
	r := get(t, addr, "/streams/p/1", bearerH(pubTok))
	assert.Equal(t, 403, r.Status, r.Body)
}

// TestPublishCookieCrossSite: a browser attaches the pgsse_token cookie to a POST from any
// site, so a publish authorised by the cookie alone must come from the same origin or one of
// --cors-origins (docs/http.md: the publisher's token is taken like a subscriber's, cookie
// included; Mercure refuses such cross-site publishes the same way). Before the fix any web page could publish as a visitor
// holding a publish cookie.
func TestPublishCookieCrossSite(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", func(c *Config) { c.CORSOrigins = []string{"https://app.example"} })
	addr := ts.Addr().String()
	tok := publishToken(t, "csrf/*")
	cookie := "Cookie: pgsse_token=" + tok
	cases := []struct {
		name    string
		headers []string
		status  int
	}{
		{"cookie from another site", []string{cookie, "Origin: https://evil.example"}, 403},
		{"cookie from an opaque origin", []string{cookie, "Origin: null"}, 403},
		{"cookie from an allowed origin", []string{cookie, "Origin: https://app.example"}, 200},
		{"cookie from the same origin", []string{cookie, "Origin: http://pgsse.test"}, 200},
		{"cookie without Origin (not a browser)", []string{cookie}, 200},
		{"bearer from another site", []string{bearerH(tok), "Origin: https://evil.example"}, 200},
	}
	published := 0
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dialPub(t, addr)
			r := c.do(post("/streams/csrf/1", "x", tc.headers...))
			require.Equal(t, tc.status, r.Status, r.Body)
			if tc.status == 200 {
				published++
			} else {
				assertErrorBody(t, r)
				assert.Contains(t, r.Body, "--cors-origins")
			}
		})
	}
	assert.Equal(t, strconv.Itoa(published), pgtest.QueryValue(t, ts.DSN, "SELECT count(*) FROM pgsse.events WHERE stream = 'csrf/1'"),
		"a refused publish stored nothing")
}

// docs/http.md, Publishing over HTTP (errors): each one line naming what was wrong.
func TestPublishErrors(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", func(c *Config) { c.MaxPublishBytes = 1000 })
	addr := ts.Addr().String()
	authz := bearerH(publishToken(t, "*"))
	cases := []struct {
		name   string
		raw    string
		status int
		says   string
	}{
		{"bad stream name", post("/streams/a%20b", "x", authz), 400, `field "stream"`},
		{"bad event name", post("/streams/s?event=a/b", "x", authz), 400, `field "event"`},
		{"empty event name", post("/streams/s?event=", "x", authz), 400, `field "event"`},
		{"bad audience tag", post("/streams/s?audience=a%01", "x", authz), 400, `field "audience"`},
		{"bad ephemeral", post("/streams/s?ephemeral=yes", "x", authz), 400, "ephemeral"},
		{"data not UTF-8", post("/streams/s", "a\xffb", authz), 400, `field "data"`},
		{"no length", request("POST", "/streams/s", authz), 411, "Content-Length"},
		{"body over --max-publish-bytes", post("/streams/s", strings.Repeat("x", 1001), authz), 413, "1000"},
		{"chunked body over --max-publish-bytes", postChunked("/streams/s", []string{strings.Repeat("x", 600), strings.Repeat("x", 600)}, authz), 413, "1000"},
		{"multipart", post("/streams/s", "x", authz, "Content-Type: multipart/form-data; boundary=x"), 415, "multipart"},
		{"bad chunk", request("POST", "/streams/s", authz, "Transfer-Encoding: chunked") + "zz\r\n", 400, "chunk"},
		{"both lengths", request("POST", "/streams/s", authz, "Transfer-Encoding: chunked", "Content-Length: 3") + "abc", 400, "both"},
		{"PUT on a stream", request("PUT", "/streams/s", authz), 405, "GET or POST"},
		{"GET /publish", request("GET", "/publish", authz), 405, "POST"},
		{"POST on a channel", post("/channels/c", "x", authz), 405, "GET"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := exchange(t, addr, "POST", tc.raw)
			require.Equal(t, tc.status, r.Status, r.Body)
			assertErrorBody(t, r)
			assert.Contains(t, r.Body, tc.says)
			switch tc.name {
			case "PUT on a stream":
				assert.Equal(t, "GET, POST, OPTIONS", r.Header.Get("Allow"))
			case "GET /publish":
				assert.Equal(t, "POST, OPTIONS", r.Header.Get("Allow"))
			case "POST on a channel":
				assert.Equal(t, "GET, OPTIONS", r.Header.Get("Allow"))
			}
		})
	}
	// pgsse.max_event_bytes: 413 naming the limit.
	pgtest.Exec(t, ts.DSN, "ALTER DATABASE "+pgtest.QueryValue(t, ts.DSN, "SELECT current_database()")+" SET pgsse.max_event_bytes = 10")
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := exchange(t, addr, "POST", post("/streams/s", strings.Repeat("y", 11), authz))
		if r.Status == 413 {
			assert.Contains(t, r.Body, "pgsse.max_event_bytes")
			break
		}
		require.Equal(t, 200, r.Status, r.Body)
		require.True(t, time.Now().Before(deadline), "the Publisher did not pick up pgsse.max_event_bytes")
		time.Sleep(200 * time.Millisecond) // the Publisher re-reads the setting every 5 s
	}
	before := pgtest.QueryValue(t, ts.DSN, "SELECT count(*) FROM pgsse.events")
	assert.Equal(t, 413, exchange(t, addr, "POST", post("/streams/s", strings.Repeat("y", 11), authz)).Status)
	assert.Equal(t, 200, exchange(t, addr, "POST", post("/streams/s", strings.Repeat("y", 10), authz)).Status)
	assert.Equal(t, before, pgtest.QueryValue(t, ts.DSN, "SELECT count(*) - 1 FROM pgsse.events"), "the 413s stored nothing")
}
