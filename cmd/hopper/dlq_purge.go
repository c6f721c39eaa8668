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
			if !yes {
				ok, err := confirmPurge(cmd.InOrStdin(), cmd.ErrOrStderr(), isTerminal(cmd.InOrStdin()), t.dlq, depth)
				if errors.Is(err, errNoTerminal) {
					return usage(err)
				}
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
