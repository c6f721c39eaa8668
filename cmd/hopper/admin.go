package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/config"
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
			cfg, plans, err := loadPlans(cmd, &cf)
			if err != nil {
				return err
			}
			if !cfg.Multi() {
				plan := plans[0]
				for _, w := range plan.Warnings() {
					fmt.Fprintf(cmd.ErrOrStderr(), "warning: %s\n", w)
				}
				if p := cfg.Topology.Partitions; p.On() {
					// Every partition is planned alike: the first one's
					// warnings stand for all.
					fmt.Fprintf(cmd.OutOrStdout(), "config OK: queue %q in %d partition(s) %s … %s behind exchange %q, %d delay tier(s) each, DLQ %q\n",
						cfg.Queue.Name, p.Count, plan.Work.Name, plans[len(plans)-1].Work.Name, config.PartitionExchange(cfg.Queue.Name), len(plan.Tiers), plan.DLQ.Name)
					return nil
				}
				fmt.Fprintf(cmd.OutOrStdout(), "config OK: queue %q, %d delay tier(s), DLQ %q\n",
					plan.Work.Name, len(plan.Tiers), plan.DLQ.Name)
				return nil
			}
			for _, plan := range plans {
				for _, w := range plan.Warnings() {
					fmt.Fprintf(cmd.ErrOrStderr(), "warning: queue %q: %s\n", plan.Work.Name, w)
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "config OK: %s\n", plural(len(cfg.Subscriptions), "subscription"))
			for _, plan := range plans {
				fmt.Fprintf(cmd.OutOrStdout(), "  queue %q, %d delay tier(s), DLQ %q\n",
					plan.Work.Name, len(plan.Tiers), plan.DLQ.Name)
			}
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
back to the work queue only) and a dead-letter queue. With subscriptions,
each subscription's queue has its own; every command acts on all of them.

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
		cf := configFlags{user: forBroker}
		if sub.declare == nil {
			cf.user = forPlan
		}
		var output string
		c := &cobra.Command{
			Use:   sub.name,
			Short: sub.short,
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				if sub.declare == nil && output != "text" && output != "json" {
					return usage(fmt.Errorf("--output %q: want text or json", output))
				}
				cfg, plans, err := loadPlans(cmd, &cf)
				if err != nil {
					return err
				}
				if sub.declare == nil {
					return printPlans(cmd.OutOrStdout(), plans, len(plans) > 1 || cfg.Multi(), output)
				}
				return applyPlans(cmd, cfg, plans, *sub.declare)
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

// loadPlans loads the config and computes one topology plan per consumed
// queue, in the order of the subscriptions (one plan without them).
func loadPlans(cmd *cobra.Command, cf *configFlags) (config.Config, []topology.Plan, error) {
	cfg, err := cf.load(cmd)
	if err != nil {
		return cfg, nil, err
	}
	effs := cfg.Consumed()
	plans := make([]topology.Plan, len(effs))
	for i := range effs {
		plans[i] = topology.FromConfig(&effs[i])
	}
	return cfg, plans, nil
}

// printPlans writes the plans for `hopper topology plan`. A single queue's
// plan is printed as it always was; with subscriptions each plan follows a
// heading naming its queue, and the JSON form wraps the documents.
func printPlans(w io.Writer, plans []topology.Plan, multi bool, output string) error {
	if !multi {
		if output == "json" {
			return writeJSON(w, plans[0].Document())
		}
		_, err := fmt.Fprint(w, plans[0].String())
		return err
	}
	if output == "json" {
		docs := make([]topology.Document, len(plans))
		for i := range plans {
			docs[i] = plans[i].Document()
		}
		return writeJSON(w, struct {
			Subscriptions []topology.Document `json:"subscriptions"`
		}{docs})
	}
	for i := range plans {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "== queue %q ==\n", plans[i].Work.Name)
		if _, err := fmt.Fprint(w, plans[i].String()); err != nil {
			return err
		}
	}
	return nil
}

// applyPlans declares or verifies every plan in turn with the same broker
// options, and stops at the first that fails, naming its subscription.
// Subscriptions may bind the same exchange: declaring it again with the
// same type is a no-op for the broker, and verify only checks it.
func applyPlans(cmd *cobra.Command, cfg config.Config, plans []topology.Plan, declare bool) error {
	log := newLogger(cfg.Log, cmd.ErrOrStderr())
	opts := broker.ConfigOptions(cfg.Broker, log, "hopper-topology")
	verb := map[bool]string{true: "applied", false: "verified"}[declare]
	out := cmd.OutOrStdout()
	// Partitions make several plans of one queue: each is reported like a
	// subscription's.
	multi := cfg.Multi() || len(plans) > 1
	bindings := 0
	queueNames, exchanges := map[string]bool{}, map[string]bool{}
	for i := range plans {
		plan := &plans[i]
		if declare {
			plan.Declare = true
		}
		if err := applyOne(cmd.Context(), opts, plan, declare); err != nil {
			if !multi {
				return err
			}
			if len(plans) != len(cfg.Subscriptions) {
				return fmt.Errorf("queue %q: %w", plan.Work.Name, err)
			}
			return fmt.Errorf("subscriptions[%d] (queue %q): %w", i, plan.Work.Name, err)
		}
		if !multi {
			fmt.Fprintf(out, "topology %s: OK %s\n", verb, counts(len(plan.Queues()), len(plan.Exchanges), len(plan.Bindings)))
			return nil
		}
		fmt.Fprintf(out, "topology %s: queue %q OK %s\n", verb, plan.Work.Name, counts(len(plan.Queues()), len(plan.Exchanges), len(plan.Bindings)))
		for _, q := range plan.Queues() {
			queueNames[q.Name] = true
		}
		bindings += len(plan.Bindings)
		for _, e := range plan.Exchanges {
			exchanges[e.Name] = true
		}
	}
	// An exchange shared by several subscriptions is one exchange on the
	// broker, so the total counts it once; so is the DLQ partitions share.
	noun := "subscription"
	if len(plans) != len(cfg.Subscriptions) {
		noun = "work queue"
	}
	fmt.Fprintf(out, "topology %s: OK (%s, %s)\n", verb, plural(len(plans), noun), countList(len(queueNames), len(exchanges), bindings))
	return nil
}

// applyOne declares or verifies one plan, each within its own time limit so
// that many subscriptions do not share one.
func applyOne(ctx context.Context, opts broker.Options, plan *topology.Plan, declare bool) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return broker.Apply(ctx, opts, plan, declare)
}

// counts is the "(4 queues, 2 exchanges, 3 bindings)" of the topology
// commands; exchanges and bindings show only when there are some.
func counts(queues, exchanges, bindings int) string {
	return "(" + countList(queues, exchanges, bindings) + ")"
}

func countList(queues, exchanges, bindings int) string {
	if exchanges == 0 {
		return fmt.Sprintf("%d queues", queues)
	}
	return fmt.Sprintf("%d queues, %d exchanges, %d bindings", queues, exchanges, bindings)
}

// plural is "1 subscription" or "2 subscriptions".
func plural(n int, word string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}

func ptr[T any](v T) *T { return &v }
