package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/internal/progress"
	"github.com/hopper-sidecar/hopper/msg"
)

// readTransform parses --transform: the patch itself, or @FILE.
func readTransform(arg string) (*dlq.Transform, error) {
	text := []byte(arg)
	if name, ok := strings.CutPrefix(arg, "@"); ok {
		b, err := os.ReadFile(name)
		if err != nil {
			return nil, err
		}
		text = b
	}
	return dlq.ParseTransform(text)
}

func newDLQReplayCmd() *cobra.Command {
	var f dlqFlags
	var ff filterFlags
	var (
		o             dlq.ReplayOptions
		transform     string
		keepOriginals bool
		pause         time.Duration
		output        string
		timeout       time.Duration
		progressMode  string
	)
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Move messages back to their original queue: publish, confirm, then ack",
		Long: `Moves DLQ messages to their original queue (x-original-queue), to --to, or
through --to-exchange (with --to-routing-key, or each message's original
routing key). The destination is checked to exist before anything moves.
Each copy is published persistent and mandatory, confirmed by the broker,
and only then is the original acked. A message without a known destination,
replayed --max-replays times already, not matching the filters, or whose
publish failed stays in the DLQ, in its place. On a quorum DLQ those near
its delivery limit (--delivery-limit; all of them without it) are rotated
(a copy published to the DLQ, confirmed, then the original acked) so that
the queue's delivery limit is not spent, and a run with --limit goes on
taking the rest of the messages present, keeping their order.

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

--transform fixes each message before it goes: a JSON Patch (RFC 6902)
applied to the document {"body": <the JSON body>, "headers": {<application
headers>}}, e.g.

  --transform '[{"op":"move","from":"/body/amt","path":"/body/amount"}]'

A message it cannot be applied to (a failed "test" operation, a missing
path, a body that is not JSON) stays in the DLQ as it was, counted as kept;
one it leaves unchanged is replayed as it is. Hopper's history headers
cannot be reached. The copy records that it was changed, by whom, when, and
the digest of the original body; --keep-originals also publishes each
original as it was to <dlq>.originals (confirmed) before its changed copy.
With --dry-run the run counts what the transformation would change and
where it fails, and moves nothing.

--batch N --pause D replays N messages, waits for their confirms and acks,
then waits D before the next N, so that a fix can be watched on the first
few before the rest go; interrupting it during a pause stops it there (a
pause longer than the broker's consumer_timeout ends the run: nothing is
lost, the rest stays in the DLQ).

Safe to kill at any point: a message is in the DLQ until its copy is
confirmed; at most the --parallel messages in flight can end up in both
queues. A run longer than the broker's consumer_timeout (30 min by default)
is ended by the broker; nothing is lost, run it again.

Exit status 0 when every message taken was handled without failure (kept and
skipped ones included); 75 when some could not be moved or the run ended
early (interrupted, stalled, connection lost), or another tool owns the
DLQ: run it again; 69 when the broker cannot be reached; 64 for a bad flag.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			if err := checkProgress(progressMode); err != nil {
				return err
			}
			filter, err := ff.filter()
			if err != nil {
				return err
			}
			if timeout < 0 {
				return usage(fmt.Errorf("--timeout %s: must not be negative", timeout))
			}
			o.Filter = filter
			var tr *dlq.Transform
			if transform != "" {
				if tr, err = readTransform(transform); err != nil {
					return usage(fmt.Errorf("--transform: %w", err))
				}
				tr.By = "hopper dlq replay"
				if u, uerr := user.Current(); uerr == nil {
					tr.By += " (" + u.Username + ")"
				}
				o.Change = func(m *msg.Message) (*msg.Message, error) { return tr.Apply(m, time.Now()) }
			} else if keepOriginals {
				return usage(errors.New("--keep-originals: only with --transform"))
			}
			if o.Batch > 0 {
				if pause <= 0 {
					return usage(fmt.Errorf("--batch %d: give --pause, the wait between batches (e.g. 30s)", o.Batch))
				}
				stderr := cmd.ErrOrStderr()
				o.Between = func(ctx context.Context, recovered int) error {
					fmt.Fprintf(stderr, "replay: %d replayed; next batch of %d in %s (interrupt to stop here: the rest stays in the DLQ)\n", recovered, o.Batch, pause)
					t := time.NewTimer(pause)
					defer t.Stop()
					select {
					case <-t.C:
						return nil
					case <-ctx.Done():
						return ctx.Err()
					}
				}
			} else if pause != 0 {
				return usage(errors.New("--pause: only with --batch"))
			}
			t, err := f.load(cmd, "replay")
			if err != nil {
				return err
			}
			o.DLQ = t.dlq
			// Named on every copy, so that a copy back in the DLQ tells
			// which run replayed it (stats and the console count them).
			o.RunID = fmt.Sprintf("cli %s pid %d", time.Now().UTC().Format("20060102T150405Z"), os.Getpid())
			if keepOriginals {
				o.Originals = dlq.OriginalsQueue(t.dlq)
			}
			if len(t.partitioned) > 0 {
				o.Through = t.through
			}
			if err := o.Validate(); err != nil {
				return usage(err)
			}
			ctx, stop := signalContext(cmd.Context(), exitTempFail, toolStopping(cmd.ErrOrStderr()), nil)
			defer stop()
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeoutCause(ctx, timeout, fmt.Errorf("total timeout %s reached", timeout))
				defer cancel()
			}

			if (o.To != "" || o.ToExchange != "") && !o.DryRun {
				// Every publish to a missing queue or exchange would come
				// back unroutable: say so once, before taking anything.
				if err := t.opener().CheckTarget(ctx, o.ToExchange, o.To); err != nil {
					return err
				}
			}
			if o.Originals != "" && !o.DryRun {
				if _, err := t.opener().Originals(ctx, t.dlq); err != nil {
					return err
				}
			}
			o.OnBad = reportBad(cmd.ErrOrStderr())
			// The window is twice the publishes in flight, so the next
			// message is already here when a publish settles.
			p, err := t.opener().Own(ctx, t.dlq, 2*o.Parallel, o.Parallel)
			if err != nil {
				return t.explain(err)
			}
			o.Rotate = p.Rotate
			o.Bound = p.Present
			stderr := cmd.ErrOrStderr()
			mode := ""
			if o.DryRun {
				mode = " (dry run)"
			}
			fmt.Fprintf(stderr, "replay%s: %d message(s) present in %s; this run handles at most those\n", mode, o.Bound, t.dlq)
			finish := func() {}
			switch {
			case usesBar(stderr, progressMode):
				bar, err := newProgress(cmd, "replay "+t.dlq, progress.Bar)
				if err != nil {
					return err
				}
				o.ProgressEvery = 250 * time.Millisecond
				o.Progress = func(r dlq.ReplayResult) { bar.Set(int64(r.Taken), int64(r.Present)) }
				finish = bar.Finish
			case progressMode != progress.None:
				o.Progress = func(r dlq.ReplayResult) { dlq.WriteProgress(stderr, r) }
			}

			res, runErr := dlq.Replay(ctx, p.Source, p.Pub, o)
			finish()
			p.Close()
			out := cmd.OutOrStdout()
			if output == "json" {
				if err := writeJSON(out, res); err != nil {
					return err
				}
			} else if err := res.WriteSummary(out); err != nil {
				return err
			}
			// A run that ended early or left messages behind may be run
			// again: what it did not move is still in the DLQ.
			if runErr != nil {
				return tempFail(runErr)
			}
			if res.Failed+res.Bad > 0 {
				return tempFail(fmt.Errorf("%d message(s) could not be replayed; they are still in %s", res.Failed+res.Bad, t.dlq))
			}
			return nil
		},
	}
	f.register(cmd.Flags())
	f.registerLimit(cmd.Flags())
	ff.register(cmd.Flags())
	fs := cmd.Flags()
	fs.StringVar(&o.To, "to", "", "destination queue for every message (default: each message's x-original-queue)")
	fs.StringVar(&o.ToExchange, "to-exchange", "", "publish every message to this exchange instead (its bindings decide where it goes), with --to-routing-key or the message's original routing key")
	fs.StringVar(&o.RoutingKey, "to-routing-key", "", "routing key for --to-exchange (default: each message's original routing key)")
	fs.StringVar(&transform, "transform", "", "fix each message before it is replayed: a JSON Patch (RFC 6902) over {\"body\": BODY, \"headers\": {APP HEADERS}}, or @FILE holding one; a message it fails on stays in the DLQ as it was")
	fs.BoolVar(&keepOriginals, "keep-originals", false, "with --transform: publish each message as it was to <dlq>.originals (confirmed) before its changed copy")
	fs.IntVar(&o.Batch, "batch", 0, "replay this many messages at a time, waiting --pause between batches (0: all at once)")
	fs.DurationVar(&pause, "pause", 0, "with --batch: the wait between batches, e.g. 30s")
	fs.IntVar(&o.Limit, "limit", 0, "replay at most this many messages (0: no limit)")
	fs.Float64Var(&o.Rate, "rate", 0, "replay at most this many messages per second (0: no limit)")
	fs.BoolVar(&o.DryRun, "dry-run", false, "decide and count, but publish and remove nothing")
	fs.BoolVar(&o.ResetAttempts, "reset-attempts", false, "clear x-retry-count, x-requeue-count and the failure times: the message gets its full retry budget again")
	fs.BoolVar(&o.ClearDeadline, "clear-deadline", false, "remove Hopper's deadline header (x-hopper-deadline) so an expired message is delivered again")
	fs.IntVar(&o.MaxReplays, "max-replays", 5, "keep messages already replayed this many times (x-replay-count) in the DLQ; 0: no cap")
	fs.IntVar(&o.Parallel, "parallel", 64, "publishes awaiting their confirm at once; 1 keeps the DLQ order exactly")
	fs.DurationVar(&o.IdleTimeout, "idle-timeout", 5*time.Second, "stop when the DLQ hands out nothing for this long")
	fs.DurationVar(&o.StallTimeout, "stall-timeout", time.Minute, "stop when nothing moves for this long (e.g. broker blocking publishes)")
	fs.DurationVar(&timeout, "timeout", 0, "stop after this long in total (0: no limit); messages in flight finish")
	registerProgress(fs, &progressMode)
	fs.StringVarP(&output, "output", "o", "table", "summary format: text (or table) or json")
	return cmd
}
