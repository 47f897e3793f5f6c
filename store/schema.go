package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// SchemaVersion is the schema version this build of pgsse installs and expects.
const SchemaVersion = 3

// Channel is the one PostgreSQL channel all stream traffic travels on.
const Channel = "pgsse"

// migrateLockKey is the pg_advisory_lock key every migration run (Migrate and the
// MigrationSQL script) takes, so concurrent runs from several hosts serialise.
// It is "pgsse" in ASCII, followed by the schema's purpose byte 'm'.
const migrateLockKey = 0x706773736501

// Migration is one forward step of the schema. SQL runs in one transaction, exactly
// once per database, after every lower Version; it is recorded in pgsse.schema_version.
// Migrations are never edited once released: a change is a new Migration.
type Migration struct {
	Version int
	SQL     string
}

// bootstrapSQL creates what must exist before the version can be read. It is
// idempotent and runs under the advisory lock.
const bootstrapSQL = `CREATE SCHEMA IF NOT EXISTS pgsse;
CREATE TABLE IF NOT EXISTS pgsse.schema_version (
    version    integer     PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);`

// Migrations lists every schema version in ascending order.
var Migrations = []Migration{
	{Version: 1, SQL: migration1},
	{Version: 2, SQL: migration2},
	{Version: 3, SQL: migration3},
}

