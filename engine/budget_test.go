package engine

import (
	"context"
	"io"
	"log/slog"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gogc is the garbage collector's percentage now (GOGC), read without changing it.
func gogc(t *testing.T) int {
	t.Helper()
	s := []rtmetrics.Sample{{Name: "/gc/gogc:percent"}}
	rtmetrics.Read(s)
	require.Equal(t, rtmetrics.KindUint64, s[0].Value.Kind())
	return int(s[0].Value.Uint64())
}

// A burst of accepts lowers GOGC to burstGCPercent until it is over, and keepMemory puts
// back what it found (issue 25: the garbage of the connections' setup then leaves fewer
// free slots beside the idle connections' objects). An operator's GOGC that is lower
// already is left alone. Not parallel: GOGC is the process's.
func TestAcceptBurstLowersGOGC(t *testing.T) {
	for _, operator := range []int{100, 300, 5} {
		prev := debug.SetGCPercent(operator)
		s, err := New(Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); s.out.keepMemory(ctx) }()
		b := acceptBurst{notify: s.out.heapToGiveBack, began: s.out.acceptBurstBegan}
		for range burstConns - 1 {
			b.accepted()
		}
		assert.Equal(t, operator, gogc(t), "GOGC %d: fewer than burstConns accepted is no burst", operator)
		b.accepted()
		want := min(operator, burstGCPercent)
		require.Eventually(t, func() bool { return gogc(t) == want }, 5*time.Second, time.Millisecond,
			"GOGC %d: during the burst", operator)
		b.opened() // the loop takes one more: the burst goes on for burstQuiet from now
		opened := time.Now()
		require.Eventually(t, func() bool { return b.n.Load() == 0 }, 10*time.Second, 10*time.Millisecond,
			"GOGC %d: the burst ends", operator)
		assert.GreaterOrEqual(t, time.Since(opened), burstQuiet, "not before burstQuiet without an accept or open")
		require.Eventually(t, func() bool { return gogc(t) == operator }, 5*time.Second, time.Millisecond,
			"GOGC %d: once the burst is over", operator)
		cancel()
		<-done
		b.timer.Stop()
		debug.SetGCPercent(prev)
	}
}
