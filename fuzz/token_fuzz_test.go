package fuzz

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/golang-jwt/jwt/v5"

	"github.com/pgsse/pgsse/auth"
)

// refJSONStringUTF8 is the reference for "a JSON string literal spells valid UTF-8", written
// the obvious way: decode it into runes by hand (raw UTF-8, escapes, surrogate pairs through
// utf16.DecodeRune) and fail on anything that is not a rune.
func refJSONStringUTF8(lit []byte) bool {
	s := lit[1 : len(lit)-1]
	var pending rune = -1 // a high surrogate waiting for its low half
	for len(s) > 0 {
		if s[0] != '\\' || len(s) < 2 || s[1] != 'u' {
			if pending >= 0 {
				return false
			}
			r, n := utf8.DecodeRune(s)
			if r == utf8.RuneError && n == 1 {
				return false
			}
			if s[0] == '\\' {
				n = 2 // an escape other than \u: one byte after the backslash
			}
			s = s[n:]
			continue
		}
		v, err := strconv.ParseUint(string(s[2:6]), 16, 16)
		if err != nil {
			return false
		}
		r := rune(v)
		s = s[6:]
		switch {
		case pending >= 0:
			if utf16.DecodeRune(pending, r) == utf8.RuneError {
				return false
			}
			pending = -1
		case utf16.IsSurrogate(r) && r < 0xDC00:
			pending = r
		case utf16.IsSurrogate(r):
			return false
		}
	}
	return pending < 0
}

// FuzzVerifyTags: a token's tags travel as JSON text; whatever that text is, a token the
// verifier accepts has exactly the tags it was signed with (no U+FFFD slipped in for bytes
// that were not UTF-8), and one whose tag text is not UTF-8 is refused naming the claim.
func FuzzVerifyTags(f *testing.F) {
	for _, s := range []string{`"a"`, `"\ud83d\udc18"`, `"\udcff"`, "\"\xff\"", `"\\udcff"`, `"\ufffd"`, `"x\ud83d"`, `"\ud83d\u0041"`, `"\n"`} {
		f.Add([]byte(s))
	}
	secret := []byte("0123456789abcdef0123456789abcdef")
	v, err := auth.NewVerifier(auth.Config{Secret: secret})
	if err != nil {
		f.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	enc := base64.RawURLEncoding
	head := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "."
	f.Fuzz(func(t *testing.T, lit []byte) {
		if len(lit) < 2 || lit[0] != '"' || !json.Valid(lit) {
			return
		}
		var want string
		if json.Unmarshal(lit, &want) != nil {
			return
		}
		unsigned := head + enc.EncodeToString([]byte(`{"exp":1800000000,"pgsse":{"tags":[`+string(lit)+`]}}`))
		sig, err := jwt.SigningMethodHS256.Sign(unsigned, secret)
		if err != nil {
			t.Fatal(err)
		}
		c, err := v.Verify([]byte(unsigned+"."+enc.EncodeToString(sig)), now)
		utf8OK := refJSONStringUTF8(lit)
		switch {
		case err == nil:
			if !utf8OK {
				t.Fatalf("tag %q is not UTF-8 on the wire but the token was accepted with tags %q", lit, c.Tags)
			}
			if len(c.Tags) != 1 || c.Tags[0] != want {
				t.Fatalf("tag %q: accepted with tags %q, want [%q]", lit, c.Tags, want)
			}
		case !utf8OK:
			var ce *auth.ClaimError
			if !errors.As(err, &ce) || ce.Claim != "pgsse.tags" || ce.Index != 0 {
				t.Fatalf("tag %q is not UTF-8: got %v, want a ClaimError naming pgsse.tags[0]", lit, err)
			}
		}
	})
}

// refToken is what a token's claims grant, as the reference decoder reads them.
type refToken struct {
	streams, channels, publish, tags, misplaced []string
	sub                                         string
	exp, nbf                                    int64 // whole seconds; nbf 0 = none
	hasNbf                                      bool
}

var errRefSkip = errors.New("reference: outside what the reference decides")

// refMaxDepth is auth's bound on the nesting of a token's JSON.
const refMaxDepth = 32

// refWalk reads one JSON value from dec into Go values (map[string]any, []any, json.Number,
// string, bool, nil), written the obvious way with encoding/json's token stream: an object
// that repeats a key (compared as decoded) is an error, and so is nesting deeper than
// refMaxDepth. keys, when not nil, receives the object's keys in order.
func refWalk(dec *json.Decoder, depth int, keys *[]string) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch tok {
	case json.Delim('{'):
		if depth+1 > refMaxDepth {
			return nil, errors.New("too deep")
		}
		obj := map[string]any{}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return nil, err
			}
			key := k.(string)
			if _, dup := obj[key]; dup {
				return nil, errors.New("repeated key " + key)
			}
			v, err := refWalk(dec, depth+1, nil)
			if err != nil {
				return nil, err
			}
			obj[key] = v
			if keys != nil {
				*keys = append(*keys, key)
			}
		}
		_, err := dec.Token() // '}'
		return obj, err
	case json.Delim('['):
		if depth+1 > refMaxDepth {
			return nil, errors.New("too deep")
		}
		arr := []any{}
		for dec.More() {
			v, err := refWalk(dec, depth+1, nil)
			if err != nil {
				return nil, err
			}
			arr = append(arr, v)
		}
		_, err := dec.Token() // ']'
		return arr, err
	}
	return tok, nil
}

