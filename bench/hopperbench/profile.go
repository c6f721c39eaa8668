package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/testbroker"
	"github.com/hopper-sidecar/hopper/sidecar"
)

// profileMain drains one backlog with Hopper and profiles it, in one of two
// ways:
//
//   - in-process (default): the sidecar package runs inside this process,
//     exactly as cmd/hopper runs it, under runtime/pprof (CPU, and the
//     allocations made during the drain: allocs-after minus allocs-before).
//     The app is a separate process (`hopperbench app`) so the profile holds
//     Hopper alone. The memory the process holds is sampled every 10 ms
//     (RssAnon, and runtime/metrics' classes: heap objects, heap free and
//     released, stacks, runtime data, the GC's goal); the sample at the
//     highest RssAnon is printed as a table, where each MB went, and
//     heap-end.pprof is the heap (in use at the last collection) when the
//     drain is done.
//   - --perf: the real binary as a subprocess, recorded with
//     `perf record -g -p <pid>` from its first request to its last; the app
//     is in this process, which perf does not record.
//
// Analyse with, for example:
//
//	go tool pprof -top -nodecount=40 DIR/cpu.pprof
//	go tool pprof -sample_index=alloc_space -top -base DIR/allocs-before.pprof DIR/allocs-after.pprof
//	perf report -i DIR/perf.data --no-children --sort symbol
func profileMain(args []string) int {
	var o options
	fs := flag.NewFlagSet("profile", flag.ExitOnError)
	fs.IntVar(&o.n, "n", 100_000, "backlog size (messages)")
	fs.IntVar(&o.size, "size", 256, "message body size (bytes)")
	fs.IntVar(&o.prefetch, "prefetch", 200, "AMQP prefetch")
	fs.IntVar(&o.workers, "workers", 64, "concurrent deliveries")
	fs.IntVar(&o.pubChannels, "publish-channels", 8, "confirm channels for moves")
	fs.DurationVar(&o.tier, "tier", 100*time.Millisecond, "the one delay tier")
	pathName := fs.String("path", "happy", "happy, retry, dlq, defaults (happy, Hopper without consumer keys), routes (the routes path's JSON backlog and rules), signed (happy, every request signed with a Standard Webhooks secret), stream (the backlog in a RabbitMQ stream, read by a stream subscription), stream-defaults (the same, Hopper without consumer keys) or batch (--batch-size messages per request)")
	fs.IntVar(&o.batchSize, "batch-size", 32, "batch path: messages per request")
	fs.IntVar(&o.batchPrefetch, "batch-prefetch", 256, "batch path: prefetch")
	fs.IntVar(&o.batchWorkers, "batch-workers", 8, "batch path: batch requests in flight")
	fs.DurationVar(&o.batchWait, "batch-wait", 0, "batch path: consumer.batch.maxWait (0: not set)")
	out := fs.String("out", "bench-profile", "directory for the profiles")
	usePerf := fs.Bool("perf", false, "profile the real binary with perf record instead of in-process pprof")
	hopperBin := fs.String("hopper-bin", "", "Hopper binary for --perf (default: go build ./cmd/hopper)")
	memRate := fs.Int("memprofilerate", 64<<10, "runtime.MemProfileRate for the in-process profile (bytes)")
	mutexFrac := fs.Int("mutexprofilefraction", 0, "runtime.SetMutexProfileFraction; >0 writes mutex.pprof")
	_ = fs.Parse(args)
	runtime.MemProfileRate = *memRate
	defaults := *pathName == "defaults" || *pathName == "stream-defaults"
	routed := *pathName == "routes"
	signed := *pathName == "signed"
	streamed := *pathName == "stream" || *pathName == "stream-defaults"
	m, err := parseMode(*pathName)
	if defaults || routed || signed || streamed {
		m, err = modeOK, nil
	}
	if err != nil || (m != modeOK && m != modeRetry && m != modeDLQ && m != modeBatch) {
		fmt.Fprintf(os.Stderr, "hopperbench profile: unknown path %q\n", *pathName)
		return 2
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "hopperbench profile:", err)
		return 1
	}
	o.workDir, o.keep, o.hopperBin = *out, true, *hopperBin
	if *mutexFrac > 0 {
		runtime.SetMutexProfileFraction(*mutexFrac)
	}
	if *usePerf {
		err = profilePerf(&o, *pathName)
	} else {
		err = profileInProcess(&o, m, defaults, routed, signed, streamed, *out, *mutexFrac > 0)
	}
	if err != nil {
		logf("profile: %v", err)
		return 1
	}
	return 0
}

