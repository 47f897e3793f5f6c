package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgsse/pgsse/engine"
	"github.com/pgsse/pgsse/store"
)

// Thresholds for NOTIFY queue usage (a full queue makes every NOTIFY fail at commit).
const (
	queueWarn = 0.10
	queueFail = 0.50
)

type doctor struct {
	w     io.Writer
	fails int
}

func (d *doctor) report(status, check, format string, args ...any) {
	if status == "FAIL" {
		d.fails++
	}
	fmt.Fprintf(d.w, "%-4s  %s: %s\n", status, check, oneLine(fmt.Sprintf(format, args...)))
}

// cmdDoctor runs `pgsse doctor`: one line per check, exit 1 if any check FAILs.
func cmdDoctor(ctx context.Context, args []string, env func(string) (string, bool), stdout io.Writer) error {
	c := newCLI("doctor", "[flags]", env)
	dbURL := c.dbFlag()
	maxConns := c.Int("max-connections", 0, "the value pgsse serve will use (default: from the fd limit)")
	hubSocket := c.String("hub-socket", "", "hub socket `PATH` to inspect")
	hubMode := c.Mode("hub-socket-mode", engine.DefaultHubSocketMode, "expected permissions of the hub socket, octal")
	workers := c.Int("workers", 0, "worker processes on this host that LISTEN, for the connection budget")
	adminMax := c.Int("admin-max-connections", engine.DefaultAdminMaxConnections, "the value pgsse serve will use, for the descriptor budget")
	procs := c.Procs("the --procs pgsse serve will use, for the connection budget")
	presenceStreams := c.List("presence-streams", "the value pgsse serve will use, for the descriptor and connection budgets (presence's writer session)")
	pos, err := c.parse(args)
	if err != nil {
		return c.helpTo(stdout, err)
	}
	if err := c.noArgs(pos); err != nil {
		return err
	}
	if *workers < 0 {
		return configErrorf("%s: must not be negative", c.source("workers"))
	}
	if c.isSet("max-connections") && *maxConns < 1 {
		return configErrorf("%s: must be at least 1", c.source("max-connections"))
	}
	if *adminMax < 1 {
		return configErrorf("%s: must be at least 1", c.source("admin-max-connections"))
	}
	_, cfg, err := c.database(*dbURL)
	if err != nil {
		return err
	}
	d := &doctor{w: stdout}

	// 1. Connectivity, and the checks that need a session.
	var server *serverBudget
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	conn, err := connect(cctx, cfg, "pgsse-doctor")
	if err != nil {
		d.report("FAIL", "connectivity", "%v", c.explainConnect(err))
	} else {
		defer conn.Close(context.WithoutCancel(ctx))
		d.report("ok", "connectivity", "PostgreSQL %s at %s:%d, database %s, user %s",
			conn.ParameterStatus("server_version"), cfg.Host, cfg.Port, cfg.Database, cfg.User)
		d.schema(cctx, conn)
		d.queue(cctx, conn)
		d.durability(cctx, conn)
		d.presence(cctx, conn)
		server = readBudget(cctx, conn)
	}

	// 2. Local checks.
	d.fdLimit(engine.Config{HubSocket: *hubSocket, AdminMaxConnections: *adminMax, PresenceStreams: *presenceStreams},
		*maxConns, c.isSet("max-connections"), c.source("max-connections"))
	d.hubSocket(*hubSocket, *hubMode)
	d.budget(*procs, *workers, c.isSet("workers"), *hubSocket != "", len(*presenceStreams) > 0, server)

	if d.fails > 0 {
		return errReported
	}
	return nil
}

func (d *doctor) schema(ctx context.Context, conn *pgconn.PgConn) {
	v, err := store.Version(ctx, conn)
	switch {
	case err != nil:
		d.report("FAIL", "schema", "%v", err)
	case v == store.SchemaVersion:
		d.report("ok", "schema", "version %d", v)
	case v == 0:
		d.report("FAIL", "schema", "not installed: run pgsse migrate")
	case v < store.SchemaVersion:
		d.report("FAIL", "schema", "version %d, this pgsse needs %d: run pgsse migrate", v, store.SchemaVersion)
	default:
		d.report("FAIL", "schema", "version %d is newer than this pgsse (%d): upgrade pgsse", v, store.SchemaVersion)
	}
}

