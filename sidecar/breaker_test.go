package sidecar_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/sidecar"
)

// counter reads one unlabelled counter or gauge from the sidecar's metrics.
func counter(t *testing.T, sc *sidecar.Sidecar, name string) float64 {
	t.Helper()
	v, ok := sc.Metrics().Value(name, nil)
	if !ok {
		t.Fatalf("no metric %s", name)
	}
	return v
}

// TestPoisonDoesNotStallHealthy: messages the app answers 503 for while its
// health check passes are message failures: they go through the tiers to
// the DLQ, the breaker never opens, and the healthy messages behind them are
// all delivered.
func TestPoisonDoesNotStallHealthy(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	cfg.Breaker.Failures = 3
	r := start(t, cfg)
	const poison, healthy = 30, 200
	for i := range poison {
		id := fmt.Sprintf("poison-%d", i)
		app.script(id, 503)
		r.publish(id)
	}
	for i := range healthy {
		r.publish(fmt.Sprintf("ok-%d", i))
	}
	r.settled(poison)
	for i := range healthy {
		if got := app.statuses(fmt.Sprintf("ok-%d", i)); len(got) != 1 || got[0] != 200 {
			t.Fatalf("ok-%d: statuses %v", i, got)
		}
	}
	if n := counter(t, r.sc, "hopper_breaker_opens_total"); n != 0 {
		t.Fatalf("the breaker opened %v times on failing messages from a healthy app", n)
	}
	dlq := r.drain(r.sc.Plan().DLQ.Name)
	for i := range poison {
		m := dlq[fmt.Sprintf("poison-%d", i)]
		if m == nil {
			t.Fatalf("poison-%d not in the DLQ", i)
		}
		if n, _ := m.Int("x-final-retry-count"); n != int64(cfg.Retry.MaxAttempts) {
			t.Errorf("poison-%d: x-final-retry-count %d, want %d", i, n, cfg.Retry.MaxAttempts)
		}
	}
}

// TestBreakerOpensWhenHealthFails: failing messages with a failing health
// check are the app being down: the breaker opens, consuming pauses, no
// message reaches the DLQ, and once the app is healthy everything is
// delivered.
func TestBreakerOpensWhenHealthFails(t *testing.T) {
	var healthy atomic.Bool
	app := newScriptApp(t)
	inner := app.srv.Handler
	app.srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			if !healthy.Load() {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			return
		}
		if !healthy.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		inner.ServeHTTP(w, r)
	})
	healthy.Store(true)
	cfg := testConfig(t, app.URL)
	cfg.App.HealthPath = "/healthz"
	cfg.Breaker.Failures = 3
	cfg.Breaker.ProbeInterval = config.Duration(50 * time.Millisecond)
	cfg.Retry.MaxAttempts = 100
	r := start(t, cfg)
	healthy.Store(false)
	for i := range 20 {
		r.publish(fmt.Sprintf("m-%d", i))
	}
	waitfor.Until(t, 15*time.Second, "breaker open and consuming paused", func() bool {
		return r.sc.BreakerState() == "open" && r.sc.Paused()
	})
	healthy.Store(true)
	r.settled(0)
	waitfor.Until(t, 15*time.Second, "breaker closed", func() bool { return r.sc.BreakerState() == "closed" })
	for i := range 20 {
		if got := app.statuses(fmt.Sprintf("m-%d", i)); len(got) != 1 || got[0] != 200 {
			t.Errorf("m-%d: answered %v by the healthy app", i, got)
		}
	}
}

func readyz(t *testing.T, sc *sidecar.Sidecar) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + sc.AdminAddr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// /readyz says what the sidecar actually waits for: the broker (for the
// topology), then the app's health check; it is ready once consuming, and
// liveness never depends on either.
func TestReadinessSaysWhatItWaitsFor(t *testing.T) {
	app := newScriptApp(t)
	app.Close() // the app is down at first
	cfg := testConfig(t, app.URL)
	cfg.Admin.Listen = "127.0.0.1:0"
	cfg.Broker.URLs = []string{"amqp://guest:guest@127.0.0.1:1/"} // nothing listens
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	sc := sidecar.New(&cfg, testLogger(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- sc.Run(ctx) }()
	waitfor.Until(t, 10*time.Second, "the admin endpoint", func() bool { return sc.AdminAddr() != "" })
	waitfor.Until(t, 10*time.Second, "/readyz waiting for the broker", func() bool {
		code, body := readyz(t, sc)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "waiting for the broker")
	})
	resp, err := http.Get("http://" + sc.AdminAddr() + "/livez")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/livez with the broker down: %v %v", resp, err)
	}
	resp.Body.Close()
	cancel()
	<-done

	// Broker up, app down.
	cfg.Broker.URLs = []string{rabbit.URL()}
	sc = sidecar.New(&cfg, testLogger(t))
	ctx2, cancel2 := context.WithCancel(context.Background())
	go func() { done <- sc.Run(ctx2) }()
	defer func() { cancel2(); <-done }()
	waitfor.Until(t, 10*time.Second, "the admin endpoint", func() bool { return sc.AdminAddr() != "" })
	waitfor.Until(t, 15*time.Second, "/readyz waiting for the app", func() bool {
		code, body := readyz(t, sc)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "waiting for the app's health check")
	})
	app.Restart()
	waitfor.Until(t, 15*time.Second, "/readyz ready", func() bool {
		code, body := readyz(t, sc)
		return code == http.StatusOK && strings.Contains(body, "ready: consuming")
	})
}
