package telemetry

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"testing"
)

// go_gc_gomemlimit_bytes is the memory limit in force at the scrape.
func TestGoMemLimitMetric(t *testing.T) {
	const limit = 7<<30 + 12345
	old := debug.SetMemoryLimit(limit)
	defer debug.SetMemoryLimit(old)
	got := gather(t, NewMetrics(Sources{}))
	if v, ok := value(got["go_gc_gomemlimit_bytes"], nil); !ok || v != limit {
		t.Fatalf("go_gc_gomemlimit_bytes = %v (found %v), want %d", v, ok, limit)
	}
}

// go_gc_duration_seconds is a summary of the GC pauses with the
// Prometheus Go collector's quantiles.
func TestGCDurationSummary(t *testing.T) {
	runtime.GC()
	runtime.GC()
	m := NewMetrics(Sources{})
	got := gather(t, m)
	ms := got["go_gc_duration_seconds"]
	if len(ms) != 1 || ms[0].GetSummary() == nil {
		t.Fatalf("go_gc_duration_seconds = %v, want one summary", ms)
	}
	s := ms[0].GetSummary()
	var qs, vs []float64
	for _, q := range s.GetQuantile() {
		qs = append(qs, q.GetQuantile())
		vs = append(vs, q.GetValue())
	}
	if !slices.Equal(qs, []float64{0, 0.25, 0.5, 0.75, 1}) {
		t.Fatalf("quantiles %v", qs)
	}
	if !slices.IsSorted(vs) || vs[4] <= 0 {
		t.Errorf("quantile values %v, want rising to a positive maximum", vs)
	}
	// Two collections stop the world at least twice each.
	if s.GetSampleCount() < 4 {
		t.Errorf("count = %d, want at least 4 pauses after two collections", s.GetSampleCount())
	}
	n := float64(s.GetSampleCount())
	if sum := s.GetSampleSum(); sum < n*vs[0] || sum > n*vs[4] || sum <= 0 {
		t.Errorf("sum = %v, want within count × [min, max] = [%v, %v]", sum, n*vs[0], n*vs[4])
	}
}

func TestPauseSummary(t *testing.T) {
	inf := math.Inf(1)
	qs := []float64{0, 0.25, 0.5, 0.75, 1}
	cases := []struct {
		name  string
		h     metrics.Float64Histogram
		want  []float64
		sum   float64
		count uint64
	}{
		{name: "empty", h: metrics.Float64Histogram{Counts: []uint64{0, 0}, Buckets: []float64{0, 1, inf}},
			want: []float64{0, 0, 0, 0, 0}},
		{name: "spread", h: metrics.Float64Histogram{Counts: []uint64{1, 0, 2, 1, 0}, Buckets: []float64{0, 1, 2, 3, 4, inf}},
			// ranks 1, 1, 2, 3, 4 of four values in [0,1) [2,3) [2,3) [3,4)
			want: []float64{0, 1, 3, 3, 4}, sum: 0.5 + 2*2.5 + 3.5, count: 4},
		{name: "one value", h: metrics.Float64Histogram{Counts: []uint64{0, 1, 0}, Buckets: []float64{1, 2, 4, 8}},
			want: []float64{2, 4, 4, 4, 4}, sum: 3, count: 1},
		{name: "infinite bounds", h: metrics.Float64Histogram{Counts: []uint64{1, 1}, Buckets: []float64{math.Inf(-1), 5, inf}},
			want: []float64{5, 5, 5, 5, 5}, sum: 10, count: 2},
	}
	for _, tc := range cases {
		q, sum, count := pauseSummary(&tc.h, qs)
		if !slices.Equal(q, tc.want) || sum != tc.sum || count != tc.count {
			t.Errorf("%s: quantiles %v sum %v count %d; want %v %v %d", tc.name, q, sum, count, tc.want, tc.sum, tc.count)
		}
	}
}