func profileInProcess(o *options, m mode, defaults, routed, signed, streamed bool, out string, mutex bool) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logf("starting a private RabbitMQ node")
	b, err := testbroker.Start(testbroker.Options{Quiet: true, Streams: streamed})
	if err != nil {
		return fmt.Errorf("start RabbitMQ: %w\n%s", err, testbroker.InstallHint)
	}
	defer b.Stop()

	// The app runs in its own process: the profile is Hopper's alone.
	appName := map[mode]string{modeOK: "ok", modeRetry: "retry", modeDLQ: "dlq", modeBatch: "batch"}[m]
	appCmd := exec.Command(self, "app", "--mode", appName)
	appCmd.Stderr = os.Stderr
	appCmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := appCmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := appCmd.Start(); err != nil {
		return err
	}
	defer func() {
		_ = appCmd.Process.Signal(syscall.SIGTERM)
		_ = appCmd.Wait()
	}()
	appURL, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		return fmt.Errorf("app did not print its URL: %w", err)
	}

	e := &env{o: o, b: b, url: b.URL(), app: &app{url: strings.TrimSpace(appURL)}, dir: out,
		quiet: slog.New(slog.DiscardHandler)}
	queue := "profile-" + appName
	sp := e.newSpec(queue, "hopper", m)
	if m == modeBatch {
		sp.consumer = o.batchSetting()
	}
	label := appName
	if defaults {
		label = "defaults"
		sp.tag, sp.consumer = "profile-defaults", consumerSetting{}
	}
	if routed {
		label = "routes"
		sp.tag, sp.routed, sp.routedBacklog = "profile-routes", true, true
	}
	if signed {
		label = "signed"
		sp.tag = "profile-signed"
		if sp.signingSecret, err = e.writeSigningSecret(); err != nil {
			return err
		}
	}
	if streamed {
		label = "stream"
		sp.tag, sp.stream = "profile-stream", true
		if defaults {
			label = "stream-defaults"
			sp.consumer = consumerSetting{}
		}
	}
	cfgPath, plan, err := e.prepare(sp)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	logf("publishing %d messages", o.n)
	publish := publishBacklog
	if routed {
		publish = publishRoutedBacklog
	}
	if streamed {
		if _, err := e.publishStreamBacklog(ctx, plan.Stream.Name, "m-", o.n, o.size); err != nil {
			return err
		}
	} else if _, err := publish(ctx, e.url, plan.Work.Name, "m-", o.n, o.size); err != nil {
		return err
	}
	cfg, _, err := config.Load(cfgPath, nil)
	if err != nil {
		return err
	}
	logFile, err := os.Create(filepath.Join(out, "hopper.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	sc := sidecar.New(&cfg, slog.New(slog.NewJSONHandler(logFile, &slog.HandlerOptions{Level: slog.LevelInfo})))
	runCtx, stop := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- sc.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-runErr; err != nil {
			logf("sidecar: %v", err)
		}
	}()

	for st := sc.Stats(); st == nil || st.Received.Load() == 0; st = sc.Stats() {
		select {
		case err := <-runErr:
			runErr <- err
			return fmt.Errorf("sidecar stopped before consuming: %v", err)
		case <-ctx.Done():
			return errors.New("sidecar never consumed")
		case <-time.After(time.Millisecond):
		}
	}
	st := sc.Stats()
	mem := watchMemory()
	limits := watchLimit(sc.ConcurrencyLimit)
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	if err := writeProfile("allocs", filepath.Join(out, "allocs-before.pprof")); err != nil {
		return err
	}
	cpuFile, err := os.Create(filepath.Join(out, "cpu.pprof"))
	if err != nil {
		return err
	}
	defer cpuFile.Close()
	if err := pprof.StartCPUProfile(cpuFile); err != nil {
		return err
	}
	cpu0, _ := procCPU(os.Getpid())
	t0 := time.Now()
	finished := func() int64 {
		if m == modeDLQ {
			return st.DeadLettered.Load()
		}
		return st.Acked.Load()
	}
	for finished() < int64(o.n) {
		if ctx.Err() != nil {
			pprof.StopCPUProfile()
			return fmt.Errorf("timed out with %d/%d settled", finished(), o.n)
		}
		time.Sleep(2 * time.Millisecond)
	}
	elapsed := time.Since(t0)
	pprof.StopCPUProfile()
	peak := mem.stop()
	limits.end()
	cpu1, _ := procCPU(os.Getpid())
	runtime.ReadMemStats(&ms1)
	if err := writeProfile("allocs", filepath.Join(out, "allocs-after.pprof")); err != nil {
		return err
	}
	if mutex {
		if err := writeProfile("mutex", filepath.Join(out, "mutex.pprof")); err != nil {
			return err
		}
	}
	if err := writeProfile("heap", filepath.Join(out, "heap-end.pprof")); err != nil {
		return err
	}
	if err := writeGoroutines(filepath.Join(out, "goroutines.txt")); err != nil {
		return err
	}
	n := float64(o.n)
	fmt.Printf("profile: path=%s n=%d elapsed=%s rate=%.0f/s cpu_s/100k=%.2f allocs/msg=%.1f bytes/msg=%.0f gcs=%d gc_cpu_fraction=%.3f heap_inuse_mb=%.1f sys_mb=%.1f\n",
		label, o.n, elapsed.Round(time.Millisecond), n/elapsed.Seconds(), per100k(cpu1-cpu0, o.n),
		float64(ms1.Mallocs-ms0.Mallocs)/n, float64(ms1.TotalAlloc-ms0.TotalAlloc)/n, ms1.NumGC-ms0.NumGC,
		ms1.GCCPUFraction, float64(ms1.HeapInuse)/(1<<20), float64(ms1.Sys)/(1<<20))
	if b := st.Batches.Load(); b > 0 {
		fmt.Printf("profile: %d batch requests, %.1f messages each\n", b, float64(st.BatchedMessages.Load())/float64(b))
	}
	peak.print(os.Stdout)
	limits.print(os.Stdout)
	fmt.Printf("profiles in %s: cpu.pprof allocs-before.pprof allocs-after.pprof heap-end.pprof goroutines.txt (binary: %s)\n", out, self)
	return nil
}

