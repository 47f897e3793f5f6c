// Package auth owns pgsse's bearer tokens (docs/http.md, Authorization; Publishing over HTTP):
// verifying JWTs (HS256 with a shared secret; RS256, ES256 or EdDSA with a public key),
// extracting the "pgsse" claims, checking them against the name rules, matching stream and
// channel names against the granted patterns, the audience rule (InAudience: which events a
// token's tags may see), verifying off the event loop (Pool) with a cache of results (Cache), and
// minting tokens for `pgsse token`.
//
// Invariants:
//   - a key accepts only its own algorithm family, so a token can never choose how it is
//     checked (no "none", no HS256 keyed with a public key);
//   - a token's JSON is read strictly (wire.go), so that no two decoders could read it
//     differently: no repeated key anywhere (claims or header), no crit header, each
//     registered claim and the "pgsse" claim of its documented type and keys, exp and nbf
//     in seconds; each refusal names the claim. Grants at the top level are not refused
//     (other claims are the application's) but remembered, so a 403 can say where they
//     belong (Claims.NotGranted);
//   - a verified token's claims are immutable and obey the name rules (patterns, tags,
//     at most MaxClaimEntries per list), so nothing a token carries can make SQL or a
//     LISTEN fail; a token that breaks them is refused like a bad signature (ErrClaims);
//   - subscribe grants (streams, channels) and publish grants (publish) are separate;
//   - the loop-side calls — Claims matching, Cache.Lookup, Pool.Lookup, Pool.Submit —
//     never block on a signature check and do not allocate in steady state; Submit never
//     blocks at all (a full queue is refused, and counted);
//   - the cache is keyed by SHA-256 of the exact token bytes (never by a claim, and
//     without keeping the bearer token itself in memory), holds a verified token no
//     longer than its exp and only from its nbf, keeps failures apart and bounded so they
//     can neither shadow nor evict a valid token, and every table has a size bound.
//
// The public-stream rule lives here too (OnPublicStream): on a stream that needs no
// token, a token only adds tags; one that does not verify is ignored.
package auth
