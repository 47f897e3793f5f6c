package engine

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/framing"
	"github.com/pgsse/pgsse/pglisten"
)

// Payloads whose bytes must survive PostgreSQL → hub → worker exactly.
var hubPayloads = [][]byte{
	[]byte("plain"),
	[]byte(""),
	[]byte("quotes ' \" and \\ backslashes"),
	[]byte("lines\nand\r\nreturns\r"),
	[]byte("unicode: żółć 日本 🐘"),
	[]byte("{\"json\": [1, 2, 3]}"),
	bytes.Repeat([]byte("x"), 7900),
}

// TestHubCensus: 8 worker processes on different channels share one LISTEN backend, and each
// receives exactly its own channels' notifications, byte for byte.
func TestHubCensus(t *testing.T) {
	bin := buildWorker(t)
	ts := startHub(t, nil)
	const n = 8
	workers := make([]*workerProc, n)
	for i := range workers {
		workers[i] = startWorker(t, bin, fmt.Sprintf("w%d", i), ts.cfg.HubSocket, ts.DSN, "lossless", fmt.Sprintf("census_%d", i), fmt.Sprintf("census_%d_b", i))
	}
	for _, w := range workers {
		l := w.expectEv(15*time.Second, "ready")
		require.Equal(t, "hub", l.Source, "worker %s went direct: %s", w.name, l.Err)
	}
	assert.Equal(t, 1, listenBackends(t, ts.DSN), "one LISTEN backend for the server and all workers")
	waitFor(t, 5*time.Second, "8 workers counted", func() bool { return metricValue(t, ts.metrics.hubWorkers) == n })

	pub := connect(t, ts.DSN)
	for i := range workers {
		for j, p := range hubPayloads {
			ch := fmt.Sprintf("census_%d", i)
			if j%2 == 1 {
				ch += "_b"
			}
			pgNotify(t, pub, ch, append([]byte(fmt.Sprintf("%d/%d:", i, j)), p...))
		}
		pgNotify(t, pub, fmt.Sprintf("census_%d", i), []byte("end"))
	}
	pgPID := ""
	for i, w := range workers {
		for j, p := range hubPayloads {
			l := w.expectEv(10*time.Second, "notify")
			want := fmt.Sprintf("census_%d", i)
			if j%2 == 1 {
				want += "_b"
			}
			assert.Equal(t, want, l.Ch, "worker %d notification %d: only its own channels, in order", i, j)
			assert.Equal(t, append([]byte(fmt.Sprintf("%d/%d:", i, j)), p...), l.Payload, "worker %d payload %d byte-identical", i, j)
			assert.Equal(t, "hub", l.Source)
			assert.NotZero(t, l.PID, "the notifying backend's pid")
			if pgPID == "" {
				pgPID = fmt.Sprint(l.PID)
			}
		}
		l := w.expectEv(10*time.Second, "notify")
		assert.Equal(t, "end", string(l.Payload), "worker %d: nothing from other channels before its end marker", i)
	}
	assert.Equal(t, 1, listenBackends(t, ts.DSN))
}

