package main

import (
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A successor reads the predecessor's next batch while its loop takes the one before, but
// never holds more than handoffAdopting connections received and not yet on its loop: each
// holds two descriptors meanwhile, and without the bound a predecessor that hands over
// faster than the successor's loop takes them ran it out of descriptors (bench/RESULTS.md,
// issue 22 hopace: EMFILE at 15,000 connections against a limit of 20,000). Here the loop
// takes nothing until the test lets it, a batch at a time: the predecessor's batches wait.
func TestSuccessorBoundsConnectionsWaitingForItsLoop(t *testing.T) {
	const batch, batches = 64, 40 // 2,560 connections, 5 × the bound
	require.Equal(t, 512, handoffAdopting, "docs/operations.md says 512")
	win := adoptWindow{max: handoffAdopting, log: slog.New(slog.DiscardHandler)}

	var mu sync.Mutex
	onLoop := make([]chan error, 0, batches) // each batch's AdoptAsync result, in order
	peak := 0
	started := make(chan int, batches)
	done := make(chan struct{})
	go func() { // the successor's reader (takeOver's 'B' case)
		defer close(done)
		for i := range batches {
			win.add(batch, func() <-chan error {
				mu.Lock()
				defer mu.Unlock()
				res := make(chan error, 1)
				onLoop = append(onLoop, res)
				peak = max(peak, win.inFlight+batch)
				started <- i
				return res
			})
		}
		win.settle()
	}()

	want := handoffAdopting / batch // batches that fit on their way at once
	for i := range want {
		select {
		case got := <-started:
			require.Equal(t, i, got)
		case <-time.After(10 * time.Second):
			t.Fatalf("batch %d did not start: the window holds %d connections", i, handoffAdopting)
		}
	}
	for next := want; next < batches; next++ {
		// The window is full: the next batch is not read until the oldest is on the loop.
		select {
		case got := <-started:
			t.Fatalf("batch %d started with %d connections already waiting for the loop", got, handoffAdopting)
		case <-time.After(50 * time.Millisecond):
		}
		mu.Lock()
		onLoop[next-want] <- nil // the loop takes the oldest batch
		mu.Unlock()
		select {
		case got := <-started:
			require.Equal(t, next, got)
		case <-time.After(10 * time.Second):
			t.Fatalf("batch %d did not start once the oldest was on the loop", next)
		}
	}
	mu.Lock()
	for _, res := range onLoop[batches-want:] {
		res <- nil
	}
	mu.Unlock()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the reader did not settle")
	}
	assert.Equal(t, handoffAdopting, peak, "connections on their way to the loop at most")
	assert.Zero(t, win.inFlight)
}
