package auth

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// benchToken mints a typical browser token with key and returns it with a
// verifier for it.
func benchToken(b *testing.B, mint MintKey, cfg Config) ([]byte, *Verifier) {
	b.Helper()
	tok, err := Mint(mint, Claims{Streams: []string{"chat/*", "orders/42"}, Tags: []string{"user:7", "role:admin"}, Subject: "user-7"},
		time.Hour, "", "", t0)
	require.NoError(b, err)
	v, err := NewVerifier(cfg)
	require.NoError(b, err)
	return []byte(tok), v
}

func benchVerify(b *testing.B, tok []byte, v *Verifier) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(tok, t0); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerify(b *testing.B) {
	k := getKeys(b)
	secret := []byte("0123456789abcdef0123456789abcdef")
	cases := []struct {
		name string
		mint MintKey
		cfg  Config
	}{
		{"HS256", MintKey{Secret: secret}, Config{Secret: secret}},
		{"ES256", MintKey{PrivateKeyPEM: pkcs8PEM(b, k.ec)}, Config{PublicKeyPEM: pkixPEM(b, &k.ec.PublicKey)}},
		{"RS256", MintKey{PrivateKeyPEM: pkcs8PEM(b, k.rsa)}, Config{PublicKeyPEM: pkixPEM(b, &k.rsa.PublicKey)}},
		{"EdDSA", MintKey{PrivateKeyPEM: pkcs8PEM(b, k.ed)}, Config{PublicKeyPEM: pkixPEM(b, k.ed.Public())}},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			tok, v := benchToken(b, tc.mint, tc.cfg)
			benchVerify(b, tok, v)
		})
	}
}

// BenchmarkCacheLookupHit is what a reconnecting browser with a token seen
// before costs the loop: one SHA-256 of the token and a map lookup.
func BenchmarkCacheLookupHit(b *testing.B) {
	k := getKeys(b)
	tok, v := benchToken(b, MintKey{PrivateKeyPEM: pkcs8PEM(b, k.ec)}, Config{PublicKeyPEM: pkixPEM(b, &k.ec.PublicKey)})
	c := NewCache(0, 0, 0, nil)
	claims, err := v.Verify(tok, t0)
	require.NoError(b, err)
	c.Store(tok, claims, nil, t0)
	b.SetBytes(int64(len(tok)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, hit := c.Lookup(tok, t0); !hit {
			b.Fatal("miss")
		}
	}
}

// BenchmarkPoolThroughput verifies distinct ES256 tokens (no cache) through
// pools of 1, 2 and 4 workers: the rate at which a reconnect storm of new
// tokens is admitted. The submitting goroutine stands for the event loop.
func BenchmarkPoolThroughput(b *testing.B) {
	k := getKeys(b)
	mint := MintKey{PrivateKeyPEM: pkcs8PEM(b, k.ec)}
	v, err := NewVerifier(Config{PublicKeyPEM: pkixPEM(b, &k.ec.PublicKey)})
	require.NoError(b, err)
	toks := make([][]byte, 256)
	for i := range toks {
		tok, err := Mint(mint, Claims{Streams: []string{"chat/*"}, Tags: []string{"user:" + strconv.Itoa(i)}}, time.Hour, "", "", t0)
		require.NoError(b, err)
		toks[i] = []byte(tok)
	}
	for _, workers := range []int{1, 2, 4} {
		b.Run("ES256/workers="+strconv.Itoa(workers), func(b *testing.B) {
			p := NewPool(v, PoolConfig{Workers: workers, Queue: 1024, CacheEntries: -1, FailureEntries: -1})
			defer p.Close()
			// At most Queue tokens in flight, so Submit is never refused; the
			// submitter blocks (rather than spinning) while the workers catch up.
			inflight := make(chan struct{}, 1024)
			var wg sync.WaitGroup
			done := func(_ *Claims, err error) {
				if err != nil {
					panic(err)
				}
				<-inflight
				wg.Done()
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				inflight <- struct{}{}
				wg.Add(1)
				if !p.Submit(toks[i%len(toks)], t0, done) {
					b.Fatal("refused")
				}
				i++
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}
