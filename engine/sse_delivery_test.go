package engine

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/store"
)

// docs/http.md's body and cursor rules, live and replayed, over raw TCP.

func TestSSELiveDelivery(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	pub := connect(t, ts.DSN)
	tok := bearerH(allStreams(t))

	a := dial(t, addr, "/streams/live/1", tok)
	b := dial(t, addr, "/streams/live/1", tok)
	other := dial(t, addr, "/streams/live/2", tok)
	for _, c := range []*sseClient{a, b, other} {
		require.Equal(t, 200, c.Status, c.Body)
	}
	// Absent cursor = live only: what was published before is not replayed.
	for i := 1; i <= 30; i++ {
		require.Equal(t, int64(i), publish(t, pub, "live/1", "d"+strconv.Itoa(i), "", nil))
	}
	for _, c := range []*sseClient{a, b} {
		for i := 1; i <= 30; i++ {
			ev := c.mustNextData(5 * time.Second)
			require.Equal(t, sseEvent{HasID: true, IDValue: strconv.Itoa(i), Data: "d" + strconv.Itoa(i)}, ev)
		}
	}
	other.expectSilence(300 * time.Millisecond)

	// A client connecting now without a cursor starts at the head.
	late := dial(t, addr, "/streams/live/1", tok)
	require.Equal(t, 200, late.Status)
	publish(t, pub, "live/1", "d31", "", nil)
	assert.Equal(t, "31", late.mustNextData(5*time.Second).IDValue)
	assert.Equal(t, "31", a.mustNextData(5*time.Second).IDValue)

	// Stream names with the whole allowed alphabet, percent-encoded or not.
	name := "A-z_0.9:@/=+~x"
	c := dial(t, addr, "/streams/A-z_0.9%3A%40%2F%3D%2B~x", tok)
	require.Equal(t, 200, c.Status, c.Body)
	publish(t, pub, name, "odd name", "", nil)
	assert.Equal(t, "odd name", c.mustNextData(5*time.Second).Data)
}

func TestSSEReplay(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	pub := connect(t, ts.DSN)
	tok := allStreams(t)
	publishN(t, pub, "r", "d", 10)

	cases := []struct {
		name    string
		query   string
		headers []string
		first   int64 // first id expected; 11 = live only
	}{
		{"since=0 is everything retained", "?since=0", nil, 1},
		{"since=3", "?since=3", nil, 4},
		{"since with leading zeros", "?since=007", nil, 8},
		{"since=10 (at head)", "?since=10", nil, 11},
		{"Last-Event-ID 5", "", []string{"Last-Event-ID: 5"}, 6},
		{"Last-Event-ID 0", "", []string{"Last-Event-ID: 0"}, 1},
		{"Last-Event-ID wins over since", "?since=1", []string{"Last-Event-ID: 8"}, 9},
		{"Last-Event-ID wins over since (lower)", "?since=9", []string{"Last-Event-ID: 2"}, 3},
		{"blank Last-Event-ID is absent: since applies", "?since=6", []string{"Last-Event-ID:"}, 7},
		{"blank Last-Event-ID with spaces is absent", "?since=6", []string{"Last-Event-ID:    "}, 7},
		{"blank Last-Event-ID alone is live only", "", []string{"Last-Event-ID: "}, 11},
		{"blank since is absent", "?since=", nil, 11},
		{"token and since in query", "?token=" + tok + "&since=4", nil, 5},
	}
	clients := make([]*sseClient, len(cases))
	for i, tc := range cases {
		hs := tc.headers
		if !strings.Contains(tc.query, "token=") {
			hs = append([]string{bearerH(tok)}, hs...)
		}
		clients[i] = dial(t, addr, "/streams/r"+tc.query, hs...)
		require.Equal(t, 200, clients[i].Status, "%s: %s", tc.name, clients[i].Body)
	}
	for i, tc := range cases {
		clients[i].readIDs(tc.first, 10, 5*time.Second)
	}
	// Then everyone continues live, from 11, exactly once.
	publishN(t, pub, "r", "live", 3)
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clients[i].t = t
			clients[i].readIDs(11, 13, 5*time.Second)
		})
	}
}

