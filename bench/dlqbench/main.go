// Command dlqbench measures `hopper dlq replay` against the raw loop it is
// built from, on one private RabbitMQ node (internal/testbroker), in one
// run:
//
//   - raw: basic.get from one queue, publish the message to another with a
//     publisher confirm, then ack — the same broker primitives (the broker
//     package's Inspector and confirming Publisher) and the same number of
//     publishes in flight, without the tool's filters, header rewriting,
//     exclusive ownership or accounting. A single goroutine gets, --parallel
//     workers publish and ack.
//
//   - floor: the cheapest safe move the broker offers (floorLoop): one
//     consumer, pipelined confirms, multiple-acks. Its rate is close to
//     what the broker itself allows, so replay/floor near 1 says little is
//     left to win on the client side.
//
//   - replay: the real binary (`hopper dlq replay --parallel P`) as a
//     subprocess. Its rate is the one it reports (messages recovered over
//     its run, connection set-up excluded); the wall-clock rate including
//     process start is printed too. Peak RSS is the subprocess's maximum
//     resident set as /proc VmHWM reports it while it runs (getrusage's
//     ru_maxrss is printed beside it; it can read high, see peakKB).
//
//   - console-scan: the real binary (`hopper dlq console`) as a
//     subprocess, asked through its API to scan a DLQ of --n messages in
//     five failure groups; the time is the scan's own (start to end of the
//     pass that builds the index), the peak RSS /proc VmHWM sampled while
//     the console runs.
//
// Each DLQ is filled with --n persistent messages of --size bytes carrying
// Hopper's DLQ headers. The last two lines of standard output are
//
//	bench: console-scan n=N secs=S rss_mb=M
//	dlqbench: replay=R1/s raw=R2/s ratio=X rss_mb=Y floor=R3/s of_floor=Z
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/internal/testbroker"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/topology"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "dlqbench:", err)
		os.Exit(1)
	}
}

type options struct {
	n, size, parallel, runs int
	hopperBin               string
	// queueType is the console-scan DLQ's x-queue-type.
	queueType string
	// transform, when set, compares replay --transform with a plain
	// replay of the same JSON bodies instead.
	transform     string
	keepOriginals bool
}

