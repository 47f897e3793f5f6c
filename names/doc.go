// Package names is the one place that validates pgsse's stream names, event
// names, PostgreSQL channel names and replay cursors (SPEC §2, §3, §5).
//
// Every check is generic over string and []byte so callers never convert,
// and none allocates. Each rule has its own sentinel error whose message
// names the rule; those messages reach HTTP 400 bodies and SQL error text
// verbatim, so they are part of the contract.
package names
