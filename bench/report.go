package bench

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// WriteTable writes a Markdown table: one row per scenario and metric, one column per
// target in order, then the ratio of the first target to the second (pgsse/baseline).
func WriteTable(w io.Writer, targets []string, results []*Result) {
	fmt.Fprintf(w, "| scenario | metric | unit |")
	for _, t := range targets {
		fmt.Fprintf(w, " %s |", t)
	}
	if len(targets) == 2 {
		fmt.Fprintf(w, " %s/%s |", targets[0], targets[1])
	}
	fmt.Fprintln(w)
	fmt.Fprint(w, "|---|---|---|")
	for range targets {
		fmt.Fprint(w, "---:|")
	}
	if len(targets) == 2 {
		fmt.Fprint(w, "---:|")
	}
	fmt.Fprintln(w)
	type key struct{ scenario, metric string }
	var order []key
	seen := map[key]bool{}
	vals := map[key]map[string]Metric{}
	for _, r := range results {
		for _, m := range r.Metrics {
			k := key{r.Scenario, m.Name}
			if !seen[k] {
				seen[k] = true
				order = append(order, k)
				vals[k] = map[string]Metric{}
			}
			vals[k][r.Target] = m
		}
	}
	for _, k := range order {
		var unit string
		for _, m := range vals[k] {
			unit = m.Unit
		}
		fmt.Fprintf(w, "| %s | %s | %s |", k.scenario, k.metric, unit)
		for _, t := range targets {
			if m, ok := vals[k][t]; ok {
				fmt.Fprintf(w, " %s |", FormatValue(m.Value))
			} else {
				fmt.Fprint(w, " – |")
			}
		}
		if len(targets) == 2 {
			a, okA := vals[k][targets[0]]
			b, okB := vals[k][targets[1]]
			if okA && okB && b.Value != 0 {
				fmt.Fprintf(w, " %s |", FormatRatio(a.Value/b.Value))
			} else {
				fmt.Fprint(w, " – |")
			}
		}
		fmt.Fprintln(w)
	}
	var notes []string
	for _, r := range results {
		for _, n := range r.Notes {
			notes = append(notes, fmt.Sprintf("- %s, %s: %s", r.Scenario, r.Target, n))
		}
	}
	if len(notes) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, strings.Join(notes, "\n"))
	}
}

// FormatValue prints v with about three significant digits.
func FormatValue(v float64) string {
	switch a := math.Abs(v); {
	case v == math.Trunc(v) && a < 1e7:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}

// FormatRatio prints a ratio as "0.12×".
func FormatRatio(r float64) string {
	if math.IsInf(r, 0) || math.IsNaN(r) {
		return "–"
	}
	return FormatValue(r) + "×"
}

// CompareIsolation adds to each server's scenario 6 result its time-to-last p99 relative to
// its scenario 3 result (issue 7: within 20 %), when both ran.
func CompareIsolation(results []*Result) {
	for _, r6 := range results {
		if r6.Scenario != "6 isolation" {
			continue
		}
		for _, r3 := range results {
			if r3.Scenario == "3 fan-out" && r3.Target == r6.Target {
				if v := r3.Get("time to last subscriber p99"); v > 0 {
					r6.Metrics = append(r6.Metrics, Metric{Name: "time to last p99 ÷ scenario 3's", Unit: "×",
						Value: r6.Get("time to last subscriber p99") / v, Lower: true})
				}
			}
		}
	}
}
