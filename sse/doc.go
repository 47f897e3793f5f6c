// Package sse owns pgsse's HTTP/1.1 and Server-Sent Events wire format for
// the stream endpoints (SPEC §3): encoding SSE events, comments, retry and
// gap notices; parsing request heads strictly; and writing every response
// head of the status table. It does no I/O.
//
// Invariants: encoders append to the caller's buffer and never allocate
// when it has room; nothing in event data can create an SSE field; the
// request parser makes one pass over the head, returns views into its input
// (or into the Parser's scratch) valid until the next Parse, never allocates
// in steady state, and rejects anything ambiguous with an error naming the
// rule.
package sse
