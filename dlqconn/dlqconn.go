// Package dlqconn opens a DLQ on the broker the way every DLQ tool does —
// the command-line tools and the console alike — so that a message of a
// quorum DLQ is rotated rather than returned to it whenever its return
// could cost it its place (see dlq.Rotation), and a run that removes
// messages always owns the DLQ exclusively.
package dlqconn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/topology"
)

// Opener opens DLQs on one broker.
type Opener struct {
	Opts broker.Options
	// ConfirmTimeout bounds the wait for each publish confirm (the
	// config's broker.confirmTimeout).
	ConfirmTimeout time.Duration
	// DeliveryLimit is the quorum DLQs' delivery limit as the operator
	// knows it: the messages one more return could bring to it are
	// rotated, the others held and returned when the pass closes. Unknown
	// (the zero value) rotates every message.
	DeliveryLimit dlq.DeliveryLimit
	Log           *slog.Logger
}

func (o *Opener) log() *slog.Logger {
	if o.Log == nil {
		return slog.Default()
	}
	return o.Log
}

// Depth is the queue's ready count.
func (o *Opener) Depth(ctx context.Context, queue string) (int, error) {
	in, err := broker.OpenInspector(ctx, o.Opts)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	return in.Depth(queue)
}

// Rotation tells how a tool hands the messages it does not remove back to
// the DLQ: nil (hold them until the end, the broker returns them in place)
// for a classic queue; a dlq.Rotation for a quorum queue, whose returns
// may spend each message's delivery count, rotating the messages
// o.DeliveryLimit says must be (every one when it is unknown). Rotating
// publishes to the DLQ, so it is checked first that this user may publish
// there at all: a tool that could not would have to return what it read,
// and it refuses instead. A DLQ without a limit rotates nothing, and needs
// no publisher.
func (o *Opener) Rotation(ctx context.Context, queue string) (*dlq.Rotation, func(), error) {
	typ, err := o.queueType(ctx, queue)
	if err != nil {
		return nil, nil, err
	}
	return o.rotation(ctx, queue, typ)
}

// queueType is the DLQ's type, one the tools read.
func (o *Opener) queueType(ctx context.Context, queue string) (broker.QueueType, error) {
	typ, err := broker.QueueTypeOf(ctx, o.Opts, queue)
	if err != nil {
		return "", fmt.Errorf("DLQ %q: nothing was read: %w", queue, err)
	}
	if typ != broker.Classic && typ != broker.Quorum {
		return "", fmt.Errorf("DLQ %q is a %s queue: the DLQ tools read classic and quorum queues only, so nothing was read", queue, typ)
	}
	return typ, nil
}

// rotation is Rotation for a DLQ of type typ.
func (o *Opener) rotation(ctx context.Context, queue string, typ broker.QueueType) (*dlq.Rotation, func(), error) {
	if typ == broker.Classic {
		return nil, func() {}, nil
	}
	if o.DeliveryLimit == dlq.NoDeliveryLimit {
		return &dlq.Rotation{Queue: queue, Need: o.DeliveryLimit.Need()}, func() {}, nil
	}
	pub := broker.NewPublisher(broker.PublisherOptions{
		Options:        o.Opts,
		Channels:       1,
		ConfirmTimeout: o.ConfirmTimeout,
	})
	closePub := func() {
		if err := pub.Close(); err != nil {
			o.log().Warn("close publisher", "error", err.Error())
		}
	}
	// A message to a queue that cannot exist goes through the same
	// permission check as a copy to the DLQ (the default exchange's) and
	// comes back unroutable, leaving nothing behind.
	probe := fmt.Sprintf("hopper.publish-check.%d", time.Now().UnixNano())
	err := pub.PublishTo(ctx, "", probe, &msg.Message{MessageID: "hopper-publish-check", Headers: map[string]any{}})
	if !errors.Is(err, broker.ErrReturned) {
		closePub()
		if err == nil {
			err = fmt.Errorf("queue %q exists", probe)
		}
		return nil, nil, fmt.Errorf("DLQ %q is a quorum queue, which counts messages handed back by returning them and drops one past the queue's delivery limit (20 by default on RabbitMQ 4.x, or a policy's delivery-limit); "+
			"the DLQ tools therefore hand back a message that could reach it by publishing a copy to the DLQ and acking the original, and publishing to it failed, so nothing was read (--delivery-limit none, for a DLQ without a limit, reads without publishing): %w", queue, err)
	}
	return &dlq.Rotation{Queue: queue, Pub: pub, Need: o.DeliveryLimit.Need()}, closePub, nil
}

