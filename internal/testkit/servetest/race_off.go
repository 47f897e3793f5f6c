//go:build !race

package servetest

// RaceEnabled: this binary runs with the race detector.
const RaceEnabled = false
