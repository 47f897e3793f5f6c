package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/internal/testkit"
	"github.com/pgsse/pgsse/internal/testkit/servetest"
)

// The browser client (clients/js/pgsse.js, served by pgsse at /pgsse.js) in Chromium: tabs of
// one origin share one connection, a closed holder tab is replaced by another without losing
// or repeating an event, a short-lived token is refreshed before the server would end the
// stream. Each test runs with one stream (GET /streams/{s}) and with three on one connection
// (GET /streams?stream=…, SPEC §3c, composite ids).

// clientTabPage loads the client from pgsse (?pgsse=) like an application page would, follows
// ?streams= (comma-separated) with ?token= or, with ?tokenURL=, a token function fetching a
// fresh one each time, and reports every callback through window.report. ?without=locks or
// ?without=broadcast takes Web Locks or BroadcastChannel away first, as in a browser without
// them; ?share=false passes share: false.
const clientTabPage = `<!doctype html>
<html><head><meta charset="utf-8"><title>pgsse client tab</title></head><body>
<script type="module">
const q = new URLSearchParams(location.search);
if (q.get('without') === 'locks') Object.defineProperty(Navigator.prototype, 'locks', { get: () => undefined, configurable: true });
if (q.get('without') === 'broadcast') window.BroadcastChannel = undefined;
const { subscribe } = await import(q.get('pgsse') + '/pgsse.js');
const opts = { url: q.get('pgsse'), streams: q.get('streams').split(','), events: ['status'] };
if (q.get('share') === 'false') opts.share = false;
if (q.get('tokenURL')) {
  opts.token = async () => {
    const r = await fetch(q.get('tokenURL'), { cache: 'no-store' });
    if (!r.ok) throw new Error('token endpoint answered ' + r.status);
    return r.text();
  };
} else if (q.get('token')) {
  opts.token = q.get('token');
}
const sub = subscribe(opts);
window.sub = sub;
const rep = (o) => {
  o.t = Date.now();
  o.role = sub.role;
  o.readyState = sub.readyState;
  window.report(o);
};
const onEvent = (e) => rep({ kind: 'client-event', type: e.type, stream: e.stream, seq: e.id, data: e.data, lastEventId: e.lastEventId });
sub.addEventListener('message', onEvent);
sub.addEventListener('status', onEvent);
sub.addEventListener('pgsse:gap', (e) => rep({ kind: 'client-gap', stream: e.stream, data: e.data }));
sub.addEventListener('statechange', () => rep({ kind: 'client-state' }));
sub.addEventListener('open', () => rep({ kind: 'client-open' }));
sub.addEventListener('error', (e) => rep({ kind: 'client-error', message: e.message || '' }));
</script></body></html>
`

// clientPages is the application's origin in these tests: the tab page, token endpoints (the
// application's backend minting tokens), the frameworks' files and pages set with setPage.
type clientPages struct {
	*httptest.Server
	tokens atomic.Int64 // tokens minted by /token and /pgsse-token

	mu       sync.Mutex
	pages    map[string]string // path → HTML
	appToken string            // what /pgsse-token mints: a /token query
}

// setPage serves html at path.
func (ps *clientPages) setPage(path, html string) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.pages[path] = html
}

// setAppToken makes /pgsse-token (the token function of the documented pages) mint what
// /token?query does.
func (ps *clientPages) setAppToken(query string) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.appToken = query
}

