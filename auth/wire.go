package auth

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"

	"github.com/golang-jwt/jwt/v5"
)

// The token's JSON, read strictly (docs/http.md, Authorization). encoding/json, which the JWT
// library uses, lets the last of two equal keys win (an expired exp followed by a valid one
// passed), turns a string of digits into a NumericDate, silently ignores keys it does not know
// (a misspelt "stream" granted nothing, without a word) and decodes invalid UTF-8 and lone
// surrogate escapes to U+FFFD (granting tags nobody signed). So the library only checks the
// signature, and this reader decodes what it signed: one pass, keys compared as decoded, every
// string decoded faithfully, nesting bounded.

// maxJSONDepth bounds the nesting of a token's header and claims. A token is at most
// MaxTokenBytes; an application's own claims are rarely more than a few levels deep.
const maxJSONDepth = 32

// msThreshold: a NumericDate over it (the year 5138) can only be milliseconds
// (Date.now() in JavaScript); today in milliseconds is ≈ 1.7e12.
const msThreshold = 1e11

// Errors a ClaimError or HeaderError carries; their text completes "token claim exp: …".
var (
	errTwice       = errors.New("appears twice (a token must not repeat a key: which one would count depends on the decoder)")
	errNotDate     = errors.New("must be a number (seconds since 1970, a NumericDate)")
	errDateString  = errors.New("must be a number (seconds since 1970, a NumericDate), not a string")
	errDateRange   = errors.New("is too large for a NumericDate")
	errDateMillis  = errors.New("is over 10^11 (the year 5138): it looks like milliseconds, but NumericDates are seconds since 1970 (in JavaScript: Math.floor(Date.now() / 1000))")
	errNotString   = errors.New("must be a string")
	errNotAudience = errors.New("must be a string or an array of strings")
	errNotObject   = errors.New(`must be an object, e.g. {"streams":["orders/42"],"publish":["orders/*"]}`)
	errNotList     = errors.New(`must be an array of strings, e.g. ["orders/42","chat/*"]`)
	errUnknownKey  = errors.New("unknown key: pgsse takes streams, channels, publish, tags")
	errTooDeep     = errors.New("is nested more than " + strconv.Itoa(maxJSONDepth) + " levels deep")
	errCrit        = errors.New("is not accepted: pgsse implements no JWS extension, so a token that lists one must be refused (RFC 7515 §4.1.11)")
)

// ErrHeader is what every *HeaderError is (errors.Is).
var ErrHeader = errors.New("token header is not accepted")

// HeaderError says which parameter of the token's JOSE header broke which rule, e.g.
// "token header: alg appears twice".
type HeaderError struct {
	Param string
	Err   error
}

func (e *HeaderError) Error() string { return "token header: " + e.Param + " " + e.Err.Error() }

// Is makes every HeaderError match ErrHeader.
func (e *HeaderError) Is(target error) bool { return target == ErrHeader }

// Unwrap returns the rule broken.
func (e *HeaderError) Unwrap() error { return e.Err }

// grantKeys are the keys of the "pgsse" claim, in the order error messages list them.
var grantKeys = [...]string{"streams", "channels", "publish", "tags"}

// tokenClaims is what the claims of a token say, decoded strictly.
type tokenClaims struct {
	exp, nbf  *jwt.NumericDate
	iss, sub  string
	hasIss    bool
	aud       []string
	lists     [len(grantKeys)][]string // under "pgsse", in grantKeys order
	misplaced []string                 // grant keys found at the top level instead of under "pgsse"
}

// checkHeader reads the token's JOSE header (JSON, already base64url-decoded): a repeated
// parameter anywhere, or a crit parameter at all, refuses the token. What it cannot read
// is left to the JWT library, which says the token is malformed.
func checkHeader(header []byte) error {
	r := jsonReader{s: header}
	r.space()
	if !r.peek('{') {
		return nil
	}
	err := r.object("", func(key string) error {
		if key == "crit" {
			return &HeaderError{Param: "crit", Err: errCrit}
		}
		return r.value(key)
	})
	var ce *ClaimError
	if errors.As(err, &ce) && ce.Err == errTwice {
		return &HeaderError{Param: ce.Claim, Err: errTwice}
	}
	if errors.Is(err, ErrHeader) {
		return err
	}
	return nil // not JSON, or nested too deeply: the library or the claims say so
}

