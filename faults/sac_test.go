package faults

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
)

// sacApp answers every message 200 and records which hopper sent it (the
// last segment of the path: each hopper has an app URL of its own), in the
// order requests arrive. The request for hold is kept unanswered until the
// hopper sending it goes away or the test ends.
type sacApp struct {
	addr string
	hold string
	gate chan struct{}

	mu    sync.Mutex
	calls []sacCall
}

type sacCall struct{ pod, id string }

func startSACApp(t *testing.T, hold string) *sacApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &sacApp{addr: ln.Addr().String(), hold: hold, gate: make(chan struct{})}
	srv := &http.Server{Handler: a, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	t.Cleanup(func() {
		close(a.gate)
		srv.Close()
	})
	return a
}

func (a *sacApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/healthz" {
		return
	}
	id := r.Header.Get("Hopper-Message-Id")
	pod := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
	a.mu.Lock()
	a.calls = append(a.calls, sacCall{pod: pod, id: id})
	a.mu.Unlock()
	if id == a.hold && pod == "a" {
		select {
		case <-a.gate:
		case <-r.Context().Done():
			return
		}
	}
}

func (a *sacApp) snapshot() []sacCall {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.calls)
}

// TestFaultSingleActiveConsumerTakeover runs two hopper processes on one
// work queue with queue.singleActiveConsumer and ordered delivery: only the
// first receives messages while the other stands by; the first is
// SIGKILLed with a message at the app, and the standby takes over from
// that message on. The app sees every message first in the order it was
// published, every message is answered 2xx, and none reaches the DLQ.
func TestFaultSingleActiveConsumerTakeover(t *testing.T) {
	const n = 200
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("sac-%03d", i)
	}
	hold := ids[n/2]
	app := startSACApp(t, hold)
	hopperBinary(t)
	q := queues{work: fmt.Sprintf("faults.sac.%d", queueSeq.Add(1))}
	cfg := func(pod string) hopperConfig {
		return hopperConfig{BrokerURLs: target.URLs(), Queue: q.work, AppURL: "http://" + app.addr + "/msg/" + pod, MaxAttempts: maxAttempts,
			// The held message stays at the app until its hopper is killed.
			Extra: "queue:\n  singleActiveConsumer: true\nconsumer:\n  ordered: true\napp:\n  timeout: 10m\n"}
	}
	a := startHopper(t, q.work+".a", cfg("a"))
	if err := a.waitEvent("CONSUMER_STARTED", time.Minute); err != nil {
		t.Fatal(err)
	}
	b := startHopper(t, q.work+".b", cfg("b"))
	if err := b.waitEvent("CONSUMER_STARTED", time.Minute); err != nil {
		t.Fatal(err)
	}

	// One publisher, one message at a time with its confirm: the queue
	// holds them in this order.
	pub := broker.NewPublisher(broker.PublisherOptions{Options: brokerOptions("faults-publisher"), ConfirmTimeout: 5 * time.Second})
	defer pub.Close()
	for _, id := range ids {
		m := &msg.Message{MessageID: id, DeliveryMode: 2, Headers: map[string]any{}, Body: []byte("sac " + id)}
		if err := pub.Publish(context.Background(), q.work, m); err != nil {
			t.Fatalf("publish %s: %v", id, err)
		}
	}

	waitfor.Until(t, time.Minute, "hopper a holding "+hold+" at the app", func() bool {
		return slices.Contains(app.snapshot(), sacCall{pod: "a", id: hold})
	})
	if err := a.waitEvent("CONSUMER_ACTIVE", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := b.waitEvent("CONSUMER_STANDBY", time.Minute); err != nil {
		t.Fatal(err)
	}
	before := app.snapshot()
	for _, c := range before {
		if c.pod != "a" {
			t.Fatalf("the standby delivered %s while a was active", c.id)
		}
	}
	a.kill()
	t.Logf("hopper a SIGKILLed holding %s after %d deliveries; b takes over", hold, len(before))

	waitfor.Until(t, 2*time.Minute, "every message answered", func() bool {
		seen := map[string]bool{}
		for _, c := range app.snapshot() {
			if !(c.pod == "a" && c.id == hold) {
				seen[c.id] = true
			}
		}
		return len(seen) == n
	})
	if err := b.waitEvent("CONSUMER_ACTIVE", time.Minute); err != nil {
		t.Fatal(err)
	}
	if d, ok := settle(q, time.Minute); !ok {
		t.Fatalf("queues did not settle: %s", formatDepths(d, q))
	}
	if left := drain(t, q); len(left) > 0 {
		t.Fatalf("%d messages left in the DLQ or work queue, first %+v", len(left), left[0])
	}

	calls := app.snapshot()
	var first []string
	seen := map[string]bool{}
	for i, c := range calls {
		if i >= len(before) && c.pod == "a" {
			t.Errorf("%s delivered by the killed hopper", c.id)
		}
		if !seen[c.id] {
			seen[c.id] = true
			first = append(first, c.id)
		}
	}
	if !slices.Equal(first, ids) {
		t.Errorf("first deliveries out of publish order:\n got %v\nwant %v", first, ids)
	}
	if i := slices.Index(calls, sacCall{pod: "b", id: hold}); i != len(before) {
		t.Errorf("b's first delivery is call %d (%+v), want %s, the message a held", i, calls[min(len(before), len(calls)-1)], hold)
	}
	for _, h := range []*hopperProc{a, b} {
		if p := h.logProblems(); len(p) > 0 {
			t.Errorf("%s: %v", h.logPath, p)
		}
	}
	if err := b.stop(); err != nil {
		t.Error(err)
	}
}
