package fuzz

import (
	"bytes"
	"testing"

	"github.com/pgsse/pgsse/ring"
)

// FuzzRing interprets ops as a program against a Ring and a plain []byte
// queue: each op byte picks an operation (low 2 bits) and, with the next
// byte(s), its size. Contents, Len, Free and the watermark tests must always
// match the model.
func FuzzRing(f *testing.F) {
	f.Add(uint16(8), []byte{0, 6, 2, 5, 1, 2, 4, 0, 6})             // push, partial consume, watermarks, wrapping push
	f.Add(uint16(1), []byte{0, 1, 0, 1, 2, 1, 0, 0})                // capacity 1
	f.Add(uint16(0), []byte{0, 0, 0, 1, 1, 0, 0, 2, 0})             // capacity 0
	f.Add(uint16(16), []byte{0, 16, 0, 1, 2, 15, 0, 15, 3, 2, 255}) // fill, refuse, wrap, reset
	f.Add(uint16(300), bytes.Repeat([]byte{0, 200, 2, 150, 1, 90, 70}, 20))
	f.Fuzz(func(t *testing.T, capacity uint16, ops []byte) {
		capacity %= 4097
		r := ring.New(int(capacity))
		var model []byte
		low, high := 0, int(capacity)
		var seq byte
		var scratch [1][256]byte
		gen := func(slot, k int) []byte {
			p := scratch[slot][:k]
			for i := range p {
				p[i] = seq
				seq++
			}
			return p
		}
		arg := func(i int) int {
			if i < len(ops) {
				return int(ops[i])
			}
			return 0
		}
		for i := 0; i < len(ops); {
			op := ops[i] & 3
			switch op {
			case 0: // push k
				p := gen(0, arg(i+1))
				i += 2
				ok := r.Push(p)
				if ok != (len(model)+len(p) <= int(capacity)) {
					t.Fatalf("Push(%d) = %v with %d of %d used", len(p), ok, len(model), capacity)
				}
				if ok {
					model = append(model, p...)
				}
			case 1: // set watermarks: low = a mod (Cap+1), high = low + b mod (Cap-low+1)
				low = arg(i+1) % (int(capacity) + 1)
				high = low + arg(i+2)%(int(capacity)-low+1)
				i += 3
				r.SetWatermarks(low, high)
			case 2: // consume k mod (Len+1)
				k := arg(i+1) % (len(model) + 1)
				i += 2
				r.Consume(k)
				model = model[k:]
			case 3: // reset, only when the op byte is 0xff (rare)
				if ops[i] == 0xff {
					r.Reset()
					model = model[:0]
				}
				i++
			}
			if r.Len() != len(model) || r.Free() != int(capacity)-len(model) || r.Cap() != int(capacity) {
				t.Fatalf("Len %d Free %d Cap %d, model %d of %d", r.Len(), r.Free(), r.Cap(), len(model), capacity)
			}
			if r.AboveHigh() != (len(model) > high) || r.BelowLow() != (len(model) < low) {
				t.Fatalf("AboveHigh %v BelowLow %v with %d buffered, watermarks %d/%d", r.AboveHigh(), r.BelowLow(), len(model), low, high)
			}
			a, b := r.Peek()
			if len(a) == 0 && len(b) != 0 {
				t.Fatal("second view without first")
			}
			if len(a)+len(b) != len(model) || !bytes.Equal(a, model[:len(a)]) || !bytes.Equal(b, model[len(a):]) {
				t.Fatalf("contents differ from model")
			}
		}
		if len(model) > 0 {
			func() {
				defer func() {
					if recover() == nil {
						t.Fatal("Consume beyond Len did not panic")
					}
				}()
				r.Consume(len(model) + 1)
			}()
		}
	})
}
