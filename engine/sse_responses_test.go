package engine

import (
	"bufio"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/auth"
)

// One test per row of docs/http.md's status table, against a real server and raw TCP.

func TestSSEResponse200(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", func(c *Config) {
		c.CORSOrigins = []string{"https://app.example", "https://other.example"}
	})
	addr := ts.Addr().String()
	tok := token(t, auth.Claims{Streams: []string{"orders/*"}}, time.Hour)

	t.Run("headers and first bytes", func(t *testing.T) {
		c := dial(t, addr, "/streams/orders/1", bearerH(tok))
		require.Equal(t, 200, c.Status, c.Body)
		assert.Equal(t, []string{"text/event-stream; charset=utf-8"}, c.Header.Values("Content-Type"))
		assert.Equal(t, []string{"no-cache, no-store"}, c.Header.Values("Cache-Control"))
		assert.Equal(t, []string{"no"}, c.Header.Values("X-Accel-Buffering"))
		assert.Empty(t, c.Header.Get("Access-Control-Allow-Origin"), "no CORS headers without Origin")
		assert.Empty(t, c.Header.Get("Content-Length"), "an event stream has no length")
		// docs/http.md, The response body: first `retry: <ms>` (exactly --retry) and a comment,
		// flushed at once.
		blk, err := c.readBlock(2 * time.Second)
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSuffix(blk, "\n"), "\n")
		require.GreaterOrEqual(t, len(lines), 2, "%q", blk)
		assert.Equal(t, "retry: 2000", lines[0])
		assert.True(t, strings.HasPrefix(lines[1], ":"), "a comment follows the retry: %q", blk)
	})

	t.Run("CORS exact origin with credentials", func(t *testing.T) {
		c := dial(t, addr, "/streams/orders/1", bearerH(tok), "Origin: https://other.example")
		require.Equal(t, 200, c.Status, c.Body)
		assert.Equal(t, "https://other.example", c.Header.Get("Access-Control-Allow-Origin"))
		assert.Equal(t, "true", c.Header.Get("Access-Control-Allow-Credentials"))
		assert.Contains(t, c.Header.Values("Vary"), "Origin")
		assert.Equal(t, "text/event-stream; charset=utf-8", c.Header.Get("Content-Type"))
	})

	t.Run("CORS origin not allowed", func(t *testing.T) {
		for _, o := range []string{"https://evil.example", "https://app.example.evil", "http://app.example", "null"} {
			c := dial(t, addr, "/streams/orders/1", bearerH(tok), "Origin: "+o)
			require.Equal(t, 200, c.Status, c.Body)
			assert.Empty(t, c.Header.Values("Access-Control-Allow-Origin"), "origin %q", o)
			assert.Empty(t, c.Header.Values("Access-Control-Allow-Credentials"), "origin %q", o)
		}
	})
}

func TestSSEResponse401(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	claims := auth.Claims{Streams: []string{"*"}, Channels: []string{"*"}}
	otherKey, err := auth.Mint(auth.MintKey{Secret: []byte("another-secret-0123456789-abcdefgh")}, claims, time.Hour, "", "", time.Now())
	require.NoError(t, err)
	expired, err := auth.Mint(auth.MintKey{Secret: []byte(testSecret)}, claims, time.Hour, "", "", time.Now().Add(-2*time.Hour))
	require.NoError(t, err)
	good := token(t, claims, time.Hour)
	tampered := good[:len(good)-4] + flip(good[len(good)-4:])

	cases := []struct {
		name    string
		target  string
		headers []string
	}{
		{"no token", "/streams/a", nil},
		{"no token channel", "/channels/a", nil},
		{"empty bearer", "/streams/a", []string{"Authorization: Bearer "}},
		{"bad signature", "/streams/a", []string{bearerH(otherKey)}},
		{"tampered signature", "/streams/a", []string{bearerH(tampered)}},
		{"expired", "/streams/a", []string{bearerH(expired)}},
		{"expired in query", "/streams/a?token=" + expired, nil},
		{"expired in cookie", "/streams/a", []string{"Cookie: pgsse_token=" + expired}},
		{"garbage", "/streams/a", []string{bearerH("not.a.jwt")}},
		{"bad signature channel", "/channels/a", []string{bearerH(otherKey)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := get(t, addr, tc.target, tc.headers...)
			require.Equal(t, 401, r.Status, r.Body)
			www := r.Header.Get("WWW-Authenticate")
			assert.True(t, strings.HasPrefix(www, "Bearer"), "WWW-Authenticate %q", www)
			assertErrorBody(t, r)
		})
	}
}

