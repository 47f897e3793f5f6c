package store

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// BenchmarkPublishCommitLatency splits the "committed" stage of one durable event published
// alone (scenario 9 (e): one event every 20 ms) into what PostgreSQL's backend does and how
// long it waits: per transaction, the wall time from handing the statement to the
// connection to the COMMIT's answer (p50), and the backend's CPU time and run-queue wait
// (/proc/<pid>/schedstat; the cluster must be local). Each shape runs back to back (gap 0)
// and with the scenario's 20 ms between transactions, in the same run:
//
//	publisher  the Publisher's protocol: the statement with a Flush, its answer (the xid),
//	           then Sync (COMMIT): two round trips
//	one-write  the same statement and Sync in one write: one round trip (what the Publisher
//	           cannot do: it must know the xid before COMMIT goes out, to learn the outcome
//	           of a COMMIT whose answer is lost)
//	select-1   SELECT 1 (the floor of a round trip through a backend)
//
//	scripts/pg.sh with go test -run '^$' -bench BenchmarkPublishCommitLatency -benchtime 300x ./store/
func BenchmarkPublishCommitLatency(b *testing.B) {
	dsn := migrated(b)
	ctx := context.Background()
	for _, gap := range []time.Duration{0, 20 * time.Millisecond} {
		for _, shape := range []string{"publisher", "one-write", "select-1"} {
			b.Run(shape+"/gap-"+gap.String(), func(b *testing.B) {
				c := connect(b, dsn)
				oid := messageOIDOf(b, c)
				stmt, err := c.Prepare(ctx, "bench_pm", publishSQL, nil)
				require.NoError(b, err)
				pid := backendPID(b, c)
				events := []*PublishEvent{{Data: []byte(`{"seq":12345,"t":1764584040123456789}`)}}
				var buf []byte
				var lat []time.Duration
				run := func(i int) {
					events[0].Stream = "bench/" + strconv.Itoa(i%100)
					buf = appendMessageArray(buf[:0], oid, events)
					t0 := time.Now()
					switch shape {
					case "publisher":
						pl := c.StartPipeline(ctx)
						pl.SendQueryStatement(stmt, [][]byte{buf}, []int16{1}, []int16{1, 1, 1})
						pl.SendFlushRequest()
						require.NoError(b, pl.Flush())
						res, err := pl.GetResults()
						require.NoError(b, err)
						_, err = res.(*pgconn.ResultReader).Close()
						require.NoError(b, err)
						pl.SendPipelineSync()
						require.NoError(b, pl.Flush())
						_, err = pl.GetResults()
						require.NoError(b, err)
						require.NoError(b, pl.Close())
					case "one-write":
						require.NoError(b, c.ExecPrepared(ctx, stmt.Name, [][]byte{buf}, []int16{1}, []int16{1, 1, 1}).Read().Err)
					default:
						require.NoError(b, c.ExecParams(ctx, "SELECT 1", nil, nil, nil, nil).Read().Err)
					}
					lat = append(lat, time.Since(t0))
				}
				for i := range 50 {
					run(i) // plans cached, counter rows exist
				}
				lat = lat[:0]
				cpu0, wait0 := schedTimes(b, pid)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					run(i)
					if gap > 0 {
						time.Sleep(gap)
					}
				}
				b.StopTimer()
				cpu1, wait1 := schedTimes(b, pid)
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(b.N), "backend-cpu-µs/tx")
				b.ReportMetric(float64((wait1-wait0).Microseconds())/float64(b.N), "backend-wait-µs/tx")
			})
		}
	}
}

// schedTimes is a local process's time on a CPU and waiting for one (/proc/<pid>/schedstat).
func schedTimes(t testing.TB, pid int) (cpu, wait time.Duration) {
	t.Helper()
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/schedstat")
	require.NoError(t, err, "the benchmark reads the backend's schedstat: the cluster must run on this machine")
	f := strings.Fields(string(raw))
	require.Len(t, f, 3)
	c, err := strconv.ParseInt(f[0], 10, 64)
	require.NoError(t, err)
	w, err := strconv.ParseInt(f[1], 10, 64)
	require.NoError(t, err)
	return time.Duration(c), time.Duration(w)
}

// BenchmarkPublisherSentStage measures the sent stage (Submit → the transaction handed to
// the connection) of a request to an idle Publisher, submitted by a goroutine that goes on
// running and then blocks in a raw system call, as the engine's loop does (epoll_wait): with
// Submit yielding to the worker it woke, and without (the worker then waits for another thread
// to be woken to run it). One event every 20 ms, as in scenario 9 (e).
//
//	scripts/pg.sh with go test -run '^$' -bench BenchmarkPublisherSentStage -benchtime 200x ./store/
func BenchmarkPublisherSentStage(b *testing.B) {
	dsn := migrated(b)
	for _, yield := range []bool{true, false} {
		name := "yield"
		if !yield {
			name = "no-yield"
		}
		b.Run(name, func(b *testing.B) {
			p := newTestPublisher(b, PublisherConfig{DatabaseURL: dsn}, testHooks{testNoYield: !yield})
			var fds [2]int
			require.NoError(b, unix.Pipe2(fds[:], unix.O_CLOEXEC))
			defer unix.Close(fds[0])
			defer unix.Close(fds[1])
			var sent []time.Duration
			publish := func(i int) {
				var r PublishResult
				require.NoError(b, p.Submit(one("sent/"+strconv.Itoa(i%50), `{"a":1}`), func(res PublishResult) {
					r = res
					_, _ = unix.Write(fds[1], []byte{1})
				}))
				for t := time.Now(); time.Since(t) < 10*time.Microsecond; { // the rest of the loop's pass
				}
				var x [1]byte
				_, err := unix.Read(fds[0], x[:]) // a raw system call: the caller's thread keeps its P
				require.NoError(b, err)
				require.NoError(b, r.Err)
				sent = append(sent, r.Times.Sent.Sub(r.Times.Queued))
			}
			for i := range 20 {
				publish(i)
			}
			sent = sent[:0]
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				publish(i)
				time.Sleep(20 * time.Millisecond)
			}
			b.StopTimer()
			slices.Sort(sent)
			b.ReportMetric(float64(sent[len(sent)/2].Microseconds()), "sent-p50-µs")
			b.ReportMetric(float64(sent[len(sent)*9/10].Microseconds()), "sent-p90-µs")
		})
	}
}