// decodeClaims reads a token's claims (the JSON the signature covered). Errors are
// ErrMalformed (not a JSON object) or a *ClaimError naming the claim.
func decodeClaims(payload []byte) (*tokenClaims, error) {
	var tc tokenClaims
	r := jsonReader{s: payload}
	r.space()
	if !r.peek('{') {
		return nil, ErrMalformed
	}
	err := r.object("", func(key string) error {
		switch key {
		case "exp":
			return r.date(key, &tc.exp)
		case "nbf":
			return r.date(key, &tc.nbf)
		case "iat":
			var iat *jwt.NumericDate
			return r.date(key, &iat)
		case "iss":
			tc.hasIss = !r.peekNull()
			return r.optString(key, &tc.iss)
		case "sub":
			return r.optString(key, &tc.sub)
		case "jti":
			var jti string
			return r.optString(key, &jti)
		case "aud":
			return r.audience(key, &tc.aud)
		case "pgsse":
			return r.grants(&tc)
		}
		for _, g := range grantKeys {
			if key == g {
				tc.misplaced = append(tc.misplaced, key)
			}
		}
		return r.value(key) // the application's own claims: read for repeated keys only
	})
	if err != nil {
		return nil, err
	}
	if r.space(); r.i != len(r.s) {
		return nil, ErrMalformed
	}
	return &tc, nil
}

// grants reads the "pgsse" claim: null, or an object of known keys whose values are null or
// arrays of strings.
func (r *jsonReader) grants(tc *tokenClaims) error {
	if r.null() {
		return nil
	}
	if !r.peek('{') {
		if err := r.value("pgsse"); err != nil {
			return err
		}
		return &ClaimError{Claim: "pgsse", Index: -1, Err: errNotObject}
	}
	return r.object("pgsse", func(key string) error {
		for i, g := range grantKeys {
			if key == g {
				return r.stringList("pgsse."+key, &tc.lists[i])
			}
		}
		return &ClaimError{Claim: "pgsse." + key, Index: -1, Err: errUnknownKey}
	})
}

// jsonReader is a strict reader of JSON text already known to be (or checked to be)
// well-formed; anything it cannot read is ErrMalformed.
type jsonReader struct {
	s     []byte
	i     int
	depth int
}

func (r *jsonReader) space() {
	for r.i < len(r.s) && (r.s[r.i] == ' ' || r.s[r.i] == '\t' || r.s[r.i] == '\n' || r.s[r.i] == '\r') {
		r.i++
	}
}

func (r *jsonReader) peek(c byte) bool { return r.i < len(r.s) && r.s[r.i] == c }

func (r *jsonReader) peekNull() bool {
	return len(r.s)-r.i >= 4 && string(r.s[r.i:r.i+4]) == "null"
}

// null consumes a null literal when it is next.
func (r *jsonReader) null() bool {
	if r.peekNull() {
		r.i += 4
		return true
	}
	return false
}

// object reads the object at r.i (which is '{'), calling member for each key with r.i at its
// value; member must consume the value. path names the object in errors ("" = the top level).
// A key seen before in the same object is a *ClaimError naming it (errTwice).
func (r *jsonReader) object(path string, member func(key string) error) error {
	if r.depth++; r.depth > maxJSONDepth {
		return &ClaimError{Claim: topOf(path), Index: -1, Err: errTooDeep}
	}
	defer func() { r.depth-- }()
	r.i++ // '{'
	var keys []string
	var many map[string]struct{} // from the 17th key on
	for first := true; ; first = false {
		r.space()
		if r.peek('}') && first {
			r.i++
			return nil
		}
		if !r.peek('"') {
			return ErrMalformed
		}
		key, ok := r.str()
		if !ok {
			return ErrMalformed
		}
		if seen(keys, many, key) {
			return &ClaimError{Claim: join(path, key), Index: -1, Err: errTwice}
		}
		if len(keys) < 16 {
			keys = append(keys, key)
		} else {
			if many == nil {
				many = make(map[string]struct{}, 32)
				for _, k := range keys {
					many[k] = struct{}{}
				}
			}
			many[key] = struct{}{}
		}
		r.space()
		if !r.peek(':') {
			return ErrMalformed
		}
		r.i++
		r.space()
		if err := member(key); err != nil {
			return err
		}
		r.space()
		switch {
		case r.peek(','):
			r.i++
		case r.peek('}'):
			r.i++
			return nil
		default:
			return ErrMalformed
		}
	}
}

