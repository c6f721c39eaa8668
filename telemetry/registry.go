package telemetry

import (
	"bufio"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// The metrics are kept by a registry of Hopper's own rather than the
// Prometheus client library, which linked a protobuf runtime and its
// collectors into the binary: about 1.4 MB of resident memory in every pod
// for counters, gauges, one histogram and the text format.

type kind int

const (
	counterKind kind = iota
	gaugeKind
	histogramKind
	summaryKind
)

func (k kind) String() string {
	switch k {
	case gaugeKind:
		return "gauge"
	case histogramKind:
		return "histogram"
	case summaryKind:
		return "summary"
	}
	return "counter"
}

// family is one metric name with its series, one per label value set.
type family struct {
	name, help string
	kind       kind
	labels     []string
	buckets    []float64 // upper bounds, histogram only
	// fn, when set, is the value read at each scrape (a series without
	// labels whose state another package owns).
	fn func() float64
	// collect, when set, refreshes the series before each read (labelled
	// series whose state another package owns).
	collect func(f *family)

	mu     sync.RWMutex
	series map[string]*series
}

// series is one time series. Values are float64 bits so that adds from
// concurrent deliveries need no lock.
type series struct {
	values []string
	bits   atomic.Uint64
	// histogram: counts per bucket (not cumulative; the last is +Inf), the
	// sum's bits and the number of observations.
	counts []atomic.Uint64
	sum    atomic.Uint64
	count  atomic.Uint64
}

// registry holds the families in registration order; extra writes
// metrics computed at scrape time (the runtime and the process).
type registry struct {
	fams  []*family
	extra func(w *textWriter)
}

func (r *registry) add(f *family) *family {
	f.series = map[string]*series{}
	r.fams = append(r.fams, f)
	return f
}

func (r *registry) counter(name, help string, labels ...string) *family {
	return r.add(&family{name: name, help: help, kind: counterKind, labels: labels})
}

func (r *registry) gauge(name, help string, labels ...string) *family {
	return r.add(&family{name: name, help: help, kind: gaugeKind, labels: labels})
}

func (r *registry) histogram(name, help string, buckets []float64, labels ...string) *family {
	return r.add(&family{name: name, help: help, kind: histogramKind, labels: labels, buckets: buckets})
}

func (r *registry) gaugeFunc(name, help string, fn func() float64) {
	r.add(&family{name: name, help: help, kind: gaugeKind, fn: fn})
}

func (r *registry) counterFunc(name, help string, fn func() float64) {
	r.add(&family{name: name, help: help, kind: counterKind, fn: fn})
}

// labelledCounterFunc registers a counter whose series, one per value of
// label, are read from fn at each scrape.
func (r *registry) labelledCounterFunc(name, help, label string, fn func() map[string]int64) {
	r.add(&family{name: name, help: help, kind: counterKind, labels: []string{label}, collect: func(f *family) {
		for v, n := range fn() {
			f.with(v).set(float64(n))
		}
	}})
}

// pairGaugeFunc registers a gauge with two labels whose series, one per
// pair of values, are read from fn at each scrape.
func (r *registry) pairGaugeFunc(name, help string, labels [2]string, fn func() map[[2]string]float64) {
	r.add(&family{name: name, help: help, kind: gaugeKind, labels: labels[:], collect: func(f *family) {
		for v, n := range fn() {
			f.with(v[0], v[1]).set(n)
		}
	}})
}

// labelledGaugeFunc registers a gauge whose series, one per value of
// label, are read from fn at each scrape.
func (r *registry) labelledGaugeFunc(name, help, label string, fn func() map[string]float64) {
	r.add(&family{name: name, help: help, kind: gaugeKind, labels: []string{label}, collect: func(f *family) {
		for v, n := range fn() {
			f.with(v).set(n)
		}
	}})
}

// with returns the series for values (one per label), creating it at 0.
// It allocates its key: callers on the delivery path keep the series.
func (f *family) with(values ...string) *series {
	if len(values) != len(f.labels) {
		panic("metric " + f.name + ": " + strconv.Itoa(len(values)) + " label values for " + strconv.Itoa(len(f.labels)) + " labels")
	}
	key := strings.Join(values, "\xff")
	f.mu.RLock()
	s := f.series[key]
	f.mu.RUnlock()
	if s != nil {
		return s
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if s = f.series[key]; s == nil {
		s = &series{values: slices.Clone(values)}
		if f.kind == histogramKind {
			s.counts = make([]atomic.Uint64, len(f.buckets)+1)
		}
		f.series[key] = s
	}
	return s
}

func addFloat(a *atomic.Uint64, v float64) {
	for {
		old := a.Load()
		if a.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

func (s *series) add(v float64) { addFloat(&s.bits, v) }
func (s *series) inc()          { s.add(1) }
func (s *series) set(v float64) { s.bits.Store(math.Float64bits(v)) }
func (s *series) value() float64 {
	return math.Float64frombits(s.bits.Load())
}

// observe records v in the histogram family f's series s.
func (f *family) observe(s *series, v float64) {
	i := sort.SearchFloat64s(f.buckets, v) // first bound >= v: v <= le
	s.counts[i].Add(1)
	addFloat(&s.sum, v)
	s.count.Add(1)
}

// lookup returns the value of the first series (in exposition order)
// whose labels include every one given; a histogram's is its count.
func (r *registry) lookup(name string, labels map[string]string) (float64, bool) {
	for _, f := range r.fams {
		if f.name != name {
			continue
		}
		if f.fn != nil {
			return f.fn(), len(labels) == 0
		}
		if f.collect != nil {
			f.collect(f)
		}
	next:
		for _, s := range f.sorted() {
			for i, l := range f.labels {
				if v, ok := labels[l]; ok && v != s.values[i] {
					continue next
				}
			}
			if f.kind == histogramKind {
				return float64(s.count.Load()), true
			}
			return s.value(), true
		}
	}
	return 0, false
}

func (f *family) sorted() []*series {
	f.mu.RLock()
	out := make([]*series, 0, len(f.series))
	for _, s := range f.series {
		out = append(out, s)
	}
	f.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return slices.Compare(out[i].values, out[j].values) < 0 })
	return out
}

// write puts every family in the Prometheus text format (version 0.0.4),
// sorted by name as scrapers and people expect.
func (r *registry) write(out io.Writer) error {
	w := &textWriter{w: bufio.NewWriter(out)}
	fams := slices.Clone(r.fams)
	sort.SliceStable(fams, func(i, j int) bool { return fams[i].name < fams[j].name })
	for _, f := range fams {
		if f.fn != nil {
			w.single(f.name, f.help, f.kind, f.fn())
			continue
		}
		if f.collect != nil {
			f.collect(f)
		}
		w.header(f.name, f.help, f.kind)
		for _, s := range f.sorted() {
			if f.kind != histogramKind {
				w.sample(f.name, f.labels, s.values, "", "", s.value())
				continue
			}
			var cum uint64
			for i, le := range f.buckets {
				cum += s.counts[i].Load()
				w.sample(f.name+"_bucket", f.labels, s.values, "le", formatFloat(le), float64(cum))
			}
			cum += s.counts[len(f.buckets)].Load()
			w.sample(f.name+"_bucket", f.labels, s.values, "le", "+Inf", float64(cum))
			w.sample(f.name+"_sum", f.labels, s.values, "", "", math.Float64frombits(s.sum.Load()))
			w.sample(f.name+"_count", f.labels, s.values, "", "", float64(cum))
		}
	}
	if r.extra != nil {
		r.extra(w)
	}
	return w.w.Flush()
}

// textWriter writes lines of the text format; the first write error is
// kept by the bufio.Writer and returned by Flush.
type textWriter struct{ w *bufio.Writer }

// single writes a family of one series without labels.
func (t *textWriter) single(name, help string, k kind, v float64) {
	t.header(name, help, k)
	t.sample(name, nil, nil, "", "", v)
}

func (t *textWriter) header(name, help string, k kind) {
	t.w.WriteString("# HELP " + name + " ")
	t.w.WriteString(helpEscaper.Replace(help))
	t.w.WriteString("\n# TYPE " + name + " " + k.String() + "\n")
}

// sample writes one line; extraName/extraValue is one more label (a
// histogram's le) when extraName is set.
func (t *textWriter) sample(name string, labels, values []string, extraName, extraValue string, v float64) {
	t.w.WriteString(name)
	if len(labels) > 0 || extraName != "" {
		t.w.WriteByte('{')
		for i, l := range labels {
			if i > 0 {
				t.w.WriteByte(',')
			}
			t.label(l, values[i])
		}
		if extraName != "" {
			if len(labels) > 0 {
				t.w.WriteByte(',')
			}
			t.label(extraName, extraValue)
		}
		t.w.WriteByte('}')
	}
	t.w.WriteByte(' ')
	t.w.WriteString(formatFloat(v))
	t.w.WriteByte('\n')
}

var helpEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`)

var labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)

func (t *textWriter) label(name, value string) {
	t.w.WriteString(name + `="`)
	t.w.WriteString(labelEscaper.Replace(value))
	t.w.WriteByte('"')
}

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
