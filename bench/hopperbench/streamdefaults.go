package main

import (
	"fmt"
	"io"
	"strings"
)

// The stream-defaults path asks what a stream subscription holds in
// memory at Hopper's defaults against a queue subscription at its
// defaults: the same backlog (--stream-n messages of --size bytes), the
// app answering 200, drained once from a stream (queue.type: stream) and
// once from a classic queue, Hopper given no consumer or limiter key
// either time. Its peak RSS and peak anonymous RSS are measured as on the
// other paths; with --baseline-bin the baseline binary drains both too.

// streamDefaultsWho are the forms of the stream-defaults path, in the
// order they drain; the base- ones only with --baseline-bin.
var streamDefaultsWho = []string{"stream", "queue", "base-stream", "base-queue"}

// streamDefaults drains the backlog in every form once per run.
func (e *env) streamDefaults() (map[string][]runResult, error) {
	out := map[string][]runResult{}
	for run := 1; run <= e.o.runs; run++ {
		for _, who := range streamDefaultsWho {
			kind := "hopper"
			if strings.HasPrefix(who, "base-") {
				if e.baseBin == "" {
					continue
				}
				kind = "base"
			}
			s := e.newSpec(fmt.Sprintf("bench-sdef-%s-%d", who, run), kind, modeOK)
			s.n, s.consumer = e.o.streamN, consumerSetting{}
			s.stream = strings.HasSuffix(who, "stream")
			res, err := e.drain(s)
			if err != nil {
				return nil, fmt.Errorf("stream-defaults path, %s run %d: %w", who, run, err)
			}
			out[who] = append(out[who], res)
			logRun("sdefault", who, run, e.o.runs, res)
		}
	}
	return out, nil
}

// printStreamDefaults writes the stream-defaults path's table.
func (rep *report) printStreamDefaults(w io.Writer, o *options) {
	fmt.Fprintf(w, "stream-defaults: a backlog of %d messages of %d B, in a stream and in a classic queue, drained by Hopper at its defaults\n", o.streamN, o.size)
	fmt.Fprintf(w, "%-13s %9s %9s %9s %10s %8s %8s\n", "form", "median/s", "min/s", "max/s", "cpu_s/100k", "rss_MiB", "anon_MiB")
	for _, who := range streamDefaultsWho {
		runs := rep.streamDefaults[who]
		if len(runs) == 0 {
			continue
		}
		r := summarize(rates(runs))
		fmt.Fprintf(w, "%-13s %9.0f %9.0f %9.0f %10.2f %8.1f %8.1f\n", who, r.med, r.min, r.max, consumerCPU(runs), maxHWM(runs), maxAnon(runs))
	}
	fmt.Fprintln(w)
}

// streamDefaultsLines are the stream-defaults path's summary lines: the
// stream subscription's peak RSS against the queue subscription's, of
// Hopper and, with --baseline-bin, of the baseline binary.
func (rep *report) streamDefaultsLines() []string {
	var out []string
	for _, f := range []struct{ prefix, stream, queue string }{
		{"baseline", "base-stream", "base-queue"}, {"bench", "stream", "queue"},
	} {
		s, q := rep.streamDefaults[f.stream], rep.streamDefaults[f.queue]
		if len(s) == 0 || len(q) == 0 {
			continue
		}
		out = append(out, fmt.Sprintf("%s: stream-defaults rss_mb=%.1f anon_mb=%.1f rate=%.0f/s vs queue-defaults rss_mb=%.1f anon_mb=%.1f rate=%.0f/s rss_ratio=%.3f anon_ratio=%.3f",
			f.prefix, maxHWM(s), maxAnon(s), summarize(rates(s)).med, maxHWM(q), maxAnon(q), summarize(rates(q)).med,
			maxHWM(s)/maxHWM(q), maxAnon(s)/maxAnon(q)))
	}
	return out
}
