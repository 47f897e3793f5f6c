package names

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseCompositeCursor(t *testing.T) {
	const absent = -1
	for _, tc := range []struct {
		in   string
		k    int
		want []int64 // absent: an empty entry
		err  error   // a sentinel, or the type of the error (compared with errors.As)
	}{
		{in: "0:17,4", k: 2, want: []int64{17, 4}},
		{in: "17,4", k: 2, want: []int64{17, 4}},
		{in: "1:0,0,0", k: 3, want: []int64{0, 0, 0}},
		{in: ",0,17", k: 3, want: []int64{absent, 0, 17}},
		{in: "2:,0,", k: 3, want: []int64{absent, 0, absent}},
		{in: ",", k: 2, want: []int64{absent, absent}},
		{in: "5", k: 1, want: []int64{5}},
		{in: "0:5", k: 1, want: []int64{5}},
		{in: "0:", k: 1, want: []int64{absent}},
		{in: "", k: 1, want: []int64{absent}},
		{in: "007,9223372036854775807", k: 2, want: []int64{7, 9223372036854775807}},
		{in: "63:1,2", k: 2, want: []int64{1, 2}}, // the prefix is ignored, whatever it says
		// A plain number or a wrong count.
		{in: "5", k: 2, err: &CompositeCountError{}},
		{in: "0:1,2,3", k: 2, err: &CompositeCountError{}},
		{in: "", k: 2, err: &CompositeCountError{}},
		{in: "1,2", k: 1, err: &CompositeCountError{}},
		// The prefix.
		{in: ":1,2", k: 2, err: ErrCompositePrefix},
		{in: "a:1,2", k: 2, err: ErrCompositePrefix},
		{in: " 0:1,2", k: 2, err: ErrCompositePrefix},
		{in: "-1:1,2", k: 2, err: ErrCompositePrefix},
		{in: "99999999999999999999:1,2", k: 2, err: ErrCompositePrefix},
		// Entries follow ParseCursor: nothing trimmed.
		{in: "1, 2", k: 2, err: ErrCursorSyntax},
		{in: "1,+2", k: 2, err: ErrCursorSyntax},
		{in: "0:1:2,3", k: 2, err: ErrCursorSyntax},
		{in: "1,9223372036854775808", k: 2, err: ErrCursorRange},
		{in: "x,1", k: 2, err: &CompositeEntryError{}},
	} {
		t.Run(tc.in, func(t *testing.T) {
			cursors, present := make([]int64, tc.k), make([]bool, tc.k)
			err := ParseCompositeCursor(tc.in, cursors, present)
			switch tc.err.(type) {
			case nil:
				require.NoError(t, err)
				for i, w := range tc.want {
					if w == absent {
						assert.False(t, present[i], "entry %d is empty: absent", i)
						assert.Zero(t, cursors[i])
					} else {
						assert.True(t, present[i], "entry %d", i)
						assert.Equal(t, w, cursors[i], "entry %d", i)
					}
				}
			case *CompositeCountError:
				var ce *CompositeCountError
				require.ErrorAs(t, err, &ce)
				assert.Equal(t, tc.k, ce.Streams)
				assert.Equal(t, strings.Count(tc.in[strings.Index(tc.in, ":")+1:], ",")+1, ce.Entries)
			case *CompositeEntryError:
				var ee *CompositeEntryError
				require.ErrorAs(t, err, &ee)
				assert.Equal(t, 0, ee.Index)
			default:
				require.ErrorIs(t, err, tc.err)
			}
			// Also as bytes.
			err2 := ParseCompositeCursor([]byte(tc.in), cursors, present)
			assert.Equal(t, err == nil, err2 == nil)
		})
	}
}

// The errors name what was wrong, both counts, and the entry.
func TestCompositeCursorErrorTexts(t *testing.T) {
	c, p := make([]int64, 2), make([]bool, 2)
	assert.EqualError(t, ParseCompositeCursor("5", c, p),
		"cursor has 1 entry but the request names 2 streams: it needs one entry per stream parameter, comma-separated (an empty one = live)")
	assert.EqualError(t, ParseCompositeCursor("1,2,3", c, p),
		"cursor has 3 entries but the request names 2 streams: it needs one entry per stream parameter, comma-separated (an empty one = live)")
	err := ParseCompositeCursor("1,x", c, p)
	assert.EqualError(t, err, "entry 1: cursor must be decimal digits")
	var ee *CompositeEntryError
	require.True(t, errors.As(err, &ee))
	assert.Equal(t, 1, ee.Index)
}

func TestParseCompositeCursorAllocatesNothing(t *testing.T) {
	in := []byte("3:17,,0,9223372036854775807,4,5,6,7")
	c, p := make([]int64, 8), make([]bool, 8)
	allocs := testing.AllocsPerRun(200, func() {
		if ParseCompositeCursor(in, c, p) != nil {
			panic("refused")
		}
	})
	assert.Zero(t, allocs)
}
