package auth

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var poolSecret = []byte("0123456789abcdef0123456789abcdef")

func hsToken(t testing.TB, claims jwt.MapClaims) []byte {
	return sign(t, jwt.SigningMethodHS256, poolSecret, claims)
}

func hsVerifier(t testing.TB) *Verifier {
	v, err := NewVerifier(Config{Secret: poolSecret})
	require.NoError(t, err)
	return v
}

// result is one done call.
type result struct {
	claims *Claims
	err    error
}

func submitWait(t *testing.T, p *Pool, tok []byte, now time.Time) result {
	t.Helper()
	ch := make(chan result, 1)
	require.True(t, p.Submit(tok, now, func(c *Claims, err error) { ch <- result{c, err} }))
	select {
	case r := <-ch:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("done never ran")
	}
	return result{}
}

func TestPoolVerifiesAndCaches(t *testing.T) {
	p := NewPool(hsVerifier(t), PoolConfig{Workers: 2})
	defer p.Close()
	now := t0
	tok := hsToken(t, jwt.MapClaims{"exp": now.Add(time.Hour).Unix(), "pgsse": map[string]any{"streams": []string{"a/*"}}})

	_, _, hit := p.Lookup(tok, now)
	assert.False(t, hit, "never seen")
	// The token is a view into a read buffer the caller reuses at once.
	buf := append([]byte(nil), tok...)
	ch := make(chan result, 1)
	require.True(t, p.Submit(buf, now, func(c *Claims, err error) { ch <- result{c, err} }))
	for i := range buf {
		buf[i] = 'x'
	}
	r := <-ch
	require.NoError(t, r.err)
	assert.True(t, r.claims.AllowsStream([]byte("a/1")))

	c, err, hit := p.Lookup(tok, now.Add(time.Minute))
	require.True(t, hit, "verified tokens are cached")
	require.NoError(t, err)
	assert.Same(t, r.claims, c)
	assert.Equal(t, uint64(1), p.Stats().Hits.Load())
	assert.Equal(t, uint64(1), p.Stats().Misses.Load())
	assert.Equal(t, uint64(1), p.Stats().Verified.Load())
}

// A forged token never finds a real token's entry: the key is the hash of
// the exact bytes, not anything the token claims.
func TestCacheForgedTokenMisses(t *testing.T) {
	p := NewPool(hsVerifier(t), PoolConfig{Workers: 1})
	defer p.Close()
	now := t0
	claims := jwt.MapClaims{"exp": now.Add(time.Hour).Unix(), "sub": "alice", "pgsse": map[string]any{"streams": []string{"*"}}}
	good := hsToken(t, claims)
	require.NoError(t, submitWait(t, p, good, now).err)

	parts := strings.Split(string(good), ".")
	forgedSig := []byte(parts[0] + "." + parts[1] + "." + strings.Repeat("A", len(parts[2])))
	forgedKey := sign(t, jwt.SigningMethodHS256, []byte("another secret, equally long...."), claims)
	for _, forged := range [][]byte{forgedSig, forgedKey, append(append([]byte(nil), good...), '='), good[:len(good)-1]} {
		_, _, hit := p.Lookup(forged, now)
		assert.False(t, hit, "%q", forged)
		r := submitWait(t, p, forged, now)
		assert.Error(t, r.err, "%q", forged)
		assert.Nil(t, r.claims)
		// The failure is remembered now, and the good token is untouched.
		_, err, hit := p.Lookup(forged, now)
		assert.True(t, hit)
		assert.Error(t, err)
		c, err, hit := p.Lookup(good, now)
		require.True(t, hit)
		require.NoError(t, err)
		assert.Equal(t, "alice", c.Subject)
	}
}

