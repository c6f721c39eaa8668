package broker

import (
	"context"
	"errors"
	"fmt"
	"regexp"

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
	wholeBodies(conn)
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
	q, err := i.declared(queue)
	return q.Messages, err
}

// Consumers is the number of consumers on a queue. On a quorum queue a
// consumer whose channel ended is removed in the same step as its unacked
// messages are returned, so 0 also says nothing is still on its way back.
func (i *Inspector) Consumers(queue string) (int, error) {
	q, err := i.declared(queue)
	return q.Consumers, err
}

// declared is what a passive declare of queue answers, on a channel of its
// own: a missing queue closes the channel it is asked on.
func (i *Inspector) declared(queue string) (amqp.Queue, error) {
	ch, err := i.s.conn.Channel()
	if err != nil {
		return amqp.Queue{}, fmt.Errorf("open channel: %w", err)
	}
	defer closeQuietly(ch)
	q, err := declarePassive(ch, queue)
	if err != nil {
		return amqp.Queue{}, fmt.Errorf("%w: queue %q: %w", ErrTopology, queue, err)
	}
	return q, nil
}

// ExchangeExists checks an exchange with a passive declare, on a channel
// of its own (a missing exchange closes the channel it is asked on). The
// default exchange, named "", always exists.
func (i *Inspector) ExchangeExists(name string) error {
	if name == "" {
		return nil
	}
	ch, err := i.s.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer closeQuietly(ch)
	// kind "", durable, autoDelete, internal, noWait: a passive declare checks the name only
	if err := ch.ExchangeDeclarePassive(name, "", false, false, false, false, nil); err != nil {
		return fmt.Errorf("%w: exchange %q: %w", ErrTopology, name, err)
	}
	return nil
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

// QueueType is what kind of queue a queue is, which decides how a tool may
// hand back a message it read: a classic queue returns it in place for
// free, a quorum queue counts the return against the message's delivery
// limit, and a stream is not a queue messages leave at all.
type QueueType string

// The queue types QueueTypeOf tells apart.
const (
	Classic QueueType = "classic"
	Quorum  QueueType = "quorum"
	Stream  QueueType = "stream"
)

// ErrUnknownType means the broker did not say what type a queue is; a tool
// that depends on it refuses rather than guess.
var ErrUnknownType = errors.New("cannot tell the queue's type")

// probeTypeRE reads the queue type out of the broker's refusal of the
// probe's consumer arguments ("invalid arg 'x-stream-offset' for queue 'q'
// in vhost '/' of queue type rabbit_quorum_queue").
var probeTypeRE = regexp.MustCompile(`of queue type (rabbit_[a-z0-9_]+)$`)

// QueueTypeOf tells what type queue is, without reading or returning any of
// its messages.
//
// Nothing AMQP 0-9-1 answers names a queue's type directly (a passive
// declare gives counts only), and the management API may not be there. But
// every RabbitMQ from 3.9 to 4.x checks a consumer's arguments against the
// queue's own type before it attaches the consumer, and refuses an
// argument that another type knows but this one does not with
// PRECONDITION_FAILED, naming the type's module. The probe asks for a
// consumer with two arguments no type accepts together: x-stream-offset,
// which only streams know, and x-priority, which classic and quorum queues
// know and streams do not. Each type refuses exactly one of them, so the
// consumer never exists and no message moves; the refusal says the type.
// That is ordinary argument validation, not deprecated behaviour, and it
// holds while a tool owns the queue (the check comes before exclusivity).
//
// Should a broker ever accept the probe, the consumer is cancelled at once
// and the type is unknown: a tool refuses rather than guess. Its prefetch
// of one keeps what could reach it meanwhile to a single message.
func QueueTypeOf(ctx context.Context, o Options, queue string) (QueueType, error) {
	if o.Name == "" {
		o.Name = "hopper-probe"
	}
	conn, _, err := o.dialOnce(ctx, 0)
	if err != nil {
		return "", fmt.Errorf("connect to broker: %w", err)
	}
	defer conn.Close()
	return queueType(ctx, conn, queue)
}

// queueType runs QueueTypeOf's probe on a channel of its own on conn; the
// broker's refusal closes that channel only.
func queueType(ctx context.Context, conn *amqp.Connection, queue string) (QueueType, error) {
	ch, err := conn.Channel()
	if err != nil {
		return "", fmt.Errorf("open channel: %w", err)
	}
	defer closeQuietly(ch)
	if err := ch.Qos(1, 0, false); err != nil { // prefetchCount=1, prefetchSize=0, global=false
		return "", fmt.Errorf("set a prefetch: %w", err)
	}
	const tag = "hopper-type-probe"
	_, err = ch.ConsumeWithContext(ctx, queue, tag,
		false, // autoAck
		false, // exclusive
		false, // noLocal
		false, // noWait
		amqp.Table{"x-stream-offset": "first", "x-priority": int32(0)})
	if err == nil {
		_ = ch.Cancel(tag, false) // noWait=false
		return "", fmt.Errorf("%w %q: the broker accepted a consumer with both x-stream-offset and x-priority, which RabbitMQ 3.9 to 4.x refuse", ErrUnknownType, queue)
	}
	var ae *amqp.Error
	if errors.As(err, &ae) {
		switch ae.Code {
		case amqp.NotFound:
			return "", fmt.Errorf("%w: %q: %w", ErrNoQueue, queue, err)
		case amqp.PreconditionFailed:
			if m := probeTypeRE.FindStringSubmatch(ae.Reason); m != nil {
				switch m[1] {
				case "rabbit_classic_queue":
					return Classic, nil
				case "rabbit_quorum_queue":
					return Quorum, nil
				case "rabbit_stream_queue":
					return Stream, nil
				}
				return "", fmt.Errorf("%w %q: the broker names its type %s, which Hopper does not know", ErrUnknownType, queue, m[1])
			}
		}
	}
	return "", fmt.Errorf("%w %q: %w", ErrUnknownType, queue, err)
}

// Bind binds a queue to an exchange with a routing key.
func (i *Inspector) Bind(queue, exchange, key string) error {
	if err := i.s.ch.QueueBind(queue, key, exchange, false, nil); err != nil { // noWait=false
		return fmt.Errorf("bind %q to %q with %q: %w", queue, exchange, key, err)
	}
	return nil
}
