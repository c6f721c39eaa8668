package telemetry

import (
	"math"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// processStart is when the process started, near enough for
// process_start_time_seconds (package init runs before main).
var processStart = time.Now()

// runtimeSamples are read from runtime/metrics, which does not stop the
// world as runtime.ReadMemStats does.
var runtimeSamples = []struct{ metric, name, help string }{
	{"/memory/classes/heap/objects:bytes", "go_memstats_alloc_bytes", "Bytes of allocated heap objects."},
	{"/memory/classes/total:bytes", "go_memstats_sys_bytes", "Bytes of memory obtained from the OS."},
	{"/gc/heap/goal:bytes", "go_gc_heap_goal_bytes", "Heap size target for the end of the GC cycle."},
	{"/gc/cycles/total:gc-cycles", "go_gc_cycles_total", "Completed GC cycles."},
	{"/gc/gomemlimit:bytes", "go_gc_gomemlimit_bytes", "Go runtime memory limit (GOMEMLIMIT, or as set at run time), math.MaxInt64 when none."},
}

// gcPauses is the runtime's histogram of GC stop-the-world pauses; the
// older name reads the same data on a runtime without the newer one.
var gcPauses = []string{"/sched/pauses/total/gc:seconds", "/gc/pauses:seconds"}

// gcPauseQuantiles are the quantiles of go_gc_duration_seconds, the ones
// the Prometheus Go collector exposes.
var gcPauseQuantiles = []float64{0, 0.25, 0.5, 0.75, 1}

// writeRuntime writes the Go runtime's and the process's own metrics, the
// usual go_* and process_* names. A value the platform cannot give is
// left out.
func writeRuntime(w *textWriter) {
	w.single("go_goroutines", "Number of goroutines that currently exist.", gaugeKind, float64(runtime.NumGoroutine()))
	if n, ok := procStatus("Threads:"); ok {
		w.single("go_threads", "Number of OS threads.", gaugeKind, n)
	}
	w.header("go_info", "Information about the Go environment.", gaugeKind)
	w.sample("go_info", []string{"version"}, []string{runtime.Version()}, "", "", 1)

	samples := make([]metrics.Sample, len(runtimeSamples))
	for i, s := range runtimeSamples {
		samples[i].Name = s.metric
	}
	metrics.Read(samples)
	for i, s := range runtimeSamples {
		if samples[i].Value.Kind() != metrics.KindUint64 {
			continue
		}
		k := gaugeKind
		if strings.HasSuffix(s.name, "_total") {
			k = counterKind
		}
		w.single(s.name, s.help, k, float64(samples[i].Value.Uint64()))
	}
	writeGCPauses(w)

	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		w.single("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", counterKind, cpu.Seconds())
	}
	if statm, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(statm)); len(f) >= 2 {
			page := float64(os.Getpagesize())
			if v, err := strconv.ParseFloat(f[0], 64); err == nil {
				w.single("process_virtual_memory_bytes", "Virtual memory size in bytes.", gaugeKind, v*page)
			}
			if v, err := strconv.ParseFloat(f[1], 64); err == nil {
				w.single("process_resident_memory_bytes", "Resident memory size in bytes.", gaugeKind, v*page)
			}
		}
	}
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		w.single("process_open_fds", "Number of open file descriptors.", gaugeKind, float64(len(fds)))
	}
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil {
		w.single("process_max_fds", "Maximum number of open file descriptors.", gaugeKind, float64(lim.Cur))
	}
	w.single("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", gaugeKind, float64(processStart.UnixNano())/1e9)
}

// writeGCPauses writes go_gc_duration_seconds, a summary of the GC
// pauses since the process started, from the runtime's pause histogram
// (which, unlike the GC statistics the Prometheus client reads, needs no
// lock on the heap).
func writeGCPauses(w *textWriter) {
	sample := []metrics.Sample{{Name: gcPauses[0]}, {Name: gcPauses[1]}}
	metrics.Read(sample)
	for _, s := range sample {
		if s.Value.Kind() != metrics.KindFloat64Histogram {
			continue
		}
		q, sum, count := pauseSummary(s.Value.Float64Histogram(), gcPauseQuantiles)
		w.header("go_gc_duration_seconds", "A summary of the stop-the-world pauses of garbage collection, "+
			"in seconds: quantiles at the bounds of the runtime's pause histogram buckets, the sum from their midpoints.", summaryKind)
		for i, v := range q {
			w.sample("go_gc_duration_seconds", nil, nil, "quantile", formatFloat(gcPauseQuantiles[i]), v)
		}
		w.sample("go_gc_duration_seconds_sum", nil, nil, "", "", sum)
		w.sample("go_gc_duration_seconds_count", nil, nil, "", "", float64(count))
		return
	}
}

// pauseSummary turns a runtime histogram into quantiles (each q of qs in
// [0, 1]), an estimated sum and the count. The runtime keeps counts per
// bucket, not the values: quantile 0 is the lower bound of the first
// bucket holding a value, any other the upper bound of the bucket holding
// the value of its rank, so that each is within one bucket (a few percent
// for the runtime's time buckets) of the true one. The sum takes each
// value at its bucket's midpoint. A bound that is infinite gives way to
// the bucket's other one. With no values every figure is 0.
func pauseSummary(h *metrics.Float64Histogram, qs []float64) (quantiles []float64, sum float64, count uint64) {
	quantiles = make([]float64, len(qs))
	for _, c := range h.Counts {
		count += c
	}
	if count == 0 {
		return quantiles, 0, 0
	}
	lower := func(i int) float64 {
		if math.IsInf(h.Buckets[i], 0) {
			return h.Buckets[i+1]
		}
		return h.Buckets[i]
	}
	upper := func(i int) float64 {
		if math.IsInf(h.Buckets[i+1], 0) {
			return h.Buckets[i]
		}
		return h.Buckets[i+1]
	}
	for i, c := range h.Counts {
		if c > 0 {
			sum += float64(c) * (lower(i) + upper(i)) / 2
		}
	}
	for qi, q := range qs {
		// rank is the 1-based position of the quantile's value in order.
		rank := max(uint64(math.Ceil(q*float64(count))), 1)
		var seen uint64
		for i, c := range h.Counts {
			seen += c
			if seen >= rank {
				if q == 0 {
					quantiles[qi] = lower(i)
				} else {
					quantiles[qi] = upper(i)
				}
				break
			}
		}
	}
	return quantiles, sum, count
}

// procStatus reads one numeric field of /proc/self/status (the kernel's
// own count, without linking the profiler for it).
func procStatus(field string) (float64, bool) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}
