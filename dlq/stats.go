package dlq

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
)

// BrowseOptions configure Browse.
type BrowseOptions struct {
	// Limit is the number of messages shown to fn.
	Limit int
	// Bound is the number of messages present at start. With Rotate every
	// one of them is taken and handed back, those past Limit without being
	// shown, so that the DLQ ends in the order it had (see Rotation); none
	// past it.
	Bound int
	// Rotate hands messages back to a quorum DLQ: those it rotates at
	// once, the rest held; nil holds them all for the caller's closing the
	// source.
	Rotate *Rotation
	// OnBad, when set, is told about each bad message (n is its 1-based
	// place in the pass).
	OnBad func(n int, err error)
}

// BrowseResult is a pass's account.
type BrowseResult struct {
	// Taken messages were read; Shown of them went to fn; Bad could not be
	// processed (reported through OnBad, still in the DLQ).
	Taken, Shown, Bad int
}

// Browse reads messages from src, oldest first, and calls fn with each of
// the first o.Limit. It removes none: it settles only the messages
// o.Rotate rotates, each once fn is done with it, and the caller closes
// the source afterwards, which returns the others to their places (order
// included, in a classic queue; at the head, in order, in a quorum one).
// It stops early when the source has
// nothing more ready. A panic in fn makes that message bad, not the run:
// it is counted, reported and handed back like the others. An error from
// fn ends the pass (after the message is handed back).
func Browse(ctx context.Context, src Source, o BrowseOptions, fn func(*msg.Message) error) (BrowseResult, error) {
	res, err := browse(ctx, src, o, fn)
	return res, flushed(o.Rotate, err)
}

func browse(ctx context.Context, src Source, o BrowseOptions, fn func(*msg.Message) error) (BrowseResult, error) {
	var res BrowseResult
	want := o.Limit
	if o.Rotate != nil {
		// Exactly the messages present: past them come the copies.
		want = o.Bound
	}
	for res.Taken < want {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("browse stopped after %d messages: %w", res.Taken, err)
		}
		d, ok, err := src.Next(ctx)
		if err != nil {
			return res, err
		}
		if !ok {
			// A source also answers "nothing ready" when ctx ended while
			// it waited: that pass was stopped, not finished.
			if err := ctx.Err(); err != nil {
				return res, fmt.Errorf("browse stopped after %d messages: %w", res.Taken, err)
			}
			return res, nil
		}
		res.Taken++
		m, err := message(d)
		if err == nil && res.Taken <= o.Limit {
			res.Shown++
			err = guard(func() error { return fn(m) })
		}
		if errors.Is(err, ErrBadMessage) {
			res.Bad++
			if o.OnBad != nil {
				o.OnBad(res.Taken, err)
			}
			err = nil
		}
		if m != nil {
			if kerr := o.Rotate.Keep(ctx, d, m); kerr != nil {
				return res, errors.Join(err, kerr)
			}
		}
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// Stats summarises a DLQ. Depth is the broker's ready count; the rest is
// from the Scanned messages read without removing them.
type Stats struct {
	DLQ     string `json:"dlq"`
	Depth   int    `json:"depth"`
	Scanned int    `json:"scanned"`
	// ByQueue, ByReason and ByStatus count messages by original queue,
	// x-dead-letter-reason and x-final-status-code; Unknown labels
	// messages without the header.
	ByQueue  map[string]int `json:"byQueue"`
	ByReason map[string]int `json:"byReason"`
	ByStatus map[string]int `json:"byStatus"`
	// Replayed counts messages that were replayed at least once before
	// (x-replay-count > 0): they failed again after a replay.
	Replayed int `json:"replayed"`
	// MaxDeliveryCount is the highest x-delivery-count seen. A quorum
	// queue counts returns of a message, and drops or dead-letters one
	// returned more often than the queue's delivery limit (20 by default
	// on RabbitMQ 4.x, or a policy's): the DLQ tools rotate a message
	// before its count gets there, but other readers of the DLQ (or a
	// tool killed mid-run) spend it, so operators must see it coming.
	MaxDeliveryCount int `json:"maxDeliveryCount,omitempty"`
	// Bad counts messages that could not be read (see the package doc);
	// they are in Depth but in no other count.
	Bad int `json:"bad,omitempty"`
	// Oldest and Newest are when the oldest and newest scanned messages
	// entered the DLQ (x-dead-letter-time, else the AMQP timestamp); zero
	// when no message has either. NoTime counts messages with neither.
	Oldest time.Time `json:"oldest,omitzero"`
	Newest time.Time `json:"newest,omitzero"`
	NoTime int       `json:"noTime,omitempty"`
	// OldestAge and NewestAge are the same as ages at At.
	OldestAge Duration  `json:"oldestAge,omitzero"`
	NewestAge Duration  `json:"newestAge,omitzero"`
	At        time.Time `json:"at"`
}

// Duration marshals as a Go duration string with units ("1h2m3s").
type Duration time.Duration

// MarshalJSON writes the duration with its unit.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// NewStats starts a summary of dlq whose ready count is depth.
func NewStats(dlq string, depth int, now time.Time) *Stats {
	return &Stats{
		DLQ: dlq, Depth: depth, At: now,
		ByQueue: map[string]int{}, ByReason: map[string]int{}, ByStatus: map[string]int{},
	}
}

// Add counts one message.
func (s *Stats) Add(m *msg.Message) {
	s.Scanned++
	s.ByQueue[orUnknown(msg.OriginalQueue(m))]++
	s.ByReason[orUnknown(msg.DeadLetterReason(m))]++
	s.ByStatus[statusKey(m)]++
	if msg.ReplayCount(m) > 0 {
		s.Replayed++
	}
	if n, ok := m.Int(msg.HeaderDeliveryCount); ok && int(n) > s.MaxDeliveryCount {
		s.MaxDeliveryCount = int(n)
	}
	t, ok := msg.DeadLetterTime(m)
	if !ok {
		s.NoTime++
		return
	}
	if s.Oldest.IsZero() || t.Before(s.Oldest) {
		s.Oldest = t
	}
	if s.Newest.IsZero() || t.After(s.Newest) {
		s.Newest = t
	}
	s.OldestAge = Duration(s.At.Sub(s.Oldest))
	s.NewestAge = Duration(s.At.Sub(s.Newest))
}

// WriteJSON writes the stats as one JSON object.
func (s *Stats) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(s); err != nil {
		return fmt.Errorf("write stats: %w", err)
	}
	return nil
}

