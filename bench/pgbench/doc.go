// Package pgbench measures pgsse.publish against the same work issued as plain SQL, with
// PostgreSQL's pgbench (issue 13: "pgsse.publish per call within 1.3× of the same three
// statements issued as plain SQL in one transaction, pgbench -c1 -M prepared, same run").
//
//	scripts/pg.sh with go test -run '^$' -bench . ./bench/pgbench/
//
// The scripts: publish.sql (SELECT pgsse.publish), plain.sql (BEGIN; counter upsert;
// insert; pg_notify; END — the baseline the issue names) and plain1.sql (the three as one
// statement with data-modifying CTEs: one round trip, a harsher baseline). Each runs
// `pgbench -n -c1 -M prepared -T <s>` in interleaved rounds on one fresh database, and
// the benchmark reports each script's median latency and the ratios publish/plain and
// publish/plain1. On a shared machine only the ratios mean something.
package pgbench
