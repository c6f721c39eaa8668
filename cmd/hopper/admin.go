package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/topology"
)

func newConfigCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "config", Short: "Check configuration"}
	var cf configFlags
	validate := &cobra.Command{
		Use:   "validate",
		Short: "Load file, HOPPER_* environment and flags, and report every problem at once",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := cf.load(cmd)
			if err != nil {
				return err
			}
			plan := topology.FromConfig(&cfg)
			for _, w := range plan.Warnings() {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: %s\n", w)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "config OK: queue %q, %d delay tier(s), DLQ %q\n",
				cfg.Queue.Name, len(plan.Tiers), plan.DLQ.Name)
			return nil
		},
	}
	cf.register(validate.Flags())
	cmd.AddCommand(validate)
	return cmd
}

func newTopologyCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "topology",
		Short: "Print, declare or verify the queues Hopper uses",
		Long: `Hopper uses the work queue, one delay queue per retry tier (each dead-letters
back to the work queue only) and a dead-letter queue.

  plan    print the queues and their arguments (no broker needed)
  apply   declare them (idempotent; fails if one exists with other arguments)
  verify  check they exist with the planned arguments, creating nothing`,
	}
	for _, sub := range []struct {
		name, short string
		declare     *bool
	}{
		{"plan", "Print the topology", nil},
		{"apply", "Declare the topology", ptr(true)},
		{"verify", "Verify the topology without creating anything", ptr(false)},
	} {
		cf := configFlags{tool: true}
		var output string
		c := &cobra.Command{
			Use:   sub.name,
			Short: sub.short,
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				cfg, err := cf.load(cmd)
				if err != nil {
					return err
				}
				plan := topology.FromConfig(&cfg)
				if sub.declare == nil {
					switch output {
					case "text":
						fmt.Fprint(cmd.OutOrStdout(), plan.String())
						return nil
					case "json":
						return writeJSON(cmd.OutOrStdout(), plan.Document())
					}
					return fmt.Errorf("--output %q: want text or json", output)
				}
				log := newLogger(cfg.Log, cmd.ErrOrStderr())
				ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
				defer cancel()
				if *sub.declare {
					plan.Declare = true
				}
				if err := broker.Apply(ctx, broker.ConfigOptions(cfg.Broker, log, "hopper-topology"), &plan, *sub.declare); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "topology %s: OK (%d queues", map[bool]string{true: "applied", false: "verified"}[*sub.declare], len(plan.Queues()))
				if len(plan.Exchanges) > 0 {
					fmt.Fprintf(cmd.OutOrStdout(), ", %d exchanges, %d bindings", len(plan.Exchanges), len(plan.Bindings))
				}
				fmt.Fprintln(cmd.OutOrStdout(), ")")
				return nil
			},
		}
		cf.register(c.Flags())
		if sub.declare == nil {
			c.Flags().StringVarP(&output, "output", "o", "text", "text or json")
		}
		cmd.AddCommand(c)
	}
	return cmd
}

func ptr[T any](v T) *T { return &v }
