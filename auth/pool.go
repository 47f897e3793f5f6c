package auth

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Pool verifies tokens off the event loop (docs/http.md, Authorization:
// signatures are checked off the event loop): a fixed set of verifier goroutines takes jobs
// from a bounded queue, and a Cache answers tokens already seen.
//
// The loop calls Lookup first (one hash; a hit needs no goroutine hop) and
// on a miss Submit, which never blocks: when the queue is full it returns
// false and the caller sheds the request. The job's done function runs on
// the verifying goroutine — the caller hands the result back to its loop.
// Every accepted job's done runs exactly once, also when the pool closes.
type Pool struct {
	v     *Verifier
	cache *Cache
	queue chan poolJob
	mu    sync.RWMutex // Submit holds it shared; Close exclusively, to close queue
	shut  bool
	wg    sync.WaitGroup
	stats *Stats
	bufs  sync.Pool // *[]byte token copies, reused
}

type poolJob struct {
	token *[]byte
	now   time.Time
	done  func(*Claims, error)
}

// PoolConfig sizes a Pool; zero values select the defaults.
type PoolConfig struct {
	Workers        int   // verifier goroutines; default runtime.GOMAXPROCS(0)
	Queue          int   // jobs waiting for a worker; default DefaultPoolQueue
	CacheEntries   int   // verified tokens remembered (NewCache); < 0 disables
	CacheBytes     int64 // bytes of claims remembered; < 0 disables
	FailureEntries int   // failed tokens remembered; < 0 disables
}

// DefaultPoolQueue is the default number of tokens waiting for a verifier:
// with ES256 at ≈ 0.2 ms each on one core, a full queue is ≈ 0.4 s of work
// on a 2-core host before new requests are shed.
const DefaultPoolQueue = 4096

// Stats are the pool's and cache's counters, read with atomic loads (the
// engine exports them as metrics; auth does not import prometheus).
type Stats struct {
	Hits        atomic.Uint64 // verified tokens answered from the cache
	FailureHits atomic.Uint64 // failures answered from the cache (or malformed at once)
	Misses      atomic.Uint64 // lookups that needed a verification
	Verified    atomic.Uint64 // verifications that succeeded
	Failed      atomic.Uint64 // verifications that failed
	QueueFull   atomic.Uint64 // Submit refused: the queue was full (or the pool closed)
	Evictions   atomic.Uint64 // cache entries removed to make room
}

// NewPool starts cfg.Workers verifier goroutines for v. Close stops them.
func NewPool(v *Verifier, cfg PoolConfig) *Pool {
	workers := cfg.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	queue := cfg.Queue
	if queue <= 0 {
		queue = DefaultPoolQueue
	}
	stats := new(Stats)
	p := &Pool{
		v:     v,
		cache: NewCache(cfg.CacheEntries, cfg.CacheBytes, cfg.FailureEntries, stats),
		queue: make(chan poolJob, queue),
		stats: stats,
	}
	p.wg.Add(workers)
	for range workers {
		go p.work()
	}
	return p
}

// Lookup answers token from the cache, on the caller's goroutine: hit is
// false when it must be verified (Submit). It does not allocate. token may
// be a view into the caller's buffer; nothing of it is kept.
func (p *Pool) Lookup(token []byte, now time.Time) (claims *Claims, err error, hit bool) {
	return p.cache.Lookup(token, now)
}

// Submit queues token for verification at now, without blocking. token may
// be a view into the caller's read buffer: it is copied. done runs on a
// verifier goroutine with the result (which is also cached). Submit returns
// false, and done never runs, when the queue is full or the pool is closed.
func (p *Pool) Submit(token []byte, now time.Time, done func(*Claims, error)) bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.shut {
		p.stats.QueueFull.Add(1)
		return false
	}
	buf, _ := p.bufs.Get().(*[]byte)
	if buf == nil {
		buf = new([]byte)
	}
	*buf = append((*buf)[:0], token...)
	select {
	case p.queue <- poolJob{token: buf, now: now, done: done}:
		return true
	default:
		p.bufs.Put(buf)
		p.stats.QueueFull.Add(1)
		return false
	}
}

// Queued reports how many jobs wait for a verifier.
func (p *Pool) Queued() int { return len(p.queue) }

// Stats returns the live counters (read them with Load).
func (p *Pool) Stats() *Stats { return p.stats }

// Cache returns the pool's cache.
func (p *Pool) Cache() *Cache { return p.cache }

// Close stops accepting jobs, lets the workers finish every queued one
// (their done functions run) and returns when they have exited.
func (p *Pool) Close() {
	p.mu.Lock()
	if !p.shut {
		p.shut = true
		close(p.queue)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Pool) work() {
	defer p.wg.Done()
	for j := range p.queue {
		tok := *j.token
		// The same token may have been verified while this job waited (two
		// tabs of one browser, a burst of retries): ask the cache again.
		claims, err, hit := p.cache.lookup(tok, j.now, false)
		if !hit {
			claims, err = p.v.Verify(tok, j.now)
			if err != nil {
				p.stats.Failed.Add(1)
			} else {
				p.stats.Verified.Add(1)
			}
			p.cache.Store(tok, claims, err, j.now)
		}
		if cap(tok) <= 2*MaxTokenBytes {
			p.bufs.Put(j.token)
		}
		j.done(claims, err)
	}
}
