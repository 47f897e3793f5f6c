//go:build linux

package chaos

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/store"
)

// cluster is the run's own PostgreSQL (scripts/pg.sh start): the run restarts it, crashes it
// and changes its settings, so it never uses a cluster it did not start.
type cluster struct {
	script string // scripts/pg.sh
	dir    string // pg.sh's directory: data/, port, server.log
	bin    string // PostgreSQL's bin directory
	port   string
	admin  string // superuser DSN
}

func startCluster(ctx context.Context, script, dir string) (*cluster, error) {
	out, err := exec.CommandContext(ctx, script, "start", dir).Output()
	if err != nil {
		_ = exec.Command(script, "stop", dir).Run()
		return nil, fmt.Errorf("%s start: %w", script, exitDetail(err))
	}
	bin, err := exec.CommandContext(ctx, script, "bindir").Output()
	if err != nil {
		_ = exec.Command(script, "stop", dir).Run()
		return nil, fmt.Errorf("%s bindir: %w", script, exitDetail(err))
	}
	port, _ := os.ReadFile(filepath.Join(dir, "port"))
	c := &cluster{script: script, dir: dir, bin: strings.TrimSpace(string(bin)),
		port: strings.TrimSpace(string(port)), admin: strings.TrimSpace(string(out))}
	// pg.sh turns synchronous_commit off for tests: the run wants PostgreSQL's default, so
	// that only the pg-crash-async fault can lose an acknowledged commit. (fsync stays off:
	// the run crashes PostgreSQL, never the machine, and the kernel keeps what was written.)
	if err := c.exec(ctx, "ALTER SYSTEM SET synchronous_commit = on", "SELECT pg_reload_conf()"); err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

func exitDetail(err error) error {
	if ee, ok := err.(*exec.ExitError); ok && len(ee.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
	}
	return err
}

// stop stops the cluster and removes its directory, keeping its log beside it
// (<dir>-server.log) for a run that failed.
func (c *cluster) stop() {
	if b, err := os.ReadFile(filepath.Join(c.dir, "server.log")); err == nil {
		_ = os.WriteFile(c.dir+"-server.log", b, 0o644)
	}
	_ = exec.Command(c.script, "stop", c.dir).Run()
}

// pgctl runs pg_ctl on the run's cluster (the test kit's pgtest.PGCtl: as the postgres OS
// user when we are root, as pg.sh does).
func (c *cluster) pgctl(ctx context.Context, args ...string) error {
	return pgtest.PGCtl(ctx, c.bin, filepath.Join(c.dir, "data"), args...)
}

// restartFast is a fast shutdown (every session terminated, a checkpoint) and a start.
func (c *cluster) restartFast(ctx context.Context) error {
	return c.pgctl(ctx, "-m", "fast", "-w", "-t", "120", "-l", filepath.Join(c.dir, "server.log"), "restart")
}

// crash stops PostgreSQL with -m immediate (no checkpoint, every backend killed: a crash
// as far as the data is concerned), waits down, and starts it again (crash recovery).
func (c *cluster) crash(ctx context.Context, down time.Duration) error {
	if err := c.pgctl(ctx, "-m", "immediate", "-w", "-t", "60", "stop"); err != nil {
		return err
	}
	_ = sleepCtx(ctx, down)
	return c.start(ctx)
}

func (c *cluster) start(ctx context.Context) error {
	return c.pgctl(ctx, "-w", "-t", "120", "-l", filepath.Join(c.dir, "server.log"), "-o", "-p "+c.port, "start")
}

// exec runs statements on the admin connection, retrying while PostgreSQL is restarting.
func (c *cluster) exec(ctx context.Context, sqls ...string) error {
	var last error
	for try := 0; try < 60; try++ {
		last = execOn(ctx, c.admin, sqls...)
		if last == nil || ctx.Err() != nil {
			return last
		}
		_ = sleepCtx(ctx, 500*time.Millisecond)
	}
	return last
}

func execOn(ctx context.Context, dsn string, sqls ...string) error {
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	conn, err := pgconn.Connect(cctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for _, s := range sqls {
		if _, err := conn.Exec(cctx, s).ReadAll(); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// database is the run's database: pgsse's schema, and an audit table that keeps every row
// pgsse.prune deletes (a BEFORE DELETE trigger, in prune's own transaction), so the checker
// knows every event ever committed. The trigger fires only on DELETE: publishing is untouched.
type database struct {
	URL  string
	Name string
}

const auditSQL = `
CREATE TABLE chaos_pruned (LIKE pgsse.events);
CREATE FUNCTION chaos_keep_pruned() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_pruned SELECT OLD.*;
    RETURN OLD;
END $$;
CREATE TRIGGER chaos_keep_pruned BEFORE DELETE ON pgsse.events
    FOR EACH ROW EXECUTE FUNCTION chaos_keep_pruned();`

func (c *cluster) newDatabase(ctx context.Context) (*database, error) {
	name := "pgsse_chaos"
	if err := c.exec(ctx, "CREATE DATABASE "+name); err != nil {
		return nil, err
	}
	u, err := url.Parse(c.admin)
	if err != nil {
		return nil, err
	}
	u.Path = "/" + name
	d := &database{URL: u.String(), Name: name}
	conn, err := pgconn.Connect(ctx, d.URL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	if _, _, err := store.Migrate(ctx, conn); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	if _, err := conn.Exec(ctx, auditSQL).ReadAll(); err != nil {
		return nil, fmt.Errorf("audit table: %w", err)
	}
	return d, nil
}
