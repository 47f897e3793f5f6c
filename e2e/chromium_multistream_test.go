package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

// Chromium's own EventSource follows 20 streams over one connection (docs/http.md, Several
// streams on one connection) through the page of docs/http.md, served exactly as written: it
// routes each event to its stream by lastEventId, and when pgsse goes away and comes back the
// browser reconnects by itself with the last composite id, and every stream — the ones that had
// no event before the drop included — resumes exactly once, in order.
func TestChromium_FollowsTwentyStreamsOnOneConnectionAndResumes(t *testing.T) {
	t.Parallel()
	page := docsBlock(t, "docs/http.md", "html browser-streams")
	ps := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = io.WriteString(w, page)
	}))
	t.Cleanup(ps.Close)

	dsn := newDatabase(t)
	s := startServer(t, dsn, "127.0.0.1", "--cors-origins", ps.URL)
	token := mintToken(t, "room/*")
	const k = 20
	var streams []string
	for i := range k {
		streams = append(streams, fmt.Sprintf("room/%02d", i))
	}
	// The first five streams have history: the page starts live, at their heads.
	pgtest.Exec(t, dsn, "SELECT pgsse.publish('room/' || lpad(g::text, 2, '0'), 'history') FROM generate_series(0, 4) g")

	b := startChromium(t, s)
	b.call(map[string]any{"cmd": "goto", "url": ps.URL + "/?pgsse=" + url.QueryEscape(s.Origin()) +
		"&streams=" + url.QueryEscape(strings.Join(streams, ",")) + "&token=" + url.QueryEscape(token)})
	eval := func(expr string, v any) {
		t.Helper()
		require.NoError(t, json.Unmarshal(b.call(map[string]any{"cmd": "eval", "expr": expr}), v))
	}
	waitPage := func(what string, cond func(lines []string) bool) []string {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			var text string
			eval("document.getElementById('events').innerText", &text)
			lines := strings.Split(strings.TrimSpace(text), "\n")
			if cond(lines) {
				return lines
			}
			if time.Now().After(deadline) {
				t.Fatalf("streams page: %s; lines:\n%s", what, text)
			}
			time.Sleep(100 * time.Millisecond) // polling the page: its DOM is the observable
		}
	}
	waitOpen := func() {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			var rs int
			eval("es.readyState", &rs)
			if rs == 1 {
				return
			}
			require.True(t, time.Now().Before(deadline), "the EventSource did not open")
			time.Sleep(50 * time.Millisecond) // polling the page: readyState has no event we can wait on from here
		}
	}
	waitOpen()

	// Before the drop: one event on each of the first 15 streams, in one transaction, and an
	// ephemeral one; the last five stay quiet.
	pgtest.Exec(t, dsn, "SELECT pgsse.publish('room/' || lpad(g::text, 2, '0'), 'one-' || g) FROM generate_series(0, 14) g")
	publishCLI(t, dsn, "room/03", `{"stream":"room/03","typing":true}`, "--ephemeral")
	waitPage("the first round and the ephemeral event", func(lines []string) bool { return len(lines) >= 16 })

	// pgsse goes away; meanwhile two events on every stream.
	s.Stop()
	pgtest.Exec(t, dsn, "SELECT pgsse.publish('room/' || lpad(g::text, 2, '0'), 'two-' || g || '-' || n) FROM generate_series(0, 19) g, generate_series(1, 2) n ORDER BY n, g")
	s.Start()
	waitOpen()
	pgtest.Exec(t, dsn, "SELECT pgsse.publish('room/19', 'live after the reconnect')")
	lines := waitPage("every stream resumed, then a live event", func(lines []string) bool {
		return strings.Contains(lines[len(lines)-1], "live after the reconnect")
	})

	// Per stream: the ids the page showed, in order, and their data.
	line := regexp.MustCompile(`^(room/\d\d) #(\d+) message: (.*)$`)
	ids := map[string][]int64{}
	data := map[string][]string{}
	ephemeral := 0
	for _, l := range lines {
		if strings.HasPrefix(l, "(ephemeral) ") {
			ephemeral++
			assert.Contains(t, l, `"stream":"room/03"`, "an ephemeral event names its stream in its data")
			continue
		}
		m := line.FindStringSubmatch(l)
		require.NotNil(t, m, "line %q", l)
		id, _ := strconv.ParseInt(m[2], 10, 64)
		ids[m[1]] = append(ids[m[1]], id)
		data[m[1]] = append(data[m[1]], m[3])
	}
	assert.Equal(t, 1, ephemeral)
	for i, st := range streams {
		var want []int64
		var wantData []string
		first := int64(1)
		if i < 5 {
			first = 2 // after its history
		}
		next := first
		if i < 15 {
			want, wantData = append(want, next), append(wantData, "one-"+strconv.Itoa(i))
			next++
		}
		for n := 1; n <= 2; n++ {
			want, wantData = append(want, next), append(wantData, fmt.Sprintf("two-%d-%d", i, n))
			next++
		}
		if i == 19 {
			want, wantData = append(want, next), append(wantData, "live after the reconnect")
		}
		assert.Equal(t, want, ids[st], "%s: every event exactly once, in order", st)
		assert.Equal(t, wantData, data[st], st)
	}

	// One connection at a time, and the browser's own reconnect carried the composite id of
	// the last durable event it had: twenty entries.
	all, _ := b.snapshot()
	var lastIDs []string
	for _, r := range filter(all, "request") {
		if strings.Contains(r.URL, "/streams?") {
			lastIDs = append(lastIDs, r.Headers["last-event-id"])
		}
	}
	require.GreaterOrEqual(t, len(lastIDs), 2, "the browser reconnected by itself")
	assert.Equal(t, "", lastIDs[0])
	resumed := lastIDs[len(lastIDs)-1]
	pos, entries, ok := strings.Cut(resumed, ":")
	require.True(t, ok, "Last-Event-ID %q is composite", resumed)
	assert.Len(t, strings.Split(entries, ","), k, "one entry per stream: %q", resumed)
	assert.Equal(t, "14", pos, "the last event before the drop was room/14's")
	assert.Equal(t, "2,2,2,2,2,1,1,1,1,1,1,1,1,1,1,0,0,0,0,0", entries,
		"where each stream stood: the ones with history after it, the quiet ones at their head")
	var es int
	eval("es.readyState", &es)
	assert.Equal(t, 1, es)
	b.call(map[string]any{"cmd": "screenshot", "path": filepath.Join(artifactsDir(t), "docs-browser-streams.png")})
}

