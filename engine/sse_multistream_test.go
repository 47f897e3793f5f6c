package engine

import (
	"context"
	"encoding/json"
	"fmt"
	neturl "net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

// Several streams on one connection (docs/http.md; SPEC §3c), over real sockets against a
// real PostgreSQL: GET /streams?stream=…&stream=…, the composite id, the composite cursor, and
// §3's guarantees per stream.

// streamsPath is /streams with one stream parameter per name (percent-encoded) and extra
// query parameters after them.
func streamsPath(streams []string, extra ...string) string {
	var b strings.Builder
	b.WriteString("/streams")
	for i, s := range streams {
		if i == 0 {
			b.WriteByte('?')
		} else {
			b.WriteByte('&')
		}
		b.WriteString("stream=" + neturl.QueryEscape(s))
	}
	for _, e := range extra {
		b.WriteString("&" + e)
	}
	return b.String()
}

// multiReader reads a GET /streams connection and checks every durable event's composite id
// against where each stream stands: <k>:<c0>,…,<cK-1>, with k in range, stream k's entry
// moving forward, and no other entry moving back.
type multiReader struct {
	t       testing.TB
	c       *sseClient
	streams []string
	at      []int64    // each stream's cursor as the last id said
	ids     [][]int64  // per stream, the ids of the events received
	data    [][]string // and their data
	gaps    []gapEvent
	lastID  string // the last composite id (what a browser sends as Last-Event-ID)
	ordered []string
}

type gapEvent struct {
	Stream string `json:"stream"`
	After  int64  `json:"after"`
	Resume int64  `json:"resume"`
}

func newMultiReader(t testing.TB, c *sseClient, streams []string, start []int64) *multiReader {
	m := &multiReader{t: t, c: c, streams: streams, at: slices.Clone(start),
		ids: make([][]int64, len(streams)), data: make([][]string, len(streams))}
	if m.at == nil {
		m.at = make([]int64, len(streams))
	}
	return m
}

// parseComposite splits a composite id into its position and cursors.
func parseComposite(t testing.TB, id string, k int) (int, []int64) {
	t.Helper()
	pos, rest, ok := strings.Cut(id, ":")
	require.True(t, ok, "composite id %q has its position", id)
	p, err := strconv.Atoi(pos)
	require.NoError(t, err, "position of %q", id)
	entries := strings.Split(rest, ",")
	require.Len(t, entries, k, "composite id %q: one entry per stream", id)
	cursors := make([]int64, k)
	for i, e := range entries {
		cursors[i], err = strconv.ParseInt(e, 10, 64)
		require.NoError(t, err, "entry %d of %q", i, id)
	}
	require.True(t, p >= 0 && p < k, "position %d of %q", p, id)
	return p, cursors
}

// next reads one event (skipping comments and retry blocks), checking it; it returns the
// event and the position of its stream (-1 for an event without an id).
func (m *multiReader) next(timeout time.Duration) (sseEvent, int) {
	m.t.Helper()
	ev := m.c.mustNextData(timeout)
	if ev.Event == "pgsse:gap" {
		require.False(m.t, ev.HasID, "a gap carries no id: %v", ev)
		var g gapEvent
		require.NoError(m.t, json.Unmarshal([]byte(ev.Data), &g))
		m.gaps = append(m.gaps, g)
		return ev, -1
	}
	if !ev.HasID {
		return ev, -1
	}
	k, cursors := parseComposite(m.t, ev.IDValue, len(m.streams))
	require.Greater(m.t, cursors[k], m.at[k], "stream %d (%s) moves forward: %v after %v", k, m.streams[k], ev, m.at)
	for i := range cursors {
		require.GreaterOrEqual(m.t, cursors[i], m.at[i], "entry %d never moves back: %v after %v", i, ev, m.at)
	}
	m.at = cursors
	m.ids[k] = append(m.ids[k], cursors[k])
	m.data[k] = append(m.data[k], ev.Data)
	m.lastID = ev.IDValue
	m.ordered = append(m.ordered, ev.Data)
	return ev, k
}

// until reads until every stream's cursor has reached want (-1: any).
func (m *multiReader) until(want []int64, timeout time.Duration) {
	m.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		done := true
		for i, w := range want {
			if m.at[i] < w {
				done = false
			}
		}
		if done {
			return
		}
		left := time.Until(deadline)
		require.Positive(m.t, left, "timed out at %v waiting for %v", m.at, want)
		m.next(left)
	}
}

