package broker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrInUse means the broker refused an exclusive consumer because the queue
// already has a consumer: another tool owns it.
var ErrInUse = errors.New("queue is in exclusive use by another consumer")

// ErrNoQueue means the queue does not exist.
var ErrNoQueue = errors.New("no such queue")

// Exclusive owns a queue for one run of an operator tool (DLQ replay,
// export --remove): an exclusive consumer, which the broker refuses to any
// second consumer of a classic queue, plus an exclusive lock queue (see
// LockQueue) that a second tool cannot declare whatever the queue type, so
// two tools can never process one DLQ at once — two owners republishing
// the same DLQ multiplies its messages on every pass. It also takes
// messages with basic.get on the same channel.
//
// Why both: a tool holds some messages unacked until the end of its run
// (filtered out, kept, waiting for an fsync) so that a bounded run never
// sees one twice. Held messages fill the consumer's prefetch window and the
// broker then stops pushing; from that point Next falls back to basic.get,
// which prefetch does not limit. A run can so hold any number of messages
// while the client buffers at most the window, whatever the body sizes.
//
// Nothing held is requeued before Close. Close (or losing the connection,
// or the process being killed) hands every unacked message back to the
// broker, which puts it back in its place in a classic queue; a quorum
// queue may put returned messages back in another order.
//
// OpenBrowse makes one that does not own the queue and ends its consumer
// with Stop instead, for a pass that must hand back nothing by a return.
type Exclusive struct {
	queue    string
	prefetch int
	present  int
	// consumersBefore is the queue's consumer count before this one took
	// anything (see awaitReturned).
	consumersBefore int
	// idle > 0 makes a browser (see OpenBrowse): how long Next waits for a
	// push before it asks whether the queue is empty.
	idle      time.Duration
	cancelled bool // under mu
	// byClosing makes Close hand held messages back by closing the
	// connection alone (see ReturnByClosing).
	byClosing bool
	tag       string
	s         *session

	deliveries <-chan amqp.Delivery
	connClosed chan *amqp.Error
	chClosed   chan *amqp.Error
	cancels    chan string

	// outstanding counts the current consumer's pushed deliveries handed
	// out and not yet settled; when it reaches the prefetch the broker
	// pushes nothing more to it. Each consumer a browser starts (see
	// renew) has its own: a delivery settles the count of the consumer
	// it came from.
	outstanding *atomic.Int64
	// taken counts every message handed out, pushed or got; buffered are
	// pushes a renewal drained from the consumer it cancelled, handed
	// out before anything else.
	taken    int
	buffered []*ExclusiveDelivery
	// unsettled are the delivery tags handed out and not yet acked or
	// nacked (under mu), for Close to return in their order.
	unsettled map[uint64]struct{}
	// cctx is the context of the browser's consumers.
	cctx context.Context
	acks *runAcker
	// A browser holds back the acks of the pushes numbered past holdFrom
	// (in the order they were handed out) until Stop has cancelled the
	// consumer; see OpenBrowse.
	mu        sync.Mutex
	pushes    int
	holdFrom  int
	held      []*ExclusiveDelivery
	stopAcks  chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// ExclusiveDelivery is a message taken by an Exclusive. Ack and Nack work
// as for Delivery.
type ExclusiveDelivery struct {
	Delivery
	e       *Exclusive
	pushed  bool
	out     *atomic.Int64 // the outstanding count of the consumer it came from
	seq     int           // place among the pushes handed out, from 1
	settled atomic.Bool
}

// Ack acknowledges the delivery on its own channel. The ack may go out a
// moment later, coalesced with others (see runAcker); Close sends what is
// held.
func (d *ExclusiveDelivery) Ack() error {
	if d.s.dead.Load() {
		return ErrChannelGone
	}
	d.e.settle(d.tag)
	if d.e.hold(d) {
		return nil
	}
	err := d.e.acks.ack(d.tag, time.Now())
	d.done()
	return err
}

// hold keeps d's ack for Stop to send, when d is one of the last pushes a
// browser's pass takes.
func (e *Exclusive) hold(d *ExclusiveDelivery) bool {
	if e.idle == 0 || !d.pushed {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cancelled || d.seq <= e.holdFrom {
		return false
	}
	e.held = append(e.held, d)
	return true
}

// Nack rejects the delivery on its own channel at once; requeue puts it
// back.
func (d *ExclusiveDelivery) Nack(requeue bool) error {
	if d.s.dead.Load() {
		return ErrChannelGone
	}
	d.e.settle(d.tag)
	err := d.e.acks.nack(d.tag, requeue)
	d.done()
	return err
}

// settle forgets a delivery Close would otherwise return.
func (e *Exclusive) settle(tag uint64) {
	e.mu.Lock()
	delete(e.unsettled, tag)
	e.mu.Unlock()
}

// got wraps a message taken with basic.get.
func (e *Exclusive) got(m *amqp.Delivery) *ExclusiveDelivery {
	e.mu.Lock()
	e.unsettled[m.DeliveryTag] = struct{}{}
	e.mu.Unlock()
	return &ExclusiveDelivery{Delivery: Delivery{m: fromDelivery(m), tag: m.DeliveryTag, s: e.s}, e: e}
}

func (d *ExclusiveDelivery) done() {
	if d.pushed && d.settled.CompareAndSwap(false, true) {
		d.out.Add(-1)
	}
}

// GetOnly, as the prefetch of OpenExclusive, takes every message with
// basic.get and starts no consumer. A quorum DLQ needs it: a consumer's
// window fills with messages pushed ahead of the tool, and whatever is
// still there when the tool ends goes back to the queue, each return
// spending a delivery of the queue's delivery limit. The lock queue still
// keeps a second tool out.
const GetOnly = 0

// OpenExclusive connects once, reads the queue's ready count (Present) and
// then takes exclusive ownership of the queue with a consumer whose window
// is prefetch messages (GetOnly: the lock queue alone, and no consumer).
// The count is read before consuming so that it is
// exactly the messages present at start, none of them pushed yet. When
// another consumer is on the queue the error wraps ErrInUse; when the queue
// does not exist it wraps ErrNoQueue.
func OpenExclusive(ctx context.Context, o Options, queue string, prefetch int) (*Exclusive, error) {
	return openExclusive(ctx, o, queue, prefetch, 0)
}

// OpenBrowse opens queue for a pass that reads it without owning it (a
// stats or console scan of a quorum DLQ): a consumer that is not
// exclusive, no lock queue, a window of prefetch messages (at least one)
// that the broker fills ahead of the pass, and Next telling when the queue
// has nothing more ready: once nothing was pushed for idle, a basic.get
// that finds the queue empty ends it. Present is read before consuming, as
// for OpenExclusive. End the pass with Stop, hand back what it returns,
// then Close.
//
// A pass takes the Present messages and no more, and the broker must not
// push past them either: whatever it pushed beyond would have to be handed
// back too, and handing it back at the tail would move it behind the rest.
// The broker pushes at most the window past what it has seen acked, so the
// window is at most Present, and the acks of the last window's worth of
// pushes are held until Stop has cancelled the consumer: then the broker
// has pushed the Present messages at most, unless some were taken by
// others meanwhile.
func OpenBrowse(ctx context.Context, o Options, queue string, prefetch int, idle time.Duration) (*Exclusive, error) {
	if idle <= 0 {
		return nil, fmt.Errorf("browse %q: the idle wait must be positive, got %v", queue, idle)
	}
	return openExclusive(ctx, o, queue, max(prefetch, 1), idle)
}

// browseWindow is a browser's window over present messages, and the number
// of pushes whose acks go out at once (the rest are held until Stop).
func browseWindow(present, prefetch int) (window, holdFrom int) {
	window = max(1, min(prefetch, present))
	return window, max(0, present-window)
}

// openExclusive opens an owner (idle 0) or a browser (idle > 0).
func openExclusive(ctx context.Context, o Options, queue string, prefetch int, idle time.Duration) (*Exclusive, error) {
	prefetch = max(prefetch, GetOnly)
	owner := idle == 0
	if o.Name == "" {
		o.Name = "hopper-exclusive " + queue
		if !owner {
			o.Name = "hopper-browse " + queue
		}
	}
	conn, _, err := o.dialOnce(ctx, 0)
	if err != nil {
		return nil, fmt.Errorf("connect to broker: %w", err)
	}
	wholeBodies(conn)
	fail := func(err error) (*Exclusive, error) {
		conn.Close()
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return fail(fmt.Errorf("open channel: %w", err))
	}
	q, err := declarePassive(ch, queue)
	if err != nil {
		return fail(queueError(queue, err))
	}
	// A passive declare that fails closes its channel, so the consumer gets
	// the same one only when the queue exists.
	if owner {
		if _, err := ch.QueueDeclare(LockQueue(queue),
			false, // durable: the lock lives and dies with this connection
			true,  // autoDelete
			true,  // exclusive: a second declare from another connection is refused
			false, // noWait
			amqp.Table{"x-queue-type": "classic"}); err != nil {
			var ae *amqp.Error
			if errors.As(err, &ae) && ae.Code == amqp.ResourceLocked {
				return fail(fmt.Errorf("%w: queue %q: lock queue %q is held by another connection: %w", ErrInUse, queue, LockQueue(queue), err))
			}
			return fail(fmt.Errorf("declare lock queue %q: %w", LockQueue(queue), err))
		}
	}
	holdFrom := q.Messages // an owner holds no ack back
	if !owner {
		prefetch, holdFrom = browseWindow(q.Messages, prefetch)
	}
	e := &Exclusive{
		queue:           queue,
		prefetch:        prefetch,
		present:         q.Messages,
		consumersBefore: q.Consumers,
		holdFrom:        holdFrom,
		idle:            idle,
		tag:             fmt.Sprintf("hopper-exclusive-%d", time.Now().UnixNano()),
		s:               &session{conn: conn, ch: ch},
		outstanding:     new(atomic.Int64),
		unsettled:       map[uint64]struct{}{},
	}
	if !owner {
		e.tag = fmt.Sprintf("hopper-browse-%d", time.Now().UnixNano())
	}
	e.connClosed = conn.NotifyClose(make(chan *amqp.Error, 1))
	e.chClosed = ch.NotifyClose(make(chan *amqp.Error, 1))
	e.cancels = ch.NotifyCancel(make(chan string, 4))
	go drain(conn.NotifyBlocked(make(chan amqp.Blocking, 4)))
	if prefetch != GetOnly {
		if err := ch.Qos(prefetch, 0, false); err != nil { // prefetchSize=0, global=false
			return fail(fmt.Errorf("set prefetch: %w", err))
		}
		// The client cancels a consumer when its context ends: a
		// browser's must live until Stop, whatever the pass's context.
		e.cctx = ctx
		if !owner {
			e.cctx = context.WithoutCancel(ctx)
		}
		e.deliveries, err = ch.ConsumeWithContext(e.cctx, queue, e.tag,
			false, // autoAck: every message is settled explicitly
			owner, // exclusive: an owner's refuses any other consumer while it runs
			false, // noLocal
			false, // noWait
			nil)
		if err != nil {
			return fail(queueError(queue, err))
		}
	}
	// A batch of a quarter of the window keeps acks waiting for their batch
	// from filling the window the broker counts.
	// On a quorum queue they also keep the acks few: its channel sends at
	// most quorum_commands_soft_limit (32) settlements ahead of the queue
	// and drops the rest when it closes. A browser acking each message
	// alone left 95 of 2,000 originals beside their copies.
	e.acks = newRunAcker(ch, prefetch/4, exclusiveAckWait)
	e.stopAcks = make(chan struct{})
	go flushEvery(e.acks, exclusiveAckWait, e.stopAcks)
	return e, nil
}

// exclusiveAckWait is how long an ack may wait to be coalesced. It is short
// because an ack the broker has not seen still holds a place in the window.
const exclusiveAckWait = 2 * time.Millisecond

// queueError classifies the broker's answer to a declare or consume.
func queueError(queue string, err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) {
		switch ae.Code {
		case amqp.AccessRefused:
			return fmt.Errorf("%w: queue %q: %w", ErrInUse, queue, err)
		case amqp.NotFound:
			return fmt.Errorf("%w: %q: %w", ErrNoQueue, queue, err)
		}
	}
	return fmt.Errorf("queue %q: %w", queue, err)
}

// LockQueue names the exclusive, auto-deleted queue an Exclusive declares
// while it owns queue. The exclusive consumer alone is not enough: quorum
// queues accept several "exclusive" consumers, while an exclusive queue is
// refused to every other connection whatever the owned queue's type, and
// the broker deletes it when the owner's connection ends, even by a kill.
// It also shows operators, in the management UI, who owns a DLQ.
func LockQueue(queue string) string {
	const prefix = "hopper.lock."
	name := prefix + queue
	if len(name) > 255 { // AMQP short string
		sum := sha256.Sum256([]byte(queue))
		name = prefix + hex.EncodeToString(sum[:16])
	}
	return name
}

// Present is the number of ready messages when the queue was opened.
func (e *Exclusive) Present() int { return e.present }

// Next returns the next message of the queue, oldest first. ok is false
// when ctx ends before one is ready (callers give ctx their idle timeout).
// An error means the connection, the channel or the consumer is gone; the
// broker has then already taken back every unacked message.
func (e *Exclusive) Next(ctx context.Context) (d *ExclusiveDelivery, ok bool, err error) {
	poll := 20 * time.Millisecond
	for {
		if len(e.buffered) > 0 {
			d := e.buffered[0]
			e.buffered = e.buffered[1:]
			e.taken++
			return d, true, nil
		}
		// A message the broker already pushed is older in the queue than
		// anything basic.get would return now.
		select {
		case del, open := <-e.deliveries:
			return e.pushed(del, open)
		default:
		}
		if e.outstanding.Load() < int64(e.prefetch) {
			// The window has room: the broker pushes the next message as
			// soon as the queue has one. A browser stops waiting after
			// idle and asks with basic.get whether anything is ready.
			var idle <-chan time.Time
			if e.idle > 0 {
				t := time.NewTimer(e.idle)
				defer t.Stop() // at most once: the idle case leaves the loop
				idle = t.C
			}
			select {
			case del, open := <-e.deliveries:
				return e.pushed(del, open)
			case err := <-e.connClosed:
				return nil, false, e.lost("connection closed", err)
			case err := <-e.chClosed:
				return nil, false, e.lost("channel closed", err)
			case tag := <-e.cancels:
				return nil, false, e.lost("consumer "+tag+" cancelled by the broker (queue deleted?)", nil)
			case <-ctx.Done():
				return nil, false, nil
			case <-idle:
			}
		}
		// The window is full of held messages: the broker pushes nothing
		// more. A browser starts a consumer with a window of its own while
		// messages present are left; else take the next one ourselves.
		if e.idle > 0 && e.taken < e.present && len(e.buffered) == 0 {
			if err := e.renew(); err != nil {
				return nil, false, err
			}
			continue
		}
		m, got, err := e.s.ch.Get(e.queue, false) // autoAck=false
		if err != nil {
			e.s.dead.Store(true)
			return nil, false, fmt.Errorf("get from %q: %w", e.queue, undecodable(err))
		}
		if got {
			e.taken++
			return e.got(&m), true, nil
		}
		if e.idle > 0 {
			// Nothing ready: the pass is over, unless a push overtook the
			// answer.
			select {
			case del, open := <-e.deliveries:
				return e.pushed(del, open)
			default:
				return nil, false, nil
			}
		}
		// Empty for now: wait for a push (a settled message freed the
		// window) or poll again, backing off up to half a second.
		t := time.NewTimer(poll)
		select {
		case del, open := <-e.deliveries:
			t.Stop()
			return e.pushed(del, open)
		case <-ctx.Done():
			t.Stop()
			return nil, false, nil
		case <-t.C:
			poll = min(2*poll, 500*time.Millisecond)
		}
	}
}

func (e *Exclusive) pushed(del amqp.Delivery, open bool) (*ExclusiveDelivery, bool, error) {
	if !open {
		// The client closes consumers after it has told the close
		// listeners why the connection or channel ended: say why.
		select {
		case err := <-e.connClosed:
			return nil, false, e.lost("connection closed", err)
		case err := <-e.chClosed:
			return nil, false, e.lost("channel closed", err)
		default:
		}
		return nil, false, e.lost("consumer closed", nil)
	}
	e.taken++
	return e.delivery(del), true, nil
}

// delivery wraps a push of the current consumer, counted in its window.
func (e *Exclusive) delivery(del amqp.Delivery) *ExclusiveDelivery {
	e.outstanding.Add(1)
	e.mu.Lock()
	e.pushes++
	seq := e.pushes
	e.unsettled[del.DeliveryTag] = struct{}{}
	e.mu.Unlock()
	return &ExclusiveDelivery{Delivery: Delivery{m: fromDelivery(&del), tag: del.DeliveryTag, s: e.s}, e: e, pushed: true, seq: seq, out: e.outstanding}
}

// renew replaces a browser's consumer whose window is full of messages the
// pass holds (it returns them when it closes, rather than rotating them)
// with a new one, whose window is the rest of the messages present at
// most. Held messages stay unacked on the channel, where Close returns
// them; without the new window the pass would go on with basic.get, which
// read 20,000 messages of a quorum queue in 72 s where a consumer took
// 12 s. The full window is also what makes the cancel safe: the broker
// pushes nothing past it, so no push is on its way to be returned (and
// counted) by the cancel. The broker pushes each consumer at most its
// window past its acks, and the acks of the last window's pushes of the
// pass are still held (see OpenBrowse), so it pushes no more than the
// messages present over all of them.
func (e *Exclusive) renew() error {
	if err := e.s.ch.Cancel(e.tag, false); err != nil { // noWait=false
		e.s.dead.Store(true)
		return fmt.Errorf("queue %q: cancel consumer: %w", e.queue, err)
	}
	// After cancel-ok the client closes the deliveries channel once it has
	// passed on every push it buffered (none is expected).
	for del := range e.deliveries {
		e.buffered = append(e.buffered, e.delivery(del))
	}
	window := max(1, min(e.prefetch, e.present-e.taken))
	if err := e.s.ch.Qos(window, 0, false); err != nil { // prefetchSize=0, global=false
		e.s.dead.Store(true)
		return fmt.Errorf("queue %q: set prefetch: %w", e.queue, err)
	}
	e.tag = fmt.Sprintf("hopper-browse-%d", time.Now().UnixNano())
	e.prefetch = window
	e.outstanding = new(atomic.Int64)
	deliveries, err := e.s.ch.ConsumeWithContext(e.cctx, e.queue, e.tag,
		false, // autoAck: every message is settled explicitly
		false, // exclusive
		false, // noLocal
		false, // noWait
		nil)
	if err != nil {
		e.s.dead.Store(true)
		return queueError(e.queue, err)
	}
	e.deliveries = deliveries
	return nil
}

func (e *Exclusive) lost(what string, err *amqp.Error) error {
	e.s.dead.Store(true)
	if err != nil {
		return fmt.Errorf("queue %q: %s: %w; unacked messages went back to the queue", e.queue, what, undecodable(err))
	}
	return fmt.Errorf("queue %q: %s; unacked messages went back to the queue", e.queue, what)
}

// Stop ends a browser's consumer without handing anything back: it
// returns, oldest first, every message the broker pushed that the caller
// did not take, for the caller to hand back in its own way (a quorum queue
// counts a return, so closing the channel on them would spend their
// delivery count). Call it once the caller has settled what it took;
// deliveries it still holds stay valid, and Close returns them.
//
// Cancelling a consumer while a push is on its way makes the broker
// return that push, counting a delivery: it is sent before the consumer is
// gone but reaches the channel after. So Stop first sends every ack held,
// then takes pushes until nothing can be on its way: either the window is
// full (the broker sends nothing past prefetch unacked, and every ack is
// on the wire, so all it sent has arrived) or the queue has nothing ready
// (a basic.get finds it empty after idle without a push; a push the broker
// decided before that answer reaches the channel before it, and the
// channel still knows the consumer when it arrives). Only a message
// published between that answer and the cancel can still be pushed and
// returned, and it then counts one delivery. The cancel waits for the
// broker's cancel-ok, after which nothing more is pushed and the client
// has every push it made.
func (e *Exclusive) Stop(ctx context.Context) ([]*ExclusiveDelivery, error) {
	e.mu.Lock()
	cancelled := e.cancelled
	e.mu.Unlock()
	if e.deliveries == nil || cancelled {
		return nil, nil
	}
	if e.s.dead.Load() {
		return nil, fmt.Errorf("queue %q: %w", e.queue, ErrChannelGone)
	}
	if err := e.acks.flush(time.Now(), true); err != nil {
		return nil, err
	}
	rest := e.buffered
	e.buffered = nil
	idle := max(e.idle, exclusiveAckWait)
	for e.outstanding.Load() < int64(e.prefetch) {
		t := time.NewTimer(idle)
		select {
		case del, open := <-e.deliveries:
			t.Stop()
			d, _, err := e.pushed(del, open)
			if err != nil {
				return rest, err
			}
			rest = append(rest, d)
			continue
		case err := <-e.connClosed:
			t.Stop()
			return rest, e.lost("connection closed", err)
		case err := <-e.chClosed:
			t.Stop()
			return rest, e.lost("channel closed", err)
		case <-ctx.Done():
			t.Stop()
			return rest, fmt.Errorf("queue %q: stop browsing: %w", e.queue, ctx.Err())
		case <-t.C:
		}
		m, got, err := e.s.ch.Get(e.queue, false) // autoAck=false
		if err != nil {
			e.s.dead.Store(true)
			return rest, fmt.Errorf("get from %q: %w", e.queue, undecodable(err))
		}
		if !got {
			break
		}
		rest = append(rest, e.got(&m))
	}
	if err := e.s.ch.Cancel(e.tag, false); err != nil { // noWait=false
		e.s.dead.Store(true)
		return rest, fmt.Errorf("queue %q: cancel consumer: %w", e.queue, err)
	}
	// After cancel-ok the client closes the deliveries channel once it has
	// passed on every push it buffered.
	for del := range e.deliveries {
		d, _, err := e.pushed(del, true)
		if err != nil {
			return rest, err
		}
		rest = append(rest, d)
	}
	return rest, e.releaseHeld()
}

// releaseHeld marks the consumer cancelled and sends the acks a browser
// held back (one multiple-ack when they are a run); from then on every ack
// goes out as it comes.
func (e *Exclusive) releaseHeld() error {
	e.mu.Lock()
	e.cancelled = true
	held := e.held
	e.held = nil
	e.mu.Unlock()
	for _, d := range held {
		if err := e.acks.ack(d.tag, time.Now()); err != nil {
			return fmt.Errorf("queue %q: %d held ack(s): %w (those messages go back to the queue beside their copies)", e.queue, len(held), err)
		}
		d.done()
	}
	if err := e.acks.flush(time.Now(), true); err != nil {
		return fmt.Errorf("queue %q: send held acks: %w", e.queue, err)
	}
	return nil
}

// ReturnByClosing makes Close hand the messages still held back by closing
// the connection, without the basic.nack before it. Call it for a classic
// queue only, before Close. On a classic queue both put every message back
// in its place, but RabbitMQ 4.3 requeues one nack of many deliveries far
// more slowly than a closed connection's (11,803 held messages: about 60 s
// against about 3 s), and a tool that held a whole DLQ would leave it empty
// to the next run for minutes. On a quorum queue a return by closing
// counts against the delivery limit where a nack does not, so there Close
// keeps the nack.
func (e *Exclusive) ReturnByClosing() { e.byClosing = true }

// Close gives up ownership: it cancels the consumer, returns every message
// still unacked to the queue (basic.nack of all outstanding deliveries with
// requeue, unless ReturnByClosing) and closes the connection. Deliveries
// cannot be settled after it.
func (e *Exclusive) Close() error {
	e.closeOnce.Do(func() {
		defer close(e.stopAcks)
		var errs []error
		if !e.s.dead.Load() && !e.s.ch.IsClosed() {
			// Acks first: each is for a message whose copy is already
			// confirmed, and the nack below would put it back.
			e.acks.flush(time.Now(), true) //nolint:errcheck // counted below
		} else {
			e.acks.abandon()
		}
		if n := e.acks.unsentAcks(); n > 0 {
			errs = append(errs, fmt.Errorf("%d ack(s) did not reach the broker before the channel ended: those messages are back in %q although handled (duplicates, not losses)", n, e.queue))
		}
		if !e.s.dead.Load() && !e.s.ch.IsClosed() {
			e.mu.Lock()
			cancelled := e.cancelled
			e.mu.Unlock()
			if e.deliveries != nil && !cancelled {
				if err := e.s.ch.Cancel(e.tag, false); err != nil { // noWait=false
					errs = append(errs, fmt.Errorf("cancel consumer: %w", err))
				} else if err := e.releaseHeld(); err != nil {
					// A browser closed without Stop: its held acks still
					// go out before the nack below.
					errs = append(errs, err)
				}
			}
			// Delivery tag 0 with multiple=true is every outstanding
			// delivery of the channel, pushed or got.
			if !e.byClosing {
				if err := e.returnInOrder(); err != nil {
					errs = append(errs, fmt.Errorf("return held messages: %w", err))
				} else {
					e.awaitReturned()
				}
			}
		}
		if e.idle == 0 && !e.s.conn.IsClosed() {
			e.dropLock()
		}
		e.s.dead.Store(true)
		if err := e.s.conn.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
			errs = append(errs, fmt.Errorf("close connection: %w", err))
		}
		e.closeErr = errors.Join(errs...)
	})
	return e.closeErr
}

