package auth

import (
	"errors"
	"strconv"
	"time"

	"github.com/pgsse/pgsse/names"
)

// Claims are what a verified token grants. Patterns are exact names, or a prefix ending
// in '*' ("chat/*" matches "chat/" and "chat/x/y"; "*" matches everything).
// A Claims value is never modified after Verify returns it, so it may be shared.
//
// Subscribe grants (Streams, Channels) and publish grants (Publish) are
// separate: neither implies the other (docs/http.md, Publishing over HTTP).
type Claims struct {
	Streams  []string  // stream patterns a subscriber may read
	Channels []string  // raw channel patterns (/channels/)
	Publish  []string  // stream patterns a publisher may write (POST /streams, /publish)
	Tags     []string  // matched against an event's audience
	Subject  string    // the token's sub, for logs; "" if absent
	Expires  time.Time // zero if the token has no exp
	// NotBefore is the token's nbf, zero if absent; a cached verification
	// honours it.
	NotBefore time.Time
	// Misplaced lists the grant keys (streams, channels, publish, tags) the token carries at
	// its top level rather than under "pgsse": other claims are the application's business,
	// so they are not refused, but a refusal says where grants belong (NotGranted).
	Misplaced []string
}

// NotGranted is the text of a 403 for something the claims do not grant ("stream
// orders/42", "publishing to stream orders/42"): "token does not grant " + what, and, when the
// token carries grants at its top level, that they belong under "pgsse" (docs/http.md,
// Authorization).
func (c *Claims) NotGranted(what string) string {
	return c.notGranted("token does not grant " + what)
}

// NotGrantedStream is NotGranted for subscribing to stream name (what names it, e.g. "stream
// orders/42 (stream[1])"); when the token may publish to that stream, it adds that a publish
// grant does not allow subscribing, the mistake behind most such refusals.
func (c *Claims) NotGrantedStream(name []byte, what string) string {
	s := "token does not grant " + what
	if c.AllowsPublish(name) {
		s += ` (it grants publishing to it, not subscribing: subscribing needs "streams" under "pgsse", e.g. pgsse token --stream)`
	}
	return c.notGranted(s)
}

// NotGrantedPublish is NotGranted for publishing to stream name; when the token may subscribe
// to that stream, it adds that a subscribe grant does not allow publishing.
func (c *Claims) NotGrantedPublish(name []byte, what string) string {
	s := "token does not grant " + what
	if c.AllowsStream(name) {
		s += ` (it grants subscribing to it, not publishing: publishing needs "publish" under "pgsse", e.g. pgsse token --publish)`
	}
	return c.notGranted(s)
}

// notGranted appends to a refusal s, when the token carries grants at its top level, that
// they belong under "pgsse".
func (c *Claims) notGranted(s string) string {
	if c == nil || len(c.Misplaced) == 0 {
		return s
	}
	s += " (the token has "
	for i, k := range c.Misplaced {
		if i > 0 {
			s += ", "
		}
		s += strconv.Quote(k)
	}
	return s + ` at its top level, but pgsse reads grants only under "pgsse": {"pgsse":{"streams":[…],"publish":[…]}})`
}

// AllowsStream reports whether some stream pattern matches name. It does not allocate.
func (c *Claims) AllowsStream(name []byte) bool {
	if c == nil {
		return false
	}
	return matchAny(c.Streams, name)
}

// AllowsChannel reports whether some channel pattern matches name. It does not allocate.
func (c *Claims) AllowsChannel(name []byte) bool {
	if c == nil {
		return false
	}
	return matchAny(c.Channels, name)
}

// AllowsPublish reports whether some publish pattern matches stream. A
// subscribe grant never allows publishing. It does not allocate.
func (c *Claims) AllowsPublish(stream []byte) bool {
	if c == nil {
		return false
	}
	return matchAny(c.Publish, stream)
}

// InAudience reports whether a connection whose token carries tags may see an event
// addressed to audience (docs/http.md, Authorization: Audience): the audience is empty
// (everyone), or it shares a tag with tags. It is the one rule for live delivery; replay applies
// the same in SQL (pgsse.replay). It does not allocate.
func InAudience(tags, audience []string) bool {
	if len(audience) == 0 {
		return true
	}
	for _, a := range audience {
		for _, t := range tags {
			if a == t {
				return true
			}
		}
	}
	return false
}

