package config_test

import (
	"testing"

	"github.com/hopper-sidecar/hopper/config"
)

func TestConcurrency(t *testing.T) {
	cases := []struct {
		name              string
		set               func(c *config.Config)
		prefetch, workers int
		follow            bool
	}{
		{"defaults follow the limit", func(*config.Config) {}, 2 * config.AutoInitial, config.AutoWorkers, true},
		{"workers set, prefetch follows", func(c *config.Config) { c.Consumer.Workers = 8 }, config.MinFollowPrefetch, 8, true},
		{"prefetch fixes it", func(c *config.Config) { c.Consumer.Prefetch = 50 }, 50, 50, false},
		{"prefetch and workers", func(c *config.Config) { c.Consumer.Prefetch, c.Consumer.Workers = 200, 64 }, 200, 64, false},
		{"no limiter", func(c *config.Config) { c.Limiter.Enabled = false }, 2 * config.FixedWorkers, config.FixedWorkers, false},
		{"ordered", func(c *config.Config) { c.Consumer.Ordered = true; c.Consumer.Prefetch = 50 }, 1, 1, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := config.Default()
			tc.set(&c)
			p, w, f := c.Concurrency()
			if p != tc.prefetch || w != tc.workers || f != tc.follow {
				t.Errorf("Concurrency() = %d, %d, %v; want %d, %d, %v", p, w, f, tc.prefetch, tc.workers, tc.follow)
			}
		})
	}
}

func TestFollowPrefetch(t *testing.T) {
	cases := []struct{ limit, workers, want int }{
		{1, 256, config.MinFollowPrefetch}, // a limit cut to 1 still keeps a few buffered
		{32, 256, 64},
		{200, 256, 400},
		{256, 256, 512}, // at the ceiling
		{300, 256, 512}, // a shared limit above this queue's workers
		{5, 4, config.MinFollowPrefetch},
	}
	for _, c := range cases {
		if got := config.FollowPrefetch(c.limit, c.workers); got != c.want {
			t.Errorf("FollowPrefetch(%d, %d) = %d, want %d", c.limit, c.workers, got, c.want)
		}
	}
}

func TestCapPrefetch(t *testing.T) {
	cases := []struct {
		want, budget int
		avg          float64
		got          int
	}{
		{128, 64 << 20, 256, 128},     // small messages: the limit rules
		{128, 64 << 20, 1 << 20, 64},  // 1 MiB messages: 64 fit
		{128, 64 << 20, 100 << 20, 1}, // larger than the budget: still one
		{128, 0, 1 << 20, 128},        // no budget
		{128, 64 << 20, 0, 128},       // nothing seen yet
		{40, 1 << 20, 32 << 10, 32},   // 1 MiB / 32 KiB
		{20, 1 << 20, 32 << 10, 20},   // under the cap
	}
	for _, c := range cases {
		if got := config.CapPrefetch(c.want, c.budget, c.avg); got != c.got {
			t.Errorf("CapPrefetch(%d, %d, %g) = %d, want %d", c.want, c.budget, c.avg, got, c.got)
		}
	}
}

func TestMemoryLimit(t *testing.T) {
	ptr := func(n int) *int { return &n }
	cases := []struct {
		name  string
		set   func(c *config.Config)
		limit int64
		ok    bool
	}{
		{"defaults: the budget plus headroom", func(*config.Config) {}, config.DefaultPrefetchBytes + config.MemoryHeadroom, true},
		{"a budget of its own", func(c *config.Config) { c.Consumer.PrefetchBytes = 8 << 20 }, 8<<20 + config.MemoryHeadroom, true},
		{"no budget, no limit", func(c *config.Config) { c.Consumer.PrefetchBytes = 0 }, 0, false},
		{"fixed prefetch, no limit", func(c *config.Config) { c.Consumer.Prefetch = 50 }, 0, false},
		{"budgets of every subscription add up", func(c *config.Config) {
			c.Subscriptions = []config.Subscription{
				{Queue: config.Queue{Name: "a"}},
				{Queue: config.Queue{Name: "b"}, Consumer: config.SubscriptionConsumer{PrefetchBytes: ptr(1 << 20)}},
			}
		}, config.DefaultPrefetchBytes + 1<<20 + config.MemoryHeadroom, true},
		{"one subscription unbounded, no limit", func(c *config.Config) {
			c.Subscriptions = []config.Subscription{
				{Queue: config.Queue{Name: "a"}},
				{Queue: config.Queue{Name: "b"}, Consumer: config.SubscriptionConsumer{Prefetch: ptr(100)}},
			}
		}, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := config.Default()
			c.Queue.Name = "q"
			tc.set(&c)
			limit, ok := c.MemoryLimit()
			if limit != tc.limit && tc.ok || ok != tc.ok {
				t.Errorf("MemoryLimit() = %d, %v; want %d, %v", limit, ok, tc.limit, tc.ok)
			}
		})
	}
}
