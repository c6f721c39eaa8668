package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/hopper-sidecar/hopper/dlq"
)

func newDLQExportCmd() *cobra.Command {
	var f dlqFlags
	var ff filterFlags
	var (
		file              string
		remove, overwrite bool
		dryRun            bool
		syncEvery, limit  int
		idleTimeout       time.Duration
		output            string
		progressMode      string
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
time). The filters are those of replay; unmatched messages stay untouched.
--limit N exports at most N matching messages. --dry-run reads and filters
as the run would and reports what it would export and remove, writing no
file and removing nothing.

--file - writes the lines to standard output and the summary to standard
error, for a container whose root filesystem is read-only:

  kubectl exec POD -c hopper -- hopper dlq export --file - > dlq.jsonl

With --remove and standard output a message is acked once its line is
written to the stream; nothing on this side can make it durable, so keep
the output (and export without --remove first when in doubt).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			if err := checkProgress(progressMode); err != nil {
				return err
			}
			if file == "" {
				return usage(errors.New("--file is required"))
			}
			filter, err := ff.filter()
			if err != nil {
				return err
			}
			if limit < 0 {
				return usage(fmt.Errorf("--limit %d: must not be negative (0: no limit)", limit))
			}
			t, err := f.load(cmd, "export")
			if err != nil {
				return err
			}
			ctx, stop := signalContext(cmd.Context(), exitTempFail, toolStopping(cmd.ErrOrStderr()), nil)
			defer stop()

			var (
				src     dlq.Source
				depth   int
				rot     *dlq.Rotation
				closeFn func()
			)
			if remove && !dryRun {
				p, err := t.opener().Own(ctx, t.dlq, 2*max(syncEvery, 1), 0)
				if err != nil {
					return t.explain(err)
				}
				src, depth, rot, closeFn = p.Source, p.Present, p.Rotate, p.Close
			} else {
				if src, depth, rot, closeFn, err = t.browse(ctx); err != nil {
					return err
				}
			}
			defer closeFn()

			var (
				w       dlq.SyncWriter
				closeFh = func() error { return nil }
				summary = cmd.OutOrStdout()
			)
			switch {
			case dryRun:
				// Nothing is written, but what would stop the real run
				// stops this one too.
				if file != "-" && !overwrite {
					if _, err := os.Stat(file); err == nil {
						return fmt.Errorf("export file (use --overwrite to replace it): %s exists", file)
					}
				}
				if file == "-" {
					summary = cmd.ErrOrStderr()
				}
			case file == "-":
				// The lines go to standard output (a read-only root
				// filesystem has nowhere else), so the summary goes to
				// standard error.
				w, summary = streamWriter{cmd.OutOrStdout()}, cmd.ErrOrStderr()
			default:
				flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
				if overwrite {
					flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
				}
				fh, err := os.OpenFile(file, flags, 0o600)
				if err != nil {
					return fmt.Errorf("export file (use --overwrite to replace it): %w", err)
				}
				w, closeFh = fh, fh.Close
			}
			rep, err := newProgress(cmd, "export "+t.dlq, progressMode)
			if err != nil {
				return err
			}
			res, runErr := dlq.Export(ctx, src, w, dlq.ExportOptions{
				DLQ: t.dlq, Bound: depth, Filter: filter, Limit: limit, Remove: remove, DryRun: dryRun, SyncEvery: syncEvery, IdleTimeout: idleTimeout,
				Progress: func(taken int) { rep.Set(int64(taken), int64(depth)) },
				Rotate:   rot, OnBad: reportBad(cmd.ErrOrStderr()),
			})
			rep.Finish()
			if err := closeFh(); err != nil && runErr == nil {
				runErr = fmt.Errorf("close export file: %w", err)
			}
			if output == "json" {
				if err := writeJSON(summary, res); err != nil {
					return err
				}
			} else if dryRun {
				fmt.Fprintf(summary, "dry run: would export %d of %d message(s) from %s to %s; would remove %d, skip %d; failed %d; nothing written or removed\n",
					res.WouldExport, res.Present, t.dlq, file, res.WouldRemove, res.Skipped, res.Failed)
			} else {
				fmt.Fprintf(summary, "exported %d of %d message(s) from %s to %s (%d bytes); removed %d, skipped %d, failed %d\n",
					res.Exported, res.Present, t.dlq, file, res.Bytes, res.Removed, res.Skipped, res.Failed)
				if res.Bad > 0 {
					fmt.Fprintf(summary, "%d bad message(s) could not be read and were left in %s\n", res.Bad, t.dlq)
				}
			}
			// What an export that stopped early did not write is still in
			// the DLQ: it may be run again.
			return tempFail(runErr)
		},
	}
	f.register(cmd.Flags())
	f.registerLimit(cmd.Flags())
	ff.register(cmd.Flags())
	fs := cmd.Flags()
	fs.StringVar(&file, "file", "", "file to write (JSON Lines); - for standard output")
	fs.BoolVar(&remove, "remove", false, "remove each message from the DLQ once its line is on disk")
	fs.IntVar(&limit, "limit", 0, "export at most this many messages (0: no limit); the rest stay in the DLQ")
	fs.BoolVar(&dryRun, "dry-run", false, "read and filter, and report what would be exported (and with --remove removed), writing and removing nothing")
	fs.BoolVar(&overwrite, "overwrite", false, "replace an existing file")
	fs.IntVar(&syncEvery, "sync-every", 100, "with --remove: lines written between fsyncs (their acks wait for it)")
	fs.DurationVar(&idleTimeout, "idle-timeout", 2*time.Second, "stop when the DLQ hands out nothing for this long")
	fs.StringVarP(&output, "output", "o", "table", "summary format: text (or table) or json")
	registerProgress(fs, &progressMode)
	return cmd
}

// streamWriter is standard output as an export target. It cannot be made
// durable from here: with --remove a message is acked once its line has
// been written to the stream, so whoever reads it (kubectl exec … > file)
// must keep it.
type streamWriter struct{ io.Writer }

// Sync flushes nothing: writes to the stream are not buffered here.
func (streamWriter) Sync() error { return nil }
