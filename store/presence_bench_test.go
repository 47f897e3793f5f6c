package store

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkPresenceFlush measures one interval's Flush with 10,000 subjects joining one
// stream (and, untimed, leaving again before the next), as in a reconnect storm, next to a
// stream of 10,000 that stays; statements/op counts what went over the wire (1 each).
//
//	scripts/pg.sh with go test -run '^$' -bench BenchmarkPresenceFlush -benchtime 20x ./store/
func BenchmarkPresenceFlush(b *testing.B) {
	dsn := migrated(b)
	var n atomic.Int64
	c := countedConnect(b, dsn, &n)
	p, err := NewPresence(PresenceConfig{Key: "bench :1 #0", Interval: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	counts := func(stream string, conns int) []PresenceCount {
		out := make([]PresenceCount, 10000)
		for i := range out {
			out[i] = PresenceCount{stream, "user:" + strconv.Itoa(i), conns}
		}
		return out
	}
	if _, err := p.Flush(ctx, c, counts("bench/steady", 1)); err != nil {
		b.Fatal(err)
	}
	join, leave := counts("bench/storm", 1), counts("bench/storm", 0)
	var statements int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		before := n.Load()
		res, err := p.Flush(ctx, c, join)
		if err != nil {
			b.Fatal(err)
		}
		statements += n.Load() - before
		if len(res.Changes) != 1 || len(res.Changes[0].Joins) != 10000 {
			b.Fatalf("changes %d", len(res.Changes))
		}
		b.StopTimer()
		if _, err := p.Flush(ctx, c, leave); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(statements)/float64(b.N), "statements/op")
}
