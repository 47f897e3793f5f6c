package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/internal/testkit/servetest"
)

// The pages and SQL of docs/frameworks.md (Hotwire Turbo, htmx) and of clients/js/README.md, as
// written, in Chromium: events published in SQL update the DOM, user text arrives escaped, an
// audience reaches only its tag, and with pgsse.js two tabs share one connection. Each test
// saves a screenshot in e2e/artifacts/.

// docsPage is a page block of a Markdown file with pgsse's example address replaced by s's
// and the example token by token.
func docsPage(t *testing.T, file, info string, s *servetest.Server, token string) string {
	t.Helper()
	page := docsBlock(t, file, info)
	require.Contains(t, page, "https://rt.example.com", "%s: the example names pgsse as https://rt.example.com", info)
	page = strings.ReplaceAll(page, "https://rt.example.com", s.Origin())
	return strings.ReplaceAll(page, "TOKEN", token)
}

// domText evaluates a DOM expression returning a string in tab page.
func domText(t *testing.T, b *nodeProc, page int, expr string) string {
	t.Helper()
	var v string
	require.NoError(t, json.Unmarshal(b.call(map[string]any{"cmd": "eval", "expr": expr, "page": page}), &v))
	return v
}

// waitDOM polls tab page until expr (a string expression) satisfies cond: the DOM is what
// the frameworks change, and nothing signals the change.
func waitDOM(t *testing.T, b *nodeProc, page int, what, expr string, cond func(string) bool) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		v := domText(t, b, page, expr)
		if cond(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("tab %d: %s; %s is %q", page, what, expr, v)
		}
		time.Sleep(100 * time.Millisecond) // polling the page: its DOM is the observable
	}
}

// streamOpen waits until pgsse answered an EventSource request for path with 200: pgsse writes
// the response head only once the subscription is live, so what is published next reaches it.
func streamOpen(t *testing.T, b *nodeProc, path string, n int) {
	t.Helper()
	b.waitFor(60*time.Second, "the stream "+path+" open", func(all []obs) bool {
		open := 0
		for _, o := range filter(all, "response") {
			if strings.Contains(o.URL, path) && o.Status == 200 {
				open++
			}
		}
		return open >= n
	})
}

// screenshot saves tab page as e2e/artifacts/name.
func screenshot(t *testing.T, b *nodeProc, page int, name string) {
	t.Helper()
	png := filepath.Join(artifactsDir(t), name)
	b.call(map[string]any{"cmd": "screenshot", "path": png, "page": page})
	st, err := os.Stat(png)
	require.NoError(t, err)
	assert.Greater(t, st.Size(), int64(3000), "a screenshot with content")
	t.Logf("screenshot: %s", png)
}

const escapedMessage = `Ada: is 2 < 3? <script>alert("hi")</script>`

const messagesText = "[...document.querySelectorAll('#messages li')].map((li) => li.textContent).join('\\n')"

// docs/frameworks.md's Turbo page: <turbo-stream-source> appends the escaped message
// published in SQL, an update for the page's user (audience user:7) arrives, one for another
// user does not.
func TestFrameworks_TurboStreamSource(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	ps := startClientPages(t)
	s := startServer(t, dsn, "127.0.0.1", "--cors-origins", ps.URL)
	token := runPGSSE(t, "token", "--jwt-secret", testSecret, "--stream", "board/*", "--tag", "user:7", "--ttl", "1h")
	ps.setPage("/turbo", docsPage(t, "docs/frameworks.md", "html turbo-example", s, token))

	b := startChromium(t, s)
	b.call(map[string]any{"cmd": "goto", "url": ps.URL + "/turbo"})
	streamOpen(t, b, "/streams/board/1", 1)

	pgtest.Exec(t, dsn, docsBlock(t, "docs/frameworks.md", "sql html-escape"))
	pgtest.Exec(t, dsn, docsBlock(t, "docs/frameworks.md", "sql turbo-publish"))
	waitDOM(t, b, 0, "the appended message", messagesText, func(v string) bool { return v != "" })
	assert.Equal(t, escapedMessage, domText(t, b, 0, messagesText), "the user's text, shown as text")
	assert.Equal(t, "0", domText(t, b, 0, "String(document.querySelectorAll('#messages script').length)"), "no script element from the user's text")

	pgtest.Exec(t, dsn, `SELECT pgsse.publish('board/1', '<turbo-stream action="update" target="notice"><template>for user 8</template></turbo-stream>', audience => ARRAY['user:8'])`)
	pgtest.Exec(t, dsn, docsBlock(t, "docs/frameworks.md", "sql turbo-audience"))
	notice := waitDOM(t, b, 0, "the notice for user 7", "document.getElementById('notice').textContent", func(v string) bool { return v != "" })
	assert.Equal(t, "Only user 7 sees this", notice, "the event for user 8 (published first) never arrived")
	screenshot(t, b, 0, "turbo.png")
}

