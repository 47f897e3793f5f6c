//go:build linux

package chaos

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgsse/pgsse/framing"
	"github.com/pgsse/pgsse/pglisten"
)

// hubWorker is a worker process's view of the hub (SPEC §5) through pglisten: a hub client
// (lossless or wake mode) that, when its hub connection ends — the first process was killed,
// it was evicted — is replaced by a new one once the hub answers again, or a failover
// Listener (hub first, then a PostgreSQL session of its own for good). Each Listener's life
// is one WorkerInstance of its log.
type hubWorker struct {
	w        *workload
	rng      *rand.Rand
	log      *WorkerLog
	mu       sync.Mutex
	slow     atomic.Bool  // reads one event every few milliseconds, through a small queue
	lastItem atomic.Int64 // UnixNano of the last item it read (the drain waits for quiet)
	stall    atomic.Int64 // UnixNano: read nothing until then (fault: stalled reader)
	closeAll atomic.Bool  // the run is closing the workers (drain): an end now is not a failure
}

func (h *hubWorker) listener() (pglisten.Listener, error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	mode := framing.ModeLossless
	if h.log.Mode == "wake" {
		mode = framing.ModeWake
	}
	hc := pglisten.HubConfig{Socket: h.w.hubSocket, Name: h.log.Name, Mode: mode, Logger: quiet, AckTimeout: 10 * time.Second}
	if h.slow.Load() {
		hc.EventBuffer = 16
	}
	if h.log.Failover {
		return pglisten.NewFailover(pglisten.FailoverConfig{Hub: hc, Logger: quiet,
			Direct: pglisten.Config{DSN: h.w.db.URL, AppName: "chaos-worker", Logger: quiet}})
	}
	return pglisten.NewHub(hc)
}

func (h *hubWorker) run(ctx context.Context) {
	for ctx.Err() == nil {
		l, err := h.listener()
		if err != nil {
			if sleepCtx(ctx, time.Duration(100+h.rng.IntN(400))*time.Millisecond) != nil {
				return
			}
			continue
		}
		inst := &WorkerInstance{AckAt: map[string]time.Duration{}}
		h.mu.Lock()
		h.log.Instances = append(h.log.Instances, inst)
		h.mu.Unlock()
		h.instance(ctx, l, inst)
		_ = l.Close()
		if sleepCtx(ctx, time.Duration(100+h.rng.IntN(900))*time.Millisecond) != nil {
			return
		}
	}
}

// instance runs one Listener until it fails or ctx ends.
func (h *hubWorker) instance(ctx context.Context, l pglisten.Listener, inst *WorkerInstance) {
	events := l.Events()
	listened := make(chan error, 1)
	go func() {
		for _, ch := range h.log.Channels {
			lctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			err := l.Listen(lctx, ch)
			cancel()
			if err != nil {
				listened <- err
				return
			}
			at := h.w.now()
			h.mu.Lock()
			inst.AckAt[ch] = at
			h.mu.Unlock()
		}
		listened <- nil
	}()
	// end records the instance's end. Every end but the run's own at the drain is one the
	// application knows of (an error, a closed Listener), so it covers what was in flight.
	end := func(reason string) {
		h.mu.Lock()
		inst.EndAt = h.w.now()
		if !h.closeAll.Load() {
			inst.Failed = reason
			inst.Items = append(inst.Items, WorkerItem{Marker: "end", At: inst.EndAt})
		}
		h.mu.Unlock()
	}
	// A failover Listener that switched to a session of its own keeps it for good; the worker
	// is restarted a while later (as a worker process would be), so it goes back to the hub.
	var restartAt time.Time
	for {
		if f, ok := l.(*pglisten.Failover); ok && restartAt.IsZero() && f.Source() == pglisten.SourceDirect {
			restartAt = time.Now().Add(time.Duration(5000+h.rng.IntN(20000)) * time.Millisecond)
		}
		if !restartAt.IsZero() && time.Now().After(restartAt) {
			end("restarted after its failover to a session of its own")
			return
		}
		if until := h.stall.Load(); until > time.Now().UnixNano() {
			if sleepCtx(ctx, min(time.Duration(until-time.Now().UnixNano()), 200*time.Millisecond)) != nil {
				end("the run ended")
				return
			}
			continue
		}
		select {
		case <-ctx.Done():
			end("the run ended")
			return
		case <-time.After(time.Second):
		case err := <-listened:
			if err != nil {
				end("Listen: " + err.Error())
				return
			}
		case ev, ok := <-events:
			if !ok {
				end("the Listener's events ended")
				return
			}
			it := WorkerItem{At: h.w.now()}
			switch ev.Kind {
			case pglisten.KindNotification:
				p, ok := ParseData(string(ev.Payload))
				it.Channel, it.Key = ev.Channel, p.Key
				if !ok || p.Kind != kindNotify {
					it.Bad = "payload " + clip(string(ev.Payload))
				} else if p.Target != ev.Channel {
					it.Bad = "a notification of " + p.Target + " delivered on " + ev.Channel
				}
			case pglisten.KindDown:
				it.Marker = "down"
			case pglisten.KindResync:
				it.Marker, it.Channel = "resync", ev.Channel
			}
			h.mu.Lock()
			inst.Items = append(inst.Items, it)
			h.mu.Unlock()
			h.lastItem.Store(time.Now().UnixNano())
			if h.slow.Load() {
				_ = sleepCtx(ctx, 5*time.Millisecond)
			}
		}
	}
}
