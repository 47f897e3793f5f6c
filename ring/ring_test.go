package ring

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func contents(r *Ring) []byte {
	a, b := r.Peek()
	return append(append([]byte{}, a...), b...)
}

func TestNew(t *testing.T) {
	r := New(16)
	assert.Equal(t, 16, r.Cap())
	assert.Equal(t, 0, r.Len())
	assert.Equal(t, 16, r.Free())
	a, b := r.Peek()
	assert.Empty(t, a)
	assert.Empty(t, b)
	assert.False(t, r.AboveHigh())
	assert.False(t, r.BelowLow())
	assert.Panics(t, func() { New(-1) })
}

func TestPushAllOrNothing(t *testing.T) {
	r := New(10)
	require.True(t, r.Push([]byte("abcdef")))
	assert.False(t, r.Push([]byte("ghijk")), "5 > 4 free")
	assert.Equal(t, "abcdef", string(contents(r)), "nothing written on refusal")
	assert.True(t, r.Push([]byte("ghij")), "exactly fills")
	assert.Equal(t, 0, r.Free())
	assert.False(t, r.Push([]byte("x")))
	assert.True(t, r.Push(nil), "empty push always fits")
	assert.Equal(t, "abcdefghij", string(contents(r)))
}

func TestWrap(t *testing.T) {
	r := New(8)
	require.True(t, r.Push([]byte("012345")))
	r.Consume(5)                              // head at 5, "5" left
	require.True(t, r.Push([]byte("abcdef"))) // wraps after "ab"
	a, b := r.Peek()
	assert.Equal(t, "5ab", string(a))
	assert.Equal(t, "cdef", string(b))
	assert.Equal(t, 7, r.Len())
	r.Consume(3) // exactly to the end of the buffer: head wraps to 0
	a, b = r.Peek()
	assert.Equal(t, "cdef", string(a))
	assert.Empty(t, b)
	require.True(t, r.Push([]byte("ghij")))
	assert.Equal(t, "cdefghij", string(contents(r)))
	assert.Equal(t, 0, r.Free())
}

func TestConsumePartialAndPanics(t *testing.T) {
	r := New(8)
	require.True(t, r.Push([]byte("frame1")))
	r.Consume(2) // a socket took part of a frame
	assert.Equal(t, "ame1", string(contents(r)))
	r.Consume(0)
	assert.Equal(t, 4, r.Len())
	assert.Panics(t, func() { r.Consume(5) })
	assert.Panics(t, func() { r.Consume(-1) })
	assert.Equal(t, "ame1", string(contents(r)), "a panicking Consume changes nothing")
	r.Consume(4)
	assert.Equal(t, 0, r.Len())
	a, _ := r.Peek()
	assert.Empty(t, a)
}

func TestEmptyRestartsAtFront(t *testing.T) {
	r := New(8)
	require.True(t, r.Push([]byte("123456")))
	r.Consume(6)
	require.True(t, r.Push([]byte("abcdefgh"))) // would wrap if head stayed at 6
	a, b := r.Peek()
	assert.Equal(t, "abcdefgh", string(a))
	assert.Empty(t, b)
}

func TestReset(t *testing.T) {
	r := New(8)
	r.SetWatermarks(2, 4)
	require.True(t, r.Push([]byte("12345")))
	r.Consume(3)
	require.True(t, r.Push([]byte("678")))
	r.Reset()
	assert.Equal(t, 0, r.Len())
	assert.Equal(t, 8, r.Free())
	assert.True(t, r.BelowLow())
	require.True(t, r.Push([]byte("abcde")))
	assert.True(t, r.AboveHigh(), "watermarks kept")
	assert.Equal(t, "abcde", string(contents(r)))
}

