package telemetry

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// spanQueue is a bounded hand-off in front of a span processor that may
// block (the batch processor with WithBlocking): ending a span never waits
// on the exporter, and a span that finds the queue full is counted in
// dropped. The SDK's own batch processor drops from a full queue without
// telling anyone, so its queue is kept from filling and this one counts.
type spanQueue struct {
	next    sdktrace.SpanProcessor
	items   chan queued
	dropped *atomic.Int64
	done    chan struct{}

	mu     sync.RWMutex // guards closed against OnEnd sending on a closed channel
	closed bool
}

// queued is an ended span, or a flush marker: flushed is closed once every
// span queued before it has been handed to next.
type queued struct {
	span    sdktrace.ReadOnlySpan
	flushed chan struct{}
}

func newSpanQueue(next sdktrace.SpanProcessor, size int, dropped *atomic.Int64) *spanQueue {
	q := &spanQueue{next: next, items: make(chan queued, size), dropped: dropped, done: make(chan struct{})}
	go func() {
		defer close(q.done)
		for it := range q.items {
			if it.flushed != nil {
				close(it.flushed)
				continue
			}
			q.next.OnEnd(it.span)
		}
	}()
	return q
}

func (q *spanQueue) OnStart(ctx context.Context, s sdktrace.ReadWriteSpan) { q.next.OnStart(ctx, s) }

// OnEnd queues s, or counts it as dropped when the queue is full.
func (q *spanQueue) OnEnd(s sdktrace.ReadOnlySpan) {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.closed {
		q.dropped.Add(1)
		return
	}
	select {
	case q.items <- queued{span: s}:
	default:
		q.dropped.Add(1)
	}
}

// ForceFlush hands every span queued so far to next, then flushes next.
func (q *spanQueue) ForceFlush(ctx context.Context) error {
	flushed := make(chan struct{})
	q.mu.RLock()
	if q.closed {
		q.mu.RUnlock()
		return nil
	}
	select {
	case q.items <- queued{flushed: flushed}:
		q.mu.RUnlock()
	case <-ctx.Done():
		q.mu.RUnlock()
		return fmt.Errorf("flush span queue: %w", ctx.Err())
	}
	select {
	case <-flushed:
	case <-ctx.Done():
		return fmt.Errorf("flush span queue: %w", ctx.Err())
	}
	return q.next.ForceFlush(ctx)
}

// Shutdown stops taking spans, hands the queued ones to next (within ctx)
// and shuts next down.
func (q *spanQueue) Shutdown(ctx context.Context) error {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		close(q.items)
	}
	q.mu.Unlock()
	select {
	case <-q.done:
	case <-ctx.Done():
		return fmt.Errorf("drain span queue: %w", ctx.Err())
	}
	return q.next.Shutdown(ctx)
}
