package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/topology"
)

// The fair path runs one Hopper with two subscriptions: a healthy queue
// whose messages the app answers 200 and a poison queue whose messages it
// answers 500 every time, so they cycle through a short tier for as long as
// Hopper runs. Both share the app client, the breaker and the concurrency
// limit; each has its own channel, workers and delivery loop. The healthy
// queue's drain rate with the poison queue empty (alone) and with it full
// (beside) tells how much a poison-heavy neighbour costs a healthy queue.
const (
	fairPrefetch = 50 // healthy subscription; the poison one keeps the default
	fairWorkers  = 50
	fairTier     = 200 * time.Millisecond // the poison queue's one tier
)

// fairResult is one drain of the healthy backlog, alone or beside poison.
type fairResult struct {
	beside  bool
	n       int           // healthy backlog
	poisonN int           // poison backlog (0 alone)
	rate    float64       // healthy messages/s
	elapsed time.Duration // first healthy request → last healthy answer
	publish time.Duration // pre-publishing both backlogs
	poison  int64         // poison requests during elapsed
	// poisonLate is the poison requests during the second half of the
	// healthy drain: beside, it must not be zero, or the poison queue ran
	// dry before the healthy one and the run measured less than it claims.
	poisonLate int64
	cpu        time.Duration // Hopper's CPU over elapsed
	broker     time.Duration // the broker's CPU over elapsed
	others     float64       // cores busy with other processes during the run
}

func (r fairResult) scenario() string {
	if r.beside {
		return "beside_poison"
	}
	return "alone"
}

// fairConfig is the two-subscription config. Every key but the broker's,
// the app's and the admin's is left to Hopper's defaults so that the run
// measures the sharing as shipped (the breaker asks the health check after
// a run of 500s, which answers 200).
func (e *env) fairConfig(healthy, poison string) string {
	return fmt.Sprintf(`broker:
  urls: [%q]
  publishChannels: %d
topology:
  declare: true
app:
  url: %q
  healthPath: %s
admin:
  listen: "127.0.0.1:0"
log:
  level: info
  format: json
subscriptions:
  - queue: {name: %s}
    path: %s
    consumer: {prefetch: %d, workers: %d}
  - queue: {name: %s}
    path: %s
    retry: {tiers: [%q], maxAttempts: unlimited}
`, e.url, e.o.pubChannels, e.app.url+"/", healthPath,
		healthy, healthyPath, fairPrefetch, fairWorkers,
		poison, poisonPath, config.FormatDuration(fairTier))
}

// prepareFair writes the fair config, loads it with Hopper's own config
// code and declares the topology of both subscriptions, so the backlogs can
// be published before Hopper starts. It returns the healthy and poison
// plans.
func (e *env) prepareFair(tag string) (string, *topology.Plan, *topology.Plan, error) {
	path := filepath.Join(e.dir, tag+".yaml")
	if err := os.WriteFile(path, []byte(e.fairConfig(tag+"-healthy", tag+"-poison")), 0o644); err != nil {
		return "", nil, nil, err
	}
	cfg, _, err := config.Load(path, nil)
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		return "", nil, nil, fmt.Errorf("bench config: %w", err)
	}
	subs := cfg.SubscriptionConfigs()
	if len(subs) != 2 {
		return "", nil, nil, fmt.Errorf("bench config: %d subscriptions, want 2", len(subs))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var plans [2]*topology.Plan
	for i := range subs {
		p := topology.FromConfig(&subs[i])
		if err := broker.Apply(ctx, broker.ConfigOptions(cfg.Broker, e.quiet, "hopperbench"), &p, true); err != nil {
			return "", nil, nil, fmt.Errorf("declare topology of %s: %w", p.Work.Name, err)
		}
		plans[i] = &p
	}
	return path, plans[0], plans[1], nil
}