func idRange(from, to int64) []int64 {
	var ids []int64
	for id := from; id <= to; id++ {
		ids = append(ids, id)
	}
	return ids
}

// waitStreaming waits until the server has n connections streaming.
func waitStreaming(t testing.TB, ts *testServer, n int) {
	t.Helper()
	waitFor(t, 15*time.Second, strconv.Itoa(n)+" connections streaming", func() bool {
		got := 0
		ts.onLoop(t, func() {
			for _, sc := range ts.conns.list {
				if sc.state == stateStreaming {
					got++
				}
			}
		})
		return got >= n
	})
}

// K = 1, 2 and 64 streams: each event arrives once with its stream's position and every
// stream's cursor, including the streams that have had no event yet (at the head they were
// subscribed at).
func TestMultiStreamComposite(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	pub := connect(t, ts.DSN)
	for _, k := range []int{1, 2, 64} {
		t.Run("K="+strconv.Itoa(k), func(t *testing.T) {
			var streams []string
			for i := range k {
				streams = append(streams, fmt.Sprintf("k%d/s%02d", k, i))
			}
			// With several, the last stream has history before the connection: its entry
			// starts at its head.
			start := make([]int64, k)
			if k > 1 {
				publish(t, pub, streams[k-1], "before", "", nil)
				start[k-1] = 1
			}
			c := dial(t, addr, streamsPath(streams), tok)
			require.Equal(t, 200, c.Status, c.Body)
			assert.Equal(t, "text/event-stream; charset=utf-8", c.Header.Get("Content-Type"))
			m := newMultiReader(t, c, streams, start)
			// One event on every stream, in one transaction, then a second on stream 0.
			pgtest.Exec(t, ts.DSN, fmt.Sprintf(
				"SELECT pgsse.publish('k%d/s' || lpad(g::text, 2, '0'), 'e' || g) FROM generate_series(0, %d) g", k, k-1))
			publish(t, pub, streams[0], "again", "", nil)
			want := make([]int64, k)
			for i := range want {
				want[i] = start[i] + 1
			}
			want[0]++
			m.until(want, 15*time.Second)
			assert.Equal(t, []int64{1, 2}, m.ids[0])
			assert.Equal(t, []string{"e0", "again"}, m.data[0])
			for i := 1; i < k; i++ {
				assert.Equal(t, []int64{want[i]}, m.ids[i], "stream %d", i)
				assert.Equal(t, []string{"e" + strconv.Itoa(i)}, m.data[i], "stream %d", i)
			}
			// The last id says where every stream stands.
			_, last := parseComposite(t, m.lastID, k)
			assert.Equal(t, want, last)
			c.expectSilence(200 * time.Millisecond)
		})
	}
}

