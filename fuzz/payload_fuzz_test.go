package fuzz

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/names"
	"github.com/pgsse/pgsse/store"
)

// refPayload is the NOTIFY payload as an independent reference parser sees it.
type refPayload struct {
	kind   byte
	timeUS int64
	stream string
	id     int64
	event  string
	tags   []string
	data   string
}

// refCanonical parses a decimal of 1..maxDigits digits without sign or leading zero.
func refCanonical(s string, maxDigits int) (int64, bool) {
	if len(s) == 0 || len(s) > maxDigits || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || strconv.FormatInt(v, 10) != s {
		return 0, false
	}
	return v, true
}

// refParsePayload is the format of store's package doc written the obvious
// way, with strings.Cut and friends.
func refParsePayload(s string) (refPayload, bool) {
	var p refPayload
	header, data, ok := strings.Cut(s, "\n")
	if !ok || len(header) < 3 || !strings.Contains("DWE", header[:1]) || header[1] != '1' || header[2] != ' ' {
		return p, false
	}
	p.kind, p.data = header[0], data
	f := strings.SplitN(header[3:], " ", 5)
	if len(f) != 5 {
		return p, false
	}
	if p.timeUS, ok = refCanonical(f[0], 16); !ok {
		return p, false
	}
	if p.stream = f[1]; names.CheckStream(p.stream) != nil {
		return p, false
	}
	if p.id, ok = refCanonical(f[2], 19); !ok || p.id < 1 {
		return p, false
	}
	if p.event = f[3]; p.event != "" && names.CheckEvent(p.event) != nil {
		return p, false
	}
	nstr, rest, hasTags := strings.Cut(f[4], " ")
	n, ok := refCanonical(nstr, 3)
	if !ok || n > 64 || (n == 0) == hasTags {
		return p, false
	}
	for i := int64(0); i < n; i++ {
		lstr, after, ok := strings.Cut(rest, ":")
		l, ok2 := refCanonical(lstr, 3)
		if !ok || !ok2 || l < 1 || l > 200 || int64(len(after)) < l {
			return p, false
		}
		tag := after[:l]
		if !utf8.ValidString(tag) || strings.ContainsFunc(tag, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return p, false
		}
		p.tags = append(p.tags, tag)
		rest = after[l:]
		if i < n-1 {
			if !strings.HasPrefix(rest, " ") {
				return p, false
			}
			rest = rest[1:]
		}
	}
	if rest != "" && n > 0 {
		return p, false
	}
	if p.kind == 'W' && (p.event != "" || n != 0 || p.data != "") {
		return p, false
	}
	return p, true
}

func FuzzParsePayload(f *testing.F) {
	for _, s := range []string{
		"D1 1764584040123456 orders/42 7 created 1 6:user:7\n{\"total\":3}",
		"D1 1764584040123456 s 1  0\n",
		"W1 1764584040123456 big/stream 123  0\n",
		"E1 1764584040123456 chat:room 9 typing 2 6:user:7 10:role:admin\nline1\nline2",
		"E1 1 a 1  1 5:a b:c\n",
		"D1 1 s 9223372036854775807  0\nx",
		"D1 1 s 9223372036854775808  0\nx",
		"D1 01 s 1  0\n",
		"D1 1 s 1  2 1:a\n",
		"D1 1 s 1  1 9:ab\n",
		"D1 1 s 1  1 3:a\nb\n",
		"W1 1 s 1  0\nx",
		"X1 1 s 1  0\n",
		"D1 1 s 1  0 \n",
		"D1 1 s 1  00\n",
		"D1 1 é 1  0\n",
		`{"stream":"s","id":1}`,
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		orig := bytes.Clone(src)
		var p store.Payload
		err := store.ParsePayload(src, &p)
		if !bytes.Equal(src, orig) {
			t.Fatal("ParsePayload modified its input")
		}
		ref, refOK := refParsePayload(string(src))
		if (err == nil) != refOK {
			t.Fatalf("ParsePayload err=%v, reference accepts=%v for %q", err, refOK, src)
		}
		if err != nil {
			if p.Stream != nil || p.Kind != 0 || p.ID != 0 {
				t.Fatalf("rejected payload left a partial route: %+v", p)
			}
			return
		}
		var tags []string
		p.Tags(func(tag []byte) bool { tags = append(tags, string(tag)); return true })
		got := refPayload{kind: byte(p.Kind), timeUS: p.TimeUS, stream: string(p.Stream), id: p.ID,
			event: string(p.Event), tags: tags, data: string(p.Data)}
		if p.NTags != len(tags) {
			t.Fatalf("NTags %d, Tags yields %d", p.NTags, len(tags))
		}
		if !assert.Equal(t, ref, got, "%q", src) {
			t.FailNow()
		}
		if re := store.AppendPayload(nil, &p, nil); !bytes.Equal(re, src) {
			t.Fatalf("re-encodes to %q, want %q", re, src)
		}
		var tb [][]byte
		for _, tag := range tags {
			tb = append(tb, []byte(tag))
		}
		if re := store.AppendPayload(nil, &p, tb); !bytes.Equal(re, src) {
			t.Fatalf("re-encodes with explicit tags to %q, want %q", re, src)
		}
	})
}