// fairRun drains the healthy backlog once, with the poison queue empty
// (alone) or holding a backlog as large as the healthy one (beside).
func (e *env) fairRun(run int, beside bool) (fairResult, error) {
	res := fairResult{beside: beside, n: e.o.n}
	if beside {
		// At least the healthy backlog, so that the poison queue has first
		// deliveries waiting for the whole healthy drain on top of the ones
		// coming back from the tier.
		res.poisonN = e.o.n
	}
	tag := fmt.Sprintf("bench-fair-%s-%d", res.scenario(), run)
	cfgPath, hp, pp, err := e.prepareFair(tag)
	if err != nil {
		return res, err
	}
	defer e.deleteQueues(pp)
	defer e.deleteQueues(hp)
	ctx, cancel := context.WithTimeout(context.Background(), e.o.runTimeout)
	defer cancel()
	start := time.Now()
	if res.poisonN > 0 {
		if _, err := publishBacklog(ctx, e.url, pp.Work.Name, "p-", res.poisonN, e.o.size); err != nil {
			return res, fmt.Errorf("publish poison backlog: %w", err)
		}
	}
	if _, err := publishBacklog(ctx, e.url, hp.Work.Name, "m-", res.n, e.o.size); err != nil {
		return res, fmt.Errorf("publish healthy backlog: %w", err)
	}
	res.publish = time.Since(start)

	mr, err := e.startMeasured(modeFair, int64(res.n), "hopper", cfgPath, hp, tag)
	if err != nil {
		return res, err
	}
	defer e.app.run.Store(nil)
	c, r := mr.c, mr.r
	select {
	case <-r.done:
	case <-c.exited:
		return res, fmt.Errorf("hopper exited during the run: %v\n%s", c.err, logTail(c.logPath, 20))
	case <-ctx.Done():
		_ = c.stop(5 * time.Second)
		return res, fmt.Errorf("hopper run timed out after %s with %d/%d healthy answers\n%s",
			e.o.runTimeout, r.final.Load(), res.n, logTail(c.logPath, 20))
	}
	res.elapsed = r.elapsed()
	res.rate = float64(res.n) / res.elapsed.Seconds()
	res.poison = r.poisonAtLast.Load() - r.poisonAtFirst.Load()
	res.poisonLate = r.poisonAtLast.Load() - r.poisonAtHalf.Load()
	used, err := mr.used()
	if err != nil {
		return res, err
	}
	res.cpu, res.broker = used.cpu, used.broker
	res.others = used.others(res.elapsed)
	if err := c.stop(30 * time.Second); err != nil {
		return res, err
	}
	if n := r.stray.Load(); n > 0 {
		return res, fmt.Errorf("the app got %d requests on neither %s nor %s", n, healthyPath, poisonPath)
	}
	if beside && res.poisonLate == 0 {
		return res, fmt.Errorf("no poison request during the second half of the healthy drain (%d poison requests in all)", r.poison.Load())
	}
	if !beside && r.poison.Load() > 0 {
		return res, fmt.Errorf("the empty poison queue delivered %d messages", r.poison.Load())
	}
	return res, e.verifyFair(hp, pp, res.poisonN)
}

