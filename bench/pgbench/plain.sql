-- The same three statements pgsse.publish runs (counter upsert, insert, pg_notify with
-- the same payload), issued as plain SQL in one transaction: issue 13's baseline.
\set s random(1, 1000)
BEGIN;
INSERT INTO pgsse.streams AS s (stream, head) VALUES ('bench/' || :s, 1)
    ON CONFLICT (stream) DO UPDATE SET head = s.head + 1 RETURNING s.head AS head \gset
INSERT INTO pgsse.events (stream, id, event, data, audience) VALUES ('bench/' || :s, :head, NULL, '{"n":1}', NULL);
SELECT pg_notify('pgsse', 'D1 ' || floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint || ' bench/' || :s || ' ' || :head || E'  0\n' || '{"n":1}');
END;