func TestSSEDataEncoding(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	pub := connect(t, ts.DSN)
	tok := bearerH(allStreams(t))
	c := dial(t, addr, "/streams/enc", tok)
	require.Equal(t, 200, c.Status)

	cases := []struct {
		data, event string
		raw         string // what must be on the wire (id filled in)
		parsed      string
	}{
		{"a\nb\r\nc\rd", "", "data: a\ndata: b\ndata: c\ndata: d\n\n", "a\nb\nc\nd"},
		{"plain", "update", "event: update\ndata: plain\n\n", "plain"},
		{"explicit default", "message", "data: explicit default\n\n", "explicit default"},
		{"x\n\nid: 99\nevent: evil\nretry: 1\n:c", "", "data: x\ndata: \ndata: id: 99\ndata: event: evil\ndata: retry: 1\ndata: :c\n\n", "x\n\nid: 99\nevent: evil\nretry: 1\n:c"},
		{"", "empty", "event: empty\ndata: \n\n", ""},
		{"trailing\n", "", "data: trailing\ndata: \n\n", "trailing\n"},
		{"\r\n\r\n", "", "data: \ndata: \ndata: \n\n", "\n\n"},
		{"ünïcödé ✓ \x00 nul", "a.b:c-d_e", "event: a.b:c-d_e\ndata: ünïcödé ✓ \x00 nul\n\n", "ünïcödé ✓ \x00 nul"},
	}
	for _, tc := range cases {
		if strings.Contains(tc.data, "\x00") {
			tc.data = strings.ReplaceAll(tc.data, "\x00", "")
			tc.raw = strings.ReplaceAll(tc.raw, "\x00", "")
			tc.parsed = strings.ReplaceAll(tc.parsed, "\x00", "")
		}
		id := publish(t, pub, "enc", tc.data, tc.event, nil)
		got := c.rawEvent(5 * time.Second)
		assert.Equal(t, "id: "+strconv.FormatInt(id, 10)+"\n"+tc.raw, got, "data %q event %q", tc.data, tc.event)
	}
	// The same through replay (table path) and the parsed view.
	r := dial(t, addr, "/streams/enc?since=0", tok)
	require.Equal(t, 200, r.Status)
	for i, tc := range cases {
		tc.parsed = strings.ReplaceAll(tc.parsed, "\x00", "")
		ev := r.mustNextData(5 * time.Second)
		want := sseEvent{HasID: true, IDValue: strconv.Itoa(i + 1), Data: tc.parsed}
		if tc.event != "" && tc.event != "message" {
			want.Event = tc.event
		}
		assert.Equal(t, want, ev)
	}
}

// Big data travels as a wake and is read from the table; it must arrive intact and in order.
func TestSSELargeEvents(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	pub := connect(t, ts.DSN)
	// Above the 1 MiB default of pgsse.max_event_bytes (docs/sql.md, The functions), as a
	// database can allow.
	_, err := pub.Exec(context.Background(), "SET pgsse.max_event_bytes = 4194304").ReadAll()
	require.NoError(t, err)
	tok := bearerH(allStreams(t))
	c := dial(t, addr, "/streams/big", tok)
	require.Equal(t, 200, c.Status)
	sizes := []int{10, 7900, 8000, 8200, 100_000, 1 << 20, 5, 3 << 20}
	for i, n := range sizes {
		data := strings.Repeat(string(rune('a'+i)), n)
		publish(t, pub, "big", data, "", nil)
	}
	for i, n := range sizes {
		t.Logf("waiting for event %d (%d bytes)", i+1, n)
		ev := c.mustNextData(10 * time.Second)
		assert.Equal(t, strconv.Itoa(i+1), ev.IDValue)
		assert.Equal(t, n, len(ev.Data), "event %d", i+1)
		assert.Equal(t, strings.Repeat(string(rune('a'+i)), n), ev.Data)
	}
}

