package sse

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bodyHead builds the request a body follows.
func bodyHead(framing BodyFraming, cl int64) *Request {
	return &Request{Method: MethodPOST, Route: RouteStream, Framing: framing, ContentLength: cl}
}

// decodeAll feeds in to d in pieces cut at cuts (offsets into in, ascending)
// the way the engine would: each call sees what arrived since the last
// consumed byte. It returns the body (copied), the total consumed and the
// error.
func decodeAll(t *testing.T, d *BodyDecoder, in []byte, cuts []int) (string, int, error) {
	t.Helper()
	consumed, arrived := 0, 0
	for k := 0; k <= len(cuts); k++ {
		arrived = len(in)
		if k < len(cuts) {
			arrived = cuts[k]
		}
		n, done, err := d.Decode(in[consumed:arrived])
		if err != nil {
			return "", consumed + n, err
		}
		require.LessOrEqual(t, n, arrived-consumed)
		consumed += n
		if done {
			require.True(t, d.Done())
			return string(d.Body()), consumed, nil
		}
		require.Equal(t, arrived, consumed, "an unfinished body consumes all its input")
	}
	return "", consumed, ErrIncomplete
}

const next = "GET /next HTTP/1.1\r\n" // a pipelined request after the body

func TestBodyDecodes(t *testing.T) {
	cases := []struct {
		name    string
		framing BodyFraming
		cl      int64
		wire    string
		body    string
		max     int64 // 64 if 0
	}{
		{"length", BodyLength, 5, "hello", "hello", 0},
		{"length with CRLF inside", BodyLength, 7, "a\r\n\r\nb\n", "a\r\n\r\nb\n", 0},
		{"one chunk", BodyChunked, 0, "5\r\nhello\r\n0\r\n\r\n", "hello", 0},
		{"several chunks", BodyChunked, 0, "3\r\nhel\r\n2\r\nlo\r\n1\r\n!\r\n0\r\n\r\n", "hello!", 0},
		{"hex sizes, both cases, leading zeros", BodyChunked, 0, "0000A\r\n0123456789\r\nb\r\n0123456789a\r\n00\r\n\r\n", "01234567890123456789a", 0},
		{"empty chunked body", BodyChunked, 0, "0\r\n\r\n", "", 0},
		{"extensions ignored", BodyChunked, 0, "5;name=value\r\nhello\r\n2 ; a ; b=\"q;\\\"x\" \r\n!!\r\n0;last\r\n\r\n", "hello!!", 0},
		{"trailers ignored", BodyChunked, 0, "2\r\nhi\r\n0\r\nX-Checksum: abc\r\nX-Empty:\r\nX-Tab:\ta\tb \r\n\r\n", "hi", 0},
		{"chunk data with CRLF and NUL", BodyChunked, 0, "4\r\n\r\n\x00\n\r\n0\r\n\r\n", "\r\n\x00\n", 0},
		{"exactly the limit", BodyChunked, 0, "4\r\nabcd\r\n4\r\nefgh\r\n0\r\n\r\n", "abcdefgh", 8},
		{"length at the limit", BodyLength, 8, "12345678", "12345678", 8},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := []byte(tc.wire + next)
			limit := tc.max
			if limit == 0 {
				limit = 64
			}
			var d BodyDecoder
			// At once, then split at every byte, then byte by byte: the same body
			// and the same consumed count each time.
			require.NoError(t, d.Start(bodyHead(tc.framing, tc.cl), limit, nil))
			body, n, err := decodeAll(t, &d, in, nil)
			require.NoError(t, err)
			assert.Equal(t, tc.body, body)
			assert.Equal(t, len(tc.wire), n, "consumed exactly the body")
			for cut := 1; cut < len(tc.wire); cut++ {
				require.NoError(t, d.Start(bodyHead(tc.framing, tc.cl), limit, d.Buffer()))
				body, n, err := decodeAll(t, &d, in, []int{cut})
				require.NoError(t, err, "cut at %d", cut)
				assert.Equal(t, tc.body, body, "cut at %d", cut)
				assert.Equal(t, len(tc.wire), n, "cut at %d", cut)
			}
			every := make([]int, len(tc.wire))
			for i := range every {
				every[i] = i
			}
			require.NoError(t, d.Start(bodyHead(tc.framing, tc.cl), limit, nil))
			body, n, err = decodeAll(t, &d, in, every)
			require.NoError(t, err)
			assert.Equal(t, tc.body, body)
			assert.Equal(t, len(tc.wire), n)

			// Skipped: consumed the same, kept nothing — not even the buffer it was given.
			require.NoError(t, d.Start(bodyHead(tc.framing, tc.cl), limit, make([]byte, 0, 4096)))
			d.Skip()
			body, n, err = decodeAll(t, &d, in, []int{len(tc.wire) / 2})
			require.NoError(t, err)
			assert.Empty(t, body)
			assert.Equal(t, len(tc.wire), n)
			assert.Zero(t, cap(d.Buffer()), "a skipped body holds no buffer")
		})
	}
}

