package auth

import (
	"crypto/sha256"
	"errors"
	"sync"
	"time"
)

// Cache remembers verification results so that a token is checked once,
// not once per connection: a reconnect storm of browsers presenting the
// tokens they already had costs one hash each (docs/http.md, Authorization).
//
// Entries are keyed by the SHA-256 of the exact token bytes, never by
// anything the token claims, so a forged token can only ever find its own
// entry. Verified tokens are kept until their exp (MaxCacheAge at most, and
// only while now is not before their nbf); failures that time cannot undo
// (bad signature, malformed, wrong algorithm, issuer or audience, no exp,
// broken claims, expired) are kept apart, for FailureTTL, in a smaller
// table, so a flood of one forged token is answered without a signature
// check and can never evict, or be mistaken for, a valid token's entry.
// Both tables are bounded (entries, and bytes of claims for the verified
// one); when full, an arbitrary entry — an expired one if the few looked at
// include one — makes room. Expired entries also go in a sweep, once as many
// results have been stored since the last sweep as it left (1,024 at least):
// amortized O(1) a Store, and the cache never holds more expired entries than
// that, so clients reconnecting with fresh short-lived tokens do not fill it
// to its bound with dead ones (issue 24's soak).
//
// A Cache is safe for concurrent use: the event loop looks up, the verifier
// pool stores.
type Cache struct {
	mu       sync.Mutex
	ok       map[[sha256.Size]byte]cachedClaims
	bad      map[[sha256.Size]byte]cachedFailure
	okBytes  int64
	maxOK    int
	maxBytes int64
	maxBad   int
	stores   int // results stored since the last sweep
	sweepAt  int // stores that make the next sweep: what the last one left, sweepMinStores at least
	stats    *Stats
}

type cachedClaims struct {
	claims  *Claims
	until   int64 // unix nanoseconds: exp, or the MaxCacheAge bound
	nbf     int64 // unix nanoseconds; 0 if none
	charged int64 // bytes counted against maxBytes
}

type cachedFailure struct {
	err   error
	until int64 // unix nanoseconds
}

// Cache bounds and lifetimes.
const (
	DefaultCacheEntries    = 100_000
	DefaultCacheBytes      = 64 << 20
	DefaultFailureEntries  = 4096
	MaxCacheAge            = time.Hour   // a verified token without exp (--jwt-allow-no-exp) is re-checked this often
	FailureTTL             = time.Minute // how long a permanent failure is remembered
	cacheEvictionLookahead = 8           // entries looked at for an expired one before evicting any
	sweepMinStores         = 1024        // results stored between two sweeps of expired entries, at least
)

// NewCache makes a cache of at most entries verified tokens holding at most
// maxBytes of claims, and failures failure entries; zero selects the
// defaults above, a negative value disables that table. stats (may be nil)
// receives the hit, miss and eviction counts.
func NewCache(entries int, maxBytes int64, failures int, stats *Stats) *Cache {
	if entries == 0 {
		entries = DefaultCacheEntries
	}
	if maxBytes == 0 {
		maxBytes = DefaultCacheBytes
	}
	if failures == 0 {
		failures = DefaultFailureEntries
	}
	if stats == nil {
		stats = new(Stats)
	}
	return &Cache{
		ok:       make(map[[sha256.Size]byte]cachedClaims),
		bad:      make(map[[sha256.Size]byte]cachedFailure),
		maxOK:    max(entries, 0),
		maxBytes: max(maxBytes, 0),
		maxBad:   max(failures, 0),
		stats:    stats,
	}
}

// Lookup returns the remembered result for token at now: hit is false when
// there is none (verify it, then Store). It costs one SHA-256 of the token
// and does not allocate. A token that is empty or longer than MaxTokenBytes
// is answered ErrMalformed at once, without hashing.
func (c *Cache) Lookup(token []byte, now time.Time) (claims *Claims, err error, hit bool) {
	return c.lookup(token, now, true)
}

// lookup is Lookup; countMiss is false for the pool's second look, whose
// miss the first look already counted.
func (c *Cache) lookup(token []byte, now time.Time, countMiss bool) (claims *Claims, err error, hit bool) {
	if len(token) == 0 || len(token) > MaxTokenBytes {
		c.stats.FailureHits.Add(1)
		return nil, ErrMalformed, true
	}
	key := sha256.Sum256(token)
	t := now.UnixNano()
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.ok[key]; ok {
		switch {
		case t >= e.until:
			c.dropOK(key, e) // expired (or too old): verification will say so
		case t < e.nbf:
			// The clock went back past nbf: let Verify decide again.
		default:
			c.stats.Hits.Add(1)
			return e.claims, nil, true
		}
	}
	if f, ok := c.bad[key]; ok {
		if t < f.until {
			c.stats.FailureHits.Add(1)
			return nil, f.err, true
		}
		delete(c.bad, key)
	}
	if countMiss {
		c.stats.Misses.Add(1)
	}
	return nil, nil, false
}

