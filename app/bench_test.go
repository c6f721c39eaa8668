package app_test

import (
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/app"
	"github.com/hopper-sidecar/hopper/msg"
)

// Benchmarks for the per-delivery header work (run with
// go test -run '^$' -bench . -benchmem ./app/).

// plainMessage is what the throughput benchmark sends: properties only.
func plainMessage() (*msg.Message, msg.Info) {
	return &msg.Message{
			RoutingKey:  "orders",
			MessageID:   "m-12345",
			ContentType: "application/octet-stream",
			Headers:     map[string]any{},
		}, msg.Info{
			Queue: "orders", RoutingKey: "orders", Attempt: 1,
		}
}

// retriedMessage is a message on its second attempt with trace context and
// a few application headers, as a typical production message looks.
func retriedMessage() (*msg.Message, msg.Info) {
	return &msg.Message{
			RoutingKey:    "orders",
			MessageID:     "5f0c7a4e-2b1d-4c1a-9b57-0d6f3f1e2a9c",
			CorrelationID: "c-981",
			Type:          "order.created",
			Timestamp:     time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC),
			ContentType:   "application/json",
			Headers: map[string]any{
				"traceparent":                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
				"tenant":                     "acme",
				"priority":                   int32(5),
				"amount":                     12.5,
				"gift":                       false,
				msg.HeaderRetryCount:         int32(1),
				msg.HeaderOriginalRoutingKey: "orders.eu.created",
				msg.HeaderOriginalExchange:   "shop",
				msg.HeaderFirstFailureTime:   "2026-03-04T05:06:08.123Z",
				msg.HeaderLastFailureTime:    "2026-03-04T05:06:08.123Z",
				msg.HeaderLastStatusCode:     int32(503),
				"x-death":                    []any{map[string]any{"count": int64(1)}},
			},
		}, msg.Info{
			Queue: "orders", Exchange: "shop", RoutingKey: "orders.eu.created", Attempt: 2,
		}
}

func BenchmarkBuildHeaders(b *testing.B) {
	for _, c := range []struct {
		name string
		mk   func() (*msg.Message, msg.Info)
	}{
		{"plain", plainMessage},
		{"retried", retriedMessage},
	} {
		b.Run(c.name, func(b *testing.B) {
			m, in := c.mk()
			dst := make([]app.Header, 0, 24)
			b.ReportAllocs()
			for b.Loop() {
				dst, _ = app.BuildHeaders(dst[:0], m, in)
			}
		})
		// What the delivery path does today: a new slice per message.
		b.Run(c.name+"/fresh-slice", func(b *testing.B) {
			m, in := c.mk()
			b.ReportAllocs()
			for b.Loop() {
				_, _ = app.BuildHeaders(make([]app.Header, 0, 24), m, in)
			}
		})
	}
}

func BenchmarkSanitizeValue(b *testing.B) {
	for _, c := range []struct{ name, v string }{
		{"clean-short", "5f0c7a4e-2b1d-4c1a-9b57-0d6f3f1e2a9c"},
		{"clean-4KiB", strings.Repeat("a", 4096)},
		{"control-chars", "line one\r\nline two\x00"},
		{"over-limit", strings.Repeat("é", 3000)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.v)))
			for b.Loop() {
				_ = app.SanitizeValue(c.v)
			}
		})
	}
}