func startClientPages(t *testing.T) *clientPages {
	t.Helper()
	ps := &clientPages{pages: map[string]string{}}
	ps.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		ps.mu.Lock()
		page, isPage := ps.pages[r.URL.Path]
		appToken := ps.appToken
		ps.mu.Unlock()
		query := r.URL.Query()
		if r.URL.Path == "/pgsse-token" {
			var err error
			if query, err = url.ParseQuery(appToken); err != nil || appToken == "" {
				http.Error(w, "no token configured", http.StatusInternalServerError)
				return
			}
		}
		switch {
		case isPage:
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_, _ = w.Write([]byte(page))
		case r.URL.Path == "/tab":
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_, _ = w.Write([]byte(clientTabPage))
		case r.URL.Path == "/token", r.URL.Path == "/pgsse-token":
			// ?stream=P (repeatable), ?ttl=5s, ?tag=T (repeatable)
			ttl, err := time.ParseDuration(query.Get("ttl"))
			if err != nil {
				http.Error(w, "ttl: "+err.Error(), http.StatusBadRequest)
				return
			}
			tok, err := auth.Mint(auth.MintKey{Secret: []byte(testSecret)},
				auth.Claims{Streams: query["stream"], Tags: query["tag"]}, ttl, "", "", time.Now())
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			ps.tokens.Add(1)
			w.Header().Set("Content-Type", "text/plain")
			_, _ = w.Write([]byte(tok))
		case strings.HasPrefix(r.URL.Path, "/js/"):
			// The frameworks' files, from the locked npm packages in e2e/js.
			files := map[string]string{
				"/js/turbo.es2017-esm.js": "@hotwired/turbo/dist/turbo.es2017-esm.js",
				"/js/htmx.min.js":         "htmx.org/dist/htmx.min.js",
				"/js/sse.js":              "htmx-ext-sse/sse.js",
			}
			f, ok := files[r.URL.Path]
			if !ok {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
			http.ServeFile(w, r, filepath.Join(jsDir, "node_modules", f))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(ps.Close)
	return ps
}

// tabURL is the tab page following streams on s with a fixed token, or, when tokenQuery is not
// empty, with a token function fetching /token?tokenQuery.
func (ps *clientPages) tabURL(s *servetest.Server, streams []string, token, tokenQuery string) string {
	q := url.Values{"pgsse": {s.Origin()}, "streams": {strings.Join(streams, ",")}}
	if tokenQuery != "" {
		q.Set("tokenURL", ps.URL+"/token?"+tokenQuery)
	} else {
		q.Set("token", token)
	}
	return ps.URL + "/tab?" + q.Encode()
}

// openTabs opens n tabs of one browser context on pageURL (tab 0 is the one chromium.mjs
// starts with) and returns their numbers.
func openTabs(t *testing.T, b *nodeProc, n int, pageURL string) []int {
	t.Helper()
	tabs := []int{0}
	for len(tabs) < n {
		var i int
		require.NoError(t, json.Unmarshal(b.call(map[string]any{"cmd": "newPage"}), &i))
		tabs = append(tabs, i)
	}
	for _, i := range tabs {
		b.call(map[string]any{"cmd": "goto", "url": pageURL, "page": i})
	}
	return tabs
}

// tabEvents is what the client delivered to each tab: for every tab, every stream's event
// ids in the order they arrived, as "id:data".
func tabEvents(all []obs) map[int]map[string][]string {
	got := map[int]map[string][]string{}
	for _, o := range filter(all, "client-event") {
		if got[o.Page] == nil {
			got[o.Page] = map[string][]string{}
		}
		got[o.Page][o.Stream] = append(got[o.Page][o.Stream], o.Seq+":"+o.Data)
	}
	return got
}

// wantEvents is every stream's events 1..n as published by publishRounds.
func wantEvents(streams []string, n int) map[string][]string {
	want := map[string][]string{}
	for _, s := range streams {
		for i := 1; i <= n; i++ {
			want[s] = append(want[s], fmt.Sprintf("%d:%s #%d", i, s, i))
		}
	}
	return want
}

// allTabsHave reports whether each of tabs has received at least n events of every stream.
func allTabsHave(tabs []int, streams []string, n int) func([]obs) bool {
	return func(all []obs) bool {
		got := tabEvents(all)
		for _, tab := range tabs {
			for _, s := range streams {
				if len(got[tab][s]) < n {
					return false
				}
			}
		}
		return true
	}
}

// tabsOpen waits until every tab's subscription is open, and returns the holder's number.
func tabsOpen(t *testing.T, b *nodeProc, tabs []int) int {
	t.Helper()
	all := b.waitFor(60*time.Second, fmt.Sprintf("%d tabs open", len(tabs)), func(all []obs) bool {
		open := map[int]bool{}
		for _, o := range filter(all, "client-open") {
			open[o.Page] = true
		}
		return len(open) == len(tabs)
	})
	holders := map[int]bool{}
	for _, o := range filter(all, "client-state") {
		if o.Role == "holder" {
			holders[o.Page] = true
		}
	}
	require.Len(t, holders, 1, "exactly one tab holds the connection")
	for h := range holders {
		return h
	}
	return -1
}

// streamRequests lists the EventSource requests the browser made to pgsse (every tab's).
func streamRequests(all []obs) []obs { return streamObs(all, "request") }

// streamObs lists the observations of one kind (request, requestfinished, …) about
// EventSource requests to pgsse.
func streamObs(all []obs, kind string) []obs {
	var r []obs
	for _, o := range filter(all, kind) {
		if strings.Contains(o.URL, "/streams") {
			r = append(r, o)
		}
	}
	return r
}

// publishRounds publishes, n times, one event to each stream in turn ("s #i"), every interval,
// on one PostgreSQL session; after each event it sends the number published so far on
// progress (buffered for all of them). It returns once all are published or ctx ends.
func publishRounds(ctx context.Context, dsn string, streams []string, n int, interval time.Duration, progress chan<- int) error {
	conn, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	tick := time.NewTicker(interval)
	defer tick.Stop()
	done := 0
	for i := 1; i <= n; i++ {
		for _, s := range streams {
			if _, err := conn.Exec(ctx, "SELECT pgsse.publish("+sqlQuote(s)+", "+sqlQuote(fmt.Sprintf("%s #%d", s, i))+")").ReadAll(); err != nil {
				return err
			}
			done++
			progress <- done
			select {
			case <-tick.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

var clientCases = []struct {
	name    string
	streams []string
}{
	{"one stream", []string{"room/a"}},
	{"three streams", []string{"room/a", "room/b", "room/c"}},
}

// Five tabs of one origin following the same streams hold one SSE connection at the server
// (pgsse_sse_connections), made by one tab; every tab receives every event once, in order.
func TestBrowserClient_FiveTabsShareOneConnection(t *testing.T) {
	t.Parallel()
	for _, tc := range clientCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dsn := newDatabase(t)
			ps := startClientPages(t)
			s := startServer(t, dsn, "127.0.0.1", "--cors-origins", ps.URL)
			b := startChromium(t, s)
			tabs := openTabs(t, b, 5, ps.tabURL(s, tc.streams, mintToken(t, "room/*"), ""))
			holder := tabsOpen(t, b, tabs)
			assert.Equal(t, 1.0, s.Metric("pgsse_sse_connections"), "five tabs, one connection")

			const n = 10
			for i := 1; i <= n; i++ {
				for _, st := range tc.streams {
					publishSQL(t, dsn, st, fmt.Sprintf("%s #%d", st, i))
				}
			}
			all := b.waitFor(60*time.Second, "every event in every tab", allTabsHave(tabs, tc.streams, n))
			got := tabEvents(all)
			want := wantEvents(tc.streams, n)
			for _, tab := range tabs {
				assert.Equal(t, want, got[tab], "tab %d (the holder is tab %d): every event once, in order", tab, holder)
			}
			assert.Equal(t, 1.0, s.Metric("pgsse_sse_connections"))
			reqs := streamRequests(all)
			assert.Len(t, reqs, 1, "one EventSource request from the whole browser: %v", reqs)
			assert.Empty(t, filter(all, "client-error"))
			assert.Empty(t, filter(all, "pageerror"))
		})
	}
}

// Without Web Locks or BroadcastChannel, or with share: false, each tab connects on its own
// (role "alone"): as many connections at the server as tabs, and every tab still receives
// every event once, in order.
func TestBrowserClient_WithoutSharingEachTabConnects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, query string }{
		{"no Web Locks", "without=locks"},
		{"no BroadcastChannel", "without=broadcast"},
		{"share false", "share=false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			streams := []string{"room/a"}
			dsn := newDatabase(t)
			ps := startClientPages(t)
			s := startServer(t, dsn, "127.0.0.1", "--cors-origins", ps.URL)
			b := startChromium(t, s)
			const nTabs = 3
			tabs := openTabs(t, b, nTabs, ps.tabURL(s, streams, mintToken(t, "room/*"), "")+"&"+tc.query)
			all := b.waitFor(60*time.Second, fmt.Sprintf("%d tabs open", nTabs), func(all []obs) bool {
				open := map[int]bool{}
				for _, o := range filter(all, "client-open") {
					open[o.Page] = true
				}
				return len(open) == nTabs
			})
			roles := map[int][]string{}
			for _, o := range filter(all, "client-state") {
				roles[o.Page] = append(roles[o.Page], o.Role)
			}
			for _, tab := range tabs {
				require.NotEmpty(t, roles[tab], "tab %d reported its role", tab)
				for _, r := range roles[tab] {
					assert.Equal(t, "alone", r, "tab %d connects on its own", tab)
				}
			}
			testkit.WaitFor(t, 15*time.Second, "pgsse_sse_connections "+fmt.Sprint(nTabs), func() bool { return s.Metric("pgsse_sse_connections") == nTabs })

			const n = 10
			for i := 1; i <= n; i++ {
				publishSQL(t, dsn, streams[0], fmt.Sprintf("%s #%d", streams[0], i))
			}
			all = b.waitFor(60*time.Second, "every event in every tab", allTabsHave(tabs, streams, n))
			got := tabEvents(all)
			for _, tab := range tabs {
				assert.Equal(t, wantEvents(streams, n), got[tab], "tab %d: every event once, in order", tab)
			}
			assert.Len(t, streamRequests(all), nTabs, "one EventSource request per tab")
			assert.Empty(t, filter(all, "client-error"))
			assert.Empty(t, filter(all, "pageerror"))
		})
	}
}

