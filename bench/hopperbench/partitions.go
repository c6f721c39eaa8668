package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/topology"
)

// The partitions path asks what splitting an ordered queue buys. The app
// answers every message 200 after slowDelay, and Hopper delivers each
// partition in order (consumer.ordered: one message in flight per
// partition), so one partition drains at about 1/slowDelay whatever the
// machine, and N partitions at up to N times that. A backlog of keyed
// messages (partitionKeys routing keys) is published through the
// partitions exchange and drained by one, then two, Hopper processes, each
// subscribed to every partition; the broker lets one consumer per
// partition deliver. Each count is held against one partition with as
// many processes: the ratio is the speed-up.

// partitionCounts are the partition counts measured; the first is the
// baseline of the ratios.
var partitionCounts = []int{1, 4}

// partitionProcs are the numbers of Hopper processes of a series.
var partitionProcs = []int{1, 2}

// partitionKeys is the number of routing keys of the backlog: enough for
// every partition to get a share.
const partitionKeys = 1024

// partitionBacklogMax bounds the backlog of a run: one partition drains at
// about 50 messages/s.
const partitionBacklogMax = 2000

// partitionSeries is the drains of one partition count by one number of
// processes, run by run.
type partitionSeries struct {
	count, procs int
	runs         []runResult
}

func (s partitionSeries) median() float64 { return summarize(rates(s.runs)).med }

// partitionBacklog is the backlog of a partitions run: --n, at most
// partitionBacklogMax.
func (o *options) partitionBacklog() int { return min(o.n, partitionBacklogMax) }

// partitionConfig is the config of a partitions run. The keys left out are
// Hopper's defaults.
func (e *env) partitionConfig(queue string, count int) string {
	return fmt.Sprintf(`broker:
  urls: [%q]
  publishChannels: %d
queue:
  name: %s
topology:
  declare: true
  partitions: {count: %d}
app:
  url: %q
  healthPath: %s
consumer:
  ordered: true
admin:
  listen: "127.0.0.1:0"
log:
  level: info
  format: json
`, e.url, e.o.pubChannels, queue, count, e.app.url+slowPath, healthPath)
}

