package config_test

import (
	"fmt"
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
		{"defaults follow the limit", func(*config.Config) {}, 2*config.AutoInitial + config.AckBatch, config.AutoWorkers, true},
		{"workers set, prefetch follows", func(c *config.Config) { c.Consumer.Workers = 8 }, 32, 8, true},
		{"prefetch fixes it", func(c *config.Config) { c.Consumer.Prefetch = 50 }, 50, 50, false},
		{"prefetch and workers", func(c *config.Config) { c.Consumer.Prefetch, c.Consumer.Workers = 200, 64 }, 200, 64, false},
		{"no limiter", func(c *config.Config) { c.Limiter.Enabled = false }, 2 * config.FixedWorkers, config.FixedWorkers, false},
		{"ordered", func(c *config.Config) { c.Consumer.Ordered = true; c.Consumer.Prefetch = 50 }, 1, 1, false},
		{"single active consumer never follows", func(c *config.Config) { yes := true; c.Queue.SingleActiveConsumer = &yes },
			2 * config.FixedWorkers, config.FixedWorkers, false},
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
		{8, 256, 32},                       // twice the limit, and as much again for held acks
		{32, 256, 128},
		{50, 256, 164}, // held acks: at most AckBatch
		{200, 256, 464},
		{256, 256, 576}, // at the ceiling
		{300, 256, 576}, // a shared limit above this queue's workers
		{5, 4, config.MinFollowPrefetch},
	}
	for _, c := range cases {
		if got := config.FollowPrefetch(c.limit, c.workers); got != c.want {
			t.Errorf("FollowPrefetch(%d, %d) = %d, want %d", c.limit, c.workers, got, c.want)
		}
	}
}

func TestFitPrefetchBytes(t *testing.T) {
	const mib = 1 << 20
	ptr := func(n int) *int { return &n }
	cases := []struct {
		name      string
		set       func(c *config.Config)
		container int64
		share     int
		lowered   bool
		budgets   []int // each queue's consumer.prefetchBytes afterwards
	}{
		{"the chart's 128Mi", func(*config.Config) {}, 128 * mib, 24 * mib, true, []int{24 * mib}},
		{"64Mi", func(*config.Config) {}, 64 * mib, 8 * mib, true, []int{8 * mib}},
		{"below the reserve: one byte, one message at a time", func(*config.Config) {}, 16 * mib, 1, true, []int{1}},
		{"a large container keeps the default", func(*config.Config) {}, 1024 * mib, 248 * mib, false, []int{config.DefaultPrefetchBytes}},
		{"an operator's smaller budget stands", func(c *config.Config) { c.Consumer.PrefetchBytes = 4 * mib }, 128 * mib, 24 * mib, false, []int{4 * mib}},
		{"no container limit", func(*config.Config) {}, 0, 0, false, []int{config.DefaultPrefetchBytes}},
		{"0 bounds nothing, and stays", func(c *config.Config) { c.Consumer.PrefetchBytes = 0 }, 128 * mib, 0, false, []int{0}},
		{"a fixed prefetch stays", func(c *config.Config) { c.Consumer.Prefetch = 50 }, 128 * mib, 0, false, []int{config.DefaultPrefetchBytes}},
		{"following queues share the budget", func(c *config.Config) {
			c.Queue.Name = ""
			c.Subscriptions = []config.Subscription{
				{Queue: config.Queue{Name: "a"}},
				{Queue: config.Queue{Name: "b"}, Consumer: config.SubscriptionConsumer{PrefetchBytes: ptr(64 * mib)}},
				{Queue: config.Queue{Name: "c"}, Consumer: config.SubscriptionConsumer{PrefetchBytes: ptr(1 * mib)}},
				{Queue: config.Queue{Name: "d"}, Consumer: config.SubscriptionConsumer{Prefetch: ptr(10)}},
			}
		}, 224 * mib, 16 * mib, true, []int{16 * mib, 16 * mib, 1 * mib, 16 * mib}}, // d inherits the top level's, unused by its fixed prefetch
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := config.Default()
			c.Queue.Name = "q"
			tc.set(&c)
			share, lowered := c.FitPrefetchBytes(tc.container)
			if share != tc.share || lowered != tc.lowered {
				t.Errorf("FitPrefetchBytes(%d) = %d, %v; want %d, %v", tc.container, share, lowered, tc.share, tc.lowered)
			}
			var got []int
			for _, sc := range c.SubscriptionConfigs() {
				got = append(got, sc.Consumer.PrefetchBytes)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.budgets) {
				t.Errorf("budgets afterwards %v, want %v", got, tc.budgets)
			}
			if err := c.Validate(); err != nil {
				t.Errorf("config invalid afterwards: %v", err)
			}
		})
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
