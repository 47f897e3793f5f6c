package engine

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Logs that repeat: while PostgreSQL is unreachable or not migrated, every reconnect attempt,
// history read and schema check fails the same way. Every warning or error the engine and what
// it runs (the LISTEN session, the replay pool, retention) log goes through a repeatLimiter: a
// line whose message and err are the same as one logged less than logRepeatEvery ago is not
// written, only counted, and the next one that is written says how many were left out
// ("repeated"). Lines below warning pass untouched.

// logRepeatEvery: the same warning (message and cause) at most this often (docs/operations.md,
// Health, metrics and logs; an unreachable PostgreSQL is reported once per 30 s).
const logRepeatEvery = 30 * time.Second

// logRepeatKeys bounds the causes remembered; when full, the table starts over.
const logRepeatKeys = 1024

type repeatLimiter struct {
	inner slog.Handler
	state *repeatState
}

type repeatState struct {
	mu    sync.Mutex
	every time.Duration
	seen  map[string]*repeatSeen
}

type repeatSeen struct {
	last     time.Time
	repeated int
}

func newRepeatLimiter(inner slog.Handler, every time.Duration) *repeatLimiter {
	return &repeatLimiter{inner: inner, state: &repeatState{every: every, seen: make(map[string]*repeatSeen)}}
}

func (h *repeatLimiter) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h *repeatLimiter) WithAttrs(as []slog.Attr) slog.Handler {
	return &repeatLimiter{inner: h.inner.WithAttrs(as), state: h.state}
}

func (h *repeatLimiter) WithGroup(name string) slog.Handler {
	return &repeatLimiter{inner: h.inner.WithGroup(name), state: h.state}
}

func (h *repeatLimiter) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return h.inner.Handle(ctx, r)
	}
	key := r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" {
			key += "\x00" + a.Value.String()
			return false
		}
		return true
	})
	st := h.state
	st.mu.Lock()
	e := st.seen[key]
	switch {
	case e == nil:
		if len(st.seen) >= logRepeatKeys {
			clear(st.seen)
		}
		e = &repeatSeen{}
		st.seen[key] = e
	case r.Time.Sub(e.last) < st.every:
		e.repeated++
		st.mu.Unlock()
		return nil
	}
	repeated := e.repeated
	e.last, e.repeated = r.Time, 0
	st.mu.Unlock()
	if repeated > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int("repeated", repeated))
	}
	return h.inner.Handle(ctx, r)
}
