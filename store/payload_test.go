package store

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParsePayloadValid(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		want  Payload
		tags  []string
		data  string
		event string
	}{
		{name: "durable", in: "D1 1700000000000000 orders/42 7 created 0\n{\"a\":1}",
			want: Payload{Kind: KindDurable, TimeUS: 1700000000000000, ID: 7}, event: "created", data: "{\"a\":1}"},
		{name: "default event, empty data", in: "D1 1 s 1  0\n", want: Payload{Kind: KindDurable, TimeUS: 1, ID: 1}},
		{name: "wake", in: "W1 1700000000000001 s 123456789  0\n", want: Payload{Kind: KindWake, TimeUS: 1700000000000001, ID: 123456789}},
		{name: "ephemeral with tags", in: "E1 5 chat:room 9 typing 2 6:user:7 10:role:admin\nline1\nline2",
			want: Payload{Kind: KindEphemeral, TimeUS: 5, ID: 9, NTags: 2}, event: "typing",
			tags: []string{"user:7", "role:admin"}, data: "line1\nline2"},
		{name: "tag with space and colon", in: "D1 1 s 1  1 5:a b:c\n", want: Payload{Kind: KindDurable, TimeUS: 1, ID: 1, NTags: 1}, tags: []string{"a b:c"}},
		{name: "max id", in: "D1 0 s 9223372036854775807  0\nx", want: Payload{Kind: KindDurable, ID: 9223372036854775807}, data: "x"},
		// Stored before schema v3 reserved the prefix: delivered as stored, live as in replay.
		{name: "reserved event name", in: "D1 1 s 1 pgsse:gap 0\nx", want: Payload{Kind: KindDurable, TimeUS: 1, ID: 1}, event: "pgsse:gap", data: "x"},
		{name: "utf-8 tag and data", in: "D1 1 s 1  1 2:é\nü€", want: Payload{Kind: KindDurable, TimeUS: 1, ID: 1, NTags: 1}, tags: []string{"é"}, data: "ü€"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var p Payload
			require.NoError(t, ParsePayload([]byte(tc.in), &p))
			assert.Equal(t, tc.want.Kind, p.Kind)
			assert.Equal(t, tc.want.TimeUS, p.TimeUS)
			assert.Equal(t, tc.want.ID, p.ID)
			assert.Equal(t, tc.want.NTags, p.NTags)
			assert.Equal(t, tc.event, string(p.Event))
			assert.Equal(t, tc.data, string(p.Data))
			var tags []string
			p.Tags(func(tag []byte) bool { tags = append(tags, string(tag)); return true })
			assert.Equal(t, tc.tags, tags)
			assert.Equal(t, tc.in, string(AppendPayload(nil, &p, nil)), "re-encodes to the same bytes")
		})
	}
}

