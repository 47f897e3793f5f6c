//go:build race

package servetest

// RaceEnabled: this binary runs with the race detector (`go test -race`, as `make test`
// runs), so a server built with Binary(t, RaceEnabled) is race-checked too.
const RaceEnabled = true
