// Package e2e judges pgsse with clients nobody here wrote: Debian's Chromium (its
// EventSource, driven through playwright-core), the npm `eventsource` package, curl,
// nginx and Caddy as reverse proxies in front of `pgsse serve`, and Debian's Prometheus
// scraping it with the rules and dashboard of deploy/ (prometheus_test.go). In Chromium it also
// runs pgsse's own browser client, clients/js (browser_client_test.go: tabs sharing one
// connection, a holder tab closed, a token refreshed, each tab on its own without Web Locks or
// BroadcastChannel), and Hotwire Turbo and htmx with the pages and SQL of docs/frameworks.md
// (frameworks_test.go).
//
// The package holds only tests. TestMain installs the clients (scripts/e2e-deps.sh: apt
// packages and `npm ci` in e2e/js, never a browser download); cmd/pgsse is built once, and
// every test starts its own `pgsse serve` subprocess on free ports against a fresh
// database (internal/testkit: servetest, pgtest), so tests share nothing but the binary. A
// missing client is an install step that fails loudly, never a skip.
//
// Besides the clients, it checks what a new user meets first: the README and docs/ commands
// against `make run` (docs_test.go, also `make docs-check`), the demo page, the container
// image (image_test.go), release binaries (release_test.go) and nginx with HTTP/2
// (nginx_h2_test.go).
//
// Run alone: `scripts/pg.sh with go test -count=1 -v ./e2e/` (or with
// PGSSE_TEST_DATABASE_URL set). Under -race, pgsse is built with -race as well and a data
// race it reports fails the test. PGSSE_E2E_VERBOSE=1 logs every client's observations and
// every server log even when tests pass. Artifacts (screenshots of the demo page, of the docs' browser example and of the Turbo and
// htmx pages) go to e2e/artifacts/, which git ignores.
package e2e