// Store remembers the result of verifying token at now: claims when err is
// nil, else err if time cannot undo it. Results that may change
// (ErrNotYetValid) are not stored.
func (c *Cache) Store(token []byte, claims *Claims, err error, now time.Time) {
	if len(token) == 0 || len(token) > MaxTokenBytes {
		return
	}
	t := now.UnixNano()
	if err != nil {
		if !permanent(err) || c.maxBad == 0 {
			return
		}
		key := sha256.Sum256(token)
		c.mu.Lock()
		defer c.mu.Unlock()
		c.maybeSweep(t)
		if _, ok := c.bad[key]; !ok && len(c.bad) >= c.maxBad {
			c.evictBad(t)
		}
		c.bad[key] = cachedFailure{err: err, until: t + int64(FailureTTL)}
		return
	}
	if claims == nil || c.maxOK == 0 {
		return
	}
	e := cachedClaims{claims: claims, until: t + int64(MaxCacheAge), charged: claimsBytes(claims)}
	if !claims.Expires.IsZero() {
		e.until = min(e.until, claims.Expires.UnixNano())
	}
	if !claims.NotBefore.IsZero() {
		e.nbf = claims.NotBefore.UnixNano()
	}
	if t >= e.until || e.charged > c.maxBytes {
		return
	}
	key := sha256.Sum256(token)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.maybeSweep(t)
	if old, ok := c.ok[key]; ok {
		c.dropOK(key, old)
	}
	for len(c.ok) > 0 && (len(c.ok) >= c.maxOK || c.okBytes+e.charged > c.maxBytes) {
		c.evictOK(t)
	}
	c.ok[key] = e
	c.okBytes += e.charged
}

// Len reports the number of verified and failed tokens remembered.
func (c *Cache) Len() (verified, failed int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ok), len(c.bad)
}

// maybeSweep counts a Store and, when as many were stored since the last sweep as that
// sweep left in the tables (sweepMinStores at least), drops every expired entry of both.
func (c *Cache) maybeSweep(t int64) {
	if c.stores++; c.stores < max(sweepMinStores, c.sweepAt) {
		return
	}
	c.stores = 0
	for k, e := range c.ok {
		if t >= e.until {
			c.dropOK(k, e)
		}
	}
	for k, f := range c.bad {
		if t >= f.until {
			delete(c.bad, k)
		}
	}
	c.sweepAt = len(c.ok) + len(c.bad)
}

func (c *Cache) dropOK(key [sha256.Size]byte, e cachedClaims) {
	delete(c.ok, key)
	c.okBytes -= e.charged
}

// evictOK removes one verified entry to make room.
func (c *Cache) evictOK(t int64) {
	victim := evictionVictim(c.ok, t)
	c.dropOK(victim, c.ok[victim])
	c.stats.Evictions.Add(1)
}

// evictBad removes one failure entry to make room.
func (c *Cache) evictBad(t int64) {
	delete(c.bad, evictionVictim(c.bad, t))
	c.stats.Evictions.Add(1)
}

// expiring is a cache entry: it knows when it stops being valid.
type expiring interface{ expiry() int64 }

func (e cachedClaims) expiry() int64  { return e.until }
func (f cachedFailure) expiry() int64 { return f.until }

// evictionVictim picks the entry of m to remove at time t: the first
// expired one among the few it looks at, else the first it looked at (map
// order is random, so that is an arbitrary entry). m must not be empty.
func evictionVictim[V expiring](m map[[sha256.Size]byte]V, t int64) [sha256.Size]byte {
	var victim [sha256.Size]byte
	n := 0
	for k, e := range m {
		if n == 0 {
			victim = k
		}
		if t >= e.expiry() {
			return k
		}
		if n++; n == cacheEvictionLookahead {
			break
		}
	}
	return victim
}

// permanent reports whether a verification failure stays a failure as time
// passes (for the same configuration).
func permanent(err error) bool {
	for _, p := range []error{ErrMalformed, ErrSignature, ErrAlgorithm, ErrIssuer, ErrAudience, ErrNoExp, ErrExpired, ErrClaims} {
		if errors.Is(err, p) {
			return true
		}
	}
	return false
}

// claimsBytes estimates the memory a Claims holds: the strings, their
// headers and the struct itself.
func claimsBytes(c *Claims) int64 {
	n := int64(160) // the Claims struct, the map entry and slice headers, roughly
	for _, l := range [][]string{c.Streams, c.Channels, c.Publish, c.Tags} {
		for _, s := range l {
			n += 16 + int64(len(s))
		}
	}
	return n + int64(len(c.Subject))
}