// The request's checks (docs/http.md, Several streams on one connection): 1 ≤ K ≤
// --max-streams-per-connection, valid names named once, a composite cursor with one entry per
// stream — each a 400 naming the parameter and the rule; every stream granted, else 403
// naming the first that is not.
func TestMultiStreamRefusals(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", func(c *Config) { c.PublicStreams = []string{"news/*"} })
	addr := ts.Addr().String()
	all := bearerH(allStreams(t))
	ab := bearerH(token(t, auth.Claims{Streams: []string{"a", "b"}}, time.Hour))
	var s65 []string
	for i := range 65 {
		s65 = append(s65, "s"+strconv.Itoa(i))
	}
	for _, tc := range []struct {
		name, target string
		headers      []string
		status       int
		body         string
	}{
		{"no stream", "/streams", []string{all}, 400, "stream: name at least one stream"},
		{"no stream but a token", "/streams?token=x", nil, 400, "stream: name at least one stream"},
		{"65 streams", streamsPath(s65), []string{all}, 400, "stream: 65 streams, but one connection may follow at most 64 (--max-streams-per-connection)"},
		{"a repeated stream", "/streams?stream=a&stream=b&stream=a", []string{all}, 400, "stream[2]: repeats stream[0] (a): name each stream once"},
		{"a bad name", "/streams?stream=a&stream=a%20b", []string{all}, 400, "stream[1]: stream name may contain only"},
		{"comma-separated", "/streams?stream=a,b", []string{all}, 400, "stream[0]: stream name may contain only A-Z a-z 0-9 and . _ : @ / = + ~ - (name one stream per parameter: stream=a&stream=b)"},
		{"an empty name", "/streams?stream=a&stream=", []string{all}, 400, "stream[1]: stream name must be 1-200 bytes"},
		{"a plain number", "/streams?stream=a&stream=b&since=5", []string{all}, 400, "since: cursor has 1 entry but the request names 2 streams"},
		{"too many entries", "/streams?stream=a&stream=b", []string{all, "Last-Event-ID: 1:1,2,3"}, 400, "Last-Event-ID: cursor has 3 entries but the request names 2 streams"},
		{"a bad entry", "/streams?stream=a&stream=b&since=1,x", []string{all}, 400, "since: entry 1 (stream b): cursor must be decimal digits"},
		{"a bad prefix", "/streams?stream=a&stream=b&since=x:1,2", []string{all}, 400, "since: cursor prefix before ':' must be decimal digits"},
		{"an invalid header does not fall back", "/streams?stream=a&stream=b&since=1,2", []string{all, "Last-Event-ID: 7"}, 400, "Last-Event-ID: cursor has 1 entry"},
		{"one stream not granted", "/streams?stream=a&stream=c&stream=b&stream=d", []string{ab}, 403, "token does not grant stream c (stream[1])"},
		{"public streams need no grant", "/streams?stream=news/1&stream=e", []string{ab}, 403, "token does not grant stream e (stream[1])"},
		{"no token for a stream that is not public", "/streams?stream=news/1&stream=a", nil, 401, errNoToken},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := get(t, addr, tc.target, tc.headers...)
			require.Equal(t, tc.status, r.Status, r.Body)
			assert.Contains(t, r.Body, tc.body)
			assertErrorBody(t, r)
		})
	}
	t.Run("methods", func(t *testing.T) {
		r := exchange(t, addr, "POST", request("POST", "/streams?stream=a", all, "Content-Length: 0"))
		assert.Equal(t, 405, r.Status, r.Body)
		assert.Equal(t, "GET, OPTIONS", r.Header.Get("Allow"))
	})
	t.Run("granted and public together", func(t *testing.T) {
		c := dial(t, addr, "/streams?stream=news/1&stream=a&stream=b", ab)
		require.Equal(t, 200, c.Status, c.Body)
		anon := dial(t, addr, "/streams?stream=news/1&stream=news/2")
		require.Equal(t, 200, anon.Status, "public streams alone need no token: %s", anon.Body)
	})
	t.Run("a lower limit", func(t *testing.T) {
		ts2 := startServer(t, "", func(c *Config) { c.MaxStreamsPerConnection = 2 })
		r := get(t, ts2.Addr().String(), "/streams?stream=a&stream=b&stream=c", all)
		require.Equal(t, 400, r.Status)
		assert.Contains(t, r.Body, "stream: 3 streams, but one connection may follow at most 2 (--max-streams-per-connection)")
		c := dial(t, ts2.Addr().String(), "/streams?stream=a&stream=b", all)
		assert.Equal(t, 200, c.Status, c.Body)
	})
}

// Reconnecting with the last composite id a client received resumes every stream exactly
// once, in order — the streams that had no events included (their entry is the head they were
// subscribed at); empty entries start those streams live; the <k>: prefix is optional.
func TestMultiStreamResume(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	pub := connect(t, ts.DSN)
	streams := []string{"r/a", "r/b", "r/quiet", "r/c"}
	publishN(t, pub, "r/c", "old c", 3) // history before the first connection
	c := dial(t, addr, streamsPath(streams), tok)
	require.Equal(t, 200, c.Status, c.Body)
	m := newMultiReader(t, c, streams, []int64{0, 0, 0, 3})
	publish(t, pub, "r/a", "a1", "", nil)
	publish(t, pub, "r/b", "b1", "", nil)
	publish(t, pub, "r/c", "c4", "", nil)
	m.until([]int64{1, 1, 0, 4}, 10*time.Second)
	last := m.lastID
	assert.Equal(t, "3:1,1,0,4", last)
	c.conn.Close()

	// While the client is away: events on every stream, the quiet one's first among them.
	publish(t, pub, "r/a", "a2", "", nil)
	publish(t, pub, "r/quiet", "q1", "", nil)
	publish(t, pub, "r/a", "a3", "", nil)
	publish(t, pub, "r/c", "c5", "", nil)

	for _, tc := range []struct {
		name    string
		headers []string
		query   string
	}{
		{"Last-Event-ID", []string{"Last-Event-ID: " + last}, ""},
		{"since without the prefix", nil, "since=" + neturl.QueryEscape(strings.SplitN(last, ":", 2)[1])},
		{"Last-Event-ID wins over since", []string{"Last-Event-ID: " + last}, "since=0,0,0,0"},
		{"a blank header is absent", []string{"Last-Event-ID: "}, "since=" + neturl.QueryEscape(last)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var extra []string
			if tc.query != "" {
				extra = append(extra, tc.query)
			}
			r := dial(t, addr, streamsPath(streams, extra...), append([]string{tok}, tc.headers...)...)
			require.Equal(t, 200, r.Status, r.Body)
			m := newMultiReader(t, r, streams, []int64{1, 1, 0, 4})
			m.until([]int64{3, 1, 1, 5}, 10*time.Second)
			assert.Equal(t, [][]int64{{2, 3}, nil, {1}, {5}}, m.ids, "each stream exactly once, in order, from its own cursor")
			assert.Equal(t, [][]string{{"a2", "a3"}, nil, {"q1"}, {"c5"}}, m.data)
			r.expectSilence(200 * time.Millisecond)
		})
	}

	t.Run("empty entries are live", func(t *testing.T) {
		// r/a from its head (live), r/b from 0 (everything kept), r/quiet live, r/c after 4.
		r := dial(t, addr, streamsPath(streams, "since=,0,,4"), tok)
		require.Equal(t, 200, r.Status, r.Body)
		m := newMultiReader(t, r, streams, []int64{3, 0, 1, 4})
		m.until([]int64{3, 1, 1, 5}, 10*time.Second)
		assert.Equal(t, [][]int64{nil, {1}, nil, {5}}, m.ids)
		publish(t, pub, "r/a", "a4", "", nil)
		publish(t, pub, "r/quiet", "q2", "", nil)
		m.until([]int64{4, 1, 2, 5}, 10*time.Second)
		assert.Equal(t, [][]int64{{4}, {1}, {2}, {5}}, m.ids, "the empty entries started live: only what came after")
		assert.Equal(t, "2:4,1,2,5", m.lastID)
	})
}

// A pruned range on one stream is one pgsse:gap naming that stream, and the others go on as
// if nothing happened.
func TestMultiStreamGapOnOneStream(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	pub := connect(t, ts.DSN)
	publishN(t, pub, "g/long", "long", 10)
	publishN(t, pub, "g/short", "short", 2)
	pgtest.Exec(t, ts.DSN, "SELECT pgsse.prune('0 seconds', 3)") // g/long keeps 8..10; g/short both
	streams := []string{"g/short", "g/long"}
	c := dial(t, addr, streamsPath(streams, "since=0:1,2"), tok)
	require.Equal(t, 200, c.Status, c.Body)
	m := newMultiReader(t, c, streams, []int64{1, 2})
	m.until([]int64{2, 10}, 10*time.Second)
	assert.Equal(t, []gapEvent{{Stream: "g/long", After: 2, Resume: 7}}, m.gaps, "one gap, naming the stream")
	assert.Equal(t, [][]int64{{2}, {8, 9, 10}}, m.ids)
	publish(t, pub, "g/short", "short3", "", nil)
	publish(t, pub, "g/long", "long11", "", nil)
	m.until([]int64{3, 11}, 10*time.Second)
	assert.Len(t, m.gaps, 1)
	assert.Equal(t, "1:3,11", m.lastID)
}

// Audience filtering is per event, on each stream: a hidden event is skipped silently, live
// and in replay, and the composite id says the stream has moved past it.
func TestMultiStreamAudience(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	pub := connect(t, ts.DSN)
	tok7 := bearerH(allStreams(t, "user:7"))
	streams := []string{"aud/x", "aud/y"}
	publishAll := func() {
		publish(t, pub, "aud/x", "x-all", "", nil)
		publish(t, pub, "aud/x", "x-for8", "", []string{"user:8"})
		publish(t, pub, "aud/y", "y-for7", "", []string{"user:7"})
		publish(t, pub, "aud/y", "y-for9", "", []string{"user:9"})
		publish(t, pub, "aud/x", "x-for7", "", []string{"user:7"})
		publish(t, pub, "aud/y", "y-all", "", nil)
	}
	live := dial(t, addr, streamsPath(streams), tok7)
	require.Equal(t, 200, live.Status, live.Body)
	publishAll()
	for _, tc := range []struct {
		name string
		c    *sseClient
	}{
		{"live", live},
		{"replay", dial(t, addr, streamsPath(streams, "since=0,0"), tok7)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, 200, tc.c.Status)
			m := newMultiReader(t, tc.c, streams, nil)
			m.until([]int64{3, 3}, 10*time.Second)
			assert.Empty(t, m.gaps, "hidden events are not announced")
			assert.Equal(t, [][]int64{{1, 3}, {1, 3}}, m.ids)
			assert.Equal(t, [][]string{{"x-all", "x-for7"}, {"y-for7", "y-all"}}, m.data)
		})
	}
}

// A lagging connection that follows several streams is caught up from the table on every
// one of them — each stream exactly once and in order — with one table read in flight at a
// time for the connection.
func TestMultiStreamLaggingCatchUp(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	streams := []string{"lag/a", "lag/b", "lag/c", "lag/d"}
	slow := dialWith(t, tinyRcvBuf(4096), addr, streamsPath(streams), tok)
	require.Equal(t, 200, slow.Status)
	waitStreaming(t, ts, 1)
	// More than the kernel and the high watermark hold, on every stream, interleaved.
	const perStream, size = 400, 8 << 10
	pub := connect(t, ts.DSN)
	for i := 0; i < perStream; i += 20 {
		_, err := pub.Exec(context.Background(), fmt.Sprintf(
			"SELECT pgsse.publish(s, lpad(g::text, %d, 'x')) FROM generate_series(%d, %d) g, unnest(ARRAY['lag/a','lag/b','lag/c','lag/d']) s",
			size, i+1, i+20)).ReadAll()
		require.NoError(t, err)
	}
	lagged, maxReads := false, 0
	sample := func() {
		ts.onLoop(t, func() {
			for _, sc := range ts.conns.list {
				if sc.subCount() != len(streams) {
					continue
				}
				reads := 0
				for i := range sc.subCount() {
					sub := sc.sub(i)
					lagged = lagged || sub.state == subLagging
					if sub.replaying() {
						reads++
					}
				}
				maxReads = max(maxReads, reads)
			}
		})
	}
	waitFor(t, 15*time.Second, "the connection lagging", func() bool { sample(); return lagged })
	m := newMultiReader(t, slow, streams, nil)
	want := []int64{perStream, perStream, perStream, perStream}
	deadline := time.Now().Add(60 * time.Second)
	for n := 0; ; n++ {
		done := true
		for i := range want {
			done = done && m.at[i] >= want[i]
		}
		if done {
			break
		}
		require.True(t, time.Now().Before(deadline), "caught up to %v of %v", m.at, want)
		m.next(15 * time.Second)
		if n%50 == 0 {
			sample()
		}
	}
	for i := range streams {
		assert.Equal(t, idRange(1, perStream), m.ids[i], "stream %s: every event once, in order", streams[i])
	}
	assert.Empty(t, m.gaps)
	assert.LessOrEqual(t, maxReads, 1, "one table read in flight per connection")
	assert.Positive(t, metricValue(t, ts.metrics.replays), "caught up from the table")
}

// One connection following several streams counts once against --max-connections and
// --max-connections-per-subject.
func TestMultiStreamCountsOnce(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", func(c *Config) { c.MaxConnections = 2; c.MaxConnectionsPerSubject = 1 })
	addr := ts.Addr().String()
	user := func(sub string) string {
		return bearerH(token(t, auth.Claims{Subject: sub, Streams: []string{"*"}}, time.Hour))
	}
	a := dial(t, addr, "/streams?stream=c/1&stream=c/2&stream=c/3", user("u1"))
	require.Equal(t, 200, a.Status)
	waitStreaming(t, ts, 1)
	again := dial(t, addr, "/streams?stream=c/4&stream=c/5", user("u1"))
	require.Equal(t, 200, again.Status)
	ev := again.mustNext(5 * time.Second)
	assert.NotEmpty(t, ev.Retry, "the same subject's second connection is sent away")
	other := dial(t, addr, "/streams?stream=c/1&stream=c/2", user("u2"))
	require.Equal(t, 200, other.Status)
	waitStreaming(t, ts, 2)
	third := get(t, addr, "/streams?stream=c/1", user("u3"))
	assert.Contains(t, third.Body, ":over capacity", "two connections of three streams each are two connections")
	// Both streaming connections still get their events.
	publish(t, connect(t, ts.DSN), "c/2", "x", "", nil)
	assert.Equal(t, "1:0,1,0", a.mustNextData(5*time.Second).IDValue)
	assert.Equal(t, "1:0,1", other.mustNextData(5*time.Second).IDValue)
}