func flip(s string) string {
	b := []byte(s)
	for i := range b {
		if b[i] == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
	}
	return string(b)
}

func TestSSEResponse403(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	orders := token(t, auth.Claims{Streams: []string{"orders/42", "chat/*"}, Channels: []string{"jobs"}}, time.Hour)
	cases := []struct{ name, target, tok string }{
		{"other stream", "/streams/orders/43", orders},
		{"prefix is not a pattern", "/streams/orders/421", orders},
		{"pattern prefix only", "/streams/chatroom", orders},
		{"channel not granted", "/channels/mail", orders},
		{"stream grant is not a channel grant", "/channels/orders/42", orders},
		{"channel grant is not a stream grant", "/streams/jobs", orders},
		{"no grants at all", "/streams/x", token(t, auth.Claims{}, time.Hour)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := get(t, addr, tc.target, bearerH(tc.tok))
			require.Equal(t, 403, r.Status, r.Body)
			assertErrorBody(t, r)
		})
	}
	// The grants themselves work.
	for _, target := range []string{"/streams/orders/42", "/streams/chat/", "/streams/chat/a/b", "/channels/jobs"} {
		c := dial(t, addr, target, bearerH(orders))
		assert.Equal(t, 200, c.Status, "%s: %s", target, c.Body)
	}
}

func TestSSEResponse400(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	tok := allStreams(t)
	authH := bearerH(tok)
	long := strings.Repeat("a", 201)
	cases := []struct {
		name    string
		target  string
		headers []string
	}{
		{"Last-Event-ID abc", "/streams/s", []string{authH, "Last-Event-ID: abc"}},
		{"Last-Event-ID -1", "/streams/s", []string{authH, "Last-Event-ID: -1"}},
		{"Last-Event-ID 2^63", "/streams/s", []string{authH, "Last-Event-ID: 9223372036854775808"}},
		{"Last-Event-ID +5", "/streams/s", []string{authH, "Last-Event-ID: +5"}},
		{"Last-Event-ID 1.5", "/streams/s", []string{authH, "Last-Event-ID: 1.5"}},
		{"Last-Event-ID 0x10", "/streams/s", []string{authH, "Last-Event-ID: 0x10"}},
		{"since=x", "/streams/s?since=x", []string{authH}},
		{"since=-1", "/streams/s?since=-1", []string{authH}},
		{"since=2^63", "/streams/s?since=9223372036854775808", []string{authH}},
		{"since=1e3", "/streams/s?since=1e3", []string{authH}},
		{"invalid header does not fall back to since", "/streams/s?since=5", []string{authH, "Last-Event-ID: abc"}},
		{"empty stream name", "/streams/", []string{authH}},
		{"stream name with space", "/streams/has%20space", []string{authH}},
		{"stream name with quote", "/streams/a%22b", []string{authH}},
		{"stream name too long", "/streams/" + long, []string{authH}},
		{"stream name non-ASCII", "/streams/caf%C3%A9", []string{authH}},
		{"bad percent escape", "/streams/a%ZZ", []string{authH}},
		{"empty channel name", "/channels/", []string{authH}},
		{"channel name too long", "/channels/" + strings.Repeat("c", 64), []string{authH}},
		{"channel name with NUL", "/channels/a%00b", []string{authH}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := get(t, addr, tc.target, tc.headers...)
			require.Equal(t, 400, r.Status, r.Body)
			assertErrorBody(t, r)
		})
	}

	malformed := []struct{ name, raw string }{
		{"garbage", "GARBAGE\r\n\r\n"},
		{"no Host", "GET /streams/s HTTP/1.1\r\nAuthorization: Bearer " + tok + "\r\n\r\n"},
		{"bare LF", "GET /streams/s HTTP/1.1\nHost: x\n\n"},
		{"bad version", "GET /streams/s HTTP/9.9\r\nHost: x\r\n\r\n"},
		{"header without colon", "GET /streams/s HTTP/1.1\r\nHost: x\r\nNoColon\r\n\r\n"},
		{"obs-fold", "GET /streams/s HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n"},
		{"absolute form", "GET http://x/streams/s HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"double space", "GET  /streams/s HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"request body", "GET /streams/s HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"},
		{"duplicate Last-Event-ID", "GET /streams/s HTTP/1.1\r\nHost: x\r\nLast-Event-ID: 1\r\nLast-Event-ID: 2\r\n\r\n"},
	}
	for _, tc := range malformed {
		t.Run("malformed "+tc.name, func(t *testing.T) {
			r := exchange(t, addr, "GET", tc.raw)
			require.Equal(t, 400, r.Status, r.Body)
			assertErrorBody(t, r)
		})
	}

	// The server is still fine after all that.
	c := dial(t, addr, "/streams/s", authH)
	assert.Equal(t, 200, c.Status)
}