func run() error {
	var o options
	flag.IntVar(&o.n, "n", 100_000, "messages in each DLQ")
	flag.IntVar(&o.size, "size", 256, "body size in bytes")
	flag.IntVar(&o.parallel, "parallel", 64, "publishes awaiting their confirm at once, for both loops (64: replay's default)")
	flag.IntVar(&o.runs, "runs", 1, "alternating raw/replay measurements; medians are reported")
	flag.StringVar(&o.hopperBin, "hopper-bin", "", "hopper binary (default: go build ./cmd/hopper into a temporary directory)")
	flag.StringVar(&o.queueType, "queue-type", "classic", "type of the console-scan DLQ: classic or quorum (a quorum DLQ is rotated, not returned to, by every pass)")
	flag.StringVar(&o.transform, "transform", "", `compare "hopper dlq replay --transform PATCH" with a plain replay of the same JSON bodies (nothing else is measured); e.g. '[{"op":"move","from":"/body/amt","path":"/body/amount"}]'`)
	flag.BoolVar(&o.keepOriginals, "keep-originals", false, "with --transform: add --keep-originals")
	flag.Parse()
	if o.queueType != "classic" && o.queueType != "quorum" {
		return fmt.Errorf("--queue-type %q: want classic or quorum", o.queueType)
	}

	if o.hopperBin == "" {
		dir, err := os.MkdirTemp("", "dlqbench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		o.hopperBin = filepath.Join(dir, "hopper")
		logf("building %s", o.hopperBin)
		if out, err := exec.Command("go", "build", "-o", o.hopperBin, "./cmd/hopper").CombinedOutput(); err != nil {
			return fmt.Errorf("go build ./cmd/hopper: %w\n%s", err, out)
		}
	}

	logf("starting a private RabbitMQ node")
	rb, err := testbroker.Start(testbroker.Options{Quiet: true})
	if err != nil {
		return fmt.Errorf("start RabbitMQ: %w\n%s", err, testbroker.InstallHint)
	}
	defer rb.Stop()
	bopts := broker.Options{URLs: []string{rb.URL()}, ConnectTimeout: 10 * time.Second, Name: "dlqbench"}

	const rawSrc, rawDst, dlqName, work = "bench.raw.dlq", "bench.raw.dest", "bench.dlq", "bench"
	for _, q := range []string{rawSrc, rawDst, dlqName, work} {
		if err := declare(bopts, q); err != nil {
			return err
		}
	}
	pub := broker.NewPublisher(broker.PublisherOptions{Options: bopts, Channels: 64, ConfirmTimeout: 30 * time.Second})
	defer pub.Close()
	body := bytes.Repeat([]byte("x"), o.size)

	if o.transform != "" {
		return compareTransform(o, rb.URL(), bopts, pub, dlqName, work)
	}

	var raws, floors, reps []float64
	var last replayResult
	for i := 1; i <= o.runs; i++ {
		// Alternate, and start each measurement from the same broker state:
		// a full source, an empty destination.
		// measure fills the raw source, moves it to the raw destination
		// with move and checks that every message arrived.
		measure := func(name, how string, move func() (rawResult, error)) (float64, error) {
			logf("run %d/%d: filling %s with %d messages of %d bytes", i, o.runs, rawSrc, o.n, o.size)
			fillRate, err := fill(pub, rawSrc, work, o.n, body)
			if err != nil {
				return 0, err
			}
			logf("  %.0f msg/s (64 channels)", fillRate)
			logf("run %d/%d: %s loop: %s; %d in flight", i, o.runs, name, how, o.parallel)
			r, err := move()
			if err != nil {
				return 0, err
			}
			if err := expectAndPurge(bopts, rawDst, o.n); err != nil {
				return 0, err
			}
			logf("  %s %.0f msg/s", name, r.rate)
			return r.rate, nil
		}
		raw, err := measure("raw", "get, publish with confirm, ack", func() (rawResult, error) {
			return rawLoop(bopts, rawSrc, rawDst, o.n, o.parallel)
		})
		if err != nil {
			return err
		}
		raws = append(raws, raw)
		floor, err := measure("floor", "consume, pipelined publish, multiple-ack after confirm", func() (rawResult, error) {
			return floorLoop(rb.URL(), rawSrc, rawDst, o.n, o.parallel)
		})
		if err != nil {
			return err
		}
		floors = append(floors, floor)

		logf("run %d/%d: filling %s with %d messages of %d bytes", i, o.runs, dlqName, o.n, o.size)
		if _, err := fill(pub, dlqName, work, o.n, body); err != nil {
			return err
		}
		logf("run %d/%d: hopper dlq replay --parallel %d", i, o.runs, o.parallel)
		rep, err := replay(o, rb.URL(), dlqName)
		if err != nil {
			return err
		}
		if err := expectAndPurge(bopts, work, o.n); err != nil {
			return err
		}
		logf("  replay %.0f msg/s, peak RSS %.1f MB, CPU %s", rep.rate, float64(rep.peakKB())/1024, rep.cpu.Round(time.Millisecond))
		reps = append(reps, rep.rate)
		last = rep
	}
	rawRate, floorRate, repRate := median(raws), median(floors), median(reps)

	const consoleWork = "bench.console"
	consoleDLQ := consoleWork + ".dlq"
	if err := declareType(bopts, consoleDLQ, o.queueType); err != nil {
		return err
	}
	logf("filling %s (%s) with %d messages of %d bytes in %d failure groups", consoleDLQ, o.queueType, o.n, o.size, len(consoleFailures))
	if err := fillConsole(pub, consoleDLQ, consoleWork, o.n, body); err != nil {
		return err
	}
	logf("hopper dlq console: scan through its API")
	cs, err := consoleScan(o, rb.URL(), consoleWork, consoleDLQ)
	if err != nil {
		return err
	}
	if err := expectAndPurge(bopts, consoleDLQ, o.n); err != nil {
		return err
	}

	fmt.Printf("messages:        %d x %d bytes, %d publishes in flight, %d run(s), medians\n", o.n, o.size, o.parallel, o.runs)
	fmt.Printf("raw loop:        %8.0f msg/s  (runs: %s)\n", rawRate, rates(raws))
	fmt.Printf("floor loop:      %8.0f msg/s  (runs: %s; the minimal safe loop)\n", floorRate, rates(floors))
	fmt.Printf("hopper replay:   %8.0f msg/s  (runs: %s; last run %.0f msg/s wall clock with process start)\n", repRate, rates(reps), last.wallRate)
	fmt.Printf("ratio:           %8.2f  (replay / raw); %.2f of the floor\n", repRate/rawRate, repRate/floorRate)
	fmt.Printf("replay peak RSS: %8.1f MB (/proc VmHWM sampled; ru_maxrss: %.1f MB); CPU %s for %d messages\n",
		float64(last.peakKB())/1024, float64(last.maxRSSKB)/1024, last.cpu.Round(time.Millisecond), o.n)
	fmt.Printf("console scan:    %8.1f s for %d messages in %d groups of a %s DLQ, peak RSS %.1f MB\n", cs.secs, o.n, cs.groups, o.queueType, float64(cs.hwmKB)/1024)
	fmt.Printf("bench: console-scan n=%d secs=%.1f rss_mb=%.1f\n", o.n, cs.secs, float64(cs.hwmKB)/1024)
	fmt.Printf("dlqbench: replay=%.0f/s raw=%.0f/s ratio=%.2f rss_mb=%.1f floor=%.0f/s of_floor=%.2f\n", repRate, rawRate, repRate/rawRate, float64(last.peakKB())/1024, floorRate, repRate/floorRate)
	return nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "dlqbench: "+format+"\n", args...)
}