func TestSSEEphemeral(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	pub := connect(t, ts.DSN)
	c := dial(t, addr, "/streams/eph", bearerH(allStreams(t)))
	require.Equal(t, 200, c.Status)

	require.NoError(t, store.Broadcast(context.Background(), pub, "eph", "typing", "presence", nil))
	blk := c.rawEvent(5 * time.Second)
	assert.Equal(t, "event: presence\ndata: typing\n\n", blk, "ephemeral events carry no id: line")

	publish(t, pub, "eph", "durable", "", nil)
	require.NoError(t, store.Broadcast(context.Background(), pub, "eph", "a\nb", "", nil))
	publish(t, pub, "eph", "durable2", "", nil)
	assert.Equal(t, sseEvent{HasID: true, IDValue: "1", Data: "durable"}, c.mustNextData(5*time.Second))
	assert.Equal(t, sseEvent{Data: "a\nb"}, c.mustNextData(5*time.Second))
	assert.Equal(t, sseEvent{HasID: true, IDValue: "2", Data: "durable2"}, c.mustNextData(5*time.Second))

	// Ephemeral events are not replayed.
	r := dial(t, addr, "/streams/eph?since=0", bearerH(allStreams(t)))
	r.readIDs(1, 2, 5*time.Second)
	r.expectSilence(300 * time.Millisecond)

	// A rolled-back broadcast and publish deliver nothing.
	pgtest.Exec(t, ts.DSN, "BEGIN; SELECT pgsse.broadcast('eph', 'rolled back'); SELECT pgsse.publish('eph', 'rolled back'); ROLLBACK")
	require.NoError(t, store.Broadcast(context.Background(), pub, "eph", "after", "", nil))
	assert.Equal(t, sseEvent{Data: "after"}, c.mustNextData(5*time.Second))
}

// docs/http.md, Authorization (Audience): live and replay alike, hidden events skipped silently
// (no gap).
func TestSSEAudience(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	pub := connect(t, ts.DSN)
	tok7 := bearerH(allStreams(t, "user:7", "role:x"))
	tok8 := bearerH(allStreams(t, "user:8"))
	tokNone := bearerH(allStreams(t))

	publishAll := func(base int) {
		publish(t, pub, "aud", "all", "", nil)
		publish(t, pub, "aud", "for7", "", []string{"user:7"})
		publish(t, pub, "aud", "for8", "", []string{"user:8", "user:9"})
		publish(t, pub, "aud", "for7and8", "", []string{"user:8", "role:x"})
		publish(t, pub, "aud", "empty audience", "", []string{})
		publish(t, pub, "aud", "nobody", "", []string{"user:1"})
		publish(t, pub, "aud", "last", "", nil)
	}
	want := map[string][]string{
		"7":    {"all", "for7", "for7and8", "empty audience", "last"},
		"8":    {"all", "for8", "for7and8", "empty audience", "last"},
		"none": {"all", "empty audience", "last"},
	}
	ids := map[string][]int64{
		"7":    {1, 2, 4, 5, 7},
		"8":    {1, 3, 4, 5, 7},
		"none": {1, 5, 7},
	}
	toks := map[string]string{"7": tok7, "8": tok8, "none": tokNone}
	check := func(t *testing.T, who string, c *sseClient, offset int64) {
		for i, d := range want[who] {
			ev := c.mustNextData(5 * time.Second)
			require.NotEqual(t, "pgsse:gap", ev.Event, "%s: hidden events are skipped silently, not announced: %v", who, ev)
			assert.Equal(t, sseEvent{HasID: true, IDValue: strconv.FormatInt(ids[who][i]+offset, 10), Data: d}, ev, who)
		}
	}
	live := map[string]*sseClient{}
	for who, tk := range toks {
		live[who] = dial(t, addr, "/streams/aud", tk)
		require.Equal(t, 200, live[who].Status)
	}
	publishAll(0)
	t.Run("live", func(t *testing.T) {
		for who, c := range live {
			check(t, who, c, 0)
		}
	})
	t.Run("replay", func(t *testing.T) {
		for who, tk := range toks {
			c := dial(t, addr, "/streams/aud?since=0", tk)
			require.Equal(t, 200, c.Status)
			check(t, who, c, 0)
		}
	})
	t.Run("replay then live", func(t *testing.T) {
		rs := map[string]*sseClient{}
		for who, tk := range toks {
			rs[who] = dial(t, addr, "/streams/aud", tk, "Last-Event-ID: 1")
			require.Equal(t, 200, rs[who].Status)
		}
		publishAll(7)
		for who, c := range rs {
			// From the replay: ids > 1 of the first round, then the second round live.
			for i, d := range want[who] {
				if ids[who][i] == 1 {
					continue
				}
				ev := c.mustNextData(5 * time.Second)
				assert.Equal(t, sseEvent{HasID: true, IDValue: strconv.FormatInt(ids[who][i], 10), Data: d}, ev, who)
			}
			check(t, who, c, 7)
		}
		for who, c := range live {
			check(t, who, c, 7)
		}
	})
	t.Run("cursor on the last hidden event", func(t *testing.T) {
		publish(t, pub, "aud", "hidden tail", "", []string{"user:1"})
		head := streamHead(t, ts.DSN, "aud")
		c := dial(t, addr, "/streams/aud", tokNone, "Last-Event-ID: "+strconv.FormatInt(head-1, 10))
		require.Equal(t, 200, c.Status)
		publish(t, pub, "aud", "after", "", nil)
		ev := c.mustNextData(5 * time.Second)
		assert.Equal(t, sseEvent{HasID: true, IDValue: strconv.FormatInt(head+1, 10), Data: "after"}, ev)
	})
	t.Run("ephemeral", func(t *testing.T) {
		require.NoError(t, store.Broadcast(context.Background(), pub, "aud", "eph7", "", []string{"user:7"}))
		require.NoError(t, store.Broadcast(context.Background(), pub, "aud", "eph-all", "", nil))
		ev := live["7"].mustNextData(5 * time.Second)
		if ev.HasID { // "after" from the previous subtest
			ev = live["7"].mustNextData(5 * time.Second)
		}
		assert.Equal(t, "eph7", ev.Data)
		for _, who := range []string{"7", "8", "none"} {
			ev := live[who].mustNextData(5 * time.Second)
			if ev.HasID { // "after"/"hidden tail" from the previous subtest
				ev = live[who].mustNextData(5 * time.Second)
			}
			assert.Equal(t, "eph-all", ev.Data, who)
		}
	})
}

