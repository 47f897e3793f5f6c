package auth

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"math/big"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testKeys are generated once per test binary (RSA generation is slow under -race).
type testKeys struct {
	rsa, rsa2, rsaSmall *rsa.PrivateKey
	ec, ec2, ecP384     *ecdsa.PrivateKey
	ed, ed2             ed25519.PrivateKey
}

var (
	keysOnce sync.Once
	keys     testKeys
)

func getKeys(t testing.TB) *testKeys {
	t.Helper()
	keysOnce.Do(func() {
		must := func(err error) {
			if err != nil {
				panic(err)
			}
		}
		var err error
		keys.rsa, err = rsa.GenerateKey(rand.Reader, 2048)
		must(err)
		keys.rsa2, err = rsa.GenerateKey(rand.Reader, 2048)
		must(err)
		keys.rsaSmall, err = rsa.GenerateKey(rand.Reader, 1024)
		must(err)
		keys.ec, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		must(err)
		keys.ec2, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		must(err)
		keys.ecP384, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
		must(err)
		_, keys.ed, err = ed25519.GenerateKey(rand.Reader)
		must(err)
		_, keys.ed2, err = ed25519.GenerateKey(rand.Reader)
		must(err)
	})
	return &keys
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func pkixPEM(t testing.TB, pub any) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	require.NoError(t, err)
	return pemBlock("PUBLIC KEY", der)
}

func pkcs8PEM(t testing.TB, priv any) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	require.NoError(t, err)
	return pemBlock("PRIVATE KEY", der)
}

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// algCase is one signing family: how to mint and how to verify.
type algCase struct {
	name   string
	alg    string
	mint   MintKey
	verify Config
}

func algCases(t *testing.T) []algCase {
	k := getKeys(t)
	secret := []byte("0123456789abcdef0123456789abcdef")
	sec1, err := x509.MarshalECPrivateKey(k.ec)
	require.NoError(t, err)
	return []algCase{
		{"HS256", AlgHS256, MintKey{Secret: secret}, Config{Secret: secret}},
		{"RS256 PKCS#1", AlgRS256,
			MintKey{PrivateKeyPEM: pemBlock("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(k.rsa))},
			Config{PublicKeyPEM: pemBlock("RSA PUBLIC KEY", x509.MarshalPKCS1PublicKey(&k.rsa.PublicKey))}},
		{"RS256 PKCS#8", AlgRS256, MintKey{PrivateKeyPEM: pkcs8PEM(t, k.rsa)},
			Config{PublicKeyPEM: pkixPEM(t, &k.rsa.PublicKey)}},
		{"ES256 SEC1 with EC PARAMETERS", AlgES256,
			MintKey{PrivateKeyPEM: append(pemBlock("EC PARAMETERS", []byte{6, 8, 42, 134, 72, 206, 61, 3, 1, 7}),
				pemBlock("EC PRIVATE KEY", sec1)...)},
			Config{PublicKeyPEM: pkixPEM(t, &k.ec.PublicKey)}},
		{"ES256 PKCS#8", AlgES256, MintKey{PrivateKeyPEM: pkcs8PEM(t, k.ec)},
			Config{PublicKeyPEM: pkixPEM(t, &k.ec.PublicKey)}},
		{"EdDSA", AlgEdDSA, MintKey{PrivateKeyPEM: pkcs8PEM(t, k.ed)},
			Config{PublicKeyPEM: pkixPEM(t, k.ed.Public())}},
		{"ES256 from certificate", AlgES256, MintKey{PrivateKeyPEM: pkcs8PEM(t, k.ec)},
			Config{PublicKeyPEM: certPEM(t, k.ec)}},
	}
}

func certPEM(t testing.TB, key *ecdsa.PrivateKey) []byte {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "pgsse test"},
		NotBefore:    t0.Add(-time.Hour),
		NotAfter:     t0.Add(time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	return pemBlock("CERTIFICATE", der)
}

func TestMintVerifyRoundTrip(t *testing.T) {
	want := Claims{
		Streams:  []string{"orders/42", "chat/*"},
		Channels: []string{"jobs"},
		Tags:     []string{"user:7", "role:admin"},
		Subject:  "user-7",
	}
	for _, tc := range algCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			tok, err := Mint(tc.mint, want, time.Hour, "", "", t0)
			require.NoError(t, err)
			hdr, _, err := jwt.NewParser().ParseUnverified(tok, jwt.MapClaims{})
			require.NoError(t, err)
			assert.Equal(t, tc.alg, hdr.Method.Alg(), "signing algorithm")

			v, err := NewVerifier(tc.verify)
			require.NoError(t, err)
			assert.Equal(t, []string{tc.alg}, v.Algorithms())
			got, err := v.Verify([]byte(tok), t0.Add(time.Minute))
			require.NoError(t, err)
			assert.Equal(t, want.Streams, got.Streams)
			assert.Equal(t, want.Channels, got.Channels)
			assert.Equal(t, want.Tags, got.Tags)
			assert.Equal(t, want.Subject, got.Subject)
			assert.True(t, got.Expires.Equal(t0.Add(time.Hour)), "expires %v", got.Expires)
			assert.True(t, got.AllowsStream([]byte("chat/room/1")))
			assert.False(t, got.AllowsStream([]byte("orders/4")))
			assert.True(t, got.AllowsChannel([]byte("jobs")))
			assert.True(t, InAudience(got.Tags, []string{"role:admin"}))
			assert.False(t, InAudience(got.Tags, []string{"role:"}))
		})
	}
}