// declare declares a durable classic queue.
func declare(o broker.Options, name string) error { return declareType(o, name, "classic") }

// declareType declares a durable queue of type classic or quorum.
func declareType(o broker.Options, name, typ string) error {
	args := map[string]any{"x-queue-type": typ}
	if typ == "classic" {
		args["x-queue-version"] = int32(2)
	}
	q := topology.Queue{Name: name, Role: topology.RoleWork, Owned: true, Args: args}
	plan := topology.Plan{Work: q, DLQ: q, Declare: true}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return broker.Apply(ctx, o, &plan, true)
}

// fill publishes n dead-lettered messages whose original queue is work.
// compareTransform measures replay --transform against a plain replay of
// the same DLQ of JSON bodies, alternating, in one run.
func compareTransform(o options, url string, bopts broker.Options, pub *broker.Publisher, dlqName, work string) error {
	pad := max(o.size-len(`{"currency":"EUR","amt":12345,"pad":""}`), 0)
	body := []byte(`{"currency":"EUR","amt":12345,"pad":"` + strings.Repeat("x", pad) + `"}`)
	extra := []string{"--transform", o.transform}
	if o.keepOriginals {
		extra = append(extra, "--keep-originals")
	}
	var plains, transformed []float64
	for i := 1; i <= o.runs; i++ {
		for _, mode := range []string{"plain", "transform"} {
			logf("run %d/%d: filling %s with %d JSON messages of %d bytes", i, o.runs, dlqName, o.n, len(body))
			if _, err := fillJSON(pub, dlqName, work, o.n, body); err != nil {
				return err
			}
			args := []string(nil)
			if mode == "transform" {
				args = extra
			}
			logf("run %d/%d: hopper dlq replay --parallel %d %s", i, o.runs, o.parallel, strings.Join(args, " "))
			rep, err := replay(o, url, dlqName, args...)
			if err != nil {
				return err
			}
			if err := expectAndPurge(bopts, work, o.n); err != nil {
				return err
			}
			if o.keepOriginals && mode == "transform" {
				if err := expectAndPurge(bopts, dlq.OriginalsQueue(dlqName), o.n); err != nil {
					return err
				}
			}
			logf("  %s %.0f msg/s, peak RSS %.1f MB", mode, rep.rate, float64(rep.peakKB())/1024)
			if mode == "plain" {
				plains = append(plains, rep.rate)
			} else {
				transformed = append(transformed, rep.rate)
			}
		}
	}
	p, t := median(plains), median(transformed)
	fmt.Printf("messages:          %d x %d bytes of JSON, %d publishes in flight, %d run(s), medians\n", o.n, len(body), o.parallel, o.runs)
	fmt.Printf("plain replay:      %8.0f msg/s  (runs: %s)\n", p, rates(plains))
	fmt.Printf("replay --transform:%8.0f msg/s  (runs: %s)\n", t, rates(transformed))
	fmt.Printf("dlqbench: transform=%.0f/s replay=%.0f/s ratio=%.2f keep_originals=%v\n", t, p, t/p, o.keepOriginals)
	return nil
}

// fillJSON fills queue with n dead letters of a JSON body.
func fillJSON(pub *broker.Publisher, queue, work string, n int, body []byte) (float64, error) {
	return fillWith(pub, queue, work, n, body, "application/json")
}

func fill(pub *broker.Publisher, queue, work string, n int, body []byte) (float64, error) {
	return fillWith(pub, queue, work, n, body, "application/octet-stream")
}

