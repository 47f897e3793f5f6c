package engine

import (
	"time"

	"github.com/pgsse/pgsse/auth"
)

// Token checks off the loop (docs/http.md, Authorization: signatures are checked off the event
// loop). A request head is parsed on the loop; its token is answered from the verifier pool's
// cache when it can be (one SHA-256, no goroutine hop), and otherwise verified on the pool's
// goroutines, the answer coming back as a loop task. Every endpoint that takes a token goes
// through tokens.check, so no signature check ever runs on the loop.

// tokenVerdict is what tokens.check could say at once.
type tokenVerdict uint8

const (
	tokenChecked tokenVerdict = iota // the result is known now (the cache had it)
	tokenPending                     // the pool verifies it; resume runs later as a loop task
	tokenBusy                        // the pool's queue is full: shed the request (over capacity)
)

// verifyQueuePerCPU sizes the verifier pool's queue: with ES256 at ≈ 0.2 ms a token, 8,192
// waiting tokens are ≈ 1.6 s of work per core — a reconnect storm of that many clients per
// core is verified in turn; beyond it a client is better told to come back (over capacity).
const verifyQueuePerCPU = 8192

// verifyWorkers is how many goroutines check signatures: one per CPU but one (auth.Procs: the
// Ps the process had before the pool added its own), so that a burst of verifications never
// takes every core even where the kernel cannot be told to prefer the loop.
func verifyWorkers() int { return max(1, auth.Procs()-1) }

// verifyNice is how much nicer than the rest of the process the verifier threads run
// (auth.PoolConfig.Nice, on Ps of their own): during a reconnect storm the kernel gives the
// loop, the LISTEN session's reader and the replay reads the CPU whenever they want it, and
// verification the rest — SPEC §3b's promise that a storm delays only the clients in it, on a
// host whose cores the load shares. Measured in the storm of issue 24 (bench/RESULTS.md).
const verifyNice = 19

// tokens is the loop's part for token checks: the verifier (nil without a token key) and
// its pool, from Run.
type tokens struct {
	*loopEnv
	verifier *auth.Verifier
	pool     *auth.Pool
}

// start starts the verifier pool (from Run; none without a token key).
func (t *tokens) start() {
	if t.verifier == nil {
		return
	}
	t.pool = auth.NewPool(t.verifier, auth.PoolConfig{Workers: verifyWorkers(), Queue: verifyQueuePerCPU * auth.Procs(),
		Nice: verifyNice, OnPriorityError: func(err error) {
			t.log.Warn("token verifier threads run at the process's priority (a reconnect storm will slow deliveries more)", "err", err)
		}})
	t.metrics.verifyStats.Store(t.pool.Stats())
}

// stop stops the pool once the loop no longer needs it; jobs still queued finish and their
// answers are dropped with the task queue.
func (t *tokens) stop() {
	if t.pool != nil {
		t.pool.Close()
	}
}

// configured reports whether tokens can be verified at all (a key is configured).
func (t *tokens) configured() bool { return t.verifier != nil }

// running reports whether the verifier pool runs (configured, and the server started).
func (t *tokens) running() bool { return t.pool != nil }

// check checks tok for a request on the loop. With tokenChecked, claims and err are the
// result. With tokenPending, resume(claims, err) runs later on the loop, inside a task (so
// what it writes is flushed like any task's writes) — by then the connection may have closed
// or been sent away, so resume must first check that it still waits for this answer. With
// tokenBusy nothing runs later. tok may be a view into gnet's buffer: the pool copies it.
func (t *tokens) check(tok []byte, resume func(*auth.Claims, error)) (*auth.Claims, error, tokenVerdict) {
	now := time.Now()
	if claims, err, hit := t.pool.Lookup(tok, now); hit {
		return claims, err, tokenChecked
	}
	queued := t.pool.Submit(tok, now, func(claims *auth.Claims, err error) {
		t.tasks.push(func() { resume(claims, err) })
	})
	if !queued {
		return nil, nil, tokenBusy
	}
	return nil, nil, tokenPending
}
