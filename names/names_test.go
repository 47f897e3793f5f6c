package names

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

type nameCase struct {
	name string
	in   string
	err  error
}

// both runs check on the string and on its []byte form and asserts the same result.
func both(t *testing.T, check func(string) error, checkB func([]byte) error, cases []nameCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.ErrorIs(t, check(tc.in), tc.err, "string %q", tc.in)
			assert.ErrorIs(t, checkB([]byte(tc.in)), tc.err, "[]byte %q", tc.in)
			if tc.err == nil {
				assert.NoError(t, check(tc.in))
				assert.NoError(t, checkB([]byte(tc.in)))
			}
		})
	}
}

func TestCheckStream(t *testing.T) {
	cases := []nameCase{
		{"len0", "", ErrStreamLength},
		{"len1", "a", nil},
		{"lenMax", strings.Repeat("x", MaxStream), nil},
		{"lenMax+1", strings.Repeat("x", MaxStream+1), ErrStreamLength},
		{"lenMax+1 bad chars", strings.Repeat(" ", MaxStream+1), ErrStreamLength},
		{"alnum", "ABCxyz019", nil},
		{"typical", "orders/42", nil},
		{"all punct", "a.b_c:d@e/f=g+h~i-j", nil},
		{"space", "a b", ErrStreamChars},
		{"percent", "a%20", ErrStreamChars},
		{"NUL", "a\x00", ErrStreamChars},
		{"0x80", "a\x80", ErrStreamChars},
		{"0xff", "\xff", ErrStreamChars},
		{"newline", "a\n", ErrStreamChars},
		{"CR", "\ra", ErrStreamChars},
		{"star", "chat/*", ErrStreamChars},
		{"question", "a?b", ErrStreamChars},
		{"hash", "a#b", ErrStreamChars},
		{"comma", "a,b", ErrStreamChars},
		{"quote", `a"b`, ErrStreamChars},
		{"backslash", `a\b`, ErrStreamChars},
		{"utf8", "café", ErrStreamChars},
		{"forbidden at max", strings.Repeat("x", MaxStream-1) + "%", ErrStreamChars},
	}
	for _, p := range []byte("._:@/=+~-") {
		cases = append(cases, nameCase{"punct " + string(p), string(p), nil})
		cases = append(cases, nameCase{"punct mid " + string(p), "a" + string(p) + "b", nil})
	}
	both(t, CheckStream[string], CheckStream[[]byte], cases)
}

func TestCheckEvent(t *testing.T) {
	cases := []nameCase{
		{"len0", "", ErrEventLength},
		{"len1", "m", nil},
		{"lenMax", strings.Repeat("e", MaxEvent), nil},
		{"lenMax+1", strings.Repeat("e", MaxEvent+1), ErrEventLength},
		{"typical", "order.created", nil},
		{"gap", "pgsse:gap", ErrEventReserved},
		{"presence", "pgsse:presence", ErrEventReserved},
		{"the prefix alone", "pgsse:", ErrEventReserved},
		{"prefix then a bad byte", "pgsse: x", ErrEventChars},
		{"pgsse without a colon", "pgsse", nil},
		{"pgsse.gap", "pgsse.gap", nil},
		{"prefix not at the start", "x:pgsse:gap", nil},
		{"prefix in another case", "PGSSE:gap", nil},
		{"short", "pgss", nil},
		{"all punct", "a.b_c:d-e", nil},
		{"space", "a b", ErrEventChars},
		{"percent", "a%", ErrEventChars},
		{"NUL", "\x00", ErrEventChars},
		{"0x80", "\x80", ErrEventChars},
		{"newline", "a\nb", ErrEventChars},
		{"CR", "a\r", ErrEventChars},
		{"colon space", "a: b", ErrEventChars},
	}
	for _, p := range []byte("._:-") {
		cases = append(cases, nameCase{"punct " + string(p), string(p), nil})
	}
	// Stream-only punctuation is not allowed in events.
	for _, p := range []byte("@/=+~") {
		cases = append(cases, nameCase{"stream-only " + string(p), "a" + string(p), ErrEventChars})
	}
	both(t, CheckEvent[string], CheckEvent[[]byte], cases)

	// CheckEventSyntax is the same rule without the reservation.
	for i := range cases {
		if cases[i].err == ErrEventReserved {
			cases[i].err = nil
		}
	}
	both(t, CheckEventSyntax[string], CheckEventSyntax[[]byte], cases)
}

