package engine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

// Issue 23 ("Smaller") and issue 26 ("What a new user tripped over"): the token, name and
// parser rules at the HTTP level, each against a real server on a real socket
// (strict_*_test.go). The rules themselves have table tests in names/, sse/, store/ and auth/.

func countEvents(t testing.TB, dsn, stream string) string {
	return pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.events WHERE stream = '"+stream+"'")
}

// TestStrictNameRulesBeforeGrants: SPEC §3a — a bad name is 400 naming the field (and the line
// of a batch), whatever the token grants. Before the fix a batch line with an invalid stream
// was refused 403 "token does not grant publishing to stream bad name": the grant was checked
// first.
func TestStrictNameRulesBeforeGrants(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	pub := bearerH(publishToken(t, "ok/*"))
	sub := bearerH(token(t, auth.Claims{Streams: []string{"ok/*"}}, time.Hour))
	ndjson := "Content-Type: application/x-ndjson"
	cases := []struct {
		name   string
		method string
		raw    string
		says   string
	}{
		{"batch: bad stream on line 2", "POST", post("/publish", `{"stream":"ok/1","data":"x"}`+"\n"+`{"stream":"bad name","data":"y"}`, pub, ndjson),
			`line 2, field "stream": stream name may contain only`},
		{"batch: bad event on a stream not granted", "POST", post("/publish", `{"stream":"no/1","data":"x","event":"a b"}`, pub, ndjson),
			`line 1, field "event": event name may contain only`},
		{"batch: bad tag on a stream not granted", "POST", post("/publish", `{"stream":"no/1","data":"x","audience":["a\u0001"]}`, pub, ndjson),
			`line 1, field "audience": audience tag must not contain control characters`},
		{"batch: bad stream after a line not granted", "POST", post("/publish", `{"stream":"no/1","data":"x"}`+"\n"+`{"stream":"","data":"y"}`, pub, ndjson),
			`line 2, field "stream": stream name must be 1-200 bytes`},
		{"one event: bad stream", "POST", post("/streams/bad%20name", "x", pub), `field "stream"`},
		{"subscription: bad stream", "GET", request("GET", "/streams/bad%20name", sub), "stream name may contain only"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := exchange(t, addr, tc.method, tc.raw)
			require.Equal(t, 400, r.Status, r.Body)
			assertErrorBody(t, r)
			assert.Contains(t, r.Body, tc.says)
		})
	}
	assert.Equal(t, "0", pgtest.QueryValue(t, ts.DSN, "SELECT count(*) FROM pgsse.events"), "nothing was published")
}

// TestStrictReservedEventNames: SPEC §2 reserves event names starting with pgsse: for pgsse's
// own events. Before the fix ?event=pgsse:gap was published and delivered as a durable event,
// so a publisher could make a client believe it had missed events (or show it a fake
// presence list).
func TestStrictReservedEventNames(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	pub := bearerH(publishToken(t, "*"))
	ndjson := "Content-Type: application/x-ndjson"
	const rule = "event names starting with pgsse: are reserved"
	for _, tc := range []struct {
		name string
		raw  string
		says string
	}{
		{"?event=pgsse:gap", post("/streams/res/1?event=pgsse:gap", `{"stream":"res/1","after":0,"resume":9}`, pub), `field "event": ` + rule},
		{"?event=pgsse:presence", post("/streams/res/1?event=pgsse%3Apresence", "x", pub), `field "event": ` + rule},
		{"ephemeral ?event=pgsse:", post("/streams/res/1?event=pgsse:&ephemeral=1", "x", pub), `field "event": ` + rule},
		{"batch event pgsse:gap", post("/publish", `{"stream":"res/1","data":"x"}`+"\n"+`{"stream":"res/1","data":"x","event":"pgsse:gap"}`, pub, ndjson),
			`line 2, field "event": ` + rule},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := exchange(t, addr, "POST", tc.raw)
			require.Equal(t, 400, r.Status, r.Body)
			assertErrorBody(t, r)
			assert.Contains(t, r.Body, tc.says)
		})
	}
	assert.Equal(t, "0", countEvents(t, ts.DSN, "res/1"), "nothing was published")
	// Only the prefix is reserved.
	for _, ev := range []string{"pgsse", "pgsse.gap", "my:pgsse:gap", "PGSSE:gap"} {
		r := exchange(t, addr, "POST", post("/streams/res/2?event="+ev, "x", pub))
		assert.Equal(t, 200, r.Status, "event %q: %s", ev, r.Body)
	}
}

// TestStrictLoneSurrogates: SPEC §3a — data is UTF-8 text, and a JSON string holding a lone
// surrogate escape is not. Before the fix "\ud800" in a batch line was stored as U+FFFD
// without a word.
func TestStrictLoneSurrogates(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	pub := bearerH(publishToken(t, "*"))
	ndjson := "Content-Type: application/x-ndjson"
	for _, tc := range []struct {
		name, body, says string
	}{
		{"lone high surrogate in data", `{"stream":"sur/1","data":"ok"}` + "\n" + `{"stream":"sur/1","data":"a\ud800b"}`, `line 2, field "data"`},
		{"lone low surrogate in data", `{"stream":"sur/1","data":"\udc00"}`, `line 1, field "data"`},
		{"reversed pair", `{"stream":"sur/1","data":"\udc00\ud800"}`, `line 1, field "data"`},
		{"inside a JSON data value", `{"stream":"sur/1","data":{"text":"\ud83d"}}`, `line 1, field "data"`},
		{"in an audience tag", `{"stream":"sur/1","data":"x","audience":["\udfff"]}`, `line 1, field "audience"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := exchange(t, addr, "POST", post("/publish", tc.body, pub, ndjson))
			require.Equal(t, 400, r.Status, r.Body)
			assertErrorBody(t, r)
			assert.Contains(t, r.Body, tc.says)
			assert.Contains(t, r.Body, "surrogate")
		})
	}
	assert.Equal(t, "0", countEvents(t, ts.DSN, "sur/1"), "nothing was published")
	// A proper pair is a character.
	r := exchange(t, addr, "POST", post("/publish", `{"stream":"sur/2","data":"\ud83d\udc18"}`, pub, ndjson))
	require.Equal(t, 200, r.Status, r.Body)
	assert.Equal(t, "🐘", pgtest.QueryValue(t, ts.DSN, "SELECT data FROM pgsse.events WHERE stream = 'sur/2'"))
}
