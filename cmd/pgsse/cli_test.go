package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/names"
	"github.com/pgsse/pgsse/store"
)

func TestMigrate(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	r := pgsse(t, nil, "migrate", "--database-url", dsn)
	requireOK(t, r)
	assert.Equal(t, "pgsse: schema at version "+strconv.Itoa(store.SchemaVersion)+" (was 0)\n", r.stdout)
	assert.Equal(t, strconv.Itoa(store.SchemaVersion), pgtest.QueryValue(t, dsn, "SELECT max(version) FROM pgsse.schema_version"))

	r = pgsse(t, nil, "migrate", "--database-url="+dsn)
	requireOK(t, r)
	assert.Equal(t, "pgsse: schema at version "+strconv.Itoa(store.SchemaVersion)+" (unchanged)\n", r.stdout)
}

func TestMigratePrintNeedsNoDatabase(t *testing.T) {
	// DATABASE_URL is unparsable and nothing listens at PGHOST: --print must not care.
	r := pgsse(t, []string{"DATABASE_URL=postgres://x:bad:port"}, "migrate", "--print")
	requireOK(t, r)
	assert.Equal(t, store.MigrationSQL(), r.stdout)
	r = pgsse(t, []string{"PGSSE_PRINT=true"}, "migrate")
	requireOK(t, r)
	assert.Equal(t, store.MigrationSQL(), r.stdout, "PGSSE_PRINT")
}

// TestDatabaseSources checks where the connection string comes from, in order:
// --database-url, PGSSE_DATABASE_URL, DATABASE_URL, the libpq variables.
func TestDatabaseSources(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	pw, _ := u.User.Password()
	libpq := []string{"PGHOST=" + u.Hostname(), "PGPORT=" + u.Port(), "PGUSER=" + u.User.Username(),
		"PGPASSWORD=" + pw, "PGDATABASE=" + strings.TrimPrefix(u.Path, "/")}
	if m := u.Query().Get("sslmode"); m != "" {
		libpq = append(libpq, "PGSSLMODE="+m)
	}
	bad := "postgres://x:bad:port"
	cases := []struct {
		name string
		env  []string
		args []string
	}{
		{"flag", nil, []string{"--database-url", dsn}},
		{"flag beats env", []string{"PGSSE_DATABASE_URL=" + bad, "DATABASE_URL=" + bad}, []string{"--database-url", dsn}},
		{"PGSSE_DATABASE_URL", []string{"PGSSE_DATABASE_URL=" + dsn, "DATABASE_URL=" + bad}, nil},
		{"DATABASE_URL", []string{"DATABASE_URL=" + dsn}, nil},
		{"libpq variables", libpq, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := pgsse(t, tc.env, append([]string{"migrate"}, tc.args...)...)
			requireOK(t, r)
			assert.Contains(t, r.stdout, "pgsse: schema at version")
		})
	}
	line := errorLine(t, pgsse(t, []string{"DATABASE_URL=" + bad}, "migrate"), 2)
	assert.True(t, strings.HasPrefix(line, "DATABASE_URL: cannot parse"), line)
	line = errorLine(t, pgsse(t, []string{"PGSSE_DATABASE_URL=" + bad}, "migrate"), 2)
	assert.True(t, strings.HasPrefix(line, "--database-url (from PGSSE_DATABASE_URL): cannot parse"), line)
}

func TestPublish(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	requireOK(t, pgsse(t, nil, "migrate", "--database-url", dsn))
	env := []string{"DATABASE_URL=" + dsn}

	r := pgsse(t, env, "publish", "orders/42", "hello")
	requireOK(t, r)
	assert.Equal(t, "1\n", r.stdout)
	// Flags after the positional arguments, repeated --audience, data with a newline.
	r = pgsse(t, env, "publish", "orders/42", "line 1\nline 2", "--event", "update", "--audience", "user:7", "--audience=role:admin")
	requireOK(t, r)
	assert.Equal(t, "2\n", r.stdout)
	// "--" ends the flags: data may start with a dash.
	r = pgsse(t, env, "publish", "--", "orders/42", "--not-a-flag")
	requireOK(t, r)
	assert.Equal(t, "3\n", r.stdout)

	assert.Equal(t, "update|line 1\nline 2|{user:7,role:admin}",
		pgtest.QueryValue(t, dsn, "SELECT event || '|' || data || '|' || audience::text FROM pgsse.events WHERE stream = 'orders/42' AND id = 2"))
	assert.Equal(t, "--not-a-flag", pgtest.QueryValue(t, dsn, "SELECT data FROM pgsse.events WHERE stream = 'orders/42' AND id = 3"))
	assert.Equal(t, "", pgtest.QueryValue(t, dsn, "SELECT event FROM pgsse.events WHERE stream = 'orders/42' AND id = 1"), "no --event is NULL")
}

func TestPublishEphemeral(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	requireOK(t, pgsse(t, nil, "migrate", "--database-url", dsn))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := pgconn.ParseConfig(dsn)
	require.NoError(t, err)
	got := make(chan *pgconn.Notification, 1)
	cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) { got <- n }
	ln, err := pgconn.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer ln.Close(context.Background())
	_, err = ln.Exec(ctx, "LISTEN "+store.Channel).ReadAll()
	require.NoError(t, err)

	r := pgsse(t, []string{"PGSSE_DATABASE_URL=" + dsn}, "publish", "--ephemeral", "ticker", "tick-payload")
	requireOK(t, r)
	assert.Empty(t, r.stdout, "ephemeral events have no id")
	require.NoError(t, ln.WaitForNotification(ctx))
	n := <-got
	assert.Equal(t, store.Channel, n.Channel)
	assert.Contains(t, n.Payload, "tick-payload")
	assert.Equal(t, "0", pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.events"), "nothing stored")
}

