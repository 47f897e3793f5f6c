package store

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// presencePayload builds and parses one P payload.
func presencePayload(t *testing.T, stream string, seq, prev int64, part, parts int, anon int64, joins, leaves []string) *Payload {
	t.Helper()
	toBytes := func(l []string) [][]byte {
		out := [][]byte{}
		for _, s := range l {
			out = append(out, []byte(s))
		}
		return out
	}
	p := &Payload{TimeUS: 1, Stream: []byte(stream), ID: seq, Prev: prev, Part: part, Parts: parts, Anonymous: anon}
	raw := AppendPresencePayload(nil, p, toBytes(joins), toBytes(leaves))
	var out Payload
	require.NoError(t, ParsePayload(raw, &out), "%q", raw)
	return &out
}

func TestPresenceViewFollowsChanges(t *testing.T) {
	v := NewPresenceView("room")
	// Before the first snapshot: kept.
	assert.Equal(t, PresenceBuffered, v.Apply(presencePayload(t, "room", 5, 3, 1, 1, 1, []string{"c"}, nil)))
	assert.Equal(t, PresenceIgnored, v.Apply(presencePayload(t, "other", 6, 0, 1, 1, 0, []string{"x"}, nil)))
	require.True(t, v.Reset(PresenceSnapshot{Stream: "room", Seq: 3, Anonymous: 2,
		Subjects: []PresenceSubject{{"a", 1}, {"b", 2}}}))
	assert.True(t, v.Synced())
	assert.Equal(t, []string{"a", "b", "c"}, v.Present(), "the kept change applied after the snapshot")
	assert.Equal(t, int64(5), v.Seq())
	v.TakeChanges() // a full present event was sent

	// Two parts, then a change that only moves the anonymous count.
	assert.Equal(t, PresenceApplied, v.Apply(presencePayload(t, "room", 9, 5, 1, 2, 4, []string{"d"}, nil)))
	assert.Equal(t, []string{"a", "b", "c"}, v.Present(), "nothing until the last part")
	assert.Equal(t, PresenceApplied, v.Apply(presencePayload(t, "room", 9, 5, 2, 2, 4, nil, []string{"a"})))
	assert.Equal(t, []string{"b", "c", "d"}, v.Present())
	assert.Equal(t, PresenceIgnored, v.Apply(presencePayload(t, "room", 9, 5, 2, 2, 4, nil, []string{"a"})), "a duplicate")
	joins, leaves, anon, changed := v.TakeChanges()
	assert.Equal(t, []string{"d"}, joins)
	assert.Equal(t, []string{"a"}, leaves)
	assert.Equal(t, int64(4), anon)
	assert.True(t, changed)
	_, _, _, changed = v.TakeChanges()
	assert.False(t, changed)

	// A subject that leaves and comes back between two events is neither.
	v.Apply(presencePayload(t, "room", 10, 9, 1, 1, 4, nil, []string{"b"}))
	v.Apply(presencePayload(t, "room", 11, 10, 1, 1, 3, []string{"b"}, nil))
	joins, leaves, anon, changed = v.TakeChanges()
	assert.Empty(t, joins)
	assert.Empty(t, leaves)
	assert.Equal(t, int64(3), anon)
	assert.True(t, changed, "the anonymous count moved")

	// Everyone leaves; the stream's next change starts from prev 0.
	v.Apply(presencePayload(t, "room", 12, 11, 1, 1, 0, nil, []string{"b", "c", "d"}))
	assert.Empty(t, v.Present())
	assert.Equal(t, PresenceApplied, v.Apply(presencePayload(t, "room", 20, 0, 1, 1, 0, []string{"e"}, nil)))
	assert.Equal(t, []string{"e"}, v.Present())
}

