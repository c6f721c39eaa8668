package main

import (
	"fmt"
	"io"
	"os"
	"runtime/metrics"
	"time"
)

// memClasses are the runtime/metrics figures that tell where a Go
// process's memory goes, in the order the memory table prints them. The
// /memory/classes/ ones add up to /memory/classes/total:bytes, what the
// runtime has mapped; of that, heap/released is handed back to the
// operating system and is not resident. Profiling buckets are this
// mode's own: the hopper binary links no memory profile, so its linker
// turns heap sampling off and it has none.
var memClasses = []struct{ name, label string }{
	{"/memory/classes/heap/objects:bytes", "heap: objects (live and not yet collected)"},
	{"/memory/classes/heap/unused:bytes", "heap: unused (free slots in spans in use)"},
	{"/memory/classes/heap/free:bytes", "heap: free, kept for reuse (resident)"},
	{"/memory/classes/heap/stacks:bytes", "goroutine stacks"},
	{"/memory/classes/os-stacks:bytes", "OS thread stacks"},
	{"/memory/classes/metadata/mspan/inuse:bytes", "runtime: span metadata"},
	{"/memory/classes/metadata/mspan/free:bytes", "runtime: span metadata, free"},
	{"/memory/classes/metadata/mcache/inuse:bytes", "runtime: per-P caches"},
	{"/memory/classes/metadata/mcache/free:bytes", "runtime: per-P caches, free"},
	{"/memory/classes/metadata/other:bytes", "runtime: other metadata (GC, page allocator)"},
	{"/memory/classes/profiling/buckets:bytes", "profiling buckets (this mode only)"},
	{"/memory/classes/other:bytes", "runtime: other"},
	{"/memory/classes/heap/released:bytes", "heap: released to the OS (not resident)"},
	{"/memory/classes/total:bytes", "total mapped by the runtime"},
	{"/gc/heap/live:bytes", "GC: heap live after the last collection"},
	{"/gc/heap/goal:bytes", "GC: heap goal"},
	{"/gc/scan/stack:bytes", "GC: stack bytes scanned (in use)"},
	{"/gc/gogc:percent", "GOGC (percent)"},
	{"/gc/gomemlimit:bytes", "GOMEMLIMIT"},
	{"/sched/goroutines:goroutines", "goroutines"},
}

// memSample is the memory of this process at one moment.
type memSample struct {
	at             time.Duration // since sampling started
	anonKB, fileKB int64         // RssAnon and RssFile of /proc/self/status
	values         []metrics.Sample
}

// memWatch samples this process's memory every anonEvery and keeps the
// sample with the highest RssAnon. Reading runtime/metrics into samples
// it made beforehand allocates nothing, so the watch does not move what
// it measures.
type memWatch struct {
	quit chan struct{}
	done chan memSample
}

func watchMemory() *memWatch {
	w := &memWatch{quit: make(chan struct{}), done: make(chan memSample, 1)}
	go func() {
		start := time.Now()
		cur := make([]metrics.Sample, len(memClasses))
		for i, c := range memClasses {
			cur[i].Name = c.name
		}
		peak := memSample{values: make([]metrics.Sample, len(memClasses))}
		copy(peak.values, cur)
		t := time.NewTicker(anonEvery)
		defer t.Stop()
		pid := os.Getpid()
		for {
			anon, err1 := procStatusKB(pid, "RssAnon")
			file, err2 := procStatusKB(pid, "RssFile")
			if err1 == nil && err2 == nil && anon > peak.anonKB {
				metrics.Read(cur)
				peak.at, peak.anonKB, peak.fileKB = time.Since(start), anon, file
				copy(peak.values, cur)
			}
			select {
			case <-w.quit:
				w.done <- peak
				return
			case <-t.C:
			}
		}
	}()
	return w
}

// stop ends the sampling and returns the sample of the highest RssAnon.
func (w *memWatch) stop() memSample {
	close(w.quit)
	return <-w.done
}

// print writes the sample as a table in MiB.
func (s memSample) print(wr io.Writer) {
	fmt.Fprintf(wr, "memory at the highest anonymous RSS (%s into the drain): RssAnon %.1f MiB, RssFile (the binary's pages) %.1f MiB\n",
		s.at.Round(time.Millisecond), float64(s.anonKB)/1024, float64(s.fileKB)/1024)
	for i, c := range memClasses {
		v := s.values[i].Value
		if v.Kind() != metrics.KindUint64 {
			continue
		}
		switch n := v.Uint64(); {
		case c.name == "/gc/gogc:percent" || c.name == "/sched/goroutines:goroutines":
			fmt.Fprintf(wr, "  %-48s %8d\n", c.label, n)
		case c.name == "/gc/gomemlimit:bytes" && n > 1<<50:
			fmt.Fprintf(wr, "  %-48s %8s\n", c.label, "none")
		default:
			fmt.Fprintf(wr, "  %-48s %8.2f MiB\n", c.label, float64(n)/(1<<20))
		}
	}
}
