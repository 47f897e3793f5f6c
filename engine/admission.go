package engine

import (
	"crypto/sha256"
	"time"

	"github.com/pgsse/pgsse/auth"
)

// Admission (docs/http.md, Responses and errors; Authorization: Per subject): what decides
// whether an authorised request becomes a subscriber, and when. Authorised connections wait in a
// FIFO that the task drain services between rounds of tasks (loop.go: taskQueue.drain), a round
// at a time: a round of admissions lasts at most admitRoundShare of the task round before it (so
// deliveries slow down by at most that much during a reconnect storm), at least admitMinRound (so
// a storm still moves when little else runs), and admits at least admitMinPerRound. The
// decisions: draining, full (--max-connections), the database unreachable, and
// --max-connections-per-subject.

// The size of an admission round. Each admission costs the loop roughly a response-head write
// and a history read request (≈ 10–30 µs).
const (
	admitMinRound    = 2 * time.Millisecond
	admitRoundShare  = 0.5 // of the preceding task round's duration
	admitMinPerRound = 16
)

// admitBudget is how long the admission round after a task round of taskTime may last.
func admitBudget(taskTime time.Duration) time.Duration {
	return max(admitMinRound, time.Duration(float64(taskTime)*admitRoundShare))
}

// connFIFO is the admission queue: authorised connections in arrival order.
type connFIFO struct {
	q    []*sseConn
	head int
}

func (f *connFIFO) push(sc *sseConn) { f.q = append(f.q, sc) }

func (f *connFIFO) len() int { return len(f.q) - f.head }

// pop returns the oldest connection, or nil when the queue is empty.
func (f *connFIFO) pop() *sseConn {
	if f.head == len(f.q) {
		return nil
	}
	sc := f.q[f.head]
	f.q[f.head] = nil
	f.head++
	switch {
	case f.head == len(f.q):
		f.q, f.head = f.q[:0], 0
	case f.head >= 1024 && f.head*2 >= len(f.q):
		n := copy(f.q, f.q[f.head:])
		clear(f.q[n:])
		f.q, f.head = f.q[:n], 0
	}
	return sc
}

// admitQueued admits queued connections for at most budget (and at least admitMinPerRound of
// them) and registers them on their streams or channels; it reports whether more are waiting.
// The task drain calls it between rounds of tasks (admitRound), inside its own enter/leave.
func (s *Server) admitQueued(budget time.Duration) bool {
	start := time.Now()
	for n := 0; n < admitMinPerRound || time.Since(start) < budget; {
		sc := s.admitQ.pop()
		if sc == nil {
			return false
		}
		if sc.closed || sc.state != stateQueued {
			continue // gone, or sent away (drain) while it waited
		}
		n++
		if why, full := s.overCapacity(); full {
			s.shed(sc, why)
			continue
		}
		req := sc.req
		s.admit(sc)
		if req.isChan {
			s.subscribeChannel(sc, req.name)
		} else {
			s.subscribeStream(sc, req.name, req.cursor, req.hasCursor)
		}
	}
	return s.admitQ.len() > 0
}

// overCapacity says whether a new subscriber must be sent away now, and why.
func (s *Server) overCapacity() (shedReason, bool) {
	switch {
	case s.draining:
		return shedDraining, true
	case s.atCapacity():
		return shedOverCapacity, true
	case s.databaseUnavailable():
		return shedDatabaseUnavailable, true
	}
	return 0, false
}

// databaseUnavailable: the LISTEN session has been down for dbUnavailableAfterMS (or has not
// come up that long after start).
func (s *Server) databaseUnavailable() bool {
	after := int64(dbUnavailableAfterMS)
	if s.cfg.dbUnavailableAfterMS > 0 {
		after = s.cfg.dbUnavailableAfterMS
	}
	return !s.listenUp && s.nowMS-s.listenDownSinceMS >= after
}

// subjectKey is whom a token's connections are counted against (--max-connections-per-subject):
// its sub claim, or without one the token itself (by hash, the way the verifier cache keys it).
func subjectKey(claims *auth.Claims, tokenKey *[sha256.Size]byte) string {
	if claims.Subject != "" {
		return "sub:" + claims.Subject
	}
	return "token:" + string(tokenKey[:])
}

// countSubject counts sc against its subject, or reports false when the subject already holds
// --max-connections-per-subject connections.
func (s *Server) countSubject(sc *sseConn, key string) bool {
	limit := s.cfg.MaxConnectionsPerSubject
	if limit < 0 {
		return true // no limit
	}
	n := s.subjects[key]
	if n >= int32(limit) {
		return false
	}
	s.subjects[key] = n + 1
	sc.subject = key
	return true
}

// uncountSubject gives back sc's place in its subject's count (removeConn).
func (s *Server) uncountSubject(sc *sseConn) {
	if sc.subject == "" {
		return
	}
	if n := s.subjects[sc.subject] - 1; n > 0 {
		s.subjects[sc.subject] = n
	} else {
		delete(s.subjects, sc.subject)
	}
	sc.subject = ""
}