func TestPublishErrors(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	requireOK(t, pgsse(t, nil, "migrate", "--database-url", dsn))
	env := []string{"DATABASE_URL=" + dsn}

	// The message is the one pgsse.publish raises with SQLSTATE 22023.
	ctx := context.Background()
	conn, err := pgconn.Connect(ctx, dsn)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "SELECT pgsse.publish('bad name!', 'x')").ReadAll()
	conn.Close(ctx)
	pe, ok := err.(*pgconn.PgError)
	require.True(t, ok, "want a PgError, got %v", err)
	require.Equal(t, "22023", pe.Code)
	line := errorLine(t, pgsse(t, env, "publish", "bad name!", "x"), 2)
	assert.Equal(t, "publish: "+pe.Message, line)
	assert.Equal(t, "publish: "+names.ErrStreamChars.Error(), line)

	line = errorLine(t, pgsse(t, env, "publish", "s", "x", "--event", "bad event"), 2)
	assert.Equal(t, "--event: "+names.ErrEventChars.Error(), line)

	// Too big for a NOTIFY, or for pgsse.max_event_bytes: refused before the transaction.
	line = errorLine(t, pgsse(t, env, "publish", "--ephemeral", "s", strings.Repeat("x", 8000)), 2)
	assert.Equal(t, "publish: the notification payload of an ephemeral event could be 8045 bytes, over the 7999-byte NOTIFY limit; publish it as a durable event", line)
	line = errorLine(t, pgsseIn(t, env, strings.Repeat("x", store.DefaultMaxEventBytes+1), "publish", "s", "-"), 2)
	assert.Equal(t, "publish: event data is 1048577 bytes, over pgsse.max_event_bytes (1048576 bytes)", line)
	line = errorLine(t, pgsseIn(t, env, "not \xff UTF-8", "publish", "s", "-"), 2)
	assert.Equal(t, "publish: "+store.ErrDataNotText.Error(), line)

	line = errorLine(t, pgsse(t, env, "publish", "only-stream"), 2)
	assert.Equal(t, `publish: need DATA after STREAM "only-stream"`, line)
	line = errorLine(t, pgsse(t, env, "publish"), 2)
	assert.Equal(t, "publish: need STREAM and DATA", line)
	line = errorLine(t, pgsse(t, env, "publish", "s", "two", "words"), 2)
	assert.Equal(t, "publish: takes STREAM and DATA, got 3 arguments (quote DATA that has spaces)", line)

	// Not migrated: a runtime error that says so and gives the fix — not "PostgreSQL is
	// unavailable" (issue 26).
	fresh := pgtest.NewDatabase(t)
	line = errorLine(t, pgsse(t, []string{"DATABASE_URL=" + fresh}, "publish", "s", "x"), 1)
	assert.True(t, strings.HasPrefix(line, "publish: pgsse's schema is not installed in the database (or is older than version "+strconv.Itoa(store.SchemaVersion)+"): run pgsse migrate ("), line)
	assert.True(t, strings.HasSuffix(line, "; nothing was published"), line)
	assert.NotContains(t, line, "unavailable")

	// Nothing listens: a connection error, exit 1.
	line = errorLine(t, pgsse(t, nil, "publish", "--database-url", "postgres://u@127.0.0.1:1/db?connect_timeout=5", "s", "x"), 1)
	assert.True(t, strings.HasPrefix(line, "publish: PostgreSQL is unavailable (failed to connect to "), line)
	assert.True(t, strings.HasSuffix(line, "; nothing was published"), line)
	assert.Equal(t, "0", pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.events"))
}

// Issue 26: without DATABASE_URL, `pgsse publish` said "PostgreSQL is unavailable (failed to
// connect to `user=root database=`: /var/run/postgresql/…)" — as if a server were down, not as
// if none had been named. With nothing configured (no --database-url, DATABASE_URL or
// libpq server variable), every command that connects says so, how to configure one, and what
// libpq's defaults made it try; a configured database that is down is still "unavailable".
func TestNoDatabaseConfigured(t *testing.T) {
	var env []string // cleanEnv without its PGHOST: nothing names a database
	for _, kv := range cleanEnv() {
		if !strings.HasPrefix(kv, "PGHOST=") {
			env = append(env, kv)
		}
	}
	run := func(args ...string) result {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, binary(t), args...)
		cmd.Env = env
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "pgsse %v must fail (is a PostgreSQL server listening at libpq's default socket?): %s", args, stdout.String())
		return result{stdout.String(), stderr.String(), ee.ExitCode()}
	}
	tried := regexp.MustCompile(`; tried libpq's default, the Unix socket /\S+/\.s\.PGSQL\.5432 as user \S+, database \S+: [a-z ]+`)
	for _, tc := range []struct {
		args   []string
		prefix string
	}{
		{[]string{"publish", "s", "x"}, "publish: "},
		{[]string{"migrate"}, "migrate: "},
	} {
		line := errorLine(t, run(tc.args...), 1)
		assert.True(t, strings.HasPrefix(line, tc.prefix+noDatabaseHint+"; tried "), "%v: %s", tc.args, line)
		assert.Regexp(t, tried, line, tc.args)
		assert.NotContains(t, line, "unavailable", tc.args)
	}
	assert.Contains(t, errorLine(t, run("publish", "s", "x"), 1), "nothing was published")
	r := run("doctor")
	assert.Equal(t, 1, r.code)
	assert.True(t, strings.HasPrefix(r.stdout, "FAIL  connectivity: "+noDatabaseHint+"; tried "), r.stdout)
	assert.Contains(t, noDatabaseHint, "DATABASE_URL")

	// A database that was named but is down is not "not configured".
	line := errorLine(t, pgsse(t, []string{"PGPORT=1"}, "publish", "s", "x"), 1)
	assert.NotContains(t, line, "no database configured")
}

