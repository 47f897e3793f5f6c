// Package sse owns pgsse's HTTP/1.1 and Server-Sent Events wire format for
// the SSE port (docs/http.md): encoding SSE events, comments, retry and gap
// notices; parsing request heads strictly; decoding publish bodies; and
// writing every response of the status tables. It does no I/O.
//
// Invariants: encoders append to the caller's buffer and never allocate
// when it has room; nothing in event data can create an SSE field, and no
// value can end a response header early; the request parser makes one pass
// over the head, returns views into its input (or into the Parser's
// scratch) valid until the next Parse, never allocates in steady state, and
// rejects anything ambiguous with an error naming the rule.
//
// Up to MaxEmptyLines empty lines before a request line are skipped (RFC 9112
// §2.2) and count toward the head's size; one more is a 400.
//
// Bodies: only a POST's is read. GET, HEAD and OPTIONS with one are a 400; a
// method this server does not implement may carry one, whose framing is
// recorded with KeepAlive false, so that it is answered (405, 404) and the
// connection closed without the body being taken for a request. The framing
// is decided from the whole head (RFC 9112 §6.3): Content-Length (one header, digits only) or
// Transfer-Encoding: chunked (exactly; other codings 501), never both (a
// request-smuggling ambiguity: 400), no Transfer-Encoding in HTTP/1.0, and
// a POST with neither is refused with 411 by BodyDecoder.Start. The
// BodyDecoder is an incremental state machine: fed the socket's bytes in any
// pieces it yields the same body and the same consumed count as fed at once,
// stops at the body's last byte so a pipelined request can follow, and
// refuses a body over the limit as soon as the limit is known to be passed.
// A connection may stay open after a response only when the request's
// framing was understood and its body consumed (see Reply).
//
// Expect: 100-continue is honoured: Request.Expect100 tells the caller to
// send AppendContinue once the head has passed every check that needs no
// body; a request refused before that gets its final status and a close.
package sse