// TestHubAckRace: a NOTIFY sent the moment the worker has read ACK OK is always delivered —
// on a fresh channel (LISTEN in flight), one already LISTENed (immediate ACK) and one whose
// LISTEN two workers wait for together.
func TestHubAckRace(t *testing.T) {
	ts := startHub(t, nil)
	pub := connect(t, ts.DSN)
	newClient := func(name string) pglisten.Listener {
		l, err := pglisten.NewHub(pglisten.HubConfig{Socket: ts.cfg.HubSocket, Name: name, PingInterval: -1})
		require.NoError(t, err)
		t.Cleanup(func() { l.Close() })
		return l
	}
	a, b := newClient("a"), newClient("b")
	names := map[pglisten.Listener]string{a: "a", b: "b"}
	waitNote := func(l pglisten.Listener, ch, payload string) {
		t.Helper()
		timeout := time.After(10 * time.Second)
		var other []string // what came instead, for the failure message
		for {
			select {
			case ev, ok := <-l.Events():
				require.True(t, ok, "events closed")
				if ev.Kind == pglisten.KindNotification && ev.Channel == ch && string(ev.Payload) == payload {
					return
				}
				other = append(other, fmt.Sprintf("%v %s %q", ev.Kind, ev.Channel, ev.Payload))
			case <-timeout:
				t.Fatalf("NOTIFY %s %q sent right after ACK was never delivered to worker %s; it got instead: %v", ch, payload, names[l], other)
			}
		}
	}
	ctx := context.Background()
	for i := range 100 {
		ch := fmt.Sprintf("race_%d", i)
		payload := fmt.Sprint(i)
		switch i % 3 {
		case 0: // fresh channel: ACK only after this LISTEN completes
			require.NoError(t, a.Listen(ctx, ch))
			pgNotify(t, pub, ch, []byte(payload))
			waitNote(a, ch, payload)
		case 1: // b holds it already: a's ACK is immediate
			require.NoError(t, b.Listen(ctx, ch))
			require.NoError(t, a.Listen(ctx, ch))
			pgNotify(t, pub, ch, []byte(payload))
			waitNote(a, ch, payload)
			waitNote(b, ch, payload)
		case 2: // both SUB at once: one joins the other's LISTEN in flight
			var wg sync.WaitGroup
			var errB error
			wg.Add(1)
			go func() { defer wg.Done(); errB = b.Listen(ctx, ch) }()
			require.NoError(t, a.Listen(ctx, ch))
			pgNotify(t, pub, ch, []byte(payload))
			wg.Wait()
			require.NoError(t, errB)
			waitNote(a, ch, payload)
			waitNote(b, ch, payload)
		}
		require.NoError(t, a.Unlisten(ctx, ch))
		if i%3 != 0 {
			require.NoError(t, b.Unlisten(ctx, ch))
		}
	}
	waitFor(t, 5*time.Second, "every raw channel released", func() bool { return len(ts.channelNames()) == 0 })
}

// channelNames returns the raw channels held right now (read on the loop).
func (ts *testServer) channelNames() []string {
	out := make(chan []string, 1)
	if !ts.tasks.push(func() {
		var names []string
		for n := range ts.chans.byName {
			names = append(names, n)
		}
		out <- names
	}) {
		return nil
	}
	select {
	case n := <-out:
		return n
	case <-time.After(5 * time.Second):
		return []string{"loop did not answer"}
	}
}

// TestHubSubscriptions: SUB is idempotent, UNSUB acknowledged at once (NOT_SUBSCRIBED when it
// was not), reserved and invalid names refused, PING answered, and channel refcounts shared with
// the SSE /channels/ bridge.
func TestHubSubscriptions(t *testing.T) {
	ts := startHub(t, nil)
	pub := connect(t, ts.DSN)
	w := dialHub(t, ts.cfg.HubSocket)
	w.hello("subs")

	assert.Equal(t, framing.AckOK, w.sub(1, framing.ModeLossless, "jobs").Ack)
	assert.Equal(t, framing.AckOK, w.sub(2, framing.ModeWake, "jobs").Ack, "second SUB on the same channel just ACKs")
	pgNotify(t, pub, "jobs", []byte("once"))
	f := w.next(5 * time.Second)
	assert.Equal(t, framing.TypeNotify, f.Type)
	assert.Equal(t, "once", string(f.Text))

	w.send(framing.AppendPing(nil, 0xdeadbeef))
	f = w.next(5 * time.Second)
	assert.Equal(t, framing.TypePong, f.Type, "PING → PONG, and the NOTIFY came only once")
	assert.Equal(t, uint64(0xdeadbeef), f.Token)

	f = w.sub(3, framing.ModeLossless, "pgsse")
	assert.Equal(t, framing.AckBadChannel, f.Ack, "the stream channel is reserved")
	w.send(framing.AppendSub(nil, 4, framing.ModeLossless, []byte("bad\x00name")))
	f = w.next(5 * time.Second)
	assert.Equal(t, framing.TypeAck, f.Type)
	assert.Equal(t, uint32(4), f.Req)
	assert.Equal(t, framing.AckBadChannel, f.Ack, "a bad channel name is refused, the worker stays")

	// Shared with the SSE bridge: the worker leaving does not UNLISTEN under the SSE client.
	tok := token(t, authClaimsChannels("jobs"), time.Hour)
	sc := dial(t, ts.Addr().String(), "/channels/jobs", "Authorization: Bearer "+tok)
	require.Equal(t, 200, sc.Status, sc.Body)
	w.send(framing.AppendUnsub(nil, 5, []byte("jobs")))
	f = w.next(5 * time.Second)
	assert.Equal(t, framing.TypeAck, f.Type)
	assert.Equal(t, framing.AckOK, f.Ack)
	w.send(framing.AppendUnsub(nil, 6, []byte("jobs")))
	f = w.next(5 * time.Second)
	assert.Equal(t, framing.AckNotSubscribed, f.Ack)
	pgNotify(t, pub, "jobs", []byte("for sse"))
	assert.Equal(t, "for sse", sc.mustNextData(5*time.Second).Data, "SSE client still LISTENed after the worker's UNSUB")

	// Resubscribe, then disconnect: the SSE client keeps the channel; when it leaves too, the
	// channel is released.
	assert.Equal(t, framing.AckOK, w.sub(7, framing.ModeLossless, "jobs").Ack)
	assert.Equal(t, framing.AckOK, w.sub(8, framing.ModeLossless, "other").Ack)
	w.conn.Close()
	waitFor(t, 5*time.Second, "worker's channels released", func() bool {
		n := ts.channelNames()
		return len(n) == 1 && n[0] == "jobs"
	})
	sc.conn.Close()
	waitFor(t, 5*time.Second, "all channels released", func() bool { return len(ts.channelNames()) == 0 })
	waitFor(t, 5*time.Second, "session holds only the stream channel", func() bool { return ts.lsn.src.(*pglisten.Session).Channels() == 1 })
}

