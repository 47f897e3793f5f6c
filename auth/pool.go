package auth

import (
	"errors"
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
//
// With PoolConfig.Nice the verifiers run at a lower scheduling priority than the rest of the
// process, on Ps of their own (lowPriority), so that a burst of verifications takes only the
// CPU time nothing else in the process wants: the caller's event loop and the goroutines
// feeding it win the CPU whenever they are runnable. Lowered workers only delay tokens by so
// much: a job that has waited longer than PoolConfig.StarveAfter (the host busy with more
// than the loop: other processes, PostgreSQL) is verified at the process's priority by a
// goroutine that helps until the queue's wait is short again (rescue).
type Pool struct {
	v     *Verifier
	cache *Cache
	queue chan poolJob
	mu    sync.RWMutex // Submit holds it shared; Close exclusively, to close queue
	shut  bool
	wg    sync.WaitGroup
	stats *Stats
	bufs  sync.Pool // *[]byte token copies, reused

	nice      int         // PoolConfig.Nice
	procs     int         // Ps this pool added (addProcs), given back by Close
	onNiceErr func(error) // PoolConfig.OnPriorityError
	niceErr   sync.Once

	// With Nice: the starvation bound (PoolConfig.StarveAfter), the last time a worker took
	// a job (UnixNano), and the rescuer's wake-up and stop.
	starveAfter time.Duration
	lastTake    atomic.Int64
	wake        chan struct{}
	stop        chan struct{}
}

type poolJob struct {
	token  *[]byte
	now    time.Time // the verification's clock (Submit's now)
	queued int64     // when Submit queued it (UnixNano of the wall clock)
	done   func(*Claims, error)
}

// PoolConfig sizes a Pool; zero values select the defaults.
type PoolConfig struct {
	Workers        int   // verifier goroutines; default runtime.GOMAXPROCS(0)
	Queue          int   // jobs waiting for a worker; default DefaultPoolQueue
	CacheEntries   int   // verified tokens remembered (NewCache); < 0 disables
	CacheBytes     int64 // bytes of claims remembered; < 0 disables
	FailureEntries int   // failed tokens remembered; < 0 disables
	// Nice > 0 runs the verifiers that much nicer than the process (at most nice 19): each
	// worker goroutine is locked to an OS thread of its own, whose nice value it raises
	// (Linux only), and the pool adds as many Ps (GOMAXPROCS) as it has workers for its
	// lifetime (see lowPriority).
	Nice int
	// OnPriorityError, if set, is called once when a worker's priority could not be
	// lowered (that worker then runs at the process's priority).
	OnPriorityError func(error)
	// StarveAfter bounds what Nice may cost a token: one that has waited this long is
	// verified at the process's priority (default DefaultStarveAfter; Stats.Rescued counts
	// them).
	StarveAfter time.Duration
}

// DefaultStarveAfter is PoolConfig.StarveAfter's default: a reconnect storm of a few thousand
// ES256 tokens is verified within it on an idle core, so the rescue is for a host whose CPU
// something else (another process, PostgreSQL) keeps from the lowered threads — before
// callers give up on a token (the engine sheds a check that takes 10 s).
const DefaultStarveAfter = time.Second

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
	Rescued     atomic.Uint64 // jobs verified at the process's priority after StarveAfter (Nice)
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
		v:         v,
		cache:     NewCache(cfg.CacheEntries, cfg.CacheBytes, cfg.FailureEntries, stats),
		queue:     make(chan poolJob, queue),
		stats:     stats,
		nice:      max(cfg.Nice, 0),
		onNiceErr: cfg.OnPriorityError,
	}
	switch {
	case p.nice > 0 && !threadPrioritySupported:
		p.nice = 0
		p.priorityFailed(errNoThreadPriority)
	case p.nice > 0:
		p.procs = workers
		addProcs(workers)
		p.starveAfter = cfg.StarveAfter
		if p.starveAfter <= 0 {
			p.starveAfter = DefaultStarveAfter
		}
		p.lastTake.Store(time.Now().UnixNano())
		p.wake, p.stop = make(chan struct{}, 1), make(chan struct{})
		p.wg.Add(1)
		go p.rescue()
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
	queued := time.Now().UnixNano()
	// Jobs wait, and no worker has taken one for StarveAfter: the rescuer is woken once this
	// job is queued too — woken before, it could empty the queue and sleep again first,
	// leaving this one behind the stuck workers.
	starved := p.wake != nil && len(p.queue) > 0 && queued-p.lastTake.Load() > int64(p.starveAfter)
	select {
	case p.queue <- poolJob{token: buf, now: now, queued: queued, done: done}:
		if starved {
			p.wakeRescuer()
		}
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
		if p.stop != nil {
			close(p.stop)
		}
	}
	procs := p.procs
	p.procs = 0
	p.mu.Unlock()
	p.wg.Wait()
	addProcs(-procs)
}