// migration1 is the initial schema. Function bodies name every object with its schema,
// so callers' search_path cannot redirect them.
const migration1 = `
CREATE TABLE pgsse.streams (
    stream text   PRIMARY KEY,
    head   bigint NOT NULL
);

CREATE TABLE pgsse.events (
    stream     text        NOT NULL,
    id         bigint      NOT NULL,
    event      text,
    data       text        NOT NULL,
    audience   text[],
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream, id)
);

CREATE INDEX events_created_at_idx ON pgsse.events (created_at);

CREATE SEQUENCE pgsse.broadcast_nonce AS bigint CYCLE;

-- check_args raises SQLSTATE 22023, with the rule in the message, unless the
-- arguments of publish/broadcast are valid. The wording matches Go's sse/names.
CREATE FUNCTION pgsse.check_args(stream text, data text, event text, audience text[])
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
    tag text;
BEGIN
    IF stream IS NULL OR octet_length(stream) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'stream name must be 1-200 bytes',
            DETAIL = format('stream = %L (%s bytes)', left(stream, 64), octet_length(stream));
    END IF;
    IF stream COLLATE "C" !~ '^[A-Za-z0-9._:@/=+~-]+$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'stream name may contain only A-Z a-z 0-9 and . _ : @ / = + ~ -',
            DETAIL = format('stream = %L', left(stream, 64));
    END IF;
    IF data IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'data must not be NULL';
    END IF;
    IF event IS NOT NULL THEN
        IF octet_length(event) NOT BETWEEN 1 AND 64 THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = 'event name must be 1-64 bytes',
                DETAIL = format('event = %L (%s bytes); use NULL for the default "message"', left(event, 64), octet_length(event));
        END IF;
        IF event COLLATE "C" !~ '^[A-Za-z0-9._:-]+$' THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = 'event name may contain only A-Z a-z 0-9 and . _ : -',
                DETAIL = format('event = %L', left(event, 64));
        END IF;
    END IF;
    IF audience IS NOT NULL THEN
        IF array_ndims(audience) > 1 THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'audience must be a one-dimensional array';
        END IF;
        IF cardinality(audience) > 64 THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'audience must have at most 64 tags',
                DETAIL = format('%s tags', cardinality(audience));
        END IF;
        FOREACH tag IN ARRAY audience LOOP
            IF tag IS NULL THEN
                RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'audience tags must not be NULL';
            END IF;
            IF octet_length(tag) NOT BETWEEN 1 AND 200 THEN
                RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'audience tag must be 1-200 bytes',
                    DETAIL = format('tag = %L (%s bytes)', left(tag, 64), octet_length(tag));
            END IF;
            IF tag ~ E'[\\x01-\\x1f\\x7f]' THEN
                RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'audience tag must not contain control characters',
                    DETAIL = format('tag = %L', left(tag, 64));
            END IF;
        END LOOP;
    END IF;
END
$fn$;

-- encode_payload builds the NOTIFY payload (format version 1, see the package
-- documentation of engine/store or the README).
CREATE FUNCTION pgsse.encode_payload(kind text, time_us bigint, stream text, id bigint,
                                     event text, audience text[], data text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT kind || '1 ' || time_us::text || ' ' || stream || ' ' || id::text || ' '
        || coalesce(event, '') || ' ' || coalesce(cardinality(audience), 0)::text
        || coalesce((SELECT string_agg(' ' || octet_length(u.tag)::text || ':' || u.tag, '' ORDER BY u.ord)
                     FROM unnest(audience) WITH ORDINALITY AS u(tag, ord)), '')
        || E'\n' || coalesce(data, '')
$fn$;

CREATE FUNCTION pgsse.publish(stream text, data text, event text DEFAULT NULL, audience text[] DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
    v_id       bigint;
    v_audience text[] := CASE WHEN cardinality(publish.audience) > 0 THEN publish.audience END;
    v_time     bigint := floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
    v_payload  text;
BEGIN
    PERFORM pgsse.check_args(publish.stream, publish.data, publish.event, publish.audience);
    -- The counter row stays locked until this transaction ends: a concurrent publisher
    -- to the same stream waits here and, after our commit, takes the next number, so
    -- ids follow commit order and a rollback returns its number unused.
    INSERT INTO pgsse.streams AS s (stream, head) VALUES (publish.stream, 1)
        ON CONFLICT ON CONSTRAINT streams_pkey DO UPDATE SET head = s.head + 1
        RETURNING s.head INTO v_id;
    INSERT INTO pgsse.events (stream, id, event, data, audience)
        VALUES (publish.stream, v_id, publish.event, publish.data, v_audience);
    v_payload := pgsse.encode_payload('D', v_time, publish.stream, v_id, publish.event, v_audience, publish.data);
    IF octet_length(v_payload) > 7999 THEN
        v_payload := 'W1 ' || v_time::text || ' ' || publish.stream || ' ' || v_id::text || E'  0\n';
    END IF;
    PERFORM pg_notify('pgsse', v_payload);
    RETURN v_id;
END
$fn$;

CREATE FUNCTION pgsse.broadcast(stream text, data text, event text DEFAULT NULL, audience text[] DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    v_payload text;
BEGIN
    PERFORM pgsse.check_args(broadcast.stream, broadcast.data, broadcast.event, broadcast.audience);
    v_payload := pgsse.encode_payload('E', floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint,
        broadcast.stream, nextval('pgsse.broadcast_nonce'), broadcast.event,
        CASE WHEN cardinality(broadcast.audience) > 0 THEN broadcast.audience END, broadcast.data);
    IF octet_length(v_payload) > 7999 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgsse.broadcast: the notification payload would be %s bytes, over the 7999-byte NOTIFY limit; use pgsse.publish for large data', octet_length(v_payload));
    END IF;
    PERFORM pg_notify('pgsse', v_payload);
END
$fn$;

-- prune deletes, per stream, the longest run of oldest events that are all older than
-- older_than, never touching the newest keep_last ids. Deleting only such a prefix keeps
-- the retained ids of a stream contiguous even though created_at (transaction start)
-- need not follow id (commit) order.
CREATE FUNCTION pgsse.prune(older_than interval, keep_last integer DEFAULT 0)
RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
    v_cutoff  timestamptz;
    v_deleted bigint;
BEGIN
    IF older_than IS NULL OR older_than < interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'older_than must be a non-negative interval';
    END IF;
    IF keep_last IS NULL OR keep_last < 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'keep_last must be a non-negative integer';
    END IF;
    v_cutoff := now() - older_than;
    WITH old AS (
        SELECT DISTINCT e.stream FROM pgsse.events e WHERE e.created_at < v_cutoff
    ), cut AS (
        SELECT s.stream, LEAST(s.head - keep_last,
            coalesce((SELECT y.id - 1 FROM pgsse.events y
                      WHERE y.stream = s.stream AND y.created_at >= v_cutoff
                      ORDER BY y.id LIMIT 1), s.head)) AS upto
        FROM old JOIN pgsse.streams s ON s.stream = old.stream
    ), del AS (
        DELETE FROM pgsse.events e USING cut
        WHERE e.stream = cut.stream AND e.id <= cut.upto
        RETURNING 1
    )
    SELECT count(*) INTO v_deleted FROM del;
    RETURN v_deleted;
END
$fn$;

-- replay returns one batch for the replay reader in one snapshot: a first row with
-- the stream's head and oldest retained id (id NULL), then up to max_events events
-- with id > after_id visible to tags (or all when all_audiences), plus one more row
-- (included = false, no data) when the batch is cut short by max_events or max_bytes.
CREATE FUNCTION pgsse.replay(stream text, after_id bigint, tags text[], all_audiences boolean,
                             max_events integer, max_bytes bigint)
RETURNS TABLE (head bigint, oldest bigint, id bigint, event text, data text, audience text[],
               time_us bigint, included boolean)
LANGUAGE sql STABLE AS $fn$
    WITH meta AS (
        SELECT coalesce((SELECT s.head FROM pgsse.streams s WHERE s.stream = replay.stream), 0) AS head,
               (SELECT min(e.id) FROM pgsse.events e WHERE e.stream = replay.stream) AS oldest
    ), page AS (
        SELECT e.id, e.event, e.data, e.audience, e.created_at,
               row_number() OVER w AS rn, sum(octet_length(e.data)) OVER w AS run
        FROM (SELECT * FROM pgsse.events e
              WHERE e.stream = replay.stream AND e.id > replay.after_id
                AND (replay.all_audiences OR e.audience IS NULL OR cardinality(e.audience) = 0
                     OR e.audience && replay.tags)
              ORDER BY e.id LIMIT replay.max_events + 1) e
        WINDOW w AS (ORDER BY e.id)
    )
    SELECT m.head, coalesce(m.oldest, m.head + 1), NULL::bigint, NULL::text, NULL::text, NULL::text[], NULL::bigint, false
    FROM meta m
    UNION ALL
    (SELECT NULL, NULL, p.id, p.event,
            CASE WHEN p.rn <= replay.max_events AND (p.rn = 1 OR p.run <= replay.max_bytes) THEN p.data END,
            p.audience,
            floor(extract(epoch FROM p.created_at) * 1000000)::bigint,
            p.rn <= replay.max_events AND (p.rn = 1 OR p.run <= replay.max_bytes)
     FROM page p ORDER BY p.id)
$fn$;
`

