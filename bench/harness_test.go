//go:build linux

package bench

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgsse/pgsse/internal/testkit/ssetest"
)

// Quick sanity tests of the harness itself (what `go test ./bench/...` runs): what the load
// client counts events with, the histogram its percentiles come from, the event data.

func TestMain(m *testing.M) {
	if spec := os.Getenv(holdEnv); spec != "" {
		os.Exit(holdFromEnv(spec)) // a holder process of scenario 10 (BenchmarkScenario10Procs)
	}
	if spec := os.Getenv(deployClientEnv); spec != "" {
		os.Exit(deployClientFromEnv(spec)) // a client process of scenario 17 (TestDeploy…)
	}
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

// The load client decodes with internal/testkit/ssetest's Decoder (tested there, chunked
// bodies included): here, that it counts what the scenarios report.
func TestClientDecoderCounts(t *testing.T) {
	sc := &sseConn{s: ssetest.Decoder{Eager: true, MaxLine: maxLine}}
	var data []string
	on := func(b *ssetest.Block) {
		if b.HasData {
			data = append(data, string(b.Data))
		}
	}
	body := "retry: 2000\n:pgsse\nid: 1\ndata: 1 100xx\n\n:\n:\nid: 2\r\ndata: 2 200\r\n\r\n:" // a heartbeat not yet whole
	for i := range len(body) {
		sc.s.Feed([]byte{body[i]}, on)
	}
	assert.Equal(t, []string{"1 100xx", "2 200"}, data)
	assert.Equal(t, int64(3), sc.s.Comments, "heartbeats count as they arrive, with or without an event after them")
	sc.s.Feed([]byte("data: "+strings.Repeat("x", maxLine)+"\n\n"), on)
	assert.Equal(t, int64(1), sc.s.Bad, "an over-long line is a fault")
}

func TestData(t *testing.T) {
	for _, size := range []int{0, 10, 64, 1024} {
		d := AppendData(nil, 12345, 1700000000123456789, size)
		assert.GreaterOrEqual(t, len(d), size)
		seq, ns, ok := ParseData(d)
		require.True(t, ok)
		assert.Equal(t, int64(12345), seq)
		assert.Equal(t, int64(1700000000123456789), ns)
	}
	for _, bad := range []string{"", "x", "12", "12x3", " 1 2"} {
		_, _, ok := ParseData([]byte(bad))
		assert.False(t, ok, bad)
	}
}

func TestHistogramQuantiles(t *testing.T) {
	var h Histogram
	samples := make([]time.Duration, 0, 100000)
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		v := time.Duration(r.ExpFloat64() * float64(time.Millisecond))
		samples = append(samples, v)
		h.Add(int64(v))
	}
	exact := Quantiles(samples, 0.5, 0.9, 0.99)
	for i, q := range []float64{0.5, 0.9, 0.99} {
		got := h.Quantile(q)
		assert.InEpsilon(t, float64(exact[i]), float64(got), 0.02, "q=%v", q)
	}
	assert.Equal(t, samples[len(samples)-1], h.Quantile(1))
	var m Histogram
	m.Merge(&h)
	m.Add(-5) // a clock step: counted as 0
	assert.Equal(t, int64(100001), m.Count())
	assert.Zero(t, (&Histogram{}).Quantile(0.5))
	for v := int64(0); v < 1<<40; v = v*3 + 1 { // bucket bounds hold every value
		i := bucketOf(v)
		assert.True(t, bucketLow(i) <= v && v < bucketLow(i+1), "v=%d bucket %d", v, i)
	}
}

