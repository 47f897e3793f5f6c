package fuzz

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"strconv"
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
