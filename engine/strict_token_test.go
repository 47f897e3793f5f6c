package engine

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// signJWS signs header and payload, both raw JSON, with the test secret (HS256), so that a
// test can send what no JWT library would produce: duplicate keys, crit, strings for numbers.
func signJWS(header, payload string) string {
	enc := base64.RawURLEncoding
	unsigned := enc.EncodeToString([]byte(header)) + "." + enc.EncodeToString([]byte(payload))
	mac := hmac.New(sha256.New, []byte(testSecret))
	mac.Write([]byte(unsigned))
	return unsigned + "." + enc.EncodeToString(mac.Sum(nil))
}

const jwsHeader = `{"alg":"HS256","typ":"JWT"}`

func expIn(d time.Duration) string { return strconv.FormatInt(time.Now().Add(d).Unix(), 10) }

// TestStrictJWT: issue 23 — a JWT whose exp is a string, whose header carries crit (RFC 7515
// §4.1.11: a recipient that does not understand the listed extensions must reject the token),
// or whose claims or header repeat a key (an expired exp followed by a valid one passed, the
// last one winning) was accepted. Each is now 401 naming what was wrong, for subscribers and
// publishers alike.
func TestStrictJWT(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	exp, past := expIn(time.Hour), expIn(-time.Hour)
	grants := `"pgsse":{"streams":["jwt/*"],"publish":["jwt/*"]}`
	cases := []struct {
		name string
		tok  string
		says string
	}{
		{"exp as a string of digits", signJWS(jwsHeader, `{"exp":"`+exp+`",`+grants+`}`), "token claim exp: must be a number"},
		{"nbf as a string", signJWS(jwsHeader, `{"exp":`+exp+`,"nbf":"0",`+grants+`}`), "token claim nbf: must be a number"},
		{"crit header", signJWS(`{"alg":"HS256","typ":"JWT","crit":["exp"],"exp":1}`, `{"exp":`+exp+`,`+grants+`}`), "crit"},
		{"expired exp, then a valid one", signJWS(jwsHeader, `{"exp":`+past+`,`+grants+`,"exp":`+exp+`}`), "token claim exp: appears twice"},
		{"a key twice inside pgsse", signJWS(jwsHeader, `{"exp":`+exp+`,"pgsse":{"streams":["none"],"publish":["none"],"streams":["jwt/*"],"publish":["jwt/*"]}}`),
			"token claim pgsse.streams: appears twice"},
		{"pgsse twice", signJWS(jwsHeader, `{"exp":`+exp+`,"pgsse":{},`+grants+`}`), "token claim pgsse: appears twice"},
		{"a key twice in the header", signJWS(`{"alg":"none","alg":"HS256"}`, `{"exp":`+exp+`,`+grants+`}`), "token header: alg appears twice"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := get(t, addr, "/streams/jwt/1", bearerH(tc.tok))
			require.Equal(t, 401, r.Status, "subscribe: %s", r.Body)
			assert.Contains(t, r.Header.Get("WWW-Authenticate"), "Bearer")
			assert.Contains(t, r.Body, tc.says)
			assertErrorBody(t, r)

			c := dialPub(t, addr)
			r = c.do(post("/streams/jwt/1", "x", bearerH(tc.tok)))
			require.Equal(t, 401, r.Status, "publish: %s", r.Body)
			assert.Contains(t, r.Body, tc.says)
		})
	}
	assert.Equal(t, "0", countEvents(t, ts.DSN, "jwt/1"), "nothing was published")
	// The same token written plainly is accepted: the refusals are about the shape alone.
	ok := signJWS(jwsHeader, `{"exp":`+exp+`,`+grants+`}`)
	c := dial(t, addr, "/streams/jwt/1", bearerH(ok))
	require.Equal(t, 200, c.Status, c.Body)
}

// TestStrictTokenShapes: issue 26 — a new user minting tokens in their own backend got
// "token is malformed" for a claim of the wrong shape (the text garbage gets), had a misspelt
// key under pgsse or a grant at the top level silently ignored ("token does not grant stream
// …" with no hint why), and an exp in milliseconds accepted as lasting for millennia.
func TestStrictTokenShapes(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	exp := expIn(time.Hour)
	cases := []struct {
		name    string
		payload string
		status  int
		says    []string
	}{
		{"pgsse is an array", `{"exp":` + exp + `,"pgsse":["shape/1"]}`, 401,
			[]string{"token claim pgsse: must be an object", `{"streams":[`}},
		{"streams is a string", `{"exp":` + exp + `,"pgsse":{"streams":"shape/1","publish":"shape/1"}}`, 401,
			[]string{"token claim pgsse.streams: must be an array of strings"}},
		{"a stream that is a number", `{"exp":` + exp + `,"pgsse":{"streams":[7],"publish":[7]}}`, 401,
			[]string{"token claim pgsse.streams[0]: must be a string"}},
		{"misspelt key under pgsse", `{"exp":` + exp + `,"pgsse":{"stream":["shape/1"],"publishes":["shape/1"]}}`, 401,
			[]string{"token claim pgsse.stream: unknown key", "streams, channels, publish, tags"}},
		{"channel instead of channels", `{"exp":` + exp + `,"pgsse":{"channel":["jobs"]}}`, 401,
			[]string{"token claim pgsse.channel: unknown key"}},
		{"exp in milliseconds", `{"exp":` + strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10) + `,"pgsse":{"streams":["shape/1"],"publish":["shape/1"]}}`, 401,
			[]string{"token claim exp:", "milliseconds"}},
		{"grants at the top level", `{"exp":` + exp + `,"streams":["shape/1"],"publish":["shape/1"]}`, 403,
			[]string{"top level", `"pgsse"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tok := signJWS(jwsHeader, tc.payload)
			r := get(t, addr, "/streams/shape/1", bearerH(tok))
			require.Equal(t, tc.status, r.Status, "subscribe: %s", r.Body)
			assertErrorBody(t, r)
			for _, s := range tc.says {
				assert.Contains(t, r.Body, s, "subscribe")
			}
			c := dialPub(t, addr)
			r = c.do(post("/streams/shape/1", "x", bearerH(tok)))
			require.Equal(t, tc.status, r.Status, "publish: %s", r.Body)
			for _, s := range tc.says {
				assert.Contains(t, r.Body, s, "publish")
			}
			if tc.status == 403 {
				r = c.do(post("/publish", `{"stream":"shape/1","data":"x"}`, bearerH(tok), "Content-Type: application/x-ndjson"))
				require.Equal(t, 403, r.Status, "batch: %s", r.Body)
				assert.Contains(t, r.Body, "top level", "batch")
			}
		})
	}
	assert.Equal(t, "0", countEvents(t, ts.DSN, "shape/1"), "nothing was published")
}
