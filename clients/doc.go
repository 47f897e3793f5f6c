// Package clients holds the hub clients in other languages — python/ (module pgsse_hub),
// ruby/ (gem pgsse-hub), node/ (npm package pgsse-hub) — and the browser client, js/ (npm
// package pgsse-browser, which pgsse also serves at /pgsse.js: package js embeds it), and, in
// Go, only the test that runs their own suites against a real `pgsse serve` and PostgreSQL
// (clients_test.go), so that `make test` runs them; e2e/ runs the browser client in Chromium.
//
// TestMain installs what the suites need (scripts/clients-deps.sh: Debian's ruby, ruby-pg and
// python3-psycopg, and `npm ci` in node/ and js/) and builds cmd/pgsse once; each suite gets its own
// migrated database and starts its own servers. A missing interpreter is an install step that
// fails loudly, never a skip.
package clients
