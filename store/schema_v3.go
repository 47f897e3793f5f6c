package store

// migration3 (issue 21): presence (SPEC §3d) and the reserved event-name prefix (SPEC §2).
//
// Presence lives in three UNLOGGED tables (docs/architecture.md says why): one row per
// registered pgsse process with its lease, one row per (stream, subject, process) with a
// connection count, and one row per stream that has presence, holding the stream's change
// number. pgsse.presence_flush is the one statement a process runs per interval
// (store.Presence); pgsse.presence answers the application's question in SQL.
//
// pgsse.check_args and pgsse.valid_names gain the rule that event names starting with
// "pgsse:" are reserved (pgsse:gap, pgsse:presence); everything else in them is as in
// versions 1 and 2, so pgsse.publish, pgsse.broadcast and pgsse.publish_many refuse such
// names with SQLSTATE 22023 and keep their signatures, results and other messages.
//
// pgsse.events loses its index on created_at (issue 20): every durable event wrote a
// second index entry for the sake of pgsse.prune alone (of a 30-event pgsse.publish_many
// call, 279 of its 525 buffer accesses and 53 of its 174 WAL records). pgsse.prune now
// probes each stream's oldest event on the primary key, and passes over the streams it
// left without events (the UNLOGGED cache pgsse.pruned_streams) until they are published
// to again; its signature, results and messages are unchanged.
const migration3 = `
CREATE OR REPLACE FUNCTION pgsse.check_args(stream text, data text, event text, audience text[])
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
        IF left(event, 6) = 'pgsse:' THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = 'event names starting with pgsse: are reserved',
                DETAIL = format('event = %L; pgsse:gap and pgsse:presence are pgsse''s own events', left(event, 64));
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

CREATE OR REPLACE FUNCTION pgsse.valid_names(stream text, event text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT octet_length(stream) BETWEEN 1 AND 200
       AND stream COLLATE "C" ~ '^[A-Za-z0-9._:@/=+~-]+$'
       AND (event IS NULL OR (octet_length(event) BETWEEN 1 AND 64
                              AND event COLLATE "C" ~ '^[A-Za-z0-9._:-]+$'
                              AND left(event, 6) <> 'pgsse:'))
$fn$;

-- One row per registered pgsse process. process is its stable key (host, listen address,
-- process index), incarnation a random number of this registration. The lease ends at
-- expires_at; a lapsed lease is never renewed: survivors delete the process and its entries.
CREATE UNLOGGED TABLE pgsse.presence_processes (
    incarnation bigint      PRIMARY KEY,
    process     text        NOT NULL UNIQUE,
    interval_ms integer     NOT NULL,
    started_at  timestamptz NOT NULL,
    renewed_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL
);

-- One row per (stream, subject, process) with the process's connection count (> 0) and
-- since when it has had one; sub '' holds the process's anonymous connections.
CREATE UNLOGGED TABLE pgsse.presence_entries (
    stream      text        NOT NULL,
    sub         text        NOT NULL,
    incarnation bigint      NOT NULL,
    connections integer     NOT NULL,
    since       timestamptz NOT NULL,
    PRIMARY KEY (stream, sub, incarnation)
);

CREATE INDEX presence_entries_incarnation_idx ON pgsse.presence_entries (incarnation);

-- One row per stream with entries: seq is the number of its last change (from
-- presence_seq, so numbers only grow, even across a row deleted and made again), and the
-- row is what a flush locks to serialise the changes of one stream.
CREATE UNLOGGED TABLE pgsse.presence_streams (
    stream text   PRIMARY KEY,
    seq    bigint NOT NULL
);

CREATE SEQUENCE pgsse.presence_seq AS bigint;

-- presence answers, inside any transaction, who is on a stream: each subject with its
-- connections summed over the processes whose lease is live, and since when (the earliest
-- of them). Anonymous connections are counted by pgsse but never listed.
CREATE FUNCTION pgsse.presence(stream text)
RETURNS TABLE (sub text, connections integer, since timestamptz)
LANGUAGE sql STABLE AS $fn$
    SELECT e.sub, least(sum(e.connections), 2147483647)::integer, min(e.since)
    FROM pgsse.presence_entries e
    JOIN pgsse.presence_processes p ON p.incarnation = e.incarnation
    WHERE e.stream = presence.stream AND e.sub <> '' AND p.expires_at >= now()
    GROUP BY e.sub
    ORDER BY e.sub COLLATE "C"
$fn$;

-- presence_flush is one pgsse process's write for one interval (store.Presence): in one
-- statement it removes the processes whose lease lapsed (this one included) and, when
-- registering, every earlier incarnation of this process; renews this process's lease;
-- sets its counts (streams[i], subs[i]) = counts[i] (0 removes the entry; mode 'register'
-- gives the whole state, and entries it does not name go; 'retire' removes everything of
-- this process); and, for each stream whose subjects joined or left or whose anonymous
-- count changed, takes the next change number and sends NOTIFY pgsse 'P1 …' (store/doc.go).
-- Streams are locked (their presence_streams rows, in name order) before anything is
-- read that decides who joined or left, so each change is computed against the last one
-- and every process sees one sequence of changes per stream. Rows: ('status', NULL,
-- ok|lost|superseded|retired), ('reaped' or 'replaced', NULL, process, incarnation, NULL,
-- entries), ('stream', stream, NULL, seq, prev, anonymous), ('join' or 'leave', stream,
-- sub). Each (stream, sub) may be given once (a new one given twice violates the key).
CREATE FUNCTION pgsse.presence_flush(process text, incarnation bigint, interval_ms integer, lease_ms integer,
                                     mode text, streams text[], subs text[], counts integer[])
RETURNS TABLE (kind text, stream text, sub text, seq bigint, prev bigint, n bigint)
LANGUAGE plpgsql
-- The presence tables change fast and are often not analyzed yet (a fresh start, a crash
-- that emptied them): index probes are what every statement here wants, whatever the
-- statistics say, and each one is planned for the arrays it gets.
SET enable_seqscan = off SET plan_cache_mode = force_custom_plan SET jit = off SET work_mem = '64MB'
AS $fn$
DECLARE
    v_now       timestamptz;
    v_time      bigint;
    v_status    text := 'ok';
    v_valid     boolean;
    v_dead      bigint[] := '{}';
    r_kind      text[] := '{}';   -- 'reaped' / 'replaced', per removed process
    r_key       text[] := '{}';
    r_inc       bigint[] := '{}';
    r_rows      bigint[] := '{}';
    del_stream  text[] := '{}';   -- this process's changes: rows to delete, update, insert
    del_sub     text[] := '{}';
    upd_stream  text[] := '{}';
    upd_sub     text[] := '{}';
    upd_n       integer[] := '{}';
    ins_stream  text[] := '{}';
    ins_sub     text[] := '{}';
    ins_n       integer[] := '{}';
    t_stream    text[] := '{}';   -- its subjects that came or went (t_left: went)
    t_sub       text[] := '{}';
    t_left      boolean[] := '{}';
    a_stream    text[] := '{}';   -- its changes of anonymous counts
    a_delta     integer[] := '{}';
    x_stream    text[] := '{}';   -- what the removed processes held, per (stream, sub)
    x_sub       text[] := '{}';
    x_conn      bigint[] := '{}';
    l_stream    text[] := '{}';   -- locked streams, with their change number before this one
    l_prev      bigint[] := '{}';
    s_stream    text[] := '{}';   -- changed streams
    s_prev      bigint[] := '{}';
    s_seq       bigint[] := '{}';
    s_anon      bigint[] := '{}';
    d_stream    text[] := '{}';   -- joins (d_join) and leaves, in no order
    d_sub       text[] := '{}';
    d_join      boolean[] := '{}';
    v_payloads  text[];
BEGIN
    IF presence_flush.process IS NULL OR octet_length(presence_flush.process) NOT BETWEEN 1 AND 200
       OR presence_flush.process ~ E'[\\x01-\\x1f\\x7f]' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'presence process key must be 1-200 bytes without control characters';
    END IF;
    IF presence_flush.incarnation IS NULL OR presence_flush.incarnation < 1 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'presence incarnation must be a positive bigint';
    END IF;
    IF presence_flush.interval_ms IS NULL OR presence_flush.interval_ms < 1
       OR presence_flush.lease_ms IS NULL OR presence_flush.lease_ms < presence_flush.interval_ms THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'presence interval_ms must be positive and lease_ms at least interval_ms';
    END IF;
    IF presence_flush.mode IS NULL OR presence_flush.mode NOT IN ('flush', 'register', 'retire') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'presence mode must be flush, register or retire';
    END IF;
    IF coalesce(array_ndims(presence_flush.streams), 1) <> 1 OR coalesce(array_ndims(presence_flush.subs), 1) <> 1
       OR coalesce(array_ndims(presence_flush.counts), 1) <> 1
       OR coalesce(cardinality(presence_flush.streams), 0) <> coalesce(cardinality(presence_flush.subs), 0)
       OR coalesce(cardinality(presence_flush.streams), 0) <> coalesce(cardinality(presence_flush.counts), 0) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'presence streams, subs and counts must be one-dimensional arrays of the same length';
    END IF;

    v_now := clock_timestamp();
    v_time := floor(extract(epoch FROM v_now) * 1000000)::bigint;

    -- 1. Registering replaces every earlier incarnation of this process: a process that
    --    restarts clears what it had before, at once. Waits if one is flushing right now.
    IF presence_flush.mode = 'register' THEN
        WITH gone AS (
            DELETE FROM pgsse.presence_processes p
            WHERE p.process = presence_flush.process AND p.incarnation <> presence_flush.incarnation
            RETURNING p.process AS key, p.incarnation AS inc)
        SELECT coalesce(array_agg(g.key), '{}'), coalesce(array_agg(g.inc), '{}'),
               coalesce(array_agg('replaced'::text), '{}')
        INTO r_key, r_inc, r_kind FROM gone g;
    END IF;

    -- 2. Reap every process whose lease lapsed, this one included: a lapsed lease is never
    --    renewed. A locked row is being renewed by its owner or reaped by another process.
    WITH lapsed AS (
        SELECT p.incarnation AS inc FROM pgsse.presence_processes p
        WHERE p.expires_at < v_now ORDER BY p.incarnation FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM pgsse.presence_processes p USING lapsed l WHERE p.incarnation = l.inc
        RETURNING p.process AS key, p.incarnation AS inc)
    SELECT r_kind || coalesce(array_agg('reaped'::text), '{}'), r_key || coalesce(array_agg(g.key), '{}'),
           r_inc || coalesce(array_agg(g.inc), '{}')
    INTO r_kind, r_key, r_inc FROM gone g;
    v_dead := r_inc;

    -- 3. This process's own row.
    IF presence_flush.mode = 'retire' THEN
        DELETE FROM pgsse.presence_processes p WHERE p.incarnation = presence_flush.incarnation;
        v_dead := v_dead || presence_flush.incarnation;
        v_status := 'retired';
    ELSIF presence_flush.incarnation = ANY (r_inc) THEN
        v_status := 'lost';
    ELSIF presence_flush.mode = 'register' THEN
        INSERT INTO pgsse.presence_processes AS p (incarnation, process, interval_ms, started_at, renewed_at, expires_at)
        VALUES (presence_flush.incarnation, presence_flush.process, presence_flush.interval_ms, v_now, v_now,
                v_now + presence_flush.lease_ms * interval '1 millisecond')
        ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            -- A repeated registration renews (at the end); another incarnation that
            -- registered the same key at the same moment keeps it.
            PERFORM 1 FROM pgsse.presence_processes p
            WHERE p.incarnation = presence_flush.incarnation AND p.process = presence_flush.process FOR UPDATE;
            IF NOT FOUND THEN
                v_status := 'superseded';
            END IF;
        END IF;
    ELSE
        -- Locked until the end, where the lease is renewed: no survivor reaps this
        -- process while it writes, however long that takes.
        PERFORM 1 FROM pgsse.presence_processes p WHERE p.incarnation = presence_flush.incarnation FOR UPDATE;
        IF NOT FOUND THEN
            v_status := CASE WHEN EXISTS (SELECT 1 FROM pgsse.presence_processes p WHERE p.process = presence_flush.process)
                             THEN 'superseded' ELSE 'lost' END;
        END IF;
    END IF;

    -- A row of this process is found by (stream, sub) on the primary key; "incarnation + 0"
    -- keeps the planner off the incarnation index, which holds every row of the process
    -- (and, within this transaction, those it removed) and made one probe cost them all.
    --
    -- 4. This process's changes: the (stream, sub) whose count differs from its row (only
    --    this process writes its rows, so they cannot change under it), each checked, and
    --    split by what they do, so that no later statement filters an unnest (the planner
    --    would guess its size).
    IF v_status = 'ok' THEN
        WITH ch AS (
            SELECT coalesce(u.s, e.stream) AS s, coalesce(u.b, e.sub) AS b, coalesce(e.connections, 0) AS o,
                   coalesce(u.c, 0) AS n,
                   u.s IS NULL OR (u.c >= 0 AND (e.stream IS NOT NULL
                       OR (pgsse.valid_names(u.s, NULL) AND octet_length(u.b) <= 200 AND u.b !~ E'[\\x01-\\x1f\\x7f]'))) AS ok
            FROM unnest(presence_flush.streams, presence_flush.subs, presence_flush.counts) AS u(s, b, c)
            FULL JOIN (SELECT e.stream, e.sub, e.connections FROM pgsse.presence_entries e
                       WHERE e.incarnation = presence_flush.incarnation) e ON e.stream = u.s AND e.sub = u.b
            WHERE presence_flush.mode = 'register'
              AND coalesce(e.connections, 0) IS DISTINCT FROM coalesce(u.c, 0)
            UNION ALL
            SELECT u.s, u.b, coalesce(e.connections, 0), u.c,
                   pgsse.valid_names(u.s, NULL) AND octet_length(u.b) <= 200 AND u.b !~ E'[\\x01-\\x1f\\x7f]' AND u.c >= 0
            FROM unnest(presence_flush.streams, presence_flush.subs, presence_flush.counts) AS u(s, b, c)
            LEFT JOIN pgsse.presence_entries e
              ON e.stream = u.s AND e.sub = u.b AND e.incarnation + 0 = presence_flush.incarnation
            WHERE presence_flush.mode = 'flush' AND coalesce(e.connections, 0) IS DISTINCT FROM u.c
        )
        SELECT coalesce(bool_and(coalesce(ch.ok, false)), true),
               coalesce(array_agg(ch.s) FILTER (WHERE ch.o > 0 AND ch.n = 0), '{}'),
               coalesce(array_agg(ch.b) FILTER (WHERE ch.o > 0 AND ch.n = 0), '{}'),
               coalesce(array_agg(ch.s) FILTER (WHERE ch.o > 0 AND ch.n > 0), '{}'),
               coalesce(array_agg(ch.b) FILTER (WHERE ch.o > 0 AND ch.n > 0), '{}'),
               coalesce(array_agg(ch.n) FILTER (WHERE ch.o > 0 AND ch.n > 0), '{}'),
               coalesce(array_agg(ch.s) FILTER (WHERE ch.o = 0 AND ch.n > 0), '{}'),
               coalesce(array_agg(ch.b) FILTER (WHERE ch.o = 0 AND ch.n > 0), '{}'),
               coalesce(array_agg(ch.n) FILTER (WHERE ch.o = 0 AND ch.n > 0), '{}'),
               coalesce(array_agg(ch.s) FILTER (WHERE ch.b <> '' AND (ch.o = 0) <> (ch.n = 0)), '{}'),
               coalesce(array_agg(ch.b) FILTER (WHERE ch.b <> '' AND (ch.o = 0) <> (ch.n = 0)), '{}'),
               coalesce(array_agg(ch.o > 0) FILTER (WHERE ch.b <> '' AND (ch.o = 0) <> (ch.n = 0)), '{}'),
               coalesce(array_agg(ch.s) FILTER (WHERE ch.b = ''), '{}'),
               coalesce(array_agg(ch.n - ch.o) FILTER (WHERE ch.b = ''), '{}')
        INTO v_valid, del_stream, del_sub, upd_stream, upd_sub, upd_n, ins_stream, ins_sub, ins_n,
             t_stream, t_sub, t_left, a_stream, a_delta
        FROM ch;
        IF v_valid IS NOT TRUE THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = 'presence entries need a valid stream name, a subject of 0-200 bytes without control characters and a count of at least 0';
        END IF;
    END IF;

    -- What the removed processes held.
    IF cardinality(v_dead) > 0 THEN
        SELECT coalesce(array_agg(e.stream), '{}'), coalesce(array_agg(e.sub), '{}'), coalesce(array_agg(e.connections::bigint), '{}')
        INTO x_stream, x_sub, x_conn
        FROM unnest(v_dead) AS d(inc) JOIN pgsse.presence_entries e ON e.incarnation = d.inc;
        SELECT coalesce(array_agg((SELECT count(*) FROM pgsse.presence_entries e WHERE e.incarnation = d.inc) ORDER BY d.ord), '{}')
        INTO r_rows FROM unnest(r_inc) WITH ORDINALITY AS d(inc, ord);
    END IF;

    -- 5. Lock the streams whose presence may change, in name order: where a subject of this
    --    process comes or goes, where its anonymous count moves, and every stream a
    --    removed process was on. A count that only moves between two positive values
    --    cannot change who is present, and locks nothing.
    IF cardinality(t_stream) + cardinality(a_stream) + cardinality(x_stream) > 0 THEN
        WITH locked AS (
            INSERT INTO pgsse.presence_streams AS ps (stream, seq)
            SELECT l.s, 0 FROM (
                SELECT t.s FROM unnest(t_stream) AS t(s)
                UNION
                SELECT a.s FROM unnest(a_stream) AS a(s)
                UNION
                SELECT x.s FROM unnest(x_stream) AS x(s)
            ) l
            ORDER BY l.s COLLATE "C"
            ON CONFLICT ON CONSTRAINT presence_streams_pkey DO UPDATE SET seq = ps.seq
            RETURNING ps.stream AS s, ps.seq AS prev)
        SELECT coalesce(array_agg(l.s), '{}'), coalesce(array_agg(l.prev), '{}') INTO l_stream, l_prev FROM locked l;
    END IF;

    -- 6. Apply: remove what the removed processes held, then this process's changes.
    IF cardinality(v_dead) > 0 THEN
        DELETE FROM pgsse.presence_entries e USING unnest(v_dead) AS d(inc) WHERE e.incarnation = d.inc;
    END IF;
    IF cardinality(del_stream) > 0 THEN
        DELETE FROM pgsse.presence_entries e USING unnest(del_stream, del_sub) AS u(s, b)
        WHERE e.stream = u.s AND e.sub = u.b AND e.incarnation + 0 = presence_flush.incarnation;
    END IF;
    IF cardinality(upd_stream) > 0 THEN
        UPDATE pgsse.presence_entries e SET connections = u.n
        FROM unnest(upd_stream, upd_sub, upd_n) AS u(s, b, n)
        WHERE e.stream = u.s AND e.sub = u.b AND e.incarnation + 0 = presence_flush.incarnation;
    END IF;
    IF cardinality(ins_stream) > 0 THEN
        INSERT INTO pgsse.presence_entries (stream, sub, incarnation, connections, since)
        SELECT u.s, u.b, presence_flush.incarnation, u.n, v_now FROM unnest(ins_stream, ins_sub, ins_n) AS u(s, b, n);
    END IF;

    -- 7. Who joined and left, read after the locks. A subject of this process that came
    --    or went changes who is present unless another process holds it (their rows
    --    cannot come or go meanwhile: that needs the stream's lock). With removed
    --    processes, each subject any of them held is present after if a row remains, and
    --    was before if this process had it or any other one did. Each check is one index
    --    probe, so the work follows the changes, not the size of the table.
    IF cardinality(l_stream) > 0 AND cardinality(x_stream) = 0 THEN
        SELECT coalesce(array_agg(a.s), '{}'), coalesce(array_agg(a.b), '{}'), coalesce(array_agg(NOT a.left_), '{}')
        INTO d_stream, d_sub, d_join
        FROM unnest(t_stream, t_sub, t_left) AS a(s, b, left_)
        WHERE NOT EXISTS (SELECT 1 FROM pgsse.presence_entries e
                          WHERE e.stream = a.s AND e.sub = a.b AND e.incarnation <> presence_flush.incarnation);
    ELSIF cardinality(l_stream) > 0 THEN
        WITH k AS (
            SELECT u.s, u.b, bool_or(u.mine_changed) AS mine_changed, bool_or(u.mine_old) AS mine_old,
                   bool_or(u.removed) AS removed
            FROM (SELECT t.s, t.b, true AS mine_changed, t.left_ AS mine_old, false AS removed
                  FROM unnest(t_stream, t_sub, t_left) AS t(s, b, left_)
                  UNION ALL
                  SELECT x.s, x.b, false, false, x.b <> '' FROM unnest(x_stream, x_sub) AS x(s, b)) u
            GROUP BY u.s, u.b
        ), h AS (
            SELECT k.s, k.b, k.mine_changed, k.mine_old, k.removed,
                   coalesce(held.others, false) AS others, coalesce(held.mine, false) AS mine
            FROM k CROSS JOIN LATERAL (
                SELECT bool_or(e.incarnation <> presence_flush.incarnation) AS others,
                       bool_or(e.incarnation = presence_flush.incarnation) AS mine
                FROM pgsse.presence_entries e WHERE e.stream = k.s AND e.sub = k.b) held
        )
        SELECT coalesce(array_agg(h.s), '{}'), coalesce(array_agg(h.b), '{}'), coalesce(array_agg(h.others OR h.mine), '{}')
        INTO d_stream, d_sub, d_join
        FROM h
        WHERE h.b <> ''
          AND (h.others OR h.mine)
              <> (h.others OR h.removed OR (CASE WHEN h.mine_changed THEN h.mine_old ELSE h.mine END));
    END IF;

    IF cardinality(l_stream) > 0 THEN
        -- The anonymous count of each locked stream now, and what it was: now, less this
        -- process's change, plus what the removed processes had.
        WITH mine AS (
            SELECT a.s, a.delta FROM unnest(a_stream, a_delta) AS a(s, delta)
        ), removed AS (
            SELECT x.s, sum(x.n) AS n FROM unnest(x_stream, x_sub, x_conn) AS x(s, b, n) WHERE x.b = '' GROUP BY x.s
        ), moved AS (
            SELECT DISTINCT d.s FROM unnest(d_stream) AS d(s)
        ), changed AS (
            SELECT l.s, l.prev,
                   coalesce((SELECT sum(e.connections) FROM pgsse.presence_entries e WHERE e.stream = l.s AND e.sub = ''), 0) AS anon
            FROM unnest(l_stream, l_prev) AS l(s, prev)
            LEFT JOIN mine m ON m.s = l.s
            LEFT JOIN removed r ON r.s = l.s
            LEFT JOIN moved v ON v.s = l.s
            WHERE coalesce(m.delta, 0) <> coalesce(r.n, 0) OR v.s IS NOT NULL
        ), bumped AS (
            UPDATE pgsse.presence_streams ps SET seq = nextval('pgsse.presence_seq')
            FROM changed c WHERE ps.stream = c.s
            RETURNING ps.stream AS s, ps.seq AS seq, c.prev AS prev, c.anon AS anon
        )
        SELECT coalesce(array_agg(b.s ORDER BY b.s COLLATE "C"), '{}'), coalesce(array_agg(b.prev ORDER BY b.s COLLATE "C"), '{}'),
               coalesce(array_agg(b.seq ORDER BY b.s COLLATE "C"), '{}'), coalesce(array_agg(b.anon ORDER BY b.s COLLATE "C"), '{}')
        INTO s_stream, s_prev, s_seq, s_anon FROM bumped b;

        -- A stream nobody is on any more loses its row; its next change has prev 0.
        DELETE FROM pgsse.presence_streams ps USING unnest(l_stream) AS l(s)
        WHERE ps.stream = l.s
          AND (SELECT 1 FROM pgsse.presence_entries e WHERE e.stream = l.s LIMIT 1) IS NULL;
    END IF;

    -- 8. One notification per changed stream, split into parts of at most 7999 bytes
    --    (at most 64 parts; more is sent as one part 0 of 0: re-read the stream). Each
    --    entry is at most 205 bytes and the header at most 97 bytes plus the stream name,
    --    so a part whose entries end within budget - 205 of the part before it fits.
    IF cardinality(s_stream) > 0 THEN
        WITH d AS (
            SELECT u.s, u.b, u.j, ' ' || octet_length(u.b)::text || ':' || u.b AS enc,
                   row_number() OVER (PARTITION BY u.s ORDER BY u.j DESC, u.b COLLATE "C") AS ord,
                   7999 - 97 - octet_length(u.s) - 205 AS budget
            FROM unnest(d_stream, d_sub, d_join) AS u(s, b, j)
        ), c AS (
            SELECT d.s, d.j, d.ord, d.enc,
                   (sum(octet_length(d.enc)) OVER (PARTITION BY d.s ORDER BY d.ord) - 1) / d.budget AS chunk
            FROM d
        ), parts AS (
            SELECT c.s, c.chunk, count(*) FILTER (WHERE c.j) AS nj, count(*) FILTER (WHERE NOT c.j) AS nl,
                   string_agg(c.enc, '' ORDER BY c.ord) AS body
            FROM c GROUP BY c.s, c.chunk
        ), st AS (
            SELECT u.s, u.prev, u.seq, u.anon,
                   coalesce((SELECT max(p.chunk) + 1 FROM parts p WHERE p.s = u.s), 1) AS nparts
            FROM unnest(s_stream, s_prev, s_seq, s_anon) AS u(s, prev, seq, anon)
        ), msgs AS (
            SELECT st.s, coalesce(p.chunk, 0) + 1 AS part,
                   'P1 ' || v_time::text || ' ' || st.s || ' ' || st.seq::text || ' ' || st.prev::text || ' '
                   || (coalesce(p.chunk, 0) + 1)::text || ' ' || st.nparts::text || ' ' || st.anon::text || ' '
                   || coalesce(p.nj, 0)::text || ' ' || coalesce(p.nl, 0)::text || coalesce(p.body, '') || E'\n' AS payload
            FROM st LEFT JOIN parts p ON p.s = st.s WHERE st.nparts <= 64
            UNION ALL
            SELECT st.s, 0, 'P1 ' || v_time::text || ' ' || st.s || ' ' || st.seq::text || ' ' || st.prev::text
                   || ' 0 0 ' || st.anon::text || E' 0 0\n'
            FROM st WHERE st.nparts > 64
        )
        SELECT array_agg(o.payload ORDER BY o.s COLLATE "C", o.part) INTO v_payloads FROM msgs o;
        PERFORM pg_notify('pgsse', p.payload) FROM unnest(v_payloads) WITH ORDINALITY AS p(payload, ord) ORDER BY p.ord;
    END IF;

    -- 9. Renew the lease from now, the end of the write, so that it lasts lease_ms after
    --    the changes became visible (at commit, a moment later). One reading of the clock
    --    for both columns: two would make the lease a microsecond longer now and then.
    IF v_status = 'ok' THEN
        v_now := clock_timestamp();
        UPDATE pgsse.presence_processes p
        SET interval_ms = presence_flush.interval_ms, renewed_at = v_now,
            expires_at = v_now + presence_flush.lease_ms * interval '1 millisecond'
        WHERE p.incarnation = presence_flush.incarnation;
    END IF;

    RETURN QUERY
        SELECT 'status'::text, NULL::text, v_status, NULL::bigint, NULL::bigint, NULL::bigint
        UNION ALL
        SELECT r.kind, NULL, r.key, r.inc, NULL, r.n
        FROM unnest(r_kind, r_key, r_inc, r_rows) AS r(kind, key, inc, n)
        WHERE r.inc <> presence_flush.incarnation
        UNION ALL
        SELECT 'stream', u.s, NULL, u.seq, u.prev, u.anon FROM unnest(s_stream, s_prev, s_seq, s_anon) AS u(s, prev, seq, anon)
        UNION ALL
        SELECT CASE WHEN u.j THEN 'join' ELSE 'leave' END, u.s, u.b, NULL, NULL, NULL
        FROM unnest(d_stream, d_sub, d_join) AS u(s, b, j);
END
$fn$;

-- pgsse.events keeps one index, its primary key (stream, id). The index on created_at,
-- which only pgsse.prune read, cost every durable event a second index entry: about half
-- of the buffers a publish touches and a third of its WAL records. pgsse.prune finds its
-- work on the primary key instead: one probe of each stream's oldest event.
DROP INDEX pgsse.events_created_at_idx;

-- The streams pgsse.prune left without events, and the id each one's next event gets.
-- Such a stream gets events again only through a publish, which moves its head to that
-- id, so pgsse.prune passes over it, without a probe, until then. It is a cache: a
-- stream without a row is probed (UNLOGGED: a crash empties it, as does a promotion).
CREATE UNLOGGED TABLE pgsse.pruned_streams (
    stream  text   PRIMARY KEY,
    next_id bigint NOT NULL
);

-- prune deletes, per stream, the longest run of oldest events that are all older than
-- older_than, never touching the newest keep_last ids (retained ids stay contiguous even
-- though created_at, the transaction start, need not follow id, the commit order). It
-- probes each stream's oldest event on the (stream, id) key, except the streams it left
-- without events that have had none since (pgsse.pruned_streams); those whose oldest
-- event is old are cut one by one in name order (two prunes at once wait for each other,
-- never deadlock): the cut is found on the same key, stopping at the first young event,
-- and deleted as one key range. The work is one pass over pgsse.streams, a probe per
-- stream holding events, and the events deleted.
CREATE OR REPLACE FUNCTION pgsse.prune(older_than interval, keep_last integer DEFAULT 0)
RETURNS bigint LANGUAGE plpgsql
-- One pass over every stream: costly enough for the planner to try JIT, which takes longer
-- than the pass.
SET jit = off
AS $fn$
DECLARE
    v_cutoff  timestamptz;
    v_deleted bigint := 0;
    v_rows    bigint;
    v_streams text[];
    v_heads   bigint[];
    v_uptos   bigint[];
    v_stream  text;
    v_upto    bigint;
BEGIN
    IF older_than IS NULL OR older_than < interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'older_than must be a non-negative interval';
    END IF;
    IF keep_last IS NULL OR keep_last < 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'keep_last must be a non-negative integer';
    END IF;
    v_cutoff := now() - older_than;
    -- look: every stream that may hold events, its oldest event probed; for those whose
    -- oldest event is old, the last id of the cut (upto: before the first young event,
    -- never past head - keep_last).
    WITH look AS MATERIALIZED (
        SELECT s.stream, s.head, o.id IS NULL AS empty,
               CASE WHEN o.created_at < v_cutoff THEN
                   LEAST(s.head - keep_last,
                         coalesce((SELECT y.id - 1 FROM pgsse.events y
                                   WHERE y.stream = s.stream AND y.created_at >= v_cutoff
                                   ORDER BY y.id LIMIT 1), s.head))
               END AS upto
        FROM pgsse.streams s
        LEFT JOIN pgsse.pruned_streams p ON p.stream = s.stream
        LEFT JOIN LATERAL (SELECT e.id, e.created_at FROM pgsse.events e
                           WHERE e.stream = s.stream ORDER BY e.id LIMIT 1) o ON true
        WHERE p.stream IS NULL OR s.head >= p.next_id
    ), emptied AS (
        INSERT INTO pgsse.pruned_streams AS p (stream, next_id)
        SELECT l.stream, l.head + 1 FROM look l WHERE l.empty ORDER BY l.stream COLLATE "C"
        ON CONFLICT ON CONSTRAINT pruned_streams_pkey DO UPDATE SET next_id = excluded.next_id
    )
    SELECT coalesce(array_agg(l.stream ORDER BY l.stream COLLATE "C"), '{}'),
           coalesce(array_agg(l.head ORDER BY l.stream COLLATE "C"), '{}'),
           coalesce(array_agg(l.upto ORDER BY l.stream COLLATE "C"), '{}')
    INTO v_streams, v_heads, v_uptos
    FROM look l WHERE l.upto IS NOT NULL;

    FOR i IN 1 .. cardinality(v_streams) LOOP
        v_stream := v_streams[i];
        v_upto := v_uptos[i];
        DELETE FROM pgsse.events e WHERE e.stream = v_stream AND e.id <= v_upto;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        v_deleted := v_deleted + v_rows;
    END LOOP;
    -- The streams this left without events.
    IF cardinality(v_streams) > 0 THEN
        INSERT INTO pgsse.pruned_streams AS p (stream, next_id)
        SELECT c.stream, c.head + 1 FROM unnest(v_streams, v_heads) AS c(stream, head)
        WHERE NOT EXISTS (SELECT 1 FROM pgsse.events e WHERE e.stream = c.stream)
        ORDER BY c.stream COLLATE "C"
        ON CONFLICT ON CONSTRAINT pruned_streams_pkey DO UPDATE SET next_id = excluded.next_id;
    END IF;
    RETURN v_deleted;
END
$fn$;
`
