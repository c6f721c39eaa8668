package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/dlqconn"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/topology"
)

func newDLQCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "Inspect and recover the dead-letter queue: stats, peek, replay, export, import, purge",
		Long: `Operator tools for the dead-letter queue (DLQ).

The DLQ is the one of the configured work queue (the same --config, HOPPER_*
variables and flags as run; topology.dlq names it), or --dlq NAME. When the
config lists subscriptions, --queue NAME picks the subscription whose DLQ is
used; it may be left out when there is only one.

  stats    depth; counts by original queue, reason, final status; ages
  peek     show the first N messages (headers, body preview)
  replay   move messages back to their original queue (or --to)
  export   write messages to a JSON Lines file (--remove to take them out)
  import   publish the messages of such a file to the DLQ (or --to)
  purge    delete every message (asks first)
  console  web console: failure groups, messages, replay/edit/transform/export/purge

stats, peek and export read messages without removing them: each is taken
unacked and handed back when the command ends, in its place. A quorum DLQ
counts returns of a message (RabbitMQ 3.x every one; 4.x not the one a
tool that ends normally makes, but the one a killed tool's connection
makes) and drops it past its delivery limit, which policies set and AMQP
cannot read. So on a quorum DLQ a message one more return could bring to
the limit is rotated instead: a copy published to the DLQ and confirmed,
then the original acked. --delivery-limit N (or none) tells the tools the
limit; without it every message is rotated, and a tool killed mid-pass
leaves the copies in flight beside their originals. Either way a run
takes every message present at start once, so the DLQ ends in its order.
replay and export
--remove move a message (publish and confirm, or write and fsync) before
acking it, so killing them at any moment loses nothing; at most the
messages in flight end up in both places.`,
	}
	cmd.AddCommand(newDLQStatsCmd(), newDLQPeekCmd(), newDLQReplayCmd(), newDLQExportCmd(), newDLQImportCmd(), newDLQPurgeCmd(), newDLQConsoleCmd())
	return cmd
}

// dlqFlags are the flags every dlq subcommand has: the config ones, and
// --dlq to name the queue directly; and, for the tools that read the DLQ,
// --delivery-limit (registerLimit).
type dlqFlags struct {
	cf    configFlags
	name  string
	limit dlq.DeliveryLimit
}

func (f *dlqFlags) register(fs *pflag.FlagSet) {
	f.cf.user = forBroker
	f.cf.register(fs)
	fs.StringVar(&f.name, "dlq", "", "DLQ to work on (default: the DLQ of queue.name, or of the subscription --queue picks, from topology.dlq)")
}

// registerLimit adds --delivery-limit, for a tool that hands back
// messages it read.
func (f *dlqFlags) registerLimit(fs *pflag.FlagSet) {
	fs.Var(limitValue{&f.limit}, "delivery-limit", deliveryLimitHelp)
}

// deliveryLimitHelp explains --delivery-limit: policies cannot be read
// over AMQP, so without it every message of a quorum DLQ is rotated.
const deliveryLimitHelp = "the quorum DLQ's delivery limit, as its policy or x-delivery-limit sets it (a count, or none): " +
	"a message one more return would bring to it (x-delivery-count >= N-1) is rotated (copied to the tail, then acked), " +
	"the others are handed back in place as on a classic DLQ; default unknown, which rotates every message (policies cannot be read over AMQP)"

// limitValue is --delivery-limit as a flag value.
type limitValue struct{ l *dlq.DeliveryLimit }

func (v limitValue) String() string {
	if v.l == nil {
		return ""
	}
	return v.l.String()
}

func (v limitValue) Set(s string) error {
	l, err := dlq.ParseDeliveryLimit(s)
	if err != nil {
		return err
	}
	if l == dlq.UnknownDeliveryLimit {
		return fmt.Errorf("delivery limit %q: want a count of at least 1, or none", s)
	}
	*v.l = l
	return nil
}

func (limitValue) Type() string { return "N|none" }

// target is what a dlq subcommand works with.
type target struct {
	cfg  config.Config
	dlq  string
	log  *slog.Logger
	opts broker.Options
	// limit is the DLQ's delivery limit as --delivery-limit gives it.
	limit dlq.DeliveryLimit
	// partitioned are the config's partitioned work queues: a message
	// dead-lettered from one of their partitions is replayed through the
	// partitions exchange.
	partitioned map[string]bool
}

// through is dlq.ReplayOptions.Through for the config's partitioned
// queues: the partitions exchange of a queue that is one of their
// partitions.
func (t *target) through(queue string) (string, bool) {
	ex, ok := topology.PartitionExchange(queue)
	if !ok {
		return "", false
	}
	for base := range t.partitioned {
		if config.PartitionExchange(base) == ex {
			return ex, true
		}
	}
	return "", false
}