func TestCacheHonoursExpAndNbf(t *testing.T) {
	c := NewCache(0, 0, 0, nil)
	now := t0
	exp, nbf := now.Add(time.Hour), now.Add(-time.Minute)
	tok := []byte("a.b.c")
	c.Store(tok, &Claims{Expires: exp, NotBefore: nbf, Subject: "s"}, nil, now)

	_, _, hit := c.Lookup(tok, exp.Add(-time.Nanosecond))
	assert.True(t, hit, "valid until exp")
	_, _, hit = c.Lookup(tok, nbf.Add(-time.Second))
	assert.False(t, hit, "before nbf (the clock went back): verify again")
	_, _, hit = c.Lookup(tok, exp)
	assert.False(t, hit, "at exp the entry is gone: Verify says expired")
	ok, _ := c.Len()
	assert.Zero(t, ok, "and it was dropped")

	// A token without exp is kept at most MaxCacheAge.
	c.Store(tok, &Claims{}, nil, now)
	_, _, hit = c.Lookup(tok, now.Add(MaxCacheAge-time.Second))
	assert.True(t, hit)
	_, _, hit = c.Lookup(tok, now.Add(MaxCacheAge))
	assert.False(t, hit)

	// Already expired: not stored at all.
	c.Store(tok, &Claims{Expires: now}, nil, now)
	_, _, hit = c.Lookup(tok, now.Add(-time.Hour))
	assert.False(t, hit)
}

func TestCacheFailures(t *testing.T) {
	c := NewCache(0, 0, 4, nil)
	now := t0
	permanentErrs := []error{ErrMalformed, ErrSignature, ErrAlgorithm, ErrIssuer, ErrAudience, ErrNoExp, ErrExpired,
		&ClaimError{Claim: "pgsse.tags", Index: 0, Err: errTooManyEntries}}
	for i, e := range permanentErrs {
		tok := []byte(fmt.Sprintf("fail.%d.x", i))
		c.Store(tok, nil, e, now)
		_, err, hit := c.Lookup(tok, now.Add(FailureTTL-time.Second))
		require.True(t, hit, "%v is remembered", e)
		assert.Same(t, e, err)
		_, _, hit = c.Lookup(tok, now.Add(FailureTTL))
		assert.False(t, hit, "%v is forgotten after FailureTTL", e)
	}
	// nbf in the future becomes valid later: never remembered as a failure.
	c.Store([]byte("later"), nil, ErrNotYetValid, now)
	_, _, hit := c.Lookup([]byte("later"), now)
	assert.False(t, hit)
	_, bad := c.Len()
	assert.LessOrEqual(t, bad, 4, "the failure table is bounded")

	// Malformed by length is answered without the table.
	_, err, hit := c.Lookup(nil, now)
	assert.True(t, hit)
	assert.Equal(t, ErrMalformed, err)
	_, err, hit = c.Lookup(make([]byte, MaxTokenBytes+1), now)
	assert.True(t, hit)
	assert.Equal(t, ErrMalformed, err)
}

// A flood of distinct forged tokens fills only the failure table: a valid
// token's entry stays.
func TestCacheFailureFloodCannotEvictValid(t *testing.T) {
	c := NewCache(10, 0, 16, nil)
	now := t0
	good := []byte("good.token.sig")
	c.Store(good, &Claims{Subject: "alice", Expires: now.Add(time.Hour)}, nil, now)
	for i := 0; i < 10_000; i++ {
		c.Store([]byte(fmt.Sprintf("forged.%d.sig", i)), nil, ErrSignature, now)
	}
	claims, err, hit := c.Lookup(good, now)
	require.True(t, hit)
	require.NoError(t, err)
	assert.Equal(t, "alice", claims.Subject)
	ok, bad := c.Len()
	assert.Equal(t, 1, ok)
	assert.Equal(t, 16, bad)
}

