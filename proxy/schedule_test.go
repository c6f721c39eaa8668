package proxy

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
	"github.com/hopper-sidecar/hopper/schedule"
	"github.com/hopper-sidecar/hopper/topology"
)

// scheduleObserver records what the loop says of parked messages.
type scheduleObserver struct {
	countingObserver
	mu     sync.Mutex
	parked []time.Duration
	late   []time.Duration
}

func (o *scheduleObserver) Parked(step time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.parked = append(o.parked, step)
}

func (o *scheduleObserver) Due(late time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.late = append(o.late, late)
}

// scheduledLoop is a loop with scheduling on (steps 1s … 16s, past that
// the DLQ), on a clock the test moves, and an app answering status.
func scheduledLoop(t *testing.T, now *atomic.Int64, status int) (*Loop, *fakePub, *journal, *scheduleObserver, *atomic.Int64) {
	t.Helper()
	cfg := config.Default()
	cfg.Queue.Name = "orders"
	cfg.Schedule.Enabled = true
	cfg.Schedule.MaxDelay = config.Duration(20 * time.Second)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	plan := topology.FromConfig(&cfg)
	j := &journal{}
	pub := &fakePub{j: j}
	calls := &atomic.Int64{}
	app := appFunc(func(*msg.Message) retry.Outcome {
		calls.Add(1)
		return retry.Outcome{Kind: retry.Response, Status: status}
	})
	obs := &scheduleObserver{}
	pol := schedule.Policy{Step: cfg.Schedule.Step.D(), Max: cfg.Schedule.MaxDelay.D()}
	p := New(Options{Plan: &plan, Selector: cfg.Selector(), App: app, Pub: pub, Workers: 1, Observer: obs,
		Schedule: &pol, Now: func() time.Time { return time.UnixMilli(now.Load()) }})
	p.Start(context.Background())
	return p, pub, j, obs, calls
}

// settleAll waits until j shows a settle (an ack, or a nack), then shuts
// the loop down, which waits for every goroutine it started.
func settleAll(t *testing.T, p *Loop, j *journal) {
	t.Helper()
	waitfor.Until(t, 10*time.Second, "a settle", func() bool {
		return slices.ContainsFunc(j.all(), func(s string) bool { return s == "ack" || strings.HasPrefix(s, "nack") })
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if !p.Shutdown(ctx) {
		t.Fatal("the loop did not finish")
	}
}

// TestParkHopsUntilDue follows one message with x-delay 10s through the
// parking ladder on a clock the test moves: each hop goes to the longest
// step not past what is left, none reaches the app or counts an attempt,
// and once due it reaches the app, counted as 10ms late.
func TestParkHopsUntilDue(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC).UnixMilli()
	now := &atomic.Int64{}
	now.Store(t0)
	m := msgWith(map[string]any{msg.HeaderDelay: int32(10000)})
	var hops []string
	for _, hop := range []struct {
		at   int64 // ms after t0
		want string
	}{{0, "orders.park.8s"}, {8005, "orders.park.1s"}, {9010, "orders.park.1s"}, {10010, ""}} {
		now.Store(t0 + hop.at)
		p, pub, j, obs, calls := scheduledLoop(t, now, 200)
		p.Handle(&fakeDelivery{m: m, j: j, alive: true})
		settleAll(t, p, j)
		if hop.want == "" {
			if calls.Load() != 1 || len(pub.to) != 0 {
				t.Fatalf("due at +%dms: %d calls, published to %v; want the app called once", hop.at, calls.Load(), pub.to)
			}
			if len(obs.late) != 1 || obs.late[0] != 10*time.Millisecond {
				t.Fatalf("lateness recorded %v, want [10ms]", obs.late)
			}
			break
		}
		if calls.Load() != 0 || len(pub.to) != 1 || pub.to[0] != hop.want {
			t.Fatalf("at +%dms: %d app calls, published to %v; want only %s", hop.at, calls.Load(), pub.to, hop.want)
		}
		if got := j.all(); len(got) != 2 || got[1] != "ack" {
			t.Fatalf("at +%dms: %v, want the publish then the ack", hop.at, got)
		}
		m = pub.got[0]
		if due, _ := m.Int(msg.HeaderDue); due != t0+10000 {
			t.Fatalf("hop %d carries due %d, want %d", len(hops), due, t0+10000)
		}
		if n, _ := m.Int(msg.HeaderRetryCount); n != 0 {
			t.Fatalf("parking counted an attempt: %v", m.Headers)
		}
		if len(obs.parked) != 1 || p.Stats.Parked.Load() != 1 {
			t.Fatalf("parked observed %v, stats %d", obs.parked, p.Stats.Parked.Load())
		}
		if next, ok := p.NextDue(); !ok || next.UnixMilli() != t0+10000 {
			t.Fatalf("next due %s %t, want %s", next, ok, time.UnixMilli(t0+10000))
		}
		hops = append(hops, hop.want)
	}
}

// TestRetryOfScheduledMessageIsNotParkedAgain: a message delivered when
// due and retried comes back from its tier carrying its due time, not
// x-delay, so the retry's delay and the schedule do not add up.
func TestRetryOfScheduledMessageIsNotParkedAgain(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC).UnixMilli()
	now := &atomic.Int64{}
	now.Store(t0)
	m := msgWith(map[string]any{msg.HeaderDelay: int32(3000), msg.HeaderDue: t0 - 5, msg.HeaderParked: true})
	p, pub, j, obs, calls := scheduledLoop(t, now, 503)
	p.Handle(&fakeDelivery{m: m, j: j, alive: true})
	settleAll(t, p, j)
	if calls.Load() != 1 || len(pub.to) != 1 || pub.to[0] != "orders.retry.1s" {
		t.Fatalf("%d calls, published to %v; want one call and a retry", calls.Load(), pub.to)
	}
	r := pub.got[0]
	if _, ok := r.Headers[msg.HeaderDelay]; ok {
		t.Fatalf("the retry copy still carries x-delay: %v", r.Headers)
	}
	if _, ok := r.Headers[msg.HeaderParked]; ok {
		t.Fatalf("the retry copy still carries the parked mark: %v", r.Headers)
	}
	if len(obs.late) != 1 {
		t.Fatalf("lateness recorded %v, want once", obs.late)
	}
	// Back from the tier a second later: delivered, lateness not counted again.
	now.Store(t0 + 1000)
	p, pub, j, obs, calls = scheduledLoop(t, now, 200)
	p.Handle(&fakeDelivery{m: r, j: j, alive: true})
	settleAll(t, p, j)
	if calls.Load() != 1 || len(pub.to) != 0 || len(obs.late) != 0 {
		t.Fatalf("back from the tier: %d calls, published %v, lateness %v; want delivered, nothing else", calls.Load(), pub.to, obs.late)
	}
}

