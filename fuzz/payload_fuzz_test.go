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
	// kind P
	prev, part, parts, anon int64
	joins, leaves           []string
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
	if !ok || len(header) < 3 || !strings.Contains("DWEP", header[:1]) || header[1] != '1' || header[2] != ' ' {
		return p, false
	}
	p.kind, p.data = header[0], data
	if p.kind == 'P' {
		return refParsePresence(header, data)
	}
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
	if p.event = f[3]; p.event != "" && names.CheckEventSyntax(p.event) != nil {
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

// refSubject is the rule for a presence subject (and an audience tag): 1–200 bytes of
// UTF-8 without control characters.
func refSubject(s string) bool {
	return len(s) >= 1 && len(s) <= 200 && utf8.ValidString(s) &&
		!strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f })
}

// refParsePresence is the P format of store's package doc written the obvious way.
func refParsePresence(header, data string) (refPayload, bool) {
	p := refPayload{kind: 'P'}
	if data != "" {
		return p, false
	}
	f := strings.SplitN(header[3:], " ", 10)
	if len(f) < 9 {
		return p, false
	}
	nums := make([]int64, 0, 8)
	for i, digits := range []int{16, 0, 19, 19, 2, 2, 19, 4, 4} {
		if i == 1 {
			if p.stream = f[1]; names.CheckStream(p.stream) != nil {
				return p, false
			}
			continue
		}
		v, ok := refCanonical(f[i], digits)
		if !ok {
			return p, false
		}
		nums = append(nums, v)
	}
	p.timeUS, p.id, p.prev, p.part, p.parts, p.anon = nums[0], nums[1], nums[2], nums[3], nums[4], nums[5]
	nj, nl := nums[6], nums[7]
	if p.id < 1 || p.prev >= p.id || p.parts > 64 || p.part > p.parts || (p.part == 0) != (p.parts == 0) ||
		(p.parts == 0 && nj+nl > 0) {
		return p, false
	}
	rest, hasRest := "", len(f) == 10
	if hasRest {
		rest = f[9]
	}
	if (nj+nl == 0) == hasRest {
		return p, false
	}
	for i := int64(0); i < nj+nl; i++ {
		lstr, after, ok2 := strings.Cut(rest, ":")
		l, ok3 := refCanonical(lstr, 3)
		if !ok2 || !ok3 || l < 1 || l > 200 || int64(len(after)) < l || !refSubject(after[:l]) {
			return p, false
		}
		if i < nj {
			p.joins = append(p.joins, after[:l])
		} else {
			p.leaves = append(p.leaves, after[:l])
		}
		rest = after[l:]
		if i < nj+nl-1 {
			if !strings.HasPrefix(rest, " ") {
				return p, false
			}
			rest = rest[1:]
		}
	}
	return p, rest == ""
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
		"P1 1700000000000000 room/1 17 12 1 1 3 1 1 6:user:9 6:user:7\n",
		"P1 1 s 1 0 1 1 2 0 0\n",
		"P1 1 s 9 3 2 3 0 2 0 5:a b:c 2:é\n",
		"P1 1 s 9 8 0 0 4 0 0\n",
		"P1 1 s 9 9 1 1 0 0 0\n",
		"P1 1 s 9 8 1 1 0 1 0 1:x\nx",
		"P1 1 s 9 8 1 1 0 0 1 3:a\tb\n",
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
		var joins, leaves [][]byte
		if p.Kind == store.KindPresence {
			got.prev, got.part, got.parts, got.anon = p.Prev, int64(p.Part), int64(p.Parts), p.Anonymous
			p.Joins(func(s []byte) bool { got.joins = append(got.joins, string(s)); joins = append(joins, s); return true })
			p.Leaves(func(s []byte) bool {
				got.leaves = append(got.leaves, string(s))
				leaves = append(leaves, s)
				return true
			})
			if p.NJoin != len(got.joins) || p.NLeave != len(got.leaves) {
				t.Fatalf("NJoin %d, NLeave %d; Joins yields %d, Leaves %d", p.NJoin, p.NLeave, len(got.joins), len(got.leaves))
			}
			if joins == nil {
				joins = [][]byte{}
			}
			if re := store.AppendPresencePayload(nil, &p, joins, leaves); !bytes.Equal(re, src) {
				t.Fatalf("re-encodes from its lists to %q, want %q", re, src)
			}
		}
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

// The presence payloads pgsse.presence_flush actually sends parse, the reference parser
// agrees, their parts stay within the NOTIFY limit, and together they carry exactly the
// changes Flush reports.
func TestPresencePayloadFromSQLParses(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	conn, err := pgconn.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, _, err = store.Migrate(ctx, conn)
	require.NoError(t, err)

	cfg, err := pgconn.ParseConfig(dsn)
	require.NoError(t, err)
	var payloads []string
	cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) { payloads = append(payloads, n.Payload) }
	lconn, err := pgconn.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer lconn.Close(ctx)
	_, err = lconn.Exec(ctx, "LISTEN "+store.Channel).ReadAll()
	require.NoError(t, err)

	a, err := store.NewPresence(store.PresenceConfig{Key: "fuzz-a :1 #0", Interval: time.Second})
	require.NoError(t, err)
	b, err := store.NewPresence(store.PresenceConfig{Key: "fuzz-b :1 #0", Interval: time.Second})
	require.NoError(t, err)
	wide := func(n, size int, prefix string) []store.PresenceCount {
		out := make([]store.PresenceCount, n)
		for i := range out {
			sub := prefix + strconv.Itoa(i)
			out[i] = store.PresenceCount{Stream: "wide/" + prefix, Sub: sub + strings.Repeat("ü", (size-len(sub))/2), Connections: 1}
		}
		return out
	}
	steps := []struct {
		name    string
		p       *store.Presence
		changes []store.PresenceCount
	}{
		{"join with odd subjects", a, []store.PresenceCount{{Stream: "room/1", Sub: "user:7", Connections: 1},
			{Stream: "room/1", Sub: "a b:c \"q\" \\", Connections: 2}, {Stream: "room/1", Sub: "€𝄞", Connections: 1},
			{Stream: "room/1", Sub: "", Connections: 3}}},
		{"anonymous only", b, []store.PresenceCount{{Stream: "room/1", Sub: "", Connections: 1}}},
		{"a leave and a join", a, []store.PresenceCount{{Stream: "room/1", Sub: "user:7", Connections: 0},
			{Stream: "room/1", Sub: "user:8", Connections: 1}}},
		{"several parts", b, wide(400, 150, "p")},
		{"too many parts: re-read", a, wide(3000, 200, "w")},
		{"everything leaves", a, append(wide(3000, 200, "w"), store.PresenceCount{Stream: "room/1", Sub: "", Connections: 0})},
	}
	for i := range steps[len(steps)-1].changes[:3000] {
		steps[len(steps)-1].changes[i].Connections = 0
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			payloads = nil
			res, err := st.p.Flush(ctx, conn, st.changes)
			require.NoError(t, err)
			// Read until every change's last part is in.
			var got []store.PresenceChange
			var wake []bool
			var cur *store.PresenceChange
			for len(got) < len(res.Changes) {
				for len(payloads) == 0 {
					wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					require.NoError(t, lconn.WaitForNotification(wctx))
					cancel()
				}
				raw := payloads[0]
				payloads = payloads[1:]
				require.LessOrEqual(t, len(raw), store.MaxPayload)
				var p store.Payload
				require.NoError(t, store.ParsePayload([]byte(raw), &p), "%q", raw)
				require.Equal(t, store.KindPresence, p.Kind)
				ref, ok := refParsePayload(raw)
				require.True(t, ok, "the reference parser accepts %q", raw)
				assert.Equal(t, raw, string(store.AppendPayload(nil, &p, nil)))
				if p.Parts == 0 {
					got = append(got, store.PresenceChange{Stream: string(p.Stream), Seq: p.ID, Prev: p.Prev, Anonymous: p.Anonymous})
					wake = append(wake, true)
					continue
				}
				if p.Part == 1 {
					cur = &store.PresenceChange{Stream: string(p.Stream), Seq: p.ID, Prev: p.Prev, Anonymous: p.Anonymous}
				}
				require.NotNil(t, cur)
				cur.Joins = append(cur.Joins, ref.joins...)
				cur.Leaves = append(cur.Leaves, ref.leaves...)
				if p.Part == p.Parts {
					got = append(got, *cur)
					wake = append(wake, false)
					cur = nil
				}
			}
			require.Len(t, got, len(res.Changes))
			for i, c := range res.Changes {
				if wake[i] {
					// Sent as part 0 of 0 (the consumer re-reads the stream): too many
					// subjects for 64 parts of 7999 bytes; the numbers still match.
					assert.Greater(t, len(c.Joins)+len(c.Leaves), store.MaxPresenceParts*store.MaxPayload/210)
					c.Joins, c.Leaves = nil, nil
				}
				assert.Equal(t, c, got[i])
			}
		})
	}
}
