package e2e

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/internal/testkit/servetest"
)

// crossOriginPage opens `new EventSource(src, {withCredentials: true})` and reports every
// callback to the driver through window.report. It is served from its own origin
// (127.0.0.1 on another port: same site, so a SameSite=Lax cookie for 127.0.0.1 travels,
// but a different origin, so CORS applies).
const crossOriginPage = `<!doctype html>
<html><head><meta charset="utf-8"><title>e2e cross-origin EventSource</title></head><body>
<pre id="log"></pre>
<script>
const q = new URLSearchParams(location.search);
const es = new EventSource(q.get('src'), {withCredentials: true});
window.es = es;
const rep = (o) => { o.t = Date.now(); document.getElementById('log').textContent += JSON.stringify(o) + '\n'; window.report(o); };
es.onopen = () => rep({kind: 'open', readyState: es.readyState});
es.onerror = () => rep({kind: 'error', readyState: es.readyState});
const onEvent = (e) => rep({kind: 'event', type: e.type, data: e.data, lastEventId: e.lastEventId, readyState: es.readyState});
es.onmessage = onEvent;
for (const name of (q.get('events') || '').split(',').filter(Boolean)) es.addEventListener(name, onEvent);
</script></body></html>
`

// pageServer serves crossOriginPage on its own origin and returns that origin.
func pageServer(t *testing.T) string {
	t.Helper()
	ps := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write([]byte(crossOriginPage))
	}))
	t.Cleanup(ps.Close)
	return ps.URL
}

// startChromium launches Debian's Chromium with a fresh --user-data-dir through
// chromium.mjs, watching requests to the pgsse server s.
func startChromium(t *testing.T, s *servetest.Server) *nodeProc {
	t.Helper()
	p := startNode(t, "chromium.mjs", map[string]any{
		"userDataDir": filepath.Join(t.TempDir(), "profile"),
		"watch":       s.URL("/"),
	})
	p.waitFor(60*time.Second, "the browser", func(all []obs) bool { return len(filter(all, "ready")) > 0 })
	return p
}

// openCrossOrigin sets the pgsse_token cookie for the pgsse origin and opens the
// cross-origin page on src.
func openCrossOrigin(t *testing.T, b *nodeProc, s *servetest.Server, pageOrigin, token, src string) {
	t.Helper()
	b.call(map[string]any{"cmd": "cookies", "cookies": []map[string]any{{
		"name": "pgsse_token", "value": token, "url": s.Origin(), "httpOnly": true, "sameSite": "Lax",
	}}})
	b.call(map[string]any{"cmd": "goto", "url": pageOrigin + "/?src=" + url.QueryEscape(src)})
}

func pageReadyState(t *testing.T, b *nodeProc) int {
	t.Helper()
	var rs int
	require.NoError(t, json.Unmarshal(b.call(map[string]any{"cmd": "eval", "expr": "window.es.readyState"}), &rs))
	return rs
}

func idsUpTo(n int) []string {
	var ids []string
	for i := 1; i <= n; i++ {
		ids = append(ids, strconv.Itoa(i))
	}
	return ids
}

func messagesThrough(n int) func([]obs) bool {
	return func(all []obs) bool { return slices.Contains(eventIDs(all, "message"), strconv.Itoa(n)) }
}

// A page on another origin reads a stream with a cookie token and credentials: replayed
// events first, then live ones; an ephemeral event does not move lastEventId.
func TestChromium_CrossOriginCookieReceivesReplayedAndLiveEvents(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	page := pageServer(t)
	s := startServer(t, dsn, "127.0.0.1", "--cors-origins", page)
	token := mintToken(t, "orders/*")
	publishSQL(t, dsn, "orders/7", "first")
	publishSQL(t, dsn, "orders/7", "second")

	b := startChromium(t, s)
	openCrossOrigin(t, b, s, page, token, s.URL("/streams/orders/7?since=0"))
	b.waitFor(10*time.Second, "replayed events 1 and 2", messagesThrough(2))

	publishSQL(t, dsn, "orders/7", "third")
	b.waitFor(5*time.Second, "live event 3", messagesThrough(3))
	publishCLI(t, dsn, "orders/7", "fleeting", "--ephemeral")
	publishSQL(t, dsn, "orders/7", "fourth")
	all := b.waitFor(5*time.Second, "live event 4", messagesThrough(4))

	var datas []string
	var ids []string
	for _, o := range filter(all, "event") {
		datas = append(datas, o.Data)
		ids = append(ids, o.LastEventID)
	}
	assert.Equal(t, []string{"first", "second", "third", "fleeting", "fourth"}, datas)
	// WHATWG: an event without an id: line keeps the last event ID buffer.
	assert.Equal(t, []string{"1", "2", "3", "3", "4"}, ids, "the ephemeral event must not move lastEventId")
	assert.Len(t, filter(all, "open"), 1)
	assert.Empty(t, filter(all, "error"))
	reqs := filter(all, "request")
	require.NotEmpty(t, reqs)
	assert.Contains(t, reqs[0].Headers["cookie"], "pgsse_token=", "the cookie travels with credentials")
	assert.Equal(t, page, reqs[0].Headers["origin"], "the request is cross-origin")
	assert.Equal(t, 1, pageReadyState(t, b))
}

