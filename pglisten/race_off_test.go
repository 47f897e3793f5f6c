//go:build !race

package pglisten

const raceEnabled = false