// bucketQuantile (scenario 12's server-side figures): the bound of the bucket the quantile of
// what was counted between two readings falls in.
func TestBucketQuantile(t *testing.T) {
	les := []float64{0.001, 0.01, 0.1, math.Inf(1)}
	before := []float64{10, 10, 10, 10}   // ten fast ones before: not in the window
	after := []float64{10, 108, 109, 110} // then 98 under 10 ms, one under 100 ms, one over
	assert.Equal(t, 0.01, bucketQuantile(les, before, after, 0.5))
	assert.Equal(t, 0.01, bucketQuantile(les, before, after, 0.98))
	assert.Equal(t, 0.1, bucketQuantile(les, before, after, 0.99))
	assert.True(t, math.IsInf(bucketQuantile(les, before, after, 1), 1))
	assert.Equal(t, 0.001, bucketQuantile(les, nil, after, 0.05), "no earlier reading: from zero")
	assert.Zero(t, bucketQuantile(les, after, after, 0.99), "nothing counted")
	assert.Zero(t, bucketQuantile(nil, nil, nil, 0.99))
}

func TestMetricUnit(t *testing.T) {
	assert.Equal(t, "time-to-last-subscriber-p99-ms", metricUnit(Metric{Name: "time to last subscriber p99", Unit: "ms"}))
	assert.Equal(t, "commit-to-received-p50-ms", metricUnit(Metric{Name: "commit→received p50", Unit: "ms"}))
	assert.Equal(t, "client-cpu-share-2-cores-pct", metricUnit(Metric{Name: "client CPU share (2 cores)", Unit: "%"}))
}

func TestWriteTable(t *testing.T) {
	var b strings.Builder
	WriteTable(&b, []string{"pgsse", "baseline"}, []*Result{
		{Scenario: "1 idle", Target: "pgsse", Metrics: []Metric{{Name: "RSS", Unit: "B", Value: 700}}},
		{Scenario: "1 idle", Target: "baseline", Metrics: []Metric{{Name: "RSS", Unit: "B", Value: 28000}}, Notes: []string{"n"}},
	})
	assert.Contains(t, b.String(), "| 1 idle | RSS | B | 700 | 28000 | 0.025× |")
	assert.Contains(t, b.String(), "- 1 idle, baseline: n")
}

// A server may write the response head and the first events in one segment (a reconnect
// whose catch-up is ready at once): the client reads the head alone and decodes what follows
// as events. A Reconnect client, closed by the server, comes back after the retry: delay with
// Last-Event-ID and keeps its sequence checks across the two connections.
func TestClientEventsWithTheHeadAndReconnect(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	reqs := make(chan string, 2)
	done := make(chan struct{})
	served := make(chan struct{})
	defer func() { close(done); <-served }()
	go func() {
		defer close(served)
		for i := 0; i < 2; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r := bufio.NewReader(c)
			var head strings.Builder
			for {
				l, err := r.ReadString('\n')
				if err != nil {
					c.Close()
					return
				}
				head.WriteString(l)
				if l == "\r\n" {
					break
				}
			}
			reqs <- head.String()
			if i == 0 { // head, retry and two events in one write, then the close
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\nretry: 50\n:pgsse\n\nid: 1\ndata: 1 100\n\nid: 2\ndata: 2 100\n\n")
				c.Close()
				continue
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\nid: 3\ndata: 3 100\n\n")
			<-done // open until the client has closed
			c.Close()
		}
	}()
	c, err := NewClient(ClientConfig{Addr: netip.MustParseAddrPort(ln.Addr().String()), Path: "/streams/x", Sources: 1, MaxSeq: 8, Reconnect: true})
	require.NoError(t, err)
	c.MarkWindow(1, time.Now().UnixNano())
	require.NoError(t, c.Connect(1, false))
	assert.True(t, c.WaitHave(2, 1, 5*time.Second), "the events sent with the head")
	assert.True(t, c.WaitHave(3, 1, 5*time.Second), "the event after the reconnect")
	assert.NotContains(t, <-reqs, "Last-Event-ID")
	assert.Contains(t, <-reqs, "Last-Event-ID: 2\r\n")
	c.Close()
	st := c.Stats()
	assert.Equal(t, int64(3), st.Events)
	assert.Zero(t, st.Gaps+st.Dups+st.Bad)
	assert.Equal(t, int64(1), st.ClosedW[1])
	assert.Equal(t, int64(1), st.ReopenedW[1])
	assert.Equal(t, 1, st.Reconnected)
}

