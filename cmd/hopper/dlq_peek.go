package main

import (
	"bufio"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/msg"
)

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
messages are handed back in their places (on a quorum DLQ every message
is taken, those past N unshown, so the order holds; those near its
delivery limit, or all without --delivery-limit, are rotated: see hopper
dlq --help). --output json writes each message as one line of the export
format.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "json" && output != "text" {
				return usage(fmt.Errorf("--output %q: want text or json", output))
			}
			if n < 1 {
				return usage(fmt.Errorf("-n %d: want at least 1", n))
			}
			t, err := f.load(cmd, "peek")
			if err != nil {
				return err
			}
			ctx, stop := signalContext(cmd.Context(), exitTempFail, toolStopping(cmd.ErrOrStderr()), nil)
			defer stop()
			src, depth, rot, closeFn, err := t.browse(ctx)
			if err != nil {
				return err
			}
			defer closeFn()
			out := bufio.NewWriter(cmd.OutOrStdout())
			now := time.Now()
			i := 0
			res, err := dlq.Browse(ctx, src, dlq.BrowseOptions{Limit: min(n, depth), Bound: depth, Rotate: rot, OnBad: reportBad(cmd.ErrOrStderr())}, func(m *msg.Message) error {
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
				return interrupted(ctx, t.explain(err))
			}
			if output != "json" {
				fmt.Fprintf(out, "--- %d of %d message(s) in %s shown ---\n", i, depth, t.dlq)
				if res.Bad > 0 {
					fmt.Fprintf(out, "--- %d bad message(s) could not be shown (left in the DLQ) ---\n", res.Bad)
				}
			}
			if err := out.Flush(); err != nil {
				return fmt.Errorf("write: %w", err)
			}
			return nil
		},
	}
	f.register(cmd.Flags())
	f.registerLimit(cmd.Flags())
	cmd.Flags().IntVarP(&n, "count", "n", 10, "number of messages to show")
	cmd.Flags().IntVar(&bodyBytes, "body-bytes", 512, "largest body preview, in bytes")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	return cmd
}