// MigrationSQL returns the whole schema as one SQL script for `pgsse migrate --print`:
// applied with psql (or any tool that runs a multi-statement script), it gives the same
// schema and pgsse.schema_version rows as Migrate. Each version runs in its own
// transaction under the same advisory lock Migrate takes, and only if it is not yet
// recorded, so running the script twice, or next to Migrate, is harmless.
func MigrationSQL() string { return migrationSQL(Migrations) }

// migrationSQL is MigrationSQL for the given migrations (tests install older versions).
func migrationSQL(migrations []Migration) string {
	var b strings.Builder
	b.WriteString("-- pgsse schema, version " + strconv.Itoa(migrations[len(migrations)-1].Version) + ". Generated by `pgsse migrate --print`.\n")
	b.WriteString("-- Safe to run more than once and concurrently with `pgsse migrate`.\n")
	lock := "BEGIN;\nSET LOCAL client_min_messages = warning;\n" +
		"DO $pgsse_lock$ BEGIN PERFORM pg_advisory_xact_lock(" + strconv.Itoa(migrateLockKey) + "); END $pgsse_lock$;\n"
	b.WriteString(lock + bootstrapSQL + "\nCOMMIT;\n")
	for _, m := range migrations {
		v := strconv.Itoa(m.Version)
		tag := "$pgsse_v" + v + "$"
		b.WriteString("\n-- version " + v + "\n" + lock)
		b.WriteString("DO $pgsse_migrate$\nBEGIN\n")
		b.WriteString("IF NOT EXISTS (SELECT 1 FROM pgsse.schema_version WHERE version = " + v + ") THEN\n")
		b.WriteString("EXECUTE " + tag + m.SQL + tag + ";\n")
		b.WriteString("INSERT INTO pgsse.schema_version (version) VALUES (" + v + ");\n")
		b.WriteString("END IF;\nEND\n$pgsse_migrate$;\nCOMMIT;\n")
	}
	return b.String()
}