// Closing the tab that holds the connection while events are being published: another tab
// takes over within 2 s, from the cursors it saw relayed, and each remaining tab still has
// every event once, in order.
func TestBrowserClient_HolderTabClosedAnotherTakesOver(t *testing.T) {
	t.Parallel()
	for _, tc := range clientCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dsn := newDatabase(t)
			ps := startClientPages(t)
			s := startServer(t, dsn, "127.0.0.1", "--cors-origins", ps.URL)
			b := startChromium(t, s)
			tabs := openTabs(t, b, 5, ps.tabURL(s, tc.streams, mintToken(t, "room/*"), ""))
			holder := tabsOpen(t, b, tabs)

			// 90 events, one every 40 ms; the holder tab is closed after the first third.
			const total = 90
			n := total / len(tc.streams)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			progress := make(chan int, total)
			published := make(chan error, 1)
			go func() { published <- publishRounds(ctx, dsn, tc.streams, n, 40*time.Millisecond, progress) }()
			for done := 0; done < total/3; {
				select {
				case done = <-progress:
				case err := <-published:
					require.NoError(t, err)
				}
			}
			closedAt := time.Now()
			b.call(map[string]any{"cmd": "closePage", "page": holder})
			var rest []int
			for _, tab := range tabs {
				if tab != holder {
					rest = append(rest, tab)
				}
			}
			newHolder := func(all []obs) (obs, bool) {
				for _, o := range filter(all, "client-open") {
					if o.Page != holder && o.Role == "holder" && o.At.After(closedAt) {
						return o, true
					}
				}
				return obs{}, false
			}
			all := b.waitFor(30*time.Second, "a new holder's open connection", func(all []obs) bool {
				_, ok := newHolder(all)
				return ok
			})
			// By the page's clock (Date.now(): the same host clock as closedAt), so that the
			// delay of the report's way out of the browser does not count.
			o, _ := newHolder(all)
			took := time.Duration(o.T-closedAt.UnixMilli()) * time.Millisecond
			t.Logf("tab %d closed; another tab's connection open %s later", holder, took.Round(time.Millisecond))
			assert.LessOrEqual(t, took, 2*time.Second, "another tab takes over within 2 s")

			require.NoError(t, <-published)
			all = b.waitFor(60*time.Second, "every event in the remaining tabs", allTabsHave(rest, tc.streams, n))
			got := tabEvents(all)
			want := wantEvents(tc.streams, n)
			for _, tab := range rest {
				assert.Equal(t, want, got[tab], "tab %d: every event once, in order", tab)
			}
			assert.Len(t, streamRequests(all), 2, "one connection before, one after the takeover")
			testkit.WaitFor(t, 15*time.Second, "pgsse_sse_connections 1", func() bool { return s.Metric("pgsse_sse_connections") == 1 })
			assert.Empty(t, filter(all, "pageerror"))
		})
	}
}