// docs/http.md: /channels/{channel} bridges raw NOTIFY; the head arrives only once LISTEN has
// completed, so a NOTIFY sent right after reading the head must arrive.
func TestSSEChannelBridge(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	tok := bearerH(token(t, auth.Claims{Channels: []string{"jobs", "Mixed.Case-ch", "q/*", "with space", "x"}}, time.Hour))
	pub := connect(t, ts.DSN)
	notify := func(ch, payload string) {
		t.Helper()
		res := pub.ExecParams(context.Background(), "SELECT pg_notify($1, $2)", [][]byte{[]byte(ch), []byte(payload)}, nil, nil, nil).Read()
		require.NoError(t, res.Err)
	}

	t.Run("head after LISTEN, 50 rounds", func(t *testing.T) {
		for i := 0; i < 50; i++ {
			ch := "jobs"
			if i%2 == 1 {
				ch = "q/" + strconv.Itoa(i) // a fresh channel: a fresh LISTEN each time
			}
			c := dial(t, addr, "/channels/"+url(ch), tok)
			require.Equal(t, 200, c.Status, c.Body)
			p := fmt.Sprintf("round %d", i)
			notify(ch, p)
			ev := c.mustNextData(5 * time.Second)
			require.Equal(t, sseEvent{Data: p}, ev, "round %d on %s", i, ch)
			c.conn.Close()
		}
	})

	t.Run("payload fidelity and no id", func(t *testing.T) {
		c := dial(t, addr, "/channels/Mixed.Case-ch", tok)
		require.Equal(t, 200, c.Status, c.Body)
		c2 := dial(t, addr, "/channels/with%20space", tok)
		require.Equal(t, 200, c2.Status, c2.Body)
		notify("mixed.case-ch", "wrong case: not ours")
		notify("Mixed.Case-ch", "line1\nline2\r\nid: 5")
		notify("Mixed.Case-ch", "")
		notify("Mixed.Case-ch", "{\"json\":true}")
		notify("with space", "spaced")
		blk := c.rawEvent(5 * time.Second)
		assert.Equal(t, "data: line1\ndata: line2\ndata: id: 5\n\n", blk)
		blk = c.rawEvent(5 * time.Second)
		assert.Equal(t, "data: \n\n", blk)
		assert.Equal(t, sseEvent{Data: "{\"json\":true}"}, c.mustNextData(5*time.Second))
		assert.Equal(t, sseEvent{Data: "spaced"}, c2.mustNextData(5*time.Second))
	})

	t.Run("several holders, one leaves", func(t *testing.T) {
		a := dial(t, addr, "/channels/x", tok)
		b := dial(t, addr, "/channels/x", tok)
		require.Equal(t, 200, a.Status)
		require.Equal(t, 200, b.Status)
		notify("x", "both")
		assert.Equal(t, "both", a.mustNextData(5*time.Second).Data)
		assert.Equal(t, "both", b.mustNextData(5*time.Second).Data)
		a.conn.Close()
		// The server has dropped a; b must keep the channel's LISTEN.
		waitFor(t, 5*time.Second, "the server to drop the closed holder", func() bool {
			holders := -1
			ts.onLoop(t, func() {
				if ch := ts.chans.byName["x"]; ch != nil {
					holders = ch.holders
				}
			})
			return holders == 1
		})
		notify("x", "b only")
		assert.Equal(t, "b only", b.mustNextData(5*time.Second).Data)
	})

	t.Run("stream traffic does not leak into channels", func(t *testing.T) {
		c := dial(t, addr, "/channels/jobs", tok)
		require.Equal(t, 200, c.Status)
		publish(t, pub, "jobs", "a stream event", "", nil)
		notify("jobs", "raw")
		assert.Equal(t, sseEvent{Data: "raw"}, c.mustNextData(5*time.Second))
	})

	t.Run("the pgsse channel is not a raw channel", func(t *testing.T) {
		r := get(t, addr, "/channels/pgsse", bearerH(allStreams(t)))
		assert.NotEqual(t, 200, r.Status, "pgsse's own channel must not be readable raw: %s", r.Body)
	})
}

