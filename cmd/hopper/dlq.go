package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/topology"
)

func newDLQCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "Inspect and recover the dead-letter queue: stats, peek, replay, export, import, purge",
		Long: `Operator tools for the dead-letter queue (DLQ).

The DLQ is the one of the configured work queue (the same --config, HOPPER_*
variables and flags as run; topology.dlq names it), or --dlq NAME.

  stats    depth; counts by original queue, reason, final status; ages
  peek     show the first N messages (headers, body preview)
  replay   move messages back to their original queue (or --to)
  export   write messages to a JSON Lines file (--remove to take them out)
  import   publish the messages of such a file to the DLQ (or --to)
  purge    delete every message (asks first)

stats, peek and export read messages without removing them: each is taken
unacked and handed back when the command ends, in its place. replay and
export --remove move a message (publish and confirm, or write and fsync)
before acking it, so killing them at any moment loses nothing; at most the
messages in flight end up in both places.`,
	}
	cmd.AddCommand(newDLQStatsCmd(), newDLQPeekCmd(), newDLQReplayCmd(), newDLQExportCmd(), newDLQImportCmd(), newDLQPurgeCmd())
	return cmd
}

// dlqFlags are the flags every dlq subcommand has: the config ones, and
// --dlq to name the queue directly.
type dlqFlags struct {
	cf   configFlags
	name string
}

func (f *dlqFlags) register(fs *pflag.FlagSet) {
	f.cf.register(fs)
	fs.StringVar(&f.name, "dlq", "", "DLQ to work on (default: the DLQ of queue.name, from topology.dlq)")
}

// target is what a dlq subcommand works with.
type target struct {
	cfg  config.Config
	dlq  string
	log  *slog.Logger
	opts broker.Options
}

// load reads the config like run does. With --dlq the work queue is not
// needed, so queue.name is filled with the DLQ name for validation only.
func (f *dlqFlags) load(cmd *cobra.Command, role string) (*target, error) {
	if f.name != "" && !cmd.Flags().Changed("queue") {
		if err := cmd.Flags().Set("queue", f.name); err != nil {
			return nil, fmt.Errorf("--dlq: %w", err)
		}
	}
	cfg, err := f.cf.load(cmd)
	if err != nil {
		return nil, err
	}
	t := &target{cfg: cfg, dlq: f.name}
	if t.dlq == "" {
		plan := topology.FromConfig(&cfg)
		t.dlq = plan.DLQ.Name
	}
	t.log = newLogger(cfg.Log, cmd.ErrOrStderr())
	t.opts = broker.ConfigOptions(cfg.Broker, t.log, "hopper-dlq-"+role+" "+t.dlq)
	return t, nil
}

// explain turns broker errors into what the operator should know.
func (t *target) explain(err error) error {
	switch {
	case errors.Is(err, broker.ErrInUse):
		return fmt.Errorf("another replayer owns DLQ %q: the broker refused an exclusive consumer because the queue already has a consumer; only one replay or export --remove may run on a DLQ at a time (%w)", t.dlq, err)
	case errors.Is(err, broker.ErrNoQueue), errors.Is(err, broker.ErrTopology):
		return fmt.Errorf("DLQ %q does not exist (check --dlq, queue.name and topology.dlq): %w", t.dlq, err)
	}
	return err
}

// queueExists checks a destination queue with a passive declare.
func (t *target) queueExists(ctx context.Context, queue string) error {
	in, err := broker.OpenInspector(ctx, t.opts)
	if err != nil {
		return err
	}
	defer in.Close()
	if _, err := in.Depth(queue); err != nil {
		return fmt.Errorf("destination queue %q: %w", queue, err)
	}
	return nil
}

// exclusiveSource adapts broker.Exclusive to dlq.Source.
type exclusiveSource struct{ e *broker.Exclusive }

func (s exclusiveSource) Next(ctx context.Context) (dlq.Delivery, bool, error) {
	d, ok, err := s.e.Next(ctx)
	if err != nil || !ok {
		return nil, false, err
	}
	return d, true, nil
}

// browseSource reads a queue with basic.get; empty ends it.
func browseSource(in *broker.Inspector, queue string) dlq.Source {
	return dlq.SourceFunc(func(context.Context) (dlq.Delivery, bool, error) {
		d, ok, err := in.Get(queue)
		if err != nil || !ok {
			return nil, false, err
		}
		return d, true, nil
	})
}

