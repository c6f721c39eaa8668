package app

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
	"go.opentelemetry.io/otel/trace"
)

var (
	ok200 = retry.Outcome{Kind: retry.Response, Status: 200}
	s503  = retry.Outcome{Kind: retry.Response, Status: 503}
	s500  = retry.Outcome{Kind: retry.Response, Status: 500}
)

// sim is a discrete-event model of Hopper in front of an app, in virtual
// time: there is always more work than the limit lets through (a backlog),
// the app serves up to capacity requests at once, each taking serve, and
// answers beyond that at once with reject (or, with capacity 0, serves
// everything). The limiter sees each answer with its virtual latency.
type sim struct {
	l        *Limiter
	capacity int
	serve    time.Duration
	reject   retry.Outcome
	answer   func(n int) retry.Outcome // status of the n-th served request
	now      time.Duration
	// fifo, when set, makes the app one server taking fifo per request
	// in arrival order, whatever serve and capacity say: its throughput
	// is fixed, and each request more at once only waits longer.
	fifo     time.Duration
	lastDone time.Duration
	busy     int
	pending  []simReq
	served   int
	n        int
	clocked  bool
}

type simReq struct {
	done    time.Duration
	start   time.Duration
	out     retry.Outcome
	counted bool // occupies an app slot
}

func (s *sim) fill(t *testing.T) {
	for s.l.InFlight() < s.l.Limit() {
		if err := s.l.acquire(context.Background(), "q"); err != nil {
			t.Fatal(err)
		}
		r := simReq{start: s.now}
		if s.fifo > 0 || s.capacity == 0 || s.busy < s.capacity {
			s.busy++
			s.n++
			r.done, r.counted, r.out = s.now+s.serve, true, ok200
			if s.fifo > 0 {
				s.lastDone = max(s.now, s.lastDone) + s.fifo
				r.done = s.lastDone
			}
			if s.answer != nil {
				r.out = s.answer(s.n)
			}
		} else {
			r.done, r.out = s.now+time.Microsecond, s.reject
		}
		s.pending = append(s.pending, r)
	}
}

// run advances virtual time by d, and reports the mean limit over it.
func (s *sim) run(t *testing.T, d time.Duration) float64 {
	t.Helper()
	if !s.clocked {
		// The limiter times the rise of the usual latency on the
		// simulation's clock.
		epoch := time.Unix(0, 0)
		s.l.o.Now = func() time.Time { return epoch.Add(s.now) }
		s.clocked = true
	}
	end := s.now + d
	var area float64
	s.fill(t)
	for {
		next := 0
		for i, r := range s.pending {
			if r.done < s.pending[next].done {
				next = i
			}
		}
		r := s.pending[next]
		if r.done > end {
			area += float64(s.l.Limit()) * float64(end-s.now)
			s.now = end
			break
		}
		s.pending = append(s.pending[:next], s.pending[next+1:]...)
		area += float64(s.l.Limit()) * float64(r.done-s.now)
		s.now = r.done
		if r.counted {
			s.busy--
			if r.out.Status < 400 {
				s.served++
			}
		}
		s.l.release(SignalOf(r.out), r.done-r.start)
		s.fill(t)
	}
	return area / float64(d)
}

// An app that serves c requests at once and answers 503 at once beyond:
// the limit settles near c instead of hammering it with Max, never at
// zero, and throughput stays near what c workers achieve.
func TestLimiterConvergesOnCapacity(t *testing.T) {
	for _, c := range []int{1, 4, 16} {
		s := &sim{l: NewLimiter(nil, LimiterOptions{Max: 64}), capacity: c, serve: 20 * time.Millisecond, reject: s503}
		s.run(t, 10*time.Second) // settle
		s.served = 0
		mean := s.run(t, 20*time.Second)
		best := float64(c) * 20 / 0.020 // c workers, 20 s, 20 ms each
		if mean < float64(c)*0.7 || mean > float64(c)*1.5+1 {
			t.Errorf("capacity %d: mean limit %.1f", c, mean)
		}
		if ratio := float64(s.served) / best; ratio < 0.8 {
			t.Errorf("capacity %d: served %.2f of what %d workers do", c, ratio, c)
		}
	}
}