// docs/http.md, Cursors and gaps: decimal digits only — "?since=+1" (a space once '+' is decoded)
// is not a cursor — and the error names the field that was wrong (issues 11 and 15).
func TestSSECursorErrorNamesField(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	authH := bearerH(allStreams(t))
	cases := []struct {
		target  string
		headers []string
		body    string
	}{
		{"/streams/s?since=+1", nil, "since: cursor must be decimal digits\n"},
		{"/streams/s?since=%2B1", nil, "since: cursor must be decimal digits\n"},
		{"/streams/s?since=1%20", nil, "since: cursor must be decimal digits\n"},
		{"/streams/s?since=9223372036854775808", nil, "since: cursor must be at most 9223372036854775807\n"},
		{"/streams/s", []string{"Last-Event-ID: x1"}, "Last-Event-ID: cursor must be decimal digits\n"},
		{"/streams/s?since=1", []string{"Last-Event-ID: 1.0"}, "Last-Event-ID: cursor must be decimal digits\n"},
		// A composite id from a /streams?stream=… connection, pasted onto one stream: the
		// error says where it belongs.
		{"/streams/s", []string{"Last-Event-ID: 1:3,1"}, "Last-Event-ID: cursor must be decimal digits (a composite cursor like 1:3,1 belongs to the /streams?stream=…&stream=… connection that gave it)\n"},
		{"/streams/s?since=3,1", nil, "since: cursor must be decimal digits (a composite cursor like 1:3,1 belongs to the /streams?stream=…&stream=… connection that gave it)\n"},
	}
	for _, tc := range cases {
		r := get(t, addr, tc.target, append([]string{authH}, tc.headers...)...)
		assert.Equal(t, 400, r.Status, "%s %v", tc.target, tc.headers)
		assert.Equal(t, tc.body, r.Body, "%s %v", tc.target, tc.headers)
	}
}

// A valid Last-Event-ID wins over since, even over a since that would be invalid on its
// own; a blank header counts as absent, so since then applies.
func TestSSECursorPrecedenceStatus(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	pub := connect(t, ts.DSN)
	publishN(t, pub, "p", "d", 5)
	tok := bearerH(allStreams(t))

	c := dial(t, addr, "/streams/p?since=1", tok, "Last-Event-ID: 3")
	require.Equal(t, 200, c.Status, c.Body)
	c.readIDs(4, 5, 5*time.Second)

	c = dial(t, addr, "/streams/p?since=x", tok, "Last-Event-ID: 4")
	require.Equal(t, 200, c.Status, "a valid Last-Event-ID wins over since: %s", c.Body)
	c.readIDs(5, 5, 5*time.Second)

	c = dial(t, addr, "/streams/p?since=2", tok, "Last-Event-ID: ")
	require.Equal(t, 200, c.Status, c.Body)
	c.readIDs(3, 5, 5*time.Second)

	r := get(t, addr, "/streams/p?since=x", tok, "Last-Event-ID: ")
	assert.Equal(t, 400, r.Status, "blank header is absent, so the bad since counts: %s", r.Body)
}