// preparePartitions writes the config, loads it with Hopper's own code and
// declares every partition's topology, so the backlog can be published
// before Hopper starts.
func (e *env) preparePartitions(tag string, count int) (string, []*topology.Plan, error) {
	path := filepath.Join(e.dir, tag+".yaml")
	if err := os.WriteFile(path, []byte(e.partitionConfig(tag, count)), 0o644); err != nil {
		return "", nil, err
	}
	cfg, _, err := config.Load(path, nil)
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		return "", nil, fmt.Errorf("bench config: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var plans []*topology.Plan
	for _, c := range cfg.Consumed() {
		p := topology.FromConfig(&c)
		if err := broker.Apply(ctx, broker.ConfigOptions(cfg.Broker, e.quiet, "hopperbench"), &p, true); err != nil {
			return "", nil, fmt.Errorf("declare topology of %s: %w", p.Work.Name, err)
		}
		plans = append(plans, &p)
	}
	return path, plans, nil
}

// partitionRun drains one keyed backlog with procs Hopper processes on
// count partitions.
func (e *env) partitionRun(count, procs, run int) (runResult, error) {
	n := e.o.partitionBacklog()
	tag := fmt.Sprintf("bench-partitions-%d-%d-%d", count, procs, run)
	cfgPath, plans, err := e.preparePartitions(tag, count)
	if err != nil {
		return runResult{}, err
	}
	defer func() {
		for _, p := range plans {
			e.deleteQueues(p)
		}
		if ch, err := e.mgmt.Channel(); err == nil {
			_ = ch.ExchangeDelete(config.PartitionExchange(tag), false, false) // ifUnused, noWait
			ch.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), e.o.runTimeout)
	defer cancel()
	key := func(i int) string { return "key-" + strconv.Itoa(i%partitionKeys) }
	pub, err := publishBacklogTo(ctx, e.url, config.PartitionExchange(tag), key, "m-", n, e.o.size, 0)
	if err != nil {
		return runResult{}, fmt.Errorf("publish backlog: %w", err)
	}
	mr, err := e.startMeasured(modeOK, int64(n), "hopper", cfgPath, plans[0], tag)
	if err != nil {
		return runResult{}, err
	}
	defer e.app.run.Store(nil)
	children := []*child{mr.c}
	for i := 1; i < procs; i++ {
		c, err := e.startConsumer("hopper", cfgPath, plans[0], fmt.Sprintf("%s-proc%d", tag, i), 0)
		if err != nil {
			return runResult{}, err
		}
		children = append(children, c)
	}
	stopAll := func() error {
		var first error
		for _, c := range children {
			if err := c.stop(30 * time.Second); err != nil && first == nil {
				first = err
			}
		}
		return first
	}
	r := mr.r
	exited := make(chan *child, len(children))
	for _, c := range children {
		go func() {
			<-c.exited
			exited <- c
		}()
	}
	select {
	case <-r.done:
	case c := <-exited:
		_ = stopAll()
		return runResult{}, fmt.Errorf("hopper exited during the run: %v\n%s", c.err, logTail(c.logPath, 20))
	case <-ctx.Done():
		_ = stopAll()
		return runResult{}, fmt.Errorf("partitions run timed out after %s with %d/%d final answers\n%s",
			e.o.runTimeout, r.final.Load(), n, logTail(mr.c.logPath, 20))
	}
	res := runResult{kind: "hopper", n: n, elapsed: r.elapsed(), publish: pub, reqs: r.total.Load()}
	used, err := mr.used()
	if err != nil {
		return res, err
	}
	res.hwmKB, _ = procStatusKB(mr.c.pid(), "VmHWM")
	res.cpu, res.broker, res.appCPU = used.cpu, used.broker, used.app
	res.others = used.others(res.elapsed)
	res.rate = float64(n) / res.elapsed.Seconds()
	if err := stopAll(); err != nil {
		return res, err
	}
	// Nothing lost: every partition, tier and the DLQ empty once the
	// processes have stopped.
	for _, p := range plans {
		for _, q := range p.Queues() {
			got, err := e.depth(q.Name)
			if err != nil {
				return res, fmt.Errorf("verify %s: %w", q.Name, err)
			}
			if got != 0 {
				return res, fmt.Errorf("verify: queue %s holds %d messages, want 0", q.Name, got)
			}
		}
	}
	return res, nil
}

// partitioning runs every count with every number of processes, once per
// run; within a run the series alternate, so that a change in what else
// the machine does hits all of them alike.
func (e *env) partitioning() ([]partitionSeries, error) {
	var series []partitionSeries
	for _, procs := range partitionProcs {
		for _, count := range partitionCounts {
			series = append(series, partitionSeries{count: count, procs: procs})
		}
	}
	for run := 1; run <= e.o.runs; run++ {
		for i := range series {
			s := &series[i]
			res, err := e.partitionRun(s.count, s.procs, run)
			if err != nil {
				return nil, fmt.Errorf("partitions path, count %d procs %d run %d: %w", s.count, s.procs, run, err)
			}
			s.runs = append(s.runs, res)
			logRun("partitions", fmt.Sprintf("count=%d procs=%d", s.count, s.procs), run, e.o.runs, res)
		}
	}
	return series, nil
}

// partitionBase is the series of the baseline count with procs processes.
func (rep *report) partitionBase(procs int) partitionSeries {
	for _, s := range rep.partitions {
		if s.procs == procs && s.count == partitionCounts[0] {
			return s
		}
	}
	return partitionSeries{}
}

// printPartitions writes the partitions path's table.
func (rep *report) printPartitions(w io.Writer, o *options) {
	fmt.Fprintf(w, "partitions: a backlog of %d messages on %d keys, answered 200 after %s, ordered per partition, drained by Hopper\n",
		o.partitionBacklog(), partitionKeys, config.FormatDuration(slowDelay))
	fmt.Fprintf(w, "processes each subscribed to every partition; rates are messages/s, ratio against %d partition(s) with as many processes\n",
		partitionCounts[0])
	fmt.Fprintf(w, "%-18s %9s %9s %9s %8s %8s\n", "series", "median/s", "min/s", "max/s", "ratio", "others")
	for _, s := range rep.partitions {
		r := summarize(rates(s.runs))
		var others []float64
		for _, res := range s.runs {
			others = append(others, res.others)
		}
		fmt.Fprintf(w, "%-18s %9.0f %9.0f %9.0f %8.3f %8.2f\n", fmt.Sprintf("count=%d procs=%d", s.count, s.procs),
			r.med, r.min, r.max, s.median()/rep.partitionBase(s.procs).median(), summarize(others).med)
	}
	fmt.Fprintln(w)
}

// partitionLines are the partitions path's summary lines: each count above
// the baseline, for each number of processes.
func (rep *report) partitionLines() []string {
	var out []string
	for _, s := range rep.partitions {
		if s.count == partitionCounts[0] {
			continue
		}
		base := rep.partitionBase(s.procs)
		out = append(out, fmt.Sprintf("bench: partitions count=%d procs=%d msgs/s=%.0f ratio=%.3f (count=%d: %.0f msgs/s)",
			s.count, s.procs, s.median(), s.median()/base.median(), base.count, base.median()))
	}
	return out
}