// A tab that joins an open connection after events were relayed, and takes over before another
// one is: it resumes from the holder's positions, which the holder hands it on joining, not live
// from the moment it connects — so what is published while the holder tab closes still reaches
// it, once. (Without the hand-over its request has no since= and those events are lost.)
func TestBrowserClient_LateTabTakesOverFromHolderCursors(t *testing.T) {
	t.Parallel()
	for _, tc := range clientCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dsn := newDatabase(t)
			ps := startClientPages(t)
			s := startServer(t, dsn, "127.0.0.1", "--cors-origins", ps.URL)
			b := startChromium(t, s)
			pageURL := ps.tabURL(s, tc.streams, mintToken(t, "room/*"), "")
			first := openTabs(t, b, 1, pageURL)
			tabsOpen(t, b, first)
			const before = 3
			for i := 1; i <= before; i++ {
				for _, st := range tc.streams {
					publishSQL(t, dsn, st, fmt.Sprintf("%s #%d", st, i))
				}
			}
			b.waitFor(60*time.Second, "the first tab's events", allTabsHave(first, tc.streams, before))

			var late int
			require.NoError(t, json.Unmarshal(b.call(map[string]any{"cmd": "newPage"}), &late))
			b.call(map[string]any{"cmd": "goto", "url": pageURL, "page": late})
			tabsOpen(t, b, []int{first[0], late})
			b.call(map[string]any{"cmd": "closePage", "page": first[0]})
			// Published while the holder tab goes away, before the late tab's connection is open.
			const after = 2
			for i := before + 1; i <= before+after; i++ {
				for _, st := range tc.streams {
					publishSQL(t, dsn, st, fmt.Sprintf("%s #%d", st, i))
				}
			}
			// The page's report of its open connection and chromium's of the request travel apart:
			// wait for both.
			all := b.waitFor(60*time.Second, "the late tab holding the connection", func(all []obs) bool {
				for _, o := range filter(all, "client-open") {
					if o.Page == late && o.Role == "holder" {
						return len(streamRequests(all)) >= 2
					}
				}
				return false
			})
			reqs := streamRequests(all)
			require.Len(t, reqs, 2, "the first tab's connection, then the late tab's")
			u, err := url.Parse(reqs[1].URL)
			require.NoError(t, err)
			positions := strings.Repeat(fmt.Sprint(before)+",", len(tc.streams))
			assert.Equal(t, positions[:len(positions)-1], u.Query().Get("since"), "the late tab resumes from the holder's positions")

			all = b.waitFor(60*time.Second, "the events published during the takeover", func(all []obs) bool {
				for _, st := range tc.streams {
					if len(tabEvents(all)[late][st]) < after {
						return false
					}
				}
				return true
			})
			want := map[string][]string{}
			for _, st := range tc.streams {
				for i := before + 1; i <= before+after; i++ {
					want[st] = append(want[st], fmt.Sprintf("%d:%s #%d", i, st, i))
				}
			}
			assert.Equal(t, want, tabEvents(all)[late], "joined live, then every event once, in order")
			for _, o := range filter(all, "client-error") {
				// The takeover is a lost connection to the late tab (an error event, as
				// EventSource fires); nothing the client had to explain.
				assert.Empty(t, o.Message, "tab %d", o.Page)
			}
			assert.Empty(t, filter(all, "pageerror"))
		})
	}
}