// Failing messages from a healthy app (500s) are not overload: the limit
// stays at Max.
func TestLimiterIgnoresFailingMessages(t *testing.T) {
	s := &sim{l: NewLimiter(nil, LimiterOptions{Max: 32}), serve: 5 * time.Millisecond,
		answer: func(int) retry.Outcome { return s500 }}
	s.run(t, 5*time.Second)
	if s.l.Limit() != 32 {
		t.Fatalf("limit %d after 500s, want 32", s.l.Limit())
	}
}

// Poison messages answered 503 by a healthy app at the head of the queue:
// the limit shrinks while they pass (they look like overload) but never to
// zero, and grows back once healthy messages follow.
func TestLimiterNeverZeroAndRecovers(t *testing.T) {
	s := &sim{l: NewLimiter(nil, LimiterOptions{Max: 32}), serve: 5 * time.Millisecond,
		answer: func(int) retry.Outcome { return s503 }}
	s.run(t, 5*time.Second)
	if s.l.Limit() != 1 {
		t.Fatalf("limit %d under constant 503s, want 1", s.l.Limit())
	}
	s.answer = nil
	s.run(t, 5*time.Second)
	if s.l.Limit() != 32 {
		t.Fatalf("limit %d after healthy messages, want 32", s.l.Limit())
	}
}

// Latency well above the usual is overload; jitter of a fast app is not.
func TestLimiterLatency(t *testing.T) {
	s := &sim{l: NewLimiter(nil, LimiterOptions{Max: 32}), serve: time.Millisecond}
	s.run(t, time.Second)
	s.serve = 3 * time.Millisecond // 3x, but only 2 ms more
	s.run(t, time.Second)
	if s.l.Limit() != 32 {
		t.Fatalf("limit %d after small jitter, want 32", s.l.Limit())
	}
	s.serve = 200 * time.Millisecond
	s.run(t, 2*time.Second)
	if s.l.Limit() >= 32 {
		t.Fatalf("limit %d while latency rose 200x, want it lower", s.l.Limit())
	}
	// The slowdown lasts: it becomes the app's usual latency, and the
	// limit grows back.
	s.run(t, 5*baseRise)
	if s.l.Limit() != 32 {
		t.Fatalf("limit %d after %s at the new latency, want 32 again", s.l.Limit(), 5*baseRise)
	}
}

// An app that serves one request at a time (a fixed throughput): more
// requests at once only queue at it. The limit must stay near where
// requests wait about the latency slack, not climb to Max because each
// step of queueing passes for the app's usual latency, and throughput
// must stay what the app can do.
func TestLimiterStaysOutOfTheAppsQueue(t *testing.T) {
	s := &sim{l: NewLimiter(nil, LimiterOptions{Max: 512, Initial: 32}), fifo: time.Millisecond}
	s.run(t, 10*time.Second) // settle
	s.served = 0
	mean := s.run(t, 30*time.Second)
	if mean > 12 {
		t.Errorf("mean limit %.1f in front of an app that serves one request at a time in 1 ms; want about the 3 ms slack's worth (≤ 12)", mean)
	}
	if ratio := float64(s.served) / 30000; ratio < 0.95 {
		t.Errorf("served %.3f of the app's 1,000 requests/s", ratio)
	}
}

// A batch of several messages that times out as a whole is one message
// hanging the app, which the split that follows charges to that message
// alone: it does not shrink the limit. A request of one message that
// times out does, as a single message's timeout always has.
func TestLimiterBatchTimeoutIsNotOverload(t *testing.T) {
	timeout := retry.Outcome{Kind: retry.Timeout, Error: "timeout"}
	l := NewLimiter(deliverFunc(func(context.Context, *msg.Message, msg.Info) retry.Outcome { return timeout }), LimiterOptions{Max: 4})
	req := func(n int) *batch.Request {
		r := &batch.Request{}
		for range n {
			r.Messages = append(r.Messages, &msg.Message{MessageID: "m"})
			r.Infos = append(r.Infos, msg.Info{Queue: "q", Attempt: 1})
			r.Traces = append(r.Traces, trace.SpanContext{})
		}
		return r
	}
	for range 40 {
		l.DeliverBatch(context.Background(), req(16))
	}
	if l.Limit() != 4 {
		t.Fatalf("limit %d after batches of 16 timed out, want 4", l.Limit())
	}
	for range 40 {
		l.DeliverBatch(context.Background(), req(1))
	}
	if l.Limit() >= 4 {
		t.Fatalf("limit %d after single messages timed out, want it lower", l.Limit())
	}
}