func TestParsePayloadInvalid(t *testing.T) {
	long := strings.Repeat("a", 201)
	tests := []struct {
		name string
		in   string
		err  error
	}{
		{"empty", "", ErrPayloadKind},
		{"unknown kind", "X1 1 s 1  0\n", ErrPayloadKind},
		{"version 2", "D2 1 s 1  0\n", ErrPayloadKind},
		{"no space after version", "D11 s 1  0\n", ErrPayloadKind},
		{"time missing", "D1  s 1  0\n", ErrPayloadTime},
		{"time leading zero", "D1 01 s 1  0\n", ErrPayloadTime},
		{"time 17 digits", "D1 12345678901234567 s 1  0\n", ErrPayloadTime},
		{"time non-digit", "D1 1x s 1  0\n", ErrPayloadSpacing},
		{"double space before stream", "D1 1  s 1  0\n", ErrPayloadStream},
		{"stream bad char", "D1 1 s\"x 1  0\n", ErrPayloadStream},
		{"stream too long", "D1 1 " + long + " 1  0\n", ErrPayloadStream},
		{"truncated after stream", "D1 1 s", ErrPayloadSpacing},
		{"id zero", "D1 1 s 0  0\n", ErrPayloadID},
		{"id negative", "D1 1 s -1  0\n", ErrPayloadID},
		{"id overflow", "D1 1 s 9223372036854775808  0\n", ErrPayloadID},
		{"id 20 digits", "D1 1 s 10000000000000000000  0\n", ErrPayloadID},
		{"id leading zero", "D1 1 s 01  0\n", ErrPayloadID},
		{"event bad char", "D1 1 s 1 a/b 0\n", ErrPayloadEvent},
		{"event too long", "D1 1 s 1 " + strings.Repeat("e", 65) + " 0\n", ErrPayloadEvent},
		{"truncated after event", "D1 1 s 1 ev", ErrPayloadSpacing},
		{"ntags missing", "D1 1 s 1  \n", ErrPayloadNTags},
		{"ntags over limit", "D1 1 s 1  65\n", ErrPayloadNTags},
		{"ntags leading zero", "D1 1 s 1  01 1:a\n", ErrPayloadNTags},
		{"fewer tags than announced", "D1 1 s 1  2 1:a\n", ErrPayloadSpacing},
		{"tag length past end", "D1 1 s 1  1 9:ab\n", ErrPayloadTag},
		{"tag length zero", "D1 1 s 1  1 0:\n", ErrPayloadTag},
		{"tag length over limit", "D1 1 s 1  1 201:" + long + "\n", ErrPayloadTag},
		{"tag without colon", "D1 1 s 1  1 1a\n", ErrPayloadTag},
		{"tag with newline", "D1 1 s 1  1 3:a\nb\n", ErrPayloadTag},
		{"more tags than announced", "D1 1 s 1  1 1:a 1:b\n", ErrPayloadHeader},
		{"no line feed", "D1 1 s 1  0", ErrPayloadHeader},
		{"carriage return", "D1 1 s 1  0\r\n", ErrPayloadHeader},
		{"wake with data", "W1 1 s 1  0\nx", ErrPayloadWake},
		{"wake with event", "W1 1 s 1 ev 0\n", ErrPayloadWake},
		{"wake with tags", "W1 1 s 1  1 1:a\n", ErrPayloadWake},
		{"foreign json", `{"stream":"s","id":1}`, ErrPayloadKind},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := Payload{Stream: []byte("stale")}
			err := ParsePayload([]byte(tc.in), &p)
			assert.ErrorIs(t, err, tc.err)
			assert.Equal(t, Payload{}, p, "a rejected payload leaves no partial route")
		})
	}
}

func TestAppendPayloadTags(t *testing.T) {
	p := Payload{Kind: KindEphemeral, TimeUS: 12, Stream: []byte("a/b"), ID: 3, Event: []byte("ev"), Data: []byte("x\ny")}
	got := AppendPayload([]byte("prefix:"), &p, [][]byte{[]byte("t1"), []byte("tag two")})
	assert.Equal(t, "prefix:E1 12 a/b 3 ev 2 2:t1 7:tag two\nx\ny", string(got))
}

var benchPayload = []byte("D1 1700000000000000 orders/42 12345 order.created 2 6:user:7 10:role:admin\n{\"id\":42,\"total\":\"19.99\",\"items\":[1,2,3]}")

func TestParsePayloadAllocs(t *testing.T) {
	var p Payload
	allocs := testing.AllocsPerRun(1000, func() {
		if ParsePayload(benchPayload, &p) != nil {
			t.Fatal("parse failed")
		}
		n := 0
		p.Tags(func([]byte) bool { n++; return true })
	})
	assert.Zero(t, allocs)
}

