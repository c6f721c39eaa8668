package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/hopper-sidecar/hopper/broker"
)

func newDLQPurgeCmd() *cobra.Command {
	var f dlqFlags
	var yes, dryRun bool
	var output string
	cmd := &cobra.Command{
		Use:   "purge",
		Short: "Delete every message in the DLQ (asks for confirmation, or --yes)",
		Long: `Deletes every ready message in the DLQ and reports how many. It asks for
confirmation on a terminal; without one (a script, a pipe) it refuses unless
--yes is given. Consider export --remove first: it keeps a copy.

--dry-run counts what would be deleted and deletes nothing (no confirmation
asked). -o json prints one JSON document: ok, dlq, purged (or dryRun and
wouldPurge, or cancelled), and errors when it failed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkTextOutput(output); err != nil {
				return err
			}
			res := purgeResult{OK: true}
			err := purge(cmd, &f, yes, dryRun, &res)
			if output == "json" {
				return jsonResult(cmd, &res, err)
			}
			if err != nil {
				return err
			}
			switch {
			case res.Cancelled:
				fmt.Fprintln(cmd.OutOrStdout(), "purge cancelled; nothing deleted")
			case res.DryRun:
				fmt.Fprintf(cmd.OutOrStdout(), "dry run: would purge %d message(s) from %s; nothing deleted\n", res.WouldPurge, res.DLQ)
			default:
				fmt.Fprintf(cmd.OutOrStdout(), "purged %d message(s) from %s\n", res.Purged, res.DLQ)
			}
			return nil
		},
	}
	f.register(cmd.Flags())
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "count the messages that would be deleted, deleting nothing")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	return cmd
}

// purgeResult is what purge did, the document of -o json.
type purgeResult struct {
	OK         bool        `json:"ok"`
	DLQ        string      `json:"dlq,omitempty"`
	Purged     int         `json:"purged"`
	DryRun     bool        `json:"dryRun,omitempty"`
	WouldPurge int         `json:"wouldPurge,omitempty"`
	Cancelled  bool        `json:"cancelled,omitempty"`
	Errors     []jsonError `json:"errors,omitempty"`
}

func (r *purgeResult) fail(errs []jsonError) { r.OK, r.Errors = false, errs }

// purge deletes (or with dryRun counts) the DLQ's ready messages into res.
func purge(cmd *cobra.Command, f *dlqFlags, yes, dryRun bool, res *purgeResult) error {
	t, err := f.load(cmd, "purge")
	if err != nil {
		return err
	}
	ctx, stop := signalContext(cmd.Context(), exitTempFail, toolStopping(cmd.ErrOrStderr()), nil)
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
	res.DLQ = t.dlq
	if dryRun {
		res.DryRun, res.WouldPurge = true, depth
		return nil
	}
	if !yes {
		ok, err := confirmPurge(cmd.InOrStdin(), cmd.ErrOrStderr(), isTerminal(cmd.InOrStdin()), t.dlq, depth)
		if errors.Is(err, errNoTerminal) {
			return usage(err)
		}
		if err != nil {
			return err
		}
		if !ok {
			res.Cancelled = true
			return nil
		}
	}
	n, err := in.Purge(t.dlq)
	if err != nil {
		return err
	}
	res.Purged = n
	return nil
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
