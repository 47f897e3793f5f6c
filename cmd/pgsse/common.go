package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgsse/pgsse/names"
)

// maxKeyFileBytes bounds what is read from --jwt-secret-file and the key files.
const maxKeyFileBytes = 64 << 10

// dbFlag registers --database-url.
func (c *cli) dbFlag() *string {
	return c.String("database-url", "", "PostgreSQL connection `URL`; else DATABASE_URL, else the libpq variables (PGHOST, …)")
}

// libpqServerVariables are the libpq variables that say which server, database or user to
// use; with none of them (and no connection string) nothing was configured.
var libpqServerVariables = []string{"PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE"}

// database resolves the connection string: --database-url / PGSSE_DATABASE_URL, else
// DATABASE_URL, else "" (libpq variables). It is parsed here so a bad one fails as
// configuration, naming where it came from (c.dbSource, also for later errors). When nothing
// names a database at all, c.dbNone is set: libpq's defaults are still tried (a local
// server with peer authentication works that way), and a failure says what to configure
// (c.explainConnect).
func (c *cli) database(flagValue string) (dsn string, cfg *pgconn.Config, err error) {
	dsn, src := flagValue, c.source("database-url")
	c.dbNone = false
	if dsn == "" {
		if v, ok := c.env("DATABASE_URL"); ok && v != "" {
			dsn, src = v, "DATABASE_URL"
		} else {
			src = "libpq environment (PGHOST, PGPORT, …)"
			c.dbNone = true
			for _, k := range libpqServerVariables {
				if v, ok := c.env(k); ok && v != "" {
					c.dbNone = false
				}
			}
			if c.dbNone {
				src = "libpq's defaults (no --database-url, DATABASE_URL or PGHOST set)"
			}
		}
	}
	c.dbSource = src
	cfg, err = pgconn.ParseConfig(dsn)
	if err != nil {
		return "", nil, configErrorf("%s: %s", src, oneLine(err.Error()))
	}
	c.dbConfig = cfg.Copy()
	return dsn, cfg, nil
}

// noDatabaseHint says what to configure when no database was; it is the start of every
// error about a connection that libpq's defaults could not make.
const noDatabaseHint = "no database configured: set DATABASE_URL (or --database-url), e.g. postgres://user:password@localhost:5432/app, or the libpq variables PGHOST, PGDATABASE, …"

// explainConnect rewrites the error of a connection that failed while no database was
// configured (c.dbNone): it says so, what to set, and what libpq's defaults made pgsse try
// ("the Unix socket /var/run/postgresql/.s.PGSQL.5432 as user root: no such file or
// directory"). Any other error is returned as it is.
func (c *cli) explainConnect(err error) error {
	var ce *pgconn.ConnectError
	if !c.dbNone || c.dbConfig == nil || !errors.As(err, &ce) {
		return err
	}
	return errors.New(noDatabaseHint + "; tried " + c.triedDefaults() + ": " + connectCause(ce))
}

// triedDefaults describes where libpq's defaults point: a Unix socket or host:port, the user
// and the database.
func (c *cli) triedDefaults() string {
	cfg := c.dbConfig
	where := net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	if strings.HasPrefix(cfg.Host, "/") {
		where = "the Unix socket " + cfg.Host + "/.s.PGSQL." + strconv.Itoa(int(cfg.Port))
	}
	db := cfg.Database
	if db == "" {
		db = cfg.User
	}
	return "libpq's default, " + where + " as user " + cfg.User + ", database " + db
}

// connectCause is the reason of a failed connection without pgconn's framing: the system
// error ("no such file or directory", "connection refused") or PostgreSQL's message.
func connectCause(ce *pgconn.ConnectError) string {
	var errno syscall.Errno
	var pe *pgconn.PgError
	switch {
	case errors.As(ce, &errno):
		return errno.Error()
	case errors.As(ce, &pe):
		return pe.Message + " (SQLSTATE " + pe.Code + ")"
	}
	return oneLine(ce.Unwrap().Error())
}

// connect opens one session, named appName unless the connection string names it.
func connect(ctx context.Context, cfg *pgconn.Config, appName string) (*pgconn.PgConn, error) {
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = appName
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	return conn, nil
}

// readKeyFile reads a secret or PEM file named by flag, bounded in size.
func (c *cli) readKeyFile(flag, path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, configErrorf("%s: %v", c.source(flag), err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxKeyFileBytes+1))
	if err != nil {
		return nil, configErrorf("%s: %v", c.source(flag), err)
	}
	if len(data) > maxKeyFileBytes {
		return nil, configErrorf("%s: %s is larger than %d KiB", c.source(flag), path, maxKeyFileBytes>>10)
	}
	return data, nil
}

// secret returns the HS256 secret from --jwt-secret or --jwt-secret-file (whose trailing
// newlines are dropped, as `echo` writes one), or nil if neither is set.
func (c *cli) secret(value, file string) ([]byte, error) {
	switch {
	case value != "" && file != "":
		return nil, configErrorf("%s and %s are mutually exclusive", c.source("jwt-secret"), c.source("jwt-secret-file"))
	case value != "":
		return []byte(value), nil
	case file != "":
		data, err := c.readKeyFile("jwt-secret-file", file)
		if err != nil {
			return nil, err
		}
		data = bytes.TrimRight(data, "\r\n")
		if len(data) == 0 {
			return nil, configErrorf("%s: %s is empty", c.source("jwt-secret-file"), file)
		}
		return data, nil
	}
	return nil, nil
}

// checkStreamPattern accepts "*", an exact stream name, or a stream-name prefix + "*"
// (names.CheckStreamPattern, the rule tokens are checked with).
func checkStreamPattern(p string) error {
	if err := names.CheckStreamPattern(p); err != nil {
		return fmt.Errorf("pattern %q: %v", p, err)
	}
	return nil
}

// checkChannelPattern accepts "*", a channel name, or a channel-name prefix + "*"
// (names.CheckChannelPattern).
func checkChannelPattern(p string) error {
	if err := names.CheckChannelPattern(p); err != nil {
		return fmt.Errorf("pattern %q: %v", p, err)
	}
	return nil
}

// checkOrigin accepts an exact origin: scheme://host[:port], nothing else.
func checkOrigin(o string) error {
	if o == "*" {
		return fmt.Errorf("%q is not allowed: list exact origins (credentials need them)", o)
	}
	u, err := url.Parse(o)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
		u.User != nil || u.Path != "" || u.RawQuery != "" || u.Fragment != "" || strings.HasSuffix(o, "?") ||
		strings.HasSuffix(o, "#") {
		return fmt.Errorf("%q is not an origin (want scheme://host[:port], e.g. https://app.example.com)", o)
	}
	if strings.ToLower(o) != o {
		return fmt.Errorf("%q: origins are compared exactly; write it in lower case as browsers send it", o)
	}
	return nil
}

// oneLine folds a multi-line message so every error stays on one line.
func oneLine(s string) string {
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	return strings.Join(strings.Fields(s), " ")
}
