package store

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// BenchmarkPublish measures durable events/s, all in one run on one database: 64
// concurrent submitters through one Publisher (group commit) with one and with two
// connections, against 8 connections each calling SELECT pgsse.publish($1, $2) in its
// own transaction. b.N events in all, over 100 streams; ratios between the sub-benchmarks
// are the figures to quote.
//
//	scripts/pg.sh with go test -run '^$' -bench BenchmarkPublish -benchtime 20000x ./store/
func BenchmarkPublish(b *testing.B) {
	dsn := migrated(b)
	data := []byte(`{"order":42,"status":"paid"}`)
	stream := func(i int64) string { return "bench/" + strconv.FormatInt(i%100, 10) }
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	for _, conns := range []int{1, 2} {
		b.Run("publisher-64-submitters-"+strconv.Itoa(conns)+"-conns", func(b *testing.B) {
			var groups groupLog
			p := newTestPublisher(b, PublisherConfig{DatabaseURL: dsn, Conns: conns, Logger: quiet, Observe: groups.observe}, testHooks{})
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
						req := &PublishRequest{Events: []PublishEvent{{Stream: stream(i), Data: data}}}
						if r := publishSync(b, p, req); r.Err != nil {
							b.Error(r.Err)
							return
						}
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
			groups.mu.Lock()
			b.ReportMetric(float64(b.N)/float64(len(groups.groups)), "events/tx")
			groups.mu.Unlock()
		})
	}

	b.Run("publish-8-conns", func(b *testing.B) {
		var next atomic.Int64
		var wg sync.WaitGroup
		ctx := context.Background()
		conns := make([]*pgconn.PgConn, 8)
		for i := range conns {
			conns[i] = connect(b, dsn)
		}
		b.ResetTimer()
		start := time.Now()
		for _, c := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
					if _, err := Publish(ctx, c, stream(i), string(data), "", nil); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		b.StopTimer()
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
	})
}