// Browse opens queue for reading without removing anything: on a classic
// DLQ every message taken is handed back, in its place, when the pass is
// closed; on a quorum DLQ each message the pass's dlq.Rotation must rotate
// is rotated, and the others are handed back as a classic DLQ's are.
//
// A classic DLQ is read with basic.get and every message held until the
// end: closing returns them all in place, in one step the broker does for
// free. A quorum DLQ is read through a consumer the broker fills ahead of
// the pass (see browsePrefetch), since one basic.get round trip per message
// bounded a scan at about 900 messages a second; once the window is full
// of held messages, the rest is read with basic.get. What the broker
// pushed past what the pass took (the pass's own copies, or dead letters
// that came meanwhile) must not go back by closing either: Close stops the
// consumer (broker.Exclusive.Stop) and hands each of those back the same
// way, then returns what is held with one basic.nack, which RabbitMQ 4.x
// does not count against the delivery limit (3.x counts it, as every
// return), and closes.
func (o *Opener) Browse(ctx context.Context, queue string) (dlq.Pass, error) {
	return o.browse(ctx, queue, true)
}

// BrowseInPlace is Browse for a reader that may look at the DLQ but not
// change it: a classic DLQ is opened as Browse opens it, its messages
// handed back in place; a quorum DLQ, which Browse would rotate, is
// refused before anything is read or published, with an error wrapping
// dlq.ErrRotates.
func (o *Opener) BrowseInPlace(ctx context.Context, queue string) (dlq.Pass, error) {
	return o.browse(ctx, queue, false)
}

// BrowseParked opens a parking queue of scheduled messages for a pass
// that reads every message without taking any out of its schedule: each
// is handed back to the queue to(m) names (see dlq.Reparker), by a copy
// published and confirmed before the original is acked, so that it waits
// only for what is left of its time rather than a whole delay again. A
// parking queue Hopper declares is a quorum queue; a classic one, should
// an operator have declared it so, is read as a classic DLQ is, every
// message handed back in its place (with its time in the queue counted
// on) when the pass closes.
func (o *Opener) BrowseParked(ctx context.Context, queue string, to func(*msg.Message) string) (dlq.Pass, error) {
	typ, err := o.queueType(ctx, queue)
	if err != nil {
		return dlq.Pass{}, err
	}
	if typ == broker.Classic {
		return o.browse(ctx, queue, true)
	}
	// Every message is rotated, whatever the delivery limit: the copy is
	// what moves it to where its due time puts it now.
	every := *o
	every.DeliveryLimit = dlq.UnknownDeliveryLimit
	rot, closeRot, err := every.rotation(ctx, queue, typ)
	if err != nil {
		return dlq.Pass{}, err
	}
	rot.To = to
	return o.browseQuorum(ctx, queue, rot, closeRot)
}

