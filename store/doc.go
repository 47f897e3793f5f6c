// Package store owns pgsse's durable store in PostgreSQL: the schema and its
// migrations, the SQL functions pgsse.publish, pgsse.publish_many, pgsse.broadcast,
// pgsse.prune and pgsse.presence, the NOTIFY payload format on channel "pgsse"
// (ParsePayload, AppendPayload), publishing from Go with group commit (Publisher,
// ParseBatch for NDJSON batches), the replay reader (Replayer), the retention job
// (RunRetention) and presence (SPEC §3d): each process's writer (Presence), its reads
// (ReadPresence, ReadPresenceSeqs, ReadPresenceProcesses) and a consumer's view of one
// stream (PresenceView).
//
// Invariant (docs/architecture.md, invariant 5): durable ids of a stream are assigned in commit
// order, with no gap left by rolled-back publishes, so a reader whose cursor only moves forward
// never skips an event that commits late. pgsse.publish takes the next number from the stream's
// row in pgsse.streams with INSERT … ON CONFLICT DO UPDATE SET head = head+1; the row stays
// locked until the transaction ends, so a second publisher to the same stream waits for the first
// to commit (or roll back, returning the number) and publishers to different streams never wait
// on each other.
//
// # Schema (version 3)
//
//	pgsse.schema_version(version integer PRIMARY KEY, applied_at timestamptz)
//	    one row per applied migration
//	pgsse.streams(stream text PRIMARY KEY, head bigint NOT NULL)
//	    head = the last id handed out for the stream (committed)
//	pgsse.events(stream text, id bigint, event text, data text NOT NULL,
//	             audience text[], created_at timestamptz NOT NULL DEFAULT now(),
//	             PRIMARY KEY (stream, id))
//	    event NULL = "message"; audience NULL = everyone; no index but the primary key
//	UNLOGGED pgsse.pruned_streams(stream text PRIMARY KEY, next_id bigint)
//	    streams pgsse.prune left without events, and the id of each one's next event
//	pgsse.broadcast_nonce  sequence (CYCLE) of nonces for ephemeral payloads
//	pgsse.message          type (stream text, data text, event text, audience text[], ephemeral boolean)
//
//	pgsse.publish(stream text, data text, event text DEFAULT NULL, audience text[] DEFAULT NULL) RETURNS bigint
//	pgsse.broadcast(stream text, data text, event text DEFAULT NULL, audience text[] DEFAULT NULL) RETURNS void
//	pgsse.publish_many(messages pgsse.message[]) RETURNS bigint[]
//	pgsse.message(stream text, data text, event text DEFAULT NULL, audience text[] DEFAULT NULL,
//	              ephemeral boolean DEFAULT false) RETURNS pgsse.message
//	pgsse.prune(older_than interval, keep_last integer DEFAULT 0) RETURNS bigint
//	pgsse.max_event_bytes() RETURNS bigint   the durable size limit as this session sees it
//	pgsse.replay(...)          one batch for the replay reader (internal)
//	pgsse.check_args, check_publish, valid_names, valid_audience, payload_header,
//	payload_tags, event_too_large, bad_max_event_bytes     helpers (internal)
//
//	UNLOGGED pgsse.presence_processes(incarnation bigint PRIMARY KEY, process text UNIQUE,
//	             interval_ms integer, started_at, renewed_at, expires_at timestamptz)
//	    one row per registered pgsse process: its key, this registration's random
//	    number, and its lease
//	UNLOGGED pgsse.presence_entries(stream text, sub text, incarnation bigint,
//	             connections integer, since timestamptz, PRIMARY KEY (stream, sub, incarnation))
//	    one row per (stream, subject, process); sub '' = the process's anonymous connections
//	UNLOGGED pgsse.presence_streams(stream text PRIMARY KEY, seq bigint)
//	    one row per stream with entries: the number of its last change, and its lock
//	pgsse.presence_seq   sequence of change numbers (logged: numbers only grow)
//
//	pgsse.presence(stream text) RETURNS TABLE(sub text, connections integer, since timestamptz)
//	pgsse.presence_flush(process, incarnation, interval_ms, lease_ms, mode, streams[], subs[], counts[])
//	    one process's write for one interval (internal; Presence.Flush)
//
// Version 3 (issue 21) added presence and made event names starting with "pgsse:"
// reserved: pgsse.publish, pgsse.broadcast and pgsse.publish_many raise 22023 "event names
// starting with pgsse: are reserved" (pgsse:gap and pgsse:presence are pgsse's own).
// It also dropped pgsse.events' index on created_at (issue 20), which cost every durable
// event a second index entry (about half the buffers and a third of the WAL records of a
// publish) for pgsse.prune alone: pgsse.prune now probes each stream's oldest event on the
// primary key instead, passing over the streams it left without events
// (pgsse.pruned_streams) until they are published to again.
//
// Version 2 (issues 11 and 13) added pgsse.message, pgsse.publish_many and
// pgsse.max_event_bytes, made pgsse.publish cheaper (one expression checks the common
// case; the payload is built by the inlined payload_header instead of the SQL function
// encode_payload, which PostgreSQL parsed and planned on every call, and which is gone)
// and made pgsse.prune's work linear in the old events; signatures, results, messages and
// SQLSTATEs of the version 1 functions are unchanged.
//
// Argument rules, each raising SQLSTATE 22023 with the rule as the message:
// stream 1–200 bytes of A-Z a-z 0-9 . _ : @ / = + ~ -; event NULL or 1–64 bytes of
// A-Z a-z 0-9 . _ : -, not starting with "pgsse:"; data not NULL; audience NULL or a
// one-dimensional array of at most 64 tags, each non-NULL, 1–200 bytes, without control
// characters (0x01–0x1F, 0x7F); then, for durable events, data at most pgsse.max_event_bytes bytes. An empty
// audience is stored as NULL (everyone). pgsse.prune deletes, per stream, only the
// oldest run of events that are all older than older_than, never the newest keep_last
// ids, so the retained ids of a stream stay contiguous; it probes each stream's oldest
// event on the (stream, id) key, finds the cut on the same key and deletes it as one key
// range, so its work grows with the streams holding events and with the old events
// (200,000 in one stream: 1.5 s on a busy 2-core VM), not with their square as in
// version 1.
// Migrations run under pg_advisory_lock(123589620884737) (0x706773736501), each in
// one transaction; MigrationSQL is the same as a psql script.
//
// # Presence
//
// A Presence writer per process is given, once per interval, the counts that changed
// (absolute, so a retried write changes nothing twice) and runs one statement,
// pgsse.presence_flush, whatever their number: it reaps every process whose lease lapsed
// (the lease lasts PresenceLeaseIntervals intervals from the end of a write and is never
// renewed once lapsed), on its first write removes every earlier incarnation of its key,
// writes its changes, renews its lease and, for each stream whose subjects joined or left
// or whose anonymous count moved, takes the next change number and NOTIFYs a P payload.
// Joins and leaves are global: the stream's presence_streams row is locked (in name order)
// before they are decided, so concurrent writers of one stream are serialised and every
// process sees one chain of changes per stream. A write that finds its own row gone
// (reaped while it was too slow, or PostgreSQL emptied the unlogged tables after a crash
// or a failover) registers again with its whole state under a new incarnation: a second
// statement, never more. A write that finds another incarnation holding its key
// (a restart elsewhere, a handoff, two processes configured alike) stops for good
// (ErrPresenceSuperseded).
//
// pgsse.presence counts only processes whose lease is live; ReadPresence counts every
// registered one, as the notifications do, so a consumer that starts from ReadPresence and
// applies P payloads is exact; the two differ only between a lease's lapse and the next
// survivor's write (at most an interval).
//
// # Durable event size: pgsse.max_event_bytes
//
// pgsse.publish, pgsse.publish_many and the Publisher refuse durable data of more than
// pgsse.max_event_bytes bytes (data of exactly the limit is accepted) with SQLSTATE 22023
// and the message "event data is <n> bytes, over pgsse.max_event_bytes (<limit> bytes)".
// The limit is a PostgreSQL setting as the publishing session sees it, e.g.
// ALTER DATABASE app SET pgsse.max_event_bytes = 4194304 (new sessions see it), a whole
// number of bytes (1–18 digits); unset or empty means 1048576; anything else makes every
// durable publish fail with 22023 naming the setting. The size is checked before
// anything is written or encoded, so a 300 MB argument is refused at once.
//
// # pgsse.publish_many
//
//	SELECT pgsse.publish_many(ARRAY[
//	    pgsse.message('orders/42', '{"total":3}', 'created'),
//	    pgsse.message('orders/43', 'x', NULL, ARRAY['user:7']),
//	    pgsse.message('chat/1', 'typing', 'typing', NULL, true)]);   -- {18,5,NULL}
//
//	SELECT pgsse.publish_many(array_agg(pgsse.message('orders/' || o.id, row_to_json(o)::text) ORDER BY o.id))
//	FROM new_orders o;
//
// publishes every message in one statement, set-based, inside the caller's transaction,
// and returns their ids in array order (NULL for ephemeral messages); a NULL array
// returns NULL, an empty one '{}'. Durable messages behave as pgsse.publish, ephemeral
// ones (ephemeral = true; NULL means false) as pgsse.broadcast. Every message is checked
// first; the first bad one (in array order) raises the error pgsse.publish or
// pgsse.broadcast would, with DETAIL "messages[<n>]: …" (1-based), and nothing is written
// or notified. The ids of one stream's durable messages are contiguous and in array
// order, and follow commit order as pgsse.publish's do: each stream's counter row is
// locked until the transaction ends, rows locked in stream-name order (bytewise) so two
// publish_many calls never deadlock each other. Notifications, in array order of each
// stream's first durable message and of each ephemeral message: per stream with durable
// messages exactly one, a D payload when the call stored one event there and it fits,
// else a W payload naming the first of the call's ids in that stream; per ephemeral
// message one E payload (raising 22023 if it would exceed 7999 bytes, as
// pgsse.broadcast does).
//
// # Publishing from Go: Publisher (group commit) and ParseBatch
//
// The engine (POST /streams, POST /publish) and `pgsse publish` submit PublishRequests
// to a Publisher: one event or an NDJSON batch (ParseBatch) of at most 1,000. Submit
// checks names, audience and size (against pgsse.max_event_bytes as the publishing
// session sees it: read on connect, re-read every 5 s, and the connection is renewed when
// ALTER DATABASE/ROLE … SET changes it, so Go and SQL agree; until the first connection
// has read it, the size is checked by the publisher goroutine) and queues the request within
// a count and byte budget; it never blocks. Each of the Publisher's connections
// (application_name pgsse-publish; one by default, which measured best on 2 cores) has
// its own queue, chosen by the stream of a request's first event, takes everything queued
// there whenever it is free and runs it as one implicit transaction, `SELECT
// txid_current(), m.ids, clock_timestamp() FROM pgsse.publish_many($1) AS m(ids)` with the messages in binary: one NOTIFY per
// stream per transaction, ids per stream in commit order (and, for one stream's
// requests, in submission order), each request contiguous per stream and all or nothing.
// The callbacks run after COMMIT. Data and tags that are not UTF-8 without
// NUL bytes are refused before the transaction. An ephemeral event is refused when its E
// payload could exceed 7999 bytes with the widest nonce (19 digits), so over HTTP the
// ephemeral limit is up to 18 bytes stricter than pgsse.broadcast's.
//
// When PostgreSQL is unavailable the request's error matches ErrUnavailable (503 with
// Retry-After) and nothing of it was published: a connection that fails before COMMIT
// aborts the transaction, and the group is retried once on a new connection before the
// error is given. A database whose pgsse schema is missing or older than SchemaVersion
// gives the same error, also matching ErrNotMigrated, whose text says to run pgsse migrate
// (not that PostgreSQL is unavailable). While no connection can be made, Submit refuses at once and everything
// queued fails; the connections are retried with backoff (0.1 s doubling to 5 s). A
// connection lost after COMMIT was sent is the one case whose outcome is not known at
// once: the statement's answer carried the transaction's xid, so the Publisher opens a new
// connection and asks txid_status(xid) — committed: the requests succeed with their ids;
// aborted: nothing was published (and the group is tried once more). After a PostgreSQL
// crash (or a replica's promotion) an xid of which nothing reached the WAL is handed out
// again, so "committed" is confirmed by the group's first durable event — stored under its
// id, by that xid (xmin), with the same data — and an xid "in the future" (none handed out
// since the restart) counts as aborted. Only if PostgreSQL cannot be reached within 3 s to ask
// do the requests get an UnavailableError with Unknown set (ErrOutcomeUnknown): their
// events may or may not have been published (all or nothing per request), and a
// subscriber resuming from Last-Event-ID sees which.
//
// # NOTIFY payload, format version 1
//
// Every pgsse.publish and pgsse.broadcast sends one notification on channel "pgsse";
// pgsse.publish_many sends one per stream and one per ephemeral message (delivered at
// commit, in commit order). Its payload, in bytes (SP = 0x20, LF = 0x0A; numbers are
// ASCII decimal without sign or leading zeros):
//
//	payload = kind "1" SP time SP stream SP id SP event SP ntags *(SP len ":" tag) LF data
//	        / presence
//	kind    = "D"              durable event, data inline
//	        / "W"              wake: durable events of stream from id on are in
//	                           pgsse.events (one event too large for NOTIFY, or the first
//	                           of several one pgsse.publish_many call stored in the
//	                           stream, with contiguous ids); read them from the table
//	        / "E"              ephemeral (pgsse.broadcast), not stored
//	time    = 1*16DIGIT        clock_timestamp() at publish, µs since the Unix epoch
//	stream  = 1*200 stream-char             A-Z a-z 0-9 . _ : @ / = + ~ -
//	id      = 1*19DIGIT        1 … 2^63-1. D: the event id. W: the first id to read.
//	                           E: a nonce that keeps PostgreSQL from folding identical
//	                           broadcasts made in one transaction; consumers ignore it
//	event   = 0*64 event-char  A-Z a-z 0-9 . _ : -   (empty = "message")
//	ntags   = 1*3DIGIT         number of audience tags, 0 … 64; 0 = everyone
//	len     = 1*3DIGIT         byte length of the tag that follows, 1 … 200
//	tag     = len octets of UTF-8, none of them 0x00–0x1F or 0x7F (names.CheckTag)
//	data    = every byte after the header's LF, up to the end (UTF-8 text, may hold LF)
//
// Example: "D1 1764584040123456 orders/42 7 created 1 6:user:7\n{\"total\":3}".
// PostgreSQL accepts payloads of at most 7999 bytes. A durable event whose D payload
// would be longer travels as exactly "W1 <time> <stream> <id>  0\n" (empty event, no
// tags, no data); pgsse.broadcast raises 22023 instead. A consumer that gets a W reads
// the stream from the table after the last id it has (the engine does); the events a W
// names commit together, so a consumer that has any of them has them all. A consumer must
// reject (never guess at) anything else: another kind or version, a number out of range
// or with a leading zero, an invalid stream or event name, a tag count or length that
// does not match the bytes, a W payload with event, tags or data, a P payload with
// anything after its LF.
//
// Presence changes (pgsse.presence_flush) are the fourth kind, not events:
//
//	presence = "P1" SP time SP stream SP seq SP prev SP part SP parts SP anonymous
//	           SP njoin SP nleave *(SP len ":" sub) LF
//	seq       = 1*19DIGIT      the change's number, 1 … 2^63-1 (growing per stream)
//	prev      = 1*19DIGIT      the number of the stream's change before it, < seq;
//	                           0 = the stream had nobody (its change chain starts again)
//	part      = 1*2DIGIT       1 … parts; a change longer than one payload is split
//	parts     = 1*2DIGIT       1 … 64 parts, sent one after the other in one transaction;
//	                           part 0 of 0: too large for 64 parts, no subjects listed:
//	                           read the stream (ReadPresence)
//	anonymous = 1*19DIGIT      the stream's anonymous connections after the change
//	njoin     = 1*4DIGIT       subjects that joined, listed first, then nleave that left
//	sub       = len octets of UTF-8, 1 … 200, none of them 0x00–0x1F or 0x7F
//
// Example: "P1 1764584040123456 room/1 17 12 1 1 3 1 1 6:user:9 6:user:7\n" (user:9
// joined, user:7 left, 3 anonymous). Nothing follows the LF. A consumer applies a change
// on top of the one numbered prev; anything else (a gap, a part out of order, part 0)
// means reading the stream again (PresenceView does this bookkeeping).
package store