// TestScheduleTooFarGoesToTheDLQ: a due time past schedule.maxDelay is
// dead-lettered with its reason, never delivered early.
func TestScheduleTooFarGoesToTheDLQ(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	now := &atomic.Int64{}
	now.Store(t0.UnixMilli())
	m := msgWith(map[string]any{msg.HeaderNotBefore: t0.Add(time.Hour).Format(time.RFC3339)})
	p, pub, j, _, calls := scheduledLoop(t, now, 200)
	p.Handle(&fakeDelivery{m: m, j: j, alive: true})
	settleAll(t, p, j)
	if calls.Load() != 0 || len(pub.to) != 1 || pub.to[0] != "orders.dlq" {
		t.Fatalf("%d calls, published to %v; want the DLQ only", calls.Load(), pub.to)
	}
	if r := pub.got[0].String(msg.HeaderDeadLetterReason); r != retry.ReasonScheduleTooFar {
		t.Fatalf("reason %q", r)
	}
	if p.Stats.DeadLettered.Load() != 1 {
		t.Fatalf("dead-lettered %d", p.Stats.DeadLettered.Load())
	}
}

// TestDueTimesBySecond: the next due time is the earliest not passed,
// rounded up to the second, and one entry per second however many
// messages share it.
func TestDueTimesBySecond(t *testing.T) {
	var s dueTimes
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for i := range 1000 {
		s.add(t0.Add(time.Duration(i) * time.Millisecond))
	}
	s.add(t0.Add(5 * time.Second))
	// t0 itself, the 999 later milliseconds rounded up to t0+1s, and +5s.
	if len(s.in) != 3 {
		t.Fatalf("%d entries, want 3", len(s.in))
	}
	if next, ok := s.next(t0); !ok || !next.Equal(t0) {
		t.Fatalf("next %s %t", next, ok)
	}
	if next, ok := s.next(t0.Add(1500 * time.Millisecond)); !ok || !next.Equal(t0.Add(5*time.Second)) {
		t.Fatalf("next %s %t, want +5s", next, ok)
	}
	if _, ok := s.next(t0.Add(6 * time.Second)); ok {
		t.Fatal("a due time past is still shown")
	}
}
