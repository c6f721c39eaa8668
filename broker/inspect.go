package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Inspector is a single connection and channel for tools that look into
// queues one message at a time (the DLQ tools, tests): basic.get with
// manual acks, depth, purge.
type Inspector struct {
	s *session
}

// OpenInspector connects once.
func OpenInspector(ctx context.Context, o Options) (*Inspector, error) {
	if o.Name == "" {
		o.Name = "hopper-inspector"
	}
	conn, _, err := o.dialOnce(ctx, 0)
	if err != nil {
		return nil, fmt.Errorf("connect to broker: %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("open channel: %w", err)
	}
	return &Inspector{s: &session{conn: conn, ch: ch}}, nil
}

// Get takes the next message without acking it; ok is false when the queue
// is empty. The delivery must be acked or nacked; closing the inspector
// returns unsettled ones to the queue.
func (i *Inspector) Get(queue string) (d *Delivery, ok bool, err error) {
	m, ok, err := i.s.ch.Get(queue, false) // autoAck=false
	if err != nil {
		i.s.dead.Store(true)
		return nil, false, fmt.Errorf("get from %q: %w", queue, undecodable(err))
	}
	if !ok {
		return nil, false, nil
	}
	return &Delivery{m: fromDelivery(&m), tag: m.DeliveryTag, s: i.s}, true, nil
}

// Depth is the number of ready messages in a queue (unacked ones are not
// counted by the broker here).
func (i *Inspector) Depth(queue string) (int, error) {
	ch, err := i.s.conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("open channel: %w", err)
	}
	defer closeQuietly(ch)
	q, err := declarePassive(ch, queue)
	if err != nil {
		return 0, fmt.Errorf("%w: queue %q: %w", ErrTopology, queue, err)
	}
	return q.Messages, nil
}

// Consumers is the number of consumers on a queue. On a quorum queue a
// consumer whose channel ended is removed in the same step as its unacked
// messages are returned, so 0 also says nothing is still on its way back.
func (i *Inspector) Consumers(queue string) (int, error) {
	ch, err := i.s.conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("open channel: %w", err)
	}
	defer closeQuietly(ch)
	q, err := declarePassive(ch, queue)
	if err != nil {
		return 0, fmt.Errorf("%w: queue %q: %w", ErrTopology, queue, err)
	}
	return q.Consumers, nil
}

// Purge removes every ready message and returns how many.
func (i *Inspector) Purge(queue string) (int, error) {
	n, err := i.s.ch.QueuePurge(queue, false) // noWait=false
	if err != nil {
		return 0, fmt.Errorf("purge %q: %w", queue, err)
	}
	return n, nil
}

// Close closes the connection; unsettled deliveries return to their queue.
func (i *Inspector) Close() error {
	i.s.dead.Store(true)
	if err := i.s.conn.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
		return fmt.Errorf("close inspector: %w", err)
	}
	return nil
}

// ErrUndecodable means the client could not decode the next message of a
// queue: the connection ended, and the message went back to the head of
// the queue, where the next reader meets it again.
var ErrUndecodable = errors.New("the next message could not be decoded by the AMQP client (a header table nested deeper than 32 levels, or a field type it does not know), which ended the connection; the message is back at the head of the queue (on a quorum queue each such attempt spends one delivery of its delivery limit): take it out with a client that can read it, or purge")

// undecodable marks the client's frame errors, which a message the broker
// accepted but the client cannot parse causes.
func undecodable(err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) && (ae.Code == amqp.FrameError || ae.Code == amqp.SyntaxError) {
		return fmt.Errorf("%w: %w", ErrUndecodable, err)
	}
	return err
}

// IsQuorum tells whether queue counts the returns of its messages, as a
// quorum queue does (and drops a message past its delivery limit), so that
// a tool must not hand messages back by returning them.
//
// Neither a passive declare nor anything else AMQP 0-9-1 answers names a
// queue's type, and the management API may not be there. Redeclaring with
// an x-queue-type is no test either: the broker compares every argument and
// reports the first that differs. What is certain is that quorum queues
// (and streams) refuse a consumer on a channel with a global prefetch, on
// RabbitMQ 3.8 to 4.x alike, with NOT_IMPLEMENTED; a classic queue accepts
// it, or refuses it as "in exclusive use" when a tool owns it. The probe
// runs on a connection of its own, since NOT_IMPLEMENTED closes the
// connection; a message a classic queue pushes to the probe meanwhile goes
// back to its place when that connection closes.
func IsQuorum(ctx context.Context, o Options, queue string) (bool, error) {
	if o.Name == "" {
		o.Name = "hopper-probe"
	}
	conn, _, err := o.dialOnce(ctx, 0)
	if err != nil {
		return false, fmt.Errorf("connect to broker: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return false, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Qos(1, 0, true); err != nil { // prefetchCount=1, prefetchSize=0, global=true
		return false, fmt.Errorf("set a global prefetch: %w", err)
	}
	_, err = ch.ConsumeWithContext(ctx, queue, "",
		false, // autoAck
		false, // exclusive
		false, // noLocal
		false, // noWait
		nil)
	if err == nil {
		return false, nil
	}
	var ae *amqp.Error
	if errors.As(err, &ae) {
		switch {
		case ae.Code == amqp.NotImplemented:
			return true, nil
		case ae.Code == amqp.AccessRefused && strings.Contains(ae.Reason, "exclusive use"):
			return false, nil
		case ae.Code == amqp.NotFound:
			return false, fmt.Errorf("%w: %q: %w", ErrNoQueue, queue, err)
		}
	}
	return false, fmt.Errorf("tell the type of queue %q: %w", queue, err)
}

// Bind binds a queue to an exchange with a routing key.
func (i *Inspector) Bind(queue, exchange, key string) error {
	if err := i.s.ch.QueueBind(queue, key, exchange, false, nil); err != nil { // noWait=false
		return fmt.Errorf("bind %q to %q with %q: %w", queue, exchange, key, err)
	}
	return nil
}
