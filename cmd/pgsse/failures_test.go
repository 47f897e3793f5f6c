package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

// Issue 11 / docs/operations.md, Configuration: failures that say what happened. One test per bad
// input; each failed on the code before (pgsse logged "pgsse serving" and retried forever, named
// the wrong flag, logged dozens of lines, or served the secrets).

const failSecret = "0123456789abcdef0123456789abcdef"

// serveOnce runs `pgsse serve` to its exit (at most 30 s) and returns the result.
func serveOnce(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), append([]string{"serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(cleanEnv(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	require.NoError(t, ctx.Err(), "pgsse serve did not exit; stderr:\n%s", stderr.String())
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "pgsse serve must fail; stderr:\n%s", stderr.String())
	return result{stdout.String(), stderr.String(), ee.ExitCode()}
}

// serveExactly is serveOnce without its --listen and --admin-listen: the test says them, or
// the environment does.
func serveExactly(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), append([]string{"serve"}, args...)...)
	cmd.Env = append(cleanEnv(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	require.NoError(t, ctx.Err(), "pgsse serve did not exit; stderr:\n%s", stderr.String())
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "pgsse serve must fail; stderr:\n%s", stderr.String())
	return result{stdout.String(), stderr.String(), ee.ExitCode()}
}

// oneLogLine asserts a start that failed with exactly one log line, and returns it.
func oneLogLine(t *testing.T, r result) string {
	t.Helper()
	assert.Equal(t, 1, r.code)
	line := strings.TrimSuffix(r.stderr, "\n")
	require.NotContains(t, line, "\n", "one line, got:\n%s", r.stderr)
	assert.NotContains(t, line, "pgsse serving")
	assert.Contains(t, line, "pgsse cannot start")
	return line
}

// A database PostgreSQL refuses for good — it does not exist (SQLSTATE 3D000), or the role
// may not log in (class 28) — ends the start with one line, before "pgsse serving".
func TestServeDatabaseRefusedForGood(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	missing := pgtest.WithDatabase(t, dsn, "pgsse_no_such_database")
	line := oneLogLine(t, serveOnce(t, []string{"PGSSE_JWT_SECRET=" + failSecret}, "--database-url", missing))
	assert.Contains(t, line, "--database-url: PostgreSQL refused the connection")
	assert.Contains(t, line, `database \"pgsse_no_such_database\" does not exist (SQLSTATE 3D000)`)

	pgtest.Exec(t, dsn, "DROP ROLE IF EXISTS pgsse_nologin")
	pgtest.Exec(t, dsn, "CREATE ROLE pgsse_nologin NOLOGIN")
	t.Cleanup(func() { pgtest.Exec(t, pgtest.URL(t), "DROP ROLE IF EXISTS pgsse_nologin") })
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	u.User = url.User("pgsse_nologin")
	line = oneLogLine(t, serveOnce(t, []string{"PGSSE_JWT_SECRET=" + failSecret}, "--database-url", u.String()))
	assert.Contains(t, line, "(SQLSTATE 28000)")
}

// The one line names where the database came from (docs/operations.md, Configuration:
// --database-url, else DATABASE_URL, else the libpq variables) and keeps PostgreSQL's reason when pgconn tried more than once — as
// it does with the default sslmode=prefer (TLS first, then plain), whose error has a line per
// attempt. Before, the line said "--database-url" whatever the source, and ended at
// "failed to connect to `user=… database=…`:" with the reason cut off.
func TestServeDatabaseRefusedNamesItsSource(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	u, err := url.Parse(pgtest.WithDatabase(t, dsn, "pgsse_no_such_database"))
	require.NoError(t, err)
	q := u.Query()
	q.Del("sslmode") // libpq's default, prefer: two attempts against a server without TLS
	u.RawQuery = q.Encode()
	missing := u.String()
	const reason = `database \"pgsse_no_such_database\" does not exist (SQLSTATE 3D000)`

	line := oneLogLine(t, serveOnce(t, []string{"PGSSE_JWT_SECRET=" + failSecret, "DATABASE_URL=" + missing}))
	assert.Contains(t, line, "DATABASE_URL: PostgreSQL refused the connection")
	assert.Contains(t, line, reason)
	assert.NotContains(t, line, "--database-url")

	line = oneLogLine(t, serveOnce(t, []string{"PGSSE_JWT_SECRET=" + failSecret, "PGSSE_DATABASE_URL=" + missing}))
	assert.Contains(t, line, "--database-url (from PGSSE_DATABASE_URL): PostgreSQL refused the connection")
	assert.Contains(t, line, reason)

	pw, _ := u.User.Password()
	libpq := []string{"PGSSE_JWT_SECRET=" + failSecret, "PGHOST=" + u.Hostname(), "PGPORT=" + u.Port(),
		"PGUSER=" + u.User.Username(), "PGPASSWORD=" + pw, "PGDATABASE=pgsse_no_such_database"}
	line = oneLogLine(t, serveOnce(t, libpq))
	assert.Contains(t, line, "libpq environment (PGHOST, PGPORT, …): PostgreSQL refused the connection")
	assert.Contains(t, line, reason)
}

