package store

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

const psqlPath = "/usr/bin/psql"

// schemaDump describes everything pgsse installs, for comparing two databases.
const schemaDump = `SELECT string_agg(x, E'\n' ORDER BY x) FROM (
  SELECT 'col ' || table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable || ' ' || coalesce(column_default, '')
    FROM information_schema.columns WHERE table_schema = 'pgsse'
  UNION ALL SELECT 'fn ' || pg_get_functiondef(p.oid) FROM pg_proc p WHERE p.pronamespace = 'pgsse'::regnamespace
  UNION ALL SELECT 'idx ' || indexdef FROM pg_indexes WHERE schemaname = 'pgsse'
  UNION ALL SELECT 'seq ' || sequencename || ' ' || data_type::text || ' ' || cycle FROM pg_sequences WHERE schemaname = 'pgsse'
  UNION ALL SELECT 'con ' || conrelid::regclass::text || ' ' || pg_get_constraintdef(oid) FROM pg_constraint WHERE connamespace = 'pgsse'::regnamespace
  UNION ALL SELECT 'rel ' || relname || ' ' || relkind::text || ' ' || relpersistence::text FROM pg_class WHERE relnamespace = 'pgsse'::regnamespace
  UNION ALL SELECT 'ver ' || version FROM pgsse.schema_version
) s(x)`

func runPsql(t *testing.T, dsn, file string) error {
	t.Helper()
	out, err := exec.Command(psqlPath, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", file).CombinedOutput()
	if err != nil {
		t.Logf("psql: %s", out)
	}
	return err
}

func writeMigrationSQL(t *testing.T) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "pgsse.sql")
	require.NoError(t, os.WriteFile(file, []byte(MigrationSQL()), 0o600))
	return file
}

func TestMigrateTwice(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	c := connect(t, dsn)
	ctx := context.Background()

	v, err := Version(ctx, c)
	require.NoError(t, err)
	assert.Equal(t, 0, v, "fresh database")

	from, to, err := Migrate(ctx, c)
	require.NoError(t, err)
	assert.Equal(t, [2]int{0, SchemaVersion}, [2]int{from, to})

	from, to, err = Migrate(ctx, c)
	require.NoError(t, err)
	assert.Equal(t, [2]int{SchemaVersion, SchemaVersion}, [2]int{from, to})

	v, err = Version(ctx, c)
	require.NoError(t, err)
	assert.Equal(t, SchemaVersion, v)
	assert.Equal(t, strconv.Itoa(len(Migrations)), pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.schema_version"))
	// The advisory lock was released: another session can take it at once.
	assert.Equal(t, "t", pgtest.QueryValue(t, dsn, "SELECT pg_try_advisory_lock("+strconv.Itoa(migrateLockKey)+")"))
}

func TestMigrateRefusesNewerSchema(t *testing.T) {
	dsn := migrated(t)
	pgtest.Exec(t, dsn, "INSERT INTO pgsse.schema_version (version) VALUES (99)")
	_, _, err := Migrate(context.Background(), connect(t, dsn))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "newer")
}

// Four Migrate calls on their own connections and two psql processes applying
// MigrationSQL, all at once on a fresh database: every one succeeds, the version is
// recorded once, and the schema is the one a lone Migrate installs.
func TestMigrateConcurrent(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	file := writeMigrationSQL(t)
	const goroutines, processes = 4, 2
	start := make(chan struct{})
	var wg sync.WaitGroup
	type result struct{ from, to int }
	results := make([]result, goroutines)
	errs := make([]error, goroutines+processes)
	for i := 0; i < goroutines; i++ {
		c := connect(t, dsn)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			from, to, err := Migrate(context.Background(), c)
			results[i], errs[i] = result{from, to}, err
		}()
	}
	for i := 0; i < processes; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[goroutines+i] = runPsql(t, dsn, file)
		}()
	}
	close(start)
	wg.Wait()
	fresh := 0
	for i, err := range errs {
		require.NoError(t, err, "runner %d", i)
	}
	for _, r := range results {
		assert.Equal(t, SchemaVersion, r.to)
		if r.from == 0 {
			fresh++
		}
	}
	assert.LessOrEqual(t, fresh, 1, "only one runner may find the database unmigrated")
	assert.Equal(t, strconv.Itoa(len(Migrations)), pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.schema_version"))
	assert.Equal(t, pgtest.QueryValue(t, migrated(t), schemaDump), pgtest.QueryValue(t, dsn, schemaDump))
}

// `pgsse migrate --print` applied with psql gives the schema Migrate gives, and
// applying it again changes nothing.
func TestMigrationSQLMatchesMigrate(t *testing.T) {
	want := pgtest.QueryValue(t, migrated(t), schemaDump)
	require.Contains(t, want, "FUNCTION pgsse.publish(stream text, data text, event text DEFAULT NULL::text, audience text[] DEFAULT NULL::text[])")
	require.Contains(t, want, "FUNCTION pgsse.broadcast(")
	require.Contains(t, want, "FUNCTION pgsse.prune(older_than interval, keep_last integer DEFAULT 0)")

	dsn := pgtest.NewDatabase(t)
	file := writeMigrationSQL(t)
	require.NoError(t, runPsql(t, dsn, file))
	assert.Equal(t, want, pgtest.QueryValue(t, dsn, schemaDump))

	require.NoError(t, runPsql(t, dsn, file), "second run")
	assert.Equal(t, want, pgtest.QueryValue(t, dsn, schemaDump))

	// Migrate after the script finds nothing to do.
	from, to, err := Migrate(context.Background(), connect(t, dsn))
	require.NoError(t, err)
	assert.Equal(t, [2]int{SchemaVersion, SchemaVersion}, [2]int{from, to})
}

