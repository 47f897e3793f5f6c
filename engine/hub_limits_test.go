package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/framing"
	"github.com/pgsse/pgsse/pglisten"
)

// TestHubSubNotUTF8: a SUB whose channel is not valid UTF-8 is answered ACK BAD_CHANNEL at once
// with the rule the SSE side answers 400 with (names.CheckChannelUTF8), and no LISTEN is sent.
// Before the fix the hub LISTENed each one: PostgreSQL refused with 22021, and 300 SUBs cost
// 300 round trips on the one LISTEN session, 295 WARN lines and ACK LISTEN_FAILED.
func TestHubSubNotUTF8(t *testing.T) {
	ts := startHub(t, nil)
	w := dialHub(t, ts.cfg.HubSocket)
	w.hello("utf8")
	const subs = 300
	for i := range subs {
		w.send(framing.AppendSub(nil, uint32(i+1), framing.ModeLossless, []byte(fmt.Sprintf("bad\xff%d", i))))
	}
	for i := range subs {
		f := w.next(10 * time.Second)
		require.Equal(t, framing.TypeAck, f.Type)
		require.Equal(t, uint32(i+1), f.Req, "answered in order")
		require.Equal(t, framing.AckBadChannel, f.Ack, "SUB %d: %s", i+1, f.Text)
		require.Equal(t, "channel name must be valid UTF-8", string(f.Text), "the rule is named")
	}
	assert.Empty(t, ts.channelNames(), "no channel was held for them")
	assert.Equal(t, 1, ts.listen.(*pglisten.Session).Channels(), "the session LISTENs only the stream channel")

	// The worker is unaffected: a valid name (UTF-8, not ASCII) still works.
	assert.Equal(t, framing.AckOK, w.sub(subs+1, framing.ModeLossless, "żółć").Ack)
	pgNotify(t, connect(t, ts.DSN), "żółć", []byte("ok"))
	f := w.next(5 * time.Second)
	require.Equal(t, framing.TypeNotify, f.Type)
	assert.Equal(t, "ok", string(f.Text))
}
