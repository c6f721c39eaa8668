package app

import (
	"strconv"

	"go.opentelemetry.io/otel/propagation"
)

// propagator writes W3C trace context into requests. It is used directly
// (not the global one) so that, with tracing off, an incoming traceparent
// still reaches the app unchanged.
var propagator = propagation.TraceContext{}

func itoa(n int) string { return strconv.Itoa(n) }
