// Package auth owns pgsse's bearer tokens (SPEC §3 Authorization): verifying JWTs
// (HS256 with a shared secret; RS256, ES256 or EdDSA with a public key), extracting the
// "pgsse" claims, matching stream and channel names against the granted patterns, the
// audience rule (InAudience: which events a token's tags may see), and minting tokens for
// `pgsse token`.
//
// Invariants: a key accepts only its own algorithm family, so a token can never choose
// how it is checked (no "none", no HS256 keyed with a public key); a verified token's
// claims are immutable; pattern matching never allocates.
package auth