// sign makes a token with arbitrary claims and header algorithm.
func sign(t testing.TB, m jwt.SigningMethod, key any, claims jwt.MapClaims) []byte {
	t.Helper()
	s, err := jwt.NewWithClaims(m, claims).SignedString(key)
	require.NoError(t, err)
	return []byte(s)
}

func TestVerifyErrors(t *testing.T) {
	k := getKeys(t)
	secret := []byte("0123456789abcdef0123456789abcdef")
	rsaPub := pkixPEM(t, &k.rsa.PublicKey)
	exp := t0.Add(time.Hour).Unix()
	ok := jwt.MapClaims{"exp": exp}
	hs := Config{Secret: secret}
	rs := Config{PublicKeyPEM: rsaPub}
	es := Config{PublicKeyPEM: pkixPEM(t, &k.ec.PublicKey)}
	ed := Config{PublicKeyPEM: pkixPEM(t, k.ed.Public())}
	noneTok := sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, ok)
	good := sign(t, jwt.SigningMethodHS256, secret, ok)
	// Another payload under the original signature: decodable, but the signature no longer matches.
	parts := strings.Split(string(sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"exp": exp, "sub": "aaaa"})), ".")
	other := strings.Split(string(sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"exp": exp, "sub": "bbbb"})), ".")
	tampered := []byte(parts[0] + "." + other[1] + "." + parts[2])

	cases := []struct {
		name string
		cfg  Config
		tok  []byte
		want error
	}{
		{"empty", hs, nil, ErrMalformed},
		{"one segment", hs, []byte("abc"), ErrMalformed},
		{"bad base64", hs, []byte("a!.b.c"), ErrMalformed},
		{"not JSON", hs, []byte("YWJj.YWJj.YWJj"), ErrMalformed},
		{"too long", hs, []byte(strings.Repeat("a", MaxTokenBytes+1)), ErrMalformed},
		{"exp not a number", hs, sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"exp": "soon"}), ErrClaims},
		{"pgsse claim wrong shape", hs, sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"exp": exp, "pgsse": []int{1}}), ErrClaims},
		{"claims not an object", hs, signRaw(t, secret, hsHeader, `[1]`), ErrMalformed},
		{"claims null", hs, signRaw(t, secret, hsHeader, `null`), ErrMalformed},
		{"claims a string", hs, signRaw(t, secret, hsHeader, `"exp"`), ErrMalformed},
		{"HS256 wrong secret", hs, sign(t, jwt.SigningMethodHS256, []byte("another secret, equally long...."), ok), ErrSignature},
		{"HS256 tampered payload", hs, tampered, ErrSignature},
		{"RS256 other key", rs, sign(t, jwt.SigningMethodRS256, k.rsa2, ok), ErrSignature},
		{"ES256 other key", es, sign(t, jwt.SigningMethodES256, k.ec2, ok), ErrSignature},
		{"EdDSA other key", ed, sign(t, jwt.SigningMethodEdDSA, k.ed2, ok), ErrSignature},
		{"expired", hs, sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"exp": t0.Unix()}), ErrExpired},
		{"expires exactly now", hs, sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"exp": t0.Add(time.Minute).Unix()}), ErrExpired},
		{"nbf in the future", hs, sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"exp": exp, "nbf": t0.Add(2 * time.Minute).Unix()}), ErrNotYetValid},
		{"no exp", hs, sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "x"}), ErrNoExp},
		{"issuer mismatch", Config{Secret: secret, Issuer: "app"}, sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"exp": exp, "iss": "other"}), ErrIssuer},
		{"issuer missing", Config{Secret: secret, Issuer: "app"}, good, ErrIssuer},
		{"audience mismatch", Config{Secret: secret, Audience: "pgsse"}, sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"exp": exp, "aud": "web"}), ErrAudience},
		{"audience array without ours", Config{Secret: secret, Audience: "pgsse"}, sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"exp": exp, "aud": []string{"a", "b"}}), ErrAudience},
		{"audience missing", Config{Secret: secret, Audience: "pgsse"}, good, ErrAudience},
		{"alg none", hs, noneTok, ErrAlgorithm},
		{"alg none vs public key", rs, noneTok, ErrAlgorithm},
		{"HS256 keyed with the RSA public key PEM", rs, sign(t, jwt.SigningMethodHS256, rsaPub, ok), ErrAlgorithm},
		{"HS256 against a public-key-only verifier", es, good, ErrAlgorithm},
		{"RS256 against a secret-only verifier", hs, sign(t, jwt.SigningMethodRS256, k.rsa, ok), ErrAlgorithm},
		{"RS384 with an RSA key", rs, sign(t, jwt.SigningMethodRS384, k.rsa, ok), ErrAlgorithm},
		{"PS256 with an RSA key", rs, sign(t, jwt.SigningMethodPS256, k.rsa, ok), ErrAlgorithm},
		{"HS512", hs, sign(t, jwt.SigningMethodHS512, secret, ok), ErrAlgorithm},
		{"ES256 token, RSA key", rs, sign(t, jwt.SigningMethodES256, k.ec, ok), ErrAlgorithm},
		{"EdDSA token, EC key", es, sign(t, jwt.SigningMethodEdDSA, k.ed, ok), ErrAlgorithm},
		{"unknown alg", hs, []byte("eyJhbGciOiJYWVoiLCJ0eXAiOiJKV1QifQ.eyJleHAiOjF9.c2ln"), ErrAlgorithm},
	}
	all := []error{ErrMalformed, ErrSignature, ErrExpired, ErrNotYetValid, ErrNoExp, ErrIssuer, ErrAudience, ErrAlgorithm, ErrClaims, ErrHeader}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, err := NewVerifier(tc.cfg)
			require.NoError(t, err)
			c, err := v.Verify(tc.tok, t0.Add(time.Minute))
			assert.Nil(t, c)
			require.ErrorIs(t, err, tc.want)
			for _, other := range all {
				if other != tc.want {
					assert.NotErrorIs(t, err, other)
				}
			}
			assert.NotContains(t, err.Error(), "\n")
		})
	}
}