// presence lists the pgsse processes holding presence leases (docs/operations.md): key, age,
// last renewal, entries; a lapsed lease is a process that died and that no survivor has
// removed yet (a WARN: only a survivor's next write removes it).
// presenceLeases is the presence line's count of n processes holding leases, lapsed of them
// lapsed.
func presenceLeases(n, lapsed int) string {
	if n == 1 {
		return fmt.Sprintf("1 pgsse process holds a presence lease (%d lapsed)", lapsed)
	}
	return fmt.Sprintf("%d pgsse processes hold presence leases (%d lapsed)", n, lapsed)
}

func (d *doctor) presence(ctx context.Context, conn *pgconn.PgConn) {
	procs, err := store.ReadPresenceProcesses(ctx, conn)
	if err != nil {
		d.report("warn", "presence", "cannot read the presence leases (schema before version 3?): %v", err)
		return
	}
	if len(procs) == 0 {
		d.report("ok", "presence", "no pgsse process holds a presence lease")
		return
	}
	status, lapsed := "ok", 0
	for _, p := range procs {
		if !p.Live {
			lapsed++
			status = "warn"
		}
	}
	d.report(status, "presence", "%s", presenceLeases(len(procs), lapsed))
	now := time.Now()
	for _, p := range procs {
		state := "live"
		if !p.Live {
			state = "LAPSED"
		}
		fmt.Fprintf(d.w, "      %-6s %s  age %s, renewed %s ago, interval %s, %d entries\n", state, p.Key,
			p.Age.Round(time.Second), now.Sub(p.Renewed).Round(time.Millisecond), p.Interval, p.Entries)
	}
}

func (d *doctor) queue(ctx context.Context, conn *pgconn.PgConn) {
	s, err := queryValue(ctx, conn, "SELECT pg_notification_queue_usage()")
	if err != nil {
		d.report("FAIL", "notify queue", "%v", err)
		return
	}
	u, err := strconv.ParseFloat(s, 64)
	if err != nil {
		d.report("FAIL", "notify queue", "unexpected pg_notification_queue_usage() %q", s)
		return
	}
	msg := fmt.Sprintf("%.1f%% in use", u*100)
	switch {
	case u >= queueFail:
		d.report("FAIL", "notify queue", "%s: a listener is not consuming (look for long transactions holding LISTEN)", msg)
	case u >= queueWarn:
		d.report("warn", "notify queue", "%s: a listener is falling behind", msg)
	default:
		d.report("ok", "notify queue", "%s", msg)
	}
}

// durabilitySQL reads synchronous_commit as a session of pgsse's role in pgsse's database sees
// it (the configuration file, ALTER SYSTEM, ALTER DATABASE/ROLE … SET, the connection string's
// options), where that value comes from, and any SET synchronous_commit attached to the
// functions pgsse publishes through (pgsse.publish, pgsse.publish_many), which wins inside them.
const durabilitySQL = `SELECT s.setting || '|' || s.source || '|' || current_user || '|' || current_database() || '|' ||
	coalesce((SELECT string_agg('pgsse.' || p.proname || ' SET ' || c, ', ' ORDER BY p.proname)
		FROM pg_proc p, unnest(p.proconfig) AS c
		WHERE p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = 'pgsse')
		  AND p.proname IN ('publish', 'publish_many') AND c LIKE 'synchronous_commit=%'), '')
	FROM pg_settings s WHERE s.name = 'synchronous_commit'`

