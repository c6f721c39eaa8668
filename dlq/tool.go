package dlq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
)

// The operator tools (stats, peek, replay, export, import, purge) see the
// broker only through the interfaces below, so that their logic — filters,
// bounds, accounting, the JSON Lines encoding — is tested without one. The
// cmd/hopper wiring backs them with the broker package.
//
// A message taken from the DLQ is in one of three states during a run:
//
//	taken ─(replayed: copy published and confirmed)→ acked: gone from the DLQ
//	  │
//	  └─(filtered out, kept, publish failed, dry run, browse)→ handed back:
//	       held unacked until the run ends, then returned in place;
//	       on a quorum DLQ, a message near its delivery limit is
//	       rotated at once instead (see Rotation)
//
// Holding instead of requeueing at once is what bounds a run: a requeued
// message would be delivered again at the head of the queue and processed
// twice. Nothing is acked before its copy is confirmed (or, for export
// --remove, before its line is on disk), so killing a tool at any point
// loses nothing: the broker takes back every unacked message.
//
// A quorum queue counts returns of a message in x-delivery-count and
// drops or dead-letters it once the count passes the queue's delivery
// limit (20 by default on RabbitMQ 4.x for a queue declared without one,
// or whatever an x-delivery-limit argument or a policy sets). Which
// returns count differs by release: on 3.x every one; on 4.x a reject
// with requeue and a channel or connection that ends with the message
// unacked (closed, cut, or its process killed), but not a basic.nack with
// requeue (see the broker package's TestWhichReturnsCount). A tool that
// ends normally hands its messages back with that nack; a tool that is
// killed cannot, and there every message it held spends one delivery.
//
// The alternative is rotating a message: an exact copy published to the
// DLQ's tail, confirmed, then the original acked. It spends nothing, but
// moves the message to the tail, and a tool killed between a copy's
// confirm and its original's ack leaves both behind. So a tool rotates
// only what it must: a message one more counted return could bring to the
// delivery limit, which the operator gives the tools (DeliveryLimit;
// policies cannot be read over AMQP). Without it every message handed
// back is rotated. Either way a run takes every message present at start,
// so that one full pass leaves the DLQ in its order.
//
// A message the tool cannot process (a panic while reading its headers,
// filtering or encoding it) is a bad message: reported, counted, handed
// back like a kept one, and the run goes on.

// Delivery is one message taken from the DLQ. It is settled at most once,
// on the channel it came from.
type Delivery interface {
	Message() *msg.Message
	Ack() error
	Nack(requeue bool) error
}

// Source hands out the DLQ's messages, oldest first, without requeueing
// any before the run ends.
type Source interface {
	// Next returns the next message. ok is false when ctx ends before one
	// is ready; an error means the source is gone (connection lost), and
	// every message it handed out and did not settle is back in the DLQ.
	Next(ctx context.Context) (d Delivery, ok bool, err error)
}

// SourceFunc adapts a function to a Source.
type SourceFunc func(ctx context.Context) (Delivery, bool, error)

// Next calls f.
func (f SourceFunc) Next(ctx context.Context) (Delivery, bool, error) { return f(ctx) }

// Publisher publishes a copy of a message and returns nil only once the
// broker has confirmed it (and did not return it as unroutable).
type Publisher interface {
	PublishTo(ctx context.Context, exchange, key string, m *msg.Message) error
}

// Sender publishes a copy at once, in the caller's order, and returns the
// wait for the broker's answer: nil only once the copy is confirmed (and
// was not returned as unroutable). The wait must be called exactly once.
type Sender interface {
	Send(ctx context.Context, exchange, key string, m *msg.Message) (wait func() error)
}

// Pass is a DLQ opened for one run of a tool: where its messages come
// from, how many were present at start (the run's bound), how the ones it
// does not remove are handed back (nil Rotate: held until Close), and, for
// a run that moves messages, the publisher of their copies. Close ends the
// pass: every message taken and not settled returns to the DLQ.
type Pass struct {
	Source  Source
	Present int
	Rotate  *Rotation
	Pub     Publisher
	Close   func()
}

// Rotation hands messages back to a quorum DLQ without spending their
// delivery count: Keep publishes msg.KeepCopy of the message to Queue
// (persistent, mandatory) and acks the original only once the copy is
// confirmed. Up to Window copies are in flight at once, sent and acked in
// the order Keep was called, so a pass keeps the DLQ's order while it
// does not wait a round trip per message. Flush settles what is in flight;
// every run that used Keep calls it before the source closes. A nil
// *Rotation holds messages instead, for the caller's closing the source to
// return them in place, which is what a classic queue does for free.
//
// With Need set, Keep rotates only the messages Need names and holds the
// others, as a classic DLQ's are held: they return when the source closes,
// each spending at most one delivery (none where the source hands them
// back with a basic.nack on RabbitMQ 4.x), back at the head of the queue
// in their order.
//
// Either way a run over a quorum DLQ takes every message present at start,
// those past its limit too. A rotated message goes to the tail, and only a
// whole pass brings the DLQ back to its order. A returned one goes back
// ahead of every message the queue never handed out, but behind those
// returned before it and not taken again since: a run that returned only
// the head of the DLQ just after one that returned all of it would move
// that head behind the rest (peek -n 5 after stats did). Holding every
// message puts them all back as they were.
//
// After the first failure Keep sends nothing more and returns it: the
// tool stops. The copies already in flight are still settled by Flush, so
// that a confirmed copy does not leave its original behind as a duplicate.
type Rotation struct {
	// Queue is the DLQ itself.
	Queue string
	// To, when set, picks the queue of each copy in place of Queue: a
	// parking queue's message goes back where its due time puts it now
	// (see Reparker), not to the tail it would wait a whole delay again at.
	To  func(*msg.Message) string
	Pub Sender
	// Need, when set, tells which messages must be rotated (see
	// DeliveryLimit.Need); the others are held. Nil rotates every one.
	Need func(*msg.Message) bool
	// Window is the number of copies awaiting their confirm at once.
	// Default 16: when the tool ends, up to a window's originals are acked
	// at once and the channel closed, and a quorum queue's channel sends at
	// most quorum_commands_soft_limit (32 by default) settlements ahead
	// without waiting and drops the rest when it closes, which puts those
	// originals back beside their copies. With a window of 64, 300
	// messages came out of one stats run with 31 duplicates; with 16, none.
	Window int

	mu      sync.Mutex
	pending []rotating
	err     error
}