// browse opens the DLQ for reading without removing anything: every
// message taken is handed back, in its place, when close is called.
func (t *target) browse(ctx context.Context) (src dlq.Source, depth int, closeFn func(), err error) {
	in, err := broker.OpenInspector(ctx, t.opts)
	if err != nil {
		return nil, 0, nil, err
	}
	depth, err = in.Depth(t.dlq)
	if err != nil {
		in.Close()
		return nil, 0, nil, t.explain(err)
	}
	closeFn = func() {
		if err := in.Close(); err != nil {
			t.log.Warn("close DLQ connection; the broker returns the messages anyway", "error", err.Error())
		}
	}
	return browseSource(in, t.dlq), depth, closeFn, nil
}

// signalContext ends on SIGINT or SIGTERM; a second signal exits at once,
// which loses nothing either: the broker takes back every unacked message.
func signalContext(parent context.Context, stderr io.Writer) (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(parent, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-ctx.Done()
		if parent.Err() != nil {
			return
		}
		stop()
		hard := make(chan os.Signal, 1)
		signal.Notify(hard, syscall.SIGTERM, syscall.SIGINT)
		fmt.Fprintln(stderr, "hopper: stopping: finishing the messages in flight (signal again to exit now; nothing is lost either way)")
		<-hard
		os.Exit(2)
	}()
	return ctx, stop
}

func checkOutput(o string) error {
	if o != "table" && o != "json" {
		return fmt.Errorf("--output %q: want table or json", o)
	}
	return nil
}

func newDLQStatsCmd() *cobra.Command {
	var f dlqFlags
	var output string
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Depth, counts by original queue, reason and status, oldest and newest age",
		Long: `Reads every message present (basic.get without ack) and hands them all back
when done, so the DLQ is left as it was, order included. Ages come from
x-dead-letter-time, else the AMQP timestamp.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			t, err := f.load(cmd, "stats")
			if err != nil {
				return err
			}
			ctx, stop := signalContext(cmd.Context(), cmd.ErrOrStderr())
			defer stop()
			src, depth, closeFn, err := t.browse(ctx)
			if err != nil {
				return err
			}
			st := dlq.NewStats(t.dlq, depth, time.Now())
			_, err = dlq.Browse(ctx, src, depth, func(m *msg.Message) error { st.Add(m); return nil })
			closeFn()
			if err != nil {
				return t.explain(err)
			}
			if output == "json" {
				return st.WriteJSON(cmd.OutOrStdout())
			}
			return st.WriteTable(cmd.OutOrStdout())
		},
	}
	f.register(cmd.Flags())
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	return cmd
}

func newDLQPeekCmd() *cobra.Command {
	var f dlqFlags
	var (
		n, bodyBytes int
		output       string
	)
	cmd := &cobra.Command{
		Use:   "peek",
		Short: "Show the first N messages (headers, body preview) without removing them",
		Long: `Shows the first N messages of the DLQ. The body is shown as text when it is
valid UTF-8 and printable, else as a hex dump. Nothing is removed: the
messages are handed back in their places. --output json writes each message
as one line of the export format.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "json" && output != "text" {
				return fmt.Errorf("--output %q: want text or json", output)
			}
			if n < 1 {
				return fmt.Errorf("-n %d: want at least 1", n)
			}
			t, err := f.load(cmd, "peek")
			if err != nil {
				return err
			}
			ctx, stop := signalContext(cmd.Context(), cmd.ErrOrStderr())
			defer stop()
			src, depth, closeFn, err := t.browse(ctx)
			if err != nil {
				return err
			}
			defer closeFn()
			out := bufio.NewWriter(cmd.OutOrStdout())
			now := time.Now()
			i := 0
			_, err = dlq.Browse(ctx, src, min(n, depth), func(m *msg.Message) error {
				i++
				if output == "json" {
					line, err := dlq.MarshalLine(m, t.dlq)
					if err != nil {
						return err
					}
					_, err = out.Write(line)
					return err
				}
				return dlq.WritePeek(out, i, m, bodyBytes, now)
			})
			if err != nil {
				return t.explain(err)
			}
			if output != "json" {
				fmt.Fprintf(out, "--- %d of %d message(s) in %s shown ---\n", i, depth, t.dlq)
			}
			if err := out.Flush(); err != nil {
				return fmt.Errorf("write: %w", err)
			}
			return nil
		},
	}
	f.register(cmd.Flags())
	cmd.Flags().IntVarP(&n, "count", "n", 10, "number of messages to show")
	cmd.Flags().IntVar(&bodyBytes, "body-bytes", 512, "largest body preview, in bytes")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	return cmd
}

