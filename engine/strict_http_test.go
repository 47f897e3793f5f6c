package engine

import (
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/auth"
)

// TestStrictBodyOnOtherMethods: SPEC §3 — another method on a stream path is 405 with
// Allow: GET, POST, OPTIONS, with or without a body. Before the fix a PUT or PATCH carrying
// a body was answered 400. A body the server does not read ends the connection (Connection:
// close): nothing in it may be taken for a request (no smuggling).
func TestStrictBodyOnOtherMethods(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	pub := bearerH(publishToken(t, "*"))
	// A body that is itself a publish request: if it were read as the next request, it would
	// publish to smuggled/1.
	smuggled := post("/streams/smuggled/1", "pwned", pub)
	withLength := func(method, target, body string) string {
		return request(method, target, pub, "Content-Length: "+strconv.Itoa(len(body))) + body
	}
	withChunks := func(method, target, body string) string {
		return request(method, target, pub, "Transfer-Encoding: chunked") +
			strconv.FormatInt(int64(len(body)), 16) + "\r\n" + body + "\r\n0\r\n\r\n"
	}
	cases := []struct {
		name   string
		raw    string
		status int
		allow  string
	}{
		{"PUT with a body on a stream", withLength("PUT", "/streams/s", smuggled), 405, "GET, POST, OPTIONS"},
		{"PATCH with a chunked body on a stream", withChunks("PATCH", "/streams/s", smuggled), 405, "GET, POST, OPTIONS"},
		{"DELETE with a body on a stream", withLength("DELETE", "/streams/s", "x"), 405, "GET, POST, OPTIONS"},
		{"PUT with a body on /publish", withLength("PUT", "/publish", smuggled), 405, "POST, OPTIONS"},
		{"PUT with a body on a channel", withLength("PUT", "/channels/c", smuggled), 405, "GET, OPTIONS"},
		{"PUT with a body elsewhere", withLength("PUT", "/elsewhere", smuggled), 404, ""},
		{"PUT without a body", request("PUT", "/streams/s", pub), 405, "GET, POST, OPTIONS"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dialPub(t, addr)
			r := c.do(tc.raw)
			require.Equal(t, tc.status, r.Status, r.Body)
			assertErrorBody(t, r)
			assert.True(t, r.Close, "Connection: close")
			if tc.allow != "" {
				assert.Equal(t, tc.allow, r.Header.Get("Allow"))
			}
			c.expectEOF()
		})
	}
	// A body larger than what the server has read when it answers: the answer still arrives
	// (the connection lingers rather than resetting), and the rest of the body is dropped —
	// whether the method is one we do not implement (405) or one that takes no body (400).
	for _, tc := range []struct {
		method, target string
		status         int
	}{{"PUT", "/streams/s", 405}, {"GET", "/streams/s", 400}, {"OPTIONS", "/streams/s", 400},
		{"POST", "/channels/c", 405}, {"POST", "/elsewhere", 404}} {
		t.Run("large body still arriving: "+tc.method+" "+tc.target, func(t *testing.T) {
			c := dialPub(t, addr)
			body := strings.Repeat("x", 4<<20)
			c.send(request(tc.method, tc.target, pub, "Content-Length: "+strconv.Itoa(len(body))) + body[:1000])
			r := c.read()
			require.Equal(t, tc.status, r.Status, r.Body)
			assert.True(t, r.Close, "Connection: close")
			// The rest of the body is taken and dropped (no reset while the client still sends).
			_ = c.conn.SetWriteDeadline(time.Now().Add(15 * time.Second))
			_, err := c.conn.Write([]byte(body[1000:]))
			require.NoError(t, err, "the server reset the connection while the body was arriving")
			c.expectEOF()
		})
	}
	assert.Equal(t, "0", countEvents(t, ts.DSN, "smuggled/1"), "no body was read as a request")
}

