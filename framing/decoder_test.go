package framing

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mixedStream is many frames of every type, of very different sizes, back to back.
func mixedStream() []byte {
	var s []byte
	for i := 0; i < 3; i++ {
		for _, tc := range roundTripCases() {
			if len(tc.enc) > 2048 && i > 0 {
				continue // one max-size frame is enough
			}
			s = append(s, tc.enc...)
		}
	}
	return s
}

// wholeDecode decodes s with Decode alone and returns the frames (copied).
func wholeDecode(t *testing.T, s []byte) []Frame {
	t.Helper()
	var out []Frame
	for len(s) > 0 {
		f, n, err := Decode(s)
		require.NoError(t, err)
		out = append(out, clone(f))
		s = s[n:]
	}
	return out
}

// drain calls Next until ErrIncomplete, cloning each frame, then scribbles
// over piece to prove the decoder kept what it needs.
func drain(t *testing.T, d *Decoder, piece []byte, out []Frame) []Frame {
	t.Helper()
	for {
		f, err := d.Next()
		if err == ErrIncomplete {
			break
		}
		require.NoError(t, err)
		out = append(out, clone(f))
	}
	for i := range piece {
		piece[i] = 0xEE
	}
	return out
}

func feedPieces(t *testing.T, s []byte, cuts []int) []Frame {
	t.Helper()
	var d Decoder
	var out []Frame
	prev := 0
	for _, c := range append(cuts, len(s)) {
		piece := bytes.Clone(s[prev:c]) // the caller's read buffer
		d.Feed(piece)
		out = drain(t, &d, piece, out)
		prev = c
	}
	assert.Zero(t, d.Buffered(), "nothing left over")
	assert.LessOrEqual(t, cap(d.buf), 2*(HeaderLen+MaxBody), "buffer bounded by one frame")
	return out
}

func TestDecoderEverySplit(t *testing.T) {
	s := mixedStream()
	want := wholeDecode(t, s)
	require.Greater(t, len(want), 50)

	// One split at every possible byte boundary. The stream holds a ~64 KiB
	// frame, so test every boundary of a smaller stream plus every boundary
	// around the big frame's edges.
	small := bytes.Clone(s)
	small = small[:0]
	for _, tc := range roundTripCases() {
		if len(tc.enc) < 2048 {
			small = append(small, tc.enc...)
		}
	}
	wantSmall := wholeDecode(t, small)
	for i := 0; i <= len(small); i++ {
		got := feedPieces(t, small, []int{i})
		if !assert.Equal(t, len(wantSmall), len(got), "split at %d", i) {
			continue
		}
		for k := range wantSmall {
			frameEqual(t, wantSmall[k], got[k], "split at %d frame %d", i, k)
		}
	}
	// Splits around each frame boundary of the full stream (incl. the max-size frame).
	off := 0
	for _, f := range want {
		enc := f.Append(nil)
		for _, c := range []int{off - 1, off, off + 1, off + 3, off + 4, off + 5, off + len(enc) - 1} {
			if c < 0 || c > len(s) {
				continue
			}
			got := feedPieces(t, s, []int{c})
			require.Equal(t, len(want), len(got), "split at %d", c)
		}
		off += len(enc)
	}
}

func TestDecoderByteByByte(t *testing.T) {
	s := mixedStream()
	want := wholeDecode(t, s)
	cuts := make([]int, 0, len(s))
	for i := 1; i < len(s); i++ {
		cuts = append(cuts, i)
	}
	got := feedPieces(t, s, cuts)
	require.Equal(t, len(want), len(got))
	for k := range want {
		frameEqual(t, want[k], got[k], "frame %d", k)
	}
}