// TestHubBadInput: each kind of bad input gets PROTOCOL_ERROR (best effort) and closes that
// worker only; a healthy worker keeps receiving throughout.
func TestHubBadInput(t *testing.T) {
	ts := startHub(t, nil)
	pub := connect(t, ts.DSN)
	healthy := dialHub(t, ts.cfg.HubSocket)
	healthy.hello("healthy")
	require.Equal(t, framing.AckOK, healthy.sub(1, framing.ModeLossless, "steady").Ack)

	hello := framing.AppendHello(nil, 1, []byte("bad"))
	cases := []struct {
		name      string
		input     []byte
		sayHello  bool
		wantError bool // STATUS PROTOCOL_ERROR expected before EOF
	}{
		{"first frame not HELLO", framing.AppendSub(nil, 1, 0, []byte("x")), false, true},
		{"PING before HELLO", framing.AppendPing(nil, 1), false, true},
		{"length over the max", []byte{0x00, 0x01, 0x00, 0x01, 0x02}, true, true},
		{"zero length", []byte{0, 0, 0, 0}, true, true},
		{"unknown type", []byte{0, 0, 0, 1, 0x7f}, true, true},
		{"truncated SUB field", []byte{0, 0, 0, 3, 0x02, 0, 0}, true, true},
		{"truncated HELLO", []byte{0, 0, 0, 3, 0x01, 1, 0}, false, true},
		{"bad HELLO version", framing.AppendHello(nil, 1, nil)[:4:4], false, false},
		{"bad SUB mode", []byte{0, 0, 0, 7, 0x02, 0, 0, 0, 1, 9, 'x'}, true, true},
		{"hub frame from a worker", framing.AppendNotify(nil, 1, []byte("x"), []byte("y")), true, true},
		// what a --procs sibling tells the hub of a rewind (rewinds.go): from anyone else, refused
		{"a sibling's rewind notice from a worker", framing.AppendNotify(nil, 1, []byte(storeChannel), appendRewindNotice(nil, "s", 1, 2)), true, true},
		{"HELLO twice", hello, true, true},
		{"random bytes", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), false, true},
		{"random bytes after HELLO", []byte{0xde, 0xad, 0xbe, 0xef, 0x99, 0x01, 0x02}, true, true},
		{"truncated frame then EOF", []byte{0, 0, 0, 9, 0x04, 1}, true, false},
	}
	cases[7].input = append([]byte{0, 0, 0, 6, 0x01, 2}, 0, 0, 0, 1) // version 2
	cases[7].wantError = true
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := dialHub(t, ts.cfg.HubSocket)
			if tc.sayHello {
				w.hello("bad")
			}
			w.send(tc.input)
			if !tc.wantError {
				w.conn.(*net.UnixConn).CloseWrite()
			}
			frames, err := w.untilClosed(10 * time.Second)
			require.NoError(t, err, "the hub closes the connection")
			if tc.wantError {
				require.NotEmpty(t, frames)
				last := frames[len(frames)-1]
				assert.Equal(t, framing.TypeStatus, last.Type)
				assert.Equal(t, framing.StatusProtocolError, last.Status, "last frame: %s", last.Text)
				assert.NotEmpty(t, last.Text, "the reason is named")
			}
			payload := fmt.Sprint("after ", i)
			pgNotify(t, pub, "steady", []byte(payload))
			f := healthy.next(5 * time.Second)
			assert.Equal(t, framing.TypeNotify, f.Type)
			assert.Equal(t, payload, string(f.Text), "the healthy worker is unaffected")
		})
	}
	waitFor(t, 5*time.Second, "only the healthy worker left", func() bool { return metricValue(t, ts.metrics.hubWorkers) == 1 })
}

