// Package engine is pgsse's server: one gnet event loop that serves SSE clients
// (docs/http.md), HTTP publishers (docs/http.md) and hub workers (docs/hub-protocol.md), fed by
// one LISTEN session (pglisten) and a small pool of replay connections (store); publish requests
// go to store's group-commit Publisher.
//
// The parts, one file (or two) each:
//
//	config.go            Config, every default and bound, the descriptor budget (Config.FDBudget)
//	server.go            Server: New, Run, drain, the probes (/healthz, /readyz)
//	accept.go            accepting connections: one acceptor per listener hands them to the loop
//	                     (a bounded number in flight), EMFILE/ENFILE contained; the admin listener's cap
//	loop.go              the task queue, enter/leave around every loop entry, the ticker
//	handler.go           the gnet callbacks, dispatching by connection kind
//	request.go           HTTP request heads on the SSE port: routing, authorisation, CORS
//	sseconn.go           the connection state machine of the SSE port (subscribers and publishers):
//	                     states, transitions, time rules, writes
//	publish.go           POST /streams/{stream} and POST /publish: bodies, grants, the Publisher
//	verify.go            checkToken: token checks off the loop (auth.Pool), answers as loop tasks
//	admission.go         who becomes a subscriber and when: the admission FIFO (a bounded amount per
//	                     round between deliveries), capacity, draining, per-subject caps
//	streams.go           durable and ephemeral streams: fan-out, catch-up, lagging, gaps
//	channels.go          raw channels: one LISTEN per channel, shared by SSE clients and workers
//	hubserver.go, hubsocket.go the hub (its own type) and its socket file
//	listen.go            the LISTEN source (pglisten.Session behind a narrow interface) and its events
//	siblingsource.go         a sibling process's LISTEN source (--procs): the first process's hub, with failover
//	schema.go            the schema-version poller (/readyz)
//	metrics.go           the Prometheus series, label values bound once
//	outbound.go          the write path: one writev per connection, the queues of what sockets
//	                     did not take (shared bytes by reference), their writable callback
//	budget.go            --max-outbound-memory: the limits that shrink with the queued total,
//	                     large events held at most maxLargeEvents at once, Go's memory limit
//
// Invariants (docs/architecture.md):
//   - One owner: every connection, stream, channel and worker is touched only on the loop
//     goroutine. Other goroutines hand work over through taskQueue, a FIFO that gnet's
//     Execute merely wakes, so order is ours, not gnet's.
//   - Encode once, write many: a live event is encoded once (event.enc) and the same bytes
//     go to every subscriber — and to every queue of what a socket did not take; the events a
//     connection is owed in one loop pass leave in one writev (sseConn.write, writeEvents,
//     writeLive, writev: the only writes to an SSE client).
//   - Nothing unbounded: the bytes queued for SSE clients count against --max-outbound-memory
//     and the per-connection limits shrink as they fill (budget.go): a live durable subscriber
//     over its high watermark stops taking live writes (lagging) and is caught up from the
//     ring or the table once it drains below the low one; an ephemeral or channel subscriber
//     over its limit is closed; a hub worker's ring follows docs/hub-protocol.md; rings, pending
//     lists, notification batches waiting for the loop and large events held are capped.
//   - No lost wake: a subscriber is registered before any history is read, the response
//     head goes out only once the subscription is live (sseconn.go: respond), and live vs
//     replayed events are deduplicated by id (per-connection cursor). After the LISTEN
//     session comes back every active stream is read from the table again.
//
// A durable stream keeps a small ring of its most recent events so that a connection
// that finished reading history close to the head joins the live set from memory rather
// than racing a fast publisher with more table reads.
package engine
