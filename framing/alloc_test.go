package framing

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

var (
	sinkBuf   []byte
	sinkFrame Frame
	sinkErr   error
)

var (
	tChan    = []byte("orders")
	tName    = []byte("worker-7")
	tPayload = []byte(`{"stream":"orders/42","id":17,"data":"hello"}`)
	tMsg     = []byte("listen failed: too many channels")
)

func encoders() map[string]func([]byte) []byte {
	return map[string]func([]byte) []byte{
		"Hello":  func(d []byte) []byte { return AppendHello(d, 4242, tName) },
		"Sub":    func(d []byte) []byte { return AppendSub(d, 7, ModeLossless, tChan) },
		"Unsub":  func(d []byte) []byte { return AppendUnsub(d, 7, tChan) },
		"Ping":   func(d []byte) []byte { return AppendPing(d, 0xfeed) },
		"Ack":    func(d []byte) []byte { return AppendAck(d, 7, AckListenFailed, tMsg) },
		"Notify": func(d []byte) []byte { return AppendNotify(d, 31337, tChan, tPayload) },
		"Status": func(d []byte) []byte { return AppendStatus(d, StatusResync, tChan, tMsg) },
		"Pong":   func(d []byte) []byte { return AppendPong(d, 0xfeed) },
	}
}

func TestZeroAllocs(t *testing.T) {
	dst := make([]byte, 0, 256)
	for name, enc := range encoders() {
		assert.Zero(t, testing.AllocsPerRun(100, func() { sinkBuf = enc(dst[:0]) }), "Append"+name)
		frame := enc(nil)
		assert.Zero(t, testing.AllocsPerRun(100, func() { sinkFrame, _, sinkErr = Decode(frame) }), "Decode"+name)
		f, _, err := Decode(frame)
		assert.NoError(t, err)
		assert.Zero(t, testing.AllocsPerRun(100, func() { sinkBuf = f.Append(dst[:0]) }), "Frame.Append "+name)
	}
	bad := []byte{0, 0, 0, 0}
	assert.Zero(t, testing.AllocsPerRun(100, func() { _, _, sinkErr = Decode(bad) }), "Decode error")
}

// Steady state: whole frames, frames split across pieces (once the buffer has
// grown to the frame size) and the error path allocate nothing.
func TestDecoderZeroAllocs(t *testing.T) {
	var stream []byte
	for _, enc := range encoders() {
		stream = enc(stream)
	}
	var d Decoder
	run := func() {
		for _, cut := range []int{len(stream), 3, 17, 61} {
			d.Feed(stream[:cut])
			for {
				if _, err := d.Next(); err != nil {
					break
				}
			}
			d.Feed(stream[cut:])
			for {
				if _, err := d.Next(); err != nil {
					break
				}
			}
		}
	}
	run() // warm: grows the split buffer once
	assert.Zero(t, testing.AllocsPerRun(100, run))
}

func benchEncode(b *testing.B, enc func([]byte) []byte) {
	dst := make([]byte, 0, 256)
	b.ReportAllocs()
	b.SetBytes(int64(len(enc(nil))))
	for b.Loop() {
		sinkBuf = enc(dst[:0])
	}
}

func benchDecode(b *testing.B, enc func([]byte) []byte) {
	frame := enc(nil)
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		sinkFrame, _, sinkErr = Decode(frame)
	}
	if sinkErr != nil {
		b.Fatal(sinkErr)
	}
}

func BenchmarkEncodeHello(b *testing.B)  { benchEncode(b, encoders()["Hello"]) }
func BenchmarkEncodeSub(b *testing.B)    { benchEncode(b, encoders()["Sub"]) }
func BenchmarkEncodeUnsub(b *testing.B)  { benchEncode(b, encoders()["Unsub"]) }
func BenchmarkEncodePing(b *testing.B)   { benchEncode(b, encoders()["Ping"]) }
func BenchmarkEncodeAck(b *testing.B)    { benchEncode(b, encoders()["Ack"]) }
func BenchmarkEncodeNotify(b *testing.B) { benchEncode(b, encoders()["Notify"]) }
func BenchmarkEncodeStatus(b *testing.B) { benchEncode(b, encoders()["Status"]) }
func BenchmarkEncodePong(b *testing.B)   { benchEncode(b, encoders()["Pong"]) }

func BenchmarkDecodeHello(b *testing.B)  { benchDecode(b, encoders()["Hello"]) }
func BenchmarkDecodeSub(b *testing.B)    { benchDecode(b, encoders()["Sub"]) }
func BenchmarkDecodeUnsub(b *testing.B)  { benchDecode(b, encoders()["Unsub"]) }
func BenchmarkDecodePing(b *testing.B)   { benchDecode(b, encoders()["Ping"]) }
func BenchmarkDecodeAck(b *testing.B)    { benchDecode(b, encoders()["Ack"]) }
func BenchmarkDecodeNotify(b *testing.B) { benchDecode(b, encoders()["Notify"]) }
func BenchmarkDecodeStatus(b *testing.B) { benchDecode(b, encoders()["Status"]) }
func BenchmarkDecodePong(b *testing.B)   { benchDecode(b, encoders()["Pong"]) }

// BenchmarkDecoderSplit: a 16-frame batch of NOTIFYs fed in 100-byte reads,
// so most frames straddle a read boundary and go through the copy path.
func BenchmarkDecoderSplit(b *testing.B) {
	var stream []byte
	for i := 0; i < 16; i++ {
		stream = AppendNotify(stream, 1, tChan, tPayload)
	}
	var d Decoder
	b.ReportAllocs()
	b.SetBytes(int64(len(stream)))
	for b.Loop() {
		for off := 0; off < len(stream); off += 100 {
			d.Feed(stream[off:min(off+100, len(stream))])
			for {
				f, err := d.Next()
				if err != nil {
					break
				}
				sinkFrame = f
			}
		}
	}
}
