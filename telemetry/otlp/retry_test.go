package otlp

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

// The waits between tries grow from minBackoff to maxBackoff, each drawn
// from the upper half of its step, and two exporters refused alike do
// not wait alike.
func TestBackoffIsJitteredAndGrows(t *testing.T) {
	const refusals = 7
	run := func() []time.Duration {
		answers := make([]int, refusals)
		for i := range answers {
			answers[i] = http.StatusServiceUnavailable
		}
		col := &httpCollector{answers: answers}
		srv := httptest.NewServer(col)
		defer srv.Close()
		exp := New(mustConfig(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL + "/base"}))
		w := recordWaits(exp)
		if err := exp.ExportSpans(context.Background(), sampleSpans(t)); err != nil {
			t.Fatalf("export after %d refusals: %v", refusals, err)
		}
		return w.all()
	}
	first, second := run(), run()
	if len(first) != refusals || len(second) != refusals {
		t.Fatalf("waits = %v and %v, want %d each", first, second, refusals)
	}
	for _, got := range [][]time.Duration{first, second} {
		for i, d := range got {
			step := min(minBackoff<<i, maxBackoff)
			if d < step/2 || d > step+step/100 {
				t.Errorf("wait %d = %v, want within [%v, %v]", i, d, step/2, step)
			}
		}
	}
	if slices.Equal(first, second) {
		t.Errorf("two exporters waited exactly alike (%v): no jitter", first)
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		header string
		want   time.Duration
	}{
		{"", 0},
		{"0", 0},
		{"7", 7 * time.Second},
		{" 7 ", 7 * time.Second},
		{"-3", 0},
		{"soon", 0},
		{"1.5", 0},
		{"99999999999999999999", 0}, // not an int64: unreadable
		{"9999999999999", time.Duration(1<<63-1) / time.Second * time.Second},
		{"Sun, 01 Mar 2026 12:01:30 GMT", 90 * time.Second}, // IMF-fixdate
		{"Sunday, 01-Mar-26 12:00:05 GMT", 5 * time.Second}, // RFC 850
		{"Sun Mar  1 13:00:00 2026", time.Hour},             // asctime
		{"Sun, 01 Mar 2026 11:59:00 GMT", 0},                // already past
		{"Sun, 01 Mar 2026 12:01:30 +0100", 0},              // not an HTTP-date
	}
	for _, tc := range cases {
		if got := retryAfter(tc.header, now); got != tc.want {
			t.Errorf("retryAfter(%q) = %v, want %v", tc.header, got, tc.want)
		}
	}
}

// A Retry-After given as an HTTP-date is waited for; one past the
// export's deadline ends the export at once, naming the wait, instead of
// holding the batch until the deadline.
func TestHTTPRetryAfterDate(t *testing.T) {
	t.Run("waited", func(t *testing.T) {
		col := &httpCollector{answers: []int{http.StatusTooManyRequests},
			retryAfter: time.Now().Add(30 * time.Second).UTC().Format(http.TimeFormat)}
		srv := httptest.NewServer(col)
		defer srv.Close()
		exp := New(mustConfig(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL + "/base",
			"OTEL_EXPORTER_OTLP_TIMEOUT": "60000"}))
		w := recordWaits(exp)
		if err := exp.ExportSpans(context.Background(), sampleSpans(t)); err != nil {
			t.Fatal(err)
		}
		// The date has whole seconds: 29 to 30 s from when it was
		// written, less the time the answer took to come back.
		if got := w.all(); len(got) != 1 || got[0] <= 15*time.Second || got[0] > 30*time.Second {
			t.Errorf("waits = %v, want one of 15-30s (the date's)", got)
		}
	})
	t.Run("past the deadline", func(t *testing.T) {
		col := &httpCollector{answers: []int{http.StatusServiceUnavailable},
			retryAfter: time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)}
		srv := httptest.NewServer(col)
		defer srv.Close()
		exp := New(mustConfig(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL + "/base",
			"OTEL_EXPORTER_OTLP_TIMEOUT": "3000"}))
		err := exp.ExportSpans(context.Background(), sampleSpans(t))
		if err == nil || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "asked to wait") {
			t.Fatalf("want an at-once failure naming the wait, got %v", err)
		}
		if len(col.requests) != 1 {
			t.Errorf("requests = %d, want 1", len(col.requests))
		}
	})
}