func (o *Opener) browse(ctx context.Context, queue string, rotate bool) (dlq.Pass, error) {
	typ, err := o.queueType(ctx, queue)
	if err != nil {
		return dlq.Pass{}, err
	}
	if typ == broker.Quorum && !rotate {
		return dlq.Pass{}, fmt.Errorf("DLQ %q is a quorum queue: %w; nothing was read", queue, dlq.ErrRotates)
	}
	rot, closeRot, err := o.rotation(ctx, queue, typ)
	if err != nil {
		return dlq.Pass{}, err
	}
	if rot != nil {
		return o.browseQuorum(ctx, queue, rot, closeRot)
	}
	in, err := broker.OpenInspector(ctx, o.Opts)
	if err != nil {
		closeRot()
		return dlq.Pass{}, err
	}
	depth, err := in.Depth(queue)
	if err != nil {
		in.Close()
		closeRot()
		return dlq.Pass{}, err
	}
	return dlq.Pass{
		Source:  GetSource(in, queue),
		Present: depth,
		Rotate:  rot,
		Close: func() {
			if err := in.Close(); err != nil {
				o.log().Warn("close DLQ connection; the broker returns the messages anyway", "error", err.Error())
			}
			closeRot()
		},
	}, nil
}

// browsePrefetch is the window of a quorum DLQ's browsing consumer. It
// needs to cover the copies awaiting their confirm and the acks waiting to
// be coalesced, with room for the broker to push ahead; every pass also
// ends by rotating up to this many messages more than it read (the head of
// its own copies), so it is kept small.
const browsePrefetch = 128

// browseIdle is how long a quorum browse waits for a push before it asks
// the broker whether the DLQ has anything ready (a consumer alone cannot
// tell an empty queue from a slow one). It is paid once at the end of a
// pass that runs out of messages, not per message.
const browseIdle = 200 * time.Millisecond

// browseStopTimeout bounds the end of a quorum pass: waiting for the
// consumer's window to fill or the DLQ to show empty, then for cancel-ok.
const browseStopTimeout = 30 * time.Second

func (o *Opener) browseQuorum(ctx context.Context, queue string, rot *dlq.Rotation, closeRot func()) (dlq.Pass, error) {
	ex, err := broker.OpenBrowse(ctx, o.Opts, queue, browsePrefetch, browseIdle)
	if err != nil {
		closeRot()
		return dlq.Pass{}, err
	}
	return dlq.Pass{
		Source:  exclusiveSource{ex},
		Present: ex.Present(),
		Rotate:  rot,
		Close: func() {
			o.closeQuorumBrowse(queue, ex, rot)
			closeRot()
		},
	}, nil
}

// closeQuorumBrowse hands back what the broker pushed past the pass and
// closes the consumer's connection. The caller's pass has flushed its
// rotation already; this one flushes again, for the messages it adds.
func (o *Opener) closeQuorumBrowse(queue string, ex *broker.Exclusive, rot *dlq.Rotation) {
	// Not the pass's context: a cancelled pass must still leave nothing
	// to be returned by the close.
	ctx, cancel := context.WithTimeout(context.Background(), browseStopTimeout)
	defer cancel()
	rest, err := ex.Stop(ctx)
	if err != nil {
		o.log().Warn("stop browsing the DLQ; messages pushed and not handed back return to it, each spending one delivery of the queue's delivery limit",
			"dlq", queue, "error", err.Error())
	}
	for _, d := range rest {
		if kerr := rot.Keep(ctx, d, d.Message()); kerr != nil {
			break
		}
	}
	if ferr := rot.Flush(); ferr != nil {
		o.log().Warn("hand back the messages pushed past the pass", "dlq", queue, "error", ferr.Error())
	}
	// What is still unacked here goes back to the DLQ (see dlq.ErrNotKept).
	if err := ex.Close(); err != nil {
		o.log().Warn("close DLQ connection; the broker returns the messages anyway", "error", err.Error())
	}
}

