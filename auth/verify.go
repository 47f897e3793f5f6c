package auth

import (
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/golang-jwt/jwt/v5"
)

// Verification errors. Each maps to HTTP 401; the messages are fit for a one-line body
// and never echo token contents.
var (
	ErrMalformed   = errors.New("token is malformed")
	ErrSignature   = errors.New("token signature is invalid")
	ErrExpired     = errors.New("token has expired")
	ErrNotYetValid = errors.New("token is not valid yet (nbf)")
	ErrNoExp       = errors.New("token has no exp claim")
	ErrIssuer      = errors.New("token issuer is not accepted")
	ErrAudience    = errors.New("token audience is not accepted")
	ErrAlgorithm   = errors.New("token algorithm is not accepted")
)

// MaxTokenBytes bounds the token Verify will look at.
const MaxTokenBytes = 8192

// wireClaims is the token's JSON payload: the registered claims plus ours under "pgsse".
type wireClaims struct {
	jwt.RegisteredClaims
	PGSSE wirePGSSE `json:"pgsse"`
}

type wirePGSSE struct {
	Streams  claimStrings `json:"streams,omitempty"`
	Channels claimStrings `json:"channels,omitempty"`
	Publish  claimStrings `json:"publish,omitempty"`
	Tags     claimStrings `json:"tags,omitempty"`
}

// claimStrings is a list of names in the "pgsse" claim, decoded faithfully: encoding/json
// turns invalid UTF-8 and lone surrogate escapes into U+FFFD without a word, which would grant
// a token tags and patterns it was never signed with. An entry whose JSON text does not spell
// valid UTF-8 gets an invalid byte instead, so that Claims.Check refuses it and names the
// claim (docs/http.md, Authorization).
type claimStrings []string

// notUTF8 marks an entry that was not valid UTF-8 on the wire.
const notUTF8 = "\xff"

func (l *claimStrings) UnmarshalJSON(b []byte) error {
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	if raw == nil {
		*l = nil
		return nil
	}
	out := make([]string, len(raw))
	for i, r := range raw {
		if err := json.Unmarshal(r, &out[i]); err != nil {
			return err
		}
		if !jsonStringIsUTF8(r) {
			out[i] += notUTF8
		}
	}
	*l = out
	return nil
}

// jsonStringIsUTF8 reports whether the JSON string literal s (quotes included, already known
// to be well-formed JSON) spells valid UTF-8: its bytes are UTF-8 and every \u escape of a
// surrogate is half of a high-low pair.
func jsonStringIsUTF8(s []byte) bool {
	if !utf8.Valid(s) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			continue
		}
		i++ // the escaped byte
		if i >= len(s) || s[i] != 'u' {
			continue
		}
		r := hex4(s[i+1 : i+5])
		i += 4
		switch {
		case r >= 0xDC00 && r <= 0xDFFF:
			return false // a low surrogate without its high half
		case r >= 0xD800 && r <= 0xDBFF:
			if i+6 >= len(s) || s[i+1] != '\\' || s[i+2] != 'u' {
				return false
			}
			if lo := hex4(s[i+3 : i+7]); lo < 0xDC00 || lo > 0xDFFF {
				return false
			}
			i += 6
		}
	}
	return true
}

// hex4 is the value of the 4 hex digits of a \u escape (-1 if they are not).
func hex4(digits []byte) rune {
	v, err := strconv.ParseUint(string(digits), 16, 16)
	if err != nil {
		return -1
	}
	return rune(v)
}

// Verifier checks tokens against one configuration. It is safe for concurrent use.
type Verifier struct {
	cfg     Config
	secret  []byte           // HS256; nil if not configured
	pub     crypto.PublicKey // nil if not configured
	pubAlg  string           // the only algorithm pub accepts
	parser  *jwt.Parser
	keyFunc jwt.Keyfunc
}

