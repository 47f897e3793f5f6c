package store

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// connect opens a connection closed at test end.
var connect = pgtest.Connect

// migrated returns the DSN of a fresh database with the schema installed.
func migrated(t testing.TB) string {
	t.Helper()
	return pgtest.Migrated(t, Migrate)
}

// execSQL runs sql (simple protocol) on c and fails the test on error.
var execSQL = pgtest.ExecOn