// The parts of a split batch go on the slot of the request they came
// from: one goes through while every slot is taken, and its timeout, alone,
// still counts.
func TestLimiterLetsSplitPartsThrough(t *testing.T) {
	timeout := retry.Outcome{Kind: retry.Timeout, Error: "timeout"}
	l := NewLimiter(deliverFunc(func(context.Context, *msg.Message, msg.Info) retry.Outcome { return timeout }), LimiterOptions{Max: 2})
	for range 2 {
		if err := l.acquire(context.Background(), "q"); err != nil {
			t.Fatal(err)
		}
	}
	part := &batch.Request{Messages: []*msg.Message{{MessageID: "m"}}, Infos: []msg.Info{{Queue: "q", Attempt: 1}},
		Traces: []trace.SpanContext{{}}, Split: true}
	for range 4 {
		if a := l.DeliverBatch(context.Background(), part); a.Whole.Kind != retry.Timeout {
			t.Fatalf("part answered %+v, want the app's timeout", a.Whole)
		}
	}
	if l.InFlight() != 2 {
		t.Errorf("in flight %d, want the 2 slots taken before, no more", l.InFlight())
	}
	if l.Limit() >= 2 {
		t.Errorf("limit %d after parts of one message timed out, want it lower", l.Limit())
	}
}

// After an outage the limit restarts small and doubles per round trip.
func TestLimiterSlowStart(t *testing.T) {
	s := &sim{l: NewLimiter(nil, LimiterOptions{Max: 64}), serve: 10 * time.Millisecond}
	s.l.Reset(1)
	var got []int
	for range 7 {
		got = append(got, s.l.Limit())
		s.run(t, 10*time.Millisecond)
	}
	want := []int{1, 2, 4, 8, 16, 32, 64}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("limits per round trip %v, want %v", got, want)
		}
	}
}

// A request over the limit waits for a slot; a released slot goes to it;
// a waiter whose context ends gives up without taking a slot.
func TestLimiterWaits(t *testing.T) {
	l := NewLimiter(nil, LimiterOptions{Max: 1})
	if err := l.acquire(context.Background(), "q"); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- l.acquire(context.Background(), "q") }()
	waitWaiters(t, l, 1)
	l.release(SignalOf(ok200), time.Millisecond)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if l.InFlight() != 1 {
		t.Fatalf("in flight %d, want the slot handed over", l.InFlight())
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { got <- l.acquire(ctx, "q") }()
	waitWaiters(t, l, 1)
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("acquire after cancel = %v", err)
	}
	l.release(SignalOf(ok200), time.Millisecond)
	if l.InFlight() != 0 {
		t.Fatalf("in flight %d after every slot was released", l.InFlight())
	}
}

func waitWaiters(t *testing.T, l *Limiter, n int) {
	t.Helper()
	for {
		l.mu.Lock()
		w := l.nwait
		l.mu.Unlock()
		if w == n {
			return
		}
		runtime.Gosched()
	}
}

// Slots freed while several queues wait go to the queues in turn: a quiet
// queue's one waiting message is served next, not after every waiter of a
// busy queue that queued before it.
func TestLimiterSharesSlotsFairlyAcrossQueues(t *testing.T) {
	l := NewLimiter(nil, LimiterOptions{Max: 1})
	if err := l.acquire(context.Background(), "busy"); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 4)
	wait := func(queue string) {
		go func() {
			if err := l.acquire(context.Background(), queue); err != nil {
				t.Error(err)
			}
			got <- queue
		}()
	}
	for i := range 3 {
		wait("busy")
		waitWaiters(t, l, i+1)
	}
	wait("quiet")
	waitWaiters(t, l, 4)

	var order []string
	for range 4 {
		l.release(SignalOf(ok200), time.Millisecond)
		order = append(order, <-got)
	}
	want := []string{"busy", "quiet", "busy", "busy"}
	if !slices.Equal(order, want) {
		t.Fatalf("slots went to %v, want %v (the quiet queue served on its turn)", order, want)
	}
}
