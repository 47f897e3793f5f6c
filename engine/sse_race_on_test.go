//go:build race

package engine

// raceOn: the race detector multiplies memory (shadow memory, larger allocations), so
// RSS bounds are scaled by rssScale.
const raceOn, rssScale = true, 3