func url(s string) string { return strings.ReplaceAll(s, " ", "%20") }

// docs/http.md, Cursors and gaps: a cursor whose next events were pruned, and a cursor newer than
// the head.
func TestSSEGap(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	pub := connect(t, ts.DSN)
	tok := bearerH(allStreams(t))
	publishN(t, pub, "g", "d", 10)
	pgtest.Exec(t, ts.DSN, "SELECT pgsse.prune('0 seconds', 3)")
	require.Equal(t, "8", pgtest.QueryValue(t, ts.DSN, "SELECT min(id) FROM pgsse.events WHERE stream = 'g'"))

	t.Run("pruned cursor", func(t *testing.T) {
		for _, hdr := range [][]string{{tok, "Last-Event-ID: 2"}, {tok}} {
			path := "/streams/g"
			if len(hdr) == 1 {
				path += "?since=2"
			}
			c := dial(t, addr, path, hdr...)
			require.Equal(t, 200, c.Status)
			blk := c.rawEvent(5 * time.Second)
			assert.Equal(t, "event: pgsse:gap\ndata: {\"stream\":\"g\",\"after\":2,\"resume\":7}\n\n", blk, "gap event has no id: line")
			c.readIDs(8, 10, 5*time.Second)
		}
	})
	t.Run("cursor just before the oldest: no gap", func(t *testing.T) {
		c := dial(t, addr, "/streams/g?since=7", tok)
		ev := c.mustNextData(5 * time.Second)
		assert.Equal(t, "8", ev.IDValue, "no gap: %v", ev)
	})
	t.Run("since=0 after pruning: everything retained, no gap", func(t *testing.T) {
		c := dial(t, addr, "/streams/g?since=0", tok)
		ev := c.mustNextData(5 * time.Second)
		assert.Equal(t, sseEvent{HasID: true, IDValue: "8", Data: "d8"}, ev)
	})
	t.Run("cursor newer than the head", func(t *testing.T) {
		c := dial(t, addr, "/streams/g?since=100", tok)
		require.Equal(t, 200, c.Status)
		blk := c.rawEvent(5 * time.Second)
		assert.Equal(t, "event: pgsse:gap\ndata: {\"stream\":\"g\",\"after\":100,\"resume\":10}\n\n", blk)
		publish(t, pub, "g", "d11", "", nil)
		publish(t, pub, "g", "d12", "", nil)
		c.readIDs(11, 12, 5*time.Second)
	})
	t.Run("cursor on a stream never published", func(t *testing.T) {
		c := dial(t, addr, "/streams/empty?since=5", tok)
		blk := c.rawEvent(5 * time.Second)
		assert.Equal(t, "event: pgsse:gap\ndata: {\"stream\":\"empty\",\"after\":5,\"resume\":0}\n\n", blk)
		publish(t, pub, "empty", "first", "", nil)
		c.readIDs(1, 1, 5*time.Second)
	})
	t.Run("gap JSON escapes the stream name", func(t *testing.T) {
		publishN(t, pub, "a/b=c+d@e", "x", 1)
		c := dial(t, addr, "/streams/a%2Fb%3Dc%2Bd%40e?since=9", tok)
		blk := c.rawEvent(5 * time.Second)
		assert.Equal(t, "event: pgsse:gap\ndata: {\"stream\":\"a/b=c+d@e\",\"after\":9,\"resume\":1}\n\n", blk)
	})
}

