package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"

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
		if e := c.explainConnect(err); e != err {
			return fmt.Errorf("migrate: %w", e)
		}
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

// maxPublishInputBytes bounds what `pgsse publish` reads from standard input or an
// --ndjson file (PostgreSQL's text values stop at 1 GB anyway).
const maxPublishInputBytes = 1 << 30

// publishStdin is where `pgsse publish STREAM -` and `--ndjson -` read.
var publishStdin io.Reader = os.Stdin

// cmdPublish runs `pgsse publish STREAM DATA|- [--event E] [--audience T…] [--ephemeral]`
// and `pgsse publish --ndjson FILE|-`, both through a store.Publisher (the group commit
// the server uses): the id is printed for a durable event, {"ids":[…]} for a batch.
func cmdPublish(ctx context.Context, args []string, env func(string) (string, bool), stdout io.Writer) error {
	c := newCLI("publish", "STREAM DATA|- [flags], or --ndjson FILE|-", env)
	dbURL := c.dbFlag()
	event := c.String("event", "", "SSE event `NAME` (default \"message\")")
	audience := c.Multi("audience", "`TAG` that may receive the event (repeatable; none = everyone)")
	ephemeral := c.Bool("ephemeral", "pgsse.broadcast: deliver to whoever is connected, store nothing")
	ndjson := c.String("ndjson", "", "publish a batch, all or nothing: one JSON object per line as POST /publish takes, from `FILE` (- = standard input)")
	pos, err := c.parse(args)
	if err != nil {
		return c.helpTo(stdout, err)
	}
	var req *store.PublishRequest
	source := "publish" // what error lines about the input start with
	if *ndjson != "" {
		if len(pos) != 0 {
			return configErrorf("publish: %s takes no STREAM or DATA (got %d arguments)", c.source("ndjson"), len(pos))
		}
		if *event != "" || len(*audience) > 0 || *ephemeral {
			return configErrorf("publish: event, audience and ephemeral go into the lines of an %s batch, not flags", c.source("ndjson"))
		}
		source = *ndjson
		if source == "-" {
			source = "standard input"
		}
		body, err := readPublishInput(*ndjson)
		if err != nil {
			return configErrorf("%s: %v", c.source("ndjson"), err)
		}
		events, err := store.ParseBatch(body)
		if err != nil {
			return configErrorf("%s: %v", source, err)
		}
		req = &store.PublishRequest{Events: events, Batch: true}
	} else {
		switch len(pos) {
		case 0:
			return configErrorf("publish: need STREAM and DATA")
		case 1:
			return configErrorf("publish: need DATA after STREAM %q", pos[0])
		case 2:
		default:
			return configErrorf("publish: takes STREAM and DATA, got %d arguments (quote DATA that has spaces)", len(pos))
		}
		// Checked before connecting, with the same rules and messages as the SQL functions.
		if err := names.CheckStream(pos[0]); err != nil {
			return configErrorf("publish: %v", err)
		}
		if *event != "" {
			if err := names.CheckEvent(*event); err != nil {
				return configErrorf("%s: %v", c.source("event"), err)
			}
		}
		if err := names.CheckAudience(*audience); err != nil {
			return configErrorf("%s: %v", c.source("audience"), err)
		}
		data := []byte(pos[1])
		if pos[1] == "-" {
			if data, err = readPublishInput("-"); err != nil {
				return configErrorf("publish: %v", err)
			}
		}
		req = &store.PublishRequest{Events: []store.PublishEvent{{
			Stream: pos[0], Data: data, Event: *event, Audience: *audience, Ephemeral: *ephemeral}}}
	}
	dsn, _, err := c.database(*dbURL)
	if err != nil {
		return err
	}
	ids, err := publishOnce(ctx, dsn, req)
	var ee *store.EventError
	switch {
	case err == nil:
	case errors.As(err, &ee) && !req.Batch:
		return configErrorf("publish: %v", ee.Err) // the only field is the data
	case errors.As(err, &ee):
		return configErrorf("%s: %v", source, err)
	default:
		if e := c.explainConnect(err); e != err {
			return fmt.Errorf("publish: %w; nothing was published", e)
		}
		return fmt.Errorf("publish: %w", err)
	}
	if req.Batch {
		out := []byte(`{"ids":[`)
		for i, id := range ids {
			if i > 0 {
				out = append(out, ',')
			}
			if req.Events[i].Ephemeral {
				out = append(out, "null"...)
			} else {
				out = strconv.AppendInt(out, id, 10)
			}
		}
		_, err = stdout.Write(append(out, "]}\n"...))
		return err
	}
	if *ephemeral {
		return nil
	}
	_, err = fmt.Fprintln(stdout, strconv.FormatInt(ids[0], 10))
	return err
}

// readPublishInput reads a file, or standard input for "-", byte for byte.
func readPublishInput(name string) ([]byte, error) {
	r := publishStdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, maxPublishInputBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxPublishInputBytes {
		return nil, fmt.Errorf("more than %d MiB of input", maxPublishInputBytes>>20)
	}
	return data, nil
}

// publishOnce publishes req through a Publisher of its own and returns the ids.
func publishOnce(ctx context.Context, dsn string, req *store.PublishRequest) ([]int64, error) {
	p := store.NewPublisher(store.PublisherConfig{
		DatabaseURL: dsn,
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)), // the one error line says it all
	})
	defer p.Close(context.WithoutCancel(ctx))
	done := make(chan store.PublishResult, 1)
	if err := p.Submit(req, func(r store.PublishResult) { done <- r }); err != nil {
		return nil, err
	}
	select {
	case r := <-done:
		return r.IDs, r.Err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
