package telemetry

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/hopper-sidecar/hopper/retry"
)

// The histogram's buckets are cumulative with a +Inf bucket equal to the
// count; a value on a bound falls in that bound's bucket.
func TestHistogramExposition(t *testing.T) {
	m := NewMetrics(Sources{Queues: []string{"q"}})
	q := m.ForQueue("q")
	for _, d := range []time.Duration{500 * time.Microsecond, time.Millisecond, 3 * time.Millisecond, time.Minute} {
		q.Decided(retry.Outcome{Kind: retry.Response, Status: 200}, true, retry.Decision{Action: retry.Ack}, d)
	}
	h := gather(t, m)["hopper_delivery_duration_seconds"]
	if len(h) != 1 {
		t.Fatalf("histogram series = %d, want 1", len(h))
	}
	hist := h[0].GetHistogram()
	if hist.GetSampleCount() != 4 {
		t.Errorf("count = %d, want 4", hist.GetSampleCount())
	}
	if want := 0.0005 + 0.001 + 0.003 + 60; hist.GetSampleSum() < want-1e-9 || hist.GetSampleSum() > want+1e-9 {
		t.Errorf("sum = %v, want %v", hist.GetSampleSum(), want)
	}
	want := map[float64]uint64{0.001: 2, 0.0025: 2, 0.005: 3, 30: 3}
	for _, b := range hist.GetBucket() {
		if w, ok := want[b.GetUpperBound()]; ok && b.GetCumulativeCount() != w {
			t.Errorf("bucket le=%v = %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), w)
		}
	}
	if v, ok := m.Value("hopper_delivery_duration_seconds", map[string]string{"queue": "q"}); !ok || v != 4 {
		t.Errorf("Value of the histogram = %v %v, want its count 4", v, ok)
	}
}

// Label values are escaped so that any queue name stays one valid line.
func TestLabelEscaping(t *testing.T) {
	name := "odd \"queue\"\\name\nline"
	m := NewMetrics(Sources{Queues: []string{name}})
	m.InFlight(3)
	found := false
	for _, s := range gather(t, m)["hopper_in_flight"] {
		for _, l := range s.GetLabel() {
			if l.GetName() == "queue" && l.GetValue() == name {
				found = s.GetGauge().GetValue() == 3
			}
		}
	}
	if !found {
		t.Error("the queue name did not come back unchanged through the text format")
	}
}

// Concurrent deliveries lose no increments.
func TestConcurrentCounts(t *testing.T) {
	m := NewMetrics(Sources{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				m.Decided(retry.Outcome{Kind: retry.Response, Status: 204}, true, retry.Decision{Action: retry.Ack}, time.Millisecond)
				m.InFlight(1)
				m.InFlight(-1)
			}
		}()
	}
	wg.Wait()
	if v, _ := m.Value("hopper_deliveries_total", map[string]string{"outcome": "ack", "status_class": "2xx"}); v != 8000 {
		t.Errorf("acks = %v, want 8000", v)
	}
	if v, _ := m.Value("hopper_in_flight", nil); v != 0 {
		t.Errorf("in flight = %v, want 0", v)
	}
}

// The runtime's and the process's metrics come with the rest.
func TestRuntimeMetrics(t *testing.T) {
	got := gather(t, NewMetrics(Sources{}))
	for _, name := range []string{"go_goroutines", "go_threads", "go_memstats_alloc_bytes", "go_gc_cycles_total",
		"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds", "process_max_fds",
		"process_start_time_seconds"} {
		v, ok := value(got[name], nil)
		if !ok || v <= 0 {
			if name == "go_gc_cycles_total" && ok {
				continue // may be 0 in a short test
			}
			t.Errorf("%s = %v (found %v), want a positive value", name, v, ok)
		}
	}
	if _, ok := value(got["go_info"], nil); !ok {
		t.Error("no go_info")
	}
}

// Families come out sorted by name, each with one HELP and TYPE line.
func TestExpositionShape(t *testing.T) {
	m := NewMetrics(Sources{})
	var buf bytes.Buffer
	if err := m.reg.write(&buf); err != nil {
		t.Fatal(err)
	}
	var names []string
	seen := map[string]bool{}
	for _, line := range strings.Split(buf.String(), "\n") {
		if name, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name = strings.Fields(name)[0]
			if seen[name] {
				t.Errorf("TYPE of %s twice", name)
			}
			seen[name] = true
			names = append(names, name)
		}
	}
	var hopper []string
	for _, n := range names {
		if strings.HasPrefix(n, "hopper_") {
			hopper = append(hopper, n)
		}
	}
	for i := 1; i < len(hopper); i++ {
		if hopper[i-1] > hopper[i] {
			t.Errorf("%s before %s", hopper[i-1], hopper[i])
		}
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	if _, err := parser.TextToMetricFamilies(&buf); err != nil {
		t.Fatal(err)
	}
}