// The payloads pgsse.publish and pgsse.broadcast actually send, captured with a plain
// LISTEN, parse and carry exactly what was published.
func TestPayloadFromSQLParses(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	conn, err := pgconn.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, _, err = store.Migrate(ctx, conn)
	require.NoError(t, err)

	cfg, err := pgconn.ParseConfig(dsn)
	require.NoError(t, err)
	payloads := make(chan string, 64)
	cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) { payloads <- n.Payload }
	lconn, err := pgconn.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer lconn.Close(ctx)
	_, err = lconn.Exec(ctx, "LISTEN "+store.Channel).ReadAll()
	require.NoError(t, err)
	next := func() string {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		for {
			select {
			case p := <-payloads:
				return p
			default:
			}
			require.NoError(t, lconn.WaitForNotification(wctx))
		}
	}

	tooBig := strings.Repeat("€", 3000) // 9000 bytes
	tests := []struct {
		name      string
		ephemeral bool
		stream    string
		data      string
		event     string
		audience  []string
		wantKind  store.Kind
	}{
		{"plain", false, "orders/42", `{"total":3}`, "", nil, store.KindDurable},
		{"event and tags", false, "a.b_c:d@e/f=g+h~i-j", "x", "order.created", []string{"user:7", "role:admin"}, store.KindDurable},
		{"newlines", false, "s", "a\nb\r\nc\r\n\n", "m", nil, store.KindDurable},
		{"utf-8 everywhere", false, "s", "ü€𝄞", "", []string{"gruppe:müller", "tag with space"}, store.KindDurable},
		{"empty data", false, "s", "", "", nil, store.KindDurable},
		{"max names", false, strings.Repeat("s", 200), "d", strings.Repeat("e", 64), []string{strings.Repeat("t", 200)}, store.KindDurable},
		{"wake", false, "big", tooBig, "ev", []string{"t"}, store.KindWake},
		{"ephemeral", true, "chat/1", "typing…", "typing", []string{"user:1"}, store.KindEphemeral},
		{"ephemeral plain", true, "chat/1", "", "", nil, store.KindEphemeral},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var id int64
			if tc.ephemeral {
				require.NoError(t, store.Broadcast(ctx, conn, tc.stream, tc.data, tc.event, tc.audience))
			} else {
				id, err = store.Publish(ctx, conn, tc.stream, tc.data, tc.event, tc.audience)
				require.NoError(t, err)
			}
			raw := next()
			var p store.Payload
			require.NoError(t, store.ParsePayload([]byte(raw), &p), "%q", raw)
			ref, ok := refParsePayload(raw)
			require.True(t, ok, "the reference parser accepts it too")
			assert.Equal(t, tc.wantKind, p.Kind)
			assert.Equal(t, tc.stream, string(p.Stream))
			assert.InDelta(t, time.Now().UnixMicro(), p.TimeUS, float64(10*time.Second/time.Microsecond))
			assert.Equal(t, raw, string(store.AppendPayload(nil, &p, nil)))
			if tc.wantKind == store.KindWake {
				assert.Equal(t, id, p.ID)
				assert.Empty(t, p.Event)
				assert.Empty(t, p.Data)
				assert.Zero(t, p.NTags)
				return
			}
			if !tc.ephemeral {
				assert.Equal(t, id, p.ID)
			}
			assert.Equal(t, tc.event, string(p.Event))
			assert.Equal(t, tc.data, string(p.Data))
			assert.Equal(t, tc.audience, ref.tags)
			var tags []string
			p.Tags(func(tag []byte) bool { tags = append(tags, string(tag)); return true })
			assert.Equal(t, tc.audience, tags)
		})
	}
}
