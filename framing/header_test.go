package framing

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestPeekRequest(t *testing.T) {
	sub := AppendSub(nil, 7, ModeWake, []byte("jobs"))
	unsub := AppendUnsub(nil, 9, []byte("jobs"))
	badChannel := AppendSub(nil, 11, ModeLossless, nil)  // empty channel: Decode refuses it
	nulChannel := AppendUnsub(nil, 12, []byte("a\x00b")) // NUL: Decode refuses it
	cases := []struct {
		name string
		in   []byte
		req  uint32
		n    int
		ok   bool
	}{
		{"sub", sub, 7, len(sub), true},
		{"unsub", unsub, 9, len(unsub), true},
		{"sub with trailing frame", append(append([]byte(nil), sub...), unsub...), 7, len(sub), true},
		{"sub, channel refused by Decode", badChannel, 11, len(badChannel), true},
		{"unsub, channel refused by Decode", nulChannel, 12, len(nulChannel), true},
		{"incomplete", sub[:len(sub)-1], 0, 0, false},
		{"header and type only", sub[:HeaderLen+1], 0, 0, false},
		{"ping", AppendPing(nil, 1), 0, 0, false},
		{"ack", AppendAck(nil, 1, AckOK, nil), 0, 0, false},
		{"length below req", append(binary.BigEndian.AppendUint32(nil, 4), byte(TypeSub), 0, 0, 0, 0), 0, 0, false},
		{"length over MaxBody", append(binary.BigEndian.AppendUint32(nil, MaxBody+1), byte(TypeSub), 0, 0, 0, 1), 0, 0, false},
		{"empty", nil, 0, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, n, ok := PeekRequest(tc.in)
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.req, req)
			assert.Equal(t, tc.n, n)
		})
	}
}

func TestWholeFrames(t *testing.T) {
	f1 := AppendPing(nil, 1)                                   // 13 bytes
	f2 := AppendNotify(nil, 1, []byte("c"), []byte("payload")) // 18 bytes
	f3 := AppendStatus(nil, StatusResync, nil, nil)            // 7 bytes
	stream := append(append(append([]byte(nil), f1...), f2...), f3...)
	all := len(stream)
	// Every seam between the ring's two views gives the same answer.
	for cut := 0; cut <= all; cut++ {
		a, b := stream[:cut], stream[cut:]
		assert.Equal(t, all, WholeFrames(a, b, 1<<20), "cut %d", cut)
		assert.Equal(t, len(f1)+len(f2), WholeFrames(a, b, len(f1)+len(f2)+len(f3)-1), "limit stops before the third frame, cut %d", cut)
		assert.Equal(t, len(f1), WholeFrames(a, b, 1), "a first frame longer than limit counts whole, cut %d", cut)
	}
	// A partial frame at the end is not counted.
	assert.Equal(t, len(f1)+len(f2), WholeFrames(stream[:all-1], nil, 1<<20))
	assert.Equal(t, len(f1), WholeFrames(stream[:len(f1)+3], nil, 1<<20), "partial header")
	assert.Zero(t, WholeFrames(nil, nil, 1<<20))
}
