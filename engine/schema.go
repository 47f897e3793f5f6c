package engine

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgsse/pgsse/store"
)

// schemaCheckInterval is how often the schema version is checked while it is not ready (and
// the timeout of one check).
const schemaCheckInterval = 10 * time.Second

// checkSchema keeps Ready's schema half up to date (/readyz): it checks the schema version
// at start and, until it matches, every schemaCheckInterval. It runs on its own goroutine
// and touches only atomics.
func (s *Server) checkSchema(ctx context.Context) {
	check := func() {
		cctx, cancel := context.WithTimeout(ctx, schemaCheckInterval)
		defer cancel()
		conn, err := pgconn.Connect(cctx, s.cfg.DatabaseURL)
		if err != nil {
			s.schemaMsg.Store("cannot check schema: " + firstLine(err.Error()))
			return
		}
		defer conn.Close(context.Background())
		v, err := store.Version(cctx, conn)
		switch {
		case err != nil:
			s.schemaMsg.Store("cannot check schema: " + firstLine(err.Error()))
		case v != store.SchemaVersion:
			msg := fmt.Sprintf("schema at version %d, expected %d: run `pgsse migrate`", v, store.SchemaVersion)
			if s.schemaOK.Swap(false) || s.schemaMsg.Load() != msg {
				s.log.Error("not ready: " + msg)
			}
			s.schemaMsg.Store(msg)
		default:
			s.schemaOK.Store(true)
			s.schemaMsg.Store("")
		}
	}
	check()
	t := time.NewTicker(schemaCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if !s.schemaOK.Load() {
				check()
			}
		}
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