func TestVerifyAccepts(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	exp := t0.Add(time.Hour).Unix()
	now := t0.Add(time.Minute)
	cases := []struct {
		name string
		cfg  Config
		tok  []byte
	}{
		{"no exp allowed", Config{Secret: secret, AllowNoExp: true}, sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "x"})},
		{"nbf reached", Config{Secret: secret}, sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"exp": exp, "nbf": now.Unix()})},
		{"issuer matches", Config{Secret: secret, Issuer: "app"}, sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"exp": exp, "iss": "app"})},
		{"audience as string", Config{Secret: secret, Audience: "pgsse"}, sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"exp": exp, "aud": "pgsse"})},
		{"audience in array", Config{Secret: secret, Audience: "pgsse"}, sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"exp": exp, "aud": []string{"web", "pgsse"}})},
		{"aud ignored when not configured", Config{Secret: secret}, sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"exp": exp, "aud": "web"})},
		{"fractional exp", Config{Secret: secret}, sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"exp": float64(exp) + 0.5})},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, err := NewVerifier(tc.cfg)
			require.NoError(t, err)
			_, err = v.Verify(tc.tok, now)
			assert.NoError(t, err)
		})
	}
}

func TestVerifierBothKeys(t *testing.T) {
	k := getKeys(t)
	secret := []byte("0123456789abcdef0123456789abcdef")
	v, err := NewVerifier(Config{Secret: secret, PublicKeyPEM: pkixPEM(t, &k.ec.PublicKey)})
	require.NoError(t, err)
	assert.Equal(t, []string{AlgHS256, AlgES256}, v.Algorithms())
	claims := jwt.MapClaims{"exp": t0.Add(time.Hour).Unix()}
	_, err = v.Verify(sign(t, jwt.SigningMethodHS256, secret, claims), t0)
	assert.NoError(t, err)
	_, err = v.Verify(sign(t, jwt.SigningMethodES256, k.ec, claims), t0)
	assert.NoError(t, err)
	_, err = v.Verify(sign(t, jwt.SigningMethodHS256, pkixPEM(t, &k.ec.PublicKey), claims), t0)
	assert.ErrorIs(t, err, ErrSignature, "HS256 is checked with the secret, never the public key")
}

