package auth

import (
	"encoding/base64"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 23 (a JWT's exp as a string, crit, repeated keys) and issue 26 (claims of the wrong
// shape, misspelt keys under pgsse, grants at the top level, exp in milliseconds): the token's
// JSON is read strictly (wire.go), and each refusal names what was wrong.

const hsHeader = `{"alg":"HS256","typ":"JWT"}`

// signRaw signs header and payload as they are (HS256): JSON no library would write.
func signRaw(t testing.TB, secret []byte, header, payload string) []byte {
	t.Helper()
	enc := base64.RawURLEncoding
	unsigned := enc.EncodeToString([]byte(header)) + "." + enc.EncodeToString([]byte(payload))
	sig, err := jwt.SigningMethodHS256.Sign(unsigned, secret)
	require.NoError(t, err)
	return []byte(unsigned + "." + enc.EncodeToString(sig))
}

func TestVerifyStrictJSON(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	v, err := NewVerifier(Config{Secret: secret})
	require.NoError(t, err)
	exp := strconv.FormatInt(t0.Add(time.Hour).Unix(), 10)
	past := strconv.FormatInt(t0.Add(-time.Hour).Unix(), 10)
	ms := strconv.FormatInt(t0.Add(time.Hour).UnixMilli(), 10)
	deep := strings.Repeat(`{"a":`, maxJSONDepth) + "1" + strings.Repeat("}", maxJSONDepth)
	many := ""
	for i := 0; i < 40; i++ {
		many += `"k` + strconv.Itoa(i) + `":` + strconv.Itoa(i) + ","
	}
	cases := []struct {
		name, header, payload, want string
	}{
		// Registered claims: their documented types.
		{"exp a string of digits", hsHeader, `{"exp":"` + exp + `"}`, "token claim exp: must be a number (seconds since 1970, a NumericDate), not a string"},
		{"exp an array", hsHeader, `{"exp":[` + exp + `]}`, "token claim exp: must be a number (seconds since 1970, a NumericDate)"},
		{"exp true", hsHeader, `{"exp":true}`, "token claim exp: must be a number (seconds since 1970, a NumericDate)"},
		{"nbf a string", hsHeader, `{"exp":` + exp + `,"nbf":"0"}`, "token claim nbf: must be a number (seconds since 1970, a NumericDate), not a string"},
		{"iat a string", hsHeader, `{"exp":` + exp + `,"iat":"0"}`, "token claim iat: must be a number (seconds since 1970, a NumericDate), not a string"},
		{"exp in milliseconds", hsHeader, `{"exp":` + ms + `}`, "token claim exp: is over 10^11 (the year 5138): it looks like milliseconds, but NumericDates are seconds since 1970 (in JavaScript: Math.floor(Date.now() / 1000))"},
		{"exp just over 10^11", hsHeader, `{"exp":100000000000.5}`, "token claim exp: is over 10^11"},
		{"exp in microseconds", hsHeader, `{"exp":1.8e16}`, "token claim exp: is over 10^11"},
		{"nbf in milliseconds", hsHeader, `{"exp":` + exp + `,"nbf":` + ms + `}`, "token claim nbf: is over 10^11"},
		{"exp out of range", hsHeader, `{"exp":1e400}`, "token claim exp: is too large for a NumericDate"},
		{"sub a number", hsHeader, `{"exp":` + exp + `,"sub":7}`, "token claim sub: must be a string"},
		{"iss an object", hsHeader, `{"exp":` + exp + `,"iss":{}}`, "token claim iss: must be a string"},
		{"aud a number", hsHeader, `{"exp":` + exp + `,"aud":1}`, "token claim aud: must be a string or an array of strings"},
		{"aud with a number", hsHeader, `{"exp":` + exp + `,"aud":["a",1]}`, "token claim aud: must be a string or an array of strings"},
		// The pgsse claim: an object of known keys, each a list of strings.
		{"pgsse an array", hsHeader, `{"exp":` + exp + `,"pgsse":["orders/42"]}`, `token claim pgsse: must be an object, e.g. {"streams":["orders/42"],"publish":["orders/*"]}`},
		{"pgsse a string", hsHeader, `{"exp":` + exp + `,"pgsse":"orders/42"}`, "token claim pgsse: must be an object"},
		{"streams a string", hsHeader, `{"exp":` + exp + `,"pgsse":{"streams":"orders/42"}}`, `token claim pgsse.streams: must be an array of strings, e.g. ["orders/42","chat/*"]`},
		{"tags an object", hsHeader, `{"exp":` + exp + `,"pgsse":{"tags":{"user":7}}}`, "token claim pgsse.tags: must be an array of strings"},
		{"a stream that is a number", hsHeader, `{"exp":` + exp + `,"pgsse":{"streams":["a",42]}}`, "token claim pgsse.streams[1]: must be a string"},
		{"a nested list", hsHeader, `{"exp":` + exp + `,"pgsse":{"channels":[["jobs"]]}}`, "token claim pgsse.channels[0]: must be a string"},
		{"stream for streams", hsHeader, `{"exp":` + exp + `,"pgsse":{"stream":["orders/42"]}}`, "token claim pgsse.stream: unknown key: pgsse takes streams, channels, publish, tags"},
		{"channel for channels", hsHeader, `{"exp":` + exp + `,"pgsse":{"channel":["jobs"]}}`, "token claim pgsse.channel: unknown key"},
		{"publishes for publish", hsHeader, `{"exp":` + exp + `,"pgsse":{"publishes":["a/*"]}}`, "token claim pgsse.publishes: unknown key"},
		{"Streams in another case", hsHeader, `{"exp":` + exp + `,"pgsse":{"Streams":["a"]}}`, "token claim pgsse.Streams: unknown key"},
		// Repeated keys, anywhere: which one counts would depend on the decoder.
		{"exp twice, expired first", hsHeader, `{"exp":` + past + `,"exp":` + exp + `}`, "token claim exp: appears twice (a token must not repeat a key: which one would count depends on the decoder)"},
		{"exp twice, once escaped", hsHeader, `{"exp":` + exp + `,"\u0065xp":` + exp + `}`, "token claim exp: appears twice"},
		{"pgsse twice", hsHeader, `{"exp":` + exp + `,"pgsse":{},"pgsse":{"streams":["*"]}}`, "token claim pgsse: appears twice"},
		{"streams twice under pgsse", hsHeader, `{"exp":` + exp + `,"pgsse":{"streams":["a"],"streams":["*"]}}`, "token claim pgsse.streams: appears twice"},
		{"a key twice in the application's claims", hsHeader, `{"exp":` + exp + `,"app":{"role":"user","role":"admin"}}`, "token claim app.role: appears twice"},
		{"a key twice in an array's object", hsHeader, `{"exp":` + exp + `,"app":[1,{"a":1,"a":2}]}`, "token claim app[1].a: appears twice"},
		{"a key twice among many", hsHeader, `{` + many + `"exp":` + exp + `,"k33":0}`, "token claim k33: appears twice"},
		{"a misplaced grant twice", hsHeader, `{"exp":` + exp + `,"streams":["a"],"streams":["b"]}`, "token claim streams: appears twice"},
		{"nested too deeply", hsHeader, `{"exp":` + exp + `,"app":` + deep + `}`, "token claim app: is nested more than 32 levels deep"},
		// The header.
		{"crit", `{"alg":"HS256","crit":["exp"],"exp":1}`, `{"exp":` + exp + `}`, "token header: crit is not accepted: pgsse implements no JWS extension, so a token that lists one must be refused (RFC 7515 §4.1.11)"},
		{"crit empty", `{"alg":"HS256","crit":[]}`, `{"exp":` + exp + `}`, "token header: crit is not accepted"},
		{"alg twice", `{"alg":"none","alg":"HS256"}`, `{"exp":` + exp + `}`, "token header: alg appears twice"},
		{"typ twice", `{"typ":"JWT","alg":"HS256","typ":"JWT"}`, `{"exp":` + exp + `}`, "token header: typ appears twice"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := v.Verify(signRaw(t, secret, tc.header, tc.payload), t0)
			assert.Nil(t, c)
			require.Error(t, err)
			assert.True(t, strings.HasPrefix(err.Error(), tc.want), "got %q, want %q…", err, tc.want)
			if strings.HasPrefix(tc.want, "token header:") {
				assert.ErrorIs(t, err, ErrHeader)
			} else {
				assert.ErrorIs(t, err, ErrClaims)
			}
			assert.NotContains(t, err.Error(), "\n")
		})
	}
}

func TestVerifyStrictJSONAccepts(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	v, err := NewVerifier(Config{Secret: secret, Audience: "pgsse", Issuer: "app"})
	require.NoError(t, err)
	exp := strconv.FormatInt(t0.Add(time.Hour).Unix(), 10)
	base := `"exp":` + exp + `,"iss":"app","aud":"pgsse"`
	cases := []struct {
		name, payload string
		check         func(t *testing.T, c *Claims)
	}{
		{"nulls are absent", `{` + base + `,"nbf":null,"iat":null,"sub":null,"jti":null,"pgsse":{"streams":null,"channels":null,"publish":null,"tags":null}}`, func(t *testing.T, c *Claims) {
			assert.Empty(t, c.Streams)
			assert.Empty(t, c.Subject)
		}},
		{"pgsse null", `{` + base + `,"pgsse":null}`, func(t *testing.T, c *Claims) { assert.Empty(t, c.Streams) }},
		{"empty lists", `{` + base + `,"pgsse":{"streams":[],"tags":[]}}`, func(t *testing.T, c *Claims) {
			assert.Empty(t, c.Streams)
			assert.False(t, c.AllowsStream([]byte("a")))
		}},
		{"every claim", `{ "sub" : "u\u00e9" , ` + base + `, "iat": 1.5e9, "jti":"x", "nbf": 0,
			"pgsse": {"streams": ["a", "b/*"], "channels": ["jobs"], "publish": ["p/*"], "tags": ["t:1"]},
			"app": {"nested": [1, {"a": [true, false, null, -0.5e-3, "\ud83d\udc18"]}]}}`, func(t *testing.T, c *Claims) {
			assert.Equal(t, []string{"a", "b/*"}, c.Streams)
			assert.Equal(t, []string{"jobs"}, c.Channels)
			assert.Equal(t, []string{"p/*"}, c.Publish)
			assert.Equal(t, []string{"t:1"}, c.Tags)
			assert.Equal(t, "ué", c.Subject)
			assert.Equal(t, t0.Add(time.Hour).Unix(), c.Expires.Unix())
			assert.Empty(t, c.Misplaced)
		}},
		{"aud in an array", `{"exp":` + exp + `,"iss":"app","aud":["web","pgsse"]}`, nil},
		{"keys that only look alike", `{` + base + `,"app":{"\ud800":1,"\udc00":2,"\u00e9":3,"e\u0301":4}}`, nil},
		{"the same key in different objects", `{` + base + `,"app":{"exp":1,"x":{"exp":2}},"b":[{"k":1},{"k":2}]}`, nil},
		{"deep, but not too deep", `{` + base + `,"app":` + strings.Repeat(`[`, maxJSONDepth-1) + strings.Repeat(`]`, maxJSONDepth-1) + `}`, nil},
		{"grants at the top level: not refused, but remembered", `{` + base + `,"streams":["a"],"tags":["t"],"pgsse":{"streams":["b"]}}`, func(t *testing.T, c *Claims) {
			assert.Equal(t, []string{"b"}, c.Streams)
			assert.Equal(t, []string{"streams", "tags"}, c.Misplaced)
			assert.Equal(t, `token does not grant stream a (the token has "streams", "tags" at its top level, but pgsse reads grants only under "pgsse": {"pgsse":{"streams":[…],"publish":[…]}})`,
				c.NotGranted("stream a"))
		}},
		{"exp of exactly 10^11", `{"exp":1e11,"iss":"app","aud":"pgsse"}`, func(t *testing.T, c *Claims) { assert.Equal(t, maxExpires, c.Expires) }},
		{"iat in milliseconds is not used, so not refused", `{` + base + `,"iat":1700000000000}`, nil},
		{"a negative nbf", `{` + base + `,"nbf":-1e300}`, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := v.Verify(signRaw(t, secret, hsHeader, tc.payload), t0)
			require.NoError(t, err)
			if tc.check != nil {
				tc.check(t, c)
			}
		})
	}
	var none *Claims
	assert.Equal(t, "token does not grant stream a", none.NotGranted("stream a"))
	assert.Equal(t, "token does not grant stream a", (&Claims{}).NotGranted("stream a"))
}