// NewVerifier parses the configured keys once. It needs Secret or PublicKeyPEM (or both:
// then HS256 tokens are checked with the secret and the public key's own algorithm with
// the key). Errors name the problem, e.g. "public key: no PEM block".
func NewVerifier(cfg Config) (*Verifier, error) {
	if len(cfg.Secret) == 0 && len(cfg.PublicKeyPEM) == 0 {
		return nil, errors.New("no JWT key: need a secret or a public key")
	}
	v := &Verifier{cfg: cfg}
	if len(cfg.Secret) > 0 {
		v.secret = slices.Clone(cfg.Secret)
	}
	if len(cfg.PublicKeyPEM) > 0 {
		key, alg, err := ParsePublicKeyPEM(cfg.PublicKeyPEM)
		if err != nil {
			return nil, fmt.Errorf("public key: %w", err)
		}
		v.pub, v.pubAlg = key, alg
	}
	// Claims are validated by Verify itself, against the caller's clock.
	v.parser = jwt.NewParser(jwt.WithoutClaimsValidation(), jwt.WithStrictDecoding())
	v.keyFunc = v.key
	return v, nil
}

// Algorithms lists the algorithms this verifier accepts.
func (v *Verifier) Algorithms() []string {
	var algs []string
	if v.secret != nil {
		algs = append(algs, AlgHS256)
	}
	if v.pub != nil {
		algs = append(algs, v.pubAlg)
	}
	return algs
}

// key picks the verification key from the token's alg, accepting only the configured
// families: a token never chooses how it is checked.
func (v *Verifier) key(t *jwt.Token) (any, error) {
	alg := t.Method.Alg()
	switch {
	case alg == AlgHS256 && v.secret != nil:
		return v.secret, nil
	case v.pub != nil && alg == v.pubAlg:
		return v.pub, nil
	}
	return nil, ErrAlgorithm
}

// Verify checks token's signature and its exp, nbf, iss and aud against now and the
// configuration, then the contents of its "pgsse" claim against the name rules
// (Claims.Check), and returns the granted claims. Every error is one of the Err* values
// above or a *ClaimError (errors.Is(err, ErrClaims)).
func (v *Verifier) Verify(token []byte, now time.Time) (*Claims, error) {
	if len(token) == 0 || len(token) > MaxTokenBytes {
		return nil, ErrMalformed
	}
	var wc wireClaims
	if _, err := v.parser.ParseWithClaims(string(token), &wc, v.keyFunc); err != nil {
		return nil, classify(err)
	}
	if wc.ExpiresAt == nil {
		if !v.cfg.AllowNoExp {
			return nil, ErrNoExp
		}
	} else if !now.Before(wc.ExpiresAt.Time) {
		return nil, ErrExpired
	}
	if wc.NotBefore != nil && now.Before(wc.NotBefore.Time) {
		return nil, ErrNotYetValid
	}
	if v.cfg.Issuer != "" && wc.Issuer != v.cfg.Issuer {
		return nil, ErrIssuer
	}
	if v.cfg.Audience != "" && !slices.Contains(wc.Audience, v.cfg.Audience) {
		return nil, ErrAudience
	}
	c := &Claims{
		Streams:  wc.PGSSE.Streams,
		Channels: wc.PGSSE.Channels,
		Publish:  wc.PGSSE.Publish,
		Tags:     wc.PGSSE.Tags,
		Subject:  wc.Subject,
	}
	if err := c.Check(); err != nil {
		return nil, err
	}
	if wc.ExpiresAt != nil {
		c.Expires = wc.ExpiresAt.Time
		if c.Expires.After(maxExpires) {
			c.Expires = maxExpires // beyond it, UnixNano (the cache) and UnixMilli would overflow
		}
	}
	if wc.NotBefore != nil {
		c.NotBefore = wc.NotBefore.Time
	}
	return c, nil
}

// maxExpires caps a token's exp: a later one is treated as this (still centuries away), so
// that every clock comparison in nanoseconds or milliseconds stays in int64's range.
var maxExpires = time.Date(2200, time.January, 1, 0, 0, 0, 0, time.UTC)

func classify(err error) error {
	switch {
	case errors.Is(err, ErrAlgorithm):
		return ErrAlgorithm
	case errors.Is(err, jwt.ErrTokenMalformed):
		return ErrMalformed
	case errors.Is(err, jwt.ErrTokenUnverifiable):
		// alg missing or unknown to the library (including "none" without its magic key)
		return ErrAlgorithm
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return ErrSignature
	default:
		return ErrMalformed
	}
}
