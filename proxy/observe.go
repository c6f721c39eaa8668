package proxy

import (
	"context"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

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
}

type nopObserver struct{}

func (nopObserver) Decided(retry.Outcome, bool, retry.Decision, time.Duration) {}
func (nopObserver) MoveFailed(string)                                          {}
func (nopObserver) InFlight(int)                                               {}

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

// Span attribute keys (OpenTelemetry messaging semantic conventions plus
// Hopper's own).
var (
	attrSystem      = attribute.String("messaging.system", "rabbitmq")
	keyDestination  = attribute.Key("messaging.destination.name")
	keyRoutingKey   = attribute.Key("messaging.rabbitmq.destination.routing_key")
	keyMessageID    = attribute.Key("messaging.message.id")
	keyConversation = attribute.Key("messaging.message.conversation_id")
	keyOperation    = attribute.Key("messaging.operation.type")
	keyAttempt      = attribute.Key("hopper.attempt")
	keyDecision     = attribute.Key("hopper.decision")
	keyReason       = attribute.Key("hopper.reason")
	keyStatus       = attribute.Key("http.response.status_code")
)

// startProducer opens the PRODUCER span of a move and writes its context
// into the copy's headers, so the next attempt's span joins the same trace.
func startProducer(ctx context.Context, tr trace.Tracer, queue, why string, headers map[string]any) (context.Context, trace.Span) {
	ctx, span := tr.Start(ctx, "send "+queue, trace.WithSpanKind(trace.SpanKindProducer))
	if span.IsRecording() {
		span.SetAttributes(attrSystem, keyDestination.String(queue), keyOperation.String("send"),
			attribute.String("hopper.move", why))
	}
	propagator.Inject(ctx, headerCarrier(headers))
	return ctx, span
}

func statusAttr(o retry.Outcome) attribute.KeyValue {
	return keyStatus.Int(o.Status)
}

func itoa(n int) string { return strconv.Itoa(n) }
