package store

// migration2 (issues 11 and 13): pgsse.max_event_bytes, a cheaper pgsse.publish, the
// set-based pgsse.publish_many with its pgsse.message type, and a pgsse.prune whose cost
// grows with the rows it deletes instead of with the square of a stream's length.
//
// pgsse.publish, pgsse.broadcast and pgsse.prune keep their signatures, results, error
// messages and SQLSTATEs; only their bodies change (CREATE OR REPLACE keeps grants).
// The payload encoding moves from the SQL function encode_payload (which PostgreSQL parsed
// and planned again on every call: half of pgsse.publish's time) into
// pgsse.payload_header, which the planner inlines, and the plpgsql pgsse.payload_tags.
const migration2 = `
DROP FUNCTION pgsse.encode_payload(text, bigint, text, bigint, text, text[], text);

-- The limit on durable event data, from the setting pgsse.max_event_bytes as the calling
-- session sees it (ALTER DATABASE/ROLE … SET, postgresql.conf, SET): a whole number of
-- bytes; unset or empty means 1048576. Inlined by the planner into its callers.
CREATE FUNCTION pgsse.bad_max_event_bytes(setting text)
RETURNS bigint LANGUAGE plpgsql STABLE AS $fn$
BEGIN
    RAISE EXCEPTION USING ERRCODE = '22023',
        MESSAGE = format('pgsse.max_event_bytes must be a whole number of bytes, not %L', setting),
        HINT = 'e.g. ALTER DATABASE mydb SET pgsse.max_event_bytes = 4194304';
END
$fn$;

CREATE FUNCTION pgsse.max_event_bytes()
RETURNS bigint LANGUAGE sql STABLE PARALLEL SAFE AS $fn$
    SELECT CASE
        WHEN coalesce(current_setting('pgsse.max_event_bytes', true), '') = '' THEN 1048576::bigint
        WHEN current_setting('pgsse.max_event_bytes', true) ~ '^[0-9]{1,18}$'
            THEN current_setting('pgsse.max_event_bytes', true)::bigint
        ELSE pgsse.bad_max_event_bytes(current_setting('pgsse.max_event_bytes', true))
    END
$fn$;

CREATE FUNCTION pgsse.event_too_large(data_bytes bigint, max_bytes bigint)
RETURNS void LANGUAGE plpgsql STABLE AS $fn$
BEGIN
    RAISE EXCEPTION USING ERRCODE = '22023',
        MESSAGE = format('event data is %s bytes, over pgsse.max_event_bytes (%s bytes)', data_bytes, max_bytes),
        HINT = 'raise the limit with ALTER DATABASE … SET pgsse.max_event_bytes = <bytes>, or publish a reference to the data';
END
$fn$;

-- valid_names is true when stream and event (NULL = "message") follow the name rules;
-- the same rules as check_args, which says which one is broken. Inlined by the planner.
CREATE FUNCTION pgsse.valid_names(stream text, event text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT octet_length(stream) BETWEEN 1 AND 200
       AND stream COLLATE "C" ~ '^[A-Za-z0-9._:@/=+~-]+$'
       AND (event IS NULL OR (octet_length(event) BETWEEN 1 AND 64
                              AND event COLLATE "C" ~ '^[A-Za-z0-9._:-]+$'))
$fn$;

-- check_publish raises what is wrong with the arguments of a durable publish (the
-- check_args rules, then the size), or returns the audience to store: NULL for everyone.
CREATE FUNCTION pgsse.check_publish(stream text, data text, event text, audience text[])
RETURNS text[] LANGUAGE plpgsql STABLE AS $fn$
BEGIN
    PERFORM pgsse.check_args(stream, data, event, audience);
    IF octet_length(data) > pgsse.max_event_bytes() THEN
        PERFORM pgsse.event_too_large(octet_length(data), pgsse.max_event_bytes());
    END IF;
    RETURN CASE WHEN cardinality(audience) > 0 THEN audience END;
END
$fn$;

-- payload_tags encodes an audience for the payload header: ' 0' for everyone, else
-- ' <n>' and ' <len>:<tag>' per tag (payload format version 1, see store/doc.go).
CREATE FUNCTION pgsse.payload_tags(audience text[])
RETURNS text LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $fn$
DECLARE
    v_tags text;
    v_tag  text;
BEGIN
    IF coalesce(cardinality(audience), 0) = 0 THEN
        RETURN ' 0';
    END IF;
    v_tags := ' ' || cardinality(audience)::text;
    FOREACH v_tag IN ARRAY audience LOOP
        v_tags := v_tags || ' ' || octet_length(v_tag)::text || ':' || v_tag;
    END LOOP;
    RETURN v_tags;
END
$fn$;

-- payload_header is a payload up to and including its LF; tags comes from payload_tags.
-- Each parameter is used once and every function in it is immutable, so the planner
-- inlines it into the caller's expression.
CREATE FUNCTION pgsse.payload_header(kind text, time_us bigint, stream text, id bigint,
                                     event text, tags text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT kind || '1 ' || time_us::text || ' ' || stream || ' ' || id::text || ' '
        || coalesce(event, '') || tags || E'\n'
$fn$;

CREATE OR REPLACE FUNCTION pgsse.publish(stream text, data text, event text DEFAULT NULL, audience text[] DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
    v_time   bigint := floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
    v_id     bigint;
    v_header text;
BEGIN
    -- The common case passes in one expression, cheapest tests first. Anything else goes
    -- to check_publish, which raises the exact error or normalises the audience.
    IF (publish.audience IS NULL AND publish.data IS NOT NULL
        AND octet_length(publish.data) <= pgsse.max_event_bytes()
        AND pgsse.valid_names(publish.stream, publish.event)) IS NOT TRUE THEN
        publish.audience := pgsse.check_publish(publish.stream, publish.data, publish.event, publish.audience);
    END IF;
    -- The counter row stays locked until this transaction ends: a concurrent publisher
    -- to the same stream waits here and, after our commit, takes the next number, so
    -- ids follow commit order and a rollback returns its number unused.
    INSERT INTO pgsse.streams AS s (stream, head) VALUES (publish.stream, 1)
        ON CONFLICT ON CONSTRAINT streams_pkey DO UPDATE SET head = s.head + 1
        RETURNING s.head INTO v_id;
    INSERT INTO pgsse.events (stream, id, event, data, audience)
        VALUES (publish.stream, v_id, publish.event, publish.data, publish.audience);
    v_header := pgsse.payload_header('D', v_time, publish.stream, v_id, publish.event,
        CASE WHEN publish.audience IS NULL THEN ' 0' ELSE pgsse.payload_tags(publish.audience) END);
    IF octet_length(v_header) + octet_length(publish.data) <= 7999 THEN
        PERFORM pg_notify('pgsse', v_header || publish.data);
    ELSE
        PERFORM pg_notify('pgsse', pgsse.payload_header('W', v_time, publish.stream, v_id, NULL, ' 0'));
    END IF;
    RETURN v_id;
END
$fn$;

CREATE OR REPLACE FUNCTION pgsse.broadcast(stream text, data text, event text DEFAULT NULL, audience text[] DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    v_header text;
BEGIN
    IF (broadcast.audience IS NULL AND broadcast.data IS NOT NULL
        AND pgsse.valid_names(broadcast.stream, broadcast.event)) IS NOT TRUE THEN
        PERFORM pgsse.check_args(broadcast.stream, broadcast.data, broadcast.event, broadcast.audience);
    END IF;
    v_header := pgsse.payload_header('E', floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint,
        broadcast.stream, nextval('pgsse.broadcast_nonce'), broadcast.event, pgsse.payload_tags(broadcast.audience));
    IF octet_length(v_header) + octet_length(broadcast.data) > 7999 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgsse.broadcast: the notification payload would be %s bytes, over the 7999-byte NOTIFY limit; use pgsse.publish for large data',
                             octet_length(v_header) + octet_length(broadcast.data));
    END IF;
    PERFORM pg_notify('pgsse', v_header || broadcast.data);
END
$fn$;

-- valid_audience is true when audience follows the check_args rules (NULL: not checked).
CREATE FUNCTION pgsse.valid_audience(audience text[])
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT coalesce(array_ndims(audience), 1) = 1 AND coalesce(cardinality(audience), 0) <= 64
       AND NOT EXISTS (SELECT 1 FROM unnest(audience) AS t(tag)
                       WHERE t.tag IS NULL OR octet_length(t.tag) NOT BETWEEN 1 AND 200
                          OR t.tag ~ E'[\\x01-\\x1f\\x7f]')
$fn$;

-- One event for pgsse.publish_many: the arguments of pgsse.publish, plus ephemeral
-- (true = pgsse.broadcast semantics: delivered at commit, not stored; NULL = false).
CREATE TYPE pgsse.message AS (stream text, data text, event text, audience text[], ephemeral boolean);

-- pgsse.message(...) builds one, with pgsse.publish's defaults.
CREATE FUNCTION pgsse.message(stream text, data text, event text DEFAULT NULL,
                              audience text[] DEFAULT NULL, ephemeral boolean DEFAULT false)
RETURNS pgsse.message LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT ROW(stream, data, event, audience, ephemeral)::pgsse.message
$fn$;

-- publish_many publishes messages in one statement: the ids of each stream's durable
-- messages are contiguous, in array order, and follow commit order like pgsse.publish;
-- each stream gets one notification (D when it got one event that fits, else a W naming
-- the first of its new ids), each ephemeral message its own E. Returns the ids in array
-- order, NULL for ephemeral messages. All or nothing: one bad message raises for all.
CREATE FUNCTION pgsse.publish_many(messages pgsse.message[])
RETURNS bigint[] LANGUAGE plpgsql AS $fn$
DECLARE
    v_time     bigint := floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
    v_max      bigint := pgsse.max_event_bytes();
    v_bad      record;
    v_ids      bigint[];
    v_payloads text[];
    v_big_ord  bigint;
    v_big_size bigint;
    v_msg      text;
    v_detail   text;
    v_hint     text;
    v_one      pgsse.message;
BEGIN
    IF messages IS NULL THEN
        RETURN NULL;
    END IF;
    IF array_ndims(messages) > 1 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'messages must be a one-dimensional array';
    END IF;
    -- One valid durable message is exactly a pgsse.publish, which costs a third.
    IF cardinality(messages) = 1 THEN
        v_one := messages[array_lower(messages, 1)];
        IF (NOT coalesce(v_one.ephemeral, false) AND v_one.data IS NOT NULL
            AND octet_length(v_one.data) <= v_max
            AND (v_one.audience IS NULL OR pgsse.valid_audience(v_one.audience))
            AND pgsse.valid_names(v_one.stream, v_one.event)) IS TRUE THEN
            RETURN ARRAY[pgsse.publish(v_one.stream, v_one.data, v_one.event, v_one.audience)];
        END IF;
    END IF;
    -- Every message is checked before anything is written; the first bad one (in array
    -- order) raises the error pgsse.publish/pgsse.broadcast would, with messages[n] in
    -- the DETAIL.
    SELECT u.ord, u.stream, u.event, u.audience, coalesce(u.ephemeral, false) AS ephemeral,
           CASE WHEN u.data IS NOT NULL THEN '' END AS data, octet_length(u.data) AS data_bytes
    INTO v_bad
    FROM unnest(messages) WITH ORDINALITY AS u(stream, data, event, audience, ephemeral, ord)
    WHERE (u.data IS NOT NULL
           AND (u.audience IS NULL OR pgsse.valid_audience(u.audience))
           AND (u.ephemeral OR octet_length(u.data) <= v_max)
           AND pgsse.valid_names(u.stream, u.event)) IS NOT TRUE
    ORDER BY u.ord LIMIT 1;
    IF FOUND THEN
        -- The data itself is not copied here: check_args only looks at whether it is NULL.
        BEGIN
            PERFORM pgsse.check_args(v_bad.stream, v_bad.data, v_bad.event, v_bad.audience);
            IF NOT v_bad.ephemeral AND v_bad.data_bytes > v_max THEN
                PERFORM pgsse.event_too_large(v_bad.data_bytes, v_max);
            END IF;
        EXCEPTION WHEN invalid_parameter_value THEN
            GET STACKED DIAGNOSTICS v_msg = MESSAGE_TEXT, v_detail = PG_EXCEPTION_DETAIL, v_hint = PG_EXCEPTION_HINT;
            v_detail := format('messages[%s]', v_bad.ord) || coalesce(': ' || nullif(v_detail, ''), '');
            IF coalesce(v_hint, '') = '' THEN
                RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = v_msg, DETAIL = v_detail;
            END IF;
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = v_msg, DETAIL = v_detail, HINT = v_hint;
        END;
        RAISE EXCEPTION 'pgsse.publish_many: messages[%] failed the quick check but passes check_args', v_bad.ord;
    END IF;

    -- One pass numbers each stream's durable messages (rank, and n per stream), the
    -- counter rows are bumped by n, and each message's id is head - n + rank.
    WITH msg AS MATERIALIZED (
        SELECT u.ord, u.stream, u.data, u.event, u.audience, u.ephemeral,
               row_number() OVER (PARTITION BY u.stream, u.ephemeral ORDER BY u.ord) AS rank,
               count(*) OVER (PARTITION BY u.stream, u.ephemeral) AS n
        FROM (SELECT u.ord, u.stream, u.data, u.event,
                     CASE WHEN cardinality(u.audience) > 0 THEN u.audience END AS audience,
                     coalesce(u.ephemeral, false) AS ephemeral
              FROM unnest(messages) WITH ORDINALITY AS u(stream, data, event, audience, ephemeral, ord)) u
    ), heads AS (
        -- One counter row per stream, locked in stream order (so two publish_many calls
        -- never deadlock each other) until the transaction ends, as in pgsse.publish.
        INSERT INTO pgsse.streams AS s (stream, head)
        SELECT m.stream, m.n FROM msg m WHERE NOT m.ephemeral AND m.rank = 1 ORDER BY m.stream COLLATE "C"
        ON CONFLICT ON CONSTRAINT streams_pkey DO UPDATE SET head = s.head + excluded.head
        RETURNING s.stream, s.head
    ), numbered AS (
        SELECT m.ord, m.stream, m.data, m.event, m.audience, m.rank, m.n, h.head - m.n + m.rank AS id
        FROM msg m JOIN heads h ON h.stream = m.stream
        WHERE NOT m.ephemeral
    ), stored AS (
        INSERT INTO pgsse.events (stream, id, event, data, audience)
        SELECT n.stream, n.id, n.event, n.data, n.audience FROM numbered n
    ), answer AS (
        -- Each stream's first durable message carries the stream's one payload; each
        -- ephemeral message its own.
        SELECT nb.ord, false AS ephemeral, nb.id,
               CASE
                   WHEN nb.rank <> 1 THEN NULL
                   WHEN nb.n = 1 AND octet_length(nb.data) + octet_length(pgsse.payload_header('D', v_time, nb.stream, nb.id, nb.event,
                           CASE WHEN nb.audience IS NULL THEN ' 0' ELSE pgsse.payload_tags(nb.audience) END)) <= 7999 THEN
                       pgsse.payload_header('D', v_time, nb.stream, nb.id, nb.event,
                           CASE WHEN nb.audience IS NULL THEN ' 0' ELSE pgsse.payload_tags(nb.audience) END) || nb.data
                   ELSE pgsse.payload_header('W', v_time, nb.stream, nb.id, NULL, ' 0')
               END AS payload
        FROM numbered nb
        UNION ALL
        SELECT m.ord, true, NULL,
               pgsse.payload_header('E', v_time, m.stream, nextval('pgsse.broadcast_nonce'), m.event,
                   CASE WHEN m.audience IS NULL THEN ' 0' ELSE pgsse.payload_tags(m.audience) END) || m.data
        FROM msg m WHERE m.ephemeral
    )
    SELECT array_agg(o.id ORDER BY o.ord),
           array_agg(o.payload ORDER BY o.ord) FILTER (WHERE o.payload IS NOT NULL),
           min(o.ord) FILTER (WHERE o.ephemeral AND octet_length(o.payload) > 7999),
           max(octet_length(o.payload)) FILTER (WHERE o.ephemeral AND octet_length(o.payload) > 7999)
    INTO v_ids, v_payloads, v_big_ord, v_big_size
    FROM answer o;

    IF v_big_ord IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgsse.broadcast: the notification payload would be %s bytes, over the 7999-byte NOTIFY limit; use pgsse.publish for large data', v_big_size),
            DETAIL = format('messages[%s]', v_big_ord);
    END IF;
    -- One statement for all notifications, in array order.
    PERFORM pg_notify('pgsse', p.payload) FROM unnest(v_payloads) WITH ORDINALITY AS p(payload, ord) ORDER BY p.ord;
    RETURN coalesce(v_ids, '{}');
END
$fn$;

-- prune deletes, per stream, the longest run of oldest events that are all older than
-- older_than, never touching the newest keep_last ids (retained ids stay contiguous even
-- though created_at, the transaction start, need not follow id, the commit order). Each
-- stream's cut is found on the (stream, id) key, stopping at its first young event, and
-- deleted as one key range: the work grows with the old events, not with their square.
CREATE OR REPLACE FUNCTION pgsse.prune(older_than interval, keep_last integer DEFAULT 0)
RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
    v_cutoff  timestamptz;
    v_deleted bigint := 0;
    v_rows    bigint;
    v_cut     record;
BEGIN
    IF older_than IS NULL OR older_than < interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'older_than must be a non-negative interval';
    END IF;
    IF keep_last IS NULL OR keep_last < 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'keep_last must be a non-negative integer';
    END IF;
    v_cutoff := now() - older_than;
    FOR v_cut IN
        SELECT s.stream,
               LEAST(s.head - keep_last,
                     -- The stream's first young event, found by walking its (stream, id)
                     -- key from the oldest; "+ interval '0'" keeps the planner off the
                     -- created_at index, which would visit every young event of the table.
                     coalesce((SELECT y.id - 1 FROM pgsse.events y
                               WHERE y.stream = s.stream AND y.created_at + interval '0' >= v_cutoff
                               ORDER BY y.id LIMIT 1), s.head)) AS upto
        FROM (SELECT DISTINCT e.stream FROM pgsse.events e WHERE e.created_at < v_cutoff) old
        JOIN pgsse.streams s ON s.stream = old.stream
    LOOP
        DELETE FROM pgsse.events e WHERE e.stream = v_cut.stream AND e.id <= v_cut.upto;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        v_deleted := v_deleted + v_rows;
    END LOOP;
    RETURN v_deleted;
END
$fn$;
`