func TestClaimExtraction(t *testing.T) {
	secret := []byte("s3cret-s3cret-s3cret-s3cret-s3cr")
	tok := sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{
		"exp": t0.Add(time.Hour).Unix(),
		"sub": "u1",
		"pgsse": map[string]any{
			"streams":  []string{"orders/42", "chat/*"},
			"channels": []string{"jobs", "ops*"},
			"tags":     []string{"user:7"},
		},
		"other": map[string]any{"the application's": "claims are ignored"},
	})
	v, err := NewVerifier(Config{Secret: secret})
	require.NoError(t, err)
	c, err := v.Verify(tok, t0)
	require.NoError(t, err)
	assert.Equal(t, []string{"orders/42", "chat/*"}, c.Streams)
	assert.Equal(t, []string{"jobs", "ops*"}, c.Channels)
	assert.Equal(t, []string{"user:7"}, c.Tags)
	assert.Equal(t, "u1", c.Subject)
	assert.Equal(t, t0.Add(time.Hour).Unix(), c.Expires.Unix())

	// A token without the pgsse claim is valid and grants nothing.
	c, err = v.Verify(sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"exp": t0.Add(time.Hour).Unix()}), t0)
	require.NoError(t, err)
	assert.False(t, c.AllowsStream([]byte("a")))
	assert.False(t, c.AllowsChannel([]byte("a")))
	assert.Empty(t, c.Tags)
	var nilClaims *Claims
	assert.False(t, nilClaims.AllowsStream([]byte("a")))
}

func TestNewVerifierErrors(t *testing.T) {
	k := getKeys(t)
	pkcs1Priv := pemBlock("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(k.rsa))
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no key", Config{}, "no JWT key"},
		{"not PEM", Config{PublicKeyPEM: []byte("hello")}, "public key: no PEM block"},
		{"only unrelated blocks", Config{PublicKeyPEM: pemBlock("EC PARAMETERS", []byte{1})}, "public key: no PEM block"},
		{"private key given", Config{PublicKeyPEM: pkcs1Priv}, `public key: PEM block "RSA PRIVATE KEY" is a private key`},
		{"garbage DER", Config{PublicKeyPEM: pemBlock("PUBLIC KEY", []byte{1, 2, 3})}, `public key: PEM block "PUBLIC KEY" does not hold a valid key`},
		{"P-384", Config{PublicKeyPEM: pkixPEM(t, &k.ecP384.PublicKey)}, "unsupported EC curve P-384"},
		{"small RSA", Config{PublicKeyPEM: pkixPEM(t, &k.rsaSmall.PublicKey)}, "RSA key has 1024 bits; at least 2048 are required"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, err := NewVerifier(tc.cfg)
			assert.Nil(t, v)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), "\n")
		})
	}
}