func TestBodyViewOrBuffer(t *testing.T) {
	var d BodyDecoder
	buf := make([]byte, 0, 64)

	// A whole Content-Length body in the input is a view into it.
	in := []byte("hello" + next)
	require.NoError(t, d.Start(bodyHead(BodyLength, 5), 0, buf))
	n, done, err := d.Decode(in)
	require.NoError(t, err)
	require.True(t, done)
	assert.Equal(t, 5, n)
	assert.Same(t, &in[0], &d.Body()[0], "a view into the input")
	assert.Equal(t, len(d.Body()), cap(d.Body()))

	// A one-chunk body in the input is a view too.
	in = []byte("5\r\nhello\r\n0\r\n\r\n" + next)
	require.NoError(t, d.Start(bodyHead(BodyChunked, 0), 0, buf))
	_, done, err = d.Decode(in)
	require.NoError(t, err)
	require.True(t, done)
	assert.Same(t, &in[3], &d.Body()[0])

	// Two chunks, or a body in two reads, are assembled in the caller's buffer.
	in = []byte("2\r\nhe\r\n3\r\nllo\r\n0\r\n\r\n")
	require.NoError(t, d.Start(bodyHead(BodyChunked, 0), 0, buf))
	_, done, err = d.Decode(in)
	require.NoError(t, err)
	require.True(t, done)
	assert.Equal(t, "hello", string(d.Body()))
	assert.Same(t, unsafe.SliceData(buf[:1]), unsafe.SliceData(d.Body()), "assembled in the caller's buffer")
	assert.Equal(t, len(d.Body()), cap(d.Body()))

	require.NoError(t, d.Start(bodyHead(BodyLength, 5), 0, buf))
	_, done, err = d.Decode([]byte("he"))
	require.NoError(t, err)
	require.False(t, done)
	_, done, err = d.Decode([]byte("llo"))
	require.NoError(t, err)
	require.True(t, done)
	assert.Equal(t, "hello", string(d.Body()))
	assert.Same(t, unsafe.SliceData(buf[:1]), unsafe.SliceData(d.Body()))

	// The buffer grows when it must, and the caller gets it back.
	require.NoError(t, d.Start(bodyHead(BodyLength, 100), 0, nil))
	_, _, _ = d.Decode(make([]byte, 60))
	_, done, _ = d.Decode(make([]byte, 40))
	require.True(t, done)
	assert.GreaterOrEqual(t, cap(d.Buffer()), 100)
	assert.Empty(t, d.Buffer())
}

func TestBodyStart(t *testing.T) {
	var d BodyDecoder
	cases := []struct {
		name string
		req  *Request
		want *ParseError
		done bool
	}{
		{"POST without framing", &Request{Method: MethodPOST}, errLengthRequired, false},
		{"Content-Length over the limit, before any byte", bodyHead(BodyLength, 11), errBodyTooLarge, false},
		{"Content-Length at the limit", bodyHead(BodyLength, 10), nil, false},
		{"Content-Length: 0", bodyHead(BodyLength, 0), nil, true},
		{"GET without a body", &Request{Method: MethodGET}, nil, true},
		{"chunked", bodyHead(BodyChunked, 0), nil, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := d.Start(tc.req, 10, nil)
			if tc.want != nil {
				assert.Equal(t, tc.want, err)
				_, _, err = d.Decode([]byte("x"))
				assert.Equal(t, errBodyState, err, "a failed decoder stays failed")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.done, d.Done())
			if tc.done {
				assert.Empty(t, d.Body())
				n, done, err := d.Decode([]byte(next))
				assert.NoError(t, err)
				assert.True(t, done)
				assert.Zero(t, n, "nothing of the next request is consumed")
			}
		})
	}
	var fresh BodyDecoder
	_, _, err := fresh.Decode([]byte("x"))
	assert.Equal(t, errBodyState, err)
	assert.Equal(t, 411, errLengthRequired.Status)
	assert.Equal(t, 413, errBodyTooLarge.Status)
}