// load reads the config like run does. With --dlq the work queue is not
// needed, so queue.name is filled with the DLQ name for validation only.
// With subscriptions queue.name stays empty (they name the queues), and
// --queue instead picks the subscription whose DLQ is used.
func (f *dlqFlags) load(cmd *cobra.Command, role string) (*target, error) {
	queueFlag := cmd.Flags().Lookup("queue")
	pick := ""
	if f.fileHasSubscriptions() {
		if queueFlag.Changed {
			// Not applied as queue.name, which must stay empty next to
			// subscriptions.
			pick = queueFlag.Value.String()
			queueFlag.Changed = false
			defer func() { queueFlag.Changed = true }()
		}
	} else if f.name != "" && !queueFlag.Changed {
		if err := cmd.Flags().Set("queue", f.name); err != nil {
			return nil, usage(fmt.Errorf("--dlq: %w", err))
		}
	}
	cfg, err := f.cf.load(cmd)
	if err != nil {
		return nil, err
	}
	t := &target{cfg: cfg, dlq: f.name, limit: f.limit, partitioned: map[string]bool{}}
	for _, e := range cfg.SubscriptionConfigs() {
		if e.Topology.Partitions.On() {
			t.partitioned[e.Queue.Name] = true
		}
	}
	if cfg.Multi() {
		eff, err := pickSubscription(&cfg, pick, f.name != "")
		if err != nil {
			return nil, usage(err)
		}
		t.cfg = eff
	}
	if t.dlq == "" {
		plan := topology.FromConfig(&t.cfg)
		t.dlq = plan.DLQ.Name
	}
	t.log = newLogger(cfg.Log, cmd.ErrOrStderr())
	t.opts = broker.ConfigOptions(cfg.Broker, t.log, "hopper-dlq-"+role+" "+t.dlq)
	return t, nil
}

// fileHasSubscriptions tells, before the config is loaded and validated,
// whether its file lists subscriptions: only the file can, neither HOPPER_*
// variables nor flags. A file that cannot be read or parsed is left to load
// to report.
func (f *dlqFlags) fileHasSubscriptions() bool {
	if f.cf.file == "" {
		return false
	}
	cfg, _, _ := config.Load(f.cf.file, nil)
	return cfg.Multi()
}

// pickSubscription returns the effective config of the subscription a dlq
// tool works on: the one whose queue --queue names, else the only one. With
// several and no --queue, --dlq alone names the DLQ and the top-level
// config serves for the rest (the broker); without --dlq either the choice
// is the operator's.
func pickSubscription(cfg *config.Config, queue string, haveDLQ bool) (config.Config, error) {
	effs := cfg.SubscriptionConfigs()
	names := make([]string, len(effs))
	for i := range effs {
		names[i] = effs[i].Queue.Name
	}
	switch {
	case queue != "":
		for i := range effs {
			if effs[i].Queue.Name == queue {
				return effs[i], nil
			}
		}
		return config.Config{}, fmt.Errorf("--queue %q names no subscription; the config's subscriptions consume %s", queue, strings.Join(names, ", "))
	case len(effs) == 1:
		return effs[0], nil
	case haveDLQ:
		return *cfg, nil
	}
	return config.Config{}, fmt.Errorf("the config lists %d subscriptions: choose whose DLQ with --queue (one of %s), or name the DLQ with --dlq", len(effs), strings.Join(names, ", "))
}

// explain turns broker errors into what the operator should know. A DLQ
// another tool owns is a temporary failure: it is free again when that
// tool ends.
func (t *target) explain(err error) error {
	switch {
	case errors.Is(err, broker.ErrInUse):
		return tempFail(fmt.Errorf("another replayer owns DLQ %q: the broker refused an exclusive consumer because the queue already has a consumer; only one replay or export --remove may run on a DLQ at a time (%w)", t.dlq, err))
	case errors.Is(err, broker.ErrNoQueue), errors.Is(err, broker.ErrTopology):
		return fmt.Errorf("DLQ %q does not exist (check --dlq, --queue, queue.name and topology.dlq): %w", t.dlq, err)
	}
	return err
}

// opener opens the DLQ on the config's broker, as every DLQ tool does.
func (t *target) opener() *dlqconn.Opener {
	return &dlqconn.Opener{Opts: t.opts, ConfirmTimeout: t.cfg.Broker.ConfirmTimeout.D(), DeliveryLimit: t.limit, Log: t.log}
}

// browse opens the DLQ for reading without removing anything: every
// message taken is handed back, in its place, when close is called, except
// on a quorum DLQ those the tool must rotate (see dlq.Rotation), through
// rot.
func (t *target) browse(ctx context.Context) (src dlq.Source, depth int, rot *dlq.Rotation, closeFn func(), err error) {
	p, err := t.opener().Browse(ctx, t.dlq)
	if err != nil {
		return nil, 0, nil, nil, t.explain(err)
	}
	return p.Source, p.Present, p.Rotate, p.Close, nil
}