func TestMintErrors(t *testing.T) {
	k := getKeys(t)
	cases := []struct {
		name string
		key  MintKey
		ttl  time.Duration
		want string
	}{
		{"no key", MintKey{}, time.Hour, "no signing key"},
		{"both", MintKey{Secret: []byte("x"), PrivateKeyPEM: pkcs8PEM(t, k.ed)}, time.Hour, "not both"},
		{"negative ttl", MintKey{Secret: []byte("x")}, -time.Second, "ttl must not be negative"},
		{"public key as private", MintKey{PrivateKeyPEM: pkixPEM(t, &k.ec.PublicKey)}, time.Hour, `PEM block "PUBLIC KEY" is not a private key`},
		{"not PEM", MintKey{PrivateKeyPEM: []byte("nope")}, time.Hour, "no PEM block"},
		{"encrypted", MintKey{PrivateKeyPEM: pemBlock("ENCRYPTED PRIVATE KEY", []byte{1})}, time.Hour, "encrypted private keys are not supported"},
		{"P-384", MintKey{PrivateKeyPEM: pkcs8PEM(t, k.ecP384)}, time.Hour, "unsupported EC curve P-384"},
		{"small RSA", MintKey{PrivateKeyPEM: pkcs8PEM(t, k.rsaSmall)}, time.Hour, "at least 2048"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tok, err := Mint(tc.key, Claims{Streams: []string{"a"}}, tc.ttl, "", "", t0)
			assert.Empty(t, tok)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestMintOptionalClaims(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	tok, err := Mint(MintKey{Secret: secret}, Claims{Streams: []string{"s"}}, 0, "app", "pgsse", t0)
	require.NoError(t, err)
	var mc jwt.MapClaims
	_, _, err = jwt.NewParser().ParseUnverified(tok, &mc)
	require.NoError(t, err)
	assert.NotContains(t, mc, "exp", "ttl 0 means no exp")
	assert.Equal(t, "app", mc["iss"])
	assert.Equal(t, float64(t0.Unix()), mc["iat"])

	strict, err := NewVerifier(Config{Secret: secret, Issuer: "app", Audience: "pgsse"})
	require.NoError(t, err)
	_, err = strict.Verify([]byte(tok), t0)
	assert.ErrorIs(t, err, ErrNoExp)
	relaxed, err := NewVerifier(Config{Secret: secret, Issuer: "app", Audience: "pgsse", AllowNoExp: true})
	require.NoError(t, err)
	c, err := relaxed.Verify([]byte(tok), t0)
	require.NoError(t, err)
	assert.True(t, c.Expires.IsZero())
}

func TestMatch(t *testing.T) {
	cases := []struct {
		pattern, name string
		want          bool
	}{
		{"chat/*", "chat/", true},
		{"chat/*", "chat/x/y", true},
		{"chat/*", "chat", false},
		{"chat/*", "cha", false},
		{"chat/*", "chatroom", false},
		{"chat*", "chatroom", true},
		{"*", "anything", true},
		{"*", "", true},
		{"orders/42", "orders/42", true},
		{"orders/42", "orders/420", false},
		{"orders/42", "orders/4", false},
		{"orders/42", "", false},
		{"a*b", "a*b", true}, // '*' not at the end is literal
		{"a*b", "axb", false},
		{"", "", true},
		{"", "a", false},
	}
	for _, tc := range cases {
		assert.Equal(t, tc.want, Match(tc.pattern, []byte(tc.name)), "Match(%q, %q)", tc.pattern, tc.name)
	}
	assert.True(t, MatchAny([]string{"x", "public/*"}, []byte("public/news")))
	assert.False(t, MatchAny(nil, []byte("x")))
}

func TestInAudience(t *testing.T) {
	cases := []struct {
		tags, audience []string
		want           bool
	}{
		{nil, nil, true},
		{nil, []string{}, true},
		{[]string{"user:7"}, nil, true},
		{[]string{"user:7", "role:admin"}, []string{"x", "role:admin"}, true},
		{[]string{"user:70", "role"}, []string{"user:7", "role:admin"}, false},
		{nil, []string{"user:7"}, false},
		{[]string{""}, []string{"user:7"}, false},
	}
	for _, tc := range cases {
		assert.Equal(t, tc.want, InAudience(tc.tags, tc.audience), "tags %q audience %q", tc.tags, tc.audience)
	}
}

func TestMatchAllocs(t *testing.T) {
	c := &Claims{Streams: []string{"orders/42", "chat/*"}, Channels: []string{"jobs"}, Tags: []string{"a", "user:7"}}
	name := []byte("chat/room/9")
	miss := []byte("billing/1")
	ch := []byte("jobs")
	audience := []string{"role:admin", "user:7"}
	allocs := testing.AllocsPerRun(1000, func() {
		if !c.AllowsStream(name) || c.AllowsStream(miss) || !c.AllowsChannel(ch) || !InAudience(c.Tags, audience) {
			panic("wrong answer")
		}
	})
	assert.Zero(t, allocs)
}

func BenchmarkAllowsStream(b *testing.B) {
	c := &Claims{Streams: []string{"orders/42", "orders/43", "users/7/*", "chat/*"}}
	name := []byte("chat/room/12345")
	b.ReportAllocs()
	for b.Loop() {
		if !c.AllowsStream(name) {
			b.Fatal("no match")
		}
	}
}

func BenchmarkVerifyHS256(b *testing.B) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	tok, err := Mint(MintKey{Secret: secret}, Claims{Streams: []string{"chat/*"}, Tags: []string{"user:7"}}, time.Hour, "", "", t0)
	require.NoError(b, err)
	v, err := NewVerifier(Config{Secret: secret})
	require.NoError(b, err)
	tb := []byte(tok)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(tb, t0); err != nil {
			b.Fatal(err)
		}
	}
}

// TestVerifyRejectsBadClaims: issue #11 — a NUL in a token tag made every
// replay read fail in PostgreSQL. Token contents follow the name rules; the
// error names the claim and the rule.
func TestVerifyRejectsBadClaims(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	v, err := NewVerifier(Config{Secret: secret})
	require.NoError(t, err)
	exp := t0.Add(time.Hour).Unix()
	many := make([]string, MaxClaimEntries+1)
	for i := range many {
		many[i] = "t" + strings.Repeat("x", i%5)
	}
	cases := []struct {
		name  string
		pgsse map[string]any
		want  string
	}{
		{"NUL in a tag", map[string]any{"tags": []string{"a", "b", "user:\x00"}},
			"token claim pgsse.tags[2]: audience tag must not contain control characters"},
		{"newline in a tag", map[string]any{"tags": []string{"a\nb"}},
			"token claim pgsse.tags[0]: audience tag must not contain control characters"},
		{"empty tag", map[string]any{"tags": []string{""}}, "token claim pgsse.tags[0]: audience tag must be 1-200 bytes"},
		{"long tag", map[string]any{"tags": []string{strings.Repeat("t", 201)}}, "token claim pgsse.tags[0]: audience tag must be 1-200 bytes"},
		{"too many tags", map[string]any{"tags": many}, "token claim pgsse.tags: at most 256 entries"},
		{"stream pattern with a space", map[string]any{"streams": []string{"ok", "a b*"}},
			"token claim pgsse.streams[1]: stream name may contain only A-Z a-z 0-9 and . _ : @ / = + ~ -"},
		{"star inside a stream pattern", map[string]any{"streams": []string{"a*b"}},
			"token claim pgsse.streams[0]: stream pattern may hold * only as its last byte (a prefix pattern)"},
		{"empty stream pattern", map[string]any{"streams": []string{""}}, "token claim pgsse.streams[0]: stream name must be 1-200 bytes"},
		{"NUL in a channel pattern", map[string]any{"channels": []string{"jobs\x00*"}},
			"token claim pgsse.channels[0]: channel name must not contain a NUL byte"},
		{"long channel", map[string]any{"channels": []string{strings.Repeat("c", 64)}},
			"token claim pgsse.channels[0]: channel name must be at most 63 bytes"},
		{"bad publish pattern", map[string]any{"publish": []string{"orders/*", "x y"}},
			"token claim pgsse.publish[1]: stream name may contain only A-Z a-z 0-9 and . _ : @ / = + ~ -"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tok := sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"exp": exp, "pgsse": tc.pgsse})
			c, err := v.Verify(tok, t0)
			assert.Nil(t, c)
			require.ErrorIs(t, err, ErrClaims)
			assert.Equal(t, tc.want, err.Error())
			assert.NotErrorIs(t, err, ErrSignature)
		})
	}
	// At the bounds: accepted.
	ok := sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"exp": exp, "pgsse": map[string]any{
		"tags":     append(many[:MaxClaimEntries:MaxClaimEntries], "€"),
		"streams":  []string{"*", strings.Repeat("s", 200), strings.Repeat("p", 200) + "*"},
		"channels": []string{"*", "with space", "a*b", strings.Repeat("c", 63), "équipe*"},
	}})
	_, err = v.Verify(ok, t0)
	require.ErrorIs(t, err, ErrClaims, "257 tags")
	ok = sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"exp": exp, "pgsse": map[string]any{
		"tags":     many[:MaxClaimEntries],
		"streams":  []string{"*", strings.Repeat("s", 200), strings.Repeat("p", 200) + "*"},
		"channels": []string{"*", "with space", "a*b", strings.Repeat("c", 63), "équipe*"},
		"publish":  []string{"orders/*"},
	}})
	c, err := v.Verify(ok, t0)
	require.NoError(t, err)
	assert.Len(t, c.Tags, MaxClaimEntries)
}