// The browser survives a pgsse restart on its own: it reconnects with Last-Event-ID and
// receives what was published while the server was down exactly once.
func TestChromium_ReconnectsWithLastEventIDAfterRestart(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	page := pageServer(t)
	s := startServer(t, dsn, "127.0.0.1", "--cors-origins", page)
	token := mintToken(t, "room")
	publishSQL(t, dsn, "room", "e1")

	b := startChromium(t, s)
	openCrossOrigin(t, b, s, page, token, s.URL("/streams/room?since=0"))
	b.waitFor(10*time.Second, "event 1", messagesThrough(1))
	publishSQL(t, dsn, "room", "e2")
	b.waitFor(5*time.Second, "event 2", messagesThrough(2))

	s.Stop()
	for i := 3; i <= 5; i++ {
		publishSQL(t, dsn, "room", "e"+strconv.Itoa(i)) // while pgsse is down
	}
	s.Start()

	all := b.waitFor(30*time.Second, "events 3..5 after the restart", messagesThrough(5))
	publishSQL(t, dsn, "room", "e6")
	all = b.waitFor(5*time.Second, "live event 6 after the reconnect", messagesThrough(6))

	assert.Equal(t, idsUpTo(6), eventIDs(all, "message"), "each event exactly once, in order")
	for _, o := range filter(all, "event") {
		assert.Equal(t, "e"+o.LastEventID, o.Data)
	}
	// The reconnect that succeeded carried Last-Event-ID: 2.
	var lastIDs []string
	for _, r := range filter(all, "request") {
		lastIDs = append(lastIDs, r.Headers["last-event-id"])
	}
	require.GreaterOrEqual(t, len(lastIDs), 2, "the browser reconnected by itself")
	assert.Equal(t, "", lastIDs[0])
	assert.Equal(t, "2", lastIDs[len(lastIDs)-1])
	errs := filter(all, "error")
	require.NotEmpty(t, errs, "the restart is visible as an error event")
	for _, e := range errs {
		assert.Equal(t, 0, e.ReadyState, "error while reconnecting must leave CONNECTING, not CLOSED")
	}
	assert.Equal(t, 1, pageReadyState(t, b))
}

// A rejected token (401) closes the EventSource for good: readyState CLOSED and no
// further requests.
func TestChromium_UnauthorizedLeavesEventSourceClosed(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	page := pageServer(t)
	s := startServer(t, dsn, "127.0.0.1", "--cors-origins", page)
	bad := runPGSSE(t, "token", "--jwt-secret", "not-the-server-secret-0123456789abcdef", "--stream", "room")

	b := startChromium(t, s)
	openCrossOrigin(t, b, s, page, bad, s.URL("/streams/room"))
	all := b.waitFor(10*time.Second, "the error event", func(all []obs) bool { return len(filter(all, "error")) > 0 })
	assert.Equal(t, 2, filter(all, "error")[0].ReadyState, "401 must fail the connection (CLOSED)")

	// Chromium's default reconnection time is a few seconds: a reconnect loop would show
	// within this window as more requests at the server.
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		if n := s.Metric(`pgsse_rejected_total{status="401"}`); n > 1 {
			t.Fatalf("the browser retried after 401: %v rejected requests", n)
		}
		time.Sleep(250 * time.Millisecond) // polling the metric: there is no event for "nothing happened"
	}
	assert.Equal(t, 1.0, s.Metric(`pgsse_rejected_total{status="401"}`))
	all, _ = b.snapshot()
	assert.Len(t, filter(all, "request"), 1)
	assert.Empty(t, filter(all, "open"))
	assert.Equal(t, 2, pageReadyState(t, b))
}

