-- A prototype, installed by no migration (bench/pgir/ir.sh runs it as SETUP in a throwaway
-- cluster): pgsse.publish_many's work for a group without ephemeral messages when the
-- caller has done the numbering. Run k is the stream of messages[firsts[k]], with counts[k]
-- messages; message i is in run runs[i] with rank ranks[i] (1 = its stream's first). Three
-- statements: the counters (bumped by counts, in the order given, which must be bytewise),
-- the events (checked row by row as publish_many's quick check does, plus the run
-- bookkeeping; any row left out raises), one notification per run. Not safe to expose as
-- it is: it lacks the checks counts[k] >= 1 and sum(counts) = cardinality(messages), and
-- raises a bare error instead of publish_many's precise ones.
CREATE OR REPLACE FUNCTION pgsse.publish_runs(messages pgsse.message[], firsts integer[], counts integer[], runs integer[], ranks integer[])
RETURNS bigint[] LANGUAGE plpgsql AS $fn$
DECLARE
    v_time  bigint := floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
    v_max   bigint := pgsse.max_event_bytes();
    v_heads bigint[];
    v_rows  bigint;
BEGIN
    WITH h AS (
        INSERT INTO pgsse.streams AS s (stream, head)
        SELECT (messages[r.first]).stream, r.n FROM ROWS FROM (unnest(firsts), unnest(counts)) AS r(first, n)
        ON CONFLICT ON CONSTRAINT streams_pkey DO UPDATE SET head = s.head + excluded.head
        RETURNING s.head
    ) SELECT array_agg(h.head) INTO v_heads FROM h;
    INSERT INTO pgsse.events (stream, id, event, data, audience)
    SELECT u.stream, v_heads[u.run] - counts[u.run] + u.rank, u.event, u.data,
           CASE WHEN cardinality(u.audience) > 0 THEN u.audience END
    FROM ROWS FROM (unnest(messages), unnest(runs), unnest(ranks)) WITH ORDINALITY
            AS u(stream, data, event, audience, ephemeral, run, rank, ord)
    WHERE (u.data IS NOT NULL AND u.ephemeral IS NOT TRUE AND octet_length(u.data) <= v_max
           AND (u.audience IS NULL OR pgsse.valid_audience(u.audience))
           AND pgsse.valid_names(u.stream, u.event)
           AND u.rank BETWEEN 1 AND counts[u.run]
           AND (messages[firsts[u.run]]).stream = u.stream
           AND (u.rank = 1) = (firsts[u.run] = u.ord)) IS TRUE;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    IF v_rows <> cardinality(messages) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'pgsse.publish_runs: bad';
    END IF;
    PERFORM pg_notify('pgsse', CASE
               WHEN r.n = 1 AND octet_length(m.data) + octet_length(pgsse.payload_header('D', v_time, m.stream, r.head, m.event, CASE WHEN cardinality(m.audience) > 0 THEN pgsse.payload_tags(m.audience) ELSE ' 0' END)) <= 7999 THEN
                   pgsse.payload_header('D', v_time, m.stream, r.head, m.event, CASE WHEN cardinality(m.audience) > 0 THEN pgsse.payload_tags(m.audience) ELSE ' 0' END) || m.data
               ELSE pgsse.payload_header('W', v_time, m.stream, r.head - r.n + 1, NULL, ' 0')
           END)
    FROM ROWS FROM (unnest(firsts), unnest(counts), unnest(v_heads)) AS r(first, n, head),
         LATERAL (SELECT (messages[r.first]).stream, (messages[r.first]).data, (messages[r.first]).event, (messages[r.first]).audience) AS m(stream, data, event, audience);
    RETURN v_heads;
END
$fn$;