func TestWatermarks(t *testing.T) {
	r := New(100)
	r.SetWatermarks(25, 50)
	assert.True(t, r.BelowLow(), "empty")
	require.True(t, r.Push(make([]byte, 24)))
	assert.True(t, r.BelowLow())
	require.True(t, r.Push(make([]byte, 1)))
	assert.False(t, r.BelowLow(), "exactly at low is not below")
	require.True(t, r.Push(make([]byte, 25)))
	assert.False(t, r.AboveHigh(), "exactly at high is not above")
	require.True(t, r.Push(make([]byte, 1)))
	assert.True(t, r.AboveHigh())
	r.Consume(27)
	assert.False(t, r.AboveHigh())
	assert.True(t, r.BelowLow())

	assert.Panics(t, func() { r.SetWatermarks(-1, 10) })
	assert.Panics(t, func() { r.SetWatermarks(20, 10) })
	assert.Panics(t, func() { r.SetWatermarks(10, 101) })
	assert.NotPanics(t, func() { r.SetWatermarks(0, 100) })
	assert.NotPanics(t, func() { r.SetWatermarks(100, 100) })
}

func TestZeroCapacity(t *testing.T) {
	r := New(0)
	assert.True(t, r.Push(nil))
	assert.False(t, r.Push([]byte("x")))
	a, b := r.Peek()
	assert.Empty(t, a)
	assert.Empty(t, b)
	r.Consume(0)
	assert.Equal(t, 0, r.Len())
}

// TestModel runs random operations against a plain []byte queue and checks
// Len, Free, Cap and the contents after every step.
func TestModel(t *testing.T) {
	for _, capacity := range []int{1, 2, 7, 64, 1000} {
		rng := rand.New(rand.NewPCG(uint64(capacity), 99))
		r := New(capacity)
		var model []byte
		low, high := 0, capacity
		next := byte(0)
		gen := func(k int) []byte {
			p := make([]byte, k)
			for i := range p {
				p[i] = next
				next++
			}
			return p
		}
		for step := 0; step < 20000; step++ {
			switch op := rng.IntN(10); {
			case op < 4:
				p := gen(rng.IntN(capacity + 2))
				ok := r.Push(p)
				assert.Equal(t, len(model)+len(p) <= capacity, ok)
				if ok {
					model = append(model, p...)
				}
			case op < 6:
				low = rng.IntN(capacity + 1)
				high = low + rng.IntN(capacity-low+1)
				r.SetWatermarks(low, high)
			case op < 9:
				k := rng.IntN(len(model) + 1)
				r.Consume(k)
				model = model[k:]
			default:
				if rng.IntN(20) == 0 {
					r.Reset()
					model = model[:0]
				}
			}
			require.Equal(t, len(model), r.Len(), "cap %d step %d", capacity, step)
			require.Equal(t, capacity-len(model), r.Free())
			require.Equal(t, capacity, r.Cap())
			require.Equal(t, len(model) > high, r.AboveHigh(), "cap %d step %d", capacity, step)
			require.Equal(t, len(model) < low, r.BelowLow(), "cap %d step %d", capacity, step)
			a, b := r.Peek()
			if len(a) == 0 {
				require.Empty(t, b, "second view only on wrap")
			}
			require.True(t, bytes.Equal(model, contents(r)), "cap %d step %d", capacity, step)
		}
	}
}

var (
	sinkA, sinkB []byte
	sinkBool     bool
)

func TestZeroAllocs(t *testing.T) {
	r := New(4096)
	frame := make([]byte, 100)
	r.SetWatermarks(1024, 2048)
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		r.Push(frame)
		r.Push(frame[:9])
		sinkBool = r.AboveHigh() || r.BelowLow()
		sinkA, sinkB = r.Peek()
		r.Consume(r.Len() - 3) // leave a partial so positions drift and wrap
	}))
}

func BenchmarkPushConsume(b *testing.B) {
	r := New(1 << 20)
	frame := make([]byte, 200)
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		r.Push(frame)
		sinkA, sinkB = r.Peek()
		r.Consume(len(frame) - 1)
		r.Consume(1)
	}
}