// A short HS256 secret is warned about once pgsse serves, not before: a start that fails — bad
// configuration, a database refused for good — says one line (docs/operations.md), short secret or not.
// Before, the warning came first and made it two.
func TestServeShortSecret(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	r := pgsse(t, []string{"DATABASE_URL=" + dsn}, "serve", "--jwt-secret", "short", "--cors-origins", "https://A.example")
	assert.Contains(t, errorLine(t, r, 2), "--cors-origins")

	missing := pgtest.WithDatabase(t, dsn, "pgsse_no_such_database")
	line := oneLogLine(t, serveOnce(t, []string{"PGSSE_JWT_SECRET=short"}, "--database-url", missing))
	assert.Contains(t, line, "(SQLSTATE 3D000)")

	p := startServe(t, 0, []string{"PGSSE_JWT_SECRET=short", "DATABASE_URL=" + dsn})
	p.WaitLog(10*time.Second, "the warning", func(l map[string]any) bool {
		return l["msg"] == "the HS256 secret is short; use at least 32 random bytes"
	})
}

// An unreachable PostgreSQL is retried while /readyz answers 503, and the log says so once
// (per cause, per 30 s) — not at every reconnect attempt.
func TestServeDatabaseUnreachable(t *testing.T) {
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := probe.Addr().String()
	probe.Close() // nothing listens here now
	p := startServe(t, 0, []string{"PGSSE_JWT_SECRET=" + failSecret,
		"PGSSE_DATABASE_URL=postgres://postgres@" + closed + "/pgsse?sslmode=disable&connect_timeout=2"})
	code, body := getURL(t, p.AdminURL("/readyz"))
	assert.Equal(t, 503, code)
	assert.Contains(t, body, "not ready: ")
	// Watch the reconnect attempts for a while (pglisten backs off from 100 ms to 5 s).
	start := time.Now()
	waitFor(t, 20*time.Second, "a few reconnect attempts", func() bool { return time.Since(start) > 6*time.Second })
	p.Alive("while PostgreSQL is unreachable")
	logs := p.Log()
	assert.Contains(t, logs, "PostgreSQL unreachable at start; retrying with backoff, /readyz answers 503 until it is back")
	assert.LessOrEqual(t, strings.Count(logs, "connection refused"), 3, "logged once per cause, not per attempt:\n%s", logs)
	code, _ = getURL(t, p.AdminURL("/readyz"))
	assert.Equal(t, 503, code)
}

// An unmigrated database: the log says "schema pgsse missing: run `pgsse migrate`" (once per
// 30 s), not one warning per history read (≈60 in 15 s with one client before).
func TestServeUnmigrated(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	p := startServe(t, 0, []string{"DATABASE_URL=" + dsn}, "--public-streams", "*")
	waitFor(t, 20*time.Second, "/readyz to name the missing schema", func() bool {
		code, body := getURL(t, p.AdminURL("/readyz"))
		return code == 503 && body == "not ready: schema pgsse missing: run `pgsse migrate`\n"
	})
	// One client that wants history: every read fails.
	conn, err := net.DialTimeout("tcp", p.Listen, 5*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, "GET /streams/s?since=0 HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	start := time.Now()
	waitFor(t, 20*time.Second, "history reads to fail a while", func() bool { return time.Since(start) > 6*time.Second })
	logs := p.Log()
	assert.Contains(t, logs, "schema pgsse missing: run `pgsse migrate`")
	assert.LessOrEqual(t, strings.Count(logs, "does not exist"), 3, "once per cause:\n%s", logs)
}

// A --hub-socket in a directory that does not exist is reported as such (not as "--listen …:
// bind: no such file or directory"), and a failed start logs nothing misleading first.
func TestServeBadHubSocketDirectory(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	path := "/nonexistent-pgsse-dir/hub.sock"
	line := oneLogLine(t, serveOnce(t, []string{"DATABASE_URL=" + dsn, "PGSSE_JWT_SECRET=" + failSecret}, "--hub-socket", path))
	assert.Contains(t, line, "--hub-socket "+path+": bind: no such file or directory")
	assert.NotContains(t, line, "--listen")
	assert.NotContains(t, line, "LISTEN on the stream channel failed")
}

// The HS256 secret and the database password never appear in /debug/pprof/cmdline or the log.
func TestServeRedactsSecrets(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	requireOK(t, pgsse(t, nil, "migrate", "--database-url", dsn))
	const password = "pw-s3cret-9f8e7d" // trust authentication accepts any password
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), password)
	secret := "jwt-s3cret-" + failSecret
	p := startServe(t, 0, nil, "--pprof", "--jwt-secret", secret, "--database-url", u.String(), "--log-level", "debug")
	code, cmdline := getURL(t, p.AdminURL("/debug/pprof/cmdline"))
	require.Equal(t, 200, code)
	assert.Contains(t, cmdline, "--jwt-secret\x00REDACTED")
	assert.Contains(t, cmdline, ":REDACTED@")
	assert.NotContains(t, cmdline, secret)
	assert.NotContains(t, cmdline, password)
	assert.NotContains(t, p.Log(), secret)
	assert.NotContains(t, p.Log(), password)
}

