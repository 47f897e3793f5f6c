package chaos

import (
	"strconv"
	"strings"
)

// Every event and notification of a run is a pure function of where it goes (stream or
// channel) and its key: the key says who sent it (Key: a publisher's number and its own
// sequence), and everything else — the data's length, newlines, the event name, the audience
// — is derived from the key. So a receiver and the checker can tell an event from another one
// that merely has its id, and verify every byte of it, by regenerating it from the key it
// carries, without storing what was sent.

// Key names one published event or notification: the publisher (16 bits) and its own
// sequence number (from 1).
type Key uint64

// MakeKey is publisher pub's seq-th message.
func MakeKey(pub int, seq int64) Key { return Key(uint64(pub)<<40 | uint64(seq)&(1<<40-1)) }

// Pub is the publisher's number.
func (k Key) Pub() int { return int(k >> 40) }

// Seq is the publisher's sequence number.
func (k Key) Seq() int64 { return int64(k & (1<<40 - 1)) }

func (k Key) String() string { return strconv.Itoa(k.Pub()) + "/" + strconv.FormatInt(k.Seq(), 10) }

// mix is splitmix64's finalizer: a well-spread hash of the key.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// The kinds of message, the data's first word.
const (
	kindDurable   = "d" // pgsse.publish / POST /streams / a durable line of POST /publish
	kindEphemeral = "e" // pgsse.broadcast / ?ephemeral=1
	kindNotify    = "n" // pg_notify on a raw channel (hub workers, /channels/)
)

// Shape is what the key decides about an event besides its data.
type Shape struct {
	Event    string   // "" = message
	Audience []string // nil = everyone
}

// ShapeOf is the event name and audience of durable event k.
func ShapeOf(k Key) Shape {
	h := mix(uint64(k) ^ 0x5eed)
	var s Shape
	if h%100 < 15 {
		s.Event = "chaos.tick"
	}
	switch (h >> 8) % 100 {
	case 0, 1, 2, 3, 4, 5, 6, 7, 8, 9:
		s.Audience = []string{"grp:a"}
	case 10, 11, 12, 13, 14, 15, 16, 17, 18, 19:
		s.Audience = []string{"grp:b"}
	}
	return s
}

// Visible reports whether an event with audience aud reaches a connection with tags.
func Visible(aud, tags []string) bool {
	if len(aud) == 0 {
		return true
	}
	for _, a := range aud {
		for _, t := range tags {
			if a == t {
				return true
			}
		}
	}
	return false
}

const filler = "abcdefghijklmnopqrstuvwxyz0123456789"

// DurableData is the data of durable event k on stream: mostly short, some of a few KiB,
// some larger than a NOTIFY payload (so they travel as a wake and are read from the table),
// some with newlines (several data: lines) and a non-ASCII rune. Never a line starting with a
// space, never an empty line, never a carriage return: what SSE carries back is exactly this.
func DurableData(stream string, k Key) string {
	return data(kindDurable, stream, k, true)
}

// EphemeralData is the data of ephemeral event k on stream (short: a broadcast must fit a
// NOTIFY payload).
func EphemeralData(stream string, k Key) string { return data(kindEphemeral, stream, k, false) }

// NotifyPayload is the payload of notification k on channel.
func NotifyPayload(channel string, k Key) string { return data(kindNotify, channel, k, false) }

func data(kind, target string, k Key, sizes bool) string {
	h := mix(uint64(k))
	n := 16 + int(h%96)
	if sizes {
		switch (h >> 16) % 100 {
		case 0, 1, 2: // over the 8000-byte NOTIFY payload: a wake, read from the table
			n = 9000 + int((h>>24)%12000)
		case 3, 4, 5, 6, 7, 8:
			n = 1000 + int((h>>24)%3000)
		}
	}
	newlines := sizes && (h>>40)%10 == 0
	var b strings.Builder
	b.Grow(n + 64)
	b.WriteString(kind)
	b.WriteString(" k=")
	b.WriteString(strconv.FormatUint(uint64(k), 10))
	b.WriteString(" t=")
	b.WriteString(target)
	b.WriteByte(' ')
	if newlines {
		b.WriteString("é")
	}
	x := h
	for i := 0; i < n; i++ {
		if i%8 == 0 {
			x = mix(x)
		}
		if newlines && i > 0 && i%61 == 0 {
			b.WriteByte('\n')
			b.WriteByte('x') // a line never starts with a space and is never empty
			continue
		}
		b.WriteByte(filler[x%uint64(len(filler))])
		x >>= 6
	}
	return b.String()
}

// Parsed is what a message's data says about itself.
type Parsed struct {
	Kind   string // kindDurable, kindEphemeral or kindNotify
	Key    Key
	Target string // the stream or channel it was sent to
}

// ParseData reads the kind, key and target from data and checks that data is exactly what
// that kind, target and key generate (ok false otherwise: a corrupted or foreign message).
func ParseData(d string) (Parsed, bool) {
	kind, rest, ok := strings.Cut(d, " k=")
	if !ok || (kind != kindDurable && kind != kindEphemeral && kind != kindNotify) {
		return Parsed{}, false
	}
	ks, rest, ok := strings.Cut(rest, " t=")
	if !ok {
		return Parsed{}, false
	}
	kv, err := strconv.ParseUint(ks, 10, 64)
	if err != nil {
		return Parsed{}, false
	}
	target, _, ok := strings.Cut(rest, " ")
	if !ok {
		return Parsed{}, false
	}
	p := Parsed{Kind: kind, Key: Key(kv), Target: target}
	if data(kind, target, p.Key, kind == kindDurable) != d {
		return p, false
	}
	return p, true
}
