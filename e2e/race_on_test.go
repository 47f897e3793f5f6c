//go:build race

package e2e

// raceEnabled: `go test -race` (as `make test` runs) builds pgsse with -race too, so
// real clients drive a race-checked server.
const raceEnabled = true
