package telemetry

import (
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
}

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
