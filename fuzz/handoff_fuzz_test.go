package fuzz

import (
	"bytes"
	"errors"
	"testing"

	"github.com/pgsse/pgsse/framing"
)

// FuzzHandoffRecord: the handoff record decoder (connections, workers, channels) (framing.DecodeHandoff) never panics, refuses
// with one of its two errors, and whatever it accepts re-encodes to exactly its input (the
// encoding is canonical), so a successor reads back precisely what the predecessor wrote.
func FuzzHandoffRecord(f *testing.F) {
	f.Add(framing.AppendHandoffConn(nil, &framing.HandoffConn{
		Composite: true, ExpiresMS: 1_800_000_000_000, Subject: "u", PresenceSub: "user:7", PresenceWatch: true, Tags: []string{"t"},
		Subs: []framing.HandoffSub{
			{Kind: framing.HandoffStream, State: framing.HandoffLive, Checked: true, Cursor: 9, Name: "orders"},
			{Kind: framing.HandoffChannel, State: framing.HandoffLive, Cursor: 3, Name: "jobs"},
		},
		Tail: []byte("data: x\n"),
	}))
	f.Add(framing.AppendHandoffWorker(nil, &framing.HandoffWorkerRec{PID: 1, Name: "w",
		Channels: []framing.HandoffChan{{Mode: 1, Pos: framing.HandoffNoPosition, Name: "jobs"}}, Partial: 1, Tail: []byte{0, 0, 0, 1, 0x84}}))
	f.Add(framing.AppendHandoffChannels(nil, &framing.HandoffChannelList{Mark: "pgsse_handoff_1", Names: []string{"jobs", "a.b"}}))
	f.Add(append([]byte{framing.HandoffVersion + 1}, framing.AppendHandoffChannels(nil, &framing.HandoffChannelList{Names: []string{"x"}})[1:]...))
	f.Add([]byte{framing.HandoffVersion + 1, framing.HandoffSSE})
	f.Fuzz(func(t *testing.T, src []byte) {
		rec, err := framing.DecodeHandoff(src)
		if err != nil {
			if !errors.Is(err, framing.ErrHandoffRecord) && !errors.Is(err, framing.ErrHandoffVersion) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		var re []byte
		switch rec.Kind {
		case framing.HandoffSSE:
			re = framing.AppendHandoffConn(nil, &rec.Conn)
		case framing.HandoffWorker:
			re = framing.AppendHandoffWorker(nil, &rec.Worker)
		case framing.HandoffChannels:
			re = framing.AppendHandoffChannels(nil, &rec.Channels)
		default:
			t.Fatalf("accepted kind %d", rec.Kind)
		}
		if !bytes.Equal(re, src) {
			t.Fatalf("re-encodes to %x, input %x", re, src)
		}
	})
}
