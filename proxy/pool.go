package proxy

import (
	"context"
	"sync"
	"sync/atomic"
)

// pool delivers each delivery on its own, on up to Workers workers.
//
// Workers start as deliveries need them, up to Workers, and then stay: a
// ceiling of hundreds for a slow app costs an app that never needs them
// nothing. A delivery goes to a worker waiting on hand, else to a new
// worker, else into work for the next worker that is free.
type pool struct {
	p    *Loop
	crew crew
	hand chan job
	work chan job
	// ctx is Start's, for the workers.
	ctx context.Context
	// run is what a worker does with a job: the core's handling of one
	// delivery, or of a key's line of them.
	run func(ctx context.Context, j job)
}

func newPool(p *Loop, run func(ctx context.Context, j job)) *pool {
	return &pool{p: p, crew: crew{max: int64(p.o.Workers)}, hand: make(chan job), work: make(chan job, p.o.Queue), run: run}
}

func (w *pool) start(ctx context.Context) { w.ctx = ctx }

// handle hands j to a worker.
func (w *pool) handle(j job) {
	select {
	case w.hand <- j: // a worker was waiting for one
		return
	default:
	}
	if !w.spawn(j) {
		w.work <- j // every worker busy: the next one free takes it
	}
}

// stop lets the workers end once work is drained: what is still queued
// goes through them, and the core gives it back.
func (w *pool) stop() { close(w.work) }

// spawn starts a worker with j unless Workers already run.
func (w *pool) spawn(j job) bool {
	if !w.crew.claim(&w.p.wg) {
		return false
	}
	go w.worker(j)
	return true
}

// worker runs j, then each job handed to it, until work is closed. It is
// a method of its own, not a closure in spawn: a closure that takes each
// next job into j would move j to the heap for every call of spawn, and
// spawn is called for every delivery that finds no worker waiting, also
// when every worker runs already and it starts none.
func (w *pool) worker(j job) {
	defer w.p.wg.Done()
	for {
		w.run(w.ctx, j)
		select {
		case j = <-w.hand:
		case next, ok := <-w.work:
			if !ok {
				return
			}
			j = next
		}
	}
}

// crew counts the workers started, up to max, and up to what cap returns
// at the time when it is set (Options.WorkerCap).
type crew struct {
	max     int64
	cap     func() int
	running atomic.Int64
}

// claim counts a new worker in, and in wg, unless max (or cap's bound)
// already run.
func (c *crew) claim(wg *sync.WaitGroup) bool {
	limit := c.max
	if c.cap != nil {
		limit = min(limit, int64(max(1, c.cap())))
	}
	for {
		n := c.running.Load()
		if n >= limit {
			return false
		}
		if c.running.CompareAndSwap(n, n+1) {
			wg.Add(1)
			return true
		}
	}
}