// TestVerifyRejectsClaimsNotUTF8: docs/http.md, tags and patterns in a token are valid UTF-8, and
// a token that breaks that is rejected naming the claim. encoding/json turns invalid UTF-8 and
// lone surrogate escapes into U+FFFD without a word, so before the fix such a token was
// accepted with tags it was never signed with ("\xff" and "\xfe" both became "\ufffd").
func TestVerifyRejectsClaimsNotUTF8(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	v, err := NewVerifier(Config{Secret: secret})
	require.NoError(t, err)
	// signRaw signs payload as it is: json.Marshal would already have replaced the bad bytes.
	signRaw := func(pgsse string) []byte {
		enc := base64.RawURLEncoding
		unsigned := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." +
			enc.EncodeToString([]byte(`{"exp":`+strconv.FormatInt(t0.Add(time.Hour).Unix(), 10)+`,"pgsse":`+pgsse+`}`))
		sig, err := jwt.SigningMethodHS256.Sign(unsigned, secret)
		require.NoError(t, err)
		return []byte(unsigned + "." + enc.EncodeToString(sig))
	}
	// In the cases below <FF> and <FE> stand for those raw bytes (Go source cannot hold them).
	rawBytes := strings.NewReplacer("<FF>", "\xff", "<FE>", "\xfe")
	for _, tc := range []struct{ name, pgsse, want string }{
		{"invalid byte in a tag", `{"tags":["a","<FF>"]}`, "token claim pgsse.tags[1]: audience tag must be valid UTF-8"},
		{"lone low surrogate in a tag", `{"tags":["\udcff"]}`, "token claim pgsse.tags[0]: audience tag must be valid UTF-8"},
		{"lone high surrogate at a tag's end", `{"tags":["x\ud83d"]}`, "token claim pgsse.tags[0]: audience tag must be valid UTF-8"},
		{"high surrogate before a non-surrogate", `{"tags":["\ud83d\u0041"]}`, "token claim pgsse.tags[0]: audience tag must be valid UTF-8"},
		{"invalid byte in a channel pattern", `{"channels":["jobs","j<FE>*"]}`, "token claim pgsse.channels[1]: channel name must be valid UTF-8"},
		{"lone surrogate in a channel pattern", `{"channels":["\ud800"]}`, "token claim pgsse.channels[0]: channel name must be valid UTF-8"},
		{"invalid byte in a stream pattern", `{"streams":["s<FF>"]}`,
			"token claim pgsse.streams[0]: stream name may contain only A-Z a-z 0-9 and . _ : @ / = + ~ -"},
		{"lone surrogate in a publish pattern", `{"publish":["\udc00x"]}`,
			"token claim pgsse.publish[0]: stream name may contain only A-Z a-z 0-9 and . _ : @ / = + ~ -"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := v.Verify(signRaw(rawBytes.Replace(tc.pgsse)), t0)
			assert.Nil(t, c)
			require.ErrorIs(t, err, ErrClaims)
			assert.Equal(t, tc.want, err.Error())
		})
	}
	// Escapes that spell valid UTF-8 are fine: a pair, U+FFFD itself (escaped or not), an
	// escaped backslash before "u".
	c, err := v.Verify(signRaw(`{"tags":["\ud83d\udc18","\ufffd","\uFFFD","`+"\ufffd"+`","\\udcff","€"],"channels":["é*"]}`), t0)
	require.NoError(t, err)
	assert.Equal(t, []string{"🐘", "\ufffd", "\ufffd", "\ufffd", `\udcff`, "€"}, c.Tags)
	assert.Equal(t, []string{"é*"}, c.Channels)
}