// returnBatch is how many returns returnInOrder has on their way at once:
// fewer than quorum_commands_soft_limit (32 by default), past which a
// quorum queue's channel holds commands back and sends them later in no
// particular order.
const returnBatch = 16

// returnBatchWait bounds the wait for one batch of returns to show in the
// queue's ready count; past it the rest go at once.
const returnBatchWait = 5 * time.Second

// returnInOrder returns every message still held, one basic.nack with
// requeue each, in the order they were taken, so that they are back at the
// head of a quorum queue in the order they had. A quorum queue takes the
// return of each message taken with basic.get (and of each consumer's
// messages) as a command of its own, and one nack of 300 such messages put
// them back in no order past the first 32. So the returns go returnBatch
// at a time, each batch once the queue's ready count shows the one before
// (returnBatchWait at most; then the rest go at once, in their order as
// far as the broker keeps it). A final nack of every outstanding delivery
// catches anything not tracked. 300 messages were back in order in 60 ms.
func (e *Exclusive) returnInOrder() error {
	e.mu.Lock()
	tags := slices.Sorted(maps.Keys(e.unsettled))
	clear(e.unsettled)
	e.mu.Unlock()
	var side *amqp.Channel
	ready0 := -1
	if len(tags) > returnBatch {
		if ch, err := e.s.conn.Channel(); err == nil {
			side = ch
			defer closeQuietly(side)
			if q, err := declarePassive(side, e.queue); err == nil {
				ready0 = q.Messages
			}
		}
	}
	for i, tag := range tags {
		if err := e.s.ch.Nack(tag, false, true); err != nil { // multiple=false, requeue=true
			return err
		}
		if ready0 < 0 || (i+1)%returnBatch != 0 || i+1 == len(tags) {
			continue
		}
		deadline := time.Now().Add(returnBatchWait)
		for {
			q, err := declarePassive(side, e.queue)
			if err != nil || time.Now().After(deadline) {
				ready0 = -1 // the rest at once
				break
			}
			if q.Messages >= ready0+i+1 {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	return e.s.ch.Nack(0, true, true) // multiple=true, requeue=true
}

// returnedWait bounds awaitReturned.
const returnedWait = 10 * time.Second

// awaitReturned waits, after the nack that returns what is held, until the
// queue has taken every message back, before the channel closes. A quorum
// queue takes the returns of a nack a few dozen at a time, and a channel
// that closes first has the rest returned as by a closed channel, which
// RabbitMQ 4.x counts against the delivery limit where the nack is not:
// a stats pass that held 300 messages and closed at once left 267 of them
// with x-delivery-count 1. A quorum queue counts each reader that holds
// messages as a consumer (a basic.get's too) until it holds none, so the
// returns are in once the count is back to what it was before this one
// took anything. Another reader coming meanwhile keeps it up: then the
// wait ends at returnedWait, and what is still on its way back counts one
// delivery, as it would have without the wait.
func (e *Exclusive) awaitReturned() {
	ch, err := e.s.conn.Channel()
	if err != nil {
		return
	}
	defer closeQuietly(ch)
	deadline := time.Now().Add(returnedWait)
	for {
		q, err := declarePassive(ch, e.queue)
		if err != nil || q.Consumers <= e.consumersBefore || time.Now().After(deadline) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// dropLock deletes the owner's lock queue before its connection closes.
// The broker also deletes an exclusive queue when the connection that
// declared it ends, but RabbitMQ 4.x does that after the close is
// answered: a tool started right after this one ends would otherwise be
// told the queue is in use. The channel is closed first, which hands back
// whatever the return above left unacked (all of it with
// ReturnByClosing), so the next owner finds every message in the queue. A
// failed delete is left to the connection close.
func (e *Exclusive) dropLock() {
	e.s.ch.Close() //nolint:errcheck // a dead channel hands its messages back all the same
	ch, err := e.s.conn.Channel()
	if err != nil {
		return
	}
	ch.QueueDelete(LockQueue(e.queue), false, false, false) //nolint:errcheck // ifUnused, ifEmpty, noWait all false; see above
}
