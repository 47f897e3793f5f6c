package engine

import (
	"fmt"
	"io"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/store"
)

// BenchmarkFanoutDelivery measures the live fan-out path on the loop: one durable event,
// encoded once, written to every live subscriber of its stream over real loopback
// sockets (clients read and discard). It reports allocations per delivery, which the
// design pins at zero in steady state: the per-event costs (the event and its encoding)
// are shared by all subscribers.
//
// streams=8 is the same fan-out to connections that each follow 8 streams (GET /streams,
// docs/http.md: Several streams on one connection), the published one at a position that
// varies with the connection: each delivery carries an id line of the connection's own
// (built per delivery, written in the same writev as the shared encoding).
func BenchmarkFanoutDelivery(b *testing.B) {
	for _, subs := range []int{100, 1000} {
		for _, perPass := range []int{1, 8} {
			for _, k := range []int{1, 8} {
				name := "subs=" + strconv.Itoa(subs) + "/events_per_pass=" + strconv.Itoa(perPass)
				if k > 1 {
					name += "/streams=" + strconv.Itoa(k)
				}
				b.Run(name, func(b *testing.B) { benchFanout(b, subs, perPass, k) })
			}
		}
	}
}

// BenchmarkFanoutSendBuffer compares the live fan-out to fast readers with the SSE sockets'
// send buffers fixed at Config.SSESendBuffer's default (256 KiB) and left to the kernel's
// autotuning (up to tcp_wmem's maximum, 4 MiB): issue 23, bounding the kernel's memory must
// not slow the fan-out down. Both servers run at once and each iteration runs one pass on
// each, timed apart, so that a machine whose load changes meanwhile slows both alike; it
// reports each one's ns/delivery and their ratio (bounded/kernel: 1 = as fast).
func BenchmarkFanoutSendBuffer(b *testing.B) {
	for _, tc := range []struct{ subs, perPass, size int }{{1000, 8, 200}, {200, 8, 8 << 10}} {
		b.Run(fmt.Sprintf("subs=%d/events_per_pass=%d/bytes=%d", tc.subs, tc.perPass, tc.size), func(b *testing.B) {
			type side struct {
				ts   *testServer
				pass func()
				done chan struct{}
				took time.Duration
			}
			var sides [2]side
			for i, size := range []int{DefaultSSESendBuffer, NoLimit} {
				ts, pass, done := fanoutFixture(b, tc.subs, tc.perPass, 1, tc.size, func(c *Config) { c.SSESendBuffer = size })
				sides[i] = side{ts: ts, pass: pass, done: done}
			}
			run := func(sd *side) {
				start := time.Now()
				sd.ts.tasks.push(sd.pass)
				<-sd.done
				sd.took += time.Since(start)
			}
			for range 100 { // warm up: rings full, buffers grown
				run(&sides[0])
				run(&sides[1])
			}
			sides[0].took, sides[1].took = 0, 0
			b.ResetTimer()
			for i := range b.N {
				first := i % 2 // alternate which goes first
				run(&sides[first])
				run(&sides[1-first])
			}
			b.StopTimer()
			deliveries := float64(b.N * tc.subs * tc.perPass)
			bounded, kernel := float64(sides[0].took.Nanoseconds())/deliveries, float64(sides[1].took.Nanoseconds())/deliveries
			b.ReportMetric(bounded, "ns/delivery-256KiB")
			b.ReportMetric(kernel, "ns/delivery-kernel")
			b.ReportMetric(bounded/kernel, "bounded/kernel")
		})
	}
}

// TestFanoutAllocatesNothingPerDelivery pins the zero: with 200 live subscribers and 16
// events per loop pass, one allocation per delivery or per coalesced write would show as
// ≥ 1 alloc per write; the per-event costs (event, encoding, task) amortise to ~0.2.
//
// The same for connections that follow 8 streams each: their composite id lines are built
// per delivery into scratch, never allocated.
func TestFanoutAllocatesNothingPerDelivery(t *testing.T) {
	for _, k := range []int{1, 8} {
		t.Run("streams="+strconv.Itoa(k), func(t *testing.T) { fanoutAllocs(t, k) })
	}
}

