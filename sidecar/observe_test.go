package sidecar_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/sidecar"
)

// scrape fetches /metrics and parses the Prometheus text format.
func scrape(t *testing.T, addr string) map[string][]*dtoMetric {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics is not valid Prometheus text: %v", err)
	}
	out := map[string][]*dtoMetric{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			dm := &dtoMetric{labels: map[string]string{}}
			for _, l := range m.GetLabel() {
				dm.labels[l.GetName()] = l.GetValue()
			}
			switch {
			case m.Counter != nil:
				dm.value = m.Counter.GetValue()
			case m.Gauge != nil:
				dm.value = m.Gauge.GetValue()
			case m.Histogram != nil:
				dm.value = float64(m.Histogram.GetSampleCount())
			}
			out[name] = append(out[name], dm)
		}
	}
	return out
}

type dtoMetric struct {
	labels map[string]string
	value  float64
}

func metricValue(ms map[string][]*dtoMetric, name string, labels map[string]string) float64 {
	var sum float64
	for _, m := range ms[name] {
		ok := true
		for k, v := range labels {
			if m.labels[k] != v {
				ok = false
			}
		}
		if ok {
			sum += m.value
		}
	}
	return sum
}

// TestMetricsEveryOutcome scrapes /metrics after a run with every outcome
// and checks each counter against what happened.
func TestMetricsEveryOutcome(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	cfg.Admin.Listen = "127.0.0.1:0"
	r := start(t, cfg)
	app.script("ok", 200)
	app.script("early", 425, 200)
	app.script("retry", 503, 200)
	app.script("bad", 400)
	app.script("dead", 500)
	for _, id := range []string{"ok", "early", "retry", "bad", "dead"} {
		r.publish(id)
	}
	r.publish("hdr", withHeader("nested", map[string]any{"a": "b"}))
	r.publish("long", withHeader("big", strings.Repeat("x", 5000)))
	r.settled(2)
	ms := scrape(t, r.sc.AdminAddr())
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"hopper_deliveries_total", map[string]string{"outcome": "ack", "status_class": "2xx"}, 5},
		{"hopper_deliveries_total", map[string]string{"outcome": "requeue", "status_class": "4xx"}, 1},
		{"hopper_deliveries_total", map[string]string{"outcome": "retry", "status_class": "5xx"}, 3},
		{"hopper_deliveries_total", map[string]string{"outcome": "dlq", "status_class": "4xx"}, 1},
		{"hopper_deliveries_total", map[string]string{"outcome": "dlq", "status_class": "5xx"}, 1},
		{"hopper_retries_total", map[string]string{"tier": "200ms"}, 2},
		{"hopper_retries_total", map[string]string{"tier": "400ms"}, 1},
		{"hopper_dead_lettered_total", map[string]string{"reason": "non-retriable"}, 1},
		{"hopper_dead_lettered_total", map[string]string{"reason": "max-attempts"}, 1},
		{"hopper_requeues_total", nil, 1},
		{"hopper_delivery_duration_seconds", nil, 11},
		{"hopper_in_flight", nil, 0},
		{"hopper_broker_connected", nil, 1},
		{"hopper_consumer_paused", nil, 0},
		{"hopper_breaker_state", map[string]string{"state": "closed"}, 1},
		{"hopper_header_values_dropped_total", nil, 1},
		{"hopper_headers_omitted_total", map[string]string{"reason": "value-too-long"}, 1},
		{"hopper_headers_omitted_total", map[string]string{"reason": "max-headers"}, 0},
		{"hopper_headers_omitted_total", map[string]string{"reason": "max-header-bytes"}, 0},
	}
	for _, c := range checks {
		if got := metricValue(ms, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	for name := range ms {
		if strings.HasPrefix(name, "hopper_") {
			for _, m := range ms[name] {
				for k := range m.labels {
					if k == "message_id" || k == "routing_key" {
						t.Errorf("%s has unbounded label %s", name, k)
					}
				}
			}
		}
	}
	if err := r.shutdown(); err != nil {
		t.Fatal(err)
	}
}

// TestTraceEveryAttemptInOneTrace: a message published with a traceparent
// that fails twice and then succeeds yields, in one trace: three CONSUMER
// spans (attempts 1-3, decisions retry, retry, ack), a CLIENT span under
// each, and a PRODUCER span for each of the two retry moves; the app
// receives a traceparent of that trace.
func TestTraceEveryAttemptInOneTrace(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	r := startWith(t, cfg, func(s *sidecar.Sidecar) { s.TracerProvider = tp })

	// The publisher's span.
	pubCtx, pubSpan := tp.Tracer("test").Start(context.Background(), "publish", trace.WithSpanKind(trace.SpanKindProducer))
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(pubCtx, carrier)
	pubSpan.End()
	traceID := pubSpan.SpanContext().TraceID()

	app.script("traced", 503, 503, 200)
	r.publish("traced", withHeader("traceparent", carrier["traceparent"]))
	r.settled(0)
	waitfor.Until(t, 5*time.Second, "spans ended", func() bool { return len(rec.Ended()) >= 9 })

	var consumers, clients, producers []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanContext().TraceID() != traceID {
			continue
		}
		switch s.SpanKind() {
		case trace.SpanKindConsumer:
			consumers = append(consumers, s)
		case trace.SpanKindClient:
			clients = append(clients, s)
		case trace.SpanKindProducer:
			if s.Name() != "publish" {
				producers = append(producers, s)
			}
		}
	}
	if len(consumers) != 3 || len(clients) != 3 || len(producers) != 2 {
		t.Fatalf("in trace %s: %d consumer, %d client, %d producer spans; want 3, 3, 2", traceID, len(consumers), len(clients), len(producers))
	}
	wantDecision := []string{"retry", "retry", "ack"}
	for i, s := range consumers {
		attrs := map[string]string{}
		for _, kv := range s.Attributes() {
			attrs[string(kv.Key)] = kv.Value.Emit()
		}
		if attrs["hopper.attempt"] != strconv.Itoa(i+1) || attrs["hopper.decision"] != wantDecision[i] ||
			attrs["messaging.system"] != "rabbitmq" || attrs["messaging.message.id"] != "traced" {
			t.Errorf("consumer span %d attributes %v", i, attrs)
		}
		// The messaging conventions: the destination is the exchange it was
		// published to (the default one here), the queue is the consumer's.
		for k, want := range map[string]string{
			"messaging.operation.type":                   "process",
			"messaging.operation.name":                   "process",
			"messaging.destination.name":                 "amq.default",
			"messaging.rabbitmq.destination.routing_key": r.cfg.Queue.Name,
			"messaging.consumer.group.name":              r.cfg.Queue.Name,
			"messaging.message.body.size":                strconv.Itoa(len("body-traced")),
			"server.address":                             "127.0.0.1",
		} {
			if attrs[k] != want {
				t.Errorf("consumer span %d: %s = %q, want %q", i, k, attrs[k], want)
			}
		}
		if attrs["messaging.rabbitmq.message.delivery_tag"] == "" || attrs["server.port"] == "" {
			t.Errorf("consumer span %d lacks the delivery tag or the broker's port: %v", i, attrs)
		}
		if wantErr := map[bool]string{true: "503", false: ""}[i < 2]; attrs["error.type"] != wantErr {
			t.Errorf("consumer span %d: error.type %q, want %q", i, attrs["error.type"], wantErr)
		}
	}
	for i, s := range producers {
		attrs := map[string]string{}
		for _, kv := range s.Attributes() {
			attrs[string(kv.Key)] = kv.Value.Emit()
		}
		if attrs["messaging.operation.type"] != "send" || !strings.HasPrefix(attrs["messaging.rabbitmq.destination.routing_key"], r.cfg.Queue.Name+".retry.") {
			t.Errorf("producer span %d attributes %v", i, attrs)
		}
	}
	for i, s := range clients {
		attrs := map[string]string{}
		for _, kv := range s.Attributes() {
			attrs[string(kv.Key)] = kv.Value.Emit()
		}
		if attrs["http.request.method"] != "POST" || attrs["server.address"] != "127.0.0.1" || attrs["server.port"] == "" || attrs["url.full"] != app.URL {
			t.Errorf("client span %d attributes %v", i, attrs)
		}
	}
	// Attempt 2 and 3 are children of the retry moves' producer spans.
	for i := 1; i < 3; i++ {
		if consumers[i].Parent().SpanID() != producers[i-1].SpanContext().SpanID() {
			t.Errorf("attempt %d is not a child of retry move %d", i+1, i)
		}
	}
	for _, c := range app.callsFor("traced") {
		if tp := c.Header.Get("Traceparent"); !strings.Contains(tp, traceID.String()) {
			t.Errorf("app got traceparent %q, not of trace %s", tp, traceID)
		}
	}
}