// refStrings is v as a list of strings: null is none, anything but an array of strings fails.
func refStrings(v any) ([]string, bool) {
	if v == nil {
		return nil, true
	}
	arr, ok := v.([]any)
	if !ok {
		return nil, false
	}
	out := []string{}
	for _, e := range arr {
		s, ok := e.(string)
		if !ok {
			return nil, false
		}
		out = append(out, s)
	}
	return out, true
}

// refDate is a NumericDate claim in whole seconds (floored, as the JWT library truncates):
// null is absent; anything but a number, a value out of float64's range, or one over 10^11
// (milliseconds, for exp and nbf) fails.
func refDate(v any, name string) (sec int64, present, ok bool) {
	if v == nil {
		return 0, false, true
	}
	n, isNum := v.(json.Number)
	if !isNum {
		return 0, false, false
	}
	f, err := strconv.ParseFloat(string(n), 64)
	if err != nil || math.IsInf(f, 0) || f > 1e11 && name != "iat" {
		return 0, false, false
	}
	return int64(math.Floor(max(f, -1e11))), true, true
}

// refDecodeToken is auth.Verify's reading of a token's claims (docs/http.md, Authorization),
// for a verifier without issuer, audience or --jwt-allow-no-exp, at now: the claims a
// valid token grants, or an error. errRefSkip: strings that are not UTF-8 (FuzzVerifyTags
// covers those) or a header nested too deeply to say.
func refDecodeToken(header, payload []byte, now int64) (*refToken, error) {
	if !json.Valid(header) || !json.Valid(payload) {
		return nil, errors.New("not JSON")
	}
	if !refStringsUTF8(string(header)) || !refStringsUTF8(string(payload)) {
		return nil, errRefSkip
	}
	hdec := json.NewDecoder(bytes.NewReader(header))
	h, err := refWalk(hdec, 0, nil)
	if err != nil {
		if err.Error() == "too deep" {
			return nil, errRefSkip
		}
		return nil, err // a repeated parameter
	}
	hm, ok := h.(map[string]any)
	if !ok || hm["alg"] != "HS256" {
		return nil, errRefSkip // the JWT library's business
	}
	if _, crit := hm["crit"]; crit {
		return nil, errors.New("crit")
	}

	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var keys []string
	v, err := refWalk(dec, 0, &keys)
	if err != nil {
		return nil, err
	}
	claims, ok := v.(map[string]any)
	if !ok {
		return nil, errors.New("claims are not an object")
	}
	var tok refToken
	for _, key := range keys {
		val := claims[key]
		switch key {
		case "exp", "nbf", "iat":
			sec, present, ok := refDate(val, key)
			if !ok {
				return nil, errors.New(key + " is not a NumericDate")
			}
			switch {
			case key == "exp" && present:
				tok.exp = sec
			case key == "exp":
				tok.exp = math.MinInt64 // null: absent
			case key == "nbf":
				tok.nbf, tok.hasNbf = sec, present
			}
		case "iss", "sub", "jti":
			s, ok := val.(string)
			if !ok && val != nil {
				return nil, errors.New(key + " is not a string")
			}
			if key == "sub" {
				tok.sub = s
			}
		case "aud":
			if _, ok := val.(string); !ok {
				if _, ok := refStrings(val); !ok {
					return nil, errors.New("aud is not a string or a list")
				}
			}
		case "pgsse":
			if val == nil {
				continue
			}
			grants, ok := val.(map[string]any)
			if !ok {
				return nil, errors.New("pgsse is not an object")
			}
			for g, list := range grants {
				l, ok := refStrings(list)
				if !ok {
					return nil, errors.New("pgsse." + g + " is not a list of strings")
				}
				switch g {
				case "streams":
					tok.streams = l
				case "channels":
					tok.channels = l
				case "publish":
					tok.publish = l
				case "tags":
					tok.tags = l
				default:
					return nil, errors.New("unknown key pgsse." + g)
				}
			}
		case "streams", "channels", "publish", "tags":
			tok.misplaced = append(tok.misplaced, key)
		}
	}
	if _, has := claims["exp"]; !has || tok.exp == math.MinInt64 {
		return nil, errors.New("no exp")
	}
	if tok.exp <= now {
		return nil, errors.New("expired")
	}
	if tok.hasNbf && now < tok.nbf {
		return nil, errors.New("not valid yet")
	}
	c := auth.Claims{Streams: tok.streams, Channels: tok.channels, Publish: tok.publish, Tags: tok.tags}
	if err := c.Check(); err != nil {
		return nil, err // the name rules: fuzzed against their own references in FuzzNames
	}
	return &tok, nil
}