// Own opens queue for a run that removes messages: an exclusive owner (a
// second one is refused with broker.ErrInUse), whose window is prefetch
// messages on a classic DLQ and none on a quorum one (what the broker
// pushed ahead and the run did not take would go back at the end,
// spending delivery counts), and, when inFlight > 0, a confirming
// publisher with that many publishes awaiting their confirm.
func (o *Opener) Own(ctx context.Context, queue string, prefetch, inFlight int) (dlq.Pass, error) {
	rot, closeRot, err := o.Rotation(ctx, queue)
	if err != nil {
		return dlq.Pass{}, err
	}
	if rot != nil {
		prefetch = broker.GetOnly
	}
	ex, err := broker.OpenExclusive(ctx, o.Opts, queue, prefetch)
	if err != nil {
		closeRot()
		return dlq.Pass{}, err
	}
	if rot == nil {
		// A classic DLQ: what the run held goes back in place when the
		// connection closes, at once even for a whole DLQ.
		ex.ReturnByClosing()
	}
	p := dlq.Pass{Source: exclusiveSource{ex}, Present: ex.Present(), Rotate: rot}
	var pub *broker.Publisher
	if inFlight > 0 {
		pub = broker.NewPublisher(broker.PublisherOptions{
			Options:        o.Opts,
			Channels:       1,
			InFlight:       inFlight,
			ConfirmTimeout: o.ConfirmTimeout,
		})
		p.Pub = pub
	}
	p.Close = func() {
		// Closing hands every held message back to the DLQ, in place.
		if err := ex.Close(); err != nil {
			o.log().Warn("close DLQ connection; the broker returns held messages anyway", "error", err.Error())
		}
		if pub != nil {
			if err := pub.Close(); err != nil {
				o.log().Warn("close publisher", "error", err.Error())
			}
		}
		closeRot()
	}
	return p, nil
}

// Originals declares the queue that keeps the originals of the messages
// of queue changed before a replay (dlq.OriginalsQueue), of the DLQ's own
// type, and returns its name. Like the DLQ, it is durable, never expires
// its messages, and as a quorum queue has no delivery limit where the
// broker allows it: what it keeps is the only copy of the message as it
// was.
func (o *Opener) Originals(ctx context.Context, queue string) (string, error) {
	typ, err := o.queueType(ctx, queue)
	if err != nil {
		return "", err
	}
	q := topology.Queue{Name: dlq.OriginalsQueue(queue), Role: topology.RoleDLQ, Owned: true,
		Args: map[string]any{"x-queue-type": "classic", "x-queue-version": int32(2)}}
	if typ == broker.Quorum {
		q.Args, q.Unbounded = map[string]any{"x-queue-type": "quorum"}, true
	}
	if err := broker.DeclareQueue(ctx, o.Opts, q); err != nil {
		return "", fmt.Errorf("keep originals of %s: %w", queue, err)
	}
	return q.Name, nil
}

// CheckTarget checks that a replay's destination exists before anything
// moves: exchange (when not "") by a passive declare, else queue. Every
// publish to a missing one would otherwise come back unroutable, one
// message at a time.
func (o *Opener) CheckTarget(ctx context.Context, exchange, queue string) error {
	in, err := broker.OpenInspector(ctx, o.Opts)
	if err != nil {
		return err
	}
	defer in.Close()
	if exchange != "" {
		if err := in.ExchangeExists(exchange); err != nil {
			return fmt.Errorf("destination exchange %q: %w", exchange, err)
		}
		return nil
	}
	if _, err := in.Depth(queue); err != nil {
		return fmt.Errorf("destination queue %q: %w", queue, err)
	}
	return nil
}

// exclusiveSource adapts broker.Exclusive to dlq.Source.
type exclusiveSource struct{ e *broker.Exclusive }

func (s exclusiveSource) Next(ctx context.Context) (dlq.Delivery, bool, error) {
	d, ok, err := s.e.Next(ctx)
	if err != nil || !ok {
		return nil, false, err
	}
	return d, true, nil
}

// GetSource reads a queue with basic.get; empty ends it.
func GetSource(in *broker.Inspector, queue string) dlq.Source {
	return dlq.SourceFunc(func(context.Context) (dlq.Delivery, bool, error) {
		d, ok, err := in.Get(queue)
		if err != nil || !ok {
			return nil, false, err
		}
		return d, true, nil
	})
}
