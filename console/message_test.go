package console

import (
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
)

func TestRenderBody(t *testing.T) {
	for _, tc := range []struct {
		name      string
		body      []byte
		limit     int
		kind      string
		text      string
		truncated bool
	}{
		{"json", []byte(`{"a":[1,2],"b":"<script>"}`), 1024, "json", "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": \"<script>\"\n}", false},
		{"text", []byte("plain <b>text</b>\nline two"), 1024, "text", "plain <b>text</b>\nline two", false},
		{"binary", []byte{0x00, 0xff, 0x10}, 1024, "binary", "00000000  00 ff 10                                          |...|", false},
		{"long json shown as text, cut", []byte(`{"a":"` + strings.Repeat("x", 100) + `"}`), 10, "text", `{"a":"xxxx`, true},
		{"empty", nil, 1024, "text", "", false},
	} {
		got := renderBody(tc.body, tc.limit)
		if got.Kind != tc.kind || got.Text != tc.text || got.Truncated != tc.truncated || got.Size != len(tc.body) {
			t.Errorf("%s: %+v, want kind %s text %q truncated %v", tc.name, got, tc.kind, tc.text, tc.truncated)
		}
	}
}

func TestTraceLink(t *testing.T) {
	tmpl := "http://jaeger:16686/trace/{traceId}"
	if got := TraceLink(tmpl, "4bf92f3577b34da6"); got != "http://jaeger:16686/trace/4bf92f3577b34da6" {
		t.Errorf("link = %s", got)
	}
	// An id cannot leave its path segment.
	if got := TraceLink(tmpl, `x/../../evil?a=<b>"`); got != "http://jaeger:16686/trace/x%2F..%2F..%2Fevil%3Fa=%3Cb%3E%22" {
		t.Errorf("hostile id link = %s", got)
	}
	for _, bad := range []string{"http://jaeger:16686/trace/", "javascript:alert('{traceId}')", "//jaeger/{traceId}", "ftp://x/{traceId}"} {
		if CheckTraceURL(bad) == nil {
			t.Errorf("trace URL %q accepted", bad)
		}
	}
	if err := CheckTraceURL(tmpl); err != nil {
		t.Error(err)
	}
}

func TestHistoryAndHeaders(t *testing.T) {
	at := t0.Add(-90 * time.Minute)
	m := dead("m1", "orders", "order.created", "max-attempts", 503, "upstream answered 503", at)
	m.Headers[msg.HeaderRequeueCount] = int32(2)
	m.Headers[msg.HeaderReplayCount] = int32(1)
	m.Headers[msg.HeaderReplayedFrom] = "orders.dlq"
	s := &Server{o: Options{Now: func() time.Time { return t0 }, MaxBody: 1024}, queues: map[string]*queueState{}}
	v := s.describe("orders.dlq", m)
	h := map[string]string{}
	for _, f := range v.History {
		h[f.Name] = f.Value
	}
	for name, want := range map[string]string{
		"original queue":     "orders",
		"first published to": "the default exchange with routing key order.created",
		"failed attempts":    "3",
		"requeues (425)":     "2",
		"final status":       "503 (int64)",
		"final error":        "upstream answered 503",
		"dead-letter reason": "max-attempts",
		"dead-lettered":      at.UTC().Format(time.RFC3339) + " (1h30m0s ago)",
		"replayed before":    "1 time(s), last from orders.dlq at —",
	} {
		if h[name] != want {
			t.Errorf("history %s = %q, want %q", name, h[name], want)
		}
	}
	about := map[string]string{}
	for _, f := range v.Headers {
		about[f.Name] = f.About
	}
	for _, name := range []string{msg.HeaderFinalError, msg.HeaderDeadLetterReason, msg.HeaderOriginalQueue, msg.HeaderRetryCount} {
		if about[name] == "" {
			t.Errorf("header %s not explained", name)
		}
	}
}