func BenchmarkParsePayload(b *testing.B) {
	var p Payload
	b.ReportAllocs()
	b.SetBytes(int64(len(benchPayload)))
	for b.Loop() {
		if err := ParsePayload(benchPayload, &p); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendPayload(b *testing.B) {
	var p Payload
	require.NoError(b, ParsePayload(benchPayload, &p))
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendPayload(buf[:0], &p, nil)
	}
}

func TestParsePresencePayloadValid(t *testing.T) {
	tests := []struct {
		name   string
		in     string
		want   Payload
		joins  []string
		leaves []string
	}{
		{name: "join and leave", in: "P1 1700000000000000 room/1 17 12 1 1 3 1 1 6:user:9 6:user:7\n",
			want:  Payload{TimeUS: 1700000000000000, ID: 17, Prev: 12, Part: 1, Parts: 1, Anonymous: 3, NJoin: 1, NLeave: 1},
			joins: []string{"user:9"}, leaves: []string{"user:7"}},
		{name: "first change, anonymous only", in: "P1 1 s 1 0 1 1 2 0 0\n",
			want: Payload{TimeUS: 1, ID: 1, Part: 1, Parts: 1, Anonymous: 2}},
		{name: "subjects with spaces, colons and UTF-8", in: "P1 1 s 9 3 2 3 0 2 0 5:a b:c 2:é\n",
			want:  Payload{TimeUS: 1, ID: 9, Prev: 3, Part: 2, Parts: 3, NJoin: 2},
			joins: []string{"a b:c", "é"}},
		{name: "only leaves", in: "P1 1 s 9 8 64 64 0 0 1 1:x\n",
			want: Payload{TimeUS: 1, ID: 9, Prev: 8, Part: 64, Parts: 64, NLeave: 1}, leaves: []string{"x"}},
		{name: "too large: re-read", in: "P1 1 s 9223372036854775807 5 0 0 9223372036854775807 0 0\n",
			want: Payload{TimeUS: 1, ID: 9223372036854775807, Prev: 5, Anonymous: 9223372036854775807}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var p Payload
			require.NoError(t, ParsePayload([]byte(tc.in), &p))
			assert.Equal(t, KindPresence, p.Kind)
			got := Payload{TimeUS: p.TimeUS, ID: p.ID, Prev: p.Prev, Part: p.Part, Parts: p.Parts,
				Anonymous: p.Anonymous, NJoin: p.NJoin, NLeave: p.NLeave}
			assert.Equal(t, tc.want, got)
			assert.Empty(t, p.Event)
			assert.Empty(t, p.Data)
			assert.Zero(t, p.NTags)
			var joins, leaves []string
			p.Joins(func(s []byte) bool { joins = append(joins, string(s)); return true })
			p.Leaves(func(s []byte) bool { leaves = append(leaves, string(s)); return true })
			assert.Equal(t, tc.joins, joins)
			assert.Equal(t, tc.leaves, leaves)
			assert.Equal(t, tc.in, string(AppendPayload(nil, &p, nil)), "re-encodes to the same bytes")
			var jb, lb [][]byte
			for _, s := range joins {
				jb = append(jb, []byte(s))
			}
			for _, s := range leaves {
				lb = append(lb, []byte(s))
			}
			if jb == nil && lb == nil {
				jb = [][]byte{}
			}
			assert.Equal(t, tc.in, string(AppendPresencePayload(nil, &p, jb, lb)), "re-encodes from the lists")
		})
	}
}

