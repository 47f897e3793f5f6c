package store

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgsse/pgsse/scripts/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// connect opens a connection closed at test end.
func connect(t testing.TB, dsn string) *pgconn.PgConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgconn.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// migrated returns the DSN of a fresh database with the schema installed.
func migrated(t testing.TB) string {
	t.Helper()
	dsn := pgtest.NewDatabase(t)
	c := connect(t, dsn)
	_, _, err := Migrate(context.Background(), c)
	require.NoError(t, err)
	return dsn
}

// execSQL runs sql (simple protocol) on c and fails the test on error.
func execSQL(t testing.TB, c *pgconn.PgConn, sql string) []*pgconn.Result {
	t.Helper()
	res, err := c.Exec(context.Background(), sql).ReadAll()
	require.NoError(t, err, sql)
	return res
}
