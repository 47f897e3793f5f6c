// Package ring is a preallocated byte ring: the outbound queue of one hub
// worker (docs/hub-protocol.md, Modes and backpressure; --hub-worker-buffer).
//
// A Ring owns one buffer allocated by New and never grows or allocates
// again. Pushes are all or nothing, so a frame is either queued whole or
// not at all; consumption is byte-granular, because a socket may take part
// of a frame (the hub writes the ring straight to the socket and keeps track
// of where the next frame starts). Len, Free and the two watermarks are
// exact at every moment, so the backpressure policy can rely on them: the
// hub sets low = Cap/4 and high = Cap/2; a wake-mode notification that meets
// a ring AboveHigh is coalesced into one RESYNC, queued once the ring is
// BelowLow, and a lossless one that does not fit (Push returns false) makes
// the hub wait for the worker's socket, briefly, and then evicts the worker.
// A Ring has a single owner (the event loop) and takes no locks.
package ring
