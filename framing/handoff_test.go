package framing

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHandoffConnRoundTrip(t *testing.T) {
	c := HandoffConn{
		Composite: true, ExpiresMS: 1_800_000_000_000, Subject: "user-7",
		PresenceSub: "user:7", PresenceWatch: true,
		Tags: []string{"a", "team-9"},
		Subs: []HandoffSub{
			{Kind: HandoffStream, State: HandoffLive, Checked: true, Cursor: 42, Name: "orders"},
			{Kind: HandoffStream, State: HandoffLagging, Cursor: 0, Name: "chat.room-1"},
			{Kind: HandoffChannel, State: HandoffLive, Cursor: 7, Name: "jobs"},
			{Kind: HandoffChannel, State: HandoffLive, Cursor: HandoffNoPosition, Name: "jobs2"},
		},
		Tail: []byte("data: half an ev"),
	}
	b := AppendHandoffConn(nil, &c)
	rec, err := DecodeHandoff(b)
	require.NoError(t, err)
	assert.Equal(t, uint8(HandoffSSE), rec.Kind)
	assert.Equal(t, c, rec.Conn)
	assert.Equal(t, b, AppendHandoffConn(nil, &rec.Conn), "canonical")
}

func TestHandoffWorkerRoundTrip(t *testing.T) {
	w := HandoffWorkerRec{PID: 77, Sibling: true, Name: "pgsse sibling",
		Channels: []HandoffChan{{Mode: 0, Pos: HandoffNoPosition, Name: "pgsse"}, {Mode: 1, Pos: 12, Name: "jobs"}},
		Partial:  3, Tail: []byte("\x00\x00\x00\x01\x84")}
	rec, err := DecodeHandoff(AppendHandoffWorker(nil, &w))
	require.NoError(t, err)
	assert.Equal(t, uint8(HandoffWorker), rec.Kind)
	assert.Equal(t, w, rec.Worker)
}

func TestHandoffRefusesFutureVersionAndJunk(t *testing.T) {
	c := HandoffConn{Subs: []HandoffSub{{Kind: HandoffStream, State: HandoffLive, Cursor: 1, Name: "s"}}}
	b := AppendHandoffConn(nil, &c)
	future := append([]byte{HandoffVersion + 1}, b[1:]...)
	_, err := DecodeHandoff(future)
	require.ErrorIs(t, err, ErrHandoffVersion)
	assert.Contains(t, err.Error(), "version 4, this binary speaks 3")

	// Records of earlier versions (1: before the channels record, 2: before the presence
	// fields) are refused too: the predecessor keeps serving, and the upgrade is a restart
	// (docs/operations.md).
	for _, v := range []byte{1, 2} {
		_, err = DecodeHandoff(append([]byte{v}, b[1:]...))
		require.ErrorIs(t, err, ErrHandoffVersion)
		assert.Contains(t, err.Error(), "version "+string('0'+rune(v))+", this binary speaks 3")
	}
	l := AppendHandoffChannels(nil, &HandoffChannelList{Mark: "m", Names: []string{"a"}})
	_, err = DecodeHandoff(append([]byte{HandoffVersion + 1}, l[1:]...))
	require.ErrorIs(t, err, ErrHandoffVersion, "a channels record of a future version")

	for name, bad := range map[string][]byte{
		"empty":              nil,
		"truncated":          b[:len(b)-1],
		"trailing":           append(append([]byte(nil), b...), 0),
		"kind":               append([]byte{HandoffVersion, 9}, b[2:]...),
		"no subs":            AppendHandoffConn(nil, &HandoffConn{}),
		"conn flags":         func() []byte { x := append([]byte(nil), b...); x[2] |= 4; return x }(),
		"channels truncated": l[:len(l)-1],
		"channels trailing":  append(append([]byte(nil), l...), 0),
		"empty channel":      AppendHandoffChannels(nil, &HandoffChannelList{Names: []string{""}}),
		"channels count":     {HandoffVersion, HandoffChannels, 0, 0, 0xff, 0xff, 0xff, 0xff},
		"worker position": AppendHandoffWorker(nil, &HandoffWorkerRec{Name: "w",
			Channels: []HandoffChan{{Pos: -2, Name: "j"}}}),
	} {
		_, err := DecodeHandoff(bad)
		assert.True(t, errors.Is(err, ErrHandoffRecord), "%s: %v", name, err)
	}
}

func TestHandoffChannelsRoundTrip(t *testing.T) {
	for _, l := range []HandoffChannelList{
		{Mark: "pgsse_handoff_0123abcd", Names: []string{"jobs", "pgsse_handoff_0123abcd", "chat.room-1"}},
		{Mark: "", Names: nil},
	} {
		b := AppendHandoffChannels(nil, &l)
		rec, err := DecodeHandoff(b)
		require.NoError(t, err)
		assert.Equal(t, uint8(HandoffChannels), rec.Kind)
		assert.Equal(t, l, rec.Channels)
		assert.Equal(t, b, AppendHandoffChannels(nil, &rec.Channels), "canonical")
	}
}