func TestSSEResponse404(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	for _, target := range []string{"/", "/nope", "/Streams", "/streams%2Fx", "/channels", "/stream/x", "/Streams/x", "/streamsx", "/events/x", "/favicon.ico"} {
		t.Run(target, func(t *testing.T) {
			r := get(t, addr, target, tok)
			require.Equal(t, 404, r.Status, r.Body)
			assertErrorBody(t, r)
			assert.Contains(t, r.Body, "not found: pgsse serves GET /streams/{stream}", "a 404 names the paths pgsse serves")
		})
	}
	r := exchange(t, addr, "POST", request("POST", "/nope", tok))
	assert.Equal(t, 404, r.Status, "unknown path with another method: %s", r.Body)
	for _, target := range []string{"/", "/nope"} {
		r = exchange(t, addr, "HEAD", request("HEAD", target, tok))
		assert.Equal(t, 404, r.Status)
		assert.Empty(t, r.Body, "a HEAD response carries no body (RFC 9110 §9.3.2)")
	}
}

func TestSSEResponse405(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	allow := map[string]string{"/streams/s": "GET, POST, OPTIONS", "/channels/c": "GET, OPTIONS", "/publish": "POST, OPTIONS",
		"/streams?stream=s": "GET, OPTIONS"}
	for _, path := range []string{"/streams/s", "/channels/c", "/publish", "/streams?stream=s"} {
		for _, m := range []string{"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "CONNECTX", "TRACE"} {
			if m == "POST" && (path == "/streams/s" || path == "/publish") || m == "GET" && path != "/publish" {
				continue // served (docs/http.md)
			}
			t.Run(m+" "+path, func(t *testing.T) {
				r := exchange(t, addr, m, request(m, path, tok))
				require.Equal(t, 405, r.Status, r.Body)
				assert.Equal(t, allow[path], r.Header.Get("Allow"))
				if m == "HEAD" {
					assert.Empty(t, r.Body, "a HEAD response carries no body")
					return
				}
				assertErrorBody(t, r)
			})
		}
	}
}

func TestSSEResponse431(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))

	big := "X-Big: " + strings.Repeat("b", 9000)
	r := get(t, addr, "/streams/s", tok, big)
	require.Equal(t, 431, r.Status, r.Body)
	assertErrorBody(t, r)

	// Many small headers over the limit.
	var many []string
	for i := 0; i < 400; i++ {
		many = append(many, "X-H"+strconv.Itoa(i)+": 01234567890123456789")
	}
	r = get(t, addr, "/streams/s", append([]string{tok}, many...)...)
	require.Equal(t, 431, r.Status, r.Body)

	// Just under the default limit: accepted.
	head := request("GET", "/streams/s", tok, "X-Pad: ")
	pad := 8192 - len(head) - 1
	c := dial(t, addr, "/streams/s", tok, "X-Pad: "+strings.Repeat("p", pad))
	assert.Equal(t, 200, c.Status, c.Body)

	// A head sent without its end, longer than the limit, is refused without waiting.
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.Write([]byte("GET /streams/s HTTP/1.1\r\nHost: x\r\nX-Long: " + strings.Repeat("z", 9000)))
	require.NoError(t, err)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	n, _ := conn.Read(buf)
	assert.True(t, strings.HasPrefix(string(buf[:n]), "HTTP/1.1 431"), "got %q", buf[:n])
}

func TestSSEResponse431Configured(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", func(c *Config) { c.MaxHeaderBytes = 1024 })
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	r := get(t, addr, "/streams/s", tok, "X-Big: "+strings.Repeat("b", 1100))
	require.Equal(t, 431, r.Status, r.Body)
	c := dial(t, addr, "/streams/s", tok, "X-Small: "+strings.Repeat("b", 100))
	assert.Equal(t, 200, c.Status, c.Body)
}