// Rotates tells whether Keep rotates m rather than holding it.
func (r *Rotation) Rotates(m *msg.Message) bool {
	return r != nil && (r.Need == nil || r.Need(m))
}

// rotating is a copy in flight and the original it stands for.
type rotating struct {
	d    Delivery
	id   string
	wait func() error
}

// ErrNotKept means a message could not be rotated: its copy was not
// confirmed. The original is left unacked, so it returns to the DLQ when
// the source closes, spending one delivery of its count: nacking it would
// spend the same, and acking it without a confirmed copy would lose it.
// The tool stops rather than spend more.
var ErrNotKept = errors.New("could not hand the message back to the quorum DLQ (copy not confirmed); it returns to the DLQ when the tool ends, spending one delivery of the queue's delivery limit")

// ErrRotates refuses to read a quorum DLQ for a reader that may look but
// not change it: nothing can be read from a quorum DLQ without rotating
// it, which publishes a copy of every message and acks every original,
// and holds the DLQ for as long as the pass takes.
var ErrRotates = errors.New("reading it rotates every message (each copied to the tail, confirmed, then the original acked), which changes the queue and holds it while the pass runs")

// Keep hands d (whose message is m) back to the DLQ: nothing to do for a
// nil Rotation or a message it holds; else the copy now, the ack once it
// is confirmed.
func (r *Rotation) Keep(ctx context.Context, d Delivery, m *msg.Message) error {
	if !r.Rotates(m) {
		return r.failed()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	// Not ctx: a copy the broker may have taken is seen through to its
	// confirm (bounded by the publisher's confirm timeout), so that the
	// original is acked and not left beside its copy.
	to := r.Queue
	if r.To != nil {
		to = r.To(m)
	}
	wait := r.Pub.Send(context.WithoutCancel(ctx), "", to, msg.KeepCopy(m))
	r.pending = append(r.pending, rotating{d: d, id: m.MessageID, wait: wait})
	window := r.Window
	if window <= 0 {
		window = 16
	}
	for len(r.pending) >= window {
		r.settleOldest()
	}
	return r.err
}

// failed is the rotation's first failure, if any: a held message after it
// stops the run as a rotated one would.
func (r *Rotation) failed() error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Flush waits for every copy in flight, acks the originals of those
// confirmed, and returns the first failure of the run.
func (r *Rotation) Flush() error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.pending) > 0 {
		r.settleOldest()
	}
	return r.err
}

func (r *Rotation) settleOldest() {
	p := r.pending[0]
	r.pending = r.pending[1:]
	if err := p.wait(); err != nil {
		if r.err == nil {
			r.err = fmt.Errorf("message %q: %w: %w", p.id, ErrNotKept, err)
		}
		return
	}
	if err := p.d.Ack(); err != nil && r.err == nil {
		r.err = fmt.Errorf("message %q: ack after its copy was confirmed failed (it is now in the DLQ twice): %w", p.id, err)
	}
}

// flushed adds the rotation's outcome to a run's error: the run stops at
// its first failure, so the two are often the same.
func flushed(r *Rotation, err error) error {
	ferr := r.Flush()
	switch {
	case ferr == nil || errors.Is(err, ferr):
		return err
	case err == nil:
		return ferr
	}
	return errors.Join(err, ferr)
}

// ErrBadMessage marks a message a tool could not process.
var ErrBadMessage = errors.New("bad message")

// guard runs fn for one message and turns a panic into an ErrBadMessage
// error, so that one message nothing anticipated cannot end a run (or
// leave it with messages held).
func guard(fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %v", ErrBadMessage, p)
		}
	}()
	return fn()
}

// message reads d's message under guard.
func message(d Delivery) (m *msg.Message, err error) {
	err = guard(func() error {
		m = d.Message()
		if m == nil {
			return fmt.Errorf("%w: no message", ErrBadMessage)
		}
		return nil
	})
	return m, err
}

// Unknown labels a message whose original queue, reason or status is not
// in its headers, in stats and summaries.
const Unknown = "(unknown)"

// headerString is the string form of a scalar header value, as filters
// compare it. ok is false for tables, arrays and void.
func headerString(v any) (string, bool) {
	if b, ok := v.([]byte); ok {
		return string(b), true
	}
	if str, ok := msg.Scalar(v); ok {
		return str, true
	}
	if d, ok := v.(msg.Decimal); ok {
		return d.String(), true
	}
	return "", false
}

// orUnknown labels an empty key.
func orUnknown(s string) string {
	if s == "" {
		return Unknown
	}
	return s
}

// statusKey is the status a message is counted under.
func statusKey(m *msg.Message) string {
	if s, ok := msg.FinalStatus(m); ok {
		return strconv.Itoa(s)
	}
	return Unknown
}

// formatAge renders a duration for people: the two largest units.
func formatAge(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	}
	return fmt.Sprintf("%dd%02dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
}