func TestCacheBounds(t *testing.T) {
	now := t0
	c := NewCache(100, 0, 0, nil)
	for i := 0; i < 1000; i++ {
		c.Store([]byte(fmt.Sprintf("t.%d.s", i)), &Claims{Expires: now.Add(time.Hour)}, nil, now)
	}
	ok, _ := c.Len()
	assert.Equal(t, 100, ok, "entries bounded")

	big := &Claims{Tags: []string{strings.Repeat("t", 200)}, Expires: now.Add(time.Hour)}
	per := claimsBytes(big)
	c = NewCache(0, 10*per, 0, nil)
	for i := 0; i < 100; i++ {
		c.Store([]byte(fmt.Sprintf("t.%d.s", i)), big, nil, now)
	}
	ok, _ = c.Len()
	assert.Equal(t, 10, ok, "bytes bounded")
	assert.LessOrEqual(t, c.okBytes, 10*per)

	// Expired entries are evicted before live ones.
	c = NewCache(2, 0, 0, nil)
	c.Store([]byte("old"), &Claims{Expires: now.Add(time.Second)}, nil, now)
	c.Store([]byte("live"), &Claims{Expires: now.Add(time.Hour)}, nil, now)
	later := now.Add(time.Minute)
	c.Store([]byte("new"), &Claims{Expires: later.Add(time.Hour)}, nil, later)
	_, _, hit := c.Lookup([]byte("live"), later)
	assert.True(t, hit)
	_, _, hit = c.Lookup([]byte("new"), later)
	assert.True(t, hit)

	// Disabled tables store nothing.
	c = NewCache(-1, 0, -1, nil)
	c.Store([]byte("x"), &Claims{}, nil, now)
	c.Store([]byte("y"), nil, ErrSignature, now)
	ok, bad := c.Len()
	assert.Zero(t, ok+bad)
}

func TestCacheLookupDoesNotAllocate(t *testing.T) {
	c := NewCache(0, 0, 0, nil)
	now := t0
	tok := hsToken(t, jwt.MapClaims{"exp": now.Add(time.Hour).Unix()})
	c.Store(tok, &Claims{Expires: now.Add(time.Hour)}, nil, now)
	miss := append([]byte(nil), tok...)
	miss[0] ^= 1
	allocs := testing.AllocsPerRun(500, func() {
		if _, _, hit := c.Lookup(tok, now); !hit {
			panic("miss")
		}
		if _, _, hit := c.Lookup(miss, now); hit {
			panic("hit")
		}
	})
	assert.Zero(t, allocs)
}

func TestPoolSubmitDoesNotAllocate(t *testing.T) {
	p := NewPool(hsVerifier(t), PoolConfig{Workers: 1, Queue: 16})
	defer p.Close()
	tok := hsToken(t, jwt.MapClaims{"exp": t0.Add(time.Hour).Unix()})
	var wg sync.WaitGroup
	done := func(*Claims, error) { wg.Done() }
	allocs := testing.AllocsPerRun(200, func() {
		wg.Add(1)
		if !p.Submit(tok, t0, done) {
			panic("refused")
		}
		wg.Wait()
	})
	assert.Zero(t, allocs, "Submit copies the token into a reused buffer")
}

// The queue is bounded: Submit refuses at once instead of blocking the loop.
func TestPoolQueueFull(t *testing.T) {
	p := NewPool(hsVerifier(t), PoolConfig{Workers: 1, Queue: 2, CacheEntries: -1, FailureEntries: -1})
	release := make(chan struct{})
	started := make(chan struct{})
	var results sync.WaitGroup
	tok := hsToken(t, jwt.MapClaims{"exp": t0.Add(time.Hour).Unix()})

	results.Add(1)
	require.True(t, p.Submit(tok, t0, func(*Claims, error) { close(started); <-release; results.Done() }))
	<-started // the only worker is busy
	for i := 0; i < 2; i++ {
		results.Add(1)
		require.True(t, p.Submit(tok, t0, func(*Claims, error) { results.Done() }), "queued %d", i)
	}
	ran := false
	assert.False(t, p.Submit(tok, t0, func(*Claims, error) { ran = true }), "queue full")
	assert.Equal(t, uint64(1), p.Stats().QueueFull.Load())
	assert.Equal(t, 2, p.Queued())
	close(release)
	results.Wait()
	p.Close()
	assert.False(t, ran)
	assert.False(t, p.Submit(tok, t0, func(*Claims, error) {}), "closed")
}

