package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// The first process's /metrics with --procs (docs/scaling.md, Every core of a host: metrics are
// summed over the processes).
//
// Every pgsse_* series is the sum over the first process and each live sibling (scraped from
// the sibling's private socket at each scrape, in parallel, siblingScrapeTimeout each; a
// sibling that does not answer in time is left out of that scrape). Counters, gauges and
// histograms add up sample by sample, series matched by their labels. A counter of a sibling
// that restarted starts again from zero, like any restarted process's: Prometheus's rate()
// treats the drop as a reset. The Go runtime's and the process's own series (go_*, process_*)
// stay the first process's. pgsse_process_sse_connections{process="0".."N-1"} shows how the
// kernel spread the SSE connections (process 0 is the first one).
type procsGatherer struct {
	own prometheus.Gatherer
	sup *supervisor
}

const (
	pgssePrefix          = "pgsse_"
	processConnsFamily   = "pgsse_process_sse_connections"
	sseConnectionsFamily = "pgsse_sse_connections"
)

// protoDelimAccept asks promhttp for the delimited protobuf format (lossless, no parsing of
// text).
var protoDelimAccept = string(expfmt.NewFormat(expfmt.TypeProtoDelim))

func (g procsGatherer) Gather() ([]*dto.MetricFamily, error) {
	fams, err := g.own.Gather()
	if fams == nil {
		return nil, err
	}
	live := g.sup.live()
	scraped := make(map[int][]*dto.MetricFamily, len(live))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for slot, path := range live {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, serr := scrapeSibling(path)
			if serr != nil {
				g.sup.log.Debug("metrics: a sibling did not answer; left out of this scrape", "slot", slot, "err", serr)
				return
			}
			mu.Lock()
			scraped[slot] = f
			mu.Unlock()
		}()
	}
	wg.Wait()
	return mergeProcs(fams, scraped), err
}

// scrapeSibling reads a sibling's registry from its metrics socket.
func scrapeSibling(path string) ([]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(context.Background(), siblingScrapeTimeout)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, "GET", "http://sibling/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", protoDelimAccept)
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, errors.New("status " + resp.Status)
	}
	dec := expfmt.NewDecoder(resp.Body, expfmt.ResponseFormat(resp.Header))
	var out []*dto.MetricFamily
	for {
		mf := &dto.MetricFamily{}
		if err := dec.Decode(mf); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if strings.HasPrefix(mf.GetName(), pgssePrefix) {
			out = append(out, mf)
		}
	}
}

// mergeProcs adds the siblings' pgsse_* families into own (the first process's families),
// and appends pgsse_process_sse_connections. own is modified.
func mergeProcs(own []*dto.MetricFamily, siblings map[int][]*dto.MetricFamily) []*dto.MetricFamily {
	byName := make(map[string]*dto.MetricFamily, len(own))
	for _, mf := range own {
		byName[mf.GetName()] = mf
	}
	perProc := []*dto.Metric{processGauge(0, connections(own))}
	slots := make([]int, 0, len(siblings))
	for slot := range siblings {
		slots = append(slots, slot)
	}
	sort.Ints(slots)
	for _, slot := range slots {
		perProc = append(perProc, processGauge(slot, connections(siblings[slot])))
		for _, mf := range siblings[slot] {
			if mine := byName[mf.GetName()]; mine == nil {
				byName[mf.GetName()] = mf
				own = append(own, mf)
			} else if mine.GetType() == mf.GetType() {
				addFamily(mine, mf)
			}
		}
	}
	gauge := dto.MetricType_GAUGE
	own = append(own, &dto.MetricFamily{
		Name:   ptr(processConnsFamily),
		Help:   ptr("Subscribed SSE connections per process of --procs (0 is the first process)."),
		Type:   &gauge,
		Metric: perProc,
	})
	sort.Slice(own, func(i, j int) bool { return own[i].GetName() < own[j].GetName() })
	return own
}

func ptr[T any](v T) *T { return &v }

// connections is a process's pgsse_sse_connections.
func connections(fams []*dto.MetricFamily) float64 {
	for _, mf := range fams {
		if mf.GetName() == sseConnectionsFamily && len(mf.Metric) == 1 {
			return mf.Metric[0].GetGauge().GetValue()
		}
	}
	return 0
}

func processGauge(slot int, v float64) *dto.Metric {
	return &dto.Metric{
		Label: []*dto.LabelPair{{Name: ptr("process"), Value: ptr(strconv.Itoa(slot))}},
		Gauge: &dto.Gauge{Value: ptr(v)},
	}
}

// addFamily adds each series of from to the series of into with the same labels (or appends
// it). Both families have the same type.
func addFamily(into, from *dto.MetricFamily) {
	index := make(map[string]*dto.Metric, len(into.Metric))
	for _, m := range into.Metric {
		index[labelKey(m)] = m
	}
	for _, m := range from.Metric {
		mine := index[labelKey(m)]
		if mine == nil {
			into.Metric = append(into.Metric, m)
			continue
		}
		switch into.GetType() {
		case dto.MetricType_COUNTER:
			mine.Counter.Value = ptr(mine.GetCounter().GetValue() + m.GetCounter().GetValue())
		case dto.MetricType_GAUGE:
			mine.Gauge.Value = ptr(mine.GetGauge().GetValue() + m.GetGauge().GetValue())
		case dto.MetricType_UNTYPED:
			mine.Untyped.Value = ptr(mine.GetUntyped().GetValue() + m.GetUntyped().GetValue())
		case dto.MetricType_HISTOGRAM:
			addHistogram(mine.Histogram, m.Histogram)
		}
	}
}

// addHistogram adds b's observations into a (same bucket bounds: the same pgsse binary).
func addHistogram(a, b *dto.Histogram) {
	if a == nil || b == nil || len(a.Bucket) != len(b.Bucket) {
		return
	}
	a.SampleCount = ptr(a.GetSampleCount() + b.GetSampleCount())
	a.SampleSum = ptr(a.GetSampleSum() + b.GetSampleSum())
	for i, bk := range a.Bucket {
		if bk.GetUpperBound() != b.Bucket[i].GetUpperBound() {
			continue
		}
		bk.CumulativeCount = ptr(bk.GetCumulativeCount() + b.Bucket[i].GetCumulativeCount())
	}
}

// labelKey identifies a series within its family.
func labelKey(m *dto.Metric) string {
	var b strings.Builder
	for _, l := range m.Label {
		b.WriteString(l.GetName())
		b.WriteByte(0)
		b.WriteString(l.GetValue())
		b.WriteByte(0)
	}
	return b.String()
}
