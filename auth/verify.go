package auth

import (
	"bytes"
	"crypto"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Verification errors. Each maps to HTTP 401; the messages are fit for a one-line body
// and never echo token contents.
var (
	ErrMalformed   = errors.New("token is malformed: a JWT is three base64url parts, header.claims.signature, the first two JSON objects")
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

// wireClaims is what Mint signs: the registered claims plus ours under "pgsse". Verify
// reads tokens with decodeClaims (wire.go) instead, strictly.
type wireClaims struct {
	jwt.RegisteredClaims
	PGSSE wirePGSSE `json:"pgsse"`
}

type wirePGSSE struct {
	Streams  []string `json:"streams,omitempty"`
	Channels []string `json:"channels,omitempty"`
	Publish  []string `json:"publish,omitempty"`
	Tags     []string `json:"tags,omitempty"`
}

// signedClaims is what the JWT library decodes the claims into while it checks the
// signature: nothing but the claims' JSON text (which the library has checked is JSON), so
// that decodeClaims reads exactly what was signed. The library validates no claim
// (jwt.WithoutClaimsValidation); these methods exist for its interface.
type signedClaims struct{ payload []byte }

func (c *signedClaims) UnmarshalJSON(b []byte) error {
	c.payload = append(c.payload[:0], b...)
	return nil
}

func (*signedClaims) GetExpirationTime() (*jwt.NumericDate, error) { return nil, nil }
func (*signedClaims) GetIssuedAt() (*jwt.NumericDate, error)       { return nil, nil }
func (*signedClaims) GetNotBefore() (*jwt.NumericDate, error)      { return nil, nil }
func (*signedClaims) GetIssuer() (string, error)                   { return "", nil }
func (*signedClaims) GetSubject() (string, error)                  { return "", nil }
func (*signedClaims) GetAudience() (jwt.ClaimStrings, error)       { return nil, nil }

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

// Verify checks token's header (no repeated parameter, no crit: checkHeader), its signature,
// then reads its claims strictly (decodeClaims: no repeated key anywhere, each registered
// claim and the "pgsse" claim of its documented shape, exp and nbf in seconds) and checks
// exp, nbf, iss and aud against now and the configuration, then the contents of the "pgsse"
// claim against the name rules (Claims.Check), and returns the granted claims. Every error is
// one of the Err* values above, a *HeaderError (errors.Is(err, ErrHeader)) or a *ClaimError
// (errors.Is(err, ErrClaims)).
func (v *Verifier) Verify(token []byte, now time.Time) (*Claims, error) {
	if len(token) == 0 || len(token) > MaxTokenBytes {
		return nil, ErrMalformed
	}
	if err := checkTokenHeader(token); err != nil {
		return nil, err
	}
	var sc signedClaims
	if _, err := v.parser.ParseWithClaims(string(token), &sc, v.keyFunc); err != nil {
		return nil, classify(err)
	}
	wc, err := decodeClaims(sc.payload)
	if err != nil {
		return nil, err
	}
	if wc.exp == nil {
		if !v.cfg.AllowNoExp {
			return nil, ErrNoExp
		}
	} else if !now.Before(wc.exp.Time) {
		return nil, ErrExpired
	}
	if wc.nbf != nil && now.Before(wc.nbf.Time) {
		return nil, ErrNotYetValid
	}
	if v.cfg.Issuer != "" && wc.iss != v.cfg.Issuer {
		return nil, ErrIssuer
	}
	if v.cfg.Audience != "" && !slices.Contains(wc.aud, v.cfg.Audience) {
		return nil, ErrAudience
	}
	c := &Claims{
		Streams:   wc.lists[0],
		Channels:  wc.lists[1],
		Publish:   wc.lists[2],
		Tags:      wc.lists[3],
		Subject:   wc.sub,
		Misplaced: wc.misplaced,
	}
	if err := c.Check(); err != nil {
		return nil, err
	}
	if wc.exp != nil {
		c.Expires = wc.exp.Time
		if c.Expires.After(maxExpires) {
			c.Expires = maxExpires // beyond it, UnixNano (the cache) would overflow
		}
	}
	if wc.nbf != nil {
		c.NotBefore = wc.nbf.Time
	}
	return c, nil
}

// checkTokenHeader applies checkHeader to the token's first segment, when it decodes (when
// it does not, the JWT library says the token is malformed).
func checkTokenHeader(token []byte) error {
	seg, _, ok := bytes.Cut(token, []byte{'.'})
	if !ok {
		return nil
	}
	header := make([]byte, base64.RawURLEncoding.DecodedLen(len(seg)))
	n, err := base64.RawURLEncoding.Strict().Decode(header, seg)
	if err != nil {
		return nil
	}
	return checkHeader(header[:n])
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
