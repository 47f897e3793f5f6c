//go:build linux

package bench

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgsse/pgsse/names"
	"github.com/pgsse/pgsse/store"
)

// Cluster is the PostgreSQL the benchmarks create their databases on: one named by a
// superuser DSN, or a throwaway one started with scripts/pg.sh (stopped by Stop).
type Cluster struct {
	AdminURL string
	script   string
	dir      string
}

// UseCluster uses an existing cluster (a superuser DSN).
func UseCluster(adminURL string) *Cluster { return &Cluster{AdminURL: adminURL} }

// StartCluster starts a throwaway cluster with script (scripts/pg.sh) in a new directory.
func StartCluster(ctx context.Context, script string) (*Cluster, error) {
	dir, err := os.MkdirTemp("", "pgsse-bench-pg.")
	if err != nil {
		return nil, err
	}
	if err := os.Remove(dir); err != nil { // pg.sh wants to create it
		return nil, err
	}
	cmd := exec.CommandContext(ctx, script, "start", dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		_ = exec.Command(script, "stop", dir).Run()
		return nil, fmt.Errorf("%s start: %w", script, err)
	}
	return &Cluster{AdminURL: strings.TrimSpace(string(out)), script: script, dir: dir}, nil
}

// Stop stops a cluster this process started; no-op otherwise.
func (c *Cluster) Stop() {
	if c == nil || c.dir == "" {
		return
	}
	_ = exec.Command(c.script, "stop", c.dir).Run()
	c.dir = ""
}

// MakeDurable gives a cluster this process started PostgreSQL's own defaults for
// durability — fsync, synchronous_commit and full_page_writes on — where scripts/pg.sh turns
// them off for tests (all three take effect on reload). Publishing figures then include what
// a COMMIT costs in production: a WAL flush.
func (c *Cluster) MakeDurable(ctx context.Context) error {
	if c.dir == "" {
		return errors.New("refusing to change the settings of a cluster this process did not start")
	}
	for _, sql := range []string{"ALTER SYSTEM SET fsync = on", "ALTER SYSTEM SET synchronous_commit = on",
		"ALTER SYSTEM SET full_page_writes = on", "SELECT pg_reload_conf()"} {
		if err := execSQL(ctx, c.AdminURL, sql); err != nil {
			return err
		}
	}
	return nil
}

// Database is a fresh database with pgsse's schema, dropped by Drop.
type Database struct {
	URL   string
	name  string
	admin string
}

// NewDatabase creates a database on c and migrates it to pgsse's schema.
func (c *Cluster) NewDatabase(ctx context.Context) (*Database, error) {
	name := "pgsse_bench_" + randHex(6)
	if err := execSQL(ctx, c.AdminURL, "CREATE DATABASE "+name); err != nil {
		return nil, err
	}
	u, err := url.Parse(c.AdminURL)
	if err != nil {
		return nil, err
	}
	u.Path = "/" + name
	d := &Database{URL: u.String(), name: name, admin: c.AdminURL}
	conn, err := pgconn.Connect(ctx, d.URL)
	if err != nil {
		d.Drop()
		return nil, err
	}
	defer conn.Close(context.Background())
	if _, _, err := store.Migrate(ctx, conn); err != nil {
		d.Drop()
		return nil, fmt.Errorf("migrate: %w", err)
	}
	return d, nil
}

// Drop drops the database, terminating its sessions.
func (d *Database) Drop() {
	if d == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = execSQL(ctx, d.admin, "DROP DATABASE IF EXISTS "+d.name+" WITH (FORCE)")
}

