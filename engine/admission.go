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

// admission is the loop's part that decides who becomes a subscriber, and when: the FIFO of
// authorised connections, the capacity checks, and the count of connections per subject.
type admission struct {
	*loopEnv
	conns *connTable
	subs  *subscriptions
	pub   *publishing
	lsn   *listenState
	pres  *presenceTable

	q        connFIFO         // authorised connections waiting to be admitted
	subjects map[string]int32 // connections per subject (--max-connections-per-subject)
}

// push queues an authorised connection (connTable.queueAdmission).
func (a *admission) push(sc *sseConn) { a.q.push(sc) }

// waiting is the number of connections in the FIFO.
func (a *admission) waiting() int { return a.q.len() }

// round admits queued connections for at most budget (and at least admitMinPerRound of
// them) and subscribes them; it reports whether more are waiting. The task drain calls it
// between rounds of tasks (Server.admitRound), inside its own enter/leave.
func (a *admission) round(budget time.Duration) bool {
	start := time.Now()
	for n := 0; n < admitMinPerRound || time.Since(start) < budget; {
		sc := a.q.pop()
		if sc == nil {
			return false
		}
		if sc.closed || sc.state != stateQueued {
			continue // gone, or sent away (drain) while it waited
		}
		n++
		if why, full := a.overCapacity(); full {
			a.conns.shed(sc, why)
			continue
		}
		a.conns.admit(sc)
		a.pres.opened(sc, sc.request()) // counted before its response head: its first presence event counts it
		a.subs.subscribe(sc, sc.request())
	}
	return a.q.len() > 0
}

// overCapacity says whether a new subscriber must be sent away now, and why.
func (a *admission) overCapacity() (shedReason, bool) {
	switch {
	case a.draining:
		return shedDraining, true
	case a.atCapacity():
		return shedOverCapacity, true
	case a.lsn.databaseUnavailable():
		return shedDatabaseUnavailable, true
	}
	return 0, false
}

// atCapacity reports whether the SSE port holds --max-connections subscribers and
// publishers.
func (a *admission) atCapacity() bool {
	return a.conns.subscribers()+a.pub.count() >= a.cfg.MaxConnections
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
func (a *admission) countSubject(sc *sseConn, key string) bool {
	limit := a.cfg.MaxConnectionsPerSubject
	if limit < 0 {
		return true // no limit
	}
	n := a.subjects[key]
	if n >= int32(limit) {
		return false
	}
	a.subjects[key] = n + 1
	sc.setSubject(key)
	return true
}

// subjectOf is the key sc is counted under ("" = none).
func (a *admission) subjectOf(sc *sseConn) string { return sc.subject() }

// adoptSubject counts a connection handed over by a predecessor under key, as it was
// counted there (the limit was checked when it was admitted).
func (a *admission) adoptSubject(sc *sseConn, key string) {
	if key == "" || a.cfg.MaxConnectionsPerSubject < 0 {
		return
	}
	a.subjects[key]++
	sc.setSubject(key)
}

// uncountSubject gives back sc's place in its subject's count (connTable.remove).
func (a *admission) uncountSubject(sc *sseConn) {
	key := sc.subject()
	if key == "" {
		return
	}
	if n := a.subjects[key] - 1; n > 0 {
		a.subjects[key] = n
	} else {
		delete(a.subjects, key)
	}
	sc.setSubject("")
}
