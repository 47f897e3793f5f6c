// Package pgtest gives tests a real PostgreSQL: a fresh database on the shared test
// cluster named by PGSSE_TEST_DATABASE_URL (which `make test` starts) — empty, or migrated
// to pgsse's schema —, connections and queries that fail the test on error, or a private
// throwaway cluster for tests that restart or reconfigure the server.
//
// A test that needs PostgreSQL and finds none fails, saying how to run it; it never skips.
// A query helper that expects a row fails when there is none, rather than answering "".
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// EnvURL is the environment variable naming the shared test cluster (a superuser DSN).
const EnvURL = "PGSSE_TEST_DATABASE_URL"

// URL returns the shared test cluster's superuser DSN, or fails the test with the
// command that provides one.
func URL(t testing.TB) string {
	t.Helper()
	u := os.Getenv(EnvURL)
	if u == "" {
		t.Fatalf("%s is not set: this test needs PostgreSQL. Run `make test`, or "+
			"`scripts/pg.sh with go test ./...` to start a throwaway cluster for one run.", EnvURL)
	}
	return u
}

// NewDatabase creates an empty database on the shared cluster and returns its DSN.
// The database is dropped (terminating its sessions) when the test ends.
func NewDatabase(t testing.TB) string {
	t.Helper()
	return newDatabaseOn(t, URL(t))
}

func newDatabaseOn(t testing.TB, admin string) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "pgsse_t_" + hex.EncodeToString(b[:])
	Exec(t, admin, "CREATE DATABASE "+name)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgconn.Connect(ctx, admin)
		if err != nil {
			t.Logf("pgtest: drop %s: %v", name, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)").ReadAll(); err != nil {
			t.Logf("pgtest: drop %s: %v", name, err)
		}
	})
	return WithDatabase(t, admin, name)
}

// WithDatabase returns dsn with its database replaced by name.
func WithDatabase(t testing.TB, dsn, name string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("pgtest: parse %q: %v", dsn, err)
	}
	u.Path = "/" + name
	return u.String()
}

// Migrator installs pgsse's schema on a connection: store.Migrate. It is a parameter, not
// an import, so that store's own tests can use this package too.
type Migrator func(ctx context.Context, conn *pgconn.PgConn) (from, to int, err error)

// Migrated creates a database on the shared cluster (as NewDatabase), migrates it with
// migrate (store.Migrate) and returns its DSN.
func Migrated(t testing.TB, migrate Migrator) string {
	t.Helper()
	return Migrate(t, NewDatabase(t), migrate)
}

// Migrate migrates the database at dsn (one of a private Cluster, say) with migrate and
// returns dsn.
func Migrate(t testing.TB, dsn string, migrate Migrator) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("pgtest: connect to migrate: %v", err)
	}
	defer c.Close(context.Background())
	if _, _, err := migrate(ctx, c); err != nil {
		t.Fatalf("pgtest: migrate: %v", err)
	}
	return dsn
}

// Connect opens a connection to dsn, closed when the test ends; it fails the test if
// PostgreSQL cannot be reached within 30 s.
func Connect(t testing.TB, dsn string) *pgconn.PgConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// Exec runs sql (simple protocol, may hold several statements) on a new connection.
func Exec(t testing.TB, dsn, sql string) []*pgconn.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer c.Close(context.Background())
	return run(ctx, t, c, sql)
}

// ExecOn is Exec on an open connection (one whose session the test keeps: a NOTIFY
// sender, a transaction held open).
func ExecOn(t testing.TB, c *pgconn.PgConn, sql string) []*pgconn.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return run(ctx, t, c, sql)
}

func run(ctx context.Context, t testing.TB, c *pgconn.PgConn, sql string) []*pgconn.Result {
	t.Helper()
	res, err := c.Exec(ctx, sql).ReadAll()
	if err != nil {
		t.Fatalf("pgtest: %s: %v", firstLine(sql), err)
	}
	return res
}

// QueryValue runs a query returning one row with one column and returns it as text
// ("" for NULL); no row, or more than one, fails the test.
func QueryValue(t testing.TB, dsn, sql string) string {
	t.Helper()
	return oneValue(t, sql, Exec(t, dsn, sql))
}

// QueryValueOn is QueryValue on an open connection.
func QueryValueOn(t testing.TB, c *pgconn.PgConn, sql string) string {
	t.Helper()
	return oneValue(t, sql, ExecOn(t, c, sql))
}

func oneValue(t testing.TB, sql string, res []*pgconn.Result) string {
	t.Helper()
	last := res[len(res)-1]
	if len(last.Rows) != 1 || len(last.Rows[0]) != 1 {
		t.Fatalf("pgtest: %s: want one value, got %d rows", firstLine(sql), len(last.Rows))
	}
	return string(last.Rows[0][0])
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + "…"
	}
	return s
}