func TestCheckChannel(t *testing.T) {
	cases := []nameCase{
		{"len0", "", ErrChannelEmpty},
		{"len1", "c", nil},
		{"lenMax", strings.Repeat("c", MaxChannel), nil},
		{"lenMax+1", strings.Repeat("c", MaxChannel+1), ErrChannelLength},
		{"lenMax+1 with NUL", strings.Repeat("\x00", MaxChannel+1), ErrChannelLength},
		{"NUL only", "\x00", ErrChannelNUL},
		{"NUL mid", "a\x00b", ErrChannelNUL},
		{"NUL at max", strings.Repeat("c", MaxChannel-1) + "\x00", ErrChannelNUL},
		{"space", "a b", nil},
		{"percent", "a%", nil},
		{"quote", `we"ird`, nil},
		{"newline", "a\n", nil},
		{"0x80", "\x80", nil},
		{"utf8", "café", nil},
		{"pgsse", "pgsse", nil},
	}
	both(t, CheckChannel[string], CheckChannel[[]byte], cases)
}

func TestCheckChannelUTF8(t *testing.T) {
	cases := []nameCase{
		// CheckChannel's rules come first.
		{"len0", "", ErrChannelEmpty},
		{"lenMax+1", strings.Repeat("c", MaxChannel+1), ErrChannelLength},
		{"NUL", "a\x00b", ErrChannelNUL},
		{"ascii", "jobs", nil},
		{"utf8", "café", nil},
		{"4-byte", "🎉", nil},
		{"lenMax of 3-byte runes", strings.Repeat("€", MaxChannel/3), nil},
		{"control bytes are legal identifiers", "a\nb\x7f", nil},
		// Issue #11: /channels/%FF%FE answered 200 + ":over capacity".
		{"FF FE", "\xff\xfe", ErrChannelUTF8},
		{"lone continuation", "a\x80", ErrChannelUTF8},
		{"truncated 2-byte", "caf\xc3", ErrChannelUTF8},
		{"truncated 3-byte", "\xe2\x82", ErrChannelUTF8},
		{"overlong slash", "\xc0\xaf", ErrChannelUTF8},
		{"overlong 3-byte", "\xe0\x80\xaf", ErrChannelUTF8},
		{"surrogate", "\xed\xa0\x80", ErrChannelUTF8},
		{"above U+10FFFF", "\xf4\x90\x80\x80", ErrChannelUTF8},
		{"F5", "\xf5\x80\x80\x80", ErrChannelUTF8},
		{"bad continuation", "\xe2\x28\xa1", ErrChannelUTF8},
	}
	both(t, CheckChannelUTF8[string], CheckChannelUTF8[[]byte], cases)
}

func TestCheckTag(t *testing.T) {
	cases := []nameCase{
		{"len0", "", ErrTagLength},
		{"len1", "a", nil},
		{"typical", "user:7", nil},
		{"spaces and punctuation", "role: admin / ops, \"quoted\"", nil},
		{"utf8", "groupe:équipe-🎉", nil},
		{"lenMax", strings.Repeat("t", MaxTag), nil},
		{"lenMax+1", strings.Repeat("t", MaxTag+1), ErrTagLength},
		// Issue #11: a NUL in a token tag made every replay read fail in PostgreSQL.
		{"NUL", "user:\x00", ErrTagControl},
		{"newline", "a\nb", ErrTagControl},
		{"CR", "a\r", ErrTagControl},
		{"tab", "a\tb", ErrTagControl},
		{"0x1f", "\x1f", ErrTagControl},
		{"DEL", "a\x7f", ErrTagControl},
		{"invalid UTF-8", "user:\xff", ErrTagUTF8},
		{"surrogate", "\xed\xb0\x80", ErrTagUTF8},
		{"C1 control is not SQL's rule", "a\u0085b", nil},
	}
	both(t, CheckTag[string], CheckTag[[]byte], cases)
}

func TestCheckAudience(t *testing.T) {
	many := func(n int) []string {
		tags := make([]string, n)
		for i := range tags {
			tags[i] = "t"
		}
		return tags
	}
	cases := []struct {
		name string
		tags []string
		want error
	}{
		{"none (everyone)", nil, nil},
		{"one", []string{"user:7"}, nil},
		{"max", many(MaxAudience), nil},
		{"max+1", many(MaxAudience + 1), ErrAudienceCount},
		{"the tag rule: length", []string{"a", ""}, ErrTagLength},
		{"the tag rule: control", []string{"a\x01"}, ErrTagControl},
		{"the tag rule: UTF-8", []string{"\xc3"}, ErrTagUTF8},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, CheckAudience(tc.tags))
			bs := make([][]byte, len(tc.tags))
			for i, tag := range tc.tags {
				bs[i] = []byte(tag)
			}
			assert.Equal(t, tc.want, CheckAudience(bs))
		})
	}
}

