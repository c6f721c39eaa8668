package broker

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hopper-sidecar/hopper/topology"
)

// A queue of Hopper's topology may be deleted while Hopper runs (by an
// operator, a policy, a broker reset). The consumer notices a deleted work
// queue (the broker cancels it) and prepares the topology again; a deleted
// delay tier or DLQ shows only as moves to it coming back unroutable. The
// publisher, which sees those returns, declares the queue again when the
// plan says Hopper declares its topology, and otherwise reports it missing
// so that the pause for failing moves can say why.

// plannedQueue is one queue of a plan, with the plan it belongs to.
type plannedQueue struct {
	plan *topology.Plan
	q    topology.Queue
}

// plannedQueues indexes the queues of the plans a publisher moves messages
// to, and keeps those found missing.
type plannedQueues struct {
	byName map[string]plannedQueue // read-only after newPlannedQueues

	mu      sync.Mutex
	gone    map[string]bool      // found missing, not seen back yet
	nGone   atomic.Int64         // len(gone), read without mu on every publish
	renewed map[string]time.Time // when each queue was last declared again

	declareMu sync.Mutex // one re-declare at a time
}

func newPlannedQueues(plans []*topology.Plan) *plannedQueues {
	pq := &plannedQueues{byName: map[string]plannedQueue{}, gone: map[string]bool{}, renewed: map[string]time.Time{}}
	for _, p := range plans {
		for _, q := range p.Queues() {
			if _, dup := pq.byName[q.Name]; !dup {
				pq.byName[q.Name] = plannedQueue{plan: p, q: q}
			}
		}
	}
	return pq
}

// missing records that a planned queue does not exist; the first time it
// is logged.
func (pq *plannedQueues) missing(log *slog.Logger, q plannedQueue) {
	pq.mu.Lock()
	defer pq.mu.Unlock()
	if pq.gone[q.q.Name] {
		return
	}
	pq.gone[q.q.Name] = true
	pq.nGone.Add(1)
	log.Error("a queue of Hopper's topology does not exist; moves to it fail until it is declared again",
		"event", "QUEUE_MISSING", "queue", q.q.Name, "role", q.q.Role, "work_queue", q.plan.Work.Name,
		"declare", q.plan.Declare)
}

// found records that a publish to a planned queue went through.
func (pq *plannedQueues) found(log *slog.Logger, name string) {
	if pq.nGone.Load() == 0 {
		return
	}
	pq.mu.Lock()
	defer pq.mu.Unlock()
	if !pq.gone[name] {
		return
	}
	delete(pq.gone, name)
	pq.nGone.Add(-1)
	log.Info("queue of Hopper's topology exists again; moves to it go through", "event", "QUEUE_RESTORED", "queue", name)
}

// MissingQueues lists, sorted, the queues of the publisher's plans that a
// move found missing and that no publish has reached since.
func (p *Publisher) MissingQueues() []string {
	p.planned.mu.Lock()
	defer p.planned.mu.Unlock()
	return slices.Sorted(maps.Keys(p.planned.gone))
}

// redeclare declares a deleted planned queue again, with its planned
// arguments, on the publishing connection. A deleted work queue takes the
// whole plan with it (its bindings are gone too). When another publish
// has declared the queue since this one started, there is nothing to do.
func (p *Publisher) redeclare(ctx context.Context, q plannedQueue, since time.Time) error {
	pq := p.planned
	pq.declareMu.Lock()
	defer pq.declareMu.Unlock()
	pq.mu.Lock()
	last := pq.renewed[q.q.Name]
	pq.mu.Unlock()
	if last.After(since) {
		return nil
	}
	conn, _, err := p.connection(ctx)
	if err != nil {
		return err
	}
	if q.q.Role == topology.RoleWork {
		err = Declare(ctx, conn, q.plan)
	} else {
		err = declare(conn, q.q)
	}
	if err != nil {
		return fmt.Errorf("declare: %w", err)
	}
	pq.mu.Lock()
	pq.renewed[q.q.Name] = time.Now()
	pq.mu.Unlock()
	p.opts.logger().Warn("a queue of Hopper's topology was deleted; declared it again with its planned arguments",
		"event", "QUEUE_REDECLARED", "queue", q.q.Name, "role", q.q.Role, "work_queue", q.plan.Work.Name)
	return nil
}
