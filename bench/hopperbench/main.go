// Command hopperbench measures Hopper against the raw broker limit, on one
// machine, in one run, on one private RabbitMQ node (internal/testbroker).
//
// For each path (happy: every message answered 200; retry: 503 once, then
// 200 after a short delay tier; dlq: every message answered 400; defaults:
// happy, with Hopper at its own defaults, see below; retry-classic: the
// retry path through classic delay tiers, where every other path has
// Hopper's default quorum tiers or --tier-type's) and each run, it
// pre-publishes a backlog (persistent, with confirms, to a classic queue)
// and drains it twice, alternating:
//
//   - raw: `hopperbench raw-worker`, a plain amqp091-go consumer with manual
//     acks at the same prefetch, with the same number of workers each doing
//     one fasthttp POST per message and acking after the 2xx (or publishing
//     to the retry queue or DLQ with confirms, then acking). It is the
//     reference client: the most a consumer of this shape gets from this
//     broker, app and machine.
//   - hopper: the real binary (`go build ./cmd/hopper`) as a subprocess, with
//     the same prefetch, workers and app.
//
// The app is a trivial fasthttp server inside this process. A run's rate is
// backlog / (last final answer − first request), so process start-up and
// the readiness gate are not counted. CPU is utime+stime of the consumer
// process over the same window (/proc/<pid>/stat), peak RSS is its VmHWM
// (the pages of its binary included), and anon its highest RssAnon
// sampled every 10 ms (heap, stacks and runtime data: what the process
// itself allocates).
//
// With --baseline-bin, a second Hopper binary (the build before a change)
// drains after hopper in every run of the happy, retry, dlq, defaults and
// batch paths, against the same raw runs, so that a before/after
// comparison comes from one run, interleaved; its figures are the
// `baseline:` lines, in the shape of the bench lines of the same path:
//
//	baseline: PATH base=R1/s raw=R2/s ratio=X cpu_ratio=Y rss_mb=Z anon_mb=A
//
// Then it measures the latency Hopper adds: with idle queues it publishes at
// a fixed rate (500 msg/s for 10 s by default) with the send time in a
// header, and the app records receipt − send; added = hopper − raw at each
// percentile. Both clients run at once on their own queues and each tick
// publishes one message to each, so a stall of the machine hits both.
//
// The fair path measures whether a poison-heavy queue slows a healthy one
// beside it in the same sidecar: one Hopper with two subscriptions, a
// healthy queue (path /healthy, answered 200) and a poison queue (path
// /poison, answered 500 every time, so its messages cycle through a 200ms
// tier with unlimited attempts). Each run drains a healthy backlog of --n
// messages twice, alternating: alone (the poison queue empty) and beside
// poison (the poison queue holding a backlog as large as the healthy one).
// The rate is the healthy path's, measured as above; the ratio is beside /
// alone, both medians of the same invocation. `--paths fair` runs it alone,
// without the latency test.
//
// The defaults path is the happy path with no consumer or limiter key in
// Hopper's config, so Hopper runs at whatever its binary's defaults are,
// against the raw worker at --prefetch and --workers as on the other
// paths: it tells what a user who leaves concurrency alone gets against a
// consumer tuned for the app. Its line is
//
//	bench: defaults hopper=R1/s raw=R2/s ratio=X cpu_ratio=Y rss_mb=Z anon_mb=A
//
// where cpu_ratio is Hopper's CPU per message over the raw worker's (both
// medians) and rss_mb Hopper's peak RSS. Each run of the path also drains
// the same Hopper at --prefetch and --workers (the happy path's setting),
// and the line
//
//	bench: defaults-fixed defaults=R1/s fixed=R2/s (prefetch P/workers W) ratio=X cpu_ratio=C rss_mb=Z anon_mb=A fixed_rss_mb=Z2 fixed_anon_mb=A2
//
// compares the two directly (medians; the table gives them run by run):
// whether the defaults cost anything against a setting chosen for this
// app, read without two raw runs' swings in between.
//
// The slow path tells whether those defaults suit an app that takes its
// time: the app answers every message 200 after 20ms (path /slow), and each
// run drains a backlog of --n-moves messages with one Hopper, no raw
// worker, at its defaults and at fixed prefetch/workers of 200/64, 400/200
// and 800/400 (each with the limiter off, so the concurrency stays fixed),
// in turn. Its line is
//
//	bench: slow20ms defaults=R1/s best_fixed=R2/s (prefetch P/workers W) ratio=X
//
// where best_fixed is the highest median rate of the fixed settings (P/W
// being that setting) and ratio = defaults / best_fixed. `--paths slow`
// runs it alone, without the latency test.
//
// The big path measures memory with large messages (see big.go): 300
// messages of 1 MiB that the app holds for 1 s each, Hopper at its
// defaults. Its line is
//
//	bench: big size_kib=K hold=D held_max=H held_bound=B rss_mb=R rss_over_held_mb=X
//
// The batch path measures batch delivery (see batch.go) on the happy
// path's backlog and app: the raw worker, the broker's floor (a process of
// its own, no app, one multiple-ack per --batch-size deliveries, measured
// as Hopper is), a hand-written batching loop (with --raw-contract also
// the same loop sending the envelope Hopper's contract has)
// and Hopper with consumer.batch.maxMessages = --batch-size, then Hopper
// again with every 10th message answered 503 once in the results body.
// Its lines are
//
//	bench: batch size=S hopper=R1/s raw=R2/s floor=R3/s of_floor=X ratio=Y cpu_ratio=C rss_mb=Z anon_mb=A
//	bench: batch-raw size=S rawbatch=R4/s ratio=X
//	bench: batch-retry size=S hopper=R5/s of_happy=X
//
// and with --raw-contract, among the contract: lines,
//
//	contract: batch size=S hopper=R1/s rawbatchc=R6/s ratio=X cpu_ratio=C raw_cpu_ratio=D rawbatchc_ratio=Y
//
// On a machine shared with other work, throughput and tail latency vary from
// run to run: the report shows how many cores other processes used during
// each run, the CPU per message of consumer, broker and app (stable), and
// a cpu-bound model ratio derived from them.
//
// When the happy path ran, the last line of standard output is
//
//	bench: hopper=R1/s raw=R2/s ratio=X p99_added_ms=Y rss_mb=Z cpu_ratio=C anon_mb=A
//
// (p99_added_ms is n/a when the latency test did not run) and the lines of
// the retry and dlq paths,
//
//	bench: retry hopper=R1/s raw=R2/s ratio=X cpu_ratio=Y rss_mb=Z anon_mb=A
//	bench: dlq hopper=R1/s raw=R2/s ratio=X cpu_ratio=Y rss_mb=Z anon_mb=A
//
// (the figures of their rows in the table: medians, CPU ratio as on the
// defaults line, Hopper's peak RSS and peak anonymous RSS), of the fair path,
//
//	bench: fair healthy_alone=R1/s healthy_beside_poison=R2/s ratio=X
//
// and of the defaults, slow, big and batch paths come just before it, those that ran,
// in --paths order (and last when the happy path did not run).
// bench/benchtable turns these lines into the README's table.
//
// Subcommands (used by the benchmark itself, or for profiling):
//
//	hopperbench [flags]            the benchmark
//	hopperbench raw-worker [flags] the reference consumer (started by the benchmark)
//	hopperbench stream-worker [flags] the reference stream loop (the stream path)
//	hopperbench app [flags]        the trivial app as a process of its own
//	hopperbench profile [flags]    Hopper's loop in-process under runtime/pprof
package main

import (
	"fmt"
	"os"
	"time"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "raw-worker":
			os.Exit(rawWorkerMain(os.Args[2:]))
		case "stream-worker":
			os.Exit(streamWorkerMain(os.Args[2:]))
		case "app":
			os.Exit(appMain(os.Args[2:]))
		case "profile":
			os.Exit(profileMain(os.Args[2:]))
		}
	}
	os.Exit(benchMain(os.Args[1:]))
}

// logf prints progress on standard error; standard output holds results.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s hopperbench: "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}