// TestHubFramesSplitAcrossReads: a socket is a byte stream, so a worker may write a frame in
// pieces (header, then body; or a byte at a time) and the hub must join them. Before the fix
// a read that held no complete frame was thrown away (gnet's Discard(0) drops everything):
// HELLO written in two pieces got STATUS PROTOCOL_ERROR instead of READY.
func TestHubFramesSplitAcrossReads(t *testing.T) {
	ts := startHub(t, nil)
	pub := connect(t, ts.DSN)
	w := dialHub(t, ts.cfg.HubSocket)
	// Each piece is a separate write with a pause between them so that the hub reads them
	// separately (were two pieces read together, the test would merely prove less).
	inPieces := func(frame []byte) {
		t.Helper()
		for i := range frame {
			w.send(frame[i : i+1])
			time.Sleep(5 * time.Millisecond)
		}
	}
	inPieces(framing.AppendHello(nil, 1, []byte("pieces")))
	f := w.next(5 * time.Second)
	require.Equal(t, framing.TypeStatus, f.Type)
	require.Equal(t, framing.StatusReady, f.Status, "HELLO in pieces is answered READY: %s", f.Text)

	inPieces(framing.AppendPing(nil, 0x0102030405060708))
	f = w.next(5 * time.Second)
	require.Equal(t, framing.TypePong, f.Type)
	assert.Equal(t, uint64(0x0102030405060708), f.Token)

	// A whole frame followed by the start of the next: the partial one is kept.
	sub := framing.AppendSub(nil, 7, framing.ModeLossless, []byte("pieces"))
	w.send(append(framing.AppendPing(nil, 1), sub[:3]...))
	f = w.next(5 * time.Second)
	require.Equal(t, framing.TypePong, f.Type)
	inPieces(sub[3:])
	f = w.next(10 * time.Second)
	require.Equal(t, framing.TypeAck, f.Type)
	require.Equal(t, uint32(7), f.Req)
	require.Equal(t, framing.AckOK, f.Ack, "%s", f.Text)

	pgNotify(t, pub, "pieces", []byte("joined"))
	f = w.next(5 * time.Second)
	require.Equal(t, framing.TypeNotify, f.Type)
	assert.Equal(t, "joined", string(f.Text))
}