func TestSSEResponsePreflight(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", func(c *Config) { c.CORSOrigins = []string{"https://app.example"} })
	addr := ts.Addr().String()
	for _, path := range []string{"/streams/orders/1", "/channels/jobs"} {
		r := exchange(t, addr, "OPTIONS", request("OPTIONS", path,
			"Origin: https://app.example",
			"Access-Control-Request-Method: GET",
			"Access-Control-Request-Headers: authorization, last-event-id"))
		require.Equal(t, 204, r.Status, r.Body)
		assert.Equal(t, "https://app.example", r.Header.Get("Access-Control-Allow-Origin"))
		assert.Equal(t, "true", r.Header.Get("Access-Control-Allow-Credentials"))
		assert.Contains(t, r.Header.Get("Access-Control-Allow-Methods"), "GET")
		ach := strings.ToLower(r.Header.Get("Access-Control-Allow-Headers"))
		assert.Contains(t, ach, "authorization")
		assert.Contains(t, ach, "last-event-id")
		assert.Empty(t, r.Body, "204 has no body")
	}
	// No Access-Control-Request-Headers: the defaults still allow Authorization.
	r := exchange(t, addr, "OPTIONS", request("OPTIONS", "/streams/x",
		"Origin: https://app.example", "Access-Control-Request-Method: GET"))
	require.Equal(t, 204, r.Status, r.Body)
	assert.Contains(t, strings.ToLower(r.Header.Get("Access-Control-Allow-Headers")), "authorization")

	// A disallowed origin gets no Access-Control-* grant.
	r = exchange(t, addr, "OPTIONS", request("OPTIONS", "/streams/orders/1",
		"Origin: https://evil.example", "Access-Control-Request-Method: GET"))
	assert.NotEqual(t, 204, r.Status)
	assert.Empty(t, r.Header.Get("Access-Control-Allow-Origin"))
	assert.Empty(t, r.Header.Get("Access-Control-Allow-Credentials"))
}

func TestSSEResponseOverCapacity(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", func(c *Config) { c.MaxConnections = 2; c.CORSOrigins = []string{"https://app.example"} })
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	a := dial(t, addr, "/streams/s", tok)
	require.Equal(t, 200, a.Status)
	b := dial(t, addr, "/channels/c", tok)
	require.Equal(t, 200, b.Status)
	a.mustNext(5 * time.Second)
	b.mustNext(5 * time.Second)

	seen := map[int64]bool{}
	for i := 0; i < 5; i++ {
		c := dial(t, addr, "/streams/s", tok, "Origin: https://app.example")
		require.Equal(t, 200, c.Status, "load shedding must not use a non-200 status: %s", c.Body)
		assert.Equal(t, "text/event-stream; charset=utf-8", c.Header.Get("Content-Type"))
		assert.Equal(t, "https://app.example", c.Header.Get("Access-Control-Allow-Origin"), "EventSource needs CORS to read the retry")
		retry := c.expectRetryEOF(5 * time.Second)
		assertJitteredRetry(t, retry)
		seen[retry] = true
	}
	assert.Greater(t, len(seen), 1, "retry is jittered: %v", seen)

	// The admitted connections are unaffected; closing one frees a slot.
	pub := connect(t, ts.DSN)
	publish(t, pub, "s", "still here", "", nil)
	assert.Equal(t, "still here", a.mustNextData(5*time.Second).Data)
	a.conn.Close()
	waitFor(t, 5*time.Second, "a slot to free", func() bool {
		c := dial(t, addr, "/streams/s", tok)
		ev := c.mustNext(5 * time.Second)
		c.conn.Close()
		return ev.Retry == "2000"
	})
}

// docs/http.md, Responses and errors: a client that has not sent a complete request head within
// 10 s is closed.
func TestSSEHeadDeadline(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	cases := []struct {
		name    string
		send    string
		trickle bool
	}{
		{"silent", "", false},
		{"partial head", "GET /streams/s HTTP/1.1\r\nHost: x\r\n", false},
		{"trickle", "GET /streams/s HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			conn, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			defer conn.Close()
			start := time.Now()
			if tc.trickle {
				go func() {
					for i := 0; i < len(tc.send); i++ {
						if _, err := conn.Write([]byte{tc.send[i]}); err != nil {
							return
						}
						time.Sleep(400 * time.Millisecond)
					}
				}()
			} else if tc.send != "" {
				_, err = conn.Write([]byte(tc.send))
				require.NoError(t, err)
			}
			_ = conn.SetReadDeadline(time.Now().Add(14 * time.Second))
			buf := make([]byte, 512)
			var got []byte
			for {
				n, err := conn.Read(buf)
				got = append(got, buf[:n]...)
				if err != nil {
					var ne net.Error
					if errors.As(err, &ne) && ne.Timeout() {
						t.Fatalf("connection still open %v after connecting (SPEC: closed after 10 s without a complete head)", time.Since(start))
					}
					break
				}
			}
			elapsed := time.Since(start)
			assert.GreaterOrEqual(t, elapsed, 9*time.Second, "closed too early (got %q)", got)
			assert.LessOrEqual(t, elapsed, 12*time.Second)
		})
	}
}

