package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/dlq"
)

func newDLQImportCmd() *cobra.Command {
	var f dlqFlags
	var (
		file, to     string
		opts         dlq.ImportOptions
		output       string
		progressMode string
	)
	cmd := &cobra.Command{
		Use:   "import --file FILE",
		Short: "Publish the messages of an export file to the DLQ (or --to), with confirms",
		Long: `Publishes every line of a file written by export, each confirmed by the
broker, to the DLQ or to --to. Body, properties and headers (with their AMQP
types) are restored as exported; copies are always persistent, and a
per-message expiration in the file is not re-applied, because a TTL in a DLQ
would drop the message silently. It stops at the first line it cannot publish
and tells how to resume with --skip. --dry-run reads and checks every line
and that the destination exists, and reports what it would publish,
publishing nothing.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			if err := checkProgress(progressMode); err != nil {
				return err
			}
			if file == "" {
				return usage(errors.New("--file is required (- for standard input)"))
			}
			if err := opts.Validate(); err != nil {
				return usage(err)
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
					return badData(fmt.Errorf("import file: %w", err))
				}
				defer fh.Close()
				r = fh
			}
			r = &checkedLines{r: bufio.NewReaderSize(r, 1<<20), skip: opts.Skip}
			ctx, stop := signalContext(cmd.Context(), exitTempFail, toolStopping(cmd.ErrOrStderr()), nil)
			defer stop()
			var pub *broker.Publisher
			if opts.DryRun {
				// A real run would find every publish unroutable: the dry
				// run says so first.
				if err := t.opener().CheckTarget(ctx, "", opts.To); err != nil {
					return err
				}
			} else {
				pub = broker.NewPublisher(broker.PublisherOptions{
					Options:        t.opts,
					Channels:       1,
					InFlight:       opts.Parallel,
					ConfirmTimeout: t.cfg.Broker.ConfirmTimeout.D(),
				})
			}
			rep, err := newProgress(cmd, "import to "+opts.To, progressMode)
			if err != nil {
				return err
			}
			total := countLines(file)
			opts.Progress = func(done int) { rep.Set(int64(done), total) }
			var dest dlq.Publisher
			if pub != nil {
				dest = pub
			}
			res, runErr := dlq.Import(ctx, r, dest, opts)
			rep.Finish()
			if pub != nil {
				if err := pub.Close(); err != nil {
					t.log.Warn("close publisher", "error", err.Error())
				}
			}
			if output == "json" {
				if err := writeJSON(cmd.OutOrStdout(), res); err != nil {
					return err
				}
			} else if opts.DryRun {
				fmt.Fprintf(cmd.OutOrStdout(), "dry run: would import %d message(s) to %s (%d line(s) read, %d skipped); nothing published\n", res.WouldPublish, res.To, res.Lines, res.Skipped)
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "imported %d message(s) to %s (%d line(s) read, %d skipped)\n", res.Published, res.To, res.Lines, res.Skipped)
			}
			if runErr != nil {
				err := fmt.Errorf("import stopped: %w; the first %d line(s) are all published: run again with --skip %d to resume", runErr, res.Through, res.Through)
				var bad *badLineError
				if errors.As(runErr, &bad) {
					return badData(err)
				}
				return tempFail(err)
			}
			return nil
		},
	}
	f.register(cmd.Flags())
	fs := cmd.Flags()
	fs.StringVar(&file, "file", "", "file to read (JSON Lines from export; - for standard input)")
	fs.StringVar(&to, "to", "", "queue to publish to (default: the DLQ)")
	fs.BoolVar(&opts.DryRun, "dry-run", false, "read and check every line, and report what would be published, publishing nothing")
	fs.IntVar(&opts.Skip, "skip", 0, "skip this many lines first (resume)")
	fs.IntVar(&opts.Parallel, "parallel", 64, "publishes awaiting their confirm at once; 1 keeps the file's order exactly")
	fs.StringVarP(&output, "output", "o", "table", "summary format: text (or table) or json")
	registerProgress(fs, &progressMode)
	return cmd
}

// badLineError is a line of an import file that is not an export record.
type badLineError struct {
	n   int
	err error
}

func (e *badLineError) Error() string {
	return fmt.Sprintf("not a line of an export: %v", e.err)
}

func (e *badLineError) Unwrap() error { return e.err }

// checkedLines hands an import its file line by line, each one first
// decoded as the import will decode it; at the first that does not decode
// it ends in a badLineError instead of the line. The import then stops
// there as it would have (every line before it handled, the bad one never
// published), and its error tells a file that is not valid (bad data) from
// a publish that failed (worth running again). Lines the import skips,
// the first skip and blank ones, are not checked, as the import does not
// read them either.
type checkedLines struct {
	r       *bufio.Reader
	skip    int
	n       int
	pending []byte
	err     error
}

func (c *checkedLines) Read(p []byte) (int, error) {
	for len(c.pending) == 0 {
		if c.err != nil {
			return 0, c.err
		}
		line, err := c.r.ReadBytes('\n')
		if len(line) > 0 {
			c.n++
			if c.n > c.skip && len(bytes.TrimSpace(line)) > 0 {
				if _, derr := dlq.UnmarshalLine(line); derr != nil {
					c.err = &badLineError{n: c.n, err: derr}
					return 0, c.err
				}
			}
		}
		c.pending, c.err = line, err // err (io.EOF at the end) once the line is handed on
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}
