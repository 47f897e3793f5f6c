package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgsse/pgsse/store"
)

// The database check: at start (Run, synchronously, so that a database that refuses us for
// good ends the start with one line) and then every schemaCheckInterval for as long as the
// server runs (Ready's schema half; docs/operations.md: /readyz is 200 only while the schema
// is at the expected version, so a schema dropped or rolled back under a running server
// turns it 503).
// SchemaCheckAppName is the application_name of the schema check's short-lived connection
// (one every schemaCheckInterval, open for one query).
const SchemaCheckAppName = "pgsse-check"

const (
	schemaCheckInterval = 10 * time.Second // between checks, and one check's timeout
	startCheckTimeout   = 5 * time.Second  // the check at start: an unreachable server does not hold the start longer
	// schemaLogEvery: a schema that is not ready is logged at most this often.
	schemaLogEvery = 30 * time.Second
)

// errSchemaMissing is the one line for a database pgsse has not been installed in.
var errSchemaMissing = errors.New("schema pgsse missing: run `pgsse migrate`")

// ErrDatabaseRefused starts the error Run returns when PostgreSQL refused the connection for
// good (refusedForGood). The caller, which knows where the connection string came from
// (--database-url, DATABASE_URL, the libpq variables), puts that name in front.
var ErrDatabaseRefused = errors.New("PostgreSQL refused the connection")

// refusedForGood reports whether PostgreSQL refused the connection for a reason retrying cannot
// fix (docs/operations.md, Health, metrics and logs): SQLSTATE class 28 (invalid authorization:
// wrong password, role may not log in, no pg_hba entry) or 3D (the database does not exist).
func refusedForGood(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) < 2 {
		return false
	}
	class := pgErr.Code[:2]
	return class == "28" || class == "3D"
}

// schemaMissing reports whether err says pgsse's schema (or its functions) is not there:
// SQLSTATE 3F000 (no such schema), 42883 (no such function), 42P01 (no such table).
func schemaMissing(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "3F000", "42883", "42P01":
		return strings.Contains(pgErr.Message, "pgsse")
	}
	return false
}

// checkDatabase connects once and reads the schema version. It returns an error only when
// PostgreSQL refused the connection for good (refusedForGood); an unreachable server is
// reported through the schema message and the log (at start) and retried.
func (s *Server) checkDatabase(ctx context.Context, timeout time.Duration, atStart bool) error {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var conn *pgconn.PgConn
	cfg, err := pgconn.ParseConfig(s.cfg.DatabaseURL)
	if err == nil {
		cfg.RuntimeParams["application_name"] = SchemaCheckAppName
		conn, err = pgconn.ConnectConfig(cctx, cfg)
	}
	if err != nil {
		if refusedForGood(err) {
			return fmt.Errorf("%w: %s", ErrDatabaseRefused, oneLineError(err))
		}
		s.schemaMsg.Store("cannot reach PostgreSQL: " + oneLineError(err))
		if atStart {
			s.log.Warn("PostgreSQL unreachable at start; retrying with backoff, /readyz answers 503 until it is back",
				"err", oneLineError(err))
		}
		return nil
	}
	defer conn.Close(context.Background())
	s.metrics.readNotifyQueue(cctx, conn) // pgsse_notify_queue_usage
	v, err := store.Version(cctx, conn)
	var msg string
	switch {
	case err != nil && s.schemaOK.Load():
		return nil // no answer: readiness stays what the last answer made it
	case err != nil:
		msg = "cannot check schema: " + oneLineError(err)
	case v == 0:
		msg = errSchemaMissing.Error()
	case v < store.SchemaVersion:
		msg = fmt.Sprintf("schema at version %d, expected %d: run `pgsse migrate`", v, store.SchemaVersion)
	case v > store.SchemaVersion:
		msg = fmt.Sprintf("schema at version %d is newer than this pgsse (%d): upgrade pgsse", v, store.SchemaVersion)
	default:
		s.schemaOK.Store(true)
		s.schemaMsg.Store("")
		return nil
	}
	s.schemaOK.Store(false)
	s.schemaMsg.Store(msg)
	now := time.Now()
	if last := s.schemaLogged.Load(); last == nil || now.Sub(*last) >= schemaLogEvery {
		s.schemaLogged.Store(&now)
		s.log.Error("not ready: " + msg)
	}
	return nil
}

// checkSchema keeps Ready's schema half up to date (/readyz) after the check at start: every
// schemaCheckInterval, ready or not (a sibling process of --procs, which serves no /readyz,
// only until it is ready). It runs on its own goroutine and touches only atomics.
func (s *Server) checkSchema(ctx context.Context) {
	t := time.NewTicker(schemaCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if s.schemaOK.Load() && s.cfg.SiblingHub != nil {
				continue // a sibling of --procs serves no /readyz: once ready, no more connections
			}
			_ = s.checkDatabase(ctx, schemaCheckInterval, false)
		}
	}
}

// oneLineError is err's text on one line. pgconn puts each connection attempt on a line of its
// own (sslmode=prefer, the default, makes two: TLS, then plain) after a first line that names
// only the user and database; the reason is in the attempts, so they are kept, "; " apart.
func oneLineError(err error) string {
	lines := strings.Split(err.Error(), "\n")
	out := strings.TrimSpace(lines[0])
	for _, l := range lines[1:] {
		if l = strings.TrimSpace(l); l == "" {
			continue
		}
		if strings.HasSuffix(out, ":") {
			out += " " + l
		} else {
			out += "; " + l
		}
	}
	return out
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
