package main

import (
	"fmt"
	"io"
	"time"

	"github.com/hopper-sidecar/hopper/config"
)

// The keyed path asks what ordering per key costs. The app answers every
// message 200 after keyedDelay, so the rate follows how many messages are
// at the app at once. Hopper drains the same backlog unordered and with
// consumer.orderingKey over keyedKeys keys (messages spread evenly, key i
// mod K), at the same fixed prefetch and workers: with many keys the
// workers stay busy, with few a worker waits for its key's previous
// message. One key is held against consumer.ordered (one message in
// flight) on a shorter backlog, since both run one message at a time.

// keyedDelay is how long the app takes to answer a message on keyedPath.
const keyedDelay = time.Millisecond

// keyedKeys are the numbers of ordering keys measured against the
// unordered drain.
var keyedKeys = []int{1000, 16}

// keyedSetting is the concurrency of every keyed-path drain but the
// ordered one; the limiter is off so that workers is the concurrency.
var keyedSetting = consumerSetting{prefetch: 200, workers: 64, fixed: true}

// keyedWho names the series of the keyed path.
func keyedWho(keys int) string {
	switch keys {
	case 0:
		return "unordered"
	case -1:
		return "ordered"
	}
	return fmt.Sprintf("keys=%d", keys)
}

// keyedOneBacklog is the backlog of the one-key and ordered drains.
func (o *options) keyedOneBacklog() int { return max(500, o.shortBacklog()/10) }

// keyedSpec is a drain of the keyed backlog: keys 0 unordered, -1 with
// consumer.ordered, else with that many ordering keys.
func (e *env) keyedSpec(keys, run int) spec {
	s := e.newSpec(fmt.Sprintf("bench-keyed-%d-%d", max(keys, 0), run), "hopper", modeOK)
	s.appPath, s.consumer, s.n = keyedPath, keyedSetting, e.o.shortBacklog()
	switch {
	case keys == -1:
		s.tag = fmt.Sprintf("bench-keyed-ordered-%d", run)
		s.consumer = consumerSetting{ordered: true, fixed: true}
		s.n = e.o.keyedOneBacklog()
	case keys > 0:
		s.consumer.orderingKey = "header:" + keyHeader
		s.keys = keys
		if keys == 1 {
			s.n = e.o.keyedOneBacklog()
		}
	}
	return s
}

// keyedness drains the keyed backlog in every form once per run, the forms
// alternating within a run so that what else the machine does hits all
// alike.
func (e *env) keyedness() (map[string][]runResult, error) {
	out := map[string][]runResult{}
	forms := append(append([]int{0}, keyedKeys...), 1, -1)
	for run := 1; run <= e.o.runs; run++ {
		for _, k := range forms {
			res, err := e.drain(e.keyedSpec(k, run))
			if err != nil {
				return nil, fmt.Errorf("keyed path, %s run %d: %w", keyedWho(k), run, err)
			}
			out[keyedWho(k)] = append(out[keyedWho(k)], res)
			logRun("keyed", keyedWho(k), run, e.o.runs, res)
		}
	}
	return out, nil
}

// printKeyed writes the keyed path's table.
func (rep *report) printKeyed(w io.Writer, o *options) {
	fmt.Fprintf(w, "keyed: one Hopper drains a backlog of %d (keys=1 and ordered: %d) answered 200 after %s, at prefetch/workers %s, limiter off\n",
		o.shortBacklog(), o.keyedOneBacklog(), config.FormatDuration(keyedDelay), keyedSetting)
	fmt.Fprintf(w, "%-10s %9s %9s %9s %10s %8s\n", "form", "median/s", "min/s", "max/s", "cpu_s/100k", "rss_MiB")
	for _, k := range append(append([]int{0}, keyedKeys...), 1, -1) {
		runs := rep.keyed[keyedWho(k)]
		r := summarize(rates(runs))
		fmt.Fprintf(w, "%-10s %9.0f %9.0f %9.0f %10.2f %8.1f\n", keyedWho(k), r.med, r.min, r.max, consumerCPU(runs), maxHWM(runs))
	}
	fmt.Fprintln(w)
}

// keyedLines are the keyed path's summary lines: each number of keys
// against the unordered drain, and one key against consumer.ordered.
func (rep *report) keyedLines() []string {
	med := func(who string) float64 { return summarize(rates(rep.keyed[who])).med }
	unordered := med(keyedWho(0))
	var out []string
	for _, k := range keyedKeys {
		h := med(keyedWho(k))
		out = append(out, fmt.Sprintf("bench: keyed keys=%d hopper=%.0f/s unordered=%.0f/s ratio=%.3f", k, h, unordered, h/unordered))
	}
	one, ordered := med(keyedWho(1)), med(keyedWho(-1))
	out = append(out, fmt.Sprintf("bench: keyed keys=1 hopper=%.0f/s ordered=%.0f/s ratio=%.3f", one, ordered, one/ordered))
	return out
}