// WriteTable writes the stats for people.
func (s *Stats) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "DLQ\t%s\n", s.DLQ)
	fmt.Fprintf(tw, "depth\t%d\n", s.Depth)
	if s.Scanned != s.Depth {
		fmt.Fprintf(tw, "scanned\t%d\t(messages taken by others while scanning are not counted)\n", s.Scanned)
	}
	if !s.Oldest.IsZero() {
		fmt.Fprintf(tw, "oldest\t%s\t(%s ago)\n", s.Oldest.UTC().Format(time.RFC3339), formatAge(time.Duration(s.OldestAge)))
		fmt.Fprintf(tw, "newest\t%s\t(%s ago)\n", s.Newest.UTC().Format(time.RFC3339), formatAge(time.Duration(s.NewestAge)))
	}
	if s.NoTime > 0 {
		fmt.Fprintf(tw, "no time\t%d\t(neither x-dead-letter-time nor a timestamp)\n", s.NoTime)
	}
	if s.Bad > 0 {
		fmt.Fprintf(tw, "bad\t%d\t(could not be read; left in the DLQ, see the warnings)\n", s.Bad)
	}
	if s.MaxDeliveryCount > 0 {
		fmt.Fprintf(tw, "delivery count\tup to %d\t(a quorum DLQ counts returns of a message; past the queue's delivery limit — 20 by default on RabbitMQ 4.x, or a policy's — the broker drops it)\n", s.MaxDeliveryCount)
	}
	if s.Replayed > 0 {
		fmt.Fprintf(tw, "replayed before\t%d\t(x-replay-count > 0: failed again after a replay)\n", s.Replayed)
	}
	for _, sec := range []struct {
		title string
		m     map[string]int
	}{{"by original queue", s.ByQueue}, {"by reason", s.ByReason}, {"by final status", s.ByStatus}} {
		if len(sec.m) == 0 {
			continue
		}
		fmt.Fprintf(tw, "\n%s\tcount\n", strings.ToUpper(sec.title[:1])+sec.title[1:])
		for _, k := range sortedByCount(sec.m) {
			fmt.Fprintf(tw, "  %s\t%d\n", k, sec.m[k])
		}
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write stats: %w", err)
	}
	return nil
}

// sortedByCount orders keys by count, largest first, then by name.
func sortedByCount(m map[string]int) []string {
	return slices.SortedFunc(maps.Keys(m), func(a, b string) int {
		if c := cmp.Compare(m[b], m[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: %w", s, err)
	}
	*d = Duration(v)
	return nil
}
