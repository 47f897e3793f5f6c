// Package store owns pgsse's durable store in PostgreSQL: the schema and its
// migrations, the SQL functions pgsse.publish, pgsse.broadcast and pgsse.prune, the
// NOTIFY payload format on channel "pgsse", the replay reader and the retention job.
//
// Invariant (DESIGN §5): durable ids of a stream are assigned in commit order, with no
// gap left by rolled-back publishes, so a reader whose cursor only moves forward never
// skips an event that commits late.
package store