// TestHubWedgedWorker: with a 128 KiB ring, a lossless worker that stops reading is evicted
// (the raw one sees EVICTED; the failover one switches to its own session), a wake-mode one is
// not and gets RESYNC for its channel when it reads again, and a healthy worker on the same
// channel receives everything in order.
func TestHubWedgedWorker(t *testing.T) {
	bin := buildWorker(t)
	ts := startHub(t, func(c *Config) { c.HubWorkerBuffer = 2 * (4 + 65536) })
	const ch = "wedge"
	healthy := startWorker(t, bin, "healthy", ts.cfg.HubSocket, ts.DSN, "lossless", ch)
	lossless := startWorker(t, bin, "lossless", ts.cfg.HubSocket, ts.DSN, "lossless", ch)
	wake := startWorker(t, bin, "wake", ts.cfg.HubSocket, ts.DSN, "wake", ch)
	for _, w := range []*workerProc{healthy, lossless, wake} {
		require.Equal(t, "hub", w.expectEv(15*time.Second, "ready").Source)
	}
	raw := dialHub(t, ts.cfg.HubSocket)
	raw.hello("raw-never-reads")
	require.Equal(t, framing.AckOK, raw.sub(1, framing.ModeLossless, ch).Ack)

	lossless.signal(syscall.SIGSTOP)
	wake.signal(syscall.SIGSTOP)

	// Fill: ~8 KB payloads until both lossless laggards are evicted, reading the healthy
	// worker as we go.
	pub := connect(t, ts.DSN)
	big := bytes.Repeat([]byte("p"), 7900)
	sent := 0
	got := 0
	check := func(l hubLine) {
		t.Helper()
		want := fmt.Sprintf("%06d", got)
		require.Equal(t, "notify", l.Ev, "healthy worker: %+v", l)
		require.True(t, len(l.Payload) > 6 && string(l.Payload[:6]) == want, "healthy worker gets every notification in order: want %s, got %.6s", want, l.Payload)
		got++
	}
	for metricValue(t, ts.metrics.evictions) < 2 {
		require.Less(t, sent, 3000, "laggards were not evicted")
		pgNotify(t, pub, ch, append([]byte(fmt.Sprintf("%06d", sent)), big...))
		sent++
		for got < sent-20 {
			check(healthy.nextLine(10 * time.Second))
		}
	}
	assert.Equal(t, 2.0, metricValue(t, ts.metrics.evictions), "the wake-mode worker is not evicted")
	assert.Greater(t, metricValue(t, ts.metrics.droppedWakeCoalesced), 0.0)
	for range 50 { // more traffic while the wake worker is still stopped
		pgNotify(t, pub, ch, append([]byte(fmt.Sprintf("%06d", sent)), big...))
		sent++
	}
	for got < sent {
		check(healthy.nextLine(10 * time.Second))
	}

	// The raw worker never read: its stream ends with EVICTED.
	frames, err := raw.untilClosed(10 * time.Second)
	require.NoError(t, err)
	require.NotEmpty(t, frames)
	last := frames[len(frames)-1]
	assert.Equal(t, framing.TypeStatus, last.Type)
	assert.Equal(t, framing.StatusEvicted, last.Status)

	// The failover worker reads again: what it had, then the switch to its own session.
	lossless.signal(syscall.SIGCONT)
	m := lossless.expectEv(20*time.Second, "source")
	assert.Equal(t, "direct", m.Source)
	assert.Contains(t, m.Err, "evicted")
	r := lossless.expectEv(20*time.Second, "resync")
	assert.Equal(t, "", r.Ch, "switch reported as a resync of everything")
	assert.Equal(t, "direct", r.Source)

	// The wake worker reads again: it gets RESYNC for the channel and stays on the hub.
	wake.signal(syscall.SIGCONT)
	rs := wake.expect(20*time.Second, "RESYNC wedge", func(l hubLine) bool {
		return l.Ev == "resync" || l.Ev == "source"
	})
	assert.Equal(t, hubLine{Ev: "resync", Ch: ch, Source: "hub"}, rs)

	pgNotify(t, pub, ch, []byte("after"))
	for _, w := range []*workerProc{lossless, wake} {
		l := w.expect(10*time.Second, "the next NOTIFY", func(l hubLine) bool { return l.Ev == "notify" && string(l.Payload) == "after" })
		assert.Equal(t, map[*workerProc]string{lossless: "direct", wake: "hub"}[w], l.Source)
	}
	l := healthy.nextLine(10 * time.Second) // nothing lost, nothing out of order, nothing extra
	assert.Equal(t, "notify", l.Ev)
	assert.Equal(t, "after", string(l.Payload))
	assert.Equal(t, 2.0, metricValue(t, ts.metrics.evictions))
}

// TestHubEvictionUnlistens: docs/hub-protocol.md, when the last holder of a channel leaves — by
// UNSUB, disconnect or eviction — the hub UNLISTENs it. An evicted worker that never reads
// keeps its socket for hubFinalGraceMS (10 s) so that it may still read EVICTED; before the
// fix its channels were released only when that socket closed, so the UNLISTEN came 10 s late.
func TestHubEvictionUnlistens(t *testing.T) {
	ts := startHub(t, func(c *Config) { c.HubWorkerBuffer = MinHubWorkerBuffer })
	const ch = "evicted-alone"
	raw := dialHub(t, ts.cfg.HubSocket)
	raw.hello("never-reads")
	require.Equal(t, framing.AckOK, raw.sub(1, framing.ModeLossless, ch).Ack)
	require.Equal(t, []string{ch}, ts.channelNames())

	pub := connect(t, ts.DSN)
	big := bytes.Repeat([]byte("e"), 7900)
	for sent := 0; metricValue(t, ts.metrics.evictions) < 1; sent++ {
		require.Less(t, sent, 3000, "the worker that never reads was not evicted")
		pgNotify(t, pub, ch, big)
	}
	waitFor(t, hubFinalGraceMS*time.Millisecond/2, "the evicted worker's channel released", func() bool {
		return len(ts.channelNames()) == 0 && ts.lsn.src.(*pglisten.Session).Channels() == 1
	})

	frames, err := raw.untilClosed(20 * time.Second)
	require.NoError(t, err)
	require.NotEmpty(t, frames)
	assert.Equal(t, framing.StatusEvicted, frames[len(frames)-1].Status, "it still reads EVICTED last")
}