func TestBodyRejects(t *testing.T) {
	long := strings.Repeat("a", 20)
	cases := []struct {
		name string
		wire string
		want *ParseError
		// at is the length of the shortest prefix that already fails: the
		// error comes as soon as the input shows it, not at the end.
		at int
	}{
		{"no size", "\r\n", errChunkSize, 1},
		{"not hex", "g\r\n", errChunkSize, 1},
		{"sign", "+5\r\nhello\r\n0\r\n\r\n", errChunkSize, 1},
		{"0x prefix", "0x5\r\n", errChunkSize, 2},
		{"bare LF after size", "5\nhello\r\n", errChunkCRLF, 2},
		{"bare CR after size", "5\rhello\r\n", errChunkCRLF, 3},
		{"17 hex digits", "00000000000000001\r\n", errChunkSizeLong, 17},
		{"size over the limit, before its data", "65\r\n", errBodyTooLarge, 2},
		{"sizes over the limit together", "32\r\n" + strings.Repeat("x", 50) + "\r\n33\r\n", errBodyTooLarge, 4 + 50 + 2 + 2},
		{"space then end of line", "5 \r\n", errChunkExt, 3},
		{"extension without semicolon", "5 x\r\n", errChunkExt, 3},
		{"control byte in extension", "5;a\x01\r\n", errChunkExt, 4},
		{"bare LF in extension", "5;a\nhello\r\n", errChunkExt, 4},
		{"DEL in extension", "5;\x7f\r\n", errChunkExt, 3},
		{"extensions too long", "1;" + strings.Repeat("e", MaxChunkExtBytes) + "\r\n", errChunkExtLong, 2 + MaxChunkExtBytes},
		{"extensions too long over several chunks", strings.Repeat("1;"+strings.Repeat("e", 300)+"\r\nx\r\n", 4), errChunkExtLong, -1},
		{"data without CRLF", "5\r\nhelloX\r\n", errChunkDataCRLF, 9},
		{"data with bare LF", "5\r\nhello\n0\r\n\r\n", errChunkDataCRLF, 9},
		{"data CR then junk", "5\r\nhello\rX", errChunkDataCRLF, 10},
		{"data longer than its size", "3\r\nhello\r\n", errChunkDataCRLF, 7},
		{"last chunk with bare LF", "0\n\r\n", errChunkCRLF, 2},
		{"missing final CRLF: bare LF", "0\r\n\n", errTrailer, 4},
		{"final CR then junk", "0\r\n\rX", errChunkCRLF, 5},
		{"trailer obs-fold", "0\r\nX: a\r\n b\r\n\r\n", errTrailer, 10},
		{"trailer without colon", "0\r\nX-A\r\n\r\n", errTrailer, 7},
		{"trailer space before colon", "0\r\nX :a\r\n\r\n", errTrailer, 5},
		{"trailer control byte", "0\r\nX: a\x00\r\n\r\n", errTrailer, 8},
		{"trailer bare LF", "0\r\nX: a\n\r\n", errTrailer, 8},
		{"trailer CR then junk", "0\r\nX: a\rb\r\n\r\n", errTrailer, 9},
		{"trailers too long", "0\r\n" + strings.Repeat("X-Long: "+long+"\r\n", MaxTrailerBytes/30+1) + "\r\n", errTrailerLong, -1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var d BodyDecoder
			require.NoError(t, d.Start(bodyHead(BodyChunked, 0), 100, nil))
			_, _, err := decodeAll(t, &d, []byte(tc.wire), nil)
			var pe *ParseError
			require.True(t, errors.As(err, &pe), "got %v", err)
			assert.Equal(t, tc.want, pe)
			assert.NotContains(t, pe.Reason, "\n")
			if tc.at > 0 {
				require.NoError(t, d.Start(bodyHead(BodyChunked, 0), 100, nil))
				_, _, err = decodeAll(t, &d, []byte(tc.wire[:tc.at-1]), nil)
				assert.Equal(t, ErrIncomplete, err, "one byte earlier, nothing is wrong yet")
				require.NoError(t, d.Start(bodyHead(BodyChunked, 0), 100, nil))
				_, _, err = decodeAll(t, &d, []byte(tc.wire[:tc.at]), nil)
				assert.Equal(t, tc.want, err, "known at byte %d", tc.at)
			}
			// And split anywhere, the same error.
			for cut := 1; cut < len(tc.wire); cut += 1 + len(tc.wire)/40 {
				require.NoError(t, d.Start(bodyHead(BodyChunked, 0), 100, nil))
				_, _, err := decodeAll(t, &d, []byte(tc.wire), []int{cut})
				assert.Equal(t, tc.want, err, "cut at %d", cut)
			}
		})
	}
	// Every body rule has its own reason and a case above.
	seen := map[string]bool{}
	for _, tc := range cases {
		seen[tc.want.Reason] = true
	}
	for _, e := range []*ParseError{errChunkSize, errChunkSizeLong, errChunkExt, errChunkExtLong, errChunkCRLF,
		errChunkDataCRLF, errTrailer, errTrailerLong, errBodyTooLarge} {
		assert.True(t, seen[e.Reason], "no case for %q", e.Reason)
	}
}

