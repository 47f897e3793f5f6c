package engine

import (
	"errors"
	"time"

	"github.com/pgsse/pgsse/auth"
)

// Token verification off the loop (SPEC §3b "Token verification never stalls the loop"):
// the verifier pool (auth.Pool) checks signatures on its own goroutines and caches the
// verdicts; the loop asks it through verifyToken and gets the answer back as a loop task.

// errVerifierBusy is the verdict when the pool's queue is full: the request is refused
// with 503 and Retry-After rather than waiting.
var errVerifierBusy = errors.New("token verification is overloaded; retry shortly")

// startVerifier starts the verifier pool when tokens are configured (Run; stopVerifier
// stops it).
func (s *Server) startVerifier() {
	if s.verifier != nil {
		s.tokens = auth.NewPool(s.verifier, auth.PoolConfig{})
	}
}

// stopVerifier stops the pool; verdicts still queued are dropped with the loop's tasks.
func (s *Server) stopVerifier() {
	if s.tokens != nil {
		s.tokens.Close()
	}
}

// verifyToken hands tok's verdict to done on the loop: at once when the pool's cache
// knows the token (one SHA-256, no allocation), otherwise from a verifier goroutine
// through a loop task — a signature check never runs on the loop. done runs exactly once
// unless the server stops first; its error is the verification error, or errVerifierBusy
// when the pool's queue is full. tok may be a view into the read buffer (the pool copies
// it). Callers check that a verifier is configured (s.tokens != nil) first.
func (s *Server) verifyToken(tok []byte, done func(*auth.Claims, error)) {
	now := time.Now()
	if claims, err, hit := s.tokens.Lookup(tok, now); hit {
		done(claims, err)
		return
	}
	if !s.tokens.Submit(tok, now, func(claims *auth.Claims, err error) {
		s.tasks.push(func() { done(claims, err) })
	}) {
		done(nil, errVerifierBusy)
	}
}