// durability warns when pgsse's publishes commit with synchronous_commit off (issue 23): the
// server acknowledges a publish before its commit is on disk, so a PostgreSQL crash (or an
// immediate stop) can lose events pgsse has already answered and delivered — and their ids are
// then given to the next events of the stream, which a subscriber that saw a lost one skips.
func (d *doctor) durability(ctx context.Context, conn *pgconn.PgConn) {
	v, err := queryValue(ctx, conn, durabilitySQL)
	if err != nil {
		d.report("warn", "durability", "cannot read synchronous_commit: %v", err)
		return
	}
	parts := strings.SplitN(v, "|", 5)
	if len(parts) != 5 {
		d.report("warn", "durability", "unexpected answer %q", v)
		return
	}
	setting, source, user, database, functions := parts[0], parts[1], parts[2], parts[3], parts[4]
	who := fmt.Sprintf("user %s in database %s", user, database)
	var off []string
	if setting == "off" {
		off = append(off, "synchronous_commit is off for "+who+" ("+settingSource(source)+")")
	}
	for _, f := range strings.Split(functions, ", ") {
		if strings.HasSuffix(f, "=off") {
			off = append(off, f)
		}
	}
	if len(off) == 0 {
		d.report("ok", "durability", "synchronous_commit is %s for %s: a publish pgsse acknowledged survives a PostgreSQL crash", setting, who)
		return
	}
	d.report("warn", "durability", "%s: PostgreSQL acknowledges a publish before it is on disk, so a crash can lose events pgsse already answered and delivered, "+
		"and their ids are then reused by the stream's next events (a subscriber that saw a lost one skips its replacement); "+
		"set it on for pgsse: ALTER ROLE %s IN DATABASE %s SET synchronous_commit = on (docs/operations.md, Durability)",
		strings.Join(off, "; "), quoteIdent(user), quoteIdent(database))
}

// settingSource words pg_settings.source for the durability check.
func settingSource(source string) string {
	switch source {
	case "configuration file":
		return "from postgresql.conf or ALTER SYSTEM"
	case "database":
		return "from ALTER DATABASE … SET"
	case "user":
		return "from ALTER ROLE … SET"
	case "database user":
		return "from ALTER ROLE … IN DATABASE … SET"
	case "client":
		return "from the connection string's options or PGOPTIONS"
	}
	return "source: " + source
}

// quoteIdent quotes a PostgreSQL identifier for a command to copy.
func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// fdLimit checks the descriptor limit against --max-connections and prints the budget: each
// consumer's share of RLIMIT_NOFILE (engine.Config.FDBudget, the one computation serve uses).
func (d *doctor) fdLimit(cfg engine.Config, maxConns int, set bool, src string) {
	limit := engine.FDLimit()
	if limit == 0 {
		d.report("warn", "fd limit", "cannot read RLIMIT_NOFILE")
		return
	}
	b := cfg.FDBudget(limit)
	allowed := b.MaxConnections
	switch {
	case set && maxConns > allowed:
		d.report("FAIL", "fd limit", "%s %d exceeds RLIMIT_NOFILE %d − %d reserved = %d: raise the limit (ulimit -n, LimitNOFILE=)",
			src, maxConns, limit, b.Reserved(), allowed)
	case allowed < 1:
		d.report("FAIL", "fd limit", "RLIMIT_NOFILE %d leaves no room for connections after the %d reserved", limit, b.Reserved())
	case limit < 4096:
		d.report("warn", "fd limit", "RLIMIT_NOFILE %d allows only %d SSE connections: raise it (ulimit -n, LimitNOFILE=)", limit, allowed)
	case set:
		d.report("ok", "fd limit", "RLIMIT_NOFILE %d allows %d connections; --max-connections %d", limit, allowed, maxConns)
	default:
		d.report("ok", "fd limit", "RLIMIT_NOFILE %d; --max-connections defaults to %d", limit, allowed)
	}
	sse := "SSE connections (--max-connections default)"
	if set {
		sse = "SSE connections allowed (--max-connections " + strconv.Itoa(maxConns) + ")"
	}
	fmt.Fprintf(d.w, "      descriptor budget of RLIMIT_NOFILE %d:\n", b.Limit)
	for _, sh := range b.Shares {
		fmt.Fprintf(d.w, "      %8d  %s\n", sh.FDs, sh.Consumer)
	}
	fmt.Fprintf(d.w, "      %8d  %s\n", max(allowed, 0), sse)
}

