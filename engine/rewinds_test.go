package engine

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// A rewind notice (rewinds.go) is parsed strictly: what does not parse is not a notice, and
// no pgsse payload is one.
func TestRewindNotice(t *testing.T) {
	b := appendRewindNotice(nil, "orders/42", 5, 10)
	assert.Equal(t, "R1 5 10 orders/42", string(b))
	name, to, from, ok := parseRewindNotice(b)
	assert.True(t, ok)
	assert.Equal(t, "orders/42", string(name))
	assert.Equal(t, [2]int64{5, 10}, [2]int64{to, from})
	for _, bad := range []string{"", "R1 ", "R1 5 10 ", "R1 5 10 a b", "R1 10 10 s", "R1 11 10 s", "R1 -1 10 s", "R1 5 x s",
		"R2 5 10 s", "R1 5  10 s", "D1 1 s 1  0\n", "R1 5 10"} {
		_, _, _, ok := parseRewindNotice([]byte(bad))
		assert.False(t, ok, "%q", bad)
	}
}

// Two views of one crash merge into the range that covers both (a gap back further than
// needed repeats events; one not far enough would skip some); a later, separate rewind
// replaces the earlier.
func TestRewindMarkMerged(t *testing.T) {
	var m rewindMark
	m = m.merged(5, 10)
	assert.Equal(t, rewindMark{to: 5, from: 10}, m)
	m = m.merged(6, 12)
	assert.Equal(t, rewindMark{to: 5, from: 12}, m)
	m = m.merged(3, 5)
	assert.Equal(t, rewindMark{to: 3, from: 12}, m)
	m = m.merged(40, 50)
	assert.Equal(t, rewindMark{to: 40, from: 50}, m)
}
