// Package testkit holds what the tests of every pgsse package share, so that a rule about
// testing lives in one place. The root package has the small generic pieces; each
// sub-package one concern:
//
//	testkit        WaitFor (one polling helper, one argument order), SyncBuffer, FreePort,
//	               SocketPath, Tail
//	pgtest         PostgreSQL: the shared test cluster, a fresh (migrated) database per test,
//	               connections, queries, private clusters that tests restart
//	ssetest        the one SSE stream parser (Decoder: incremental, allocation-free, also what
//	               bench/ decodes with at load), Stream (events from a connection), and a
//	               resuming reader for failure tests
//	metricstest    the one Prometheus scraper (text format via expfmt, series selected by
//	               labels); its helpers fail the test on a missing series
//	servetest      the one subprocess harness: the pgsse binary built once per test binary,
//	               `pgsse serve` on free ports, ready on a signal, stopped with SIGTERM, its
//	               log shown when the test fails
//
// Invariant: nothing here is a mock of PostgreSQL or of pgsse — the kit starts, reads and
// checks the real things — and a helper that looks something up fails the test when it is
// not there, rather than answering zero (a test must be able to fail).
package testkit
