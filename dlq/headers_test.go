package dlq

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

func TestMarkSetsEveryHeader(t *testing.T) {
	now := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	first := now.Add(-time.Hour)
	m := &msg.Message{Headers: map[string]any{"x-death": []any{"history"}, "keep": "me"}}
	Mark(m, Info{
		Queue: "orders", Exchange: "shop", RoutingKey: "order.created", Status: 503,
		Error: strings.Repeat("é", 400), Retries: 10, Reason: retry.ReasonMaxAttempts,
		TraceID: "abc", FirstFailure: first, Now: now,
	})
	want := map[string]any{
		"x-original-queue":       "orders",
		"x-original-exchange":    "shop",
		"x-original-routing-key": "order.created",
		"x-final-status-code":    int32(503),
		"x-final-retry-count":    int32(10),
		"x-first-failure-time":   "2026-03-04T04:06:07Z",
		"x-last-failure-time":    "2026-03-04T05:06:07Z",
		"x-dead-letter-reason":   "max-attempts",
		"x-trace-id":             "abc",
		"keep":                   "me",
	}
	for k, v := range want {
		if m.Headers[k] != v {
			t.Errorf("%s = %#v, want %#v", k, m.Headers[k], v)
		}
	}
	if _, ok := m.Headers["x-death"]; !ok {
		t.Error("x-death history must be kept")
	}
	e := m.Headers["x-final-error"].(string)
	if len(e) > MaxErrorLen+len("…") || !utf8.ValidString(e) {
		t.Errorf("x-final-error not truncated to valid UTF-8: %d bytes", len(e))
	}
}

func TestMarkFirstFailureDefaultsToNow(t *testing.T) {
	now := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	m := &msg.Message{Headers: map[string]any{}}
	Mark(m, Info{Reason: retry.ReasonNonRetriable, Status: 400, Now: now})
	if m.Headers["x-first-failure-time"] != "2026-03-04T05:06:07Z" {
		t.Fatalf("got %v", m.Headers["x-first-failure-time"])
	}
	if _, ok := m.Headers["x-trace-id"]; ok {
		t.Fatal("no trace id given, none expected")
	}
}