func seen(keys []string, many map[string]struct{}, key string) bool {
	if many != nil {
		_, ok := many[key]
		return ok
	}
	for _, k := range keys {
		if k == key {
			return true
		}
	}
	return false
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// topOf is the top-level claim of path ("app" for "app.a[2].b"), which a nesting error names.
func topOf(path string) string {
	if i := strings.IndexAny(path, ".["); i >= 0 {
		path = path[:i]
	}
	if path == "" {
		return "(the claims)"
	}
	return path
}

// value reads any value at r.i, refusing repeated keys in the objects it holds.
func (r *jsonReader) value(path string) error {
	if r.i >= len(r.s) {
		return ErrMalformed
	}
	switch c := r.s[r.i]; {
	case c == '{':
		return r.object(path, func(key string) error { return r.value(join(path, key)) })
	case c == '[':
		if r.depth++; r.depth > maxJSONDepth {
			return &ClaimError{Claim: topOf(path), Index: -1, Err: errTooDeep}
		}
		defer func() { r.depth-- }()
		r.i++
		for n := 0; ; n++ {
			r.space()
			if r.peek(']') && n == 0 {
				r.i++
				return nil
			}
			if err := r.value(path + "[" + strconv.Itoa(n) + "]"); err != nil {
				return err
			}
			r.space()
			switch {
			case r.peek(','):
				r.i++
			case r.peek(']'):
				r.i++
				return nil
			default:
				return ErrMalformed
			}
		}
	case c == '"':
		if _, ok := r.str(); !ok {
			return ErrMalformed
		}
	case c == '-' || c >= '0' && c <= '9':
		if _, ok := r.number(); !ok {
			return ErrMalformed
		}
	case r.null():
	case len(r.s)-r.i >= 4 && string(r.s[r.i:r.i+4]) == "true":
		r.i += 4
	case len(r.s)-r.i >= 5 && string(r.s[r.i:r.i+5]) == "false":
		r.i += 5
	default:
		return ErrMalformed
	}
	return nil
}

// date reads a NumericDate claim: null (absent) or a number of seconds.
func (r *jsonReader) date(claim string, dst **jwt.NumericDate) error {
	if r.null() {
		return nil
	}
	wrong := errNotDate
	if r.peek('"') {
		wrong = errDateString
	}
	lit, ok := r.number()
	if !ok {
		if err := r.value(claim); err != nil {
			return err
		}
		return &ClaimError{Claim: claim, Index: -1, Err: wrong}
	}
	f, err := strconv.ParseFloat(lit, 64)
	switch {
	case err != nil || math.IsInf(f, 0):
		return &ClaimError{Claim: claim, Index: -1, Err: errDateRange}
	case f > msThreshold && claim != "iat":
		return &ClaimError{Claim: claim, Index: -1, Err: errDateMillis}
	}
	f = max(f, -msThreshold) // far in the past is as good as this, and int64 holds it
	f = min(f, msThreshold)
	sec, frac := math.Modf(f)
	*dst = jwt.NewNumericDate(time.Unix(int64(sec), int64(frac*1e9)))
	return nil
}

// optString reads a string claim, or null (absent).
func (r *jsonReader) optString(claim string, dst *string) error {
	if r.null() {
		return nil
	}
	if !r.peek('"') {
		if err := r.value(claim); err != nil {
			return err
		}
		return &ClaimError{Claim: claim, Index: -1, Err: errNotString}
	}
	s, ok := r.str()
	if !ok {
		return ErrMalformed
	}
	*dst = s
	return nil
}

// audience reads aud: null, a string, or an array of strings.
func (r *jsonReader) audience(claim string, dst *[]string) error {
	if r.peek('"') {
		s, ok := r.str()
		if !ok {
			return ErrMalformed
		}
		*dst = []string{s}
		return nil
	}
	if err := r.stringList(claim, dst); err != nil {
		var ce *ClaimError
		if errors.As(err, &ce) && (ce.Err == errNotList || ce.Err == errNotString) {
			return &ClaimError{Claim: claim, Index: -1, Err: errNotAudience}
		}
		return err
	}
	return nil
}

// stringList reads null or an array of strings.
func (r *jsonReader) stringList(claim string, dst *[]string) error {
	if r.null() {
		return nil
	}
	if !r.peek('[') {
		if err := r.value(claim); err != nil {
			return err
		}
		return &ClaimError{Claim: claim, Index: -1, Err: errNotList}
	}
	r.i++
	out := []string{}
	for n := 0; ; n++ {
		r.space()
		if r.peek(']') && n == 0 {
			r.i++
			break
		}
		if !r.peek('"') {
			if err := r.value(claim); err != nil {
				return err
			}
			return &ClaimError{Claim: claim, Index: n, Err: errNotString}
		}
		s, ok := r.str()
		if !ok {
			return ErrMalformed
		}
		out = append(out, s)
		r.space()
		if r.peek(',') {
			r.i++
			continue
		}
		if r.peek(']') {
			r.i++
			break
		}
		return ErrMalformed
	}
	*dst = out
	return nil
}

// number reads a JSON number and returns its text; when there is none, r.i stays.
func (r *jsonReader) number() (string, bool) {
	start := r.i
	lit, ok := r.numberText()
	if !ok {
		r.i = start
	}
	return lit, ok
}

func (r *jsonReader) numberText() (string, bool) {
	start := r.i
	if r.peek('-') {
		r.i++
	}
	digits := func() int {
		n := 0
		for r.i < len(r.s) && r.s[r.i] >= '0' && r.s[r.i] <= '9' {
			r.i++
			n++
		}
		return n
	}
	if r.peek('0') {
		r.i++
	} else if digits() == 0 {
		return "", false
	}
	if r.peek('.') {
		r.i++
		if digits() == 0 {
			return "", false
		}
	}
	if r.peek('e') || r.peek('E') {
		r.i++
		if r.peek('+') || r.peek('-') {
			r.i++
		}
		if digits() == 0 {
			return "", false
		}
	}
	return string(r.s[start:r.i]), true
}

// str reads the JSON string at r.i (which is '"') and decodes it faithfully: its bytes as
// they are (invalid UTF-8 stays invalid), escapes decoded, a surrogate pair to its character
// and a lone surrogate escape to its WTF-8 bytes — never valid UTF-8, so the name rules
// refuse it, and distinct per surrogate, so two different keys never decode alike.
func (r *jsonReader) str() (string, bool) {
	r.i++ // '"'
	start := r.i
	for r.i < len(r.s) && r.s[r.i] != '"' && r.s[r.i] != '\\' {
		if r.s[r.i] < 0x20 {
			return "", false
		}
		r.i++
	}
	if r.peek('"') {
		r.i++
		return string(r.s[start : r.i-1]), true
	}
	var b strings.Builder
	b.Write(r.s[start:r.i])
	for r.i < len(r.s) {
		c := r.s[r.i]
		switch {
		case c == '"':
			r.i++
			return b.String(), true
		case c < 0x20:
			return "", false
		case c != '\\':
			b.WriteByte(c)
			r.i++
			continue
		}
		if r.i+1 >= len(r.s) {
			return "", false
		}
		e := r.s[r.i+1]
		r.i += 2
		switch e {
		case '"', '\\', '/':
			b.WriteByte(e)
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'u':
			u, ok := r.hex4()
			if !ok {
				return "", false
			}
			if u >= 0xD800 && u < 0xDC00 && len(r.s)-r.i >= 6 && r.s[r.i] == '\\' && r.s[r.i+1] == 'u' {
				save := r.i
				r.i += 2
				lo, ok := r.hex4()
				if !ok {
					return "", false
				}
				if dec := utf16.DecodeRune(u, lo); dec != '\uFFFD' {
					b.WriteRune(dec)
					continue
				}
				r.i = save // not its low half: that escape stands on its own
			}
			if utf16.IsSurrogate(u) {
				b.Write([]byte{0xED, byte(0x80 | (u>>6)&0x3F), byte(0x80 | u&0x3F)}) // WTF-8
				continue
			}
			b.WriteRune(u)
		default:
			return "", false
		}
	}
	return "", false
}

func (r *jsonReader) hex4() (rune, bool) {
	if len(r.s)-r.i < 4 {
		return 0, false
	}
	var v rune
	for _, c := range r.s[r.i : r.i+4] {
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			v = v<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			v = v<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	r.i += 4
	return v, true
}