// work is a worker: with Nice, on a thread of its own at the lowered priority.
func (p *Pool) work() {
	if p.nice == 0 {
		p.verify()
		return
	}
	runtime.LockOSThread() // never unlocked, but on the main thread: the thread ends with the worker
	if !onMainThread() {
		p.priorityFailed(lowerThreadPriority(p.nice))
		p.verify()
		return
	}
	// The process's main thread cannot end (the runtime parks it for good when a locked
	// goroutine returns on it), and ps shows its priority as the whole process's: leave it
	// as it is. The worker starts again while this goroutine holds the main thread, so the
	// new one is locked to another, and only then lets it go.
	locked := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		close(locked)
		p.priorityFailed(lowerThreadPriority(p.nice))
		p.verify()
	}()
	<-locked
	runtime.UnlockOSThread()
}

// errNoThreadPriority: PoolConfig.Nice where threads have no priority of their own.
var errNoThreadPriority = errors.New("verifier threads at a lower priority are supported on Linux only")

// onMainThread is isMainThread; tests make another thread play the main one.
var onMainThread = isMainThread

// verify runs jobs until the pool closes.
func (p *Pool) verify() {
	defer p.wg.Done()
	for j := range p.queue {
		if p.wake != nil {
			now := time.Now().UnixNano()
			p.lastTake.Store(now)
			if now-j.queued > int64(p.starveAfter) {
				p.wakeRescuer() // this one waited too long: so do the ones behind it
			}
		}
		p.run(j)
	}
}

func (p *Pool) wakeRescuer() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// rescue is the goroutine of a pool with lowered workers that verifies at the process's
// priority once jobs have waited longer than StarveAfter: woken, it takes jobs until the
// queue is empty or the one it took had waited less than half of StarveAfter (the workers
// keep up again), then waits to be woken again. It ends with the pool (the workers finish
// what is queued then).
func (p *Pool) rescue() {
	defer p.wg.Done()
	for {
		select {
		case <-p.stop:
			return
		case <-p.wake:
		}
	help:
		for {
			select {
			case <-p.stop:
				return
			case j, ok := <-p.queue:
				if !ok {
					return
				}
				now := time.Now().UnixNano()
				p.lastTake.Store(now)
				p.stats.Rescued.Add(1)
				p.run(j)
				if now-j.queued < int64(p.starveAfter)/2 {
					break help
				}
			default:
				break help
			}
		}
	}
}

// run verifies one job (unless the cache has it by now) and calls its done.
func (p *Pool) run(j poolJob) {
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

func (p *Pool) priorityFailed(err error) {
	if err != nil && p.onNiceErr != nil {
		p.niceErr.Do(func() { p.onNiceErr(err) })
	}
}

// lowPriority counts the Ps that pools with lowered-priority workers added to GOMAXPROCS.
//
// Why a worker brings its own P: a goroutine runs only on a P (at most GOMAXPROCS at once),
// and a worker holds one for as long as it verifies — also while the kernel, doing what the
// lower priority asks, keeps its thread off the CPU in favour of the event loop. Without a P
// of its own, a worker at a lower priority would hold one of the Ps the loop, the LISTEN
// session's reader and the replay reads need, and they would queue for the other ones behind
// each other: the kernel would give the loop the CPU, and the Go scheduler would have no P
// to run it on. Measured in the reconnect storm (bench/RESULTS.md, issue 24): the LISTEN
// reader waited up to 50 ms for a P that way.
var lowPriority struct {
	sync.Mutex
	added int
}

// addProcs raises GOMAXPROCS by n (lowers it, for n < 0). A process whose GOMAXPROCS was
// the runtime's default no longer follows changes of its CPU limit once a pool has set it
// (runtime.GOMAXPROCS): the value it keeps is the one it had plus the workers.
func addProcs(n int) {
	if n == 0 {
		return
	}
	lowPriority.Lock()
	defer lowPriority.Unlock()
	lowPriority.added += n
	runtime.GOMAXPROCS(max(1, runtime.GOMAXPROCS(0)+n))
}

// Procs is GOMAXPROCS without the Ps that pools with lowered-priority workers added: the Ps
// for everything else, which is what a caller sizes its pools by.
func Procs() int {
	lowPriority.Lock()
	defer lowPriority.Unlock()
	return max(1, runtime.GOMAXPROCS(0)-lowPriority.added)
}
