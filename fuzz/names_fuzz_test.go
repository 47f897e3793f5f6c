package fuzz

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/pgsse/pgsse/names"
)

// Reference implementations: the rules written the obvious way.

func refCharset(s string, max int, allowed string, errLen, errChars error) error {
	if len(s) < 1 || len(s) > max {
		return errLen
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		if !alnum && strings.IndexByte(allowed, c) < 0 {
			return errChars
		}
	}
	return nil
}

func refChannel(s string) error {
	switch {
	case len(s) == 0:
		return names.ErrChannelEmpty
	case len(s) > 63:
		return names.ErrChannelLength
	case strings.IndexByte(s, 0) >= 0:
		return names.ErrChannelNUL
	}
	return nil
}

func refChannelUTF8(s string) error {
	if err := refChannel(s); err != nil {
		return err
	}
	if !utf8.ValidString(s) {
		return names.ErrChannelUTF8
	}
	return nil
}

func refTag(s string) error {
	switch {
	case len(s) < 1 || len(s) > 200:
		return names.ErrTagLength
	case strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return names.ErrTagControl
	case !utf8.ValidString(s):
		return names.ErrTagUTF8
	}
	return nil
}

func refStreamPattern(s string) error {
	base, prefix := strings.CutSuffix(s, "*")
	if prefix && len(base) > 200 || !prefix && (len(s) < 1 || len(s) > 200) {
		return names.ErrStreamLength
	}
	for i := 0; i < len(base); i++ { // the first byte that breaks a rule names it
		if base[i] == '*' {
			return names.ErrPatternStar
		}
		if refCharset(base[i:i+1], 1, "._:@/=+~-", nil, names.ErrStreamChars) != nil {
			return names.ErrStreamChars
		}
	}
	return nil
}

func refChannelPattern(s string) error {
	base, prefix := strings.CutSuffix(s, "*")
	switch {
	case !prefix:
		return refChannelUTF8(s)
	case len(base) > 63:
		return names.ErrChannelLength
	case strings.IndexByte(base, 0) >= 0:
		return names.ErrChannelNUL
	case !utf8.ValidString(base):
		return names.ErrChannelUTF8
	}
	return nil
}

func refCursor(s string) (int64, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, names.ErrCursorSyntax
	}
	v, err := strconv.ParseUint(s, 10, 63) // digits only, so any error is a range error
	if err != nil {
		return 0, names.ErrCursorRange
	}
	return int64(v), nil
}

func sameErr(t *testing.T, what, s string, want, got error) {
	t.Helper()
	if !errors.Is(got, want) || (want == nil) != (got == nil) {
		t.Fatalf("%s(%q) = %v, reference says %v", what, s, got, want)
	}
}

// FuzzNames checks the validators against the reference implementations, for
// both string and []byte inputs.
func FuzzNames(f *testing.F) {
	for _, s := range []string{
		"", "a", "orders/42", "a.b_c:d@e/f=g+h~i-j", "pgsse:gap", "pgsse:", "pgsse", "a b", "a%20", "a\x00b", "\x80", "a\n",
		strings.Repeat("x", 63), strings.Repeat("x", 64), strings.Repeat("x", 65),
		strings.Repeat("x", 200), strings.Repeat("x", 201),
		"\xff\xfe", "caf\xc3", "\xed\xa0\x80", "\xf4\x90\x80\x80", "user:\x00", "a\x7f", "é",
		"*", "chat/*", "a*b", "a b*", "a\x00*", "a**", "*a", strings.Repeat("s", 200) + "*",
		"0", "007", "+1", "-1", " 1", "1 ", "0x1",
		"9223372036854775807", "9223372036854775808", "18446744073709551616", "99999999999999999999x",
	} {
		f.Add(s)
	}
	checks := []struct {
		name string
		ref  func(string) error
		str  func(string) error
		byt  func([]byte) error
	}{
		{"CheckStream", func(s string) error {
			return refCharset(s, 200, "._:@/=+~-", names.ErrStreamLength, names.ErrStreamChars)
		}, names.CheckStream[string], names.CheckStream[[]byte]},
		{"CheckEvent", func(s string) error {
			if err := refCharset(s, 64, "._:-", names.ErrEventLength, names.ErrEventChars); err != nil {
				return err
			}
			if strings.HasPrefix(s, "pgsse:") {
				return names.ErrEventReserved
			}
			return nil
		}, names.CheckEvent[string], names.CheckEvent[[]byte]},
		{"CheckEventSyntax", func(s string) error {
			return refCharset(s, 64, "._:-", names.ErrEventLength, names.ErrEventChars)
		}, names.CheckEventSyntax[string], names.CheckEventSyntax[[]byte]},
		{"CheckChannel", refChannel, names.CheckChannel[string], names.CheckChannel[[]byte]},
		{"CheckChannelUTF8", refChannelUTF8, names.CheckChannelUTF8[string], names.CheckChannelUTF8[[]byte]},
		{"CheckTag", refTag, names.CheckTag[string], names.CheckTag[[]byte]},
		{"CheckStreamPattern", refStreamPattern, names.CheckStreamPattern[string], names.CheckStreamPattern[[]byte]},
		{"CheckChannelPattern", refChannelPattern, names.CheckChannelPattern[string], names.CheckChannelPattern[[]byte]},
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := []byte(s)
		for _, c := range checks {
			want := c.ref(s)
			sameErr(t, c.name, s, want, c.str(s))
			sameErr(t, c.name+"[]byte", s, want, c.byt(b))
		}

		wantV, wantErr := refCursor(s)
		for _, parse := range []func() (int64, error){
			func() (int64, error) { return names.ParseCursor(s) },
			func() (int64, error) { return names.ParseCursor(b) },
		} {
			v, err := parse()
			sameErr(t, "ParseCursor", s, wantErr, err)
			if v != wantV {
				t.Fatalf("ParseCursor(%q) = %d, reference %d", s, v, wantV)
			}
		}
	})
}

