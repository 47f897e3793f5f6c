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
		Tags: []string{"a", "team-9"},
		Subs: []HandoffSub{
			{Kind: HandoffStream, State: HandoffLive, Checked: true, Cursor: 42, Name: "orders"},
			{Kind: HandoffStream, State: HandoffLagging, Cursor: 0, Name: "chat.room-1"},
			{Kind: HandoffChannel, State: HandoffLive, Name: "jobs"},
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
		Channels: []HandoffChan{{Mode: 0, Name: "pgsse"}, {Mode: 1, Name: "jobs"}},
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
	assert.Contains(t, err.Error(), "version 2, this binary speaks 1")

	for name, bad := range map[string][]byte{
		"empty":     nil,
		"truncated": b[:len(b)-1],
		"trailing":  append(append([]byte(nil), b...), 0),
		"kind":      append([]byte{HandoffVersion, 9}, b[2:]...),
		"no subs":   AppendHandoffConn(nil, &HandoffConn{}),
	} {
		_, err := DecodeHandoff(bad)
		assert.True(t, errors.Is(err, ErrHandoffRecord), "%s: %v", name, err)
	}
}
