package engine

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/auth"
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
	assert.Equal(t, 1, ts.lsn.src.(*pglisten.Session).Channels(), "the session LISTENs only the stream channel")

	// The worker is unaffected: a valid name (UTF-8, not ASCII) still works.
	assert.Equal(t, framing.AckOK, w.sub(subs+1, framing.ModeLossless, "żółć").Ack)
	pgNotify(t, connect(t, ts.DSN), "żółć", []byte("ok"))
	f := w.next(5 * time.Second)
	require.Equal(t, framing.TypeNotify, f.Type)
	assert.Equal(t, "ok", string(f.Text))
}

// firstComment reads an SSE response's first block and returns its comment: "pgsse" for a
// subscription that is live, the reason for a shed one.
func (c *sseClient) firstComment(timeout time.Duration) string {
	c.t.Helper()
	require.Equal(c.t, 200, c.Status, c.Body)
	blk, err := c.readBlock(timeout)
	require.NoError(c.t, err, "first block %q", blk)
	for _, l := range strings.Split(blk, "\n") {
		if strings.HasPrefix(l, ":") {
			return l[1:]
		}
	}
	c.t.Fatalf("no comment in the first block %q", blk)
	return ""
}

// TestChannelShares: the LISTEN session's channels are shared out — SSE clients (with sibling
// processes) hold at most their share, hub workers theirs — so neither side can take the
// other's. Before the fix SSE clients took every channel the session could hold (then were
// shed ":over capacity", the wrong reason) and every hub SUB after that was answered
// LISTEN_FAILED instead of the LIMIT docs/hub-protocol.md promises.
func TestChannelShares(t *testing.T) {
	const session = 100 // sessions of 10,000 take 20,000 descriptors to fill in one test process
	ts := startHub(t, func(c *Config) { c.listenChannels = session })
	const hubShare, perWorker, sseShare = session / 2, session / 5, session - session/2 - 1 // 1: the stream channel
	addr := ts.Addr().String()
	tok := bearerH(token(t, authClaimsChannels("*"), time.Hour))

	// More SSE clients on distinct channels than the whole session holds.
	live, shed := 0, 0
	for i := range session + 10 {
		c := dial(t, addr, fmt.Sprintf("/channels/sse-%d", i), tok)
		switch why := c.firstComment(10 * time.Second); why {
		case "pgsse":
			live++
		case "too many channels":
			shed++
		default:
			t.Fatalf("client %d shed for the wrong reason: %q", i, why)
		}
	}
	assert.Equal(t, sseShare, live, "SSE clients hold their share of channels")
	assert.Equal(t, session+10-sseShare, shed, "the rest are told why")
	assert.Equal(t, float64(shed), metricValue(t, ts.metrics.shed[shedChannelLimit]))
	// A channel SSE clients already hold costs no share.
	c := dial(t, addr, "/channels/sse-0", tok)
	assert.Equal(t, "pgsse", c.firstComment(10*time.Second))

	// The hub still has its whole share: per worker, then all workers together.
	a := dialHub(t, ts.cfg.HubSocket)
	a.hello("a")
	for i := range perWorker {
		f := a.sub(uint32(i+1), framing.ModeLossless, fmt.Sprintf("hub-%d", i))
		require.Equal(t, framing.AckOK, f.Ack, "SUB %d: %s", i, f.Text)
	}
	f := a.sub(perWorker+1, framing.ModeLossless, "hub-over")
	assert.Equal(t, framing.AckLimit, f.Ack)
	assert.Equal(t, fmt.Sprintf("at most %d channels per worker", perWorker), string(f.Text))
	var others []*rawWorker
	for n := perWorker; n < hubShare; {
		w := dialHub(t, ts.cfg.HubSocket)
		w.hello("more")
		others = append(others, w)
		for k := 0; k < perWorker && n < hubShare; k, n = k+1, n+1 {
			f := w.sub(uint32(k+1), framing.ModeLossless, fmt.Sprintf("hub-%d", n))
			require.Equal(t, framing.AckOK, f.Ack, "SUB of channel %d: %s", n, f.Text)
		}
	}
	f = others[len(others)-1].sub(1000, framing.ModeLossless, "hub-over")
	assert.Equal(t, framing.AckLimit, f.Ack, "the hub's share is full: %s", f.Text)
	assert.Contains(t, string(f.Text), fmt.Sprintf("the hub's workers hold %d channels together", hubShare))
	assert.Equal(t, framing.AckLimit, others[0].sub(1001, framing.ModeLossless, "sse-1").Ack,
		"a channel SSE clients hold counts in the hub's share too when a worker takes it: it is full")
	assert.Equal(t, 1+sseShare+hubShare, ts.lsn.src.(*pglisten.Session).Channels(), "the session is full, and never over")
}

// TestChannelSharePerSubject: --max-connections-per-subject bounds the channels one subject can
// make the server hold (docs/http.md, Per subject), as it bounds its connections.
func TestChannelSharePerSubject(t *testing.T) {
	const perSubject = 5
	ts := startServer(t, "", func(c *Config) { c.MaxConnectionsPerSubject = perSubject })
	addr := ts.Addr().String()
	alice := bearerH(token(t, auth.Claims{Channels: []string{"*"}, Subject: "alice"}, time.Hour))
	for i := range perSubject {
		assert.Equal(t, "pgsse", dial(t, addr, fmt.Sprintf("/channels/alice-%d", i), alice).firstComment(10*time.Second))
	}
	dial(t, addr, "/channels/alice-more", alice).expectShed("too many connections for this subject")
	assert.Len(t, ts.channelNames(), perSubject, "one subject holds at most its connections' channels")
}

// TestChannelSharesWithSiblings: a sibling process's channels are its SSE clients', so on the
// first process's hub they count in the SSE side's share, together with the first process's
// own clients; over it the sibling's client is shed for the channel limit too (the hub's ACK
// LIMIT), not as if the database were unavailable.
func TestChannelSharesWithSiblings(t *testing.T) {
	const session = 20
	const sseShare = session - session/2 - 1
	primary := startHub(t, func(c *Config) { c.listenChannels = session })
	sib := startSibling(t, primary, nil) // its own share is the default's: far larger
	tok := bearerH(token(t, authClaimsChannels("*"), time.Hour))
	const own = 4
	for i := range own {
		assert.Equal(t, "pgsse", dial(t, primary.Addr().String(), fmt.Sprintf("/channels/p-%d", i), tok).firstComment(10*time.Second))
	}
	for i := range sseShare - own {
		assert.Equal(t, "pgsse", dial(t, sib.Addr().String(), fmt.Sprintf("/channels/s-%d", i), tok).firstComment(10*time.Second), "sibling client %d", i)
	}
	assert.Equal(t, "too many channels", dial(t, sib.Addr().String(), "/channels/s-over", tok).firstComment(10*time.Second))
	assert.Equal(t, "too many channels", dial(t, primary.Addr().String(), "/channels/p-over", tok).firstComment(10*time.Second))
	assert.Equal(t, "pgsse", dial(t, sib.Addr().String(), "/channels/p-0", tok).firstComment(10*time.Second),
		"a channel the SSE side holds costs no share")
	assert.Equal(t, 1+sseShare, primary.lsn.src.(*pglisten.Session).Channels())
}