func TestPresenceViewNeedsReadOnGaps(t *testing.T) {
	synced := func() *PresenceView {
		v := NewPresenceView("s")
		require.True(t, v.Reset(PresenceSnapshot{Stream: "s", Seq: 10, Subjects: []PresenceSubject{{"a", 1}}}))
		v.TakeChanges() // the full present event
		return v
	}
	for _, tc := range []struct {
		name string
		p    []*Payload
	}{
		{"a change missed", []*Payload{presencePayload(t, "s", 12, 11, 1, 1, 0, []string{"b"}, nil)}},
		{"prev 0 while someone is present", []*Payload{presencePayload(t, "s", 12, 0, 1, 1, 0, []string{"b"}, nil)}},
		{"too large to list", []*Payload{presencePayload(t, "s", 11, 10, 0, 0, 0, nil, nil)}},
		{"first part missed", []*Payload{presencePayload(t, "s", 11, 10, 2, 2, 0, []string{"b"}, nil)}},
		{"middle part missed", []*Payload{presencePayload(t, "s", 11, 10, 1, 3, 0, []string{"b"}, nil),
			presencePayload(t, "s", 11, 10, 3, 3, 0, []string{"c"}, nil)}},
		{"a new change before the last part", []*Payload{presencePayload(t, "s", 11, 10, 1, 2, 0, []string{"b"}, nil),
			presencePayload(t, "s", 12, 11, 1, 1, 0, []string{"c"}, nil)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := synced()
			var last PresenceApply
			for _, p := range tc.p {
				last = v.Apply(p)
			}
			assert.Equal(t, PresenceNeedRead, last)
			assert.False(t, v.Synced())
			assert.Equal(t, []string{"a"}, v.Present(), "nothing half applied")
			assert.Equal(t, PresenceBuffered, v.Apply(presencePayload(t, "s", 30, 29, 1, 1, 0, nil, nil)))
		})
	}

	// The snapshot read after a gap, then what arrived meanwhile.
	v := synced()
	assert.Equal(t, PresenceNeedRead, v.Apply(presencePayload(t, "s", 13, 12, 1, 1, 0, []string{"c"}, nil)))
	v.Apply(presencePayload(t, "s", 14, 13, 1, 1, 0, nil, []string{"a"}))
	require.True(t, v.Reset(PresenceSnapshot{Stream: "s", Seq: 13, Subjects: []PresenceSubject{{"a", 1}, {"b", 1}, {"c", 1}}}))
	assert.Equal(t, []string{"b", "c"}, v.Present())
	joins, leaves, _, _ := v.TakeChanges()
	assert.Equal(t, []string{"b", "c"}, joins, "what the view missed counts as joins")
	assert.Equal(t, []string{"a"}, leaves)

	// A snapshot that the kept notifications do not follow, and an overflow: read again.
	v = synced()
	v.Desync()
	v.Apply(presencePayload(t, "s", 20, 19, 1, 1, 0, nil, nil))
	assert.False(t, v.Reset(PresenceSnapshot{Stream: "s", Seq: 15}))
	assert.False(t, v.Synced())
	for i := 0; i <= maxPresenceBuffered; i++ {
		v.Apply(presencePayload(t, "s", int64(100+i), int64(99+i), 1, 1, 0, nil, nil))
	}
	assert.False(t, v.Reset(PresenceSnapshot{Stream: "s", Seq: 99}))
	assert.True(t, v.Reset(PresenceSnapshot{Stream: "s", Seq: 500}))
}

// Three writers churn subjects on one stream while a consumer follows the notifications
// with a PresenceView that starts from a snapshot taken in the middle of it: at the end
// the view holds exactly what the table holds.
func TestPresenceViewMatchesTable(t *testing.T) {
	dsn := migrated(t)
	ctx := context.Background()
	cfg, err := pgconn.ParseConfig(dsn)
	require.NoError(t, err)
	var payloads []string
	cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) {
		if n.Channel == Channel {
			payloads = append(payloads, n.Payload)
		}
	}
	lc, err := pgconn.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer lc.Close(ctx)
	_, err = lc.Exec(ctx, "LISTEN "+Channel).ReadAll()
	require.NoError(t, err)
	reader := connect(t, dsn)

	writers := make([]*Presence, 3)
	conns := make([]*pgconn.PgConn, 3)
	for i := range writers {
		writers[i] = newPresence(t, "w"+strconv.Itoa(i)+" :1 #0")
		conns[i] = connect(t, dsn)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	churn := func(rounds int) {
		for r := 0; r < rounds; r++ {
			w := rng.IntN(len(writers))
			var ch []PresenceCount
			for k := 0; k < 1+rng.IntN(30); k++ {
				sub := "u" + strconv.Itoa(rng.IntN(40))
				if rng.IntN(8) == 0 {
					sub = ""
				}
				ch = append(ch, PresenceCount{"room", sub, rng.IntN(3)})
			}
			_, err := writers[w].Flush(ctx, conns[w], ch)
			require.NoError(t, err)
		}
	}
	drain := func(v *PresenceView) {
		// A marker from the reader's connection comes after everything committed before.
		_, err := reader.Exec(ctx, "NOTIFY "+Channel+", 'marker'").ReadAll()
		require.NoError(t, err)
		for {
			for len(payloads) > 0 {
				raw := payloads[0]
				payloads = payloads[1:]
				if raw == "marker" {
					return
				}
				if v == nil {
					continue
				}
				var p Payload
				require.NoError(t, ParsePayload([]byte(raw), &p))
				if v.Apply(&p) == PresenceNeedRead {
					snap, err := ReadPresence(ctx, reader, "room", NoLimit)
					require.NoError(t, err)
					require.True(t, v.Reset(snap))
				}
			}
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			require.NoError(t, lc.WaitForNotification(wctx))
			cancel()
		}
	}
	churn(30)
	drain(nil)
	v := NewPresenceView("room")
	churn(10) // these arrive before the snapshot is read, and some are older than it
	snap, err := ReadPresence(ctx, reader, "room", NoLimit)
	require.NoError(t, err)
	churn(10)
	drain(v) // buffered: the view has no snapshot yet
	require.True(t, v.Reset(snap))
	churn(60)
	drain(v)
	final, err := ReadPresence(ctx, reader, "room", NoLimit)
	require.NoError(t, err)
	var want []string
	for _, s := range final.Subjects {
		want = append(want, s.Sub)
	}
	assert.Equal(t, want, v.Present())
	if final.Seq != 0 { // 0: the last change left the stream empty and its row went
		assert.Equal(t, final.Seq, v.Seq())
	}
	assert.Equal(t, final.Anonymous, v.Anonymous())
}
