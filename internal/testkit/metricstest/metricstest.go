// Package metricstest is the one Prometheus scraper of pgsse's tests and load harness: it
// reads /metrics (the text format, with github.com/prometheus/common/expfmt) or a registry in
// the test's own process, and picks one series by name and labels, as a PromQL selector does:
// `pgsse_dropped_total{reason="slow_client"}`, `pgsse_publish_batch_size_count`,
// `pgsse_delivery_lag_seconds_bucket{le="0.005"}`.
//
// Its test helpers fail the test when the series is not there — a missing series is not a
// zero (an assertion `0 == metric(…)` on a renamed or never-registered series must fail);
// MetricOrAbsent is for the tests where absence is the point.
package metricstest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Scrape is one read of a set of metric families.
type Scrape struct {
	Source   string // where it came from, for messages
	families map[string]*dto.MetricFamily
}

// Parse reads the Prometheus text format.
func Parse(r io.Reader, source string) (*Scrape, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	return &Scrape{Source: source, families: fams}, nil
}

// Get scrapes url (a /metrics endpoint) within ctx.
func Get(ctx context.Context, url string) (*Scrape, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(b)))
	}
	return Parse(resp.Body, url)
}

// Gather reads a registry of this process.
func Gather(g prometheus.Gatherer, source string) (*Scrape, error) {
	fams, err := g.Gather()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	s := &Scrape{Source: source, families: make(map[string]*dto.MetricFamily, len(fams))}
	for _, f := range fams {
		s.families[f.GetName()] = f
	}
	return s, nil
}

// Series is one sample: a family's name (with _count, _sum or _bucket for the parts of a
// histogram or summary), its labels and value.
type Series struct {
	Name   string
	Labels map[string]string
	Value  float64
}

func (s Series) String() string {
	keys := make([]string, 0, len(s.Labels))
	for k := range s.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(s.Name)
	if len(keys) > 0 {
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%s=%q", k, s.Labels[k])
		}
		b.WriteByte('}')
	}
	return b.String() + " " + strconv.FormatFloat(s.Value, 'g', -1, 64)
}

