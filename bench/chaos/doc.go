// Package chaos is pgsse's randomized fault run with an exactly-once checker, and its soak
// (issue 24): `go run ./bench/cmd/chaos --duration D --seed S [--soak]`.
//
// A run starts a PostgreSQL of its own (scripts/pg.sh) and `pgsse serve --procs 2` on it, then
// a workload: durable subscribers of one stream or, when the server under test has them (SPEC §3c),
// several (steady, slow, flaky ones that drop their connection and resume with Last-Event-ID,
// ones whose tokens expire, churn that joins from cursor 0, a recent cursor or live), ephemeral
// and /channels/ subscribers, hub workers through pglisten (lossless and wake, a failover
// one, slow ones), SQL publishers (pgsse.publish in transactions, some rolled back, some with
// a pg_notify beside), HTTP publishers (POST /streams/…, POST /publish), broadcasters, a
// notifier, and a pruner. Faults land at moments drawn from the seed (faults.go: sessions
// terminated by kind, PostgreSQL restarted or crashed, processes killed, clients reset or
// stalled, tokens expiring, descriptors squeezed, connections flooded, SIGUSR2 handoffs once
// the server has them). Then it drains — faults stop, every subscriber must reach one last
// event per stream — and Check decides from the table and every client's log whether each
// guarantee held (checker.go says exactly what is checked).
//
// Every event is a pure function of its stream and key (data.go), so a receiver verifies each
// byte and the checker tells an event from another one with the same id.
//
// Invariant: a run leaves nothing behind — its PostgreSQL is stopped and removed, its pgsse
// processes die with it (parent-death signal) — and the same seed draws the same faults at
// the same moments and the same workload choices (the interleaving is the machine's).
package chaos