// filterFlags are the message filters of replay and export.
type filterFlags struct {
	queues, reasons, statuses, keys, headers []string
	olderThan, newerThan                     time.Duration
}

func (ff *filterFlags) register(fs *pflag.FlagSet) {
	fs.StringSliceVar(&ff.queues, "original-queue", nil, "only messages whose x-original-queue is one of these (--queue names the work queue whose DLQ is used, as for run)")
	fs.StringSliceVar(&ff.reasons, "reason", nil, "only these x-dead-letter-reason values (max-attempts, non-retriable, expired, too-early, app-action)")
	fs.StringSliceVar(&ff.statuses, "status", nil, "only these final statuses: codes (503) or classes (5xx); 0 is no response")
	fs.StringSliceVar(&ff.keys, "routing-key", nil, "only these original routing keys (AMQP topic patterns: * one word, # any)")
	fs.StringArrayVar(&ff.headers, "header", nil, "only messages with this header: name=value, or name for any value (repeatable, all must match)")
	fs.DurationVar(&ff.olderThan, "older-than", 0, "only messages in the DLQ for longer than this (e.g. 1h)")
	fs.DurationVar(&ff.newerThan, "newer-than", 0, "only messages in the DLQ for less than this (e.g. 30m)")
}

func (ff *filterFlags) filter() (dlq.Filter, error) {
	f := dlq.Filter{
		Queues: ff.queues, Reasons: ff.reasons, Statuses: ff.statuses, RoutingKeys: ff.keys,
		OlderThan: ff.olderThan, NewerThan: ff.newerThan,
	}
	for _, h := range ff.headers {
		hm, err := dlq.ParseHeaderMatch(h)
		if err != nil {
			return f, fmt.Errorf("--header: %w", err)
		}
		f.Headers = append(f.Headers, hm)
	}
	if err := f.Validate(); err != nil {
		return f, err
	}
	return f, nil
}