// FuzzVerifyClaims: whatever a signed token's header and claims say, Verify accepts it
// exactly when the reference decoder (encoding/json's token stream, refWalk) finds no
// repeated key anywhere, no crit, every registered claim and the pgsse claim of their
// documented types (exp and nbf in seconds, not milliseconds) and a valid exp — and then it
// grants exactly what the reference read.
func FuzzVerifyClaims(f *testing.F) {
	exp := strconv.FormatInt(1_800_000_000, 10)
	for _, s := range [][2]string{
		{``, `{"exp":` + exp + `,"sub":"u","pgsse":{"streams":["a","b/*"],"channels":["jobs"],"publish":["p/*"],"tags":["t"]}}`},
		{``, `{"exp":"` + exp + `"}`},
		{``, `{"exp":1699999999,"exp":` + exp + `}`},
		{``, `{"exp":` + exp + `,"pgsse":{"streams":["x"],"streams":["*"]}}`},
		{``, `{"exp":` + exp + `,"pgsse":["orders/42"]}`},
		{``, `{"exp":` + exp + `,"pgsse":{"streams":"orders/42"}}`},
		{``, `{"exp":` + exp + `,"pgsse":{"stream":["orders/42"]}}`},
		{``, `{"exp":` + exp + `,"streams":["orders/42"],"publish":["a"]}`},
		{``, `{"exp":1800000000000}`},
		{``, `{"exp":1e11,"nbf":1.5,"iat":"x"}`},
		{``, `{"exp":` + exp + `,"\u0065xp":1}`},
		{``, `{"exp":` + exp + `,"app":{"a":[{"k":1,"k":2}]}}`},
		{``, `{"exp":` + exp + `,"aud":["a",1],"iss":null,"sub":null}`},
		{``, `{"exp":` + exp + `,"pgsse":null,"nbf":1800000001}`},
		{`,"crit":["b64"]`, `{"exp":` + exp + `}`},
		{`,"alg":"none"`, `{"exp":` + exp + `}`},
		{`,"kid":"k","x":{"y":1,"y":2}`, `{"exp":` + exp + `}`},
	} {
		f.Add([]byte(s[0]), []byte(s[1]))
	}
	secret := []byte("0123456789abcdef0123456789abcdef")
	v, err := auth.NewVerifier(auth.Config{Secret: secret})
	if err != nil {
		f.Fatal(err)
	}
	const now = 1_700_000_000
	enc := base64.RawURLEncoding
	f.Fuzz(func(t *testing.T, members, payload []byte) {
		header := []byte(`{"alg":"HS256"` + string(members) + `}`)
		unsigned := enc.EncodeToString(header) + "." + enc.EncodeToString(payload)
		if len(unsigned) > auth.MaxTokenBytes-64 {
			return
		}
		sig, err := jwt.SigningMethodHS256.Sign(unsigned, secret)
		if err != nil {
			t.Fatal(err)
		}
		want, refErr := refDecodeToken(header, payload, now)
		if errors.Is(refErr, errRefSkip) {
			return
		}
		c, err := v.Verify([]byte(unsigned+"."+enc.EncodeToString(sig)), time.Unix(now, 0))
		if (err == nil) != (refErr == nil) {
			t.Fatalf("header %s claims %s: Verify err=%v, reference err=%v", header, payload, err, refErr)
		}
		if err != nil {
			if strings.ContainsAny(err.Error(), "\r\n") {
				t.Fatalf("error %q is not one line", err)
			}
			return
		}
		norm := func(l []string) []string {
			if len(l) == 0 {
				return nil
			}
			return l
		}
		// An exp past 2200-01-01 is capped there (auth: int64 nanoseconds must hold it).
		const maxExpires = 7258118400
		if wantExp := min(want.exp, maxExpires); c.Expires.Unix() != wantExp {
			t.Fatalf("claims %s: Expires %v, reference exp %d", payload, c.Expires, want.exp)
		}
		got := refToken{streams: norm(c.Streams), channels: norm(c.Channels), publish: norm(c.Publish), tags: norm(c.Tags),
			misplaced: norm(c.Misplaced), sub: c.Subject, exp: want.exp, nbf: c.NotBefore.Unix(), hasNbf: !c.NotBefore.IsZero()}
		want.streams, want.channels, want.publish, want.tags, want.misplaced =
			norm(want.streams), norm(want.channels), norm(want.publish), norm(want.tags), norm(want.misplaced)
		if !want.hasNbf {
			want.nbf = got.nbf
		}
		if !reflect.DeepEqual(*want, got) {
			t.Fatalf("claims %s:\nVerify    %+v\nreference %+v", payload, got, *want)
		}
	})
}