func TestPublishGrants(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	tok, err := Mint(MintKey{Secret: secret}, Claims{Publish: []string{"orders/*"}, Streams: []string{"chat/*"}}, time.Hour, "", "", t0)
	require.NoError(t, err)
	v, err := NewVerifier(Config{Secret: secret})
	require.NoError(t, err)
	c, err := v.Verify([]byte(tok), t0)
	require.NoError(t, err)
	assert.Equal(t, []string{"orders/*"}, c.Publish)
	assert.True(t, c.AllowsPublish([]byte("orders/42")))
	assert.False(t, c.AllowsStream([]byte("orders/42")), "a publish grant does not allow subscribing")
	assert.True(t, c.AllowsStream([]byte("chat/1")))
	assert.False(t, c.AllowsPublish([]byte("chat/1")), "a subscribe grant does not allow publishing")
	var none *Claims
	assert.False(t, none.AllowsPublish([]byte("orders/42")))
	assert.Zero(t, testing.AllocsPerRun(100, func() { _ = c.AllowsPublish([]byte("orders/42")) }))
}

func TestMintRefusesBadClaims(t *testing.T) {
	_, err := Mint(MintKey{Secret: []byte("s")}, Claims{Tags: []string{"a\x00"}}, time.Hour, "", "", t0)
	require.ErrorIs(t, err, ErrClaims)
	assert.Equal(t, "token claim pgsse.tags[0]: audience tag must not contain control characters", err.Error())
	_, err = Mint(MintKey{Secret: []byte("s")}, Claims{Publish: []string{"a*b"}}, time.Hour, "", "", t0)
	require.ErrorIs(t, err, ErrClaims)
}

