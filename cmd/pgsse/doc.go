// Command pgsse serves PostgreSQL notifications as Server-Sent Events and to local
// worker processes over one LISTEN session (docs/operations.md, docs/scaling.md).
//
// This package owns the command line: subcommands, flags with their PGSSE_* variables
// (flags win), the database source (--database-url, DATABASE_URL, libpq variables),
// signals, the admin HTTP server (docs/operations.md, Health, metrics and logs; at
// --admin-max-connections a new connection closes the idlest, adminconns.go), the supervision
// of --procs siblings and the sum of their metrics (procs.go, procsmetrics.go) and the wiring of
// engine.Config. It holds no business logic.
//
// Invariant: every bad configuration is found before anything starts and reported as
// exactly one line on stderr naming the flag or variable and the problem, exit status 2;
// runtime failures exit 1; a graceful stop exits 0.
package main
