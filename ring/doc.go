// Package ring is a preallocated byte ring: the outbound queue of one hub
// worker (SPEC §5, --hub-worker-buffer).
//
// A Ring owns one buffer allocated by New and never grows or allocates
// again. Pushes are all or nothing, so a frame is either queued whole or
// not at all; consumption is byte-granular, because a socket may take part
// of a frame. Len, Free and the watermarks are exact at every moment, so
// the backpressure policy (evict, mark for RESYNC) can rely on them.
// A Ring has a single owner (the event loop) and takes no locks.
package ring
