package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/hopper-sidecar/hopper/config"
)

// The slow path asks whether Hopper's defaults suit an app that takes its
// time. The app answers every message 200 after slowDelay, so a consumer's
// rate is about its concurrency / slowDelay until the broker or the machine
// bounds it: a default concurrency that is too small, or a limiter that
// holds it down, shows as a rate below the best of the fixed settings. Each
// run drains the backlog with Hopper at its defaults (no consumer or
// limiter keys) and at each of slowFixed; the raw worker takes no part.

// slowDelay is how long the app takes to answer a message on slowPath.
const slowDelay = 20 * time.Millisecond

// slowFixed are the fixed settings the defaults are held against: the
// bench's usual 200/64 and two with more concurrency, since with a slow
// app more requests in flight is what raises the rate. Each turns the
// limiter off, so its workers are the concurrency for the whole run.
var slowFixed = []consumerSetting{
	{prefetch: 200, workers: 64, fixed: true},
	{prefetch: 400, workers: 200, fixed: true},
	{prefetch: 800, workers: 400, fixed: true},
}

// slowSeries is one setting's drains of the slow backlog, run by run.
type slowSeries struct {
	setting consumerSetting
	runs    []runResult
}

func (s slowSeries) median() float64 { return summarize(rates(s.runs)).med }

// slowSpec is a drain of the slow backlog by Hopper at cs.
func (e *env) slowSpec(cs consumerSetting, run int) spec {
	s := e.newSpec(fmt.Sprintf("bench-slow-%s-%d", cs.tag(), run), "hopper", modeOK)
	s.appPath, s.consumer, s.n = slowPath, cs, e.o.shortBacklog()
	return s
}

// slowness drains the slow backlog with every setting, the defaults first,
// once per run: the settings alternate within each run, so that a change
// in what else the machine does hits all of them alike.
func (e *env) slowness() ([]slowSeries, error) {
	series := []slowSeries{{}} // the zero setting: Hopper's defaults
	for _, cs := range slowFixed {
		series = append(series, slowSeries{setting: cs})
	}
	for run := 1; run <= e.o.runs; run++ {
		for i := range series {
			cs := series[i].setting
			res, err := e.drain(e.slowSpec(cs, run))
			if err != nil {
				return nil, fmt.Errorf("slow path, %s run %d: %w", cs, run, err)
			}
			series[i].runs = append(series[i].runs, res)
			logRun("slow", cs.String(), run, e.o.runs, res)
		}
	}
	return series, nil
}

// slowMedians are the median rate at Hopper's defaults and the fixed
// setting with the highest median rate (the first of equals).
func (rep *report) slowMedians() (defaults float64, best slowSeries) {
	for _, s := range rep.slow {
		switch {
		case s.setting.isDefault():
			defaults = s.median()
		case best.runs == nil || s.median() > best.median():
			best = s
		}
	}
	return defaults, best
}

// printSlow writes the slow path's table.
func (rep *report) printSlow(w io.Writer, o *options) {
	fmt.Fprintf(w, "slow: one Hopper drains a backlog of %d answered 200 after %s, at its defaults (no consumer or limiter keys)\n",
		o.shortBacklog(), config.FormatDuration(slowDelay))
	fmt.Fprintf(w, "and at fixed prefetch/workers (limiter off); rates are messages/s, CPU per 100,000 messages\n")
	fmt.Fprintf(w, "%-14s %9s %9s %9s %10s %10s %8s %8s\n", "setting", "median/s", "min/s", "max/s", "cpu_s/100k", "broker_cpu", "rss_MiB", "others")
	for _, s := range rep.slow {
		r := summarize(rates(s.runs))
		var others []float64
		for _, res := range s.runs {
			others = append(others, res.others)
		}
		fmt.Fprintf(w, "%-14s %9.0f %9.0f %9.0f %10.2f %10.2f %8.1f %8.2f\n", s.setting, r.med, r.min, r.max,
			consumerCPU(s.runs), summarize(cpus(s.runs, func(r runResult) time.Duration { return r.broker })).med,
			maxHWM(s.runs), summarize(others).med)
	}
	defaults, best := rep.slowMedians()
	var pairs []string
	for i := range best.runs {
		pairs = append(pairs, fmt.Sprintf("%.3f", rep.slow[0].runs[i].rate/best.runs[i].rate))
	}
	fmt.Fprintf(w, "slow   ratio   %9.3f (defaults/best fixed medians, best fixed %s; per run: %s)\n\n",
		defaults/best.median(), best.setting, strings.Join(pairs, " "))
}

// slowLine is the slow path's summary line.
func (rep *report) slowLine() string {
	defaults, best := rep.slowMedians()
	return fmt.Sprintf("bench: slow%s defaults=%.0f/s best_fixed=%.0f/s (prefetch %d/workers %d) ratio=%.3f",
		config.FormatDuration(slowDelay), defaults, best.median(), best.setting.prefetch, best.setting.workers, defaults/best.median())
}
