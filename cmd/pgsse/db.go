package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgsse/pgsse/names"
	"github.com/pgsse/pgsse/store"
)

// cmdMigrate runs `pgsse migrate [--print]`.
func cmdMigrate(ctx context.Context, args []string, env func(string) (string, bool), stdout io.Writer) error {
	c := newCLI("migrate", "[--print] [flags]", env)
	dbURL := c.dbFlag()
	print := c.Bool("print", "write the migration SQL to stdout instead (needs no database)")
	pos, err := c.parse(args)
	if err != nil {
		return c.helpTo(stdout, err)
	}
	if err := c.noArgs(pos); err != nil {
		return err
	}
	if *print {
		_, err := io.WriteString(stdout, store.MigrationSQL())
		return err
	}
	_, cfg, err := c.database(*dbURL)
	if err != nil {
		return err
	}
	conn, err := connect(ctx, cfg, "pgsse-migrate")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	from, to, err := store.Migrate(ctx, conn)
	if err != nil {
		return err
	}
	if from == to {
		fmt.Fprintf(stdout, "pgsse: schema at version %d (unchanged)\n", to)
	} else {
		fmt.Fprintf(stdout, "pgsse: schema at version %d (was %d)\n", to, from)
	}
	return nil
}

// cmdPublish runs `pgsse publish STREAM DATA [--event E] [--audience T…] [--ephemeral]`.
func cmdPublish(ctx context.Context, args []string, env func(string) (string, bool), stdout io.Writer) error {
	c := newCLI("publish", "STREAM DATA [flags]", env)
	dbURL := c.dbFlag()
	event := c.String("event", "", "SSE event `NAME` (default \"message\")")
	audience := c.Multi("audience", "`TAG` that may receive the event (repeatable; none = everyone)")
	ephemeral := c.Bool("ephemeral", "pgsse.broadcast: deliver to whoever is connected, store nothing")
	pos, err := c.parse(args)
	if err != nil {
		return c.helpTo(stdout, err)
	}
	switch len(pos) {
	case 0:
		return configErrorf("publish: need STREAM and DATA")
	case 1:
		return configErrorf("publish: need DATA after STREAM %q", pos[0])
	case 2:
	default:
		return configErrorf("publish: takes STREAM and DATA, got %d arguments (quote DATA that has spaces)", len(pos))
	}
	stream, data := pos[0], pos[1]
	// Checked before connecting, with the same rules and messages as the SQL functions.
	if err := names.CheckStream(stream); err != nil {
		return configErrorf("publish: %v", err)
	}
	if *event != "" {
		if err := names.CheckEvent(*event); err != nil {
			return configErrorf("%s: %v", c.source("event"), err)
		}
	}
	if err := store.CheckAudience(*audience); err != nil {
		return configErrorf("%s: %v", c.source("audience"), err)
	}
	_, cfg, err := c.database(*dbURL)
	if err != nil {
		return err
	}
	conn, err := connect(ctx, cfg, "pgsse-publish")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if *ephemeral {
		return sqlError("publish", store.Broadcast(ctx, conn, stream, data, *event, *audience))
	}
	id, err := store.Publish(ctx, conn, stream, data, *event, *audience)
	if err != nil {
		return sqlError("publish", err)
	}
	_, err = fmt.Fprintln(stdout, strconv.FormatInt(id, 10))
	return err
}

// sqlError words a PostgreSQL error as one line; a rejected argument (SQLSTATE class 22)
// is bad input, exit 2.
func sqlError(what string, err error) error {
	if err == nil {
		return nil
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		msg := fmt.Sprintf("%s: %s (SQLSTATE %s)", what, oneLine(pe.Message), pe.Code)
		if pe.Code == "42883" || pe.Code == "3F000" { // undefined function / schema
			msg += "; run pgsse migrate"
		}
		if strings.HasPrefix(pe.Code, "22") {
			return &configError{msg: msg}
		}
		return errors.New(msg)
	}
	return fmt.Errorf("%s: %w", what, err)
}
