package main

import (
	"fmt"
	"io"
	"time"

	"github.com/hopper-sidecar/hopper/config"
)

// The big path asks how much memory large messages take. The backlog is
// bigN messages of bigSize bytes and the app holds each for bigDelay, far
// longer than the broker takes to deliver the next: whatever Hopper lets
// the broker push is drawn in and held at once. At its defaults (no
// consumer keys) Hopper's prefetch follows its concurrency but is kept at
// most consumer.prefetchBytes over the average body size, so what it holds
// is bounded by about prefetchBytes, and its peak RSS by that plus its
// own constant. The line is
//
//	bench: big size_kib=K hold=D held_max=H held_bound=B rss_mb=R rss_over_held_mb=X
//
// where held_max is the most messages the app held at once, held_bound is
// prefetchBytes / size, rss_mb Hopper's peak RSS (the highest of --runs)
// and rss_over_held_mb = rss_mb − held_max × size: the constant.

const (
	bigSize  = 1 << 20
	bigN     = 300
	bigDelay = time.Second
)

// bigness drains the big backlog once per run with Hopper at its defaults.
func (e *env) bigness() ([]runResult, error) {
	var out []runResult
	for run := 1; run <= e.o.runs; run++ {
		s := e.newSpec(fmt.Sprintf("bench-big-hopper-%d", run), "hopper", modeOK)
		s.appPath, s.consumer, s.n, s.size = bigPath, consumerSetting{}, bigN, bigSize
		res, err := e.drain(s)
		if err != nil {
			return nil, fmt.Errorf("big path, run %d: %w", run, err)
		}
		logRun("big", "hopper", run, e.o.runs, res)
		logf("      the app held at most %d messages of %d KiB at once", res.maxHeld, bigSize>>10)
		out = append(out, res)
	}
	return out, nil
}

// bigFigures are the big path's figures over its runs: the most held and
// the highest peak RSS.
func (rep *report) bigFigures() (held int64, rssMiB float64) {
	for _, r := range rep.big {
		held = max(held, r.maxHeld)
	}
	return held, maxHWM(rep.big)
}

func (rep *report) printBig(w io.Writer) {
	held, rss := rep.bigFigures()
	bound := config.DefaultPrefetchBytes / bigSize
	fmt.Fprintf(w, "big: one Hopper at its defaults drains %d messages of %d KiB, the app holding each %s\n",
		bigN, bigSize>>10, config.FormatDuration(bigDelay))
	fmt.Fprintf(w, "held at most %d at once (bound: prefetchBytes %d MiB / %d KiB = %d); peak RSS %.1f MiB, %.1f MiB over what was held\n\n",
		held, config.DefaultPrefetchBytes>>20, bigSize>>10, bound, rss, rss-float64(held*bigSize)/(1<<20))
}

func (rep *report) bigLine() string {
	held, rss := rep.bigFigures()
	return fmt.Sprintf("bench: big size_kib=%d hold=%s held_max=%d held_bound=%d rss_mb=%.1f rss_over_held_mb=%.1f",
		bigSize>>10, config.FormatDuration(bigDelay), held, config.DefaultPrefetchBytes/bigSize, rss, rss-float64(held*bigSize)/(1<<20))
}
