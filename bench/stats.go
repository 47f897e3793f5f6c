package bench

import (
	"math/bits"
	"slices"
	"time"
)

// Histogram is a log-linear histogram of non-negative durations in nanoseconds: 64 linear
// sub-buckets per power of two, so a reported quantile is within 1/64 (1.6 %) of the true
// value. Not safe for concurrent use; Merge per-goroutine histograms afterwards.
type Histogram struct {
	counts [64 * 64]int64
	n      int64
	max    int64
	neg    int64 // negative samples (clock skew between threads), counted as 0
}

const subBits = 6

func bucketOf(v int64) int {
	if v < 64 {
		return int(v)
	}
	e := 63 - bits.LeadingZeros64(uint64(v)) // ≥ 6
	sub := int(v>>(e-subBits)) & 63
	return (e-subBits+1)*64 + sub
}

func bucketLow(i int) int64 {
	if i < 64 {
		return int64(i)
	}
	e := i/64 + subBits - 1
	sub := int64(i % 64)
	return (64 + sub) << (e - subBits)
}

// Add records one sample.
func (h *Histogram) Add(ns int64) {
	if ns < 0 {
		h.neg++
		ns = 0
	}
	h.counts[bucketOf(ns)]++
	h.n++
	h.max = max(h.max, ns)
}

// Merge adds o's samples to h.
func (h *Histogram) Merge(o *Histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.neg += o.neg
	h.max = max(h.max, o.max)
}

// Count is the number of samples.
func (h *Histogram) Count() int64 { return h.n }

// Quantile returns the q-quantile (0 < q ≤ 1): the middle of the bucket holding it, the
// maximum for q = 1. Zero without samples.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	if q >= 1 {
		return time.Duration(h.max)
	}
	rank := int64(q*float64(h.n-1)) + 1
	var seen int64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo, hi := bucketLow(i), bucketLow(i+1)
			return time.Duration(min((lo+hi)/2, h.max))
		}
	}
	return time.Duration(h.max)
}

// Quantiles returns exact quantiles of samples (sorted in place).
func Quantiles(samples []time.Duration, qs ...float64) []time.Duration {
	out := make([]time.Duration, len(qs))
	if len(samples) == 0 {
		return out
	}
	slices.Sort(samples)
	for i, q := range qs {
		k := int(q * float64(len(samples)-1))
		out[i] = samples[min(max(k, 0), len(samples)-1)]
	}
	return out
}
