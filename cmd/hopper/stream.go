package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/streamsrc"
)

func newStreamCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "stream",
		Short: "A stream subscription's position: its stored offset, the stream's bounds and the lag; move the stored offset",
		Long: `Tools for a stream subscription (queue.type: stream). The same --config,
HOPPER_* variables and flags as run name the stream and the consumer name
(queue.stream.consumer); with subscriptions, --queue picks one by its stream.`,
	}
	cmd.AddCommand(newStreamStatusCmd(), newStreamSeekCmd())
	return cmd
}

func newStreamStatusCmd() *cobra.Command {
	var f dlqFlags
	var output string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the offset stored for the consumer name, the stream's first and last offset, and the lag",
		Long: `Shows where a stream subscription's consumer name stands: the offset the
broker stores for it (Hopper reads on after it; none for a name that never
stored one, which starts where queue.stream.offset says), the stream's first
and last offset (the last message's, found by reading the last chunk), and
the lag: the offsets after the stored one up to the last. Offset tracking
takes offsets of its own (one per store of any consumer name of the stream),
so among messages the lag counts those few too. Nothing is changed.

For a super stream (queue.stream.superStream) it shows the same for each
partition, and the total lag.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			o, err := f.streamOptions(cmd)
			if err != nil {
				return err
			}
			st, err := streamsrc.Inspect(o)
			if err != nil {
				return streamErr(err)
			}
			return writeOut(cmd.OutOrStdout(), output, st, func(w io.Writer) error { return writeStreamStatus(w, st) })
		},
	}
	f.cf.user = forBroker
	f.cf.register(cmd.Flags())
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	return cmd
}

func newStreamSeekCmd() *cobra.Command {
	var f dlqFlags
	var output string
	var dry, force bool
	var partition string
	cmd := &cobra.Command{
		Use:   "seek first|last|OFFSET|TIME",
		Short: "Move the offset stored for the consumer name: Hopper then reads from the message named",
		Long: `Moves the offset the broker stores for a stream subscription's consumer
name, so that the next Hopper reading under it starts at the message named:

  first    the oldest message the stream keeps (everything again)
  last     after the last message (only what is written from now on)
  OFFSET   that offset (e.g. 41880)
  TIME     the first chunk written at or after an RFC 3339 time
           (2026-11-28T09:00:00Z: everything since 09:00)

--dry-run shows what would be stored and the lag it leaves, and stores
nothing.

A running Hopper stores its own progress under the name (every
queue.stream.storeEvery, and at shutdown), which would overwrite the moved
offset: stop every Hopper of the subscription first. With
queue.stream.singleActiveConsumer the broker can tell: seek subscribes under
the name as its single active consumer and stores only if the broker makes
it the active one; while a Hopper reads it stands by, and seek refuses (exit
75). Without it the broker cannot tell whether a reader runs, so seek
refuses unless --force says every Hopper of the subscription is stopped.

For a super stream (queue.stream.superStream) first, last and TIME move every
partition, each to its own first, last or first chunk at or after TIME;
--dry-run and the output show each partition and the total of their lag. An
OFFSET is one partition's: it takes --partition, the partition's stream name
(orders-1) or its index (1), which also keeps any other target to that
partition. With queue.stream.singleActiveConsumer seek subscribes to every
partition as the super stream's single active consumer and stores only if
the broker makes it the active one on all of them: while a Hopper reads any
partition, seek refuses (exit 75) and stores nothing in any. Every
partition's new offset is found before any is stored.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			to, err := streamsrc.ParseTarget(args[0])
			if err != nil {
				return usage(err)
			}
			o, err := f.streamOptions(cmd)
			if err != nil {
				return err
			}
			to.Partition = partition
			switch {
			case !o.SuperStream && partition != "":
				return usage(fmt.Errorf("--partition names a partition of a super stream, and %s is a stream (queue.stream.superStream is off)", o.Stream))
			case o.SuperStream && to.Kind == "offset" && partition == "":
				return usage(fmt.Errorf("offset %d names no message of super stream %s as a whole: each partition counts its own offsets; name the partition to move with --partition (its stream name, such as %s-0, or its index, such as 0)", to.Offset, o.Stream, o.Stream))
			}
			if !dry && !o.SingleActive && !force {
				return usage(fmt.Errorf("queue.stream.singleActiveConsumer is off, so the broker cannot tell whether a Hopper reads as %q now, and a running one would store its own offset over the new one: stop every Hopper of this subscription, then run seek again with --force (or see what it would do with --dry-run)", o.Consumer))
			}
			mv, err := streamsrc.Seek(o, to, dry)
			if errors.Is(err, streamsrc.ErrReaderActive) {
				what, stored := "stream", "nothing was stored"
				if o.SuperStream {
					what, stored = "a partition of super stream", "nothing was stored in any partition"
				}
				return tempFail(fmt.Errorf("a Hopper reads %s %q as %q now (it is the name's single active consumer) and would store its own offset over the new one: stop the Hoppers of this subscription (scale them to 0), then run seek again; %s", what, o.Stream, o.Consumer, stored))
			}
			if errors.Is(err, streamsrc.ErrNoPartition) {
				return usage(err)
			}
			if err != nil {
				return streamErr(err)
			}
			return writeOut(cmd.OutOrStdout(), output, mv, func(w io.Writer) error { return writeStreamMove(w, mv) })
		},
	}
	f.cf.user = forBroker
	f.cf.register(cmd.Flags())
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	cmd.Flags().BoolVar(&dry, "dry-run", false, "show what would be stored; store nothing")
	cmd.Flags().StringVar(&partition, "partition", "", "of a super stream: move only this partition (its stream name, or its index); needed for an OFFSET")
	cmd.Flags().BoolVar(&force, "force", false, "without queue.stream.singleActiveConsumer: every Hopper of the subscription is stopped, store anyway")
	return cmd
}