// Cluster is a private throwaway PostgreSQL cluster, for tests that restart, stop or
// reconfigure the server. Created with StartCluster; removed when the test ends.
type Cluster struct {
	Dir  string // holds data/, the Unix socket, server.log
	Port string
	t    testing.TB
}

// ClusterOptions configure StartCluster.
type ClusterOptions struct {
	SSL bool // ssl=on with a self-signed certificate made for this cluster
}

// StartCluster starts a private cluster with scripts/pg.sh (about a second).
func StartCluster(t testing.TB, opts ClusterOptions) *Cluster {
	t.Helper()
	dir, err := os.MkdirTemp("", "pgsse-pgtest-")
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"start", dir}
	if opts.SSL {
		args = append(args, "--ssl")
	}
	cmd := exec.Command(Script(), args...)
	cmd.WaitDelay = 5 * time.Second // the script's children must not keep us waiting
	if _, err := cmd.Output(); err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		_ = exec.Command(Script(), "stop", dir).Run()
		t.Fatalf("pgtest: start cluster: %v\n%s", err, stderr)
	}
	port, err := os.ReadFile(filepath.Join(dir, "port"))
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{Dir: dir, Port: strings.TrimSpace(string(port)), t: t}
	t.Cleanup(func() { _ = exec.Command(Script(), "stop", dir).Run() })
	return c
}

// URL is the superuser DSN over TCP with the given sslmode ("disable", "require", …).
func (c *Cluster) URL(sslmode string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%s/postgres?sslmode=%s", c.Port, sslmode)
}

// SocketURL is the superuser DSN over the cluster's Unix socket.
func (c *Cluster) SocketURL() string {
	return fmt.Sprintf("host=%s port=%s user=postgres dbname=postgres sslmode=disable", c.Dir, c.Port)
}

// NewDatabase creates a database on this cluster (see the package-level NewDatabase).
func (c *Cluster) NewDatabase(t testing.TB) string {
	t.Helper()
	return newDatabaseOn(t, c.URL("disable"))
}

// Restart runs `pg_ctl restart -m fast`.
func (c *Cluster) Restart() { c.pgctl("-m", "fast", "-o", "-p "+c.Port, "-l", c.logFile(), "restart") }

// Stop runs `pg_ctl stop -m fast`.
func (c *Cluster) Stop() { c.pgctl("-m", "fast", "stop") }

// StopImmediate runs `pg_ctl stop -m immediate`: no shutdown checkpoint, so WAL not yet
// written is lost (with synchronous_commit off, commits already acknowledged) and the next
// Start runs crash recovery.
func (c *Cluster) StopImmediate() { c.pgctl("-m", "immediate", "stop") }

// Start brings a stopped cluster back on the same port.
func (c *Cluster) Start() { c.pgctl("-o", "-p "+c.Port, "-l", c.logFile(), "start") }

func (c *Cluster) logFile() string { return filepath.Join(c.Dir, "server.log") }

func (c *Cluster) pgctl(args ...string) {
	c.t.Helper()
	bin, err := exec.Command(Script(), "bindir").Output()
	if err != nil {
		c.t.Fatalf("pgtest: bindir: %v", err)
	}
	if err := PGCtl(context.Background(), strings.TrimSpace(string(bin)), filepath.Join(c.Dir, "data"),
		append([]string{"-w", "-t", "60"}, args...)...); err != nil {
		c.t.Fatalf("pgtest: %v", err)
	}
}

// PGCtl runs bin/pg_ctl -D dataDir args within ctx — as the postgres OS user when this
// process is root, as scripts/pg.sh does — and returns its output in the error when it fails.
// Its output goes to a file beside dataDir, never a pipe: a postmaster it starts would inherit
// the pipe, and it would not close until the server stops. For harnesses that are not tests
// (bench/chaos) as well as Cluster.
func PGCtl(ctx context.Context, bin, dataDir string, args ...string) error {
	full := append([]string{"-D", dataDir}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "pg_ctl"), full...)
	if os.Geteuid() == 0 {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", "postgres", "--", cmd.Path}, full...)...)
	}
	out, err := os.CreateTemp(filepath.Dir(dataDir), "pg_ctl-*.out")
	if err != nil {
		return err
	}
	defer os.Remove(out.Name())
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		msg, _ := os.ReadFile(out.Name())
		return fmt.Errorf("pg_ctl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(msg)))
	}
	return nil
}

// Script is the absolute path of scripts/pg.sh.
func Script() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "scripts", "pg.sh")
}
