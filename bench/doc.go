// Package bench is pgsse's load harness (issue 7): it starts a server under test — `pgsse
// serve` or the baseline in bench/baseline — as a subprocess against a fresh database, opens
// SSE subscribers over several loopback source addresses on a few epoll loops (Client),
// publishes with pgsse.publish (Publisher), and reads the server's RSS and CPU time from
// /proc. The scenarios (Idle, Latency, FanOut, Throughput; the hub comes separately) return
// Results that WriteTable prints side by side with the ratio pgsse/baseline.
//
// Used by `go run ./bench/cmd/load` (full scale, RESULTS.md) and by the benchmarks in this
// package (`go test -run '^$' -bench . ./bench/`, small scale; PGSSE_BENCH_FULL=1 for full).
// Invariant: every process and database a scenario starts is stopped or dropped before it
// returns (and servers get SIGKILL if this process dies).
package bench
