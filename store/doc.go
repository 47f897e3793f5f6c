// Package store owns pgsse's durable store in PostgreSQL: the schema and its
// migrations, the SQL functions pgsse.publish, pgsse.broadcast and pgsse.prune, the
// NOTIFY payload format on channel "pgsse" (ParsePayload, AppendPayload), the replay
// reader (Replayer) and the retention job (RunRetention).
//
// Invariant (DESIGN §5): durable ids of a stream are assigned in commit order, with no
// gap left by rolled-back publishes, so a reader whose cursor only moves forward never
// skips an event that commits late. pgsse.publish takes the next number from the
// stream's row in pgsse.streams with INSERT … ON CONFLICT DO UPDATE SET head = head+1;
// the row stays locked until the transaction ends, so a second publisher to the same
// stream waits for the first to commit (or roll back, returning the number) and
// publishers to different streams never wait on each other.
//
// # Schema (version 1)
//
//	pgsse.schema_version(version integer PRIMARY KEY, applied_at timestamptz)
//	    one row per applied migration
//	pgsse.streams(stream text PRIMARY KEY, head bigint NOT NULL)
//	    head = the last id handed out for the stream (committed)
//	pgsse.events(stream text, id bigint, event text, data text NOT NULL,
//	             audience text[], created_at timestamptz NOT NULL DEFAULT now(),
//	             PRIMARY KEY (stream, id))
//	    event NULL = "message"; audience NULL = everyone; index on created_at for prune
//	pgsse.broadcast_nonce  sequence (CYCLE) of nonces for ephemeral payloads
//
//	pgsse.publish(stream text, data text, event text DEFAULT NULL, audience text[] DEFAULT NULL) RETURNS bigint
//	pgsse.broadcast(stream text, data text, event text DEFAULT NULL, audience text[] DEFAULT NULL) RETURNS void
//	pgsse.prune(older_than interval, keep_last integer DEFAULT 0) RETURNS bigint
//	pgsse.replay(...)          one batch for the replay reader (internal)
//	pgsse.check_args(...), pgsse.encode_payload(...)   helpers (internal)
//
// Argument rules, each raising SQLSTATE 22023 with the rule as the message:
// stream 1–200 bytes of A-Z a-z 0-9 . _ : @ / = + ~ -; event NULL or 1–64 bytes of
// A-Z a-z 0-9 . _ : -; data not NULL; audience NULL or a one-dimensional array of at
// most 64 tags, each non-NULL, 1–200 bytes, without control characters (0x01–0x1F,
// 0x7F). An empty audience is stored as NULL (everyone). pgsse.prune deletes, per
// stream, only the oldest run of events that are all older than older_than, never
// the newest keep_last ids, so the retained ids of a stream stay contiguous.
// Migrations run under pg_advisory_lock(123589620884737) (0x706773736501), each in
// one transaction; MigrationSQL is the same as a psql script.
//
// # NOTIFY payload, format version 1
//
// Every pgsse.publish and pgsse.broadcast sends one notification on channel "pgsse"
// (delivered at commit, in commit order). Its payload, in bytes (SP = 0x20, LF = 0x0A;
// numbers are ASCII decimal without sign or leading zeros):
//
//	payload = kind "1" SP time SP stream SP id SP event SP ntags *(SP len ":" tag) LF data
//	kind    = "D"              durable event, data inline
//	        / "W"              durable event too large for NOTIFY: wake-only, read
//	                           (stream, id) from pgsse.events
//	        / "E"              ephemeral (pgsse.broadcast), not stored
//	time    = 1*16DIGIT        clock_timestamp() at publish, µs since the Unix epoch
//	stream  = 1*200 stream-char             A-Z a-z 0-9 . _ : @ / = + ~ -
//	id      = 1*19DIGIT        1 … 2^63-1. D/W: the event id. E: a nonce that keeps
//	                           PostgreSQL from folding identical broadcasts made in one
//	                           transaction; consumers ignore it
//	event   = 0*64 event-char  A-Z a-z 0-9 . _ : -   (empty = "message")
//	ntags   = 1*3DIGIT         number of audience tags, 0 … 64; 0 = everyone
//	len     = 1*3DIGIT         byte length of the tag that follows, 1 … 200
//	tag     = len octets, none of them 0x00–0x1F or 0x7F
//	data    = every byte after the header's LF, up to the end (UTF-8 text, may hold LF)
//
// Example: "D1 1764584040123456 orders/42 7 created 1 6:user:7\n{\"total\":3}".
// PostgreSQL accepts payloads of at most 7999 bytes. A durable event whose D payload
// would be longer travels as exactly "W1 <time> <stream> <id>  0\n" (empty event, no
// tags, no data); pgsse.broadcast raises 22023 instead. A consumer must reject
// (never guess at) anything else: another kind or version, a number out of range or
// with a leading zero, an invalid stream or event name, a tag count or length that
// does not match the bytes, a W payload with event, tags or data.
package store
