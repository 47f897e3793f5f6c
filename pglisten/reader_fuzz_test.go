package pglisten

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"
)

// chunkReader returns at most size bytes per Read.
type chunkReader struct {
	data []byte
	size int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		panic("readStream asked for a zero-length read")
	}
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.size)], r.data)
	r.data = r.data[n:]
	return n, nil
}

// trace runs readStream over r and records what it delivered, in order.
func trace(r io.Reader) (events []string, protoErr bool) {
	readStream(r, func(it item) bool {
		if it.batch != nil {
			for _, n := range it.batch.Notes {
				events = append(events, "A"+string(rune(n.PID&0x7f))+string(n.Channel)+"\x00"+string(n.Payload))
			}
			it.batch.Release()
		}
		for _, c := range it.ctl {
			events = append(events, string(c.typ))
		}
		if it.err != nil {
			protoErr = !errors.Is(it.err, io.ErrUnexpectedEOF)
		}
		return true
	}, func() {}, slog.New(slog.DiscardHandler))
	return events, protoErr
}

// FuzzReadStreamSplit: however the socket splits the byte stream, the reader delivers the same
// notifications and control messages in the same order, and fails the same way.
func FuzzReadStreamSplit(f *testing.F) {
	// Tiny batch buffers: most messages straddle reads and need the grow and split paths.
	saved := batchBufSize
	batchBufSize = 16
	f.Cleanup(func() { batchBufSize = saved })
	small := sampleStreamWith(40)
	f.Add(small, uint8(0))
	f.Add(small, uint8(6))
	f.Add(small, uint8(200))
	f.Add(AppendNotificationResponse(nil, 1, []byte("c"), bytes.Repeat([]byte("x"), 100)), uint8(30))
	f.Add([]byte{'A', 0, 0, 0, 9, 0, 0, 0, 1, 0, 'Z', 0, 0, 0, 5, 'I'}, uint8(3))
	f.Fuzz(func(t *testing.T, data []byte, chunk uint8) {
		want, wantErr := trace(bytes.NewReader(data))
		got, gotErr := trace(&chunkReader{data: data, size: int(chunk)%23 + 1})
		if !slices.Equal(want, got) || wantErr != gotErr {
			t.Fatalf("split reads differ:\nwhole %q (proto error %v)\nsplit %q (proto error %v)", want, wantErr, got, gotErr)
		}
	})
}