// streamOptions loads the config as run does and returns the stream
// reader options of the subscription --queue picks (the only one
// without).
func (f *dlqFlags) streamOptions(cmd *cobra.Command) (streamsrc.Options, error) {
	if f.cf.file != "" && !cmd.Flags().Changed("queue") {
		if cfg, _, _ := config.Load(f.cf.file, nil); len(cfg.Subscriptions) > 1 {
			var names []string
			for _, e := range cfg.SubscriptionConfigs() {
				names = append(names, e.Queue.Name)
			}
			return streamsrc.Options{}, usage(fmt.Errorf("the config lists %d subscriptions: choose one with --queue (one of %s)", len(names), strings.Join(names, ", ")))
		}
	}
	t, err := f.load(cmd, "stream")
	if err != nil {
		return streamsrc.Options{}, err
	}
	if !t.cfg.IsStream() {
		return streamsrc.Options{}, usage(fmt.Errorf("queue %q is not a stream: these tools work on a stream subscription (queue.type: stream)", t.cfg.Queue.Name))
	}
	eff := t.cfg.ForStream()
	o, err := streamsrc.ConfigOptions(&eff, t.log)
	if err != nil {
		return streamsrc.Options{}, badData(err)
	}
	o.Name = "hopper-stream-tool " + o.Stream + " " + o.Consumer
	return o, nil
}

// streamErr says what a missing stream means; the rest as it is.
func streamErr(err error) error {
	if errors.Is(err, streamsrc.ErrNoStream) {
		return badData(fmt.Errorf("%w (check queue.name, or --queue)", err))
	}
	return err
}

func writeOut(w io.Writer, output string, v any, text func(io.Writer) error) error {
	out := bufio.NewWriter(w)
	var err error
	if output == "json" {
		err = writeJSON(out, v)
	} else {
		err = text(out)
	}
	if err != nil {
		return err
	}
	if err := out.Flush(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}

func offsetText(off int64) string {
	if off < 0 {
		return "none"
	}
	return fmt.Sprint(off)
}

func storedText(off int64, has bool) string {
	if !has {
		return "none (a new consumer name: it starts where queue.stream.offset says)"
	}
	return fmt.Sprintf("%d (reading resumes at %d)", off, off+1)
}

func writeStreamStatus(w io.Writer, st streamsrc.Status) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if st.Partitions != nil {
		fmt.Fprintf(tw, "super stream\t%s (%d partitions)\n", st.Stream, len(st.Partitions))
		fmt.Fprintf(tw, "consumer\t%s\n", st.Consumer)
		fmt.Fprintln(tw, "partition\tstored offset\tfirst offset\tlast offset\tlag")
		for _, p := range st.Partitions {
			stored := "none"
			if p.HasStored {
				stored = fmt.Sprint(p.Stored)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", p.Stream, stored, offsetText(p.First), offsetText(p.Last), p.Lag)
		}
		fmt.Fprintf(tw, "total\t\t\t\t%d\n", st.Lag)
		return tw.Flush()
	}
	fmt.Fprintf(tw, "stream\t%s\n", st.Stream)
	fmt.Fprintf(tw, "consumer\t%s\n", st.Consumer)
	fmt.Fprintf(tw, "stored offset\t%s\n", storedText(st.Stored, st.HasStored))
	fmt.Fprintf(tw, "first offset\t%s\n", offsetText(st.First))
	fmt.Fprintf(tw, "last offset\t%s\n", offsetText(st.Last))
	fmt.Fprintf(tw, "lag\t%d\n", st.Lag)
	return tw.Flush()
}

func writeStreamMove(w io.Writer, mv streamsrc.Move) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if mv.Partitions != nil {
		fmt.Fprintf(tw, "super stream\t%s\n", mv.Stream)
		fmt.Fprintf(tw, "consumer\t%s\n", mv.Consumer)
		fmt.Fprintln(tw, "partition\tfirst offset\tlast offset\tstored offset\tlag")
		for _, p := range mv.Partitions {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d -> %d\n", p.Stream, offsetText(p.First), offsetText(p.Last), storedMove(p), p.Lag, p.LagAfter)
		}
		fmt.Fprintf(tw, "total\t\t\t\t%d -> %d\n", mv.Lag, mv.LagAfter)
	} else {
		fmt.Fprintf(tw, "stream\t%s (first offset %s, last %s)\n", mv.Stream, offsetText(mv.First), offsetText(mv.Last))
		fmt.Fprintf(tw, "consumer\t%s\n", mv.Consumer)
		fmt.Fprintf(tw, "stored offset\t%s\n", storedMove(mv))
		fmt.Fprintf(tw, "lag\t%d -> %d\n", mv.Lag, mv.LagAfter)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if !mv.Done {
		_, err := fmt.Fprintln(w, "dry run: nothing stored")
		return err
	}
	return nil
}

// storedMove is a stream's stored offset before and after the move.
func storedMove(mv streamsrc.Move) string {
	now := "none"
	if mv.HasStored {
		now = fmt.Sprint(mv.Stored)
	}
	return fmt.Sprintf("%s -> %d (reading resumes at %d)", now, mv.NewStored, mv.Next)
}