// A slow client is not a short one: while events keep arriving, WaitHaveProgress waits on
// past the time a fixed WaitHave gives up at (scenario 16's small drain under -race on a
// shared machine); once they stop — heartbeats still coming — it gives up after its stall.
func TestClientWaitHaveProgress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	const events = 20 // 3 s of them: longer than the stall the progress wait is given
	done := make(chan struct{})
	served := make(chan struct{})
	defer func() { close(done); <-served }()
	go func() {
		defer close(served)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		for {
			l, err := r.ReadString('\n')
			if err != nil || l == "\r\n" {
				break
			}
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\nretry: 2000\n:pgsse\n\n")
		tick := time.NewTicker(150 * time.Millisecond) // a slow stream: an event every 150 ms, then heartbeats only
		defer tick.Stop()
		for i := 1; ; i++ {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			msg := ":\n"
			if i <= events {
				msg = fmt.Sprintf("id: %d\ndata: %d 100\n\n", i, i)
			}
			if _, err := io.WriteString(c, msg); err != nil {
				return
			}
		}
	}()
	c, err := NewClient(ClientConfig{Addr: netip.MustParseAddrPort(ln.Addr().String()), Path: "/streams/x", Sources: 1, MaxSeq: 32})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Connect(1, false))
	assert.False(t, c.WaitHave(events, 1, 300*time.Millisecond), "a fixed bound calls the slow subscriber short")
	assert.True(t, c.WaitHaveProgress(events, 1, 1500*time.Millisecond, time.Minute), "it had every event, slowly: later than the stall")
	t0 := time.Now()
	assert.False(t, c.WaitHaveProgress(events+1, 1, 500*time.Millisecond, time.Minute), "no event comes after the last")
	assert.Less(t, time.Since(t0), 30*time.Second, "given up at the stall, not at the limit")
	c.Close()
	assert.Positive(t, c.Stats().Comments, "heartbeats came meanwhile")
}

// BenchmarkClientDelivery is the load client's cost per delivery, in wall and CPU time (the
// small scenario 16's drain is bound by it under -race): 200 connections to a local server
// that writes each of them b.N events of 64 bytes of data at once.
func BenchmarkClientDelivery(b *testing.B) {
	const conns = 200
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	var body []byte
	now := time.Now().UnixNano()
	for i := 1; i <= b.N; i++ {
		body = fmt.Appendf(body, "id: %d\ndata: ", i)
		body = AppendData(body, int64(i), now, 64)
		body = append(body, "\n\n"...)
	}
	served := make(chan net.Conn, conns)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				r := bufio.NewReader(c)
				for {
					l, err := r.ReadString('\n')
					if err != nil {
						c.Close()
						return
					}
					if l == "\r\n" {
						break
					}
				}
				_, _ = c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\nretry: 2000\n:pgsse\n\n"))
				served <- c
			}()
		}
	}()
	c, err := NewClient(ClientConfig{Addr: netip.MustParseAddrPort(ln.Addr().String()), Path: "/streams/x", Sources: 4, MaxSeq: b.N + 1})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if err := c.Connect(conns, false); err != nil {
		b.Fatal(err)
	}
	var sc []net.Conn
	for range conns {
		sc = append(sc, <-served)
	}
	defer func() {
		for _, s := range sc {
			s.Close()
		}
	}()
	cpu0 := SelfCPU()
	b.ResetTimer()
	for _, s := range sc {
		go func() { _, _ = s.Write(body) }()
	}
	want := int64(b.N) * conns
	for c.Delivered() < want {
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(want), "ns/delivery")
	b.ReportMetric(float64((SelfCPU()-cpu0).Nanoseconds())/float64(want), "cpu-ns/delivery")
}