func (d *doctor) hubSocket(path string, want os.FileMode) {
	if path == "" {
		d.report("ok", "hub socket", "not configured (no --hub-socket)")
		return
	}
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		d.report("warn", "hub socket", "%s does not exist (is pgsse serve running with --hub-socket?)", path)
		return
	case err != nil:
		d.report("FAIL", "hub socket", "%v", err)
		return
	case fi.Mode().Type() != fs.ModeSocket:
		d.report("FAIL", "hub socket", "%s is not a socket (%s)", path, fi.Mode().Type())
		return
	}
	perm := fi.Mode().Perm()
	live := "a server answers"
	if c, err := net.DialTimeout("unix", path, time.Second); err != nil {
		live = "nothing answers (stale file: pgsse serve replaces it)"
		if !errors.Is(err, syscall.ECONNREFUSED) {
			live = "cannot connect: " + err.Error()
		}
	} else {
		c.Close()
	}
	switch {
	case perm&^want != 0:
		d.report("FAIL", "hub socket", "%s has mode %04o, looser than --hub-socket-mode %04o; %s", path, perm, want, live)
	case perm != want:
		d.report("warn", "hub socket", "%s has mode %04o, not --hub-socket-mode %04o; %s", path, perm, want, live)
	default:
		d.report("ok", "hub socket", "%s has mode %04o; %s", path, perm, live)
	}
}

// serverBudget is the PostgreSQL server's connection capacity.
type serverBudget struct {
	max, reserved, inUse int
}

func readBudget(ctx context.Context, conn *pgconn.PgConn) *serverBudget {
	s, err := queryValue(ctx, conn, `SELECT current_setting('max_connections')::int || ' ' ||
		(current_setting('superuser_reserved_connections')::int +
		 coalesce(current_setting('reserved_connections', true)::int, 0)) || ' ' ||
		(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')`)
	if err != nil {
		return nil
	}
	var b serverBudget
	if _, err := fmt.Sscanf(s, "%d %d %d", &b.max, &b.reserved, &b.inUse); err != nil {
		return nil
	}
	b.inUse = max(b.inUse-1, 0) // not counting doctor's own session
	return &b
}

// budget reports pgsse's PostgreSQL connections, and what the hub saves: worker processes
// that share its one LISTEN session instead of holding one each. Without a hub (and no
// --workers given) it claims nothing about workers. With --procs N every process has its
// own replay pool and publishing connections, and the host still one LISTEN session — except
// for the grace period after the first process died, when each sibling holds one of its own
// (procs.go).
func (d *doctor) budget(procs, workers int, workersSet, hub, presence bool, server *serverBudget) {
	perProc := engine.DefaultReplayPoolSize + store.DefaultPublishConns
	each := fmt.Sprintf("%d replay + %d publishing", engine.DefaultReplayPoolSize, store.DefaultPublishConns)
	if presence {
		perProc++ // presence's writer (--presence-streams)
		each += " + 1 presence"
	}
	ours := 1 + procs*perProc
	msg := fmt.Sprintf("pgsse holds %d PostgreSQL connections (1 LISTEN + %s)", ours, each)
	if procs > 1 {
		msg = fmt.Sprintf("pgsse holds %d PostgreSQL connections with --procs %d (1 LISTEN + %d processes × (%s); for %s after the first process dies, each of its %d siblings holds a LISTEN session of its own)",
			ours, procs, procs, each, orphanGrace, procs-1)
	}
	switch {
	case hub && workersSet:
		msg += fmt.Sprintf(" for all %d workers (--workers); without the hub they would hold %d LISTEN sessions", workers, workers)
	case hub:
		msg += " however many worker processes share the hub; without it each would hold a LISTEN session of its own"
	case workersSet:
		msg += fmt.Sprintf("; no hub configured, so %d workers (--workers) hold %d LISTEN sessions of their own (--hub-socket shares one)", workers, workers)
	default:
		msg += "; no hub configured (--hub-socket lets worker processes share its LISTEN session)"
	}
	if server == nil {
		d.report("ok", "connection budget", "%s", msg)
		return
	}
	free := server.max - server.reserved - server.inUse
	msg += fmt.Sprintf("; server max_connections %d (%d reserved), %d in use, %d free", server.max, server.reserved, server.inUse, free)
	if free < ours {
		d.report("warn", "connection budget", "%s: not enough for pgsse serve", msg)
		return
	}
	d.report("ok", "connection budget", "%s", msg)
}

// queryValue runs a one-row, one-column query and returns the value as text.
func queryValue(ctx context.Context, conn *pgconn.PgConn, sql string) (string, error) {
	res, err := conn.Exec(ctx, sql).ReadAll()
	if err != nil {
		return "", err
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 1 {
		return "", errors.New("unexpected result")
	}
	return string(res[0].Rows[0][0]), nil
}
