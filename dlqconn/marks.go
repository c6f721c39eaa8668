package dlqconn

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/topology"
)

// The console's marks on a DLQ's failure groups are kept on the broker, in
// a queue of the DLQ's own (dlq.MarksQueue): a durable classic queue that
// holds one persistent message, the whole current set (dlq.Marks).
//
// Why this way. The marks must outlive the console, be the same for every
// console of the DLQ, and never put a dead letter at risk; so they are
// never written into the DLQ, only beside it, where a replay, a purge or a
// scan never looks. The queue is classic whatever the DLQ's type: reading
// it takes the message with basic.get and hands it back unacked, which a
// classic queue does in place and for free, where a quorum queue would
// count every read against the message's delivery limit and drop the marks
// after twenty of them on RabbitMQ 4.x.
//
// A change is made under the queue's lock (broker.OpenExclusive: an
// exclusive lock queue no second connection can declare), so two consoles
// never change the set from the same old one and lose a mark: take the
// set, publish the changed set (persistent, one Seq higher) and wait for
// the broker's confirm, and only then ack the old one. A failure at any
// step leaves the old set in place; one after the confirm at worst leaves
// the old set beside the new, which readers pass over (the highest Seq
// wins) and the next change removes. A read takes the lock too: a message
// another console holds for a moment is not in the queue for anyone
// else, and the marks would seem gone.

// marksLockWait bounds the wait for another console that holds a marks
// queue: it does so for a few round trips per read or change.
const marksLockWait = 10 * time.Second

// marksMax is the most messages a marks queue is read with. It holds one,
// or two for a moment; more means something else publishes to it.
const marksMax = 16

// Marks reads the marks kept for queue's failure groups. A DLQ whose marks
// were never stored has none: its marks queue does not exist, and is not
// created by a read.
func (o *Opener) Marks(ctx context.Context, queue string) (dlq.Marks, error) {
	ex, err := o.openMarks(ctx, queue)
	if errors.Is(err, broker.ErrNoQueue) {
		m, _ := dlq.LatestMarks(queue, nil)
		return m, nil
	}
	if err != nil {
		return dlq.Marks{}, err
	}
	defer o.closeMarks(queue, ex)
	sets, _, err := readMarks(ctx, ex, queue)
	if err != nil {
		return dlq.Marks{}, err
	}
	m, _ := dlq.LatestMarks(queue, sets)
	return m, nil
}

// ChangeMarks makes change to queue's marks on behalf of who and returns
// the set stored. It returns only once the broker has confirmed the new
// set; on an error nothing was changed.
func (o *Opener) ChangeMarks(ctx context.Context, queue, who string, change func(*dlq.Marks)) (dlq.Marks, error) {
	mq := dlq.MarksQueue(queue)
	q := topology.Queue{Name: mq, Role: "console marks", Owned: true,
		Args: map[string]any{"x-queue-type": "classic", "x-queue-version": int32(2)}}
	if err := broker.DeclareQueue(ctx, o.Opts, q); err != nil {
		return dlq.Marks{}, fmt.Errorf("keep console marks of %s: %w", queue, err)
	}
	ex, err := o.openMarks(ctx, queue)
	if err != nil {
		return dlq.Marks{}, err
	}
	defer o.closeMarks(queue, ex)
	sets, held, err := readMarks(ctx, ex, queue)
	if err != nil {
		return dlq.Marks{}, err
	}
	old, _ := dlq.LatestMarks(queue, sets)
	next := old.Next(time.Now(), who, change)
	m, err := dlq.EncodeMarks(next)
	if err != nil {
		return dlq.Marks{}, err
	}
	pub := broker.NewPublisher(broker.PublisherOptions{Options: o.Opts, Channels: 1, ConfirmTimeout: o.ConfirmTimeout})
	err = pub.Publish(ctx, mq, m)
	if cerr := pub.Close(); cerr != nil {
		o.log().Warn("close publisher", "error", cerr.Error())
	}
	if err != nil {
		return dlq.Marks{}, fmt.Errorf("store console marks of %s in %s: %w; the marks are as they were", queue, mq, err)
	}
	// The new set is the broker's now: the old ones may go. An ack that
	// does not reach it leaves an outdated set that readers pass over.
	for _, d := range held {
		if err := d.Ack(); err != nil {
			o.log().Warn("remove outdated console marks; they stay beside the new set, which supersedes them", "queue", mq, "error", err.Error())
			break
		}
	}
	return next, nil
}

// openMarks takes queue's marks queue for a read or a change, waiting up
// to marksLockWait for a console that holds it.
func (o *Opener) openMarks(ctx context.Context, queue string) (*broker.Exclusive, error) {
	mq := dlq.MarksQueue(queue)
	deadline := time.Now().Add(marksLockWait)
	wait := 20 * time.Millisecond
	for {
		ex, err := broker.OpenExclusive(ctx, o.Opts, mq, broker.GetOnly)
		if err == nil || !errors.Is(err, broker.ErrInUse) || time.Now().After(deadline) {
			if err != nil && !errors.Is(err, broker.ErrNoQueue) {
				err = fmt.Errorf("console marks of %s (%s): %w", queue, mq, err)
			}
			return ex, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("console marks of %s (%s): %w", queue, mq, ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

// closeMarks hands back what was not acked, in place, and frees the lock.
func (o *Opener) closeMarks(queue string, ex *broker.Exclusive) {
	if err := ex.Close(); err != nil {
		o.log().Warn("close console marks queue; the broker keeps its messages anyway", "queue", dlq.MarksQueue(queue), "error", err.Error())
	}
}

// readMarks takes every message of an open marks queue, unacked, and
// decodes each.
func readMarks(ctx context.Context, ex *broker.Exclusive, queue string) ([]dlq.Marks, []*broker.ExclusiveDelivery, error) {
	mq := dlq.MarksQueue(queue)
	if n := ex.Present(); n > marksMax {
		return nil, nil, fmt.Errorf("%w: %s holds %d messages, where the console keeps one; look at them (hopper dlq peek --dlq %s), or delete the queue to clear every mark", dlq.ErrNotMarks, mq, n, mq)
	}
	var sets []dlq.Marks
	var held []*broker.ExclusiveDelivery
	for range ex.Present() {
		nctx, cancel := context.WithTimeout(ctx, marksLockWait)
		d, ok, err := ex.Next(nctx)
		cancel()
		if err != nil {
			return nil, nil, fmt.Errorf("read console marks from %s: %w", mq, err)
		}
		if !ok {
			return nil, nil, fmt.Errorf("read console marks from %s: %d of %d messages could be taken", mq, len(held), ex.Present())
		}
		held = append(held, d)
		m, err := dlq.DecodeMarks(queue, d.Message())
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w; look at it (hopper dlq peek --dlq %s), or delete the queue to clear every mark", mq, err, mq)
		}
		sets = append(sets, m)
	}
	return sets, held, nil
}
