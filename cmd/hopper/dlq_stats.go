package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/msg"
)

func newDLQStatsCmd() *cobra.Command {
	var f dlqFlags
	var output string
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Depth, counts by original queue, reason and status, oldest and newest age",
		Long: `Reads every message present without acking it (basic.get on a classic DLQ, a
consumer on a quorum one) and hands them all back when done, so the DLQ is left
as it was, order included (on a quorum DLQ the messages near its delivery
limit, or all without --delivery-limit, are rotated: see hopper dlq --help).
Ages come from x-dead-letter-time, else the AMQP timestamp.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			t, err := f.load(cmd, "stats")
			if err != nil {
				return err
			}
			ctx, stop := signalContext(cmd.Context(), exitTempFail, toolStopping(cmd.ErrOrStderr()), nil)
			defer stop()
			src, depth, rot, closeFn, err := t.browse(ctx)
			if err != nil {
				return err
			}
			st := dlq.NewStats(t.dlq, depth, time.Now())
			res, err := dlq.Browse(ctx, src, dlq.BrowseOptions{Limit: depth, Bound: depth, Rotate: rot, OnBad: reportBad(cmd.ErrOrStderr())},
				func(m *msg.Message) error { st.Add(m); return nil })
			st.Bad = res.Bad
			closeFn()
			if err != nil {
				return interrupted(ctx, t.explain(err))
			}
			if output == "json" {
				return st.WriteJSON(cmd.OutOrStdout())
			}
			return st.WriteTable(cmd.OutOrStdout())
		},
	}
	f.register(cmd.Flags())
	f.registerLimit(cmd.Flags())
	cmd.Flags().StringVarP(&output, "output", "o", "table", "text (or table) or json")
	return cmd
}