// TestStrictCookieSecFetchSite: docs/http.md — a publish authorised only by the pgsse_token
// cookie must come from the same origin or one of --cors-origins. A browser that sends no
// Origin still says where the request comes from in Sec-Fetch-Site; before the fix a
// cookie-only publish with Sec-Fetch-Site: cross-site and no Origin was accepted.
func TestStrictCookieSecFetchSite(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	tok := publishToken(t, "fetch/*")
	cookie := "Cookie: pgsse_token=" + tok
	cases := []struct {
		name    string
		headers []string
		status  int
	}{
		{"cookie, cross-site, no Origin", []string{cookie, "Sec-Fetch-Site: cross-site"}, 403},
		{"cookie, an unknown Sec-Fetch-Site, no Origin", []string{cookie, "Sec-Fetch-Site: elsewhere"}, 403},
		{"cookie, same-origin, no Origin", []string{cookie, "Sec-Fetch-Site: same-origin"}, 200},
		{"cookie, same-site, no Origin", []string{cookie, "Sec-Fetch-Site: same-site"}, 200},
		{"cookie, none (typed by the user), no Origin", []string{cookie, "Sec-Fetch-Site: none"}, 200},
		{"cookie, no Sec-Fetch-Site (not a browser)", []string{cookie}, 200},
		{"bearer, cross-site", []string{bearerH(tok), "Sec-Fetch-Site: cross-site"}, 200},
		{"cookie, cross-site, same Origin", []string{cookie, "Sec-Fetch-Site: cross-site", "Origin: http://pgsse.test"}, 200},
	}
	published := 0
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dialPub(t, addr)
			r := c.do(post("/streams/fetch/1", "x", tc.headers...))
			require.Equal(t, tc.status, r.Status, r.Body)
			if tc.status == 200 {
				published++
				return
			}
			assertErrorBody(t, r)
			assert.Contains(t, r.Body, "Sec-Fetch-Site")
		})
	}
	assert.Equal(t, strconv.Itoa(published), countEvents(t, ts.DSN, "fetch/1"), "a refused publish stored nothing")
}

// TestStrictLeadingEmptyLines: RFC 9112 §2.2 — a server SHOULD ignore at least one empty line
// received before the request line (clients that end a POST body with an extra CRLF). Before
// the fix such a request was refused 400 and its keep-alive connection closed.
func TestStrictLeadingEmptyLines(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	pub := bearerH(publishToken(t, "blank/*"))
	c := dialPub(t, addr)
	first := decodePublished(t, c.do(post("/streams/blank/1", "one", pub)))
	// The extra CRLF after the body, then the next request.
	second := decodePublished(t, c.do("\r\n"+post("/streams/blank/1", "two", pub)))
	require.NotNil(t, first.ID)
	require.NotNil(t, second.ID)
	assert.Equal(t, *first.ID+1, *second.ID)
	// Several, and bare LFs.
	third := decodePublished(t, c.do("\r\n\n\r\n"+post("/streams/blank/1", "three", pub)))
	assert.Equal(t, *second.ID+1, *third.ID)
	// The extra CRLF alone, with the next request later: the connection stays idle between
	// requests (the keep-alive timeout, 30 s), rather than waiting for a request head (10 s).
	c.send("\r\n")
	waitFor(t, 10*time.Second, "the empty line to be read", func() bool {
		idle := false
		ts.onLoop(t, func() {
			for _, sc := range ts.conns.list {
				idle = idle || sc.state == stateIdle && sc.c.InboundBuffered() == 0
			}
		})
		return idle
	})
	var heads int
	ts.onLoop(t, func() {
		for _, sc := range ts.conns.list {
			if sc.state == stateHead {
				heads++
			}
		}
	})
	assert.Zero(t, heads, "a connection waits for a request head after an empty line")
	fourth := decodePublished(t, c.do(post("/streams/blank/1", "four", pub)))
	assert.Equal(t, *third.ID+1, *fourth.ID)

	// A subscription after an empty line.
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	_, err = conn.Write([]byte("\r\n" + request("GET", "/streams/blank/1?since=0", bearerH(token(t, auth.Claims{Streams: []string{"blank/*"}}, time.Hour)))))
	require.NoError(t, err)
	buf := make([]byte, 4096)
	var got string
	for !strings.Contains(got, "data: four") {
		n, err := conn.Read(buf)
		require.NoError(t, err, "read so far: %q", got)
		got += string(buf[:n])
	}
	assert.True(t, strings.HasPrefix(got, "HTTP/1.1 200 OK\r\n"), got)

	// The skipping is bounded: a flood of empty lines is a bad request.
	r := exchange(t, addr, "POST", strings.Repeat("\r\n", 100)+post("/streams/blank/1", "x", pub))
	assert.Equal(t, 400, r.Status, r.Body)
	assert.Contains(t, r.Body, "empty lines")
}
