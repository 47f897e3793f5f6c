package auth

import "time"

// Claims are what a verified token grants. Patterns are exact names, or a prefix ending
// in '*' ("chat/*" matches "chat/" and "chat/x/y"; "*" matches everything).
// A Claims value is never modified after Verify returns it, so it may be shared.
type Claims struct {
	Streams  []string  // stream patterns
	Channels []string  // raw channel patterns (/channels/)
	Tags     []string  // matched against an event's audience
	Subject  string    // the token's sub, for logs; "" if absent
	Expires  time.Time // zero if the token has no exp
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

// InAudience reports whether a connection whose token carries tags may see an event
// addressed to audience (SPEC §3 "Audience"): the audience is empty (everyone), or it
// shares a tag with tags. It is the one rule for live delivery; replay applies the same
// in SQL (pgsse.replay). It does not allocate.
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