// rotation tells how a tool hands the messages it does not remove back to
// the DLQ (see dlqconn.Opener.Rotation).
func (t *target) rotation(ctx context.Context) (*dlq.Rotation, func(), error) {
	rot, closeRot, err := t.opener().Rotation(ctx, t.dlq)
	if err != nil {
		return nil, nil, t.explain(err)
	}
	return rot, closeRot, nil
}

// reportBad writes a line for each message a tool could not process.
func reportBad(w io.Writer) func(int, error) {
	return func(n int, err error) {
		fmt.Fprintf(w, "warning: message %d skipped (left in the DLQ): %v\n", n, err)
	}
}

// checkOutput checks -o of the dlq summaries: text (table, the name they
// had first) or json, so that -o text is right on every command.
func checkOutput(o string) error {
	if o != "text" && o != "table" && o != "json" {
		return usage(fmt.Errorf("--output %q: want text (or table) or json", o))
	}
	return nil
}

// interrupted marks err a temporary failure when the run was stopped by a
// signal: nothing was lost, and the tool may be run again.
func interrupted(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return tempFail(err)
	}
	return err
}

// filterFlags are the message filters of replay and export.
type filterFlags struct {
	// fs is where the flags were registered, to tell a flag given an
	// empty value from one not given.
	fs                                            *pflag.FlagSet
	ids, queues, reasons, statuses, keys, headers []string
	olderThan, newerThan                          time.Duration
}

func (ff *filterFlags) register(fs *pflag.FlagSet) {
	ff.fs = fs
	fs.StringSliceVar(&ff.ids, "message-id", nil, "only messages with one of these message ids (repeatable, or comma-separated)")
	fs.StringSliceVar(&ff.queues, "original-queue", nil, "only messages whose x-original-queue is one of these (--queue names the work queue whose DLQ is used, as for run)")
	fs.StringSliceVar(&ff.reasons, "reason", nil, reasonHelp())
	fs.StringSliceVar(&ff.statuses, "status", nil, "only these final statuses: codes (503) or classes (5xx); 0 is no response")
	fs.StringSliceVar(&ff.keys, "routing-key", nil, "only these original routing keys (AMQP topic patterns: * one word, # any)")
	fs.StringArrayVar(&ff.headers, "header", nil, "only messages with this header: name=value, or name for any value (repeatable, all must match)")
	fs.DurationVar(&ff.olderThan, "older-than", 0, "only messages in the DLQ for longer than this (e.g. 1h)")
	fs.DurationVar(&ff.newerThan, "newer-than", 0, "only messages in the DLQ for less than this (e.g. 30m)")
}

// reasonHelp lists every dead-letter reason once, grouped by who writes
// it: expired is written both by Hopper (its deadline) and the broker (a
// TTL).
func reasonHelp() string {
	var hopperOnly, both []string
	brokerOnly := dlq.BrokerOnlyReasons()
	for _, r := range dlq.Reasons() {
		switch {
		case slices.Contains(brokerOnly, r):
		case slices.Contains(msg.BrokerReasons, r):
			both = append(both, r)
		default:
			hopperOnly = append(hopperOnly, r)
		}
	}
	return "only these dead-letter reasons: Hopper's " + strings.Join(hopperOnly, ", ") +
		"; Hopper's or the broker's " + strings.Join(both, ", ") +
		"; the broker's " + strings.Join(brokerOnly, ", ")
}

func (ff *filterFlags) filter() (dlq.Filter, error) {
	f := dlq.Filter{
		MessageIDs: ff.ids, Queues: ff.queues, Reasons: ff.reasons, Statuses: ff.statuses, RoutingKeys: ff.keys,
		OlderThan: ff.olderThan, NewerThan: ff.newerThan,
	}
	// A list flag given only an empty value parses as no list at all,
	// which selects every message: `--message-id "$ID"` with ID unset
	// would replay the whole DLQ.
	if ff.fs != nil {
		for _, l := range []struct {
			name string
			v    []string
		}{{"message-id", ff.ids}, {"original-queue", ff.queues}, {"reason", ff.reasons}, {"status", ff.statuses}, {"routing-key", ff.keys}} {
			if fl := ff.fs.Lookup(l.name); fl != nil && fl.Changed && len(l.v) == 0 {
				return f, usage(fmt.Errorf("--%s: empty value; leave the flag out to select every message", l.name))
			}
		}
	}
	for _, h := range ff.headers {
		hm, err := dlq.ParseHeaderMatch(h)
		if err != nil {
			return f, usage(fmt.Errorf("--header: %w", err))
		}
		f.Headers = append(f.Headers, hm)
	}
	if err := f.Validate(); err != nil {
		return f, usage(err)
	}
	return f, nil
}

// isTerminal reports whether r is an interactive terminal: a character
// device other than /dev/null, which is what a container, a cron job or a
// CI step without a TTY gets as standard input.
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	null, err := os.Stat(os.DevNull)
	return err == nil && !os.SameFile(fi, null)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}
