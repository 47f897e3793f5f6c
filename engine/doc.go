// Package engine is pgsse's server: one gnet event loop that serves SSE clients
// (SPEC §3) and hub workers (SPEC §5), fed by one LISTEN session (pglisten) and a small
// pool of replay connections (store).
//
// Invariants (DESIGN.md):
//   - One owner: every connection, stream, channel and worker is touched only on the loop
//     goroutine. Other goroutines hand work over through taskQueue, a FIFO that gnet's
//     Execute merely wakes, so order is ours, not gnet's.
//   - Encode once, write many: a live event is encoded once (event.enc) and the same bytes
//     go to every subscriber; the events a connection is owed in one loop pass leave in one
//     write/writev.
//   - Nothing unbounded: a durable subscriber over durableHigh stops taking live writes and
//     is caught up from the table once it drains below durableLow; an ephemeral or channel
//     subscriber over ephemeralLimit is closed; rings, pending lists and queues are capped.
//   - No lost wake: a subscriber is registered before any history is read, the response
//     head goes out only once the subscription is live, and live vs replayed events are
//     deduplicated by id (per-connection cursor). After the LISTEN session comes back
//     every active stream is read from the table again.
//
// A durable stream keeps a small ring of its most recent events so that a connection
// that finished reading history close to the head joins the live set from memory rather
// than racing a fast publisher with more table reads.
package engine