// The redacting log handler scrubs messages, string attributes, errors and groups.
func TestRedactingHandler(t *testing.T) {
	var out bytes.Buffer
	r := &redactor{}
	r.add("hunter2-secret")
	r.add("p@ss word") // URL-escaped forms too
	r.add("abcde")     // too short to search for
	log := slog.New(redactingHandler{inner: slog.NewTextHandler(&out, nil), r: r})
	log.Info("connect to postgres://u:p%40ss+word@h/db failed", "err", io.ErrUnexpectedEOF,
		"dsn", "postgres://u:p%40ss%20word@h/db", "wrapped", errString("token hunter2-secret rejected"),
		slog.Group("g", "k", "p@ss word"), "n", 7)
	log.With("secret", "hunter2-secret").Warn("with")
	got := out.String()
	assert.NotContains(t, got, "hunter2-secret")
	assert.NotContains(t, got, "p@ss word")
	assert.NotContains(t, got, "p%40ss")
	assert.Contains(t, got, "postgres://u:REDACTED@h/db")
	assert.Contains(t, got, "dsn=postgres://u:REDACTED@h/db")
	assert.Contains(t, got, "g.k=REDACTED")
	assert.Contains(t, got, "n=7")
	assert.Len(t, r.secrets, 5, "the secret, the spaced password and its three escaped forms; not the short one")
}

// /debug/pprof/cmdline hides --jwt-secret and the password of --database-url whatever their
// length, in both flag forms.
func TestRedactArgs(t *testing.T) {
	got := redactArgs([]string{"pgsse", "serve", "--jwt-secret", "x", "--database-url=postgres://u:pw@h/db",
		"--database-url", "host=h password=pw user=u", "-jwt-secret=y", "--listen", ":8080"}, &redactor{})
	assert.Equal(t, []string{"pgsse", "serve", "--jwt-secret", "REDACTED", "--database-url=postgres://u:REDACTED@h/db",
		"--database-url", "host=h password=REDACTED user=u", "-jwt-secret=REDACTED", "--listen", ":8080"}, got)
}

type errString string

func (e errString) Error() string { return string(e) }

// getURL is a GET with a timeout: status and body.
func getURL(t *testing.T, u string) (int, string) {
	t.Helper()
	client := http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// Issue 26: `source bin/run.env` sets PGSSE_HUB_SOCKET; a second `pgsse serve` then refused to
// start naming --hub-socket, a flag the user never typed. Every error about a value taken from
// the environment names the variable (cli.source, cli.attribute) — the engine's for --listen and
// --hub-socket as well as the command's own for --admin-listen — and a value typed on the
// command line is named as the flag alone.
func TestServeNamesTheVariableThatSetAValue(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	dir := shortTempDir(t)
	sock := dir + "/hub.sock"
	hub, err := net.Listen("unix", sock) // a live server on the path
	require.NoError(t, err)
	defer hub.Close()
	go func() {
		for {
			c, err := hub.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	addr := taken.Addr().String()
	base := []string{"DATABASE_URL=" + dsn, "PGSSE_JWT_SECRET=" + failSecret}
	free := []string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}
	cases := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"hub socket from the environment", []string{"PGSSE_HUB_SOCKET=" + sock}, free,
			"--hub-socket (from PGSSE_HUB_SOCKET) " + sock + ": another process is serving it"},
		{"hub socket on the command line", nil, append([]string{"--hub-socket", sock}, free...),
			"--hub-socket " + sock + ": another process is serving it"},
		{"listen from the environment", []string{"PGSSE_LISTEN=" + addr}, []string{"--admin-listen", "127.0.0.1:0"},
			"--listen (from PGSSE_LISTEN) " + addr + ": bind: address already in use"},
		{"admin listen from the environment", []string{"PGSSE_ADMIN_LISTEN=" + addr}, []string{"--listen", "127.0.0.1:0"},
			"--admin-listen (from PGSSE_ADMIN_LISTEN) " + addr + ": admin server cannot listen: bind: address already in use"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			line := oneLogLine(t, serveExactly(t, append(base, tc.env...), tc.args...))
			assert.Contains(t, line, tc.want)
		})
	}
}