func TestCheckStreamPattern(t *testing.T) {
	cases := []nameCase{
		{"everything", "*", nil},
		{"exact", "orders/42", nil},
		{"prefix", "chat/*", nil},
		{"prefix without slash", "chat*", nil},
		{"exact max", strings.Repeat("s", MaxStream), nil},
		{"prefix max", strings.Repeat("s", MaxStream) + "*", nil},
		{"empty", "", ErrStreamLength},
		{"exact max+1", strings.Repeat("s", MaxStream+1), ErrStreamLength},
		{"prefix max+1", strings.Repeat("s", MaxStream+1) + "*", ErrStreamLength},
		{"star inside", "a*b", ErrPatternStar},
		{"two stars", "a**", ErrPatternStar},
		{"star first", "*a", ErrPatternStar},
		{"space", "a b", ErrStreamChars},
		{"space in prefix", "a b*", ErrStreamChars},
		{"NUL in prefix", "a\x00*", ErrStreamChars},
		{"utf8", "café*", ErrStreamChars},
	}
	both(t, CheckStreamPattern[string], CheckStreamPattern[[]byte], cases)
}

func TestCheckChannelPattern(t *testing.T) {
	cases := []nameCase{
		{"everything", "*", nil},
		{"exact", "jobs", nil},
		{"prefix", "jobs.*", nil},
		{"star inside is an ordinary byte", "a*b", nil},
		{"prefix of a star name", "a**", nil},
		{"exact max", strings.Repeat("c", MaxChannel), nil},
		{"prefix max", strings.Repeat("c", MaxChannel) + "*", nil},
		{"utf8 prefix", "équipe*", nil},
		{"empty", "", ErrChannelEmpty},
		{"exact max+1", strings.Repeat("c", MaxChannel+1), ErrChannelLength},
		{"prefix max+1", strings.Repeat("c", MaxChannel+1) + "*", ErrChannelLength},
		{"NUL", "a\x00", ErrChannelNUL},
		{"NUL in prefix", "a\x00*", ErrChannelNUL},
		{"invalid UTF-8", "\xff", ErrChannelUTF8},
		{"prefix splits a rune", "caf\xc3*", ErrChannelUTF8},
	}
	both(t, CheckChannelPattern[string], CheckChannelPattern[[]byte], cases)
}

func TestParseCursor(t *testing.T) {
	cases := []struct {
		in   string
		want int64
		err  error
	}{
		{"0", 0, nil},
		{"1", 1, nil},
		{"42", 42, nil},
		{"007", 7, nil},
		{strings.Repeat("0", 300) + "5", 5, nil},
		{"9223372036854775806", 1<<63 - 2, nil},
		{"9223372036854775807", 1<<63 - 1, nil},
		{"09223372036854775807", 1<<63 - 1, nil},
		{"9223372036854775808", 0, ErrCursorRange},
		{"9223372036854775809", 0, ErrCursorRange},
		{"9223372036854775810", 0, ErrCursorRange},
		{"18446744073709551615", 0, ErrCursorRange},
		{"18446744073709551616", 0, ErrCursorRange},
		{"99999999999999999999", 0, ErrCursorRange},
		{"92233720368547758070", 0, ErrCursorRange},
		{strings.Repeat("9", 400), 0, ErrCursorRange},
		{"", 0, ErrCursorSyntax},
		{"+1", 0, ErrCursorSyntax},
		{"-1", 0, ErrCursorSyntax},
		{"-0", 0, ErrCursorSyntax},
		{" 1", 0, ErrCursorSyntax},
		{"1 ", 0, ErrCursorSyntax},
		{"0x1", 0, ErrCursorSyntax},
		{"1e3", 0, ErrCursorSyntax},
		{"1_000", 0, ErrCursorSyntax},
		{"1.0", 0, ErrCursorSyntax},
		{"١", 0, ErrCursorSyntax}, // Arabic-Indic digit one
		{"1\x00", 0, ErrCursorSyntax},
		{"1\n", 0, ErrCursorSyntax},
		{"\t1", 0, ErrCursorSyntax},
		{"１", 0, ErrCursorSyntax},       // fullwidth digit one
		{"\u00a01", 0, ErrCursorSyntax}, // no-break space: bytes.TrimSpace would remove it
		{"/", 0, ErrCursorSyntax},       // '0'-1
		{":", 0, ErrCursorSyntax},       // '9'+1
		// Overflowing digits followed by junk: syntax wins (the value was never a number).
		{"99999999999999999999x", 0, ErrCursorSyntax},
	}
	for _, tc := range cases {
		name := tc.in
		if len(name) > 40 {
			name = name[:20] + "…" + strconv.Itoa(len(name))
		}
		t.Run(name, func(t *testing.T) {
			for _, got := range []func() (int64, error){
				func() (int64, error) { return ParseCursor(tc.in) },
				func() (int64, error) { return ParseCursor([]byte(tc.in)) },
			} {
				v, err := got()
				if tc.err != nil {
					assert.ErrorIs(t, err, tc.err)
					assert.Zero(t, v)
				} else {
					assert.NoError(t, err)
					assert.Equal(t, tc.want, v)
				}
			}
		})
	}
}

