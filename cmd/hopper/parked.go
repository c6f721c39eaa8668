package main

import (
	"bufio"
	"context"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/schedule"
	"github.com/hopper-sidecar/hopper/topology"
)

func newParkedCmd() *cobra.Command {
	var f dlqFlags
	var output string
	cmd := &cobra.Command{
		Use:   "parked",
		Short: "List the scheduled messages parked until due: id, due time, time left, parking queue",
		Long: `Lists the messages of the work queue that wait in its parking queues
(schedule.enabled): each one's message id, due time, the time left until
then, and the parking queue it was read from, soonest due first. The same
--config, HOPPER_* variables and flags as run name the queue; with
subscriptions, --queue picks one.

Nothing is removed or delayed. A parking queue is read as the DLQ tools
read a quorum DLQ (each message copied, the copy confirmed, then the
original acked: no delivery of the queue's delivery limit is spent), but
the copy goes where the schedule puts the message now, not to the tail of
the queue it came from, where it would wait that queue's whole delay
again: to the parking queue of the longest step its time left allows, or
to the work queue once it is due. That is one more hop of the kind Hopper
makes on every step, from the absolute due time the message carries, so
it reaches the app as close to its due time as it would have anyway.

The parking queues are read longest first. A message Hopper moves to a
shorter step while the listing runs is met again there and listed once;
one in the work queue at that moment, between two steps, is not listed.
Killing the command loses nothing: what it read and did not hand back
returns to its parking queue (each such return counts one delivery).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			if err := f.pickNeeded(cmd); err != nil {
				return err
			}
			t, err := f.load(cmd, "parked")
			if err != nil {
				return err
			}
			plan := topology.FromConfig(&t.cfg)
			t.opts.Name = "hopper-parked " + plan.Work.Name
			if len(plan.Parking) == 0 {
				return usage(fmt.Errorf("queue %q parks nothing: schedule.enabled is off in this config (turn it on as the Hopper consuming the queue has it)", plan.Work.Name))
			}
			ctx, stop := signalContext(cmd.Context(), exitTempFail, toolStopping(cmd.ErrOrStderr()), nil)
			defer stop()
			list, err := listParked(ctx, t, plan)
			if err != nil {
				return interrupted(ctx, err)
			}
			out := bufio.NewWriter(cmd.OutOrStdout())
			if output == "json" {
				err = writeJSON(out, list)
			} else {
				err = writeParked(out, list)
			}
			if err != nil {
				return err
			}
			if err := out.Flush(); err != nil {
				return fmt.Errorf("write: %w", err)
			}
			return nil
		},
	}
	f.cf.user = forBroker
	f.cf.register(cmd.Flags())
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text (a table) or json")
	return cmd
}

// pickNeeded refuses a config of several subscriptions when --queue
// does not pick one: whose parked messages to list is the operator's
// choice (the DLQ tools may take --dlq instead, which parked has not).
func (f *dlqFlags) pickNeeded(cmd *cobra.Command) error {
	if f.cf.file == "" || cmd.Flags().Changed("queue") {
		return nil
	}
	cfg, _, _ := config.Load(f.cf.file, nil)
	if len(cfg.Subscriptions) < 2 {
		return nil
	}
	var names []string
	for _, e := range cfg.SubscriptionConfigs() {
		names = append(names, e.Queue.Name)
	}
	return usage(fmt.Errorf("the config lists %d subscriptions: choose whose parked messages with --queue (one of %s)", len(names), strings.Join(names, ", ")))
}

// parkedList is what `hopper parked` reports.
type parkedList struct {
	Queue string `json:"queue"`
	// Depths are the ready counts of the parking queues before the
	// listing, by queue.
	Depths   map[string]int `json:"depths"`
	Messages []dlq.Parked   `json:"messages"`
	// Again counts messages met a second time and listed once (see
	// dlq.Reparker.Again).
	Again int `json:"again,omitempty"`
	Bad   int `json:"bad,omitempty"`
}

// listParked reads every parking queue of plan, longest step first, and
// hands each message back where its due time puts it now.
func listParked(ctx context.Context, t *target, plan topology.Plan) (*parkedList, error) {
	rp := &dlq.Reparker{
		Policy: schedule.Policy{Step: t.cfg.Schedule.Step.D(), Max: t.cfg.Schedule.MaxDelay.D()},
		Work:   plan.Work.Name,
		Park:   plan.ParkQueue,
	}
	list := &parkedList{Queue: plan.Work.Name, Depths: map[string]int{}, Messages: []dlq.Parked{}}
	in, err := broker.OpenInspector(ctx, t.opts)
	if err != nil {
		return nil, err
	}
	for _, q := range plan.Parking {
		n, err := in.Depth(q.Name)
		if err != nil {
			in.Close() //nolint:errcheck // read-only
			return nil, fmt.Errorf("parking queue %q (schedule.step, schedule.maxDelay and topology.parkQueue must be those of the Hopper that consumes %q; `hopper topology verify` checks them): %w", q.Name, plan.Work.Name, err)
		}
		list.Depths[q.Name] = n
	}
	in.Close() //nolint:errcheck // read-only
	opener := t.opener()
	for _, q := range slices.Backward(plan.Parking) {
		if list.Depths[q.Name] == 0 {
			continue
		}
		pass, err := opener.BrowseParked(ctx, q.Name, func(m *msg.Message) string { return rp.To(q.Name, m) })
		if err != nil {
			// The queues read before were handed back: nothing is lost,
			// and the listing may be run again.
			return nil, tempFail(fmt.Errorf("parking queue %q: %w", q.Name, err))
		}
		res, err := dlq.Browse(ctx, pass.Source, dlq.BrowseOptions{Limit: pass.Present, Bound: pass.Present, Rotate: pass.Rotate,
			OnBad: func(n int, err error) { list.Bad++ }}, func(m *msg.Message) error {
			if p, ok := rp.Read(q.Name, m); ok {
				list.Messages = append(list.Messages, p)
			}
			return nil
		})
		pass.Close()
		if err != nil {
			return nil, tempFail(fmt.Errorf("parking queue %q, after %d message(s), each handed back: %w", q.Name, res.Taken, err))
		}
	}
	list.Again = rp.Again
	slices.SortStableFunc(list.Messages, func(a, b dlq.Parked) int {
		switch {
		case a.Due.IsZero() != b.Due.IsZero():
			if a.Due.IsZero() {
				return 1
			}
			return -1
		}
		return a.Due.Compare(b.Due)
	})
	return list, nil
}

// writeParked writes the list as a table and a summary line.
func writeParked(w *bufio.Writer, l *parkedList) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MESSAGE ID\tDUE\tIN\tPARK QUEUE")
	for _, p := range l.Messages {
		due, in := "(none)", "-"
		if !p.Due.IsZero() {
			due = p.Due.Format("2006-01-02T15:04:05.000Z07:00")
			in = formatLeft(p.Left)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", quoteID(p.ID), due, in, p.Queue)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	fmt.Fprintf(w, "--- %d message(s) parked for %s", len(l.Messages), l.Queue)
	if l.Again > 0 {
		fmt.Fprintf(w, "; %d met again in a shorter step while listing, listed once", l.Again)
	}
	if l.Bad > 0 {
		fmt.Fprintf(w, "; %d could not be read (left parked)", l.Bad)
	}
	fmt.Fprintln(w, " ---")
	return nil
}

// formatLeft renders the time left until a due time: "due" once passed.
func formatLeft(d time.Duration) string {
	if d <= 0 {
		return "due"
	}
	if d < time.Minute {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// quoteID shows a message id on one line of the table.
func quoteID(id string) string {
	if id == "" {
		return `""`
	}
	return dlq.FormatValue(id)
}
