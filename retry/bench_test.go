package retry_test

import (
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/retry"
)

// Benchmarks for the per-delivery decision (run with
// go test -run '^$' -bench . -benchmem ./retry/).

func benchPolicy() *retry.Policy {
	return &retry.Policy{
		Name:          "default",
		MaxAttempts:   10,
		Tiers:         []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute, 10 * time.Minute, 30 * time.Minute},
		Table:         retry.DefaultTable(),
		ExpiredAction: retry.DLQ,
		MaxRequeues:   100,
		MaxHold:       5 * time.Second,
		MinHold:       time.Second,
	}
}

func BenchmarkDecide(b *testing.B) {
	p := benchPolicy()
	now := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	rnd := func() float64 { return 0.5 }
	for _, c := range []struct {
		name string
		st   retry.State
		o    retry.Outcome
	}{
		{"2xx-ack", retry.State{}, retry.Outcome{Kind: retry.Response, Status: 200}},
		{"503-retry", retry.State{Retries: 1}, retry.Outcome{Kind: retry.Response, Status: 503}},
		{"400-dlq", retry.State{}, retry.Outcome{Kind: retry.Response, Status: 400}},
		{"425-requeue", retry.State{}, retry.Outcome{Kind: retry.Response, Status: 425}},
		{"override-dlq", retry.State{}, retry.Outcome{Kind: retry.Response, Status: 200, Override: "dlq"}},
		{"timeout-deadline", retry.State{Deadline: now.Add(time.Minute)}, retry.Outcome{Kind: retry.Timeout}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = retry.Decide(p, c.st, c.o, now, rnd)
			}
		})
	}
}

func BenchmarkTableLookup(b *testing.B) {
	t := retry.DefaultTable()
	for _, c := range []struct {
		name string
		o    retry.Outcome
	}{
		{"200-class", retry.Outcome{Kind: retry.Response, Status: 200}},
		{"425-exact", retry.Outcome{Kind: retry.Response, Status: 425}},
		{"503-class", retry.Outcome{Kind: retry.Response, Status: 503}},
		{"timeout", retry.Outcome{Kind: retry.Timeout}},
		{"unavailable", retry.Outcome{Kind: retry.Unavailable}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = t.Lookup(c.o)
			}
		})
	}
}

func BenchmarkTopicMatch(b *testing.B) {
	for _, c := range []struct{ name, pattern, key string }{
		{"exact", "orders.created", "orders.created"},
		{"star", "orders.*.created", "orders.eu.created"},
		{"hash-tail", "game.reminder.#", "game.reminder.a.b.c"},
		{"hash-middle", "#.created", "orders.eu.west.created"},
		{"miss", "orders.*.created", "payments.eu.settled"},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = retry.TopicMatch(c.pattern, c.key)
			}
		})
	}
}