func newDLQReplayCmd() *cobra.Command {
	var f dlqFlags
	var ff filterFlags
	var (
		o       dlq.ReplayOptions
		output  string
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Move messages back to their original queue: publish, confirm, then ack",
		Long: `Moves DLQ messages to their original queue (x-original-queue) or to --to.
Each copy is published persistent and mandatory, confirmed by the broker,
and only then is the original acked. A message without a known destination,
replayed --max-replays times already, not matching the filters, or whose
publish failed stays in the DLQ, in its place.

One run handles at most the messages present when it starts, each at most
once: messages it does not move are held until the end, so a message that
fails again at once and comes back is not replayed twice. Only one replayer
may own a DLQ (an exclusive consumer): a second one is refused.

The copy keeps body, properties and message id. The headers that describe the
DLQ entry (x-dead-letter-reason, x-dead-letter-time, x-final-*) are removed,
x-replay-count is incremented and x-last-replay-time, x-replayed-from set.
Hopper's attempt counters (x-retry-count, x-requeue-count, failure times) are
kept, so a message that fails again comes straight back to the DLQ; with
--reset-attempts they are cleared and it gets its full retry budget again.
--clear-deadline removes Hopper's deadline so an expired message is not
expired again at once.

Safe to kill at any point: a message is in the DLQ until its copy is
confirmed; at most the --parallel messages in flight can end up in both
queues. A run longer than the broker's consumer_timeout (30 min by default)
is ended by the broker; nothing is lost, run it again.

Exit status 0 when every message taken was handled without failure (kept and
skipped ones included), 1 otherwise.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			filter, err := ff.filter()
			if err != nil {
				return err
			}
			switch {
			case o.Limit < 0:
				return fmt.Errorf("--limit %d: must not be negative", o.Limit)
			case o.Rate < 0:
				return fmt.Errorf("--rate %g: must not be negative", o.Rate)
			case o.MaxReplays < 0:
				return fmt.Errorf("--max-replays %d: must not be negative", o.MaxReplays)
			case o.Parallel < 1 || o.Parallel > 1000:
				return fmt.Errorf("--parallel %d: want 1 to 1000", o.Parallel)
			case o.IdleTimeout <= 0 || o.StallTimeout <= 0 || timeout < 0:
				return fmt.Errorf("--idle-timeout and --stall-timeout must be positive, --timeout not negative")
			}
			o.Filter = filter
			t, err := f.load(cmd, "replay")
			if err != nil {
				return err
			}
			o.DLQ = t.dlq
			if o.To == t.dlq {
				return fmt.Errorf("--to %q is the DLQ itself", o.To)
			}
			ctx, stop := signalContext(cmd.Context(), cmd.ErrOrStderr())
			defer stop()
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeoutCause(ctx, timeout, fmt.Errorf("total timeout %s reached", timeout))
				defer cancel()
			}

			if o.To != "" && !o.DryRun {
				// Every publish to a missing queue would come back unroutable:
				// say so once, before taking anything.
				if err := t.queueExists(ctx, o.To); err != nil {
					return err
				}
			}
			// The window is twice the publishes in flight, so the next
			// message is already here when a publish settles.
			ex, err := broker.OpenExclusive(ctx, t.opts, t.dlq, 2*o.Parallel)
			if err != nil {
				return t.explain(err)
			}
			pub := broker.NewPublisher(broker.PublisherOptions{
				Options:        t.opts,
				Channels:       o.Parallel,
				ConfirmTimeout: t.cfg.Broker.ConfirmTimeout.D(),
			})
			o.Bound = ex.Present()
			stderr := cmd.ErrOrStderr()
			mode := ""
			if o.DryRun {
				mode = " (dry run)"
			}
			fmt.Fprintf(stderr, "replay%s: %d message(s) present in %s; this run handles at most those\n", mode, o.Bound, t.dlq)
			o.Progress = func(r dlq.ReplayResult) { dlq.WriteProgress(stderr, r) }

			res, runErr := dlq.Replay(ctx, exclusiveSource{ex}, pub, o)
			// Closing hands every held message back to the DLQ, in place.
			if err := ex.Close(); err != nil {
				t.log.Warn("close DLQ connection; the broker returns held messages anyway", "error", err.Error())
			}
			if err := pub.Close(); err != nil {
				t.log.Warn("close publisher", "error", err.Error())
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				if err := writeJSON(out, res); err != nil {
					return err
				}
			} else if err := res.WriteSummary(out); err != nil {
				return err
			}
			if runErr != nil {
				return runErr
			}
			if res.Failed > 0 {
				return fmt.Errorf("%d message(s) could not be replayed; they are still in %s", res.Failed, t.dlq)
			}
			return nil
		},
	}
	f.register(cmd.Flags())
	ff.register(cmd.Flags())
	fs := cmd.Flags()
	fs.StringVar(&o.To, "to", "", "destination queue for every message (default: each message's x-original-queue)")
	fs.IntVar(&o.Limit, "limit", 0, "replay at most this many messages (0: no limit)")
	fs.Float64Var(&o.Rate, "rate", 0, "replay at most this many messages per second (0: no limit)")
	fs.BoolVar(&o.DryRun, "dry-run", false, "decide and count, but publish and remove nothing")
	fs.BoolVar(&o.ResetAttempts, "reset-attempts", false, "clear x-retry-count, x-requeue-count and the failure times: the message gets its full retry budget again")
	fs.BoolVar(&o.ClearDeadline, "clear-deadline", false, "remove Hopper's deadline header (x-hopper-deadline) so an expired message is delivered again")
	fs.IntVar(&o.MaxReplays, "max-replays", 5, "keep messages already replayed this many times (x-replay-count) in the DLQ; 0: no cap")
	fs.IntVar(&o.Parallel, "parallel", 8, "publishes awaiting their confirm at once; 1 keeps the DLQ order exactly")
	fs.DurationVar(&o.IdleTimeout, "idle-timeout", 5*time.Second, "stop when the DLQ hands out nothing for this long")
	fs.DurationVar(&o.StallTimeout, "stall-timeout", time.Minute, "stop when nothing moves for this long (e.g. broker blocking publishes)")
	fs.DurationVar(&timeout, "timeout", 0, "stop after this long in total (0: no limit); messages in flight finish")
	fs.StringVarP(&output, "output", "o", "table", "summary format: table or json")
	return cmd
}

func newDLQExportCmd() *cobra.Command {
	var f dlqFlags
	var ff filterFlags
	var (
		file              string
		remove, overwrite bool
		syncEvery         int
		idleTimeout       time.Duration
		output            string
	)
	cmd := &cobra.Command{
		Use:   "export --file FILE",
		Short: "Write DLQ messages to a JSON Lines file (non-destructive unless --remove)",
		Long: `Writes each message present in the DLQ as one JSON line: body (base64), every
AMQP property, and the headers with their AMQP types, so that import restores
them exactly. Without --remove the DLQ is left as it was.

With --remove a message is acked only after its line is written and the file
fsynced (every --sync-every lines), so a crash leaves each message in the
DLQ, in the file, or both. --remove owns the DLQ like replay does (one at a
time). The filters are those of replay; unmatched messages stay untouched.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			if file == "" {
				return errors.New("--file is required")
			}
			filter, err := ff.filter()
			if err != nil {
				return err
			}
			t, err := f.load(cmd, "export")
			if err != nil {
				return err
			}
			ctx, stop := signalContext(cmd.Context(), cmd.ErrOrStderr())
			defer stop()

			var (
				src     dlq.Source
				depth   int
				closeFn func()
			)
			if remove {
				ex, err := broker.OpenExclusive(ctx, t.opts, t.dlq, 2*max(syncEvery, 1))
				if err != nil {
					return t.explain(err)
				}
				src, depth, closeFn = exclusiveSource{ex}, ex.Present(), func() {
					if err := ex.Close(); err != nil {
						t.log.Warn("close DLQ connection; the broker returns held messages anyway", "error", err.Error())
					}
				}
			} else {
				if src, depth, closeFn, err = t.browse(ctx); err != nil {
					return err
				}
			}
			defer closeFn()

			flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
			if overwrite {
				flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
			}
			fh, err := os.OpenFile(file, flags, 0o600)
			if err != nil {
				return fmt.Errorf("export file (use --overwrite to replace it): %w", err)
			}
			res, runErr := dlq.Export(ctx, src, fh, dlq.ExportOptions{
				DLQ: t.dlq, Bound: depth, Filter: filter, Remove: remove, SyncEvery: syncEvery, IdleTimeout: idleTimeout,
			})
			if err := fh.Close(); err != nil && runErr == nil {
				runErr = fmt.Errorf("close export file: %w", err)
			}
			if output == "json" {
				if err := writeJSON(cmd.OutOrStdout(), res); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "exported %d of %d message(s) from %s to %s (%d bytes); removed %d, skipped %d, failed %d\n",
					res.Exported, res.Present, t.dlq, file, res.Bytes, res.Removed, res.Skipped, res.Failed)
			}
			return runErr
		},
	}
	f.register(cmd.Flags())
	ff.register(cmd.Flags())
	fs := cmd.Flags()
	fs.StringVar(&file, "file", "", "file to write (JSON Lines)")
	fs.BoolVar(&remove, "remove", false, "remove each message from the DLQ once its line is on disk")
	fs.BoolVar(&overwrite, "overwrite", false, "replace an existing file")
	fs.IntVar(&syncEvery, "sync-every", 100, "with --remove: lines written between fsyncs (their acks wait for it)")
	fs.DurationVar(&idleTimeout, "idle-timeout", 2*time.Second, "stop when the DLQ hands out nothing for this long")
	fs.StringVarP(&output, "output", "o", "table", "summary format: table or json")
	return cmd
}