func TestMigrationSQLQuoting(t *testing.T) {
	for _, m := range Migrations {
		assert.NotContains(t, m.SQL, "$pgsse_", "version %d must not use the script's dollar-quote tags", m.Version)
	}
	for i, m := range Migrations {
		assert.Equal(t, i+1, m.Version, "versions are 1, 2, 3, ... in order")
	}
	assert.Equal(t, SchemaVersion, Migrations[len(Migrations)-1].Version)
	assert.True(t, strings.HasPrefix(MigrationSQL(), "-- pgsse schema"))
}

// A database at version 1 or 2 holding events is upgraded in place to the current
// version, by Migrate and by the `pgsse migrate --print` script under psql: the schema
// equals a fresh install's, ids, heads and stored events carry on, presence works and the
// reserved event names are refused.
func TestMigrateUpgradesInPlace(t *testing.T) {
	want := pgtest.QueryValue(t, migrated(t), schemaDump)
	ctx := context.Background()
	for from := 1; from < SchemaVersion; from++ {
		for _, via := range []string{"Migrate", "psql"} {
			t.Run("v"+strconv.Itoa(from)+"/"+via, func(t *testing.T) {
				dsn := pgtest.NewDatabase(t)
				c := connect(t, dsn)
				old := filepath.Join(t.TempDir(), "old.sql")
				require.NoError(t, os.WriteFile(old, []byte(migrationSQL(Migrations[:from])), 0o600))
				if via == "Migrate" {
					_, to, err := migrate(ctx, c, Migrations[:from])
					require.NoError(t, err)
					require.Equal(t, from, to)
				} else {
					require.NoError(t, runPsql(t, dsn, old))
				}
				require.Equal(t, strconv.Itoa(from), pgtest.QueryValue(t, dsn, "SELECT max(version) FROM pgsse.schema_version"))
				pgtest.Exec(t, dsn, `SELECT pgsse.publish('up/a', 'a' || g, NULL, ARRAY['t']) FROM generate_series(1, 5) g;
					SELECT pgsse.publish('up/b', 'b1'); SELECT pgsse.broadcast('up/a', 'e')`)
				// Before version 3 the reserved prefix was an ordinary name.
				pgtest.Exec(t, dsn, "SELECT pgsse.publish('up/old', 'x', 'pgsse:gap')")

				if via == "Migrate" {
					from2, to, err := Migrate(ctx, c)
					require.NoError(t, err)
					assert.Equal(t, [2]int{from, SchemaVersion}, [2]int{from2, to})
				} else {
					require.NoError(t, runPsql(t, dsn, writeMigrationSQL(t)))
					require.NoError(t, runPsql(t, dsn, old), "the old script is harmless afterwards")
				}
				assert.Equal(t, want, pgtest.QueryValue(t, dsn, schemaDump))

				id, err := Publish(ctx, c, "up/a", "a6", "", nil)
				require.NoError(t, err)
				assert.EqualValues(t, 6, id)
				assert.Equal(t, "{7,2,1}", pgtest.QueryValue(t, dsn,
					`SELECT pgsse.publish_many(ARRAY[pgsse.message('up/a', 'a7'), pgsse.message('up/b', 'b2'), pgsse.message('up/c', 'c1')])`))
				assert.Equal(t, "up/a:1-7 up/b:1-2 up/c:1-1 up/old:1-1", pgtest.QueryValue(t, dsn,
					`SELECT string_agg(stream || ':' || min || '-' || max, ' ' ORDER BY stream) FROM
					 (SELECT stream, min(id), max(id) FROM pgsse.events GROUP BY stream) s`))
				assert.Equal(t, "a1 {t}", pgtest.QueryValue(t, dsn, "SELECT data || ' ' || audience::text FROM pgsse.events WHERE stream = 'up/a' AND id = 1"))

				_, err = c.Exec(ctx, "SELECT pgsse.publish('up/a', 'x', 'pgsse:gap')").ReadAll()
				var pgErr *pgconn.PgError
				require.ErrorAs(t, err, &pgErr)
				assert.Equal(t, "event names starting with pgsse: are reserved", pgErr.Message)

				p, err := NewPresence(PresenceConfig{Key: "up :1 #0", Interval: time.Second})
				require.NoError(t, err)
				_, err = p.Flush(ctx, c, []PresenceCount{{"up/a", "user:1", 1}})
				require.NoError(t, err)
				assert.Equal(t, "user:1", pgtest.QueryValue(t, dsn, "SELECT string_agg(sub, ',') FROM pgsse.presence('up/a')"))
			})
		}
	}
}