// A connection shed over --max-connections (200 + retry: + close) is retried by the
// browser after the retry: delay and succeeds once there is room.
func TestChromium_ShedConnectionReconnectsAfterRetryDelay(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	page := pageServer(t)
	s := startServer(t, dsn, "127.0.0.1", "--cors-origins", page, "--max-connections", "1")
	token := mintToken(t, "room")

	// One connection holds the only slot.
	holder, holderItems := openStream(t, s.URL("/streams/room?token="+token), nil)
	require.Equal(t, http.StatusOK, holder.StatusCode)
	nextItem(t, holderItems, 5*time.Second, "the holder's retry line", func(it sseItem) bool { return it.Kind == "retry" })

	b := startChromium(t, s)
	openCrossOrigin(t, b, s, page, token, s.URL("/streams/room?since=0"))
	all := b.waitFor(10*time.Second, "the shed connection's error", func(all []obs) bool { return len(filter(all, "error")) > 0 })
	shedAt := filter(all, "error")[0].T
	assert.Equal(t, 0, filter(all, "error")[0].ReadyState, "a shed connection must leave the EventSource CONNECTING")
	holder.Body.Close() // make room

	all = b.waitFor(15*time.Second, "a successful reconnect", func(all []obs) bool { return len(filter(all, "open")) >= 2 })
	opens := filter(all, "open")
	require.Len(t, opens, 2, "shed (open, error), then reconnected (open)")
	// Browser clock: from the shed connection's error to the next connection's open.
	wait := time.Duration(opens[1].T-shedAt) * time.Millisecond
	assert.GreaterOrEqual(t, wait, 2000*time.Millisecond, "the browser must wait the retry: delay (2000–10000 ms) before reconnecting")
	assert.LessOrEqual(t, wait, 12*time.Second, "retry: is at most 10000 ms")
	t.Logf("reconnected %s after being shed", wait)

	// Once connected, events flow (the cursor is still since=0 from the URL).
	publishSQL(t, dsn, "room", "after the shed")
	all = b.waitFor(10*time.Second, "event 1 on the reconnected stream", messagesThrough(1))
	assert.Equal(t, []string{"1"}, eventIDs(all, "message"))
	assert.Equal(t, 1, pageReadyState(t, b))
}

