// Package engine is pgsse's server: one gnet event loop that serves SSE clients
// (docs/http.md), HTTP publishers (docs/http.md) and hub workers (docs/hub-protocol.md), fed by
// one LISTEN session (pglisten) and a small pool of replay connections (store); publish requests
// go to store's group-commit Publisher.
//
// The loop's state lives in parts (docs/architecture.md, The engine in parts): each a type that
// owns its fields, in its own files, reaching the other parts only through their methods, and
// all of them reading the loop's environment (loopEnv: configuration, log, metrics, clock, task
// queue, replay pool). parts_test.go checks it — no type has more than 40 methods, a part's
// fields are selected only in its own files (unless the table there lends one), each state is
// assigned by its one helper, no SSE bytes are made outside the SSE transport.
//
//	part            files                        owns
//	Server          server.go                    New, Run, drain, the probes (/healthz, /readyz), AddSibling
//	                handler.go                   the gnet callbacks, dispatching by connection kind
//	                loop.go                      loopEnv, the task queue, enter/leave around every loop entry, the tick
//	                accept.go                    accepting connections: one acceptor per listener hands them to the
//	                                             loop (a bounded number in flight), EMFILE/ENFILE contained; the admin cap
//	                schema.go                    the schema-version poller (/readyz)
//	                config.go                    Config, every default and bound, the descriptor budget (Config.FDBudget)
//	                metrics.go                   the Prometheus series, label values bound once
//	                hubsocket.go                 the hub's socket file (mode, stale files)
//	                handoff.go                   SIGUSR2 (docs/operations.md, Upgrading without disconnects): listeners,
//	                                             SSE connections and hub workers handed to a successor (HandOver) and
//	                                             taken back onto its loop through Register (Adopt)
//	connTable       sseconn.go                   the SSE port's connections and their state machine (subscribers and
//	                                             publishers): states, transitions, time rules, writes
//	requests        request.go                   HTTP request heads on the SSE port: routing, a subscription's checks
//	                                             (names, cursor, CORS, token) up to admission
//	tokens          verify.go                    token checks off the loop (auth.Pool), answers as loop tasks
//	admission       admission.go                 who becomes a subscriber and when: the admission FIFO (a bounded amount
//	                                             per round between deliveries), capacity, draining, per-subject caps
//	publishing      publish.go                   POST /streams/{stream} and POST /publish: bodies, grants, the Publisher
//	subscriptions   subscription.go, catchup.go  what a connection follows: each subscription's stream or channel,
//	                                             cursor, audience view and state (starting, catch-up, live, lagging);
//	                                             what it takes of each loop pass; its catch-up reads, gaps and lag;
//	                                             several streams on one connection (subSet: composite ids, one
//	                                             write per pass in arrival order, one table read at a time)
//	fanout          fanout.go, rewinds.go        the live side of streams and channels: events encoded once, the
//	                                             stream's ring, stream-level table reads, one flush per loop entry;
//	                                             the rewinds the host's processes found (told between --procs)
//	channelTable    channels.go                  raw channels: one LISTEN per channel, shared by SSE subscriptions and workers;
//	                                             the session's channels shared out between the two sides (channelShares)
//	listenState     listen.go                    the LISTEN source (pglisten.Session behind a narrow interface), up/down,
//	                                             routing its notifications, held in order while the hub stalls (sessionGate)
//	siblingSource   siblingsource.go             a --procs sibling's LISTEN source: the first process's hub, with failover
//	hubServer       hubserver.go                 the hub server: workers, their subscriptions and rings, written straight
//	                                             to their sockets as they fill; eviction and stalls
//	presenceTable   presence.go                  presence (docs/http.md, Presence): local counts per (stream, subject) as
//	                                             connections open and close, the views fed by P notifications, the
//	                                             pgsse:presence events (one per stream and interval, shared), GET /presence
//	                presencewriter.go            its writer: a goroutine with its own PostgreSQL connection that writes the
//	                                             changed counts once per interval (store.Presence) and answers reads
//	outbound        outbound.go                  the write path: one writev per connection, the queues of what sockets
//	                                             did not take (shared bytes by reference), their writable callback
//	                budget.go                    --max-outbound-memory: the limits that shrink with the queued total,
//	                                             large events held at most maxLargeEvents at once, Go's memory limit
//	                writable_linux.go            the writability set (epoll); writable_other.go without it
//	stageClock      stages.go                    pgsse_publish_stage_seconds: the publish path's stages, from the
//	                                             loop's readings and the Publisher's (store.PublishTimes)
//	transport       transport.go                 the seam: how an event, a gap, a heartbeat, a shed, a retry and a
//	                                             response head become bytes
//	                transport_sse.go             SSE, its one implementation, and the port's HTTP answers: the only
//	                                             file that calls sse.Append*
//
// Each part's tests sit beside it: sseconn_test.go and sse_*_test.go (the connection, over real
// sockets), admission_test.go (admission, tokens), publish_*_test.go, subscription_test.go,
// sse_gap_lagging_test.go and sse_multistream_test.go (subscriptions), fanout_*_test.go, stages_test.go, channels_test.go,
// siblingsource_test.go, hubserver_*_test.go, outbound_*_test.go, transport_sse_test.go,
// accept_test.go, config_test.go; parts_test.go keeps the parts apart.
//
// Invariants (docs/architecture.md):
//   - One owner: every connection, subscription, stream, channel and worker is touched only on
//     the loop goroutine. Other goroutines hand work over through taskQueue, a FIFO that gnet's
//     Execute merely wakes, so order is ours, not gnet's.
//   - Encode once, write many: a live event is encoded once (event.enc, by the transport) and
//     the same bytes go to every subscription — and to every queue of what a socket did not
//     take; the events a connection is owed in one loop pass leave in one writev
//     (connTable.write, writeEvents, writeLive, writev: the only writes to an SSE client). A
//     connection that needs bytes of its own in front of a shared encoding (an id line) leads
//     it in the same writev (outbound.go: leadItem), without copying the shared bytes.
//   - Nothing unbounded: the bytes queued for SSE clients count against --max-outbound-memory
//     and the per-connection limits shrink as they fill (budget.go): a live durable subscription
//     whose connection is over its high watermark stops taking live writes (lagging) and is
//     caught up from the ring or the table once the queue drains below the low one; an ephemeral
//     or channel subscriber over its limit is closed; a hub worker's ring follows
//     docs/hub-protocol.md; rings, pending lists, notification batches waiting for the loop and
//     large events held are capped; the kernel's send buffer of each SSE socket is fixed
//     (Config.SSESendBuffer), and a client evicted for not reading is reset with what it did
//     not read.
//   - No lost wake: a subscription is registered before any history is read, the response
//     head goes out only once every subscription of the connection has started
//     (subscriptions.started), and live vs replayed events are deduplicated by id (the
//     subscription's cursor). After the LISTEN session comes back every active stream is read
//     from the table again.
//
// A durable stream keeps a small ring of its most recent events so that a subscription that
// finished reading history close to the head joins the live set from memory rather than
// racing a fast publisher with more table reads.
package engine