func matchAny(patterns []string, name []byte) bool {
	for _, p := range patterns {
		if Match(p, name) {
			return true
		}
	}
	return false
}

// Match reports whether name matches pattern: equal to it, or, when pattern ends in '*',
// starting with the part before the '*'. A '*' anywhere else is an ordinary byte.
// It does not allocate.
func Match(pattern string, name []byte) bool {
	if n := len(pattern); n > 0 && pattern[n-1] == '*' {
		prefix := pattern[:n-1]
		return len(name) >= len(prefix) && string(name[:len(prefix)]) == prefix
	}
	return string(name) == pattern
}

// MatchAny is Match over several patterns (e.g. --public-streams). It does not allocate.
func MatchAny(patterns []string, name []byte) bool { return matchAny(patterns, name) }

// MaxClaimEntries bounds each list in the "pgsse" claim (streams, channels,
// publish, tags): a token travels in every request head, and each entry
// costs a match per event.
const MaxClaimEntries = 256

// ErrClaims is what every token-contents error is (test with errors.Is): a
// token whose grants or tags break the name rules is rejected like a bad
// signature (401), with a message naming the claim.
var ErrClaims = errors.New("token claims break the name rules")

// ClaimError says which entry of which claim broke which rule, e.g.
// "token claim pgsse.tags[2]: audience tag must not contain control characters".
type ClaimError struct {
	Claim string // "pgsse.tags", "pgsse.streams", …
	Index int    // the entry, or -1 for the list as a whole
	Err   error  // the names rule broken
}

func (e *ClaimError) Error() string {
	s := "token claim " + e.Claim
	if e.Index >= 0 {
		s += "[" + strconv.Itoa(e.Index) + "]"
	}
	return s + ": " + e.Err.Error()
}

// Is makes every ClaimError match ErrClaims.
func (e *ClaimError) Is(target error) bool { return target == ErrClaims }

// Unwrap returns the names rule, so errors.Is(err, names.ErrTagControl) works.
func (e *ClaimError) Unwrap() error { return e.Err }

var errTooManyEntries = errors.New("at most " + strconv.Itoa(MaxClaimEntries) + " entries")

// Check applies the name rules to every grant and tag (docs/http.md, Authorization): stream
// and publish patterns follow names.CheckStreamPattern, channel patterns
// names.CheckChannelPattern, tags names.CheckTag — so nothing a token
// carries can reach SQL or a LISTEN that PostgreSQL would refuse — and
// bounds each list by MaxClaimEntries. It returns the first *ClaimError.
func (c *Claims) Check() error {
	lists := []struct {
		claim string
		list  []string
		check func(string) error
	}{
		{"pgsse.streams", c.Streams, names.CheckStreamPattern[string]},
		{"pgsse.channels", c.Channels, names.CheckChannelPattern[string]},
		{"pgsse.publish", c.Publish, names.CheckStreamPattern[string]},
		{"pgsse.tags", c.Tags, names.CheckTag[string]},
	}
	for _, l := range lists {
		if len(l.list) > MaxClaimEntries {
			return &ClaimError{Claim: l.claim, Index: -1, Err: errTooManyEntries}
		}
		for i, v := range l.list {
			if err := l.check(v); err != nil {
				return &ClaimError{Claim: l.claim, Index: i, Err: err}
			}
		}
	}
	return nil
}

// OnPublicStream applies the public-stream rule to a verification result
// (c, err) for a stream that needs no token (--public-streams): a token
// there can only add audience tags. A token that does not verify —
// expired, not yet valid, badly signed, breaking the name rules — is
// ignored: the connection is anonymous, with no tags and no deadline. A
// valid token gives its tags, and the connection must end at its exp only
// when it has tags (that is when what it may see changes; the client comes
// back with a fresh token or anonymously); a valid token without tags adds
// nothing, so its exp does not matter. deadline is zero for "never".
func OnPublicStream(c *Claims, err error) (tags []string, deadline time.Time) {
	if err != nil || c == nil || len(c.Tags) == 0 {
		return nil, time.Time{}
	}
	return c.Tags, c.Expires
}
