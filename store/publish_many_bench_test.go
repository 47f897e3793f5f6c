package store

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// BenchmarkPublishManyBackendCPU measures what one group of the Publisher costs the
// PostgreSQL backend that runs it, per event: the Publisher's own statement (binary
// pgsse.message[], prepared) as one implicit transaction per group, events spread over
// 100 streams as in scenario 9 (a group of 30 then touches ≈ 26 of them). The figure
// is the backend's CPU time (/proc/<pid>/schedstat: the cluster must be local), which
// depends far less on other work sharing the machine than wall time does; for
// comparison, pgsse.publish's per event, one transaction each, in the same run.
//
// The "-one-stream" variants put a whole group in one stream (a different one per group),
// so that the cost per transaction, per event and per stream can be told apart: with c(n, s)
// the backend-µs/tx of n events over s streams, c(300, 1) − c(30, 1) is 270 events' worth,
// what is left of c(30, 1) is the transaction's own, and c(30, 26) − c(30, 1) is 25 streams'.
//
//	scripts/pg.sh with go test -run '^$' -bench BenchmarkPublishManyBackendCPU -benchtime 2000x ./store/
func BenchmarkPublishManyBackendCPU(b *testing.B) {
	dsn := migrated(b)
	data := []byte(`{"seq":12345,"t":1764584040123456789,"pad":"xxxxxxxxxxxxxxxxxxxxxxxx"}`)
	ctx := context.Background()

	for _, v := range []struct {
		size      int
		oneStream bool
	}{{1, false}, {30, false}, {300, false}, {30, true}, {300, true}} {
		size, name := v.size, "publish_many-"+strconv.Itoa(v.size)
		if v.oneStream {
			name += "-one-stream"
		}
		b.Run(name, func(b *testing.B) {
			c := connect(b, dsn)
			oid := messageOIDOf(b, c)
			stmt, err := c.Prepare(ctx, "bench_pm", publishSQL, nil)
			require.NoError(b, err)
			events := make([]*PublishEvent, size)
			for i := range events {
				events[i] = &PublishEvent{Data: data}
			}
			var buf []byte
			next := 0
			run := func(n int) {
				for range n {
					for i := range events {
						events[i].Stream = "bench/" + strconv.Itoa(next%100)
						if !v.oneStream || i == len(events)-1 {
							next += 7 // 100 streams, neighbours in a group mostly distinct
						}
					}
					buf = appendMessageArray(buf[:0], oid, events)
					res := c.ExecPrepared(ctx, stmt.Name, [][]byte{buf}, []int16{1}, []int16{1, 1, 1}).Read()
					require.NoError(b, res.Err)
				}
			}
			run(20) // plans cached, counter rows exist
			pid := backendPID(b, c)
			cpu0 := schedCPU(b, pid)
			b.ResetTimer()
			run(b.N)
			b.StopTimer()
			cpu := float64(schedCPU(b, pid)-cpu0) / 1e3
			b.ReportMetric(cpu/float64(b.N*size), "backend-µs/event")
			b.ReportMetric(cpu/float64(b.N), "backend-µs/tx")
		})
	}

	b.Run("publish", func(b *testing.B) {
		c := connect(b, dsn)
		run := func(n int) {
			for i := range n {
				_, err := Publish(ctx, c, "bench/"+strconv.Itoa(i%100), string(data), "", nil)
				require.NoError(b, err)
			}
		}
		run(20)
		pid := backendPID(b, c)
		cpu0 := schedCPU(b, pid)
		b.ResetTimer()
		run(b.N)
		b.StopTimer()
		b.ReportMetric(float64(schedCPU(b, pid)-cpu0)/1e3/float64(b.N), "backend-µs/event")
	})
}

func messageOIDOf(t testing.TB, c *pgconn.PgConn) uint32 {
	t.Helper()
	res := execSQL(t, c, "SELECT 'pgsse.message'::regtype::oid")
	oid, err := strconv.ParseUint(string(res[0].Rows[0][0]), 10, 32)
	require.NoError(t, err)
	return uint32(oid)
}

func backendPID(t testing.TB, c *pgconn.PgConn) int {
	t.Helper()
	res := execSQL(t, c, "SELECT pg_backend_pid()")
	pid, err := strconv.Atoi(string(res[0].Rows[0][0]))
	require.NoError(t, err)
	return pid
}

// schedCPU is the CPU time a local process has run, from /proc/<pid>/schedstat.
func schedCPU(t testing.TB, pid int) time.Duration {
	t.Helper()
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/schedstat")
	require.NoError(t, err, "the benchmark reads the backend's CPU time: the cluster must run on this machine")
	ns, err := strconv.ParseInt(strings.Fields(string(raw))[0], 10, 64)
	require.NoError(t, err)
	return time.Duration(ns)
}