// limitTrace samples the concurrency limit every 100 ms while a drain
// runs: where the limit went says how many workers and how large a
// prefetch the defaults kept.
type limitTrace struct {
	stop chan struct{}
	done chan []int
	got  []int
}

func watchLimit(limit func() int) *limitTrace {
	t := &limitTrace{stop: make(chan struct{}), done: make(chan []int, 1)}
	go func() {
		var seen []int
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-t.stop:
				t.done <- seen
				return
			case <-tick.C:
				seen = append(seen, limit())
			}
		}
	}()
	return t
}

// end stops sampling.
func (t *limitTrace) end() {
	close(t.stop)
	t.got = <-t.done
}

func (t *limitTrace) print(w io.Writer) {
	if len(t.got) == 0 || t.got[len(t.got)-1] == 0 {
		return
	}
	fmt.Fprintf(w, "concurrency limit every 100ms: max %d, last %d: %v\n", slices.Max(t.got), t.got[len(t.got)-1], t.got)
}

// writeGoroutines writes the goroutines left once the drain is done,
// grouped by stack: the workers and connections a setting keeps for
// the next backlog.
func writeGoroutines(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return pprof.Lookup("goroutine").WriteTo(f, 1)
}

func writeProfile(name, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return pprof.Lookup(name).WriteTo(f, 0)
}

// profilePerf runs one throughput drain of the real binary with perf
// attached for exactly the measured window.
func profilePerf(o *options, pathName string) error {
	if _, err := exec.LookPath("perf"); err != nil {
		return fmt.Errorf("perf is not installed (apt-get install linux-perf): %w", err)
	}
	o.runs = 1
	o.runTimeout = 15 * time.Minute
	e, err := setup(o)
	if e != nil {
		defer e.close()
	}
	if err != nil {
		return err
	}
	m, _ := parseMode(pathName)
	routed := pathName == "routes"
	if routed {
		m = modeOK
	}
	tag := "perf-" + pathName
	sp := e.newSpec(tag, "hopper", m)
	sp.routed, sp.routedBacklog = routed, routed
	cfgPath, plan, err := e.prepare(sp)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.runTimeout)
	defer cancel()
	publish := publishBacklog
	if routed {
		publish = publishRoutedBacklog
	}
	if _, err := publish(ctx, e.url, plan.Work.Name, "m-", o.n, o.size); err != nil {
		return err
	}
	perfData := filepath.Join(e.dir, "perf.data")
	var perf *exec.Cmd
	var c *child
	started := make(chan error, 1)
	r := newAppRun(m, int64(o.n), func() {
		// Called on the app's first request: attach perf now.
		perf = exec.Command("perf", "record", "-F", "999", "-g", "-o", perfData, "-p", fmt.Sprint(c.pid()))
		perf.Stdout, perf.Stderr = os.Stderr, os.Stderr
		started <- perf.Start()
	})
	e.app.run.Store(r)
	if c, err = e.startConsumer("hopper", cfgPath, plan, tag, o.n); err != nil {
		return err
	}
	select {
	case <-r.done:
	case <-c.exited:
		return fmt.Errorf("hopper exited: %v\n%s", c.err, logTail(c.logPath, 20))
	case <-ctx.Done():
		return errors.New("timed out")
	}
	if err := <-started; err != nil {
		return fmt.Errorf("perf record: %w", err)
	}
	_ = perf.Process.Signal(syscall.SIGINT)
	_ = perf.Wait()
	fmt.Printf("perf: path=%s n=%d rate=%.0f/s data=%s binary=%s\n", pathName, o.n,
		float64(o.n)/r.elapsed().Seconds(), perfData, e.hopperBin)
	return c.stop(30 * time.Second)
}
