package loadgen

import (
	"math"
	"slices"
	"time"
)

// Latency summarises the durations of a set of calls, in microseconds.
// Percentiles are nearest-rank: P50 is the smallest duration at least half
// of the calls took no longer than. All fields are zero when no call was
// made.
type Latency struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50_us"`
	P90   float64 `json:"p90_us"`
	P99   float64 `json:"p99_us"`
	Max   float64 `json:"max_us"`
	Mean  float64 `json:"mean_us"`
}

// summarize computes the Latency of durs (which it sorts in place).
func summarize(durs []time.Duration) Latency {
	if len(durs) == 0 {
		return Latency{}
	}
	slices.Sort(durs)
	var sum time.Duration
	for _, d := range durs {
		sum += d
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	return Latency{
		Count: len(durs),
		P50:   us(percentile(durs, 0.50)),
		P90:   us(percentile(durs, 0.90)),
		P99:   us(percentile(durs, 0.99)),
		Max:   us(durs[len(durs)-1]),
		Mean:  us(sum) / float64(len(durs)),
	}
}

// percentile is the nearest-rank p-quantile of sorted (0 < p ≤ 1): the
// element at rank ⌈p·n⌉.
func percentile(sorted []time.Duration, p float64) time.Duration {
	rank := int(math.Ceil(p * float64(len(sorted))))
	if rank < 1 {
		rank = 1
	}
	if rank > len(sorted) {
		rank = len(sorted)
	}
	return sorted[rank-1]
}
