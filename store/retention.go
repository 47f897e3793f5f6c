package store

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// RetentionAppName is the application_name of the retention job's short-lived
// connection (one at a time, open only while pgsse.prune runs).
const RetentionAppName = "pgsse-retention"

// RetentionInterval is how often RunRetention prunes: retention/24, clamped to
// [1 minute, 1 hour].
func RetentionInterval(retention time.Duration) time.Duration {
	return min(max(retention/24, time.Minute), time.Hour)
}

// RunRetention deletes durable events older than retention with pgsse.prune — at
// once, then every RetentionInterval(retention) — until ctx is done, and returns
// then. It logs the rows deleted at info (when any) and failures at warn, and keeps
// going after a failure. A retention ≤ 0 means keep forever: it returns at once.
func RunRetention(ctx context.Context, dsn string, retention time.Duration, logger *slog.Logger) {
	runRetention(ctx, dsn, retention, RetentionInterval(retention), logger)
}

func runRetention(ctx context.Context, dsn string, retention, interval time.Duration, logger *slog.Logger) {
	if retention <= 0 {
		return
	}
	if logger == nil {
		logger = slog.Default()
	}
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		logger.Warn("retention: bad database URL; events will not be pruned", "err", err)
		<-ctx.Done()
		return
	}
	cfg.RuntimeParams["application_name"] = RetentionAppName
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		pruneOnce(ctx, cfg, retention, logger)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func pruneOnce(ctx context.Context, cfg *pgconn.Config, retention time.Duration, logger *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		if ctx.Err() == nil {
			logger.Warn("retention: cannot connect to PostgreSQL", "err", err)
		}
		return
	}
	defer func() {
		closeCtx, closeCancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(closeCtx)
		closeCancel()
	}()
	n, err := Prune(ctx, conn, retention, 0)
	switch {
	case err != nil:
		if ctx.Err() == nil {
			logger.Warn("retention: pgsse.prune failed", "err", err)
		}
	case n > 0:
		logger.Info("retention: pruned durable events", "rows", n, "older_than", retention.String())
	}
}