// `pgsse publish STREAM -` publishes standard input byte for byte.
func TestPublishStdin(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	requireOK(t, pgsse(t, nil, "migrate", "--database-url", dsn))
	env := []string{"DATABASE_URL=" + dsn}
	data := "line 1\r\nline 2\n\ttabbed, ünïcödé, trailing newlines\n\n"
	r := pgsseIn(t, env, data, "publish", "in/1", "-", "--event", "doc")
	requireOK(t, r)
	assert.Equal(t, "1\n", r.stdout)
	assert.Equal(t, data, pgtest.QueryValue(t, dsn, "SELECT data FROM pgsse.events WHERE stream = 'in/1'"))
	r = pgsseIn(t, env, "", "publish", "in/1", "-")
	requireOK(t, r)
	assert.Equal(t, "2\n", r.stdout, "empty input is empty data")
}

// `pgsse publish --ndjson FILE|-` publishes a batch all or nothing and prints the ids as
// POST /publish answers them.
func TestPublishNDJSON(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	requireOK(t, pgsse(t, nil, "migrate", "--database-url", dsn))
	env := []string{"DATABASE_URL=" + dsn}
	batch := `{"stream":"nd/a","data":"a1"}
{"stream":"nd/b","data":{"total":3},"event":"created","audience":["user:7"]}
{"stream":"nd/a","data":"typing","ephemeral":true}
{"stream":"nd/a","data":"a2"}
`
	r := pgsse(t, env, "publish", "--ndjson", writeFile(t, "batch.ndjson", []byte(batch)))
	requireOK(t, r)
	assert.Equal(t, `{"ids":[1,1,null,2]}`+"\n", r.stdout)
	r = pgsseIn(t, env, `{"stream":"nd/a","data":"a3"}`, "publish", "--ndjson", "-")
	requireOK(t, r)
	assert.Equal(t, `{"ids":[3]}`+"\n", r.stdout)
	assert.Equal(t, `nd/a 1 a1|nd/a 2 a2|nd/a 3 a3|nd/b 1 {"total":3} created {user:7}`, pgtest.QueryValue(t, dsn,
		`SELECT string_agg(concat_ws(' ', stream, id, data, event, audience::text), '|' ORDER BY stream, id) FROM pgsse.events`))

	// One bad line: nothing is published, the line and field are named.
	bad := `{"stream":"nd/c","data":"c1"}
{"stream":"nd/c","data":"c2","audience":["ok","bad\u0001tag"]}
`
	line := errorLine(t, pgsse(t, env, "publish", "--ndjson", writeFile(t, "bad.ndjson", []byte(bad))), 2)
	assert.True(t, strings.HasSuffix(line, `bad.ndjson: line 2, field "audience": audience tag must not contain control characters`), line)
	line = errorLine(t, pgsseIn(t, env, `{"stream":"nd/c","data":"c1","evnt":"x"}`, "publish", "--ndjson", "-"), 2)
	assert.Equal(t, `standard input: line 1, field "evnt": unknown field (known: stream, data, event, audience, ephemeral)`, line)
	assert.Equal(t, "0", pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.events WHERE stream = 'nd/c'"))

	line = errorLine(t, pgsse(t, env, "publish", "--ndjson", "/nonexistent/batch"), 2)
	assert.Equal(t, "--ndjson: open /nonexistent/batch: no such file or directory", line)
	line = errorLine(t, pgsse(t, env, "publish", "--ndjson", "-", "nd/a"), 2)
	assert.Equal(t, "publish: --ndjson takes no STREAM or DATA (got 1 arguments)", line)
	line = errorLine(t, pgsse(t, env, "publish", "--ndjson", "-", "--ephemeral"), 2)
	assert.Equal(t, "publish: event, audience and ephemeral go into the lines of an --ndjson batch, not flags", line)
}

func writeFile(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, data, 0o600))
	return p
}

