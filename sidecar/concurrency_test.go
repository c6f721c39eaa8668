package sidecar_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/topology"
)

// slowApp answers 200 after a fixed service time and records how many
// requests it held at once.
type slowApp struct {
	URL      string
	serve    time.Duration
	busy     atomic.Int64
	maxBusy  atomic.Int64
	answered atomic.Int64
}

func newSlowApp(t *testing.T, serve time.Duration) *slowApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &slowApp{URL: "http://" + ln.Addr().String() + "/msg", serve: serve}
	srv := &http.Server{Handler: http.HandlerFunc(a.handle), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return a
}

func (a *slowApp) handle(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		return // the health check
	}
	n := a.busy.Add(1)
	defer a.busy.Add(-1)
	for {
		m := a.maxBusy.Load()
		if n <= m || a.maxBusy.CompareAndSwap(m, n) {
			break
		}
	}
	time.Sleep(a.serve) // the app's own work: what makes it slow
	a.answered.Add(1)
}

// With prefetch and workers left unset, concurrency follows an app that
// takes its time without slowing down under load: the limit climbs past
// its start and the prefetch follows it, so more requests are at the app
// at once than any fixed prefetch of the earlier defaults (50) allowed.
func TestDefaultsFollowASlowApp(t *testing.T) {
	a := newSlowApp(t, 20*time.Millisecond)
	cfg := testConfig(t, a.URL)
	cfg.Consumer.Prefetch, cfg.Consumer.Workers = 0, 0
	const n = 3000
	prefill(t, cfg, "slow", n)
	r := start(t, cfg)
	waitfor.Until(t, 2*time.Minute, "every message answered", func() bool { return a.answered.Load() >= n })
	r.settled(0)
	if got := a.maxBusy.Load(); got <= 64 {
		t.Errorf("at most %d requests at the app at once; with the prefetch following the limit it should pass the starting prefetch of 64", got)
	}
	t.Logf("most requests at the app at once: %d", a.maxBusy.Load())
}

// With the prefetch following the limit, consumer.prefetchBytes bounds what
// the prefetch may hold: 32 KiB messages under a 512 KiB budget cap it at
// 16 although the limit alone would have it at 64 or more, and it stays
// there while the backlog drains.
func TestDefaultsPrefetchBoundedByBytes(t *testing.T) {
	a := newSlowApp(t, 5*time.Millisecond)
	cfg := testConfig(t, a.URL)
	cfg.Consumer.Prefetch, cfg.Consumer.Workers = 0, 0
	cfg.Consumer.PrefetchBytes = 512 << 10
	const n, size = 1500, 32 << 10
	prefillSized(t, cfg, "big", n, size)
	r := start(t, cfg)
	q := cfg.Queue.Name
	waitfor.Until(t, time.Minute, "the prefetch capped at 16 by bytes", func() bool { return r.sc.QueuePrefetch(q) == 16 })
	waitfor.Until(t, 2*time.Minute, "every message answered", func() bool {
		if p := r.sc.QueuePrefetch(q); p > 16 {
			t.Fatalf("prefetch %d after the cap, want at most 16 (512 KiB / 32 KiB)", p)
		}
		return a.answered.Load() >= n
	})
	r.settled(0)
}

// prefill declares cfg's queues and publishes n messages (ids prefix-0000…)
// to the work queue before Hopper starts, so it starts on a backlog.
func prefill(t *testing.T, cfg config.Config, prefix string, n int) {
	prefillSized(t, cfg, prefix, n, 0)
}

// prefillSized is prefill with bodies of size bytes (the id when 0).
func prefillSized(t *testing.T, cfg config.Config, prefix string, n, size int) {
	t.Helper()
	ctx := context.Background()
	bo := broker.ConfigOptions(cfg.Broker, testLogger(t), "prefill")
	plan := topology.FromConfig(&cfg)
	if err := broker.Apply(ctx, bo, &plan, true); err != nil {
		t.Fatal(err)
	}
	pub := broker.NewPublisher(broker.PublisherOptions{Options: bo, Channels: 8, ConfirmTimeout: 5 * time.Second})
	defer pub.Close()
	const publishers = 8
	var (
		wg    sync.WaitGroup
		ids   = make(chan string)
		fails atomic.Int64
	)
	for range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range ids {
				body := []byte(id)
				if size > 0 {
					body = make([]byte, size)
				}
				if err := pub.Publish(ctx, cfg.Queue.Name, &msg.Message{MessageID: id, Headers: map[string]any{}, Body: body}); err != nil {
					t.Errorf("prefill %s: %v", id, err)
					fails.Add(1)
				}
			}
		}()
	}
	for i := range n {
		ids <- fmt.Sprintf("%s-%04d", prefix, i)
	}
	close(ids)
	wg.Wait()
	if fails.Load() > 0 {
		t.FailNow()
	}
}
