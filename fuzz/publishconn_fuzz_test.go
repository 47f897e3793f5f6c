package fuzz

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/engine"
)

// FuzzPublishConn drives the engine's publisher connection (docs/http.md, Publishing over HTTP:
// POST /streams/…, POST /publish, keep-alive, pipelining, chunked bodies, Expect: 100-continue)
// with arbitrary byte streams delivered in two pieces: the server never panics, answers only with
// well-formed HTTP/1.1 responses, and keeps serving a well-behaved keep-alive publisher on
// another connection throughout.
//
// As FuzzHubServer, the server runs against an unreachable PostgreSQL: everything up to
// the Publisher (heads, bodies, tokens, grants, batches) works without a database, and a
// request that gets that far is answered 503.
func FuzzPublishConn(f *testing.F) {
	srv, secret := startFuzzPublisher(f)
	tok, err := auth.Mint(auth.MintKey{Secret: secret}, auth.Claims{Publish: []string{"a/*"}, Streams: []string{"*"}}, 24*time.Hour, "", "", time.Now())
	if err != nil {
		f.Fatal(err)
	}
	authz := "Authorization: Bearer " + tok + "\r\n"
	post := func(target, headers, body string) string {
		return "POST " + target + " HTTP/1.1\r\nHost: x\r\n" + authz + headers + "\r\n" + body
	}
	cl := func(body string) string { return "Content-Length: " + strconv.Itoa(len(body)) + "\r\n" }
	chunked := "Transfer-Encoding: chunked\r\n"
	batch := `{"stream":"a/1","data":"x"}` + "\n" + `{"stream":"a/2","data":{"y":1},"audience":["t"]}` + "\n"
	for i, s := range []string{
		post("/streams/a/1", cl("hello"), "hello"),
		post("/streams/a/1?event=e&audience=t&ephemeral=1", cl("x"), "x") + post("/streams/a/2", cl(""), ""),
		post("/streams/a/1", chunked, "5\r\nhello\r\n0\r\n\r\n") + post("/streams/a/1", cl("ab"), "ab"),
		post("/publish", "Content-Type: application/x-ndjson\r\n"+cl(batch), batch),
		post("/publish", "Content-Type: application/x-ndjson\r\n"+cl("{}\n"), "{}\n"),
		post("/streams/b/1", cl("no grant"), "no grant") + post("/streams/a/1", cl("after"), "after"),
		post("/streams/a/1", "Expect: 100-continue\r\n"+cl("z"), "z"),
		post("/streams/a/1", cl("x")+"Connection: close\r\n", "x"),
		"POST /streams/a/1 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc",
		post("/streams/a/1", chunked, "ffffffff\r\n"),
		post("/streams/a%20b", cl("x"), "x"),
		post("/streams/a/1", cl("x"), "x") + "GET /streams/a/1 HTTP/1.1\r\nHost: x\r\n" + authz + "\r\n",
		"OPTIONS /publish HTTP/1.1\r\nHost: x\r\nOrigin: https://o.example\r\nAccess-Control-Request-Method: POST\r\n\r\n",
		"PUT /publish HTTP/1.1\r\nHost: x\r\n\r\n",
	} {
		f.Add([]byte(s), uint16(i*7))
	}

	healthy := newHealthyPublisher(f, srv.Addr().String(), authz)
	f.Fuzz(func(t *testing.T, data []byte, split uint16) {
		c := sendInTwo(t, "tcp", srv.Addr().String(), data, split, 20*time.Second)
		defer c.Close()
		out, err := io.ReadAll(c)
		if err != nil && !isReset(err) {
			t.Fatalf("reading the answers: %v (after %q)", err, out)
		}
		checkResponses(t, data, out)
		healthy.publish(t)
	})
}

// checkResponses: the server's output is a sequence of well-formed HTTP/1.1 responses
// (the last may be an event stream, or cut short by the close).
func checkResponses(t *testing.T, in, out []byte) {
	if len(out) == 0 {
		return
	}
	if !bytes.HasPrefix(out, []byte("HTTP/1.1 ")) {
		t.Fatalf("the answer does not start with a status line: %q", out)
	}
	if bytes.Contains(in, []byte("HEAD")) {
		return // a HEAD answer has a Content-Length but no body: the reader below cannot tell
	}
	r := bufio.NewReader(bytes.NewReader(out))
	for {
		if _, err := r.Peek(1); err != nil {
			return // the close, between responses
		}
		resp, err := http.ReadResponse(r, &http.Request{Method: "POST"})
		if err != nil {
			t.Fatalf("malformed response: %v in %q", err, out)
		}
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			return // the rest is the event stream, until the close
		}
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			t.Fatalf("response body: %v in %q", err, out)
		}
		if resp.StatusCode < 100 || resp.StatusCode > 599 {
			t.Fatalf("status %d in %q", resp.StatusCode, out)
		}
	}
}

// startFuzzPublisher runs one engine with a token key for the whole fuzz process.
func startFuzzPublisher(f *testing.F) (*engine.Server, []byte) {
	secret := []byte("fuzz-secret-0123456789-abcdefghijklmn")
	return runFuzzEngine(f, engine.Config{Auth: auth.Config{Secret: secret}, CORSOrigins: []string{"https://o.example"}}), secret
}

// healthyPublisher is a well-behaved keep-alive publisher that must keep being served
// (with 503: the database is unreachable).
type healthyPublisher struct {
	c     net.Conn
	r     *bufio.Reader
	authz string
}

func newHealthyPublisher(f *testing.F, addr, authz string) *healthyPublisher {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { c.Close() })
	return &healthyPublisher{c: c, r: bufio.NewReader(c), authz: authz}
}

func (h *healthyPublisher) publish(t *testing.T) {
	_ = h.c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := h.c.Write([]byte("POST /streams/a/healthy HTTP/1.1\r\nHost: x\r\n" + h.authz + "Content-Length: 2\r\n\r\nok")); err != nil {
		t.Fatalf("healthy publisher: %v", err)
	}
	resp, err := http.ReadResponse(h.r, &http.Request{Method: "POST"})
	if err != nil {
		t.Fatalf("healthy publisher not answered: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != 503 || resp.Close {
		t.Fatalf("healthy publisher: %d (close %v), want 503 on a kept-alive connection", resp.StatusCode, resp.Close)
	}
}