// A token that lives 5 s, from a token function: the client reopens the stream with a fresh
// token before each exp, at its cursors, so over 30 s the server never ends the stream (no
// EventSource request ends by the server's hand, no 401, no error in the page) and no event is
// missed, repeated or announced as a gap.
func TestBrowserClient_TokenRefreshedBeforeExpiry(t *testing.T) {
	t.Parallel()
	for _, tc := range clientCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dsn := newDatabase(t)
			ps := startClientPages(t)
			s := startServer(t, dsn, "127.0.0.1", "--cors-origins", ps.URL)
			b := startChromium(t, s)
			tabs := openTabs(t, b, 1, ps.tabURL(s, tc.streams, "", "stream=room/*&ttl=5s"))
			tabsOpen(t, b, tabs)

			// 30 s of events, one every 200 ms.
			const total = 150
			n := total / len(tc.streams)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			progress := make(chan int, total)
			start := time.Now()
			require.NoError(t, publishRounds(ctx, dsn, tc.streams, n, 200*time.Millisecond, progress))
			all := b.waitFor(30*time.Second, "every event", allTabsHave(tabs, tc.streams, n))
			t.Logf("%d events over %s; %d tokens minted", total, time.Since(start).Round(time.Second), ps.tokens.Load())

			assert.Equal(t, wantEvents(tc.streams, n), tabEvents(all)[0], "every event once, in order")
			assert.Empty(t, filter(all, "client-gap"))
			assert.Empty(t, filter(all, "client-error"), "no connection failed or was ended")
			assert.Empty(t, streamObs(all, "requestfinished"), "the server ended no stream (an expiry close ends the response)")
			assert.Equal(t, 0.0, s.Metric(`pgsse_rejected_total{status="401"}`))
			assert.GreaterOrEqual(t, ps.tokens.Load(), int64(7), "a fresh token before each exp")
			// One connection per token; the last token may be minted and its connection not yet
			// requested when the observations were taken (a refresh under way).
			conns, minted := int64(len(streamRequests(all))), ps.tokens.Load()
			assert.True(t, minted == conns || minted == conns+1, "one connection per token: %d tokens, %d connections", minted, conns)
			assert.Empty(t, filter(all, "pageerror"))
		})
	}
}

