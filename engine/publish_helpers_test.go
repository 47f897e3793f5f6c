package engine

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/auth"
)

// Helpers of the publish_*_test.go tests: raw POST requests, a keep-alive client that reads
// one response at a time, and publish tokens.

// post builds a complete POST request with a Content-Length body.
func post(target, body string, headers ...string) string {
	return request("POST", target, append(headers, "Content-Length: "+strconv.Itoa(len(body)))...) + body
}

// postChunked builds a complete POST request whose body is sent in the given chunks.
func postChunked(target string, chunks []string, headers ...string) string {
	var b strings.Builder
	b.WriteString(request("POST", target, append(headers, "Transfer-Encoding: chunked")...))
	for _, c := range chunks {
		b.WriteString(strconv.FormatInt(int64(len(c)), 16) + "\r\n" + c + "\r\n")
	}
	b.WriteString("0\r\n\r\n")
	return b.String()
}

// publishToken grants publishing to the patterns (and nothing else).
func publishToken(t testing.TB, patterns ...string) string {
	return token(t, auth.Claims{Publish: patterns}, time.Hour)
}

// pubClient is one keep-alive connection that sends requests and reads their answers in
// order.
type pubClient struct {
	t    testing.TB
	conn net.Conn
	r    *bufio.Reader
}

func dialPub(t testing.TB, addr string) *pubClient {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return &pubClient{t: t, conn: conn, r: bufio.NewReader(conn)}
}

// send writes raw bytes (one or several requests).
func (c *pubClient) send(raw string) {
	c.t.Helper()
	_ = c.conn.SetWriteDeadline(time.Now().Add(15 * time.Second))
	_, err := c.conn.Write([]byte(raw))
	require.NoError(c.t, err)
}

// read reads one complete response (its body by Content-Length).
func (c *pubClient) read() httpResult {
	c.t.Helper()
	r, err := c.readErr(30 * time.Second)
	require.NoError(c.t, err, "reading a response")
	return r
}

func (c *pubClient) readErr(timeout time.Duration) (httpResult, error) {
	_ = c.conn.SetReadDeadline(time.Now().Add(timeout))
	defer c.conn.SetReadDeadline(time.Time{})
	resp, err := http.ReadResponse(c.r, &http.Request{Method: "POST"})
	if err != nil {
		return httpResult{}, err
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return httpResult{}, err
	}
	return httpResult{Status: resp.StatusCode, Header: resp.Header, Body: string(body), Close: resp.Close}, nil
}

// do sends one request and reads its answer.
func (c *pubClient) do(raw string) httpResult {
	c.t.Helper()
	c.send(raw)
	return c.read()
}

// expectEOF asserts that the server closes the connection (after any answers read).
func (c *pubClient) expectEOF() {
	c.t.Helper()
	_ = c.conn.SetReadDeadline(time.Now().Add(15 * time.Second))
	b, err := c.r.ReadByte()
	require.Error(c.t, err, "the server must close the connection (read %q)", b)
	require.True(c.t, isEOF(err) || strings.Contains(err.Error(), "reset"), "want EOF, got %v", err)
}

// published decodes a 200 answer of POST /streams.
type published struct {
	Stream string `json:"stream"`
	ID     *int64 `json:"id"`
}

func decodePublished(t testing.TB, r httpResult) published {
	t.Helper()
	require.Equal(t, 200, r.Status, r.Body)
	require.Equal(t, "application/json", r.Header.Get("Content-Type"))
	var p published
	require.NoError(t, json.Unmarshal([]byte(r.Body), &p), r.Body)
	return p
}

// decodeIDs decodes a 200 answer of POST /publish (0 for null).
func decodeIDs(t testing.TB, r httpResult) []int64 {
	t.Helper()
	require.Equal(t, 200, r.Status, r.Body)
	var v struct {
		IDs []*int64 `json:"ids"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.Body), &v), r.Body)
	ids := make([]int64, len(v.IDs))
	for i, id := range v.IDs {
		if id != nil {
			ids[i] = *id
		}
	}
	return ids
}
