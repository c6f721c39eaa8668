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
	cmd := &cobra.Command{Use: "config", Short: "Check configuration and describe its keys"}
	var cf configFlags
	var output string
	validate := &cobra.Command{
		Use:   "validate",
		Short: "Load file, HOPPER_* environment and flags, and report every problem at once",
		Long: `Loads the config file, the HOPPER_* environment and the flags as run would,
and reports every problem at once, each with its key path (exit 65), or
what the config consumes.

-o json prints one JSON document on standard output: ok; queues (queue,
delayTiers, dlq for each consumed queue, and its routes and filter when it
has routing rules); partitions when they are on;
warnings; and errors, each with its key path, the flag it came from when
it came from one (source), and the message.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkTextOutput(output); err != nil {
				return err
			}
			cfg, plans, err := loadPlans(cmd, &cf)
			if output == "json" {
				doc := validateResult{OK: true}
				if err == nil {
					doc.fill(cfg, plans)
				}
				return jsonResult(cmd, &doc, err)
			}
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
					printRouting(cmd.OutOrStdout(), "  ", &cfg)
					return nil
				}
				fmt.Fprintf(cmd.OutOrStdout(), "config OK: queue %q, %d delay tier(s), DLQ %q\n",
					plan.Work.Name, len(plan.Tiers), plan.DLQ.Name)
				printRouting(cmd.OutOrStdout(), "  ", &cfg)
				return nil
			}
			for _, plan := range plans {
				for _, w := range plan.Warnings() {
					fmt.Fprintf(cmd.ErrOrStderr(), "warning: queue %q: %s\n", plan.Work.Name, w)
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "config OK: %s\n", plural(len(cfg.Subscriptions), "subscription"))
			consumed := cfg.Consumed()
			for i, plan := range plans {
				fmt.Fprintf(cmd.OutOrStdout(), "  queue %q, %d delay tier(s), DLQ %q\n",
					plan.Work.Name, len(plan.Tiers), plan.DLQ.Name)
				if i < len(consumed) {
					printRouting(cmd.OutOrStdout(), "    ", &consumed[i])
				}
			}
			return nil
		},
	}
	cf.register(validate.Flags())
	validate.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	cmd.AddCommand(validate, newExplainCmd())
	return cmd
}

// validateResult is the -o json document of config validate.
type validateResult struct {
	OK         bool           `json:"ok"`
	Queues     []plannedQueue `json:"queues,omitempty"`
	Partitions *partitionsDoc `json:"partitions,omitempty"`
	Warnings   []string       `json:"warnings,omitempty"`
	Errors     []jsonError    `json:"errors,omitempty"`
}

// plannedQueue is one consumed queue of a valid config.
type plannedQueue struct {
	Queue      string `json:"queue"`
	DelayTiers int    `json:"delayTiers"`
	DLQ        string `json:"dlq"`
	// Routes and Filter are the queue's routing rules, by route name and
	// the filter's expression.
	Routes []string `json:"routes,omitempty"`
	Filter string   `json:"filter,omitempty"`
}

// printRouting writes a line naming c's routes, in order with their paths,
// and its filter with what becomes of the messages it makes false and of
// those it cannot be evaluated for, when it has routing rules.
func printRouting(w io.Writer, indent string, c *config.Config) {
	if !c.Routed() {
		return
	}
	line := indent + "routes:"
	if len(c.Routes) == 0 {
		line += " none"
	}
	for i, r := range c.Routes {
		if i > 0 {
			line += ","
		}
		path := r.Path
		if path == "" {
			path = "(queue's path)"
		}
		line += fmt.Sprintf(" %s → %s", r.Name, path)
		if r.Retry != nil {
			line += " (own retry policy)"
		}
	}
	if c.Filter != "" {
		on := c.OnFiltered
		if on == "" {
			on = "ack"
		}
		onErr := c.OnFilterError
		if onErr == "" {
			onErr = "dlq"
		}
		line += fmt.Sprintf("; filter %q, filtered messages: %s, filter errors: %s", c.Filter, on, onErr)
	}
	fmt.Fprintln(w, line)
}

// partitionsDoc describes a queue consumed as partitions.
type partitionsDoc struct {
	Queue    string `json:"queue"`
	Count    int    `json:"count"`
	Exchange string `json:"exchange"`
}

func (r *validateResult) fail(errs []jsonError) { r.OK, r.Errors = false, errs }

// fill records what a valid config consumes, with the plans' warnings.
func (r *validateResult) fill(cfg config.Config, plans []topology.Plan) {
	warned := plans
	if p := cfg.Topology.Partitions; !cfg.Multi() && p.On() {
		r.Partitions = &partitionsDoc{Queue: cfg.Queue.Name, Count: p.Count, Exchange: config.PartitionExchange(cfg.Queue.Name)}
		// Every partition is planned alike: the first one's warnings
		// stand for all.
		warned = plans[:1]
	}
	consumed := cfg.Consumed()
	for i, plan := range plans {
		q := plannedQueue{Queue: plan.Work.Name, DelayTiers: len(plan.Tiers), DLQ: plan.DLQ.Name}
		if i < len(consumed) {
			for _, rt := range consumed[i].Routes {
				q.Routes = append(q.Routes, rt.Name)
			}
			q.Filter = consumed[i].Filter
		}
		r.Queues = append(r.Queues, q)
	}
	for _, plan := range warned {
		for _, w := range plan.Warnings() {
			r.Warnings = append(r.Warnings, fmt.Sprintf("queue %q: %s", plan.Work.Name, w))
		}
	}
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
				if err := checkTextOutput(output); err != nil {
					return err
				}
				cfg, plans, err := loadPlans(cmd, &cf)
				if sub.declare == nil {
					if err != nil {
						return err
					}
					return printPlans(cmd.OutOrStdout(), plans, len(plans) > 1 || cfg.Multi(), output)
				}
				doc := &applyResult{OK: true, Action: sub.name}
				if err == nil {
					err = applyPlans(cmd, cfg, plans, *sub.declare, output == "text", doc)
				}
				if output == "json" {
					return jsonResult(cmd, doc, err)
				}
				return err
			},
		}
		cf.register(c.Flags())
		c.Flags().StringVarP(&output, "output", "o", "text", "text or json")
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

// applyResult is the -o json document of topology apply and verify: what
// was declared or checked, queue by work queue, and what failed.
type applyResult struct {
	OK     bool   `json:"ok"`
	Action string `json:"action"`
	// Queues are the work queues whose topology was declared or found as
	// planned, in order; the one that failed is in Errors, and those after
	// it were not tried.
	Queues []appliedPlan `json:"queues"`
	// Totals count each queue, exchange and binding on the broker once,
	// however many work queues share it.
	Totals *applyTotals `json:"totals,omitempty"`
	Errors []jsonError  `json:"errors,omitempty"`
	// failedQueue is the work queue whose topology failed.
	failedQueue string
}

type appliedPlan struct {
	Queue     string       `json:"queue"`
	Queues    []string     `json:"queues"`
	Exchanges []string     `json:"exchanges,omitempty"`
	Bindings  []bindingDoc `json:"bindings,omitempty"`
}

type bindingDoc struct {
	Exchange   string `json:"exchange"`
	Queue      string `json:"queue,omitempty"`
	ToExchange string `json:"toExchange,omitempty"`
	RoutingKey string `json:"routingKey"`
}

type applyTotals struct {
	Queues    int `json:"queues"`
	Exchanges int `json:"exchanges"`
	Bindings  int `json:"bindings"`
}

func (r *applyResult) fail(errs []jsonError) {
	r.OK = false
	// A failure of one work queue's topology names that queue.
	for i := range errs {
		if q := r.failedQueue; q != "" && errs[i].Queue == "" {
			errs[i].Queue = q
		}
	}
	r.Errors = errs
}

func (r *applyResult) add(plan *topology.Plan) {
	p := appliedPlan{Queue: plan.Work.Name}
	for _, q := range plan.Queues() {
		p.Queues = append(p.Queues, q.Name)
	}
	for _, e := range plan.Exchanges {
		p.Exchanges = append(p.Exchanges, e.Name)
	}
	for _, b := range plan.Bindings {
		p.Bindings = append(p.Bindings, bindingDoc{Exchange: b.Exchange, Queue: b.Queue, ToExchange: b.ToExchange, RoutingKey: b.RoutingKey})
	}
	r.Queues = append(r.Queues, p)
}

// applyPlans declares or verifies every plan in turn with the same broker
// options, and stops at the first that fails, naming its subscription.
// Subscriptions may bind the same exchange: declaring it again with the
// same type is a no-op for the broker, and verify only checks it. What was
// done goes into doc, and with text to standard output as it is done.
func applyPlans(cmd *cobra.Command, cfg config.Config, plans []topology.Plan, declare, text bool, doc *applyResult) error {
	log := newLogger(cfg.Log, cmd.ErrOrStderr())
	opts := broker.ConfigOptions(cfg.Broker, log, "hopper-topology")
	verb := map[bool]string{true: "applied", false: "verified"}[declare]
	out := io.Discard
	if text {
		out = cmd.OutOrStdout()
	}
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
			doc.failedQueue = plan.Work.Name
			if !multi {
				return err
			}
			if len(plans) != len(cfg.Subscriptions) {
				return fmt.Errorf("queue %q: %w", plan.Work.Name, err)
			}
			return fmt.Errorf("subscriptions[%d] (queue %q): %w", i, plan.Work.Name, err)
		}
		doc.add(plan)
		if !multi {
			doc.Totals = &applyTotals{Queues: len(plan.Queues()), Exchanges: len(plan.Exchanges), Bindings: len(plan.Bindings)}
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
	doc.Totals = &applyTotals{Queues: len(queueNames), Exchanges: len(exchanges), Bindings: bindings}
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