// BackendPIDs lists the PostgreSQL server processes connected to this database.
func (d *Database) BackendPIDs(ctx context.Context) ([]int, error) {
	conn, err := pgconn.Connect(ctx, d.admin)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	res := conn.ExecParams(ctx, "SELECT pid FROM pg_stat_activity WHERE datname = $1",
		[][]byte{[]byte(d.name)}, nil, nil, nil).Read()
	if res.Err != nil {
		return nil, res.Err
	}
	var pids []int
	for _, r := range res.Rows {
		var pid int
		if _, err := fmt.Sscan(string(r[0]), &pid); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

func execSQL(ctx context.Context, dsn, sql string) error {
	conn, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql).ReadAll()
	return err
}

// Publisher publishes benchmark events with pgsse.publish on its own connection and records,
// per sequence number, the wall-clock time of the event's reference point (Ref): for
// PublishTx the moment COMMIT is sent, for Publish (autocommit) the moment the statement is
// sent. Mark, when set, is told the reference time before the commit can complete, so a
// receiver never sees an event before its reference time is known.
type Publisher struct {
	conn   *pgconn.PgConn
	stream string
	size   int
	buf    []byte
	sql    []byte
	Seq    int64
	Ref    []int64 // UnixNano, index seq
	Ack    []int64 // UnixNano when the commit was acknowledged
	Mark   func(seq, refNs int64)
}

// NewPublisher connects to dsn. Events go to stream with data of size bytes.
func NewPublisher(ctx context.Context, dsn, stream string, size, maxSeq int) (*Publisher, error) {
	if names.CheckStream(stream) != nil || strings.ContainsAny(stream, "'\\") {
		return nil, fmt.Errorf("publisher: stream %q must be a plain name", stream)
	}
	conn, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	return &Publisher{conn: conn, stream: stream, size: size,
		Ref: make([]int64, maxSeq+1), Ack: make([]int64, maxSeq+1)}, nil
}

func (p *Publisher) record(seq, ref int64) {
	if seq < int64(len(p.Ref)) {
		p.Ref[seq] = ref
	}
	if p.Mark != nil {
		p.Mark(seq, ref)
	}
}

func (p *Publisher) ack(seq int64) {
	p.Seq = seq
	if seq < int64(len(p.Ack)) {
		p.Ack[seq] = time.Now().UnixNano()
	}
}

// Publish commits the next event in one autocommit statement and returns its sequence
// number; the reference time is when the statement is sent.
func (p *Publisher) Publish(ctx context.Context) (int64, error) {
	seq := p.Seq + 1
	send := time.Now().UnixNano()
	p.buf = AppendData(p.buf[:0], seq, send, p.size)
	p.record(seq, send)
	if _, err := store.Publish(ctx, p.conn, p.stream, string(p.buf), "", nil); err != nil {
		return 0, err
	}
	p.ack(seq)
	return seq, nil
}

// PublishBatch commits the next k events in one statement (one transaction: the server
// sees them as one notification batch) and returns the last sequence number; the reference
// time of all k is when the statement is sent.
func (p *Publisher) PublishBatch(ctx context.Context, k int) (int64, error) {
	first, last := p.Seq+1, p.Seq+int64(k)
	send := time.Now().UnixNano()
	for seq := first; seq <= last; seq++ {
		p.record(seq, send)
	}
	p.sql = append(p.sql[:0], "SELECT count(pgsse.publish('"...)
	p.sql = append(p.sql, p.stream...)
	p.sql = append(p.sql, "', rpad(g::text || ' "...)
	p.sql = strconv.AppendInt(p.sql, send, 10)
	p.sql = append(p.sql, " ', "...)
	p.sql = strconv.AppendInt(p.sql, int64(p.size), 10)
	p.sql = append(p.sql, ", 'x'))) FROM generate_series("...)
	p.sql = strconv.AppendInt(p.sql, first, 10)
	p.sql = append(p.sql, ", "...)
	p.sql = strconv.AppendInt(p.sql, last, 10)
	p.sql = append(p.sql, ") g"...)
	if _, err := p.conn.Exec(ctx, string(p.sql)).ReadAll(); err != nil {
		return 0, err
	}
	p.ack(last)
	return last, nil
}

// PublishTx publishes the next event inside an explicit transaction (BEGIN and the
// pgsse.publish call in one round trip), then sends COMMIT: the reference time is the moment
// COMMIT is sent, so latency is measured from the application's commit.
func (p *Publisher) PublishTx(ctx context.Context) (int64, error) {
	seq := p.Seq + 1
	p.buf = AppendData(p.buf[:0], seq, time.Now().UnixNano(), p.size)
	p.sql = append(p.sql[:0], "BEGIN; SELECT pgsse.publish('"...)
	p.sql = append(p.sql, p.stream...)
	p.sql = append(p.sql, "', '"...)
	p.sql = append(p.sql, p.buf...) // digits, a space and 'x': nothing to quote
	p.sql = append(p.sql, "')"...)
	if _, err := p.conn.Exec(ctx, string(p.sql)).ReadAll(); err != nil {
		return 0, err
	}
	p.record(seq, time.Now().UnixNano())
	if _, err := p.conn.Exec(ctx, "COMMIT").ReadAll(); err != nil {
		return 0, err
	}
	p.ack(seq)
	return seq, nil
}

// Close closes the connection.
func (p *Publisher) Close() { _ = p.conn.Close(context.Background()) }
