// Package ssetest is the one SSE client side of pgsse's tests and load harness.
//
//   - Decoder: the stream parser, written from the WHATWG standard (CRLF, LF and CR line ends,
//     comments, id/event/data/retry fields, reads split anywhere, optionally chunked transfer
//     coding), incremental and allocation-free, so that bench/ decodes its 10,000 connections
//     with it and the fuzz targets hold pgsse's encoder against it (it does not import sse/).
//   - Stream and Event: blocks read from a connection or response body, copied into strings
//     with the time they arrived, with timeouts — what a test asserts on.
//   - ResumingReader: an EventSource-like subscriber that reconnects with Last-Event-ID
//     wherever the kernel or a load balancer sends it, for tests of process and host failures;
//     PublishRange and RequireAll check docs/http.md's durable delivery guarantee with it.
package ssetest