func newDLQImportCmd() *cobra.Command {
	var f dlqFlags
	var (
		file, to string
		opts     dlq.ImportOptions
		output   string
	)
	cmd := &cobra.Command{
		Use:   "import --file FILE",
		Short: "Publish the messages of an export file to the DLQ (or --to), with confirms",
		Long: `Publishes every line of a file written by export, each confirmed by the
broker, to the DLQ or to --to. Body, properties and headers (with their AMQP
types) are restored as exported; copies are always persistent, and a
per-message expiration in the file is not re-applied, because a TTL in a DLQ
would drop the message silently. It stops at the first line it cannot publish
and tells how to resume with --skip.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			if file == "" {
				return errors.New("--file is required (- for standard input)")
			}
			if opts.Parallel < 1 || opts.Skip < 0 {
				return errors.New("--parallel must be at least 1 and --skip not negative")
			}
			t, err := f.load(cmd, "import")
			if err != nil {
				return err
			}
			opts.To = to
			if opts.To == "" {
				opts.To = t.dlq
			}
			var r = cmd.InOrStdin()
			if file != "-" {
				fh, err := os.Open(file)
				if err != nil {
					return fmt.Errorf("import file: %w", err)
				}
				defer fh.Close()
				r = fh
			}
			ctx, stop := signalContext(cmd.Context(), cmd.ErrOrStderr())
			defer stop()
			pub := broker.NewPublisher(broker.PublisherOptions{
				Options:        t.opts,
				Channels:       opts.Parallel,
				ConfirmTimeout: t.cfg.Broker.ConfirmTimeout.D(),
			})
			res, runErr := dlq.Import(ctx, r, pub, opts)
			if err := pub.Close(); err != nil {
				t.log.Warn("close publisher", "error", err.Error())
			}
			if output == "json" {
				if err := writeJSON(cmd.OutOrStdout(), res); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "imported %d message(s) to %s (%d line(s) read, %d skipped)\n", res.Published, res.To, res.Lines, res.Skipped)
			}
			if runErr != nil {
				return fmt.Errorf("import stopped: %w; the first %d line(s) are all published: run again with --skip %d to resume", runErr, res.Through, res.Through)
			}
			return nil
		},
	}
	f.register(cmd.Flags())
	fs := cmd.Flags()
	fs.StringVar(&file, "file", "", "file to read (JSON Lines from export; - for standard input)")
	fs.StringVar(&to, "to", "", "queue to publish to (default: the DLQ)")
	fs.IntVar(&opts.Skip, "skip", 0, "skip this many lines first (resume)")
	fs.IntVar(&opts.Parallel, "parallel", 8, "publishes awaiting their confirm at once; 1 keeps the file's order exactly")
	fs.StringVarP(&output, "output", "o", "table", "summary format: table or json")
	return cmd
}

func newDLQPurgeCmd() *cobra.Command {
	var f dlqFlags
	var yes bool
	cmd := &cobra.Command{
		Use:   "purge",
		Short: "Delete every message in the DLQ (asks for confirmation, or --yes)",
		Long: `Deletes every ready message in the DLQ and reports how many. It asks for
confirmation on a terminal; without one (a script, a pipe) it refuses unless
--yes is given. Consider export --remove first: it keeps a copy.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, err := f.load(cmd, "purge")
			if err != nil {
				return err
			}
			ctx, stop := signalContext(cmd.Context(), cmd.ErrOrStderr())
			defer stop()
			in, err := broker.OpenInspector(ctx, t.opts)
			if err != nil {
				return err
			}
			defer in.Close()
			depth, err := in.Depth(t.dlq)
			if err != nil {
				return t.explain(err)
			}
			if !yes {
				ok, err := confirmPurge(cmd.InOrStdin(), cmd.ErrOrStderr(), isTerminal(cmd.InOrStdin()), t.dlq, depth)
				if err != nil {
					return err
				}
				if !ok {
					fmt.Fprintln(cmd.OutOrStdout(), "purge cancelled; nothing deleted")
					return nil
				}
			}
			n, err := in.Purge(t.dlq)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "purged %d message(s) from %s\n", n, t.dlq)
			return nil
		},
	}
	f.register(cmd.Flags())
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	return cmd
}

// errNoTerminal refuses a purge nobody confirmed.
var errNoTerminal = errors.New("refusing to purge: standard input is not a terminal, so nobody can confirm; pass --yes to purge anyway")

// confirmPurge asks on a terminal. The operator types yes or the DLQ's
// name; anything else cancels.
func confirmPurge(in io.Reader, out io.Writer, terminal bool, name string, depth int) (bool, error) {
	if !terminal {
		return false, errNoTerminal
	}
	fmt.Fprintf(out, "Delete all %d message(s) in %s? This cannot be undone. Type yes (or the DLQ name) to confirm: ", depth, name)
	line, err := bufio.NewReader(in).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return false, fmt.Errorf("read confirmation: %w", err)
	}
	answer := strings.TrimSpace(line)
	return answer == "yes" || answer == name, nil
}

// isTerminal reports whether r is an interactive terminal: a character
// device other than /dev/null, which is what a container, a cron job or a
// CI step without a TTY gets as standard input.
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	null, err := os.Stat(os.DevNull)
	return err == nil && !os.SameFile(fi, null)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}