func fanoutAllocs(t *testing.T, k int) {
	const subs, perPass = 200, 16 // more than 8 events per pass: x/sys keeps ≤ 8 iovecs on the stack
	ts, pass, done := fanoutFixture(t, subs, perPass, k, 200, nil)
	for i := 0; i < 600; i++ { // steady state: ring full, buffers grown
		ts.tasks.push(pass)
		<-done
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const passes = 300
	for i := 0; i < passes; i++ {
		ts.tasks.push(pass)
		<-done
	}
	runtime.ReadMemStats(&after)
	mallocs := float64(after.Mallocs - before.Mallocs)
	perWrite := mallocs / float64(passes*subs) // one coalesced write per connection per pass
	t.Logf("allocations per delivery: %.4f, per connection write: %.3f", mallocs/float64(passes*subs*perPass), perWrite)
	require.Less(t, perWrite, 0.5, "the live fan-out must not allocate per connection write or per delivery")
}

func benchFanout(b *testing.B, subs, perPass, k int) {
	ts, pass, done := fanoutFixture(b, subs, perPass, k, 200, nil)
	// Warm up: grow the ring, scratch slices and socket buffers to steady state.
	for i := 0; i < 600; i++ {
		ts.tasks.push(pass)
		<-done
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ts.tasks.push(pass)
		<-done
	}
	b.StopTimer()
	runtime.ReadMemStats(&after)
	deliveries := float64(b.N * subs * perPass)
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/deliveries, "allocs/delivery")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/deliveries, "ns/delivery")
}

// fanoutFixture starts a server with subs live subscribers on stream "bench" (reading and
// discarding) and returns a loop task that injects perPass contiguous durable events of size
// bytes and flushes them, signalling done. With k > 1 each subscriber follows k streams on its
// connection (GET /streams), "bench" at position i mod k for the i-th. configure (if not nil)
// adjusts the server's Config.
func fanoutFixture(tb testing.TB, subs, perPass, k, size int, configure func(*Config)) (*testServer, func(), chan struct{}) {
	// One token for every subscriber: no per-subject cap (256 by default would shed the rest).
	ts := startServer(tb, "", func(c *Config) {
		c.Heartbeat = time.Hour
		c.MaxConnectionsPerSubject = NoLimit
		if configure != nil {
			configure(c)
		}
	})
	tok := token(tb, auth.Claims{Streams: []string{"bench", "other/*"}}, time.Hour)
	for i := 0; i < subs; i++ {
		path := "/streams/bench"
		if k > 1 {
			path = "/streams?"
			for j := range k {
				if j == i%k {
					path += "stream=bench&"
				} else {
					path += "stream=other/" + strconv.Itoa(j) + "&"
				}
			}
		}
		c := dial(tb, ts.Addr().String(), path, "Authorization: Bearer "+tok)
		require.Equal(tb, 200, c.Status)
		go func() { _, _ = io.Copy(io.Discard, c.r) }()
	}
	waitFor(tb, 20*time.Second, "all subscribers live", func() bool {
		live := make(chan int, 1)
		ts.tasks.push(func() {
			n := 0
			if st := ts.fan.streams["bench"]; st != nil {
				for _, sub := range st.subs {
					if sub.state == subLive {
						n++
					}
				}
			}
			live <- n
		})
		return <-live == subs
	})

	data := make([]byte, size)
	for i := range data {
		data[i] = 'x'
	}
	var next int64 = 1
	payloads := make([][]byte, perPass)
	done := make(chan struct{}, 1)
	pass := func() {
		ts.enter()
		for k := 0; k < perPass; k++ {
			p := store.Payload{Kind: store.KindDurable, TimeUS: time.Now().UnixMicro(), Stream: []byte("bench"), ID: next, Data: data}
			payloads[k] = store.AppendPayload(payloads[k][:0], &p, nil)
			if err := store.ParsePayload(payloads[k], &ts.lsn.payload); err != nil {
				panic(err)
			}
			ts.fan.onPayload(&ts.lsn.payload)
			next++
		}
		ts.fan.flushStreams(0, true)
		ts.leave()
		done <- struct{}{}
	}
	return ts, pass, done
}