// RESOURCE_EXHAUSTED is retried only when its status carries RetryInfo,
// after the delay given; the other retryable codes are retried either
// way, after RetryInfo's delay when there is one.
func TestGRPCRetryInfo(t *testing.T) {
	cases := []struct {
		name     string
		code     codes.Code
		delay    time.Duration
		retried  bool
		minWait  time.Duration
		maxWait  time.Duration
		errorHas string
	}{
		{name: "resource exhausted without RetryInfo", code: codes.ResourceExhausted,
			errorHas: "not retried: no RetryInfo"},
		{name: "resource exhausted with RetryInfo", code: codes.ResourceExhausted, delay: 1500 * time.Millisecond,
			retried: true, minWait: 1500 * time.Millisecond, maxWait: 1500 * time.Millisecond},
		{name: "unavailable with RetryInfo", code: codes.Unavailable, delay: 3 * time.Second,
			retried: true, minWait: 3 * time.Second, maxWait: 3 * time.Second},
		{name: "unavailable without RetryInfo", code: codes.Unavailable,
			retried: true, minWait: minBackoff / 2, maxWait: minBackoff},
		{name: "aborted", code: codes.Aborted, retried: true, minWait: minBackoff / 2, maxWait: minBackoff},
		{name: "data loss", code: codes.DataLoss, retried: true, minWait: minBackoff / 2, maxWait: minBackoff},
		{name: "permission denied with RetryInfo", code: codes.PermissionDenied, delay: time.Second,
			errorHas: "status 7"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			col := &grpcCollector{fail: []codes.Code{tc.code}, retryDelay: tc.delay}
			addr := startGRPC(t, col)
			exp := New(mustConfig(t, map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
				"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + addr}))
			w := recordWaits(exp)
			err := exp.ExportSpans(context.Background(), sampleSpans(t))
			col.mu.Lock()
			n := len(col.requests)
			col.mu.Unlock()
			if !tc.retried {
				if err == nil || !strings.Contains(err.Error(), tc.errorHas) || n != 1 {
					t.Fatalf("want one request and an error with %q, got %d requests and %v", tc.errorHas, n, err)
				}
				return
			}
			if err != nil || n != 2 {
				t.Fatalf("want a retried export, got %d requests and %v", n, err)
			}
			if got := w.all(); len(got) != 1 || got[0] < tc.minWait || got[0] > tc.maxWait {
				t.Errorf("waits = %v, want one within [%v, %v]", got, tc.minWait, tc.maxWait)
			}
		})
	}
}

// A RetryInfo delay beyond the export's deadline ends the export at once.
func TestGRPCRetryInfoPastDeadline(t *testing.T) {
	col := &grpcCollector{fail: []codes.Code{codes.ResourceExhausted}, retryDelay: time.Hour}
	addr := startGRPC(t, col)
	exp := New(mustConfig(t, map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + addr}))
	w := recordWaits(exp)
	err := exp.ExportSpans(context.Background(), sampleSpans(t))
	if err == nil || !strings.Contains(err.Error(), "asked to wait 1h0m0s") {
		t.Fatalf("want an at-once failure naming the wait, got %v", err)
	}
	if got := w.all(); len(got) != 0 {
		t.Errorf("waits = %v, want none", got)
	}
}

func TestRetryInfoDecoding(t *testing.T) {
	cases := []struct {
		name  string
		bin   string
		delay time.Duration
		ok    bool
	}{
		{name: "absent"},
		{name: "not base64", bin: "!!!"},
		// google.rpc.Status{code: 8, details: [Any{type_url: ".../google.rpc.RetryInfo",
		// value: RetryInfo{retry_delay: {seconds: 2, nanos: 500000000}}}]}, padded and not.
		{name: "padded", bin: "CAgaNgoodHlwZS5nb29nbGVhcGlzLmNvbS9nb29nbGUucnBjLlJldHJ5SW5mbxIKCggIAhCAyrXuAQ==",
			delay: 2500 * time.Millisecond, ok: true},
		{name: "unpadded", bin: "CAgaNgoodHlwZS5nb29nbGVhcGlzLmNvbS9nb29nbGUucnBjLlJldHJ5SW5mbxIKCggIAhCAyrXuAQ",
			delay: 2500 * time.Millisecond, ok: true},
		// The same with a google.rpc.ErrorInfo detail instead: no RetryInfo.
		{name: "other detail", bin: "CAgaKgoodHlwZS5nb29nbGVhcGlzLmNvbS9nb29nbGUucnBjLkVycm9ySW5mbw"},
	}
	for _, tc := range cases {
		d, ok := retryInfo(tc.bin)
		if d != tc.delay || ok != tc.ok {
			t.Errorf("%s: retryInfo = %v, %v; want %v, %v", tc.name, d, ok, tc.delay, tc.ok)
		}
	}
}
