package engine

import (
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/auth"
)

// The publishing path's limits under attack (issue 23): what one publisher can make the
// others wait for.

// A refusal decided by the verifier pool (the token was not in its cache) leaves the
// connection idle with the requests the client pipelined behind it already in the input:
// they are answered at once, not once the client sends more bytes or the keep-alive timeout
// ends the connection (issue 23: 8/8 hung for ≈ 31 s).
func TestPublishPipelinedAfterPoolVerdict(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	granted := bearerH(publishToken(t, "pv/*"))
	// Warm the cache for the request behind, so that only the first one goes to the pool.
	require.Equal(t, 200, dialPub(t, addr).do(post("/streams/pv/warm", "x", granted)).Status)

	for i, tc := range []struct {
		name   string
		status int
		behind string // "POST" or "GET"
	}{
		{"401 then POST", 401, "POST"},
		{"401 then GET", 401, "GET"},
		{"403 then POST", 403, "POST"},
		{"403 then GET", 403, "GET"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A token no request has used yet, so that its verdict comes from the pool.
			claims := auth.Claims{Publish: []string{"elsewhere/*"}, Subject: "pv-" + strconv.Itoa(i)}
			var first string
			if tc.status == 401 {
				tok, err := auth.Mint(auth.MintKey{Secret: []byte("another secret, 32 bytes or more!!")}, claims, time.Hour, "", "", time.Now())
				require.NoError(t, err)
				first = bearerH(tok)
			} else {
				first = bearerH(token(t, claims, time.Hour))
			}
			c := dialPub(t, addr)
			raw := post("/streams/pv/"+strconv.Itoa(i), "refused", first)
			if tc.behind == "POST" {
				raw += post("/streams/pv/"+strconv.Itoa(i), "behind", granted)
			} else {
				raw += request("GET", "/streams/pv/"+strconv.Itoa(i), bearerH(allStreams(t)))
			}
			c.send(raw) // one write: nothing more follows
			r, err := c.readErr(5 * time.Second)
			require.NoError(t, err)
			require.Equal(t, tc.status, r.Status, r.Body)
			if tc.behind == "POST" {
				r, err = c.readErr(5 * time.Second)
				require.NoError(t, err, "the pipelined POST is answered without more bytes from the client")
				assert.Equal(t, 200, r.Status, r.Body)
				return
			}
			_ = c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(c.r, &http.Request{Method: "GET"})
			require.NoError(t, err, "the pipelined GET is answered without more bytes from the client")
			assert.Equal(t, 200, resp.StatusCode)
			assert.Equal(t, "text/event-stream; charset=utf-8", resp.Header.Get("Content-Type"))
		})
	}
}

// While a request waits for its token's verdict, what the client sends behind it stays in the
// input, at most publishPipelineBytes of it: more closes the connection at once, as it does
// while a request waits for its COMMIT (it used to pile up in gnet's buffer, without bound,
// for as long as the verdict took).
func TestPublishPipelineBoundWhileVerifying(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	release := holdVerifier(t, ts)
	defer release()
	c := dialPub(t, ts.Addr().String())
	c.send(post("/streams/pb/1", "body", bearerH(publishToken(t, "pb/*"))))
	ahead := make([]byte, publishPipelineBytes+1)
	for i := range ahead {
		ahead[i] = 'x'
	}
	c.send(string(ahead))
	start := time.Now()
	c.expectEOF()
	assert.Less(t, time.Since(start), 5*time.Second, "closed at once, not after the verdict or the body deadline")
}

// holdVerifier keeps every goroutine of ts's verifier pool busy until release is called
// (also at the end of the test): tokens that are not in its cache wait in its queue
// meanwhile, as they do when a storm of new tokens swamps it.
func holdVerifier(t testing.TB, ts *testServer) (release func()) {
	t.Helper()
	var pool *auth.Pool
	ts.onLoop(t, func() { pool = ts.tok.pool })
	require.NotNil(t, pool)
	block := make(chan struct{})
	var busy sync.WaitGroup
	for i := range verifyWorkers() {
		busy.Add(1)
		require.True(t, pool.Submit([]byte("held-"+strconv.Itoa(i)), time.Now(), func(*auth.Claims, error) {
			busy.Done()
			<-block
		}))
	}
	busy.Wait()
	var once sync.Once
	release = func() { once.Do(func() { close(block) }) }
	t.Cleanup(release)
	return release
}