func TestBodyDecodeDoesNotAllocate(t *testing.T) {
	var d BodyDecoder
	buf := make([]byte, 0, 4096)
	cl := []byte(strings.Repeat("x", 1000) + next)
	chunked := []byte("100\r\n" + strings.Repeat("a", 256) + "\r\n100\r\n" + strings.Repeat("b", 256) + "\r\n0\r\n\r\n")
	lengthReq, chunkedReq := bodyHead(BodyLength, 1000), bodyHead(BodyChunked, 0)
	allocs := testing.AllocsPerRun(200, func() {
		_ = d.Start(lengthReq, 0, buf)
		if _, done, err := d.Decode(cl); !done || err != nil {
			panic("length body")
		}
		_ = d.Start(chunkedReq, 0, d.Buffer())
		if _, done, err := d.Decode(chunked[:100]); done || err != nil {
			panic("first half")
		}
		if _, done, err := d.Decode(chunked[100:]); !done || err != nil || len(d.Body()) != 512 {
			panic("second half")
		}
		buf = d.Buffer()
	})
	assert.Zero(t, allocs)
}

// BenchmarkBodyLength decodes a 1 KiB Content-Length body that arrived
// whole: the view path.
func BenchmarkBodyLength(b *testing.B) {
	var d BodyDecoder
	in := []byte(strings.Repeat("x", 1024))
	req := bodyHead(BodyLength, 1024)
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		_ = d.Start(req, 0, nil)
		if _, done, err := d.Decode(in); !done || err != nil {
			b.Fatal(done, err)
		}
	}
}

// BenchmarkBodyChunked decodes a 4 KiB chunked body of 16 chunks arriving
// in 1,500-byte reads: the assembling path.
func BenchmarkBodyChunked(b *testing.B) {
	var d BodyDecoder
	var wire []byte
	for i := 0; i < 16; i++ {
		wire = append(wire, "100\r\n"...)
		wire = append(wire, strings.Repeat("z", 256)...)
		wire = append(wire, "\r\n"...)
	}
	wire = append(wire, "0\r\n\r\n"...)
	req := bodyHead(BodyChunked, 0)
	buf := make([]byte, 0, 4096)
	b.SetBytes(int64(len(wire)))
	b.ReportAllocs()
	for b.Loop() {
		_ = d.Start(req, 0, buf)
		for off := 0; off < len(wire); {
			end := min(off+1500, len(wire))
			n, _, err := d.Decode(wire[off:end])
			if err != nil {
				b.Fatal(err)
			}
			off += n
		}
		if !d.Done() || len(d.Body()) != 4096 {
			b.Fatal("incomplete")
		}
	}
}

// TestPipelinedKeepAlive is the engine's loop on one keep-alive connection:
// head, body, next head from what remains — whether the bytes arrive at
// once or one at a time.
func TestPipelinedKeepAlive(t *testing.T) {
	wire := "POST /streams/a?event=e HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello" +
		"POST /publish HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Type: application/x-ndjson\r\n\r\n" +
		"1a\r\n{\"stream\":\"b\",\"data\":\"x\"}\n\r\n0\r\n\r\n" +
		"POST /streams/c HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n" +
		"GET /streams/d HTTP/1.1\r\nHost: x\r\n\r\n"
	want := []string{"POST /streams/a?event=e keep=true body=hello",
		"POST /publish keep=true body={\"stream\":\"b\",\"data\":\"x\"}\n",
		"POST /streams/c keep=false body=",
		"GET /streams/d keep=true body="}
	for _, step := range []int{len(wire), 1, 7} {
		var p Parser
		var d BodyDecoder
		var got []string
		in := []byte(wire)
		consumed, inBody, line := 0, false, ""
		for arrived := min(step, len(in)); ; arrived = min(arrived+step, len(in)) {
			for consumed < arrived || inBody && d.Done() {
				if !inBody {
					req, err := p.Parse(in[consumed:arrived], 8192)
					if err == ErrIncomplete {
						break
					}
					require.NoError(t, err)
					line = string(req.RawMethod) + " " + string(req.Target) + " keep=" + strconv.FormatBool(req.KeepAlive)
					consumed += req.HeadLen
					require.NoError(t, d.Start(req, 0, d.Buffer()))
					inBody = true
					continue
				}
				n, done, err := d.Decode(in[consumed:arrived])
				require.NoError(t, err)
				consumed += n
				if !done {
					break
				}
				got = append(got, line+" body="+string(d.Body()))
				inBody = false
			}
			if arrived == len(in) {
				break
			}
		}
		assert.Equal(t, want, got, "arriving %d bytes at a time", step)
		assert.Equal(t, len(in), consumed)
	}
}