// docs/frameworks.md's htmx page: sse-swap="message" appends the escaped fragment,
// sse-swap="status" replaces the status with the event published as event => 'status'.
func TestFrameworks_HtmxSSE(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	ps := startClientPages(t)
	s := startServer(t, dsn, "127.0.0.1", "--cors-origins", ps.URL)
	token := mintToken(t, "board/*")
	ps.setPage("/htmx", docsPage(t, "docs/frameworks.md", "html htmx-example", s, token))

	b := startChromium(t, s)
	b.call(map[string]any{"cmd": "goto", "url": ps.URL + "/htmx"})
	streamOpen(t, b, "/streams/board/1", 1)

	pgtest.Exec(t, dsn, docsBlock(t, "docs/frameworks.md", "sql html-escape"))
	pgtest.Exec(t, dsn, docsBlock(t, "docs/frameworks.md", "sql htmx-publish"))
	waitDOM(t, b, 0, "the status", "document.getElementById('status').textContent", func(v string) bool { return v == "shipped" })
	assert.Equal(t, escapedMessage, domText(t, b, 0, messagesText), "the fragment appended, the user's text shown as text")
	assert.Equal(t, "0", domText(t, b, 0, "String(document.querySelectorAll('#messages script').length)"))
	all, _ := b.snapshot()
	reqs := streamObs(all, "request")
	require.NotEmpty(t, reqs)
	assert.Equal(t, ps.URL, reqs[0].Headers["origin"], "htmx's EventSource is cross-origin, with credentials")
	screenshot(t, b, 0, "htmx.png")
}

// sharedTabs opens the page at path in two tabs of one browser, publishes the SQL blocks and
// waits until both tabs show them (check reads one tab); pgsse holds one connection for both.
func sharedTabs(t *testing.T, s *servetest.Server, b *nodeProc, ps *clientPages, path, dsn string, sql []string, check func(tab int)) {
	t.Helper()
	tabs := openTabs(t, b, 2, ps.URL+path)
	// The holder's connection is live once pgsse answered it; the other tab is waiting for it.
	streamOpen(t, b, "/streams/board/1", 1)
	for _, q := range sql {
		pgtest.Exec(t, dsn, q)
	}
	for _, tab := range tabs {
		check(tab)
	}
	assert.Equal(t, 1.0, s.Metric("pgsse_sse_connections"), "two tabs, one connection")
	all, _ := b.snapshot()
	assert.Len(t, streamObs(all, "request"), 1, "one EventSource request from the whole browser")
	assert.Empty(t, filter(all, "pageerror"))
}

// docs/frameworks.md's Turbo page with pgsse.js: Turbo.connectStreamSource(subscribe(…)) in two
// tabs, one connection.
func TestFrameworks_TurboWithBrowserClient(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	ps := startClientPages(t)
	s := startServer(t, dsn, "127.0.0.1", "--cors-origins", ps.URL)
	ps.setAppToken("stream=board/*&tag=user:7&ttl=1h")
	ps.setPage("/turbo-shared", docsPage(t, "docs/frameworks.md", "html turbo-shared-example", s, ""))

	b := startChromium(t, s)
	sql := []string{
		docsBlock(t, "docs/frameworks.md", "sql html-escape"),
		docsBlock(t, "docs/frameworks.md", "sql turbo-publish"),
		docsBlock(t, "docs/frameworks.md", "sql turbo-audience"),
	}
	sharedTabs(t, s, b, ps, "/turbo-shared", dsn, sql, func(tab int) {
		waitDOM(t, b, tab, "the notice", "document.getElementById('notice').textContent", func(v string) bool { return v != "" })
		assert.Equal(t, escapedMessage, domText(t, b, tab, messagesText), "tab %d", tab)
	})
	screenshot(t, b, 1, "turbo-shared.png")
}

// docs/frameworks.md's htmx page with pgsse.js as htmx.createEventSource, in two tabs, one
// connection; the named event reaches the follower tab too (it asked the holder to listen).
func TestFrameworks_HtmxWithBrowserClient(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	ps := startClientPages(t)
	s := startServer(t, dsn, "127.0.0.1", "--cors-origins", ps.URL)
	ps.setAppToken("stream=board/*&ttl=1h")
	ps.setPage("/htmx-shared", docsPage(t, "docs/frameworks.md", "html htmx-shared-example", s, ""))

	b := startChromium(t, s)
	sql := []string{
		docsBlock(t, "docs/frameworks.md", "sql html-escape"),
		docsBlock(t, "docs/frameworks.md", "sql htmx-publish"),
	}
	sharedTabs(t, s, b, ps, "/htmx-shared", dsn, sql, func(tab int) {
		waitDOM(t, b, tab, "the status", "document.getElementById('status').textContent", func(v string) bool { return v == "shipped" })
		assert.Equal(t, escapedMessage, domText(t, b, tab, messagesText), "tab %d", tab)
	})
	screenshot(t, b, 1, "htmx-shared.png")
}

// clients/js/README.md's page, in two tabs: both list the events of both streams, one
// connection.
func TestFrameworks_BrowserClientReadmePage(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	ps := startClientPages(t)
	s := startServer(t, dsn, "127.0.0.1", "--cors-origins", ps.URL)
	ps.setAppToken("stream=orders/*&stream=chat/*&ttl=1h")
	ps.setPage("/orders", docsPage(t, "clients/js/README.md", "html client-example", s, ""))

	b := startChromium(t, s)
	tabs := openTabs(t, b, 2, ps.URL+"/orders")
	streamOpen(t, b, "/streams", 1)
	publishSQL(t, dsn, "orders/42", "created")
	pgtest.Exec(t, dsn, "SELECT pgsse.publish('chat/7', 'hello', event => 'status')")
	publishSQL(t, dsn, "orders/42", "paid")
	for _, tab := range tabs {
		v := waitDOM(t, b, tab, "three events", "document.getElementById('events').innerText", func(v string) bool { return strings.Count(v, "\n") >= 2 })
		assert.Equal(t, "orders/42 #1 message: created\nchat/7 #1 status: hello\norders/42 #2 message: paid", strings.TrimSpace(v), "tab %d", tab)
	}
	assert.Equal(t, 1.0, s.Metric("pgsse_sse_connections"), "two tabs, one connection")
	screenshot(t, b, 0, "client-readme.png")
}
