package main

import (
	"fmt"
	"strings"
	"time"
)

// The deep path drains one deep backlog (--deep-n, a million by default)
// with the raw loop, with Hopper per message at the same prefetch and
// workers, and with Hopper in batches (the batch path's setting), each
// from the same kind of queue Hopper declares (classic, version 2). A
// lead measured on a backlog that fits the broker's memory can be lost on
// one that does not: the broker then reads messages back from disk, and
// any cost that grows with what is held (unacked deliveries, acks out of
// order) shows. The final answers are sampled every deepSample, so the
// rate can be followed through the drain.

// deepWho are the deep path's consumers, in run order.
var deepWho = []string{"raw", "hopper", "hopper-batch"}

// deepSample is how often the final answers are counted during a deep
// drain.
const deepSample = 10 * time.Second

func (e *env) deepness() (map[string][]runResult, error) {
	out := map[string][]runResult{}
	for run := 1; run <= e.o.deepRuns; run++ {
		for _, who := range deepWho {
			tag := fmt.Sprintf("bench-deep-%s-%d", who, run)
			var s spec
			switch who {
			case "raw", "hopper":
				s = e.newSpec(tag, who, modeOK)
			case "hopper-batch":
				s = e.newSpec(tag, "hopper", modeBatch)
				s.consumer = e.o.batchSetting()
			}
			s.n, s.sample = e.o.deepN, deepSample
			res, err := e.drain(s)
			if err != nil {
				return nil, fmt.Errorf("deep path, %s run %d: %w", who, run, err)
			}
			out[who] = append(out[who], res)
			logRun("deep", who, run, e.o.deepRuns, res)
			logf("      rate by %s: %s", deepSample, curveRates(res.curve, deepSample, res.n))
		}
	}
	return out, nil
}

// curveRates is the rate of each sampling interval, in msg/s, until the
// backlog was drained.
func curveRates(curve []int64, every time.Duration, n int) string {
	var b strings.Builder
	prev := int64(0)
	for _, c := range curve {
		if prev >= int64(n) {
			break
		}
		fmt.Fprintf(&b, " %.0f", float64(c-prev)/every.Seconds())
		prev = c
	}
	return strings.TrimSpace(b.String())
}

// sampleFinal counts r's final answers every interval until stop.
func sampleFinal(r *appRun, every time.Duration, stop <-chan struct{}) []int64 {
	t := time.NewTicker(every)
	defer t.Stop()
	var out []int64
	for {
		select {
		case <-stop:
			return out
		case <-t.C:
			out = append(out, r.final.Load())
		}
	}
}

// deepLine is the deep path's summary: the medians of each consumer's
// rate, and Hopper's against the raw loop's, per message and in batches.
func (rep *report) deepLine() string {
	med := func(who string) float64 { return summarize(rates(rep.deep[who])).med }
	raw, hop, bat := med("raw"), med("hopper"), med("hopper-batch")
	return fmt.Sprintf("bench: deep n=%d hopper=%.0f/s raw=%.0f/s ratio=%.3f batch=%.0f/s batch_ratio=%.3f",
		rep.o.deepN, hop, raw, hop/raw, bat, bat/raw)
}
