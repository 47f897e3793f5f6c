package store

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgsse/pgsse/scripts/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// connect opens a connection closed at test end.
var connect = pgtest.Connect

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
