package faults

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
)

// scheduleStep is the scenario's schedule.step: every message reaches the
// app no earlier than half of it before its due time.
const scheduleStep = time.Second

// TestFaultScheduled: messages that say when they may be delivered (by
// turns x-delay, Hopper-Not-Before in RFC 3339 and in Unix milliseconds),
// due from 20s to 60s after their publish, wait in the parking queues
// while the broker restarts gracefully, Hopper is SIGKILLed and started
// again, and the broker's node is SIGKILLed. Each id must reach the app
// (2xx), none before its due time by more than the schedule's precision
// (step/2), lost=0; those due after the last fault is over must also be
// on time, no later than step/2 plus a second. Duplicates (a SIGKILL
// between a parking move's confirm and its ack) are counted and reported.
func TestFaultScheduled(t *testing.T) {
	n := max(100, messageCount(t)/5)
	ids := makeIDs("scheduled", n)
	scripts := map[string]*script{}
	for _, id := range ids {
		scripts[id] = &script{final: answer2xx, want: expectAck}
	}
	extra := fmt.Sprintf("schedule:\n  enabled: true\n  step: %s\n  maxDelay: 2m\n", scheduleStep)
	r := beginApp(t, "scheduled", startApp(t, scripts), hopperConfig{QueueType: "classic", Extra: extra})
	r.step("%d messages due 20s to 60s after their publish; a broker restart, a hopper SIGKILL and a broker SIGKILL while they are parked", n)

	var (
		mu  sync.Mutex
		due = map[string]time.Time{}
	)
	build := func(id string) *msg.Message {
		var i int
		fmt.Sscanf(id, "scheduled-%d", &i) //nolint:errcheck // makeIDs' own form
		delay := 20*time.Second + time.Duration(i)*40*time.Second/time.Duration(n)
		// Measured before the publish: Hopper counts x-delay from its
		// receipt, later, so this due time can only make a delivery look
		// later than it was, never earlier.
		at := time.Now().Add(delay)
		mu.Lock()
		due[id] = at
		mu.Unlock()
		m := &msg.Message{MessageID: id, ContentType: "text/plain", DeliveryMode: 2, Headers: map[string]any{}, Body: []byte("fault-suite " + id)}
		switch i % 3 {
		case 0:
			m.Headers[msg.HeaderDelay] = int64(delay / time.Millisecond)
		case 1:
			m.Headers[msg.HeaderNotBefore] = at.UTC().Format(time.RFC3339Nano)
		case 2:
			m.Headers[msg.HeaderNotBefore] = at.UnixMilli()
		}
		return m
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	ps := publishPacedWith(ctx, t, r.q.work, ids, 0, build)
	cancel()
	r.step("published %d ids", len(ps.confirmed))

	r.waitParked(n / 2)
	r.restartBroker()
	r.waitParked(n / 4)
	r.killHopper(time.Second)
	r.killBroker()
	faultsOver := time.Now()

	done := make(chan publishStats, 1)
	done <- ps
	a := r.finish(done)
	a.report(t)
	checkScripts(t, a, scripts)
	if a.dlq != 0 {
		t.Errorf("%d message(s) dead-lettered, want none (by reason %v)", a.dlq, a.byReason)
	}

	// When each id first reached the app, against its due time.
	first := map[string]time.Time{}
	for _, rec := range r.app.snapshot() {
		if at, ok := first[rec.ID]; !ok || rec.At.Before(at) {
			first[rec.ID] = rec.At
		}
	}
	var offs, after []time.Duration
	early := 0
	for _, id := range ids {
		at, ok := first[id]
		if !ok {
			continue // lost: reported by the accounting
		}
		off := at.Sub(due[id])
		offs = append(offs, off)
		if off < -scheduleStep/2-50*time.Millisecond {
			early++
			t.Errorf("%s reached the app %s before its due time, more than the precision (%s)", id, -off, scheduleStep/2)
		}
		if due[id].After(faultsOver.Add(2 * time.Second)) {
			after = append(after, off)
			if off > scheduleStep/2+time.Second {
				t.Errorf("%s, due after the faults were over, reached the app %s late", id, off)
			}
		}
	}
	t.Logf("RabbitMQ %s: %d scheduled ids through a broker restart, a hopper SIGKILL and a broker SIGKILL: lost=%d, duplicates=%d, early beyond %s: %d",
		rabbit.Version(), n, a.lost, a.duplicates(), scheduleStep/2, early)
	t.Logf("first delivery against due time, all ids: %s", spread(offs))
	t.Logf("first delivery against due time, ids due after the faults: %s", spread(after))
}

// spread is the earliest, median, 99th percentile and latest of offs.
func spread(offs []time.Duration) string {
	if len(offs) == 0 {
		return "none"
	}
	s := append([]time.Duration(nil), offs...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	q := func(p float64) float64 { return s[min(len(s)-1, int(p*float64(len(s))))].Seconds() }
	return fmt.Sprintf("n=%d earliest %+.3fs median %+.3fs p99 %+.3fs latest %+.3fs", len(s), s[0].Seconds(), q(0.5), q(0.99), s[len(s)-1].Seconds())
}

// waitParked waits until the parking queues hold at least k messages.
func (r *run) waitParked(k int) {
	r.t.Helper()
	r.waitHeld(k, "the parking queues", r.q.isParking)
}