// Every error message names its rule; they reach HTTP bodies and SQL errors.
func TestErrorMessages(t *testing.T) {
	errs := map[error]string{
		ErrStreamLength:  "stream name must be 1-200 bytes",
		ErrStreamChars:   "stream name may contain only A-Z a-z 0-9 and . _ : @ / = + ~ -",
		ErrEventLength:   "event name must be 1-64 bytes",
		ErrEventChars:    "event name may contain only A-Z a-z 0-9 and . _ : -",
		ErrEventReserved: "event names starting with pgsse: are reserved",
		ErrChannelEmpty:  "channel name must be 1-63 bytes",
		ErrChannelLength: "channel name must be at most 63 bytes",
		ErrChannelNUL:    "channel name must not contain a NUL byte",
		ErrChannelUTF8:   "channel name must be valid UTF-8",
		ErrTagLength:     "audience tag must be 1-200 bytes",
		ErrTagUTF8:       "audience tag must be valid UTF-8",
		ErrTagControl:    "audience tag must not contain control characters",
		ErrAudienceCount: "audience must have at most 64 tags",
		ErrPatternStar:   "stream pattern may hold * only as its last byte (a prefix pattern)",
		ErrCursorSyntax:  "cursor must be decimal digits",
		ErrCursorRange:   "cursor must be at most 9223372036854775807",
	}
	seen := map[string]bool{}
	for err, msg := range errs {
		assert.Equal(t, msg, err.Error())
		assert.False(t, seen[msg], "duplicate message %q", msg)
		seen[msg] = true
	}
}

// Named string/byte types work through the ~ constraint.
func TestNamedTypes(t *testing.T) {
	type streamName string
	type raw []byte
	assert.NoError(t, CheckStream(streamName("a/b")))
	assert.ErrorIs(t, CheckStream(raw("a b")), ErrStreamChars)
	v, err := ParseCursor(raw("12"))
	assert.NoError(t, err)
	assert.Equal(t, int64(12), v)
}

var sink error

func TestZeroAllocs(t *testing.T) {
	long := strings.Repeat("x", MaxStream)
	bs := []byte("orders/42")
	bad := []byte("a b")
	cur := []byte("9223372036854775807")
	utf := []byte("groupe:équipe-🎉")
	bad8 := []byte("user:\xff")
	cases := map[string]func(){
		"CheckStream string":  func() { sink = CheckStream(long) },
		"CheckStream bytes":   func() { sink = CheckStream(bs) },
		"CheckStream bad":     func() { sink = CheckStream(bad) },
		"CheckEvent string":   func() { sink = CheckEvent("order.created") },
		"CheckEvent bytes":    func() { sink = CheckEvent(bad) },
		"CheckChannel string": func() { sink = CheckChannel("jobs") },
		"CheckChannel bytes":  func() { sink = CheckChannel(bs) },
		"CheckChannelUTF8":    func() { sink = CheckChannelUTF8(utf) },
		"CheckChannelUTF8 s":  func() { sink = CheckChannelUTF8("équipe") },
		"CheckTag bytes":      func() { sink = CheckTag(utf) },
		"CheckTag bad":        func() { sink = CheckTag(bad8) },
		"CheckStreamPattern":  func() { sink = CheckStreamPattern(bs) },
		"CheckChannelPattern": func() { sink = CheckChannelPattern("jobs.*") },
		"ParseCursor bytes":   func() { _, sink = ParseCursor(cur) },
		"ParseCursor string":  func() { _, sink = ParseCursor("123456") },
		"ParseCursor bad":     func() { _, sink = ParseCursor("99999999999999999999") },
	}
	for name, fn := range cases {
		assert.Zero(t, testing.AllocsPerRun(200, fn), name)
	}
}

func BenchmarkCheckStream(b *testing.B) {
	s := []byte("tenant-7/orders/2024-06-01:abc@x")
	b.ReportAllocs()
	for b.Loop() {
		sink = CheckStream(s)
	}
}

func BenchmarkParseCursor(b *testing.B) {
	s := []byte("9223372036854775807")
	b.ReportAllocs()
	for b.Loop() {
		_, sink = ParseCursor(s)
	}
}
