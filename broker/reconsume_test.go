package broker

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/internal/waitfor"
)

// A consumer whose prefetch changes replaces its broker consumer on the
// same channel each time. A long-running sidecar whose prefetch follows
// the concurrency limit does that many times a day: nothing may be left
// behind per replacement, or goroutines pile up for as long as the
// connection lives.
func TestPrefetchChangesLeaveNoGoroutineBehind(t *testing.T) {
	needBroker(t)
	q := declareTyped(t, "classic", 0)
	c := NewConsumer(ConsumerOptions{Options: opts(), Queue: q, Prefetch: 20})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, func(*Delivery) {}) }()
	defer c.Close()

	// running waits until the queue's only consumer has prefetch p.
	running := func(p int) {
		t.Helper()
		waitfor.Until(t, 30*time.Second, "one consumer of "+q+" with prefetch "+strconv.Itoa(p), func() bool {
			lines, ok := consumersOf(q, "prefetch_count")
			return ok && len(lines) == 1 && lines[0] == q+"\t"+strconv.Itoa(p)
		})
	}
	running(20)
	before := runtime.NumGoroutine()
	const changes = 8
	for i := range changes {
		p := 40 + 20*(i%2) // 40, 60, 40, …: each a new broker consumer
		c.SetPrefetch(p)
		running(p)
	}
	after := runtime.NumGoroutine()
	if after > before+1 {
		t.Errorf("%d goroutines after %d prefetch changes, %d before: each replaced consumer left one behind", after, changes, before)
	}
	select {
	case err := <-done:
		t.Fatalf("consumer ended: %v", err)
	default:
	}
}
