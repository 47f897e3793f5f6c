// Package pglisten owns the one PostgreSQL LISTEN session of a host (Session) and the
// worker-facing Listener interface with three implementations: NewDirect (its own
// session), NewHub (the worker-side hub client, hubclient.go, over pgsse's hub socket) and
// NewFailover (hub first, then direct).
//
// A Session connects with pgconn (DSN or libpq environment, application_name forced to
// pgsse-listen, TCP keepalive 5 s), then hijacks the socket and speaks the protocol itself:
// simple Query messages for LISTEN/UNLISTEN with the identifier double-quoted (a `"` doubled,
// nothing else from outside ever spliced), pipelined, matched to a FIFO of commands by their
// CommandComplete/ErrorResponse + ReadyForQuery. Backend messages are framed by ParseBackend
// and decoded by ParseNotification (views, no allocation; fuzzed in fuzz/pgproto_fuzz_test.go).
//
// Which path runs when: always the same one. gnet could enrol a plain TCP or Unix socket in its
// loop but not a *tls.Conn (sslmode=require), so every connection — Unix, TCP and TLS alike —
// has one reader goroutine that reads straight into a pooled Batch buffer (a message split
// across reads is the only thing copied) and one writer goroutine that sends what the session
// queued, with a write deadline. The reader hands batches to the session goroutine, which owns
// all channel state and calls Events and done callbacks — from that one goroutine, in protocol
// order, never concurrently. Callers' goroutines never do I/O.
//
// Invariants: a Listen's done(nil) is reported only once PostgreSQL answered a LISTEN for that
// channel on the current connection (docs/hub-protocol.md, Conversation: ACK after LISTEN;
// docs/architecture.md, invariant 4); after any loss the session reconnects with capped, jittered
// exponential backoff, re-LISTENs every channel with a live reference, and only then reports
// Resynced. Liveness: an empty query is sent after PingInterval without input; no answer within
// PingTimeout ends the session. Nothing grows without bound: messages over MaxMessage end the
// session, channels are capped by MaxChannels, a Direct listener's event queue by EventBuffer
// (overflow drops notifications and delivers one KindResync instead).
package pglisten
