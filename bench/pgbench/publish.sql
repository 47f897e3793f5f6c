-- pgsse.publish to one of 1,000 streams: one statement, its own transaction.
\set s random(1, 1000)
SELECT pgsse.publish('bench/' || :s, '{"n":1}');