// The demo page (--demo) follows several streams over one connection when given several,
// comma-separated: each row names the stream its composite id says.
func TestChromium_DemoPageFollowsSeveralStreams(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	s := startServer(t, dsn, "127.0.0.1", "--demo")
	token := mintToken(t, "demo*")
	publishSQL(t, dsn, "demo", "first of demo")
	publishSQL(t, dsn, "demo/2", "first of demo/2")

	b := startChromium(t, s)
	b.call(map[string]any{"cmd": "goto", "url": s.URL("/?stream=demo,demo/2&since=0,0&token=" + url.QueryEscape(token))})
	text := func(expr string) string {
		var v string
		require.NoError(t, json.Unmarshal(b.call(map[string]any{"cmd": "eval", "expr": expr}), &v))
		return v
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(text("document.getElementById('events-list').innerText"), "first of demo/2") ||
		!strings.Contains(text("document.getElementById('events-list').innerText"), "first of demo\n") {
		require.True(t, time.Now().Before(deadline), "rows: %s", text("document.getElementById('events-list').innerText"))
		time.Sleep(100 * time.Millisecond) // polling the page: its DOM is the observable
	}
	publishSQL(t, dsn, "demo/2", "second of demo/2")
	for !strings.Contains(text("document.getElementById('events-list').innerText"), "second of demo/2") {
		require.True(t, time.Now().Before(deadline), "rows: %s", text("document.getElementById('events-list').innerText"))
		time.Sleep(100 * time.Millisecond) // polling the page: its DOM is the observable
	}
	rows := text("document.getElementById('events-list').innerText")
	assert.Regexp(t, `2\tdemo/2\tmessage\tsecond of demo/2`, rows, "the event's own id and its stream")
	assert.Regexp(t, `1\tdemo\tmessage\tfirst of demo`, rows)
	assert.Contains(t, rows, "subscribed to demo, demo/2 on one connection")
	assert.Equal(t, "1:1,2", text("document.getElementById('last').textContent"))
	assert.Contains(t, text("document.getElementById('url').textContent"), "GET /streams?stream=demo&stream=demo%2F2&since=0%2C0")
}
