package sidecar_test

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/sidecar"
)

// startedLog records the prefetch of every consumer Hopper starts, from
// its CONSUMER_STARTED log lines: what the broker was asked to push.
type startedLog struct {
	mu        sync.Mutex
	prefetchs []int
}

func (l *startedLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *startedLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *startedLog) WithGroup(string) slog.Handler            { return l }
func (l *startedLog) Handle(_ context.Context, r slog.Record) error {
	var event string
	prefetch := -1
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "event":
			event = a.Value.String()
		case "prefetch":
			prefetch = int(a.Value.Int64())
		}
		return true
	})
	if event == "CONSUMER_STARTED" {
		l.mu.Lock()
		l.prefetchs = append(l.prefetchs, prefetch)
		l.mu.Unlock()
	}
	return nil
}

// runLogged runs a sidecar on cfg logging to log until the test ends.
func runLogged(t *testing.T, cfg *config.Config, log slog.Handler) *sidecar.Sidecar {
	t.Helper()
	sc := sidecar.New(cfg, slog.New(log))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("sidecar: %v", err)
		}
	})
	return sc
}

func (l *startedLog) started() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.prefetchs)
}

// healthApp answers 200, or while it is down 500 to messages and 503 to
// its health check; it counts the messages it answered 200 by id.
type healthApp struct {
	URL  string
	down atomic.Bool
	mu   sync.Mutex
	ok   map[string]int
}

func newHealthApp(t *testing.T) *healthApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &healthApp{URL: "http://" + ln.Addr().String() + "/msg", ok: map[string]int{}}
	srv := &http.Server{Handler: a, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	t.Cleanup(func() { srv.Close() })
	return a
}

func (a *healthApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if a.down.Load() {
		if r.URL.Path == "/healthz" {
			w.WriteHeader(http.StatusServiceUnavailable)
		} else {
			w.WriteHeader(http.StatusInternalServerError)
		}
		return
	}
	if r.Method == http.MethodPost {
		a.mu.Lock()
		a.ok[r.Header.Get("Hopper-Message-Id")]++
		a.mu.Unlock()
	}
}

func (a *healthApp) answered() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.ok)
}

// At the defaults (prefetch following the limit) the byte budget bounds
// every consumer Hopper starts: the first takes one message, since no size
// is known yet, and when the breaker resumes consuming after the app was
// down, it asks for no more than the budget holds, although the breaker
// asks the consumer for its full prefetch.
func TestResumeWithinPrefetchBytes(t *testing.T) {
	app := newHealthApp(t)
	cfg := testConfig(t, app.URL)
	cfg.App.HealthPath = "/healthz"
	cfg.Consumer.Prefetch, cfg.Consumer.Workers = 0, 0
	cfg.Consumer.PrefetchBytes = 1 << 20
	cfg.Breaker.Failures = 3
	cfg.Breaker.ProbeInterval = config.Duration(50 * time.Millisecond)
	cfg.Retry.MaxAttempts = 100
	const n, size, room = 20, 256 << 10, 4 // 1 MiB / 256 KiB
	prefillSized(t, cfg, "first", n, size)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	log := &startedLog{}
	sc := runLogged(t, &cfg, log)
	waitfor.Until(t, time.Minute, "the backlog answered", func() bool { return app.answered() == n })

	app.down.Store(true)
	prefillSized(t, cfg, "second", n, size)
	waitfor.Until(t, 30*time.Second, "breaker open and consuming paused", func() bool {
		return sc.BreakerState() == "open" && sc.Paused()
	})
	beforeResume := len(log.started())
	app.down.Store(false)
	waitfor.Until(t, time.Minute, "every message answered", func() bool { return app.answered() == 2*n })

	started := log.started()
	if len(started) == 0 || started[0] != 1 {
		t.Errorf("consumers started with prefetch %v: the first, before any body size is known, should take 1", started)
	}
	if len(started) <= beforeResume {
		t.Fatalf("no consumer started after the breaker opened (prefetches %v)", started)
	}
	for i, p := range started {
		if p > room {
			t.Errorf("consumer %d of %v started with prefetch %d: %d KiB bodies under a %d KiB budget allow %d",
				i, started, p, size>>10, cfg.Consumer.PrefetchBytes>>10, room)
		}
	}
	t.Logf("prefetch of each consumer started: %v (%d after the breaker opened)", started, len(started)-beforeResume)
}

// The prefetch Hopper picks for a single-active-consumer queue does not
// follow the limit, but it is still bounded by consumer.prefetchBytes:
// the first consumer, before any body size is known, takes one message,
// not twice the workers, and none takes more than the budget holds.
func TestSingleActivePrefetchWithinBytes(t *testing.T) {
	app := newHealthApp(t)
	cfg := testConfig(t, app.URL)
	yes := true
	cfg.Queue.SingleActiveConsumer = &yes
	cfg.Consumer.Prefetch, cfg.Consumer.Workers = 0, 0
	cfg.Consumer.PrefetchBytes = 1 << 20
	const n, size, room = 20, 256 << 10, 4 // 1 MiB / 256 KiB
	prefillSized(t, cfg, "first", n, size)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	log := &startedLog{}
	runLogged(t, &cfg, log)
	waitfor.Until(t, time.Minute, "the backlog answered", func() bool { return app.answered() == n })
	started := log.started()
	if len(started) == 0 || started[0] != 1 {
		t.Errorf("consumers started with prefetch %v: the first, before any body size is known, should take 1", started)
	}
	for i, p := range started {
		if p > room {
			t.Errorf("consumer %d of %v started with prefetch %d over the %d the budget allows", i, started, p, room)
		}
	}
}
