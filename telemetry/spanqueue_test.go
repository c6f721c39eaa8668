package telemetry

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// blockingProcessor takes spans one at a time and holds each until the
// test releases it, like a batcher waiting on a slow collector.
type blockingProcessor struct {
	entered chan struct{}
	release chan struct{}
	mu      sync.Mutex
	got     []string
	shut    bool
}

func (b *blockingProcessor) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (b *blockingProcessor) OnEnd(s sdktrace.ReadOnlySpan) {
	b.entered <- struct{}{}
	<-b.release
	b.mu.Lock()
	b.got = append(b.got, s.Name())
	b.mu.Unlock()
}
func (b *blockingProcessor) ForceFlush(context.Context) error { return nil }
func (b *blockingProcessor) Shutdown(context.Context) error {
	b.mu.Lock()
	b.shut = true
	b.mu.Unlock()
	return nil
}

// TestSpanQueueCountsDropsWhenFull: with the exporter stuck, the queue
// takes what fits and counts every other span as dropped, without ever
// blocking the code that ends spans; once the exporter moves again, what
// was queued is exported.
func TestSpanQueueCountsDropsWhenFull(t *testing.T) {
	next := &blockingProcessor{entered: make(chan struct{}), release: make(chan struct{})}
	var dropped atomic.Int64
	q := newSpanQueue(next, 2, &dropped)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(q))
	tr := tp.Tracer("test")

	end := func(name string) {
		_, s := tr.Start(context.Background(), name)
		s.End()
	}
	end("s1")
	<-next.entered // s1 is with the (stuck) exporter: the queue is empty
	end("s2")
	end("s3") // the queue (2) is full now
	end("s4")
	end("s5")
	if got := dropped.Load(); got != 2 {
		t.Fatalf("dropped %d, want 2 (s4, s5)", got)
	}
	go func() {
		next.release <- struct{}{} // s1 exported; s2 enters
		<-next.entered
		next.release <- struct{}{} // s3 enters
		<-next.entered
		next.release <- struct{}{}
	}()
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	next.mu.Lock()
	defer next.mu.Unlock()
	if len(next.got) != 3 || next.got[0] != "s1" || next.got[2] != "s3" || !next.shut {
		t.Errorf("exported %v (shut down %v), want s1 s2 s3 then shutdown", next.got, next.shut)
	}
}