// The demo page (--demo) is the first thing a person looks at: opened with ?since=0 it shows
// the history, then live events — unnamed, named (listed in ?events=) and ephemeral — and
// across a pgsse restart the reconnect (with its Last-Event-ID) and the pgsse:gap for events
// pruned meanwhile. The screenshot is kept as e2e/artifacts/demo.png.
func TestChromium_DemoPageShowsEvents(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	s := startServer(t, dsn, "127.0.0.1", "--demo")
	token := mintToken(t, "demo")
	publishSQL(t, dsn, "demo", "hello from SELECT pgsse.publish('demo', …)")
	publishCLI(t, dsn, "demo", "second, from pgsse publish")

	b := startChromium(t, s)
	b.call(map[string]any{"cmd": "goto", "url": s.URL("/?stream=demo&since=0&events=status,order.created&token=" + url.QueryEscape(token))})
	evalString := func(expr string) string {
		var v string
		require.NoError(t, json.Unmarshal(b.call(map[string]any{"cmd": "eval", "expr": expr}), &v))
		return v
	}
	rows := func() string { return evalString("document.getElementById('events-list').innerText") }
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("demo page: %s; state %q, rows:\n%s", what, evalString("document.getElementById('state').textContent"), rows())
			}
			time.Sleep(100 * time.Millisecond) // polling the page: its DOM is the observable
		}
	}
	text := func(id string) string { return evalString("document.getElementById('" + id + "').textContent") }
	waitFor("the history from ?since=0", func() bool { return text("state") == "open" && text("last") == "2" })
	assert.Equal(t, "0", evalString("document.getElementById('since').value"), "the cursor field shows ?since=")

	publishSQL(t, dsn, "demo", "plain")
	pgtest.Exec(t, dsn, "SELECT pgsse.publish('demo', 'out for delivery', event => 'status')")
	publishCLI(t, dsn, "demo", `{"order":42,"status":"created"}`, "--event", "order.created")
	publishCLI(t, dsn, "demo", "typing… (ephemeral, no id)", "--ephemeral")
	waitFor("the named and ephemeral events", func() bool {
		r := rows()
		return text("last") == "5" && strings.Contains(r, "status\tout for delivery") && strings.Contains(r, "typing…")
	})
	assert.Contains(t, rows(), "order.created")
	assert.Contains(t, rows(), "message (no id)")

	// pgsse restarts; meanwhile events 6..8 are published and 6..7 pruned.
	s.Stop()
	waitFor("the reconnecting state", func() bool { return text("state") == "reconnecting" })
	for _, d := range []string{"six", "seven", "eight"} {
		publishSQL(t, dsn, "demo", d)
	}
	pgtest.Exec(t, dsn, "SELECT pgsse.prune(interval '0', keep_last => 1)")
	s.Start()
	waitFor("the reconnect, the gap and event 8", func() bool { return text("state") == "open" && text("last") == "8" })
	r := rows()
	assert.Equal(t, "1", text("reconnects"))
	assert.Contains(t, r, "the browser resumed with Last-Event-ID: 5")
	assert.Contains(t, r, "pgsse:gap\tevents after 5 up to 7 are gone (pruned)")
	assert.NotContains(t, r, "six")

	png := filepath.Join(artifactsDir(t), "demo.png")
	b.call(map[string]any{"cmd": "screenshot", "path": png})
	st, err := os.Stat(png)
	require.NoError(t, err)
	assert.Greater(t, st.Size(), int64(5000), "a screenshot with content")
	t.Logf("demo page screenshot: %s", png)
}

// A page from an origin not in --cors-origins cannot read the stream, even with a valid
// cookie: the browser fails the EventSource and no event reaches the page.
func TestChromium_DisallowedOriginCannotReadStream(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	page := pageServer(t)
	s := startServer(t, dsn, "127.0.0.1", "--cors-origins", "https://app.example")
	token := mintToken(t, "secret")
	publishSQL(t, dsn, "secret", "not for that origin")

	b := startChromium(t, s)
	openCrossOrigin(t, b, s, page, token, s.URL("/streams/secret?since=0"))
	all := b.waitFor(10*time.Second, "the error event", func(all []obs) bool { return len(filter(all, "error")) > 0 })
	assert.Equal(t, 2, filter(all, "error")[0].ReadyState, "a CORS failure is final (CLOSED)")
	assert.Empty(t, filter(all, "event"))
	assert.Empty(t, filter(all, "open"))
	assert.Equal(t, 2, pageReadyState(t, b))
}

// When the token's exp passes the server ends the stream (retry:, close); the browser
// reconnects with the same, now expired, cookie, gets 401 and stays CLOSED.
func TestChromium_ExpiredTokenEndsStreamAndStaysClosed(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	page := pageServer(t)
	s := startServer(t, dsn, "127.0.0.1", "--cors-origins", page)

	b := startChromium(t, s)
	// Minted once the browser is up: starting Chromium under load can take seconds.
	token := runPGSSE(t, "token", "--jwt-secret", testSecret, "--stream", "room", "--ttl", "4s")
	openCrossOrigin(t, b, s, page, token, s.URL("/streams/room"))
	b.waitFor(10*time.Second, "open", func(all []obs) bool { return len(filter(all, "open")) > 0 })
	publishSQL(t, dsn, "room", "before exp")
	b.waitFor(5*time.Second, "event 1", messagesThrough(1))

	all := b.waitFor(20*time.Second, "the final error after exp", func(all []obs) bool {
		errs := filter(all, "error")
		return len(errs) > 0 && errs[len(errs)-1].ReadyState == 2
	})
	errs := filter(all, "error")
	assert.Len(t, errs, 2, "the end of the stream at exp (reconnecting), then the 401 (closed)")
	assert.Equal(t, 0, errs[0].ReadyState)
	assert.Equal(t, 1.0, s.Metric(`pgsse_rejected_total{status="401"}`))
	assert.Equal(t, []string{"1"}, eventIDs(all, "message"))
}