func TestSSEHeartbeat(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", func(c *Config) { c.Heartbeat = 200 * time.Millisecond })
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	for _, path := range []string{"/streams/hb", "/channels/hb", "/streams?stream=hb&stream=hb2"} {
		c := dial(t, addr, path, tok)
		require.Equal(t, 200, c.Status)
		_, err := c.readBlock(2 * time.Second) // retry + comment
		require.NoError(t, err)
		start := time.Now()
		_ = c.conn.SetReadDeadline(time.Now().Add(3 * time.Second))
		var beats int
		for beats < 3 {
			line, err := c.r.ReadString('\n')
			require.NoError(t, err, "%s: waiting for heartbeats (got %d)", path, beats)
			if strings.HasPrefix(line, ":") {
				beats++
			} else if line != "\n" {
				t.Fatalf("%s: unexpected line %q", path, line)
			}
		}
		el := time.Since(start)
		assert.Less(t, el, 2*time.Second, "%s: 3 heartbeats at 200ms", path)
		assert.Greater(t, el, 400*time.Millisecond, "%s: not faster than --heartbeat", path)
	}
}

// Race: connecting with since=<head> while a publisher runs flat out must yield ids
// contiguous from cursor+1, no duplicates, no gaps (docs/architecture.md, invariant 4).
func TestSSESubscribeRace(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	p := startPublisher(t, ts.DSN, "race", 0)
	waitFor(t, 10*time.Second, "publisher running", func() bool { return p.last.Load() > 5 })

	// Also keep one connection live the whole time: it must see everything.
	keeper := dial(t, addr, "/streams/race?since="+strconv.FormatInt(p.last.Load(), 10), tok)

	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for round := 0; round < 20; round++ {
		cursor := streamHead(t, ts.DSN, "race")
		useHeader := round%2 == 1
		var c *sseClient
		if round%5 == 4 {
			// No cursor: live from the head; contiguous from the first event, and the
			// first is at most one past the head committed once the response head was read.
			c = dial(t, addr, "/streams/race", tok)
			require.Equal(t, 200, c.Status)
			after := streamHead(t, ts.DSN, "race")
			wg.Add(1)
			go func(round int, c *sseClient) {
				defer wg.Done()
				evs := c.eventsSoon(100, 300*time.Millisecond)
				if len(evs) == 0 {
					errs <- fmt.Sprintf("round %d: no event within 10s", round)
					return
				}
				if evs[0].id() > after+1 {
					errs <- fmt.Sprintf("round %d (no cursor): first id %d, but %d was committed after the head was read", round, evs[0].id(), after)
				}
				for i, ev := range evs {
					if ev.id() != evs[0].id()+int64(i) {
						errs <- fmt.Sprintf("round %d (no cursor): ids not contiguous: %v", round, evs)
						return
					}
				}
			}(round, c)
			time.Sleep(15 * time.Millisecond)
			continue
		}
		if useHeader {
			c = dial(t, addr, "/streams/race", tok, "Last-Event-ID: "+strconv.FormatInt(cursor, 10))
		} else {
			c = dial(t, addr, "/streams/race?since="+strconv.FormatInt(cursor, 10), tok)
		}
		require.Equal(t, 200, c.Status)
		wg.Add(1)
		go func(round int, c *sseClient, cursor int64) {
			defer wg.Done()
			evs := c.eventsSoon(100, 300*time.Millisecond)
			if len(evs) == 0 {
				errs <- fmt.Sprintf("round %d: no event within 10s", round)
				return
			}
			want := cursor + 1
			for _, ev := range evs {
				if !ev.HasID || ev.id() != want {
					errs <- fmt.Sprintf("round %d (cursor %d): want id %d, got %v", round, cursor, want, ev)
					return
				}
				want++
			}
		}(round, c, cursor)
		time.Sleep(15 * time.Millisecond)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	p.Stop()
	head := streamHead(t, ts.DSN, "race")
	t.Logf("published %d events, %d publish errors", head, p.errors.Load())
	first := keeper.mustNextData(5 * time.Second)
	require.True(t, first.HasID)
	keeper.readIDs(first.id()+1, head, 30*time.Second)
}

// docs/http.md: "everything committed after the client has read the head reaches it" — for a
// client without a cursor, on a stream new to the server and on one it already follows.
func TestSSEHeadMeansLive(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	pub := connect(t, ts.DSN)
	keep := dial(t, addr, "/streams/known", tok) // keeps "known" followed throughout
	require.Equal(t, 200, keep.Status)
	for i := 0; i < 50; i++ {
		stream := "fresh/" + strconv.Itoa(i)
		if i%2 == 1 {
			stream = "known"
		}
		if i%4 == 0 {
			publish(t, pub, stream, "before", "", nil) // a stream with history
		}
		c := dial(t, addr, "/streams/"+stream, tok)
		require.Equal(t, 200, c.Status)
		id := publish(t, pub, stream, "after head "+strconv.Itoa(i), "", nil)
		ev := c.mustNextData(5 * time.Second)
		require.Equal(t, sseEvent{HasID: true, IDValue: strconv.FormatInt(id, 10), Data: "after head " + strconv.Itoa(i)}, ev, "round %d on %s", i, stream)
		c.conn.Close()
	}
}

// Clients catching up a long backlog (many replay batches) while a publisher runs flat
// out join the live stream with no gap and no duplicate.
func TestSSECatchUpUnderLoad(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	pgtest.Exec(t, ts.DSN, "SELECT pgsse.publish('load', 'backlog ' || g) FROM generate_series(1, 1500) g")
	p := startPublisher(t, ts.DSN, "load", 0)
	waitFor(t, 10*time.Second, "publisher running", func() bool { return p.last.Load() > 1510 })
	clients := map[int64]*faultClient{}
	for _, since := range []int64{0, 1, 700, 1499} {
		clients[since] = startFaultClient(t, addr, "/streams/load?since="+strconv.FormatInt(since, 10), tok)
	}
	lid := startFaultClient(t, addr, "/streams/load", tok, "Last-Event-ID: 250")
	time.Sleep(1500 * time.Millisecond) // the workload: clients catch up while the publisher runs
	p.Stop()
	head := streamHead(t, ts.DSN, "load")
	t.Logf("head %d", head)
	for since, fc := range clients {
		fc.finish(t, "since="+strconv.FormatInt(since, 10), since+1, head, 30*time.Second)
	}
	lid.finish(t, "Last-Event-ID 250", 251, head, 30*time.Second)
}