// Version returns the schema version recorded in the database, 0 if pgsse was never
// migrated there.
func Version(ctx context.Context, conn *pgconn.PgConn) (int, error) {
	res, err := conn.Exec(ctx, `SELECT to_regclass('pgsse.schema_version') IS NOT NULL`).ReadAll()
	if err != nil {
		return 0, fmt.Errorf("store: read schema version: %w", err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || string(res[0].Rows[0][0]) != "t" {
		return 0, nil
	}
	res, err = conn.Exec(ctx, `SELECT coalesce(max(version), 0) FROM pgsse.schema_version`).ReadAll()
	if err != nil {
		return 0, fmt.Errorf("store: read schema version: %w", err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 {
		return 0, errors.New("store: read schema version: unexpected result")
	}
	v, err := strconv.Atoi(string(res[0].Rows[0][0]))
	if err != nil {
		return 0, fmt.Errorf("store: read schema version: %w", err)
	}
	return v, nil
}

// Migrate brings the database to SchemaVersion: under a session advisory lock (so
// runs from several hosts at once serialise), it applies each missing migration in
// its own transaction and records it. It returns the version found and the version
// left. A database newer than this build is left alone and reported as an error.
func Migrate(ctx context.Context, conn *pgconn.PgConn) (from, to int, err error) {
	return migrate(ctx, conn, Migrations)
}

// migrate is Migrate up to the last of migrations (tests install older versions).
func migrate(ctx context.Context, conn *pgconn.PgConn, migrations []Migration) (from, to int, err error) {
	target := migrations[len(migrations)-1].Version
	lockKey := strconv.Itoa(migrateLockKey)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock("+lockKey+")").ReadAll(); err != nil {
		return 0, 0, fmt.Errorf("store: migrate: take advisory lock: %w", err)
	}
	defer func() {
		// Unlock even if ctx is done; closing the session would release it too.
		if _, uerr := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock("+lockKey+")").ReadAll(); uerr != nil && err == nil {
			err = fmt.Errorf("store: migrate: release advisory lock: %w", uerr)
		}
	}()
	if _, err := conn.Exec(ctx, bootstrapSQL).ReadAll(); err != nil {
		return 0, 0, fmt.Errorf("store: migrate: create schema pgsse: %w", err)
	}
	from, err = Version(ctx, conn)
	if err != nil {
		return 0, 0, err
	}
	if from > target {
		return from, from, fmt.Errorf("store: migrate: database schema version %d is newer than this pgsse (%d)", from, target)
	}
	to = from
	for _, m := range migrations {
		if m.Version <= to {
			continue
		}
		sql := "BEGIN;\n" + m.SQL + "\nINSERT INTO pgsse.schema_version (version) VALUES (" + strconv.Itoa(m.Version) + ");\nCOMMIT;"
		if _, err := conn.Exec(ctx, sql).ReadAll(); err != nil {
			if conn.TxStatus() != 'I' {
				_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK").ReadAll()
			}
			return from, to, fmt.Errorf("store: migrate to version %d: %w", m.Version, err)
		}
		to = m.Version
	}
	return from, to, nil
}
