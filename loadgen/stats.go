package loadgen

import (
	"math"
	"math/rand/v2"
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

// maxSamples bounds the durations a sampler keeps (8 MiB each); a
// variable so tests can lower it.
var maxSamples = 1 << 20

// sampler keeps the count, sum and maximum of every duration added and a
// uniform random sample of at most maxSamples of them (reservoir sampling,
// Algorithm R), so a long run's percentiles cost bounded memory: exact up
// to maxSamples calls, estimated from the sample beyond.
type sampler struct {
	n       int64
	sum     time.Duration
	max     time.Duration
	samples []time.Duration
}

// add records d; rng picks which samples a full reservoir replaces.
func (s *sampler) add(d time.Duration, rng *rand.Rand) {
	s.n++
	s.sum += d
	s.max = max(s.max, d)
	if len(s.samples) < maxSamples {
		s.samples = append(s.samples, d)
		return
	}
	if j := rng.Int64N(s.n); j < int64(len(s.samples)) {
		s.samples[j] = d
	}
}

// latency summarises the sampler: count, mean and max exact, percentiles
// from the sample.
func (s *sampler) latency() Latency {
	if s.n == 0 {
		return Latency{}
	}
	l := summarize(s.samples)
	l.Count = int(s.n)
	l.Max = float64(s.max.Nanoseconds()) / 1e3
	l.Mean = float64(s.sum.Nanoseconds()) / 1e3 / float64(s.n)
	return l
}
