// Package framing encodes and decodes the hub's binary wire protocol (docs/hub-protocol.md):
// a big-endian u32 body length N (1 ≤ N ≤ MaxBody), then N body bytes whose
// first byte is the frame type.
//
// It owns the byte layout and nothing else: no I/O, no state beyond a
// Decoder's one-frame buffer. Invariants: encoders append to the caller's
// buffer and never allocate when it has room; decoders never copy — every
// []byte in a decoded Frame is a view into the input, valid only until that
// input is modified or reused (for a Decoder, until the next Feed or Next).
// Every byte from a peer goes through Decode, which checks every field
// against its rule and reports the first violation as a distinct sentinel
// error; a decoded frame re-encodes (Frame.Append) to exactly its input bytes.
package framing