// Close runs every queued job's done before returning, then stops the workers.
func TestPoolCloseDrains(t *testing.T) {
	p := NewPool(hsVerifier(t), PoolConfig{Workers: 2, Queue: 100})
	var mu sync.Mutex
	n := 0
	for i := 0; i < 50; i++ {
		tok := hsToken(t, jwt.MapClaims{"exp": t0.Add(time.Hour).Unix(), "sub": fmt.Sprint(i)})
		require.True(t, p.Submit(tok, t0, func(c *Claims, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				n++
			}
		}))
	}
	p.Close()
	assert.Equal(t, 50, n)
	p.Close() // idempotent
}

// Many goroutines looking up and submitting at once (run with -race).
func TestPoolConcurrent(t *testing.T) {
	p := NewPool(hsVerifier(t), PoolConfig{Workers: 4, Queue: 1024, CacheEntries: 32})
	defer p.Close()
	toks := make([][]byte, 64)
	for i := range toks {
		toks[i] = hsToken(t, jwt.MapClaims{"exp": t0.Add(time.Hour).Unix(), "sub": fmt.Sprint(i)})
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				tok := toks[(g*31+i)%len(toks)]
				want := fmt.Sprint((g*31 + i) % len(toks))
				if c, err, hit := p.Lookup(tok, t0); hit {
					if err != nil || c.Subject != want {
						t.Errorf("cache gave %v %v for %s", c, err, want)
					}
					continue
				}
				ch := make(chan result, 1)
				if !p.Submit(tok, t0, func(c *Claims, err error) { ch <- result{c, err} }) {
					continue
				}
				if r := <-ch; r.err != nil || r.claims.Subject != want {
					t.Errorf("pool gave %v %v for %s", r.claims, r.err, want)
				}
			}
		}()
	}
	wg.Wait()
	ok, _ := p.Cache().Len()
	assert.LessOrEqual(t, ok, 32)
}

func TestClaimErrorIs(t *testing.T) {
	err := error(&ClaimError{Claim: "pgsse.tags", Index: 2, Err: errors.New("x")})
	assert.ErrorIs(t, err, ErrClaims)
	var ce *ClaimError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, 2, ce.Index)
}

// Entries whose token expired go without waiting for the table to fill: a server whose
// clients reconnect with fresh short-lived tokens (the soak's churn, issue 24) would otherwise
// hold every expired one until the bound of 100,000 — memory growing for hours.
func TestCacheDropsExpiredEntries(t *testing.T) {
	c := NewCache(0, 0, 0, nil)
	now := t0
	for round := range 20 {
		for i := range 500 {
			c.Store([]byte(fmt.Sprintf("short.%d.%d", round, i)), &Claims{Expires: now.Add(5 * time.Second)}, nil, now)
			c.Store([]byte(fmt.Sprintf("bad.%d.%d", round, i)), nil, ErrSignature, now)
		}
		now = now.Add(FailureTTL) // every token stored so far has expired, every failure is forgotten
	}
	ok, bad := c.Len()
	assert.LessOrEqual(t, ok, 2*sweepMinStores, "verified entries held: only the recent ones, not 10,000 expired")
	assert.LessOrEqual(t, bad, 2*sweepMinStores, "failures held")

	// A sweep keeps what is still valid.
	c = NewCache(0, 0, 0, nil)
	now = t0
	c.Store([]byte("long"), &Claims{Subject: "alice", Expires: now.Add(time.Hour)}, nil, now)
	for i := range 4 * sweepMinStores {
		c.Store([]byte(fmt.Sprintf("s.%d", i)), &Claims{Expires: now.Add(time.Second)}, nil, now)
		now = now.Add(10 * time.Millisecond)
	}
	claims, err, hit := c.Lookup([]byte("long"), now)
	require.True(t, hit)
	require.NoError(t, err)
	assert.Equal(t, "alice", claims.Subject)
	ok, _ = c.Len()
	assert.Less(t, ok, 2*sweepMinStores)
}