func TestDecoderRandomPieces(t *testing.T) {
	s := mixedStream()
	want := wholeDecode(t, s)
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 50; round++ {
		var cuts []int
		for c := rng.IntN(40); c < len(s); c += 1 + rng.IntN(1+rng.IntN(5000)) {
			cuts = append(cuts, c)
		}
		got := feedPieces(t, s, cuts)
		require.Equal(t, len(want), len(got), "round %d", round)
		for k := range want {
			frameEqual(t, want[k], got[k], "round %d frame %d", round, k)
		}
	}
}

// Feeding again before Next has drained is allowed and still correct.
func TestDecoderFeedWithoutDraining(t *testing.T) {
	s := mixedStream()
	want := wholeDecode(t, s)
	var d Decoder
	var got []Frame
	var prev []byte
	for i := 0; i < len(s); i += 1000 {
		piece := bytes.Clone(s[i:min(i+1000, len(s))])
		d.Feed(piece)
		for j := range prev { // Feed has copied what it still needed of the previous piece
			prev[j] = 0xEE
		}
		prev = piece
		if f, err := d.Next(); err == nil { // take at most one frame per piece
			got = append(got, clone(f))
		} else {
			require.ErrorIs(t, err, ErrIncomplete)
		}
	}
	for {
		f, err := d.Next()
		if err == ErrIncomplete {
			break
		}
		require.NoError(t, err)
		got = append(got, clone(f))
	}
	require.Equal(t, len(want), len(got))
	for k := range want {
		frameEqual(t, want[k], got[k], "frame %d", k)
	}
}

func TestDecoderFastPathIsZeroCopy(t *testing.T) {
	p := AppendSub(nil, 1, ModeWake, []byte("jobs"))
	var d Decoder
	d.Feed(p)
	f, err := d.Next()
	require.NoError(t, err)
	assert.Same(t, &p[len(p)-4], &f.Channel[0], "view into the fed piece")
	_, err = d.Next()
	assert.ErrorIs(t, err, ErrIncomplete)
	assert.Zero(t, cap(d.buf), "no buffer needed for whole frames")
}

func TestDecoderErrors(t *testing.T) {
	t.Run("length detected from header alone", func(t *testing.T) {
		var d Decoder
		d.Feed([]byte{0, 2})
		_, err := d.Next()
		require.ErrorIs(t, err, ErrIncomplete)
		d.Feed([]byte{0, 1}) // N = 0x00020001 > MaxBody
		_, err = d.Next()
		assert.ErrorIs(t, err, ErrLength)
		assert.LessOrEqual(t, cap(d.buf), 8, "did not buffer for the body")
	})
	t.Run("sticky until Reset", func(t *testing.T) {
		var d Decoder
		d.Feed(append(AppendPing(nil, 1), raw(0x77)...))
		f, err := d.Next()
		require.NoError(t, err)
		assert.Equal(t, TypePing, f.Type)
		_, err = d.Next()
		assert.ErrorIs(t, err, ErrUnknownType)
		d.Feed(AppendPing(nil, 2))
		_, err = d.Next()
		assert.ErrorIs(t, err, ErrUnknownType, "sticky")
		d.Reset()
		d.Feed(AppendPing(nil, 3))
		f, err = d.Next()
		require.NoError(t, err)
		assert.Equal(t, uint64(3), f.Token)
	})
	t.Run("bad body split across pieces", func(t *testing.T) {
		bad := raw(byte(TypeSub), 0, 0, 0, 1, 7, 'c')
		var d Decoder
		d.Feed(bad[:6])
		_, err := d.Next()
		require.ErrorIs(t, err, ErrIncomplete)
		d.Feed(bad[6:])
		_, err = d.Next()
		assert.ErrorIs(t, err, ErrBadMode)
	})
	t.Run("unknown type split after type byte", func(t *testing.T) {
		bad := raw(0x10, 1, 2, 3)
		var d Decoder
		d.Feed(bad[:4])
		_, err := d.Next()
		require.ErrorIs(t, err, ErrIncomplete)
		d.Feed(bad[4:5])
		_, err = d.Next()
		assert.ErrorIs(t, err, ErrUnknownType)
	})
}