// refComposite is the composite cursor of docs/http.md (Several streams on one connection)
// written the obvious way: an optional "<k>:" prefix, then exactly k comma-separated entries,
// each empty (absent) or a cursor.
func refComposite(s string, k int) (cursors []int64, present []bool, err error) {
	if prefix, rest, ok := strings.Cut(s, ":"); ok {
		if _, err := refCursor(prefix); err != nil {
			return nil, nil, names.ErrCompositePrefix
		}
		s = rest
	}
	entries := strings.Split(s, ",")
	if len(entries) != k {
		return nil, nil, &names.CompositeCountError{Entries: len(entries), Streams: k}
	}
	cursors, present = make([]int64, k), make([]bool, k)
	for i, e := range entries {
		if e == "" {
			continue
		}
		c, err := refCursor(e)
		if err != nil {
			return nil, nil, &names.CompositeEntryError{Index: i, Err: err}
		}
		cursors[i], present[i] = c, true
	}
	return cursors, present, nil
}

// FuzzCompositeCursor checks names.ParseCompositeCursor against refComposite, for string and
// []byte input and 1 to 255 streams: the same cursors, the same entries absent, the same
// error (the same sentinel, counts and entry index).
func FuzzCompositeCursor(f *testing.F) {
	for _, s := range []struct {
		s string
		k uint8
	}{
		{"0:17,4", 2}, {"17,4", 2}, {",0,17", 3}, {"2:,0,", 3}, {",", 2}, {"5", 1}, {"5", 2}, {"0:", 1}, {"", 1}, {"", 2},
		{":1,2", 2}, {"a:1,2", 2}, {"0:1:2,3", 2}, {"1, 2", 2}, {"1,9223372036854775808", 2},
		{"99999999999999999999:1,2", 2}, {"3:1,2,3,4,5,6,7,8", 8}, {"1,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,", 64},
	} {
		f.Add(s.s, s.k)
	}
	f.Fuzz(func(t *testing.T, s string, k8 uint8) {
		k := max(int(k8), 1)
		want, wantPresent, wantErr := refComposite(s, k)
		for _, asBytes := range []bool{false, true} {
			cursors, present := make([]int64, k), make([]bool, k)
			var err error
			if asBytes {
				err = names.ParseCompositeCursor([]byte(s), cursors, present)
			} else {
				err = names.ParseCompositeCursor(s, cursors, present)
			}
			if (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) {
				t.Fatalf("ParseCompositeCursor(%q, %d streams) = %v, reference says %v", s, k, err, wantErr)
			}
			if wantErr != nil {
				var got, ref *names.CompositeEntryError
				if errors.As(wantErr, &ref) && (!errors.As(err, &got) || !errors.Is(err, ref.Err) || got.Index != ref.Index) {
					t.Fatalf("ParseCompositeCursor(%q, %d streams): entry error %v, reference %v", s, k, err, wantErr)
				}
				continue
			}
			for i := range k {
				if cursors[i] != want[i] || present[i] != wantPresent[i] {
					t.Fatalf("ParseCompositeCursor(%q, %d streams): entry %d = %d (present %v), reference %d (%v)",
						s, k, i, cursors[i], present[i], want[i], wantPresent[i])
				}
			}
		}
	})
}
