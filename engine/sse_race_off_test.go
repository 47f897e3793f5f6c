//go:build !race

package engine

const raceOn, rssScale = false, 1
