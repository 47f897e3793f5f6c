package fuzz

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"strings"
	"testing"

	"github.com/pgsse/pgsse/sse"
)

// The request reader below is what the engine does on a keep-alive
// connection: parse a head from the bytes not yet consumed, start the body
// decoder, feed it what follows, consume, and parse the next head from what
// remains — with the input arriving in pieces.

// sseRequest is one request as the reader saw it, for comparisons.
type sseRequest struct {
	method, target string
	framing        sse.BodyFraming
	keepAlive      bool
	body           string
	consumed       int // offset in the input where this request (head and body) ended
}

// sseTranscript is everything a connection's bytes produced: the requests
// read, then how reading ended (an error, or "incomplete" at end of input).
type sseTranscript struct {
	requests []sseRequest
	end      string
}

func (t sseTranscript) String() string {
	var b strings.Builder
	for _, r := range t.requests {
		fmt.Fprintf(&b, "%s %q framing=%d keep=%v body=%q end=%d\n", r.method, r.target, r.framing, r.keepAlive, r.body, r.consumed)
	}
	return b.String() + "then " + t.end
}

const sseMaxBody = 1024

// readRequests reads in, delivered in pieces of the given sizes (the last
// piece takes whatever is left), as the engine would.
func readRequests(p *sse.Parser, d *sse.BodyDecoder, in []byte, pieces []int, maxHead int) sseTranscript {
	var tr sseTranscript
	var buf []byte // the caller-owned body buffer, reused
	consumed, arrived := 0, 0
	inBody := false
	var cur sseRequest
	for {
		if arrived == len(in) {
			tr.end = "incomplete"
			return tr
		}
		step := len(in) - arrived
		if len(pieces) > 0 {
			step = min(max(pieces[0], 1), step)
			pieces = pieces[1:]
		}
		arrived += step
		for consumed < arrived || inBody && d.Done() {
			pending := in[consumed:arrived]
			if !inBody {
				req, err := p.Parse(pending, maxHead)
				if errors.Is(err, sse.ErrIncomplete) {
					break
				}
				if err != nil {
					tr.end = "head: " + err.Error()
					return tr
				}
				cur = sseRequest{method: string(req.RawMethod), target: string(req.Target), framing: req.Framing, keepAlive: req.KeepAlive}
				consumed += req.HeadLen
				if err := d.Start(req, sseMaxBody, buf); err != nil {
					tr.end = "start: " + err.Error()
					return tr
				}
				inBody = true
				continue
			}
			n, done, err := d.Decode(in[consumed:arrived])
			if err != nil {
				tr.end = "body: " + err.Error()
				return tr
			}
			consumed += n
			if !done {
				break
			}
			cur.body = string(d.Body())
			cur.consumed = consumed
			buf = d.Buffer()
			tr.requests = append(tr.requests, cur)
			inBody = false
		}
	}
}

// ones is n reads of one byte each.
func ones(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = 1
	}
	return out
}

// piecesOf turns fuzz bytes into read sizes: each byte is one read of 1–256 bytes.
func piecesOf(cuts []byte) []int {
	out := make([]int, len(cuts))
	for i, c := range cuts {
		out[i] = int(c) + 1
	}
	return out
}

// FuzzRequestStream: a connection's bytes — pipelined requests with
// Content-Length and chunked bodies — read in arbitrary pieces give exactly
// the transcript they give read at once (the same requests, bodies,
// consumed offsets and final error); and every request accepted is read by
// net/http from the same bytes with the same method, target and body, and
// ends at the same offset, so the next request is found where net/http
// finds it.
func FuzzRequestStream(f *testing.F) {
	post := func(target, headers, body string) string {
		return "POST " + target + " HTTP/1.1\r\nHost: x\r\n" + headers + "\r\n" + body
	}
	chunked := "Transfer-Encoding: chunked\r\n"
	for _, s := range []string{
		post("/streams/a", "Content-Length: 5\r\n", "hello") + post("/streams/b?event=e", "Content-Length: 0\r\n", "") +
			"GET /streams/c HTTP/1.1\r\nHost: x\r\n\r\n",
		post("/streams/a", chunked, "5\r\nhello\r\n0\r\n\r\n") + post("/streams/a", chunked, "2;x=y\r\nab\r\n1\r\nc\r\n0\r\nT: v\r\n\r\n"),
		post("/publish", chunked+"Content-Type: application/x-ndjson\r\n", "1a\r\n{\"stream\":\"a\",\"data\":\"x\"}\n\r\n0\r\n\r\n"),
		post("/streams/a", "Content-Length: 3\r\nConnection: close\r\n", "abc"),
		"POST /streams/a HTTP/1.0\r\nContent-Length: 2\r\n\r\nhi" + post("/streams/a", "Content-Length: 1\r\n", "x"),
		post("/streams/a", "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n"),
		post("/streams/a", chunked, "5\nhello\r\n0\r\n\r\n"),
		post("/streams/a", chunked, "400\r\n"),
		post("/streams/a", "", "") + "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
		post("/streams/a", "Content-Length: 2000\r\n", ""),
		post("/streams/a", "Expect: 100-continue\r\nContent-Length: 1\r\n", "z"),
		post("/streams/a", "Content-Length: 2\r\n", "hi") + "\r\n" + post("/streams/b", "Content-Length: 1\r\n", "x") + "\n\r\n",
		post("/streams/a", "Content-Length: 0\r\n", "") + strings.Repeat("\r\n", 9) + post("/streams/b", "", ""),
		"PUT /streams/a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello" + post("/streams/a", "Content-Length: 1\r\n", "x"),
	} {
		f.Add([]byte(s), []byte{0, 3, 17, 1, 255})
		f.Add([]byte(s), []byte{})
	}

	var p sse.Parser
	var d sse.BodyDecoder
	f.Fuzz(func(t *testing.T, in, cuts []byte) {
		const maxHead = 2048
		whole := readRequests(&p, &d, in, nil, maxHead)
		split := readRequests(&p, &d, in, piecesOf(cuts), maxHead)
		if whole.String() != split.String() {
			t.Fatalf("at once:\n%s\nin pieces %v:\n%s", whole, piecesOf(cuts), split)
		}
		// Byte by byte re-parses a growing head after every byte: quadratic,
		// so only for inputs small enough to keep the fuzzer fast.
		if len(in) <= 4096 {
			bytewise := readRequests(&p, &d, in, ones(len(in)), maxHead)
			if whole.String() != bytewise.String() {
				t.Fatalf("at once:\n%s\nbyte by byte:\n%s", whole, bytewise)
			}
		}

		// net/http reads each request we accepted from exactly the bytes we
		// say it occupies: same method, target and body, nothing left over.
		from := 0
		for i, want := range whole.requests {
			from += refEmptyLines(in[from:want.consumed]) // skipped by us, not by net/http's ReadRequest
			br := bufio.NewReader(bytes.NewReader(in[from:want.consumed]))
			from = want.consumed
			hr, err := http.ReadRequest(br)
			if err != nil {
				t.Fatalf("request %d: we accepted %+v, net/http: %v", i, want, err)
			}
			body, err := io.ReadAll(hr.Body)
			if err != nil {
				if strings.Contains(err.Error(), "too much non-data") {
					return // net/http's own overhead heuristic for tiny chunks; not a framing disagreement
				}
				t.Fatalf("request %d body: we read %q, net/http: %v", i, want.body, err)
			}
			if hr.Method != want.method || hr.RequestURI != want.target || string(body) != want.body {
				t.Fatalf("request %d: net/http read %s %s %q, we read %+v", i, hr.Method, hr.RequestURI, body, want)
			}
			if _, err := br.ReadByte(); err != io.EOF {
				t.Fatalf("request %d: net/http left bytes of it unread (%v): %+v", i, err, want)
			}
		}
	})
}