// The contract (docs/http.md): "Nothing in a request can crash the server, leak another stream's
// events, or make it buffer without bound."
func TestSSERequestRobustness(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	pub := connect(t, ts.DSN)

	t.Run("name boundaries", func(t *testing.T) {
		long := strings.Repeat("s", 200)
		c := dial(t, addr, "/streams/"+long, tok)
		require.Equal(t, 200, c.Status, "a 200-byte stream name is valid: %s", c.Body)
		publish(t, pub, long, "long name", "", nil)
		assert.Equal(t, "long name", c.mustNextData(5*time.Second).Data)
		ch := strings.Repeat("c", 63)
		c = dial(t, addr, "/channels/"+ch, tok)
		require.Equal(t, 200, c.Status, "a 63-byte channel name is valid: %s", c.Body)
	})

	t.Run("pipelined second request is not served", func(t *testing.T) {
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer conn.Close()
		_, err = conn.Write([]byte(request("GET", "/streams/pipe/a", tok) + request("GET", "/streams/pipe/b", tok)))
		require.NoError(t, err)
		c := &sseClient{t: t, conn: conn, r: bufio.NewReader(conn)}
		c.readHead()
		require.Equal(t, 200, c.Status)
		publish(t, pub, "pipe/b", "b", "", nil)
		publish(t, pub, "pipe/a", "a", "", nil)
		assert.Equal(t, sseEvent{HasID: true, IDValue: "1", Data: "a"}, c.mustNextData(5*time.Second))
	})

	t.Run("bytes after the head are discarded", func(t *testing.T) {
		c := dial(t, addr, "/streams/junk", tok)
		require.Equal(t, 200, c.Status)
		junk := []byte(strings.Repeat("GET /streams/other HTTP/1.1\r\n\r\n\x00\xff", 1000))
		for i := 0; i < 200; i++ { // ~7 MB the server must not keep
			_, err := c.conn.Write(junk)
			require.NoError(t, err)
		}
		publish(t, pub, "junk", "still streaming", "", nil)
		assert.Equal(t, "still streaming", c.mustNextData(5*time.Second).Data)
		var maxIn int
		ts.onLoop(t, func() {
			for _, sc := range ts.conns.list {
				if sc.c != nil && !sc.closed {
					maxIn = max(maxIn, sc.c.InboundBuffered())
				}
			}
		})
		assert.Less(t, maxIn, 1<<20, "inbound bytes after the head are not buffered")
	})

	t.Run("HTTP/1.0", func(t *testing.T) {
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer conn.Close()
		_, err = conn.Write([]byte("GET /streams/old HTTP/1.0\r\nHost: x\r\n" + tok + "\r\n\r\n"))
		require.NoError(t, err)
		c := &sseClient{t: t, conn: conn, r: bufio.NewReader(conn)}
		c.readHead()
		require.Equal(t, 200, c.Status, c.Body)
		publish(t, pub, "old", "1.0", "", nil)
		assert.Equal(t, "1.0", c.mustNextData(5*time.Second).Data)
	})

	t.Run("client gone mid-stream costs nobody else", func(t *testing.T) {
		stay := dial(t, addr, "/streams/gone", tok)
		for i := 0; i < 20; i++ {
			c := dialWith(t, tinyRcvBuf(2048), addr, "/streams/gone", tok)
			require.Equal(t, 200, c.Status)
			if tcp, ok := c.conn.(*net.TCPConn); ok {
				_ = tcp.SetLinger(0) // RST on close
			}
			c.conn.Close()
		}
		big := strings.Repeat("g", 6000)
		for i := 0; i < 50; i++ {
			publish(t, pub, "gone", big, "", nil)
		}
		stay.readIDs(1, 50, 10*time.Second)
		var n int
		ts.onLoop(t, func() { n = ts.conns.active })
		assert.Less(t, n, 20, "closed clients are forgotten")
	})
}