// The control for the test above: the same 5 s token given as a string (no function to refresh
// it) ends at exp as the server ends it — observed as the response ending — and the client then
// stops, saying why, rather than reconnecting with a token that cannot work.
func TestBrowserClient_StaticTokenEndsAtExpiry(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	ps := startClientPages(t)
	s := startServer(t, dsn, "127.0.0.1", "--cors-origins", ps.URL)
	b := startChromium(t, s)
	token := runPGSSE(t, "token", "--jwt-secret", testSecret, "--stream", "room/*", "--ttl", "5s")
	tabs := openTabs(t, b, 1, ps.tabURL(s, []string{"room/a"}, token, ""))
	tabsOpen(t, b, tabs)
	publishSQL(t, dsn, "room/a", "room/a #1")
	all := b.waitFor(30*time.Second, "the server ending the stream and the client giving up", func(all []obs) bool {
		for _, o := range filter(all, "client-error") {
			if strings.Contains(o.Message, "token has expired") {
				return len(streamObs(all, "requestfinished")) > 0 // the response ended: the server closed it
			}
		}
		return false
	})
	assert.Len(t, streamRequests(all), 1, "no reconnect with the expired token")
	assert.Equal(t, []string{"1:room/a #1"}, tabEvents(all)[0]["room/a"])
	var rs int
	require.NoError(t, json.Unmarshal(b.call(map[string]any{"cmd": "eval", "expr": "window.sub.readyState"}), &rs))
	assert.Equal(t, 2, rs, "closed")
}
