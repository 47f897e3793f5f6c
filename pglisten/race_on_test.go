//go:build race

package pglisten

// raceEnabled: the race detector makes sync.Pool drop items on purpose, so pooled-buffer
// allocation counts are only exact without it.
const raceEnabled = true
