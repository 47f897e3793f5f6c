package fuzz

import (
	"bytes"
	"errors"
	"testing"

	"github.com/pgsse/pgsse/framing"
)

// decodeAll decodes src frame by frame with Decode, checking that every frame
// re-encodes to exactly the bytes it consumed. It returns the concatenated
// re-encodings and the error that stopped it (ErrIncomplete at a clean end).
func decodeAll(t *testing.T, src []byte) ([]byte, error) {
	var out []byte
	for {
		f, n, err := framing.Decode(src)
		peekReq, peekN, peekOK := framing.PeekRequest(src)
		if peekOK && (peekN < framing.HeaderLen+5 || peekN > len(src)) {
			t.Fatalf("PeekRequest n=%d out of range (len %d)", peekN, len(src))
		}
		if err == nil && (f.Type == framing.TypeSub || f.Type == framing.TypeUnsub) && (!peekOK || peekReq != f.Req || peekN != n) {
			t.Fatalf("PeekRequest = %d,%d,%v; Decode read req %d, n %d", peekReq, peekN, peekOK, f.Req, n)
		}
		if err != nil {
			if n != 0 {
				t.Fatalf("error %v with n=%d", err, n)
			}
			return out, err
		}
		if n < framing.HeaderLen+1 || n > len(src) || n > framing.HeaderLen+framing.MaxBody {
			t.Fatalf("n=%d out of range (len %d)", n, len(src))
		}
		re := f.Append(nil)
		if !bytes.Equal(re, src[:n]) {
			t.Fatalf("%v re-encodes to %x, consumed %x", f.Type, re, src[:n])
		}
		if !framing.IsWorkerType(f.Type) && !framing.IsHubType(f.Type) {
			t.Fatalf("decoded unknown type %v", f.Type)
		}
		if w := framing.WholeFrames(src[:n/2], src[n/2:n], n); w != n {
			t.Fatalf("WholeFrames over one %d-byte frame split in two = %d", n, w)
		}
		out = append(out, re...)
		src = src[n:]
	}
}

// FuzzFrameDecode: Decode never panics, every decoded frame re-encodes to the
// bytes it used, and a Decoder fed the same bytes in two pieces yields the
// same frames and stops with the same error.
func FuzzFrameDecode(f *testing.F) {
	seeds := [][]byte{
		nil,
		{0, 0, 0, 0},
		{0, 1, 0, 1},
		{0xff, 0xff, 0xff, 0xff, 0x01},
		{0, 0, 0, 1, 0x05},
		framing.AppendHello(nil, 4242, []byte("worker")),
		framing.AppendSub(nil, 7, framing.ModeWake, []byte("jobs")),
		framing.AppendUnsub(nil, 7, []byte("jobs")),
		framing.AppendPing(nil, 1),
		framing.AppendPong(nil, 1<<63),
		framing.AppendAck(nil, 7, framing.AckLimit, []byte("too many channels")),
		framing.AppendNotify(nil, 1, []byte("pgsse"), []byte(`{"s":"orders/42","i":1}`)),
		framing.AppendStatus(nil, framing.StatusResync, nil, nil),
		framing.AppendStatus(nil, framing.StatusEvicted, []byte("jobs"), []byte("ring full")),
		// several frames back to back, the last one cut short
		append(append(framing.AppendPing(nil, 2), framing.AppendSub(nil, 1, 0, []byte("a"))...), 0, 0, 0, 9, 0x04),
		// malformed bodies
		{0, 0, 0, 6, 0x01, 2, 0, 0, 0, 1},               // bad version
		{0, 0, 0, 7, 0x02, 0, 0, 0, 1, 2, 'c'},          // bad mode
		{0, 0, 0, 7, 0x82, 0, 0, 0, 1, 9, 'c'},          // chanlen past end
		{0, 0, 0, 8, 0x83, 3, 2, 'a', 0, 'x', 'y', 'z'}, // channel NUL
		{0, 0, 0, 10, 0x04, 1, 2, 3, 4, 5, 6, 7, 8, 9},  // trailing
	}
	for i, s := range seeds {
		f.Add(s, uint16(i*3))
	}
	f.Fuzz(func(t *testing.T, data []byte, split uint16) {
		want, wantErr := decodeAll(t, data)

		cut := int(split) % (len(data) + 1)
		var d framing.Decoder
		var got []byte
		var gotErr error
		for _, piece := range [][]byte{bytes.Clone(data[:cut]), bytes.Clone(data[cut:])} {
			d.Feed(piece)
			for {
				fr, err := d.Next()
				if err != nil {
					gotErr = err
					break
				}
				got = fr.Append(got)
			}
			if gotErr != framing.ErrIncomplete {
				break
			}
			for i := range piece { // the decoder must have copied what it still needs
				piece[i] = 0xA5
			}
		}
		if !bytes.Equal(want, got) {
			t.Fatalf("cut %d: Decoder frames %x, Decode frames %x", cut, got, want)
		}
		if !errors.Is(gotErr, wantErr) {
			t.Fatalf("cut %d: Decoder stopped with %v, Decode with %v", cut, gotErr, wantErr)
		}
		if wantErr == framing.ErrIncomplete && d.Buffered() != len(data)-len(want) {
			t.Fatalf("Buffered %d, want %d", d.Buffered(), len(data)-len(want))
		}
	})
}
