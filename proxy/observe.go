package proxy

import (
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// Observer records what the loop did, once per delivery, after the settle,
// so metrics cannot disagree with what happened: a decision whose move had
// to be let go is reported as a return.
type Observer interface {
	// Decided is called once per delivery with the app's outcome (Kind is
	// meaningless when called is false: the message expired unseen), the
	// decision, the delay tier of a retry and the HTTP latency.
	Decided(out retry.Outcome, called bool, dec retry.Decision, latency time.Duration)
	// MoveFailed is called each time a move's publish fails; the original is
	// held and the move retried.
	MoveFailed(role string)
	// InFlight tracks deliveries being processed.
	InFlight(delta int)
	// InternalError is called for each panic recovered while handling a
	// delivery.
	InternalError()
	// Batch is called for each batch request, with its number of messages.
	Batch(size int)
	// OrderBroken is called for each ordered message that had to leave
	// its place in line, with why (OrderHoldExhausted, OrderReturned).
	OrderBroken(reason string)
	// Routed is called once per delivery the queue's routing rules let
	// through, with the route taken ("" for none: the queue's own path).
	// A message left out is counted by Decided, with its reason.
	Routed(route string)
	// RuleFailed is called for each routing rule that could not be
	// evaluated for a message, with why (route.ProblemBody,
	// route.ProblemEval).
	RuleFailed(kind string)
	// Parked is called for each message moved to a parking queue because
	// it is not due, with the parking delay.
	Parked(step time.Duration)
	// Due is called for each message back from parking when it is
	// delivered, with how late it is (negative: early, by at most half
	// the schedule's step).
	Due(late time.Duration)
}

// Why an ordered message left its place in line.
const (
	// OrderHoldExhausted: holding it in place would have kept it unacked
	// past MoveHoldMax, so its retry or requeue went through a queue and
	// later messages overtook it.
	OrderHoldExhausted = "hold-exhausted"
	// OrderReturned: it was published again at the tail of the work queue
	// (a give-back on a quorum queue, or a return carrying a crash count).
	OrderReturned = "returned"
)

type nopObserver struct{}

func (nopObserver) Decided(retry.Outcome, bool, retry.Decision, time.Duration) {}
func (nopObserver) MoveFailed(string)                                          {}
func (nopObserver) InFlight(int)                                               {}
func (nopObserver) InternalError()                                             {}
func (nopObserver) Batch(int)                                                  {}
func (nopObserver) OrderBroken(string)                                         {}
func (nopObserver) Routed(string)                                              {}
func (nopObserver) RuleFailed(string)                                          {}
func (nopObserver) Parked(time.Duration)                                       {}
func (nopObserver) Due(time.Duration)                                          {}

// propagator reads and writes W3C trace context. It is used directly (not
// the global one) so that, with tracing off, an incoming traceparent still
// reaches the app and the moved copies unchanged.
var propagator = propagation.TraceContext{}

// headerCarrier adapts AMQP headers to the propagator.
type headerCarrier map[string]any

func (c headerCarrier) Get(key string) string {
	if s, ok := c[key].(string); ok {
		return s
	}
	return ""
}

func (c headerCarrier) Set(key, value string) { c[key] = value }

func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// Hopper's own span attributes; the rest are the OpenTelemetry messaging
// semantic conventions' (semconv).
var (
	keyAttempt  = attribute.Key("hopper.attempt")
	keyDecision = attribute.Key("hopper.decision")
	keyReason   = attribute.Key("hopper.reason")
	// keyBatchAgain says why an attempt in a batch was not acted on: the
	// message goes again (the batch split, refused, or behind a failed
	// message of an ordered batch).
	keyBatchAgain = attribute.Key("hopper.batch.again")
	keyMove       = attribute.Key("hopper.move")
	// keyRoute is the route the routing rules chose; keyFiltered marks a
	// message they left out, settled without reaching the app.
	keyRoute    = attribute.Key("hopper.route")
	keyFiltered = attribute.Key("hopper.filtered")
)

// defaultExchange is how the conventions name RabbitMQ's default exchange
// ("") as a destination.
const defaultExchange = "amq.default"

// exchangeName is the destination name of a RabbitMQ exchange.
func exchangeName(ex string) string {
	if ex == "" {
		return defaultExchange
	}
	return ex
}

// deliveryAttrs are the consumer span's attributes: where the message came
// from, which queue this consumer reads, and the delivery itself.
func deliveryAttrs(d Delivery, m *msg.Message, in msg.Info) []attribute.KeyValue {
	if u, ok := d.(interface{ Unwrap() Delivery }); ok {
		d = u.Unwrap()
	}
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemRabbitMQ,
		semconv.MessagingOperationName("process"),
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingDestinationName(exchangeName(in.Exchange)),
		semconv.MessagingRabbitMQDestinationRoutingKey(in.RoutingKey),
		semconv.MessagingConsumerGroupName(in.Queue),
		semconv.MessagingMessageBodySize(len(m.Body)),
		keyAttempt.Int(in.Attempt),
	}
	if m.MessageID != "" {
		attrs = append(attrs, semconv.MessagingMessageID(m.MessageID))
	}
	if m.CorrelationID != "" {
		attrs = append(attrs, semconv.MessagingMessageConversationID(m.CorrelationID))
	}
	if t, ok := d.(interface{ Tag() uint64 }); ok {
		attrs = append(attrs, semconv.MessagingRabbitMQMessageDeliveryTag(int(t.Tag())))
	}
	if sv, ok := d.(interface{ Server() (string, int) }); ok {
		if host, port := sv.Server(); host != "" {
			attrs = append(attrs, semconv.ServerAddress(host))
			if port > 0 {
				attrs = append(attrs, semconv.ServerPort(port))
			}
		}
	}
	return attrs
}

// record counts a settled delivery, once, as what happened: in Stats and
// through the Observer. It is the only place either is told of a decision.
func (p *Loop) record(out retry.Outcome, called bool, dec retry.Decision, latency time.Duration) {
	var c *atomic.Int64
	switch dec.Action {
	case retry.Ack:
		c = &p.Stats.Acked
	case retry.Drop:
		c = &p.Stats.Dropped
	case retry.Requeue:
		c = &p.Stats.Requeued
	case retry.Retry:
		c = &p.Stats.Retried
	case retry.DLQ:
		c = &p.Stats.DeadLettered
	case retry.Return:
		c = &p.Stats.Returned
	}
	if c != nil {
		c.Add(1)
	}
	p.obs.Decided(out, called, dec, latency)
}