// TestHubRepeatedSubWhileListenPending: a SUB repeated while its channel's LISTEN is in flight
// waits for it (answered OK once the LISTEN completes), but only hubWaitingSubsMax of them:
// the rest are answered LIMIT at once. Before the fix every repeat was kept, so a worker
// repeating a SUB through a PostgreSQL outage grew the hub's memory without bound (30 MB of
// SUB frames: +47 MB RSS).
func TestHubRepeatedSubWhileListenPending(t *testing.T) {
	s, err := New(Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	conn := newSinkConn(t, true)
	_, action := s.hub.accept(conn, false)
	require.Equal(t, gnet.None, action)
	w := conn.ctx.(*worker)
	w.hello = true
	const repeats = 1000
	for req := uint32(1); req <= repeats; req++ {
		s.hub.sub(w, req, framing.ModeLossless, []byte("pending"))
	}
	ch := s.chans.byName["pending"]
	require.NotNil(t, ch)
	assert.Equal(t, hubWaitingSubsMax, len(w.subs["pending"].reqs), "SUBs kept while the LISTEN is in flight")
	s.lsn.up = true
	s.chans.live(ch) // the LISTEN completed
	flushAll(t, s)

	codes := map[framing.AckCode]int{}
	waitFor(t, 10*time.Second, "every SUB answered", func() bool {
		clear(codes)
		var dec framing.Decoder
		dec.Feed(conn.received())
		n := 0
		for {
			f, err := dec.Next()
			if err == framing.ErrIncomplete {
				break
			}
			require.NoError(t, err)
			require.Equal(t, framing.TypeAck, f.Type)
			codes[f.Ack]++
			n++
		}
		return n == repeats
	})
	assert.Equal(t, map[framing.AckCode]int{framing.AckOK: hubWaitingSubsMax, framing.AckLimit: repeats - hubWaitingSubsMax}, codes,
		"every SUB answered: the waiting ones OK once the LISTEN completed, the others LIMIT")
	s.hub.sub(w, repeats+1, framing.ModeLossless, []byte("pending"))
	assert.True(t, w.subs["pending"].acked, "a SUB after the LISTEN completed is just acknowledged")
}

// The hub's share of the LISTEN session (issue 11: 3 workers × 4,096 SUBs took all 10,000
// channels): one worker holds at most maxWorkerChannels, all workers together at most
// maxChannels distinct channels; SUBs beyond get ACK LIMIT, and SSE clients still get theirs.
func TestHubChannelShares(t *testing.T) {
	assert.Equal(t, 5000, hubMaxChannels, "half of the LISTEN session's 10,000 (docs/hub-protocol.md)")
	assert.Equal(t, 2000, hubMaxChannelsPerWorker)
	ts := startHub(t, nil)
	ts.onLoop(t, func() { ts.hub.maxChannels, ts.hub.maxWorkerChannels = 3, 2 })
	a := dialHub(t, ts.cfg.HubSocket)
	a.hello("a")
	b := dialHub(t, ts.cfg.HubSocket)
	b.hello("b")
	assert.Equal(t, framing.AckOK, a.sub(1, framing.ModeLossless, "ch1").Ack)
	assert.Equal(t, framing.AckOK, a.sub(2, framing.ModeLossless, "ch2").Ack)
	f := a.sub(3, framing.ModeLossless, "ch3")
	assert.Equal(t, framing.AckLimit, f.Ack, "per worker")
	assert.Equal(t, "at most 2 channels per worker", string(f.Text))
	assert.Equal(t, framing.AckOK, b.sub(4, framing.ModeLossless, "ch3").Ack)
	f = b.sub(5, framing.ModeLossless, "ch4")
	assert.Equal(t, framing.AckLimit, f.Ack, "all workers together")
	assert.Contains(t, string(f.Text), "the hub's workers hold 3 channels together")
	assert.Equal(t, framing.AckOK, b.sub(6, framing.ModeLossless, "ch1").Ack, "a channel the hub already holds costs no share")

	// SSE clients keep their share.
	tok := token(t, authClaimsChannels("*"), time.Hour)
	sc := dial(t, ts.Addr().String(), "/channels/ch9", bearerH(tok))
	require.Equal(t, 200, sc.Status, sc.Body)

	// A channel given back is available again.
	a.send(framing.AppendUnsub(nil, 7, []byte("ch2")))
	assert.Equal(t, framing.AckOK, a.next(5*time.Second).Ack)
	assert.Equal(t, framing.AckOK, a.sub(8, framing.ModeLossless, "ch4").Ack)
}
