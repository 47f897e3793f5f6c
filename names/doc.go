// Package names is the one place that validates pgsse's stream names, event
// names, PostgreSQL channel names, audience tags, grant patterns and replay
// cursors, one stream's and the composite one of several streams on one
// connection (ParseCompositeCursor) (docs/sql.md, docs/http.md,
// docs/hub-protocol.md).
//
// Every check is generic over string and []byte so callers never convert,
// and none allocates. Each rule has its own sentinel error whose message
// names the rule; those messages reach HTTP 400 bodies, token errors and SQL
// error text verbatim, so they are part of the contract.
//
// Invariants: a cursor is decimal digits and nothing else (no sign, no
// whitespace — callers pass the client's bytes untrimmed); a tag is what
// SQL's pgsse.check_args accepts, so nothing a token carries can make a
// replay query fail; a name a client subscribes to (CheckChannelUTF8) is
// one PostgreSQL can LISTEN on; a grant pattern's non-star part obeys the
// rule of the names it grants; an event name a publisher may use does not
// start with the reserved "pgsse:" (CheckEvent), while what the database
// already holds is read by the syntax alone (CheckEventSyntax).
package names
