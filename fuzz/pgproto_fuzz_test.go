package fuzz

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/pgsse/pgsse/pglisten"
)

// FuzzBackendParser drives the PostgreSQL backend-message framing and decoders with arbitrary
// bytes: they never panic, never read past the message, honour MaxMessage, and framing is
// consistent with the announced length.
func FuzzBackendParser(f *testing.F) {
	f.Add(pglisten.AppendNotificationResponse(nil, 42, []byte("pgsse"), []byte("payload")))
	f.Add([]byte{'Z', 0, 0, 0, 5, 'I'})
	f.Add([]byte("C\x00\x00\x00\x0bLISTEN\x00Z\x00\x00\x00\x05I"))
	f.Add([]byte("E\x00\x00\x00\x17SERROR\x00C22021\x00Mno\x00\x00"))
	f.Add([]byte{'A', 0x7f, 0xff, 0xff, 0xff})
	f.Add([]byte{'A', 0, 0, 0, 3})
	f.Add([]byte{'A', 0, 0, 0, 9, 0, 0, 0, 1, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		rest := data
		for len(rest) > 0 {
			msg, n, err := pglisten.ParseBackend(rest)
			if err != nil {
				if len(rest) < 5 {
					t.Fatalf("error %v before a header was visible", err)
				}
				return
			}
			if n == 0 {
				if len(rest) >= 5 {
					l := int(binary.BigEndian.Uint32(rest[1:5]))
					if l+1 <= len(rest) {
						t.Fatalf("incomplete reported for a complete message (len %d, have %d)", l, len(rest))
					}
				}
				return
			}
			if n > len(rest) || n != len(msg.Body)+5 || n-1 > pglisten.MaxMessage+4 {
				t.Fatalf("bad frame: n=%d body=%d have=%d", n, len(msg.Body), len(rest))
			}
			if msg.Type != rest[0] || !bytes.Equal(msg.Body, rest[5:n]) {
				t.Fatal("frame does not match input")
			}
			switch msg.Type {
			case pglisten.MsgNotification:
				if note, err := pglisten.ParseNotification(msg.Body); err == nil {
					// A decoded notification re-encodes to exactly the message it came from.
					again := pglisten.AppendNotificationResponse(nil, note.PID, note.Channel, note.Payload)
					if !bytes.Equal(again, rest[:n]) {
						t.Fatalf("notification does not round-trip:\n%q\n%q", rest[:n], again)
					}
				}
			case pglisten.MsgError, pglisten.MsgNotice:
				_, _ = pglisten.ParseErrorFields(msg.Body)
			case pglisten.MsgReady:
				_, _ = pglisten.ParseReady(msg.Body)
			}
			rest = rest[n:]
		}
	})
}

// FuzzNotificationRoundTrip: any NUL-free channel and payload, encoded the way PostgreSQL sends
// a NotificationResponse, parses back to the same pid, channel and payload bytes.
func FuzzNotificationRoundTrip(f *testing.F) {
	f.Add(uint32(1), []byte("pgsse"), []byte("hello"))
	f.Add(uint32(0xffffffff), []byte(`a"b`), []byte(""))
	f.Add(uint32(7), []byte("Robert'); DROP TABLE x;--"), []byte("naïve café 日本"))
	f.Add(uint32(9), []byte("c"), bytes.Repeat([]byte("x"), 7999))
	f.Fuzz(func(t *testing.T, pid uint32, channel, payload []byte) {
		if bytes.IndexByte(channel, 0) >= 0 || bytes.IndexByte(payload, 0) >= 0 || len(channel)+len(payload) > pglisten.MaxMessage-16 {
			return // not representable: PostgreSQL sends C strings
		}
		msg := pglisten.AppendNotificationResponse(nil, pid, channel, payload)
		// Follow it with another message: framing must stop at the first one.
		stream := append(append([]byte{}, msg...), 'Z', 0, 0, 0, 5, 'I')
		m, n, err := pglisten.ParseBackend(stream)
		if err != nil || n != len(msg) || m.Type != pglisten.MsgNotification {
			t.Fatalf("frame: n=%d err=%v", n, err)
		}
		note, err := pglisten.ParseNotification(m.Body)
		if err != nil {
			t.Fatal(err)
		}
		if note.PID != pid || !bytes.Equal(note.Channel, channel) || !bytes.Equal(note.Payload, payload) {
			t.Fatalf("round trip: got (%d %q %q) want (%d %q %q)", note.PID, note.Channel, note.Payload, pid, channel, payload)
		}
		// Every strict prefix is incomplete, never an error.
		for _, cut := range []int{0, 1, 4, 5, len(msg) / 2, len(msg) - 1} {
			if cut < 0 || cut >= len(msg) {
				continue
			}
			if _, n, err := pglisten.ParseBackend(msg[:cut]); n != 0 || err != nil {
				t.Fatalf("prefix %d: n=%d err=%v", cut, n, err)
			}
		}
	})
}
