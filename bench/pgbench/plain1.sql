-- A harsher baseline: the three statements as one statement (one round trip, like
-- SELECT pgsse.publish), with data-modifying CTEs.
\set s random(1, 1000)
WITH c AS (INSERT INTO pgsse.streams AS s (stream, head) VALUES ('bench/' || :s, 1) ON CONFLICT (stream) DO UPDATE SET head = s.head + 1 RETURNING s.head AS head), i AS (INSERT INTO pgsse.events (stream, id, event, data, audience) SELECT 'bench/' || :s, head, NULL, '{"n":1}', NULL FROM c RETURNING id) SELECT pg_notify('pgsse', 'D1 ' || floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint || ' bench/' || :s || ' ' || id || E'  0\n' || '{"n":1}') FROM i;