func pemOf(t *testing.T, typ string, der []byte, err error) []byte {
	t.Helper()
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func TestToken(t *testing.T) {
	secret := "0123456789abcdef0123456789abcdef"
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	edPub, edKey, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	pkcs8 := func(k any) []byte {
		der, err := x509.MarshalPKCS8PrivateKey(k)
		return pemOf(t, "PRIVATE KEY", der, err)
	}
	pkix := func(k any) []byte { der, err := x509.MarshalPKIXPublicKey(k); return pemOf(t, "PUBLIC KEY", der, err) }
	ecSEC1, err := x509.MarshalECPrivateKey(ecKey)
	require.NoError(t, err)

	claimArgs := []string{"--stream", "orders/42", "--stream=chat/*", "--channel", "jobs", "--publish", "orders/*", "--tag", "user:7", "--tag", "role:admin", "--ttl", "30m"}
	cases := []struct {
		name   string
		env    []string
		args   []string
		verify auth.Config
	}{
		{"HS256 flag", nil, []string{"--jwt-secret", secret}, auth.Config{Secret: []byte(secret)}},
		{"HS256 env", []string{"PGSSE_JWT_SECRET=" + secret}, nil, auth.Config{Secret: []byte(secret)}},
		{"HS256 file with newline", nil, []string{"--jwt-secret-file", writeFile(t, "secret", []byte(secret+"\n"))}, auth.Config{Secret: []byte(secret)}},
		{"RS256", nil, []string{"--private-key-file", writeFile(t, "rsa.pem", pemOf(t, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rsaKey), nil))},
			auth.Config{PublicKeyPEM: pkix(&rsaKey.PublicKey)}},
		{"ES256", nil, []string{"--private-key-file", writeFile(t, "ec.pem", pemOf(t, "EC PRIVATE KEY", ecSEC1, nil))},
			auth.Config{PublicKeyPEM: pkix(&ecKey.PublicKey)}},
		{"EdDSA", nil, []string{"--private-key-file", writeFile(t, "ed.pem", pkcs8(edKey))},
			auth.Config{PublicKeyPEM: pkix(edPub)}},
		{"key file flag masks the secret variable", []string{"PGSSE_JWT_SECRET=" + secret},
			[]string{"--private-key-file", writeFile(t, "ed2.pem", pkcs8(edKey))}, auth.Config{PublicKeyPEM: pkix(edPub)}},
		{"issuer and audience", nil, []string{"--jwt-secret", secret, "--jwt-issuer", "app", "--jwt-audience", "pgsse"},
			auth.Config{Secret: []byte(secret), Issuer: "app", Audience: "pgsse"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := time.Now()
			r := pgsse(t, tc.env, append(append([]string{"token"}, claimArgs...), tc.args...)...)
			requireOK(t, r)
			tok := strings.TrimSuffix(r.stdout, "\n")
			require.NotContains(t, tok, "\n", "prints only the token")
			v, err := auth.NewVerifier(tc.verify)
			require.NoError(t, err)
			c, err := v.Verify([]byte(tok), time.Now())
			require.NoError(t, err)
			assert.Equal(t, []string{"orders/42", "chat/*"}, c.Streams)
			assert.Equal(t, []string{"jobs"}, c.Channels)
			assert.Equal(t, []string{"orders/*"}, c.Publish)
			assert.Equal(t, []string{"user:7", "role:admin"}, c.Tags)
			assert.WithinDuration(t, before.Add(30*time.Minute), c.Expires, 5*time.Second)
		})
	}

	// Repeatable flags from the environment are comma-separated.
	r := pgsse(t, []string{"PGSSE_JWT_SECRET=" + secret, "PGSSE_STREAM=a,b/*", "PGSSE_TAG=t1"}, "token")
	requireOK(t, r)
	v, err := auth.NewVerifier(auth.Config{Secret: []byte(secret)})
	require.NoError(t, err)
	c, err := v.Verify([]byte(strings.TrimSpace(r.stdout)), time.Now())
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b/*"}, c.Streams)
	assert.Equal(t, []string{"t1"}, c.Tags)

	// --ttl 0: no exp, accepted only with AllowNoExp.
	r = pgsse(t, nil, "token", "--stream", "s", "--ttl", "0", "--jwt-secret", secret)
	requireOK(t, r)
	_, err = v.Verify([]byte(strings.TrimSpace(r.stdout)), time.Now())
	assert.ErrorIs(t, err, auth.ErrNoExp)
}

func TestVersion(t *testing.T) {
	r := pgsse(t, nil, "version")
	requireOK(t, r)
	assert.Regexp(t, `^pgsse \S+ commit \S+.* `+regexp.QuoteMeta(runtime.Version())+` `+runtime.GOOS+`/`+runtime.GOARCH+"\n$", r.stdout)
	// The commit is what the toolchain stamped into the binary (none with -buildvcs=false).
	out, err := exec.Command("go", "version", "-m", binary(t)).Output()
	require.NoError(t, err)
	if m := regexp.MustCompile(`(?m)^\s*build\s+vcs\.revision=([0-9a-f]+)$`).FindSubmatch(out); m != nil {
		assert.Contains(t, r.stdout, " commit "+string(m[1]))
	} else {
		assert.Contains(t, r.stdout, " commit unknown ")
	}
	r2 := pgsse(t, nil, "--version")
	requireOK(t, r2)
	assert.Equal(t, r.stdout, r2.stdout)
}

// TestVersionStampedByMake: `make build` stamps the commit with -ldflags, so a binary built
// with -buildvcs=false (no VCS information from the toolchain) still names it.
func TestVersionStampedByMake(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("make is needed to test `make build`: %v", err)
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	require.NoError(t, err, "the repository is a git checkout")
	bin := filepath.Join(t.TempDir(), "pgsse")
	cmd := exec.Command("make", "-s", "-C", "../..", "build", "BIN="+bin)
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "make build: %s", out)
	got, err := exec.Command(bin, "version").Output()
	require.NoError(t, err)
	assert.Regexp(t, `^pgsse [0-9a-z.-]+ commit `+strings.TrimSpace(string(head))+`(\+dirty)? \(\d{4}-\d\d-\d\dT[^)]+\) `, string(got))
	assert.NotContains(t, string(got), "unknown")
	// The toolchain stamped nothing: the commit came from -ldflags.
	info, err := exec.Command("go", "version", "-m", bin).Output()
	require.NoError(t, err)
	assert.NotContains(t, string(info), "vcs.revision")
}

func TestDoctor(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	env := []string{"DATABASE_URL=" + dsn}

	// Not migrated: the schema check fails.
	r := pgsse(t, env, "doctor")
	assert.Equal(t, 1, r.code, "stdout: %s", r.stdout)
	assert.Contains(t, r.stdout, "FAIL  schema: not installed: run pgsse migrate\n")
	assert.Empty(t, r.stderr)

	requireOK(t, pgsse(t, env, "migrate"))
	// No hub configured: nothing about "all 8 workers" (the --workers default).
	r = pgsse(t, env, "doctor")
	requireOK(t, r)
	assert.Contains(t, r.stdout, "connection budget: pgsse holds 6 PostgreSQL connections (1 LISTEN + 4 replay + 1 publishing); no hub configured (--hub-socket lets worker processes share its LISTEN session)")
	assert.NotContains(t, r.stdout, "workers")
	r = pgsse(t, env, "doctor", "--workers", "12")
	requireOK(t, r)
	var lines, table []string // one line per check; the descriptor budget's table is indented
	for _, l := range strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n") {
		if strings.HasPrefix(l, " ") {
			table = append(table, l)
		} else {
			lines = append(lines, l)
		}
	}
	checks := []string{"connectivity", "schema", "notify queue", "durability", "presence", "fd limit", "hub socket", "connection budget"}
	require.Len(t, lines, len(checks), r.stdout)
	for i, check := range checks {
		assert.Regexp(t, `^(ok  |warn)  `+check+`: `, lines[i])
	}
	assert.Contains(t, lines[0], "PostgreSQL ")
	assert.Contains(t, lines[1], "version "+strconv.Itoa(store.SchemaVersion))
	assert.Contains(t, lines[2], "0.0% in use")
	assert.Contains(t, lines[4], "no pgsse process holds a presence lease")
	assert.Contains(t, lines[7], "6 PostgreSQL connections (1 LISTEN + 4 replay + 1 publishing); no hub configured, so 12 workers (--workers) hold 12 LISTEN sessions of their own (--hub-socket shares one)")
	assert.Contains(t, lines[7], "max_connections")
	// docs/operations.md, pgsse doctor: doctor prints the descriptor budget, each consumer's
	// share, after fd limit.
	require.NotEmpty(t, table)
	assert.Regexp(t, `^ +descriptor budget of RLIMIT_NOFILE \d+:$`, table[0])
	assert.Regexp(t, `(?m)^ +64  admin connections \(--admin-max-connections\)$`, strings.Join(table, "\n"))
	assert.Regexp(t, `(?m)^ +\d+  SSE connections \(--max-connections default\)$`, strings.Join(table, "\n"))
	assert.Contains(t, r.stdout, lines[5]+"\n"+table[0]+"\n", "the table follows the fd limit check")

	// --procs: a replay pool per process, still one LISTEN session.
	r = pgsse(t, env, "doctor", "--procs", "3")
	requireOK(t, r)
	assert.Contains(t, r.stdout, "connection budget: pgsse holds 16 PostgreSQL connections with --procs 3 (1 LISTEN + 3 processes × (4 replay + 1 publishing); for 15s after the first process dies, each of its 2 siblings holds a LISTEN session of its own)")
	// --presence-streams: presence's writer session, in both budgets.
	r = pgsse(t, env, "doctor", "--procs", "2", "--presence-streams", "room/*")
	requireOK(t, r)
	assert.Contains(t, r.stdout, "connection budget: pgsse holds 13 PostgreSQL connections with --procs 2 (1 LISTEN + 2 processes × (4 replay + 1 publishing + 1 presence);")
	assert.Regexp(t, `(?m)^ +1  PostgreSQL session for presence \(--presence-streams\)$`, r.stdout)
	r = pgsse(t, env, "doctor", "--procs", "0")
	assert.Equal(t, 2, r.code)
	assert.Contains(t, r.stderr, "--procs: invalid process count \"0\" (1 to 256, or auto for one per CPU)")

	// --max-connections beyond the fd limit.
	r = pgsse(t, env, "doctor", "--max-connections", strconv.Itoa(1<<30))
	assert.Equal(t, 1, r.code)
	assert.Regexp(t, `(?m)^FAIL  fd limit: --max-connections 1073741824 exceeds RLIMIT_NOFILE`, r.stdout)

	// Hub socket: too loose, then right, then stale.
	dir := t.TempDir()
	sock := filepath.Join(dir, "hub.sock")
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	require.NoError(t, os.Chmod(sock, 0o666))
	r = pgsse(t, append(env, "PGSSE_HUB_SOCKET="+sock), "doctor")
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stdout, "FAIL  hub socket: "+sock+" has mode 0666, looser than --hub-socket-mode 0600; a server answers\n")
	require.NoError(t, os.Chmod(sock, 0o600))
	r = pgsse(t, env, "doctor", "--hub-socket", sock)
	requireOK(t, r)
	assert.Contains(t, r.stdout, "ok    hub socket: "+sock+" has mode 0600; a server answers\n")
	assert.Contains(t, r.stdout, "6 PostgreSQL connections (1 LISTEN + 4 replay + 1 publishing) however many worker processes share the hub; without it each would hold a LISTEN session of its own")
	r = pgsse(t, env, "doctor", "--hub-socket", sock, "--workers", "8")
	requireOK(t, r)
	assert.Contains(t, r.stdout, "6 PostgreSQL connections (1 LISTEN + 4 replay + 1 publishing) for all 8 workers (--workers); without the hub they would hold 8 LISTEN sessions")
	r = pgsse(t, env, "doctor", "--hub-socket", sock, "--hub-socket-mode", "0660")
	requireOK(t, r)
	assert.Contains(t, r.stdout, "warn  hub socket: "+sock+" has mode 0600, not --hub-socket-mode 0660")
	regular := writeFile(t, "not-a-socket", nil)
	r = pgsse(t, env, "doctor", "--hub-socket", regular)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stdout, "FAIL  hub socket: "+regular+" is not a socket")

	// Unreachable database.
	r = pgsse(t, nil, "doctor", "--database-url", "postgres://u@127.0.0.1:1/db?connect_timeout=5")
	assert.Equal(t, 1, r.code)
	assert.Regexp(t, `^FAIL  connectivity: connect: `, r.stdout)
}

// Issue 23: with synchronous_commit off, PostgreSQL acknowledges a publish before it is on disk,
// so a crash loses events pgsse already delivered and reuses their ids. doctor warns when the
// setting a session of pgsse's role in pgsse's database gets is off — wherever it comes from —
// or when pgsse's publishing functions carry it, and says how to turn it on.
func TestDoctorDurability(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	env := []string{"DATABASE_URL=" + dsn}
	requireOK(t, pgsse(t, env, "migrate"))
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	db := strings.TrimPrefix(u.Path, "/")
	check := func() string {
		t.Helper()
		r := pgsse(t, env, "doctor")
		requireOK(t, r) // a warning, not a failure
		line := regexp.MustCompile(`(?m)^.*durability: .*$`).FindString(r.stdout)
		require.NotEmpty(t, line, r.stdout)
		return line
	}

	pgtest.Exec(t, dsn, `ALTER DATABASE "`+db+`" SET synchronous_commit = off`)
	line := check()
	assert.True(t, strings.HasPrefix(line, "warn  durability: synchronous_commit is off for user "+u.User.Username()+" in database "+db+" (from ALTER DATABASE … SET): "), line)
	assert.Contains(t, line, "a crash can lose events pgsse already answered and delivered")
	assert.Contains(t, line, "ids are then reused")
	assert.Contains(t, line, `ALTER ROLE "`+u.User.Username()+`" IN DATABASE "`+db+`" SET synchronous_commit = on`)

	pgtest.Exec(t, dsn, `ALTER DATABASE "`+db+`" SET synchronous_commit = on`)
	assert.Equal(t, "ok    durability: synchronous_commit is on for user "+u.User.Username()+" in database "+db+": a publish pgsse acknowledged survives a PostgreSQL crash", check())

	// A SET on the function pgsse publishes through wins inside it.
	pgtest.Exec(t, dsn, `ALTER FUNCTION pgsse.publish_many SET synchronous_commit = off`)
	line = check()
	assert.True(t, strings.HasPrefix(line, "warn  durability: pgsse.publish_many SET synchronous_commit=off: "), line)

	// The connection string's options count too: they are what pgsse's sessions get.
	pgtest.Exec(t, dsn, `ALTER FUNCTION pgsse.publish_many RESET synchronous_commit`)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	r := pgsse(t, []string{"DATABASE_URL=" + dsn + sep + "options=" + "-c%20synchronous_commit%3Doff"}, "doctor")
	requireOK(t, r)
	assert.Contains(t, r.stdout, "warn  durability: synchronous_commit is off for user "+u.User.Username()+" in database "+db+" (from the connection string's options or PGOPTIONS)")
}

// TestBadInput: every bad configuration exits non-zero with exactly one line that names
// the flag or variable and the problem, before anything starts.
func TestBadInput(t *testing.T) {
	key := []string{"--jwt-secret", "0123456789abcdef0123456789abcdef"}
	cases := []struct {
		name string
		env  []string
		args []string
		want string // the whole line after "pgsse: "
	}{
		{"duration", nil, append([]string{"serve", "--heartbeat", "abc"}, key...), `--heartbeat: invalid duration "abc" (e.g. 15s, 2m, 1h30m)`},
		{"duration, default command", nil, []string{"--retry=x"}, `--retry: invalid duration "x" (e.g. 15s, 2m, 1h30m)`},
		{"negative duration", nil, append([]string{"--heartbeat", "-1s"}, key...), `--heartbeat: must be positive`},
		{"int", nil, []string{"--max-connections", "lots"}, `--max-connections: invalid integer "lots"`},
		{"int too big for the fd limit", nil, append([]string{"--max-connections", "1073741824"}, key...), "--max-connections: 1073741824 exceeds what the file-descriptor limit allows"},
		{"int zero", nil, append([]string{"--max-connections", "0"}, key...), "--max-connections: must be at least 1"},
		{"size", nil, []string{"--hub-worker-buffer", "1MB"}, `--hub-worker-buffer: invalid size "1MB" (bytes, or with a KiB, MiB or GiB suffix, e.g. 1MiB)`},
		{"size too small", nil, append([]string{"--hub-worker-buffer", "1KiB"}, key...), "--hub-worker-buffer: must be between 131080 (two maximum frames) and 1GiB"},
		{"heartbeat too short", nil, append([]string{"--heartbeat", "10ms"}, key...), "--heartbeat: must be at least 100ms"},
		{"header size", nil, append([]string{"--max-header-bytes", "10"}, key...), "--max-header-bytes: must be between 1024 and 1048576"},
		{"streams per connection", nil, append([]string{"--max-streams-per-connection", "0"}, key...), "--max-streams-per-connection: must be between 1 and 255"},
		{"streams per connection from env", []string{"PGSSE_MAX_STREAMS_PER_CONNECTION=256"}, key, "--max-streams-per-connection (from PGSSE_MAX_STREAMS_PER_CONNECTION): must be between 1 and 255"},
		{"presence interval", nil, append([]string{"--presence-interval", "1ms"}, key...), "--presence-interval: must be between 10ms and 1h0m0s"},
		{"presence max list from env", []string{"PGSSE_PRESENCE_MAX_LIST=0"}, key, "--presence-max-list (from PGSSE_PRESENCE_MAX_LIST): must be between 1 and 100000"},
		{"presence stream pattern", nil, append([]string{"--presence-streams", "room/ x"}, key...), `--presence-streams: pattern "room/ x": stream name may contain only A-Z a-z 0-9 and . _ : @ / = + ~ -`},
		{"publish size", []string{"PGSSE_MAX_PUBLISH_BYTES=2GiB"}, key, "--max-publish-bytes (from PGSSE_MAX_PUBLISH_BYTES): must be between 1 and 1GiB"},
		{"outbound memory", []string{"PGSSE_MAX_OUTBOUND_MEMORY=64KiB"}, key, "--max-outbound-memory (from PGSSE_MAX_OUTBOUND_MEMORY): must be between 1MiB and 1024GiB"},
		{"mode", nil, []string{"--hub-socket-mode", "rw-------"}, `--hub-socket-mode: invalid mode "rw-------" (octal, e.g. 0600)`},
		{"mode out of range", nil, []string{"--hub-socket-mode", "1777"}, `--hub-socket-mode: mode "1777" out of range (0000-0777)`},
		{"bool", []string{"PGSSE_PPROF=maybe"}, nil, `--pprof (from PGSSE_PPROF): invalid boolean "maybe" (use true or false)`},
		{"unknown flag", nil, []string{"serve", "--no-such-flag"}, "serve: unknown flag --no-such-flag (pgsse serve --help lists its flags)"},
		{"unknown flag, migrate", nil, []string{"migrate", "-x=1"}, "migrate: unknown flag --x (pgsse migrate --help lists its flags)"},
		{"unknown flag, no command", nil, []string{"--bogus"}, "unknown flag --bogus (pgsse --help lists the commands; pgsse serve --help the flags of serve, the default command)"},
		{"help for an unknown command", nil, []string{"help", "frobnicate"}, `help: unknown command "frobnicate" (commands: serve, migrate, token, publish, doctor, version)`},
		{"missing value", nil, []string{"serve", "--listen"}, "--listen: needs a value"},
		{"bad listen", nil, append([]string{"--listen", "8080"}, key...), `--listen: invalid address "8080" (want host:port, e.g. :8080)`},
		{"bad DSN", nil, append([]string{"--database-url", "postgres://u@h:notaport/db"}, key...), "--database-url: cannot parse `postgres://u@h:notaport/db`: invalid port"},
		{"bad DSN, migrate", nil, []string{"migrate", "--database-url", "postgres://u@h:notaport/db"}, "--database-url: cannot parse `postgres://u@h:notaport/db`: invalid port"},
		{"missing secret file", nil, []string{"--jwt-secret-file", "/nope"}, "--jwt-secret-file: open /nope: no such file or directory"},
		{"missing secret file from env", []string{"PGSSE_JWT_SECRET_FILE=/nope"}, nil, "--jwt-secret-file (from PGSSE_JWT_SECRET_FILE): open /nope: no such file or directory"},
		{"empty secret file", nil, []string{"--jwt-secret-file", os.DevNull}, "--jwt-secret-file: /dev/null is empty"},
		{"secret and secret file", nil, []string{"--jwt-secret", "a", "--jwt-secret-file", "/x"}, "--jwt-secret and --jwt-secret-file are mutually exclusive"},
		{"not a public key", nil, []string{"--jwt-public-key-file", os.DevNull}, "--jwt-public-key-file: no PEM block"},
		{"no key", nil, []string{"serve"}, "no JWT key: set --jwt-secret, --jwt-secret-file or --jwt-public-key-file (or --public-streams for token-free streams)"},
		{"log format", nil, []string{"--log-format", "xml"}, "--log-format: must be text or json"},
		{"log level", []string{"PGSSE_LOG_LEVEL=loud"}, nil, "--log-level (from PGSSE_LOG_LEVEL): must be debug, info, warn or error"},
		{"public stream pattern", nil, []string{"--public-streams", "news/*,bad name"}, `--public-streams: pattern "bad name": stream name may contain only A-Z a-z 0-9 and . _ : @ / = + ~ -`},
		{"cors wildcard", nil, append([]string{"--cors-origins", "*"}, key...), `--cors-origins: "*" is not allowed: list exact origins (credentials need them)`},
		{"cors with path", nil, append([]string{"--cors-origins", "https://a.example/app"}, key...), `--cors-origins: "https://a.example/app" is not an origin (want scheme://host[:port], e.g. https://app.example.com)`},
		{"pprof without admin", nil, append([]string{"--admin-listen=", "--pprof"}, key...), "--pprof needs an admin address (--admin-listen)"},
		{"unexpected argument", nil, []string{"serve", "extra"}, `serve: unexpected argument "extra"`},
		{"unknown command", nil, []string{"frobnicate"}, `unknown command "frobnicate" (commands: serve, migrate, token, publish, doctor, version)`},
		{"env names the variable", []string{"PGSSE_HEARTBEAT=abc"}, key, `--heartbeat (from PGSSE_HEARTBEAT): invalid duration "abc" (e.g. 15s, 2m, 1h30m)`},
		// The flag wins over the bad variable: the run gets past it to the next problem.
		{"flag wins over env", []string{"PGSSE_HEARTBEAT=abc"}, []string{"--heartbeat", "1s"}, "no JWT key: set --jwt-secret, --jwt-secret-file or --jwt-public-key-file (or --public-streams for token-free streams)"},
		{"token: no key", nil, []string{"token", "--stream", "s"}, "no JWT key: set --jwt-secret, --jwt-secret-file or --private-key-file"},
		{"token: no grant", nil, []string{"token", "--jwt-secret", "x"}, "token: give at least one --stream, --channel or --publish"},
		{"token: bad publish pattern", nil, []string{"token", "--publish", "a*b", "--jwt-secret", "x"}, `--publish: pattern "a*b": stream pattern may hold * only as its last byte (a prefix pattern)`},
		{"token: bad tag", nil, []string{"token", "--stream", "s", "--tag", "a\tb", "--jwt-secret", "x"}, `--tag: tag "a\tb": audience tag must not contain control characters`},
		{"token: bad ttl", nil, []string{"token", "--stream", "s", "--ttl", "forever"}, `--ttl: invalid duration "forever" (e.g. 15s, 2m, 1h30m)`},
		{"token: bad pattern", nil, []string{"token", "--stream", "a b", "--jwt-secret", "x"}, `--stream: pattern "a b": stream name may contain only A-Z a-z 0-9 and . _ : @ / = + ~ -`},
		{"token: missing key file", nil, []string{"token", "--stream", "s", "--private-key-file", "/nope.pem"}, "--private-key-file: open /nope.pem: no such file or directory"},
		{"token: secret and key file", nil, []string{"token", "--stream", "s", "--jwt-secret", "x", "--private-key-file", "/k"}, "--private-key-file and --jwt-secret are mutually exclusive"},
		{"publish: missing value", nil, []string{"publish", "s", "d", "--event"}, "--event: needs a value"},
		{"publish: bad audience", nil, []string{"publish", "s", "d", "--audience", "a\x01"}, "--audience: audience tag must not contain control characters"},
		{"doctor: bad workers", nil, []string{"doctor", "--workers", "-1"}, "--workers: must not be negative"},
		{"procs", nil, []string{"--procs", "many"}, `--procs: invalid process count "many" (1 to 256, or auto for one per CPU)`},
		{"procs too many", []string{"PGSSE_PROCS=257"}, key, `--procs (from PGSSE_PROCS): invalid process count "257" (1 to 256, or auto for one per CPU)`},
		{"sibling marker from outside", []string{"PGSSE_INTERNAL_SIBLING=yes"}, key,
			`PGSSE_INTERNAL_SIBLING: not a marker set by pgsse serve --procs (it is internal): "yes"`},
		{"version: argument", nil, []string{"version", "now"}, `version: unexpected argument "now"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			line := errorLine(t, pgsse(t, tc.env, tc.args...), 2)
			if strings.HasSuffix(tc.want, "allows") {
				assert.True(t, strings.HasPrefix(line, tc.want), line)
				return
			}
			assert.Equal(t, tc.want, line)
		})
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"help"}, {"-h"}, {"help", "help"}} {
		r := pgsse(t, nil, args...)
		requireOK(t, r)
		assert.True(t, strings.HasPrefix(r.stdout, "Usage: pgsse [command] [flags]\n"), "%v: %s", args, r.stdout)
	}
	for _, cmd := range []string{"serve", "migrate", "token", "publish", "doctor", "version"} {
		t.Run(cmd, func(t *testing.T) {
			r := pgsse(t, nil, cmd, "--help")
			requireOK(t, r)
			assert.True(t, strings.HasPrefix(r.stdout, "Usage: pgsse "+cmd), r.stdout)
			// The one-line summary from the top-level help follows the synopsis.
			assert.Contains(t, r.stdout, "\n\n"+strings.ToUpper(commandSummary(cmd)[:1]), r.stdout)
			// `pgsse help CMD` is the same text; so is -h.
			assert.Equal(t, r, pgsse(t, nil, "help", cmd), "pgsse help %s", cmd)
			assert.Equal(t, r, pgsse(t, nil, cmd, "-h"))
			// Every flag shows a placeholder that says what goes there, never a generic one;
			// a command without flags prints no Flags header.
			assert.NotRegexp(t, `--\S+ (VALUE|TEXT|value)\b`, r.stdout)
			if strings.Contains(r.stdout, "Flags") {
				assert.Regexp(t, `Flags \(each also from PGSSE_<NAME>; flags win\):\n  --`, r.stdout)
			}
		})
	}
	r := pgsse(t, nil, "serve", "--help")
	assert.Contains(t, r.stdout, "--max-connections N")
	assert.Contains(t, r.stdout, "[PGSSE_MAX_CONNECTIONS]")
	// docs/operations.md, Configuration, lists serve's flags with their defaults (as written there)
	// and variables; the help says the same.
	for flag, def := range map[string]string{
		"database-url": "", "listen": ":8080", "admin-listen": "127.0.0.1:9090", "hub-socket": "",
		"hub-socket-mode": "0600", "hub-worker-buffer": "1MiB", "jwt-secret": "", "jwt-secret-file": "",
		"jwt-public-key-file": "", "jwt-issuer": "", "jwt-audience": "", "jwt-allow-no-exp": "",
		"public-streams": "", "cors-origins": "", "max-connections": "", "max-header-bytes": "8192",
		"max-streams-per-connection": "64",
		"heartbeat":                  "15s", "retry": "2s", "retention": "24h", "pprof": "", "log-level": "",
		"log-format": "text", "procs": "1",
	} {
		line := regexp.MustCompile(`(?m)^  --` + flag + `\b.*$`).FindString(r.stdout)
		if !assert.NotEmpty(t, line, "--%s is listed", flag) {
			continue
		}
		assert.Contains(t, line, "["+envName(flag)+"]")
		if def != "" {
			assert.Contains(t, line, "(default "+def+")")
		}
	}
	r = pgsse(t, nil, "token", "--help")
	for _, want := range []string{"--stream PATTERN ", "--channel PATTERN ", "--tag TAG ", "--jwt-secret-file FILE ", "--ttl DURATION "} {
		assert.Contains(t, r.stdout, want)
	}
	r = pgsse(t, nil, "version", "--help")
	assert.Equal(t, "Usage: pgsse version\n\nPrint the version.\n", r.stdout)
}