// Families lists the family names, sorted.
func (s *Scrape) Families() []string {
	names := make([]string, 0, len(s.families))
	for n := range s.families {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Series lists every sample of the family called name (a histogram's or a summary's parts
// under their own names), in the order of the exposition.
func (s *Scrape) Series(name string) []Series {
	f := s.families[name]
	if f == nil {
		return nil
	}
	var out []Series
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		with := func(extra, value string) map[string]string {
			c := make(map[string]string, len(labels)+1)
			for k, v := range labels {
				c[k] = v
			}
			c[extra] = value
			return c
		}
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			out = append(out, Series{name, labels, m.GetCounter().GetValue()})
		case dto.MetricType_GAUGE:
			out = append(out, Series{name, labels, m.GetGauge().GetValue()})
		case dto.MetricType_UNTYPED:
			out = append(out, Series{name, labels, m.GetUntyped().GetValue()})
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			h := m.GetHistogram()
			inf := false
			for _, b := range h.GetBucket() {
				inf = math.IsInf(b.GetUpperBound(), 1)
				out = append(out, Series{name + "_bucket", with("le", formatBound(b.GetUpperBound())), float64(b.GetCumulativeCount())})
			}
			if !inf { // a registry leaves the +Inf bucket implicit; the text format has it
				out = append(out, Series{name + "_bucket", with("le", "+Inf"), float64(h.GetSampleCount())})
			}
			out = append(out, Series{name + "_sum", labels, h.GetSampleSum()}, Series{name + "_count", labels, float64(h.GetSampleCount())})
		case dto.MetricType_SUMMARY:
			sm := m.GetSummary()
			for _, q := range sm.GetQuantile() {
				out = append(out, Series{name, with("quantile", formatBound(q.GetQuantile())), q.GetValue()})
			}
			out = append(out, Series{name + "_sum", labels, sm.GetSampleSum()}, Series{name + "_count", labels, float64(sm.GetSampleCount())})
		}
	}
	return out
}

func formatBound(v float64) string {
	if math.IsInf(v, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// ErrAbsent says that no series matches a selector.
var ErrAbsent = errors.New("no such series")

// Lookup returns the value of the one series that selector matches: the name, and every
// label the selector gives with that value (the series may have more). No match is
// ErrAbsent (wrapped, with what the family does have); several matches, or a malformed
// selector, are other errors.
func (s *Scrape) Lookup(selector string) (float64, error) {
	name, want, err := ParseSelector(selector)
	if err != nil {
		return 0, err
	}
	family := name
	if s.families[family] == nil {
		for _, suffix := range []string{"_count", "_sum", "_bucket"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && s.families[base] != nil {
				family = base
			}
		}
	}
	all := s.Series(family)
	var match []Series
	for _, se := range all {
		if se.Name == name && labelsMatch(se.Labels, want) {
			match = append(match, se)
		}
	}
	switch {
	case len(match) == 1:
		return match[0].Value, nil
	case len(match) > 1:
		return 0, fmt.Errorf("%s: %d series match %s (name the labels that tell them apart): %s",
			s.Source, len(match), selector, list(match))
	case s.families[family] == nil:
		return 0, fmt.Errorf("%s: %s: %w (no family %s; %s)", s.Source, selector, ErrAbsent, name, s.near(name))
	case len(all) > 0 && all[0].Name != name && family == name:
		return 0, fmt.Errorf("%s: %s: %w (%s is a %s: select %s_count, %s_sum or a bucket)",
			s.Source, selector, ErrAbsent, name, strings.ToLower(s.families[family].GetType().String()), name, name)
	default:
		return 0, fmt.Errorf("%s: %s: %w (the family has: %s)", s.Source, selector, ErrAbsent, list(all))
	}
}

func labelsMatch(have, want map[string]string) bool {
	for k, v := range want {
		got, ok := have[k]
		if !ok {
			return false
		}
		if k == "le" || k == "quantile" {
			a, errA := strconv.ParseFloat(got, 64)
			b, errB := strconv.ParseFloat(v, 64)
			if errA == nil && errB == nil && a == b {
				continue
			}
		}
		if got != v {
			return false
		}
	}
	return true
}

func list(ss []Series) string {
	if len(ss) == 0 {
		return "no series"
	}
	var parts []string
	for i, s := range ss {
		if i == 12 {
			parts = append(parts, fmt.Sprintf("… %d more", len(ss)-i))
			break
		}
		parts = append(parts, s.String())
	}
	return strings.Join(parts, "; ")
}

// near names the families that share name's first two words, for a message about a typo.
func (s *Scrape) near(name string) string {
	words := strings.SplitN(name, "_", 3)
	prefix := strings.Join(words[:min(2, len(words))], "_")
	var near []string
	for _, f := range s.Families() {
		if strings.HasPrefix(f, prefix) {
			near = append(near, f)
		}
	}
	if len(near) == 0 {
		return fmt.Sprintf("%d families, none named %s…", len(s.families), prefix)
	}
	return "families named " + prefix + "…: " + strings.Join(near, ", ")
}

// ParseSelector splits `name{label="value",…}` into the name and the labels.
func ParseSelector(sel string) (string, map[string]string, error) {
	name, rest, hasLabels := strings.Cut(sel, "{")
	name = strings.TrimSpace(name)
	labels := map[string]string{}
	if name == "" || strings.ContainsAny(name, " \t\"}=,") {
		return "", nil, fmt.Errorf("selector %q: want name{label=\"value\",…}", sel)
	}
	if !hasLabels {
		return name, labels, nil
	}
	rest, ok := strings.CutSuffix(strings.TrimSpace(rest), "}")
	if !ok {
		return "", nil, fmt.Errorf("selector %q: no closing }", sel)
	}
	for rest = strings.TrimSpace(rest); rest != ""; {
		key, after, ok := strings.Cut(rest, "=")
		key = strings.TrimSpace(key)
		after = strings.TrimSpace(after)
		if !ok || key == "" || !strings.HasPrefix(after, `"`) {
			return "", nil, fmt.Errorf("selector %q: want label=\"value\" at %q", sel, rest)
		}
		value, tail, err := quoted(after)
		if err != nil {
			return "", nil, fmt.Errorf("selector %q: %v", sel, err)
		}
		labels[key] = value
		tail = strings.TrimSpace(tail)
		if tail != "" && !strings.HasPrefix(tail, ",") {
			return "", nil, fmt.Errorf("selector %q: want , between labels at %q", sel, tail)
		}
		rest = strings.TrimSpace(strings.TrimPrefix(tail, ","))
	}
	return name, labels, nil
}

// quoted reads a "…" string with \" \\ \n escapes from the start of s.
func quoted(s string) (value, rest string, err error) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; c {
		case '"':
			return b.String(), s[i+1:], nil
		case '\\':
			if i+1 == len(s) {
				return "", "", errors.New("unfinished escape")
			}
			i++
			switch s[i] {
			case 'n':
				b.WriteByte('\n')
			default:
				b.WriteByte(s[i])
			}
		default:
			b.WriteByte(c)
		}
	}
	return "", "", errors.New("unfinished label value")
}

// --- test helpers -----------------------------------------------------------------------

// Fetch scrapes url (within 10 s) or fails the test.
func Fetch(t testing.TB, url string) *Scrape {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := Get(ctx, url)
	if err != nil {
		t.Fatalf("metricstest: %v", err)
	}
	return s
}

// Metric scrapes url and returns the value of the series selector picks; a series that
// is not there fails the test.
func Metric(t testing.TB, url, selector string) float64 {
	t.Helper()
	return Fetch(t, url).Metric(t, selector)
}

// MetricOrAbsent is Metric for a test where the series may rightly be missing: ok is false
// then. A malformed or ambiguous selector still fails the test.
func MetricOrAbsent(t testing.TB, url, selector string) (v float64, ok bool) {
	t.Helper()
	return Fetch(t, url).MetricOrAbsent(t, selector)
}

// Metric returns the value of the series selector picks, failing the test when there is
// none.
func (s *Scrape) Metric(t testing.TB, selector string) float64 {
	t.Helper()
	v, err := s.Lookup(selector)
	if err != nil {
		t.Fatalf("metricstest: %v", err)
	}
	return v
}

// MetricOrAbsent returns the value of the series selector picks, and whether there is one.
func (s *Scrape) MetricOrAbsent(t testing.TB, selector string) (float64, bool) {
	t.Helper()
	v, err := s.Lookup(selector)
	if errors.Is(err, ErrAbsent) {
		return 0, false
	}
	if err != nil {
		t.Fatalf("metricstest: %v", err)
	}
	return v, true
}

// Value reads a counter or gauge of this process (safe from any goroutine). Any other kind
// fails the test: a histogram has no single value (Gather it and select _count or _sum).
func Value(t testing.TB, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatalf("metricstest: %s: %v", m.Desc(), err)
	}
	switch {
	case d.Counter != nil:
		return d.Counter.GetValue()
	case d.Gauge != nil:
		return d.Gauge.GetValue()
	case d.Untyped != nil:
		return d.Untyped.GetValue()
	}
	t.Fatalf("metricstest: %s has no single value (a histogram or summary)", m.Desc())
	return 0
}