// verifyFair checks, after Hopper has stopped, that the healthy queue and
// its tier queues and DLQ are empty (every healthy message answered and
// acked), and that every poison message is still in the poison queue: none
// dead-lettered (attempts are unlimited) and none lost. The poison
// messages Hopper held at shutdown were moved to the tier queue, which
// gives them back to the work queue after its delay, so the poison count is
// read once the tier queue has emptied.
func (e *env) verifyFair(hp, pp *topology.Plan, poisonN int) error {
	for _, q := range hp.Queues() {
		got, err := e.depth(q.Name)
		if err != nil {
			return fmt.Errorf("verify %s: %w", q.Name, err)
		}
		if got != 0 {
			return fmt.Errorf("verify: healthy queue %s holds %d messages, want 0", q.Name, got)
		}
	}
	deadline := time.Now().Add(10*time.Second + fairTier)
	for {
		depths := map[string]int{}
		for _, q := range pp.Queues() {
			got, err := e.depth(q.Name)
			if err != nil {
				return fmt.Errorf("verify %s: %w", q.Name, err)
			}
			depths[q.Name] = got
		}
		settled := depths[pp.DLQ.Name] == 0 && depths[pp.Work.Name] == poisonN
		for _, t := range pp.Tiers {
			settled = settled && depths[t.Name] == 0
		}
		if settled {
			return nil
		}
		if depths[pp.DLQ.Name] != 0 || time.Now().After(deadline) {
			return fmt.Errorf("verify: poison queues hold %v, want %d in %s and none elsewhere", depths, poisonN, pp.Work.Name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// fairness alternates alone and beside runs, so that a change in what else
// the machine does hits both scenarios alike.
func (e *env) fairness() (alone, beside []fairResult, err error) {
	for run := 1; run <= e.o.runs; run++ {
		for _, b := range []bool{false, true} {
			res, err := e.fairRun(run, b)
			if err != nil {
				return nil, nil, fmt.Errorf("fair path, %s run %d: %w", res.scenario(), run, err)
			}
			if b {
				beside = append(beside, res)
			} else {
				alone = append(alone, res)
			}
			logf("fair  %-13s run %d/%d: %8.0f healthy msg/s (%d msgs in %s; backlogs published in %s), %d poison requests meanwhile (%.0f/s), hopper cpu %.2fs/100k healthy, broker cpu %.2fs/100k healthy",
				res.scenario(), run, e.o.runs, res.rate, res.n, res.elapsed.Round(time.Millisecond), res.publish.Round(time.Millisecond),
				res.poison, float64(res.poison)/res.elapsed.Seconds(), per100k(res.cpu, res.n), per100k(res.broker, res.n))
			logf("      other processes on the machine used %.2f cores during the run (load %s)", res.others, loadAvg())
		}
	}
	return alone, beside, nil
}

func fairRates(rs []fairResult) []float64 {
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[i] = r.rate
	}
	return out
}

// fairMedians are the median healthy rates alone and beside poison.
func (rep *report) fairMedians() (alone, beside float64) {
	return summarize(fairRates(rep.fairAlone)).med, summarize(fairRates(rep.fairBeside)).med
}

// printFair writes the fair path's table.
func (rep *report) printFair(w io.Writer, o *options) {
	fmt.Fprintf(w, "fair: one Hopper, two subscriptions: healthy (backlog %d answered 200, prefetch %d, workers %d) alone, then beside poison\n",
		o.n, fairPrefetch, fairWorkers)
	fmt.Fprintf(w, "(backlog %d answered 500 every time, tier %s, unlimited attempts); rates are healthy messages/s, CPU per 100,000 healthy messages\n",
		o.n, config.FormatDuration(fairTier))
	fmt.Fprintf(w, "%-14s %9s %9s %9s %9s %10s %10s %8s\n", "scenario", "median/s", "min/s", "max/s", "poison/s", "cpu_s/100k", "broker_cpu", "others")
	for _, rs := range [][]fairResult{rep.fairAlone, rep.fairBeside} {
		s := summarize(fairRates(rs))
		var poison, cpu, brk, others []float64
		for _, r := range rs {
			poison = append(poison, float64(r.poison)/r.elapsed.Seconds())
			cpu = append(cpu, per100k(r.cpu, r.n))
			brk = append(brk, per100k(r.broker, r.n))
			others = append(others, r.others)
		}
		fmt.Fprintf(w, "%-14s %9.0f %9.0f %9.0f %9.0f %10.2f %10.2f %8.2f\n", rs[0].scenario(), s.med, s.min, s.max,
			summarize(poison).med, summarize(cpu).med, summarize(brk).med, summarize(others).med)
	}
	alone, beside := rep.fairMedians()
	var pairs []string
	var pairRatios []float64
	for i := range rep.fairBeside {
		pr := rep.fairBeside[i].rate / rep.fairAlone[i].rate
		pairRatios = append(pairRatios, pr)
		pairs = append(pairs, fmt.Sprintf("%.3f", pr))
	}
	fmt.Fprintf(w, "fair   ratio   %9.3f (beside/alone medians; per run pair: %s, their median %.3f)\n\n",
		beside/alone, strings.Join(pairs, " "), summarize(pairRatios).med)
}

// fairLine is the fair path's summary line.
func (rep *report) fairLine() string {
	alone, beside := rep.fairMedians()
	return fmt.Sprintf("bench: fair healthy_alone=%.0f/s healthy_beside_poison=%.0f/s ratio=%.3f", alone, beside, beside/alone)
}