// FuzzBodyDecoder: a body in any framing, decoded in arbitrary pieces, gives
// the same body, consumed count and error as decoded at once; the limit is
// never passed; and a chunked body we accept is read identically by
// net/http's chunked reader (httputil.NewChunkedReader), which also stops
// where we did.
func FuzzBodyDecoder(f *testing.F) {
	for _, s := range []string{
		"5\r\nhello\r\n0\r\n\r\n",
		"3\r\nhel\r\n2;ext=\"q\"\r\nlo\r\n0\r\nTrailer: v\r\n\r\nGET / HTTP/1.1\r\n",
		"0\r\n\r\n",
		"00000000000000001\r\n",
		"5;\x01\r\n",
		"5 \r\nhello\r\n",
		"5\r\nhello\n",
		"ffffffffffffffff\r\n",
		"0\r\nX: a\r\n b\r\n\r\n",
		"hello world",
	} {
		f.Add([]byte(s), uint8(1), uint16(64), []byte{2, 5})
		f.Add([]byte(s), uint8(0), uint16(5), []byte{})
	}

	var d sse.BodyDecoder
	f.Fuzz(func(t *testing.T, in []byte, framing uint8, limit uint16, cuts []byte) {
		req := &sse.Request{Method: sse.MethodPOST, Framing: sse.BodyChunked}
		if framing%2 == 0 {
			req.Framing, req.ContentLength = sse.BodyLength, int64(len(in)/2)
		}
		max := int64(limit) + 1

		run := func(pieces []int) (string, int, string) {
			if err := d.Start(req, max, nil); err != nil {
				return "", 0, "start: " + err.Error()
			}
			consumed := 0
			for consumed < len(in) || len(pieces) > 0 || d.Done() {
				end := len(in)
				if len(pieces) > 0 {
					end = min(consumed+pieces[0], len(in))
					pieces = pieces[1:]
				}
				n, done, err := d.Decode(in[consumed:end])
				if err != nil {
					return "", consumed + n, err.Error()
				}
				if n > end-consumed {
					t.Fatalf("consumed %d of %d", n, end-consumed)
				}
				consumed += n
				if done {
					body := d.Body()
					if int64(len(body)) > max {
						t.Fatalf("body of %d bytes over the limit %d", len(body), max)
					}
					if cap(body) != len(body) {
						t.Fatal("body has spare capacity")
					}
					return string(body), consumed, "done"
				}
				if consumed != end {
					t.Fatalf("unfinished body consumed %d of %d", consumed, end)
				}
			}
			return "", consumed, "incomplete"
		}
		body, n, how := run(nil)
		body2, n2, how2 := run(piecesOf(cuts))
		if body != body2 || n != n2 || how != how2 {
			t.Fatalf("at once %q %d %s; in pieces %v %q %d %s", body, n, how, piecesOf(cuts), body2, n2, how2)
		}
		body3, n3, how3 := run(ones(len(in)))
		if body != body3 || n != n3 || how != how3 {
			t.Fatalf("at once %q %d %s; byte by byte %q %d %s", body, n, how, body3, n3, how3)
		}

		if how == "done" && req.Framing == sse.BodyChunked {
			r := bufio.NewReader(bytes.NewReader(in[:n]))
			got, err := io.ReadAll(httputil.NewChunkedReader(r))
			if err != nil && !strings.Contains(err.Error(), "too much non-data") {
				t.Fatalf("we decoded %q, net/http: %v", body, err)
			}
			if err == nil && string(got) != body {
				t.Fatalf("we decoded %q, net/http %q", body, got)
			}
		}
	})
}