func TestParsePresencePayloadInvalid(t *testing.T) {
	long := strings.Repeat("a", 201)
	tests := []struct {
		name string
		in   string
		err  error
	}{
		{"version 2", "P2 1 s 2 1 1 1 0 0 0\n", ErrPayloadKind},
		{"time leading zero", "P1 01 s 2 1 1 1 0 0 0\n", ErrPayloadTime},
		{"bad stream", "P1 1 a\"b 2 1 1 1 0 0 0\n", ErrPayloadStream},
		{"seq zero", "P1 1 s 0 0 1 1 0 0 0\n", ErrPayloadID},
		{"seq overflow", "P1 1 s 9223372036854775808 1 1 1 0 0 0\n", ErrPayloadID},
		{"prev equals seq", "P1 1 s 2 2 1 1 0 0 0\n", ErrPayloadPrev},
		{"prev above seq", "P1 1 s 2 3 1 1 0 0 0\n", ErrPayloadPrev},
		{"prev leading zero", "P1 1 s 2 01 1 1 0 0 0\n", ErrPayloadPrev},
		{"prev missing", "P1 1 s 2  1 1 0 0 0\n", ErrPayloadPrev},
		{"part zero of one", "P1 1 s 2 1 0 1 0 0 0\n", ErrPayloadParts},
		{"part one of zero", "P1 1 s 2 1 1 0 0 0 0\n", ErrPayloadParts},
		{"part beyond parts", "P1 1 s 2 1 3 2 0 0 0\n", ErrPayloadParts},
		{"65 parts", "P1 1 s 2 1 1 65 0 0 0\n", ErrPayloadParts},
		{"3-digit part", "P1 1 s 2 1 100 100 0 0 0\n", ErrPayloadParts},
		{"anonymous negative", "P1 1 s 2 1 1 1 -1 0 0\n", ErrPayloadAnonymous},
		{"anonymous leading zero", "P1 1 s 2 1 1 1 01 0 0\n", ErrPayloadAnonymous},
		{"joins 5 digits", "P1 1 s 2 1 1 1 0 10000 0\n", ErrPayloadNSubjects},
		{"subjects in part 0", "P1 1 s 2 1 0 0 0 1 0 1:x\n", ErrPayloadNSubjects},
		{"fewer subjects than announced", "P1 1 s 2 1 1 1 0 1 1 1:x\n", ErrPayloadSpacing},
		{"more subjects than announced", "P1 1 s 2 1 1 1 0 1 0 1:x 1:y\n", ErrPayloadHeader},
		{"subject length past end", "P1 1 s 2 1 1 1 0 1 0 9:x\n", ErrPayloadSubject},
		{"empty subject", "P1 1 s 2 1 1 1 0 1 0 0:\n", ErrPayloadSubject},
		{"subject over 200 bytes", "P1 1 s 2 1 1 1 0 1 0 201:" + long + "\n", ErrPayloadSubject},
		{"subject with a control character", "P1 1 s 2 1 1 1 0 1 0 3:a\tb\n", ErrPayloadSubject},
		{"subject not UTF-8", "P1 1 s 2 1 1 1 0 1 0 1:\xff\n", ErrPayloadSubject},
		{"no line feed", "P1 1 s 2 1 1 1 0 0 0", ErrPayloadHeader},
		{"data after the line feed", "P1 1 s 2 1 1 1 0 0 0\nx", ErrPayloadTrailing},
		{"extra field", "P1 1 s 2 1 1 1 0 0 0 0\n", ErrPayloadHeader},
		{"double space", "P1 1 s  2 1 1 1 0 0 0\n", ErrPayloadID},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := Payload{Stream: []byte("stale")}
			err := ParsePayload([]byte(tc.in), &p)
			assert.ErrorIs(t, err, tc.err)
			assert.Equal(t, Payload{}, p, "a rejected payload leaves no partial route")
		})
	}
}

var benchPresencePayload = []byte("P1 1700000000000000 doc/42 1234 1233 1 1 3 2 1 6:user:7 7:user:12 6:user:3\n")

func TestParsePresencePayloadAllocs(t *testing.T) {
	var p Payload
	allocs := testing.AllocsPerRun(1000, func() {
		if ParsePayload(benchPresencePayload, &p) != nil {
			t.Fatal("parse failed")
		}
		n := 0
		p.Joins(func([]byte) bool { n++; return true })
		p.Leaves(func([]byte) bool { n++; return true })
	})
	assert.Zero(t, allocs)
}
