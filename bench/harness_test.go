//go:build linux

package bench

import (
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Quick sanity tests of the harness itself (what `go test ./bench/...` runs): the decoder the
// load client counts events with, the histogram its percentiles come from, the event data.

func TestMain(m *testing.M) {
	if spec := os.Getenv(holdEnv); spec != "" {
		os.Exit(holdFromEnv(spec)) // a holder process of scenario 10 (BenchmarkScenario10Procs)
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

func chunk(parts ...string) string {
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(strings.ToUpper(strconvHex(len(p))))
		b.WriteString(";ext=1\r\n")
		b.WriteString(p)
		b.WriteString("\r\n")
	}
	return b.String()
}

func strconvHex(n int) string {
	const digits = "0123456789abcdef"
	if n == 0 {
		return "0"
	}
	var s []byte
	for n > 0 {
		s = append([]byte{digits[n%16]}, s...)
		n /= 16
	}
	return string(s)
}

func TestStreamDecode(t *testing.T) {
	body := "retry: 2000\n:ok\n\nid: 1\ndata: 1 100xx\n\n:\nid: 2\r\nevent: e\r\ndata: 2 200\r\n\r\n"
	want := []string{"1 100xx", "2 200"}
	// The chunked form splits events across chunks, as net/http does when its buffer fills.
	chunked := chunk(body[:10], body[10:31], body[31:]) + "0\r\n\r\n"
	for _, tc := range []struct {
		name    string
		raw     string
		chunked bool
	}{
		{"close-delimited", body, false},
		{"chunked", chunked, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Every split point into two reads, and one byte at a time.
			for split := 0; split <= len(tc.raw); split++ {
				s := Stream{Chunked: tc.chunked}
				var got []string
				on := func(v []byte) { got = append(got, string(v)) }
				s.Feed([]byte(tc.raw[:split]), on)
				s.Feed([]byte(tc.raw[split:]), on)
				require.Equal(t, want, got, "split at %d", split)
				assert.Equal(t, int64(2), s.Comments)
				assert.Zero(t, s.Bad)
				assert.Equal(t, tc.chunked, s.Ended)
			}
			s := Stream{Chunked: tc.chunked}
			var got []string
			for i := range len(tc.raw) {
				s.Feed([]byte{tc.raw[i]}, func(v []byte) { got = append(got, string(v)) })
			}
			assert.Equal(t, want, got)
		})
	}
}

func TestStreamDecodeBadChunk(t *testing.T) {
	s := Stream{Chunked: true}
	s.Feed([]byte("zz\r\ndata: 1 1\n\n"), func([]byte) { t.Fatal("data after a bad chunk size") })
	assert.Equal(t, int64(1), s.Bad)
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