// The public-stream rule (issue #11 asks for one): a token there only adds
// tags; one that does not verify is ignored; only a token with tags bounds
// the connection's life.
func TestOnPublicStream(t *testing.T) {
	exp := t0.Add(time.Hour)
	withTags := &Claims{Tags: []string{"user:7"}, Expires: exp}
	noTags := &Claims{Streams: []string{"*"}, Expires: exp}
	cases := []struct {
		name     string
		c        *Claims
		err      error
		tags     []string
		deadline time.Time
	}{
		{"no token", nil, nil, nil, time.Time{}},
		{"expired token: anonymous, no deadline", nil, ErrExpired, nil, time.Time{}},
		{"forged token: anonymous", nil, ErrSignature, nil, time.Time{}},
		{"token breaking the name rules: anonymous", nil, &ClaimError{Claim: "pgsse.tags", Index: 0, Err: ErrMalformed}, nil, time.Time{}},
		{"valid token with tags: its tags until exp", withTags, nil, []string{"user:7"}, exp},
		{"valid token without tags: nothing to end", noTags, nil, nil, time.Time{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tags, deadline := OnPublicStream(tc.c, tc.err)
			assert.Equal(t, tc.tags, tags)
			assert.True(t, tc.deadline.Equal(deadline), "deadline %v", deadline)
		})
	}
}

// An exp far in the future (here 1e11 s, the largest not taken for milliseconds, past
// 2262's int64 nanoseconds) is capped at maxExpires, so that the engine's millisecond
// deadline and the cache's nanosecond one do not overflow into the past and end the
// connection at once. (1.8e16 s, which used to be capped, is now refused: it can only be a
// clock in finer units.)
func TestVerifyCapsFarExp(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	v, err := NewVerifier(Config{Secret: secret})
	require.NoError(t, err)
	c, err := v.Verify(sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"exp": 1e11}), t0)
	require.NoError(t, err)
	assert.Equal(t, maxExpires, c.Expires)
	assert.Greater(t, c.Expires.UnixMilli(), t0.UnixMilli())
	assert.Greater(t, c.Expires.UnixNano(), t0.UnixNano())
}