func fillWith(pub *broker.Publisher, queue, work string, n int, body []byte, contentType string) (float64, error) {
	start := time.Now()
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	next := atomic.Int64{}
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || failed.Load() != nil {
					return
				}
				m := &msg.Message{MessageID: strconv.Itoa(i), ContentType: contentType, Headers: map[string]any{}, Body: body}
				*m = *msg.DLQCopy(m, msg.Info{Queue: work, RoutingKey: work}, msg.DeadLetter{Status: 503, Reason: "max-attempts", Retries: 10, Now: time.Now()})
				if err := pub.Publish(context.Background(), queue, m); err != nil {
					failed.Store(&err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if p := failed.Load(); p != nil {
		return 0, fmt.Errorf("fill %s: %w", queue, *p)
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

type rawResult struct {
	rate    float64
	elapsed time.Duration
}

// rawLoop moves n messages from src to dst: one goroutine gets, parallel
// workers publish (confirmed) and ack.
func rawLoop(o broker.Options, src, dst string, n, parallel int) (rawResult, error) {
	in, err := broker.OpenInspector(context.Background(), o)
	if err != nil {
		return rawResult{}, err
	}
	defer in.Close()
	pub := broker.NewPublisher(broker.PublisherOptions{Options: o, Channels: parallel, ConfirmTimeout: 30 * time.Second})
	defer pub.Close()

	work := make(chan *broker.Delivery, parallel)
	var wg sync.WaitGroup
	var firstErr atomic.Pointer[error]
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range work {
				if err := pub.Publish(context.Background(), dst, d.Message()); err != nil {
					firstErr.CompareAndSwap(nil, &err)
					continue
				}
				if err := d.Ack(); err != nil {
					firstErr.CompareAndSwap(nil, &err)
				}
			}
		}()
	}
	start := time.Now()
	for got := 0; got < n && firstErr.Load() == nil; {
		d, ok, err := in.Get(src)
		if err != nil {
			firstErr.CompareAndSwap(nil, &err)
			break
		}
		if !ok {
			time.Sleep(time.Millisecond)
			continue
		}
		work <- d
		got++
	}
	close(work)
	wg.Wait()
	el := time.Since(start)
	if p := firstErr.Load(); p != nil {
		return rawResult{}, fmt.Errorf("raw loop: %w", *p)
	}
	return rawResult{rate: float64(n) / el.Seconds(), elapsed: el}, nil
}

type replayResult struct {
	rate, wallRate     float64
	elapsed, wall, cpu time.Duration
	maxRSSKB, hwmKB    int64
}

// peakKB is the replay's peak resident set. The kernel's high-water mark
// read from /proc while it runs is preferred: a child's ru_maxrss can carry
// the size of this (larger) process it was forked from, so it reads high.
func (r replayResult) peakKB() int64 {
	if r.hwmKB > 0 {
		return r.hwmKB
	}
	return r.maxRSSKB
}

// replay runs the binary and measures it.
func replay(o options, url, dlqName string, extra ...string) (replayResult, error) {
	cmd := exec.Command(o.hopperBin, append([]string{"dlq", "replay", "--dlq", dlqName, "--broker-url", url,
		"--parallel", strconv.Itoa(o.parallel), "-o", "json", "--log-format", "text"}, extra...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HOPPER_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = os.Stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return replayResult{}, err
	}
	hwm := watchHWM(cmd.Process.Pid)
	err := cmd.Wait()
	wall := time.Since(start)
	hwm.stop()
	if err != nil {
		return replayResult{}, fmt.Errorf("hopper dlq replay: %w\n%s", err, out.String())
	}
	var res dlq.ReplayResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		return replayResult{}, fmt.Errorf("replay summary: %w\n%s", err, out.String())
	}
	if res.Recovered != o.n {
		return replayResult{}, fmt.Errorf("replay recovered %d of %d: %+v", res.Recovered, o.n, res)
	}
	r := replayResult{rate: res.Rate, elapsed: time.Duration(res.Elapsed), wall: wall, wallRate: float64(o.n) / wall.Seconds(), hwmKB: hwm.peak()}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		r.maxRSSKB = ru.Maxrss // kilobytes on Linux
		r.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return r, nil
}

// statusKB reads a "<key>: N kB" line of /proc/<pid>/status.
func statusKB(pid int, key string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != key {
			continue
		}
		return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
	}
	return 0, errors.New(key + " not found")
}

// expectAndPurge checks that queue holds n messages, then empties it.
func expectAndPurge(o broker.Options, queue string, n int) error {
	in, err := broker.OpenInspector(context.Background(), o)
	if err != nil {
		return err
	}
	defer in.Close()
	got, err := in.Purge(queue)
	if err != nil {
		return err
	}
	if got != n {
		return fmt.Errorf("%s held %d messages, want %d", queue, got, n)
	}
	return nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func rates(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.0f", x)
	}
	return strings.Join(parts, ", ")
}

// hwmWatch follows a process's peak resident set (VmHWM) while it runs:
// /proc loses it when the process is reaped, so it is read every 50 ms
// until stop.
type hwmWatch struct {
	kb   atomic.Int64
	done chan struct{}
	wg   sync.WaitGroup
}

func watchHWM(pid int) *hwmWatch {
	w := &hwmWatch{done: make(chan struct{})}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			if kb, err := statusKB(pid, "VmHWM"); err == nil && kb > w.kb.Load() {
				w.kb.Store(kb)
			}
			select {
			case <-w.done:
				return
			case <-t.C:
			}
		}
	}()
	return w
}

// stop ends the watch; peak is then final.
func (w *hwmWatch) stop() { close(w.done); w.wg.Wait() }

// peak is the highest VmHWM read, in KiB.
func (w *hwmWatch) peak() int64 { return w.kb.Load() }