// The header is read before the signature is checked (crit must be refused whatever the
// key), the claims only after: a forged token's claims are never reported.
func TestVerifyStrictOrder(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	v, err := NewVerifier(Config{Secret: secret})
	require.NoError(t, err)
	forged := signRaw(t, []byte("another secret, equally long...."), hsHeader, `{"exp":"soon","exp":1}`)
	_, err = v.Verify(forged, t0)
	assert.ErrorIs(t, err, ErrSignature)
	forged = signRaw(t, []byte("another secret, equally long...."), `{"alg":"HS256","crit":["b64"]}`, `{"exp":1}`)
	_, err = v.Verify(forged, t0)
	assert.ErrorIs(t, err, ErrHeader)
}

// A refusal says when the token holds the other kind of grant for the stream, and still where
// misplaced grants belong.
func TestNotGrantedNamesTheOtherKind(t *testing.T) {
	pub := &Claims{Publish: []string{"orders/*"}}
	assert.Equal(t, `token does not grant stream orders/42 (it grants publishing to it, not subscribing: subscribing needs "streams" under "pgsse", e.g. pgsse token --stream)`,
		pub.NotGrantedStream([]byte("orders/42"), "stream orders/42"))
	assert.Equal(t, "token does not grant stream chat/7", pub.NotGrantedStream([]byte("chat/7"), "stream chat/7"))
	sub := &Claims{Streams: []string{"orders/42"}, Misplaced: []string{"publish"}}
	assert.Equal(t, `token does not grant publishing to stream orders/42 (it grants subscribing to it, not publishing: publishing needs "publish" under "pgsse", e.g. pgsse token --publish)`+
		` (the token has "publish" at its top level, but pgsse reads grants only under "pgsse": {"pgsse":{"streams":[…],"publish":[…]}})`,
		sub.NotGrantedPublish([]byte("orders/42"), "publishing to stream orders/42"))
	var none *Claims
	assert.Equal(t, "token does not grant stream a", none.NotGrantedStream([]byte("a"), "stream a"))
	assert.Equal(t, "token does not grant publishing to stream a", none.NotGrantedPublish([]byte("a"), "publishing to stream a"))
}
