package telemetry

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/hopper-sidecar/hopper/retry"
)

// gather scrapes the handler and reads the answer with Prometheus's own
// text parser, so every test here also checks the exposition.
func gather(t *testing.T, m *Metrics) map[string][]*dto.Metric {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if ct := rec.Header().Get("Content-Type"); ct != "text/plain; version=0.0.4; charset=utf-8" {
		t.Errorf("content type %q", ct)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("/metrics is not valid Prometheus text: %v", err)
	}
	out := map[string][]*dto.Metric{}
	for name, f := range fams {
		out[name] = f.GetMetric()
	}
	return out
}

func value(ms []*dto.Metric, labels map[string]string) (float64, bool) {
	for _, m := range ms {
		match := true
		for k, v := range labels {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			match = match && found
		}
		if !match {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue(), true
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue(), true
		case m.GetHistogram() != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

// Each decision lands in its counters once, with its status class; the
// latency is observed only for deliveries that reached the app.
func TestDecidedCounts(t *testing.T) {
	m := NewMetrics(Sources{})
	resp := func(code int) retry.Outcome { return retry.Outcome{Kind: retry.Response, Status: code} }
	m.Decided(resp(200), true, retry.Decision{Action: retry.Ack}, time.Millisecond)
	m.Decided(resp(503), true, retry.Decision{Action: retry.Retry, Tier: time.Second}, time.Millisecond)
	m.Decided(resp(400), true, retry.Decision{Action: retry.DLQ, Reason: retry.ReasonNonRetriable}, time.Millisecond)
	m.Decided(retry.Outcome{Kind: retry.Unavailable, Refused: true}, false, retry.Decision{Action: retry.Return}, 0)
	m.Decided(retry.Outcome{}, false, retry.Decision{Action: retry.DLQ, Reason: retry.ReasonExpired}, 0)
	m.Decided(resp(425), true, retry.Decision{Action: retry.Requeue}, time.Millisecond)
	m.MoveFailed("dlq")
	got := gather(t, m)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"hopper_deliveries_total", map[string]string{"outcome": "ack", "status_class": "2xx"}, 1},
		{"hopper_deliveries_total", map[string]string{"outcome": "retry", "status_class": "5xx"}, 1},
		{"hopper_deliveries_total", map[string]string{"outcome": "dlq", "status_class": "4xx"}, 1},
		{"hopper_deliveries_total", map[string]string{"outcome": "return", "status_class": "refused"}, 1},
		{"hopper_deliveries_total", map[string]string{"outcome": "dlq", "status_class": "expired"}, 1},
		{"hopper_dead_lettered_total", map[string]string{"reason": "non-retriable"}, 1},
		{"hopper_dead_lettered_total", map[string]string{"reason": "expired"}, 1},
		{"hopper_requeues_total", nil, 1},
		{"hopper_returns_total", nil, 1},
		{"hopper_moves_failed_total", map[string]string{"move": "dlq"}, 1},
		{"hopper_delivery_duration_seconds", nil, 4}, // the app was called 4 times
	} {
		v, ok := value(got[c.name], c.labels)
		if !ok || v != c.want {
			t.Errorf("%s%v = %v (found %v), want %v", c.name, c.labels, v, ok, c.want)
		}
	}
	if n, _ := value(got["hopper_retries_total"], nil); n != 1 {
		t.Errorf("hopper_retries_total = %v, want 1", n)
	}
}

// The breaker gauge has exactly one state at 1; opens are counted.
func TestBreakerGauge(t *testing.T) {
	m := NewMetrics(Sources{})
	m.SetBreaker("open")
	m.BreakerOpened()
	got := gather(t, m)
	for state, want := range map[string]float64{"open": 1, "closed": 0, "half-open": 0} {
		if v, _ := value(got["hopper_breaker_state"], map[string]string{"state": state}); v != want {
			t.Errorf("breaker state %s = %v, want %v", state, v, want)
		}
	}
	if v, _ := value(got["hopper_breaker_opens_total"], nil); v != 1 {
		t.Errorf("opens = %v", v)
	}
}

// Gauges read from their sources at scrape time.
func TestSources(t *testing.T) {
	limit, failing := int64(7), int64(2)
	m := NewMetrics(Sources{
		Connected:        func() bool { return true },
		Paused:           func() bool { return false },
		ConcurrencyLimit: func() int64 { return limit },
		MovesFailing:     func() int64 { return failing },
	})
	got := gather(t, m)
	for name, want := range map[string]float64{
		"hopper_broker_connected": 1, "hopper_consumer_paused": 0,
		"hopper_concurrency_limit": 7, "hopper_moves_failing": 2,
	} {
		if v, ok := value(got[name], nil); !ok || v != want {
			t.Errorf("%s = %v (found %v), want %v", name, v, ok, want)
		}
	}
}

// The headers the forwarding bounds left out are read at each scrape, one
// series per reason, every reason present while still 0.
func TestHeadersOmitted(t *testing.T) {
	omitted := map[string]int64{"value-too-long": 0, "max-headers": 0, "max-header-bytes": 0}
	m := NewMetrics(Sources{HeadersOmitted: func() map[string]int64 { return omitted }})
	got := gather(t, m)
	for r := range omitted {
		if v, ok := value(got["hopper_headers_omitted_total"], map[string]string{"reason": r}); !ok || v != 0 {
			t.Errorf("reason %s = %v (found %v), want 0 from the start", r, v, ok)
		}
	}
	omitted = map[string]int64{"value-too-long": 2, "max-headers": 427, "max-header-bytes": 5}
	got = gather(t, m)
	for r, want := range omitted {
		if v, _ := value(got["hopper_headers_omitted_total"], map[string]string{"reason": r}); v != float64(want) {
			t.Errorf("reason %s = %v, want %d", r, v, want)
		}
	}
	if v, ok := m.Value("hopper_headers_omitted_total", map[string]string{"reason": "max-headers"}); !ok || v != 427 {
		t.Errorf("Value(max-headers) = %v, %v", v, ok)
	}
}

// Without an endpoint tracing is off and a no-op.
func TestTracingOffWithoutEndpoint(t *testing.T) {
	tr, err := TracingFromEnv(context.Background(), func(string) string { return "" }, "test")
	if err != nil {
		t.Fatal(err)
	}
	if tr.Enabled {
		t.Fatal("tracing enabled without an endpoint")
	}
	off, err := TracingFromEnv(context.Background(), func(k string) string {
		return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"}[k]
	}, "test")
	if err != nil || off.Enabled {
		t.Fatalf("OTEL_SDK_DISABLED=true: enabled %v, err %v", off.Enabled, err)
	}
}

// Every series an alert rates exists at 0 from the first scrape, tiers are
// labelled as in their queue names, and the build is identified.
func TestSeriesExistFromTheStart(t *testing.T) {
	m := NewMetrics(Sources{Version: "v9.9.9", Tiers: []time.Duration{time.Second, 2 * time.Minute}})
	got := gather(t, m)
	for _, c := range []struct {
		name   string
		labels map[string]string
	}{
		{"hopper_build_info", map[string]string{"version": "v9.9.9"}},
		{"hopper_retries_total", map[string]string{"tier": "2m"}},
		{"hopper_retries_total", map[string]string{"tier": "1s"}},
		{"hopper_dead_lettered_total", map[string]string{"reason": "app-crash"}},
		{"hopper_deliveries_total", map[string]string{"outcome": "dlq", "status_class": "5xx"}},
		{"hopper_moves_failed_total", map[string]string{"move": "dlq"}},
		{"hopper_delivery_duration_seconds", nil},
		{"hopper_in_flight", nil},
	} {
		if _, ok := value(got[c.name], c.labels); !ok {
			t.Errorf("no series %s%v at start", c.name, c.labels)
		}
	}
	if v, _ := value(got["hopper_build_info"], nil); v != 1 {
		t.Errorf("hopper_build_info = %v", v)
	}
}
