package broker

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
)

// Whatever prefetch the breaker's Resume asks for, a consumer with a byte
// budget comes back no larger than the budget holds at the size of the
// bodies it has seen; before it has seen one it takes a single message.
func TestResumeCappedByBytes(t *testing.T) {
	const mib = 1 << 20
	c := NewConsumer(ConsumerOptions{Queue: "q", Prefetch: 64, PrefetchBytes: 16 * mib})
	if p := c.Prefetch(); p != 1 {
		t.Fatalf("prefetch %d before any body was seen, want 1", p)
	}
	c.received(4 * mib)
	if p := c.Prefetch(); p != 4 {
		t.Fatalf("prefetch %d with 4 MiB bodies under 16 MiB, want 4", p)
	}
	c.Pause()
	for _, ask := range []int{64, 0, 1000} {
		c.Resume(ask)
		if p := c.Prefetch(); p != 4 {
			t.Errorf("Resume(%d) after a pause runs with prefetch %d, want 4 (16 MiB / 4 MiB)", ask, p)
		}
		if _, p, _, _ := c.want(); p != 4 {
			t.Errorf("Resume(%d): the consume loop is told prefetch %d, want 4", ask, p)
		}
		c.Pause()
	}
	c.Resume(2)
	if p := c.Prefetch(); p != 2 {
		t.Errorf("Resume(2) runs with %d, want 2: a prefetch under the cap stands", p)
	}
	c.SetPrefetch(64)
	c.received(40 * mib)
	if p := c.Prefetch(); p != 1 {
		t.Errorf("prefetch %d after a body larger than the whole budget, want 1: delivered alone", p)
	}

	free := NewConsumer(ConsumerOptions{Queue: "q", Prefetch: 64})
	free.received(40 * mib)
	free.Pause()
	free.Resume(0)
	if p := free.Prefetch(); p != 64 {
		t.Errorf("without a budget Resume(0) runs with %d, want the configured 64", p)
	}
}

func TestBodySizeFollowsFromAbove(t *testing.T) {
	var b bodySize
	b.observe(1000)
	if b.est != 1000 || !b.seen {
		t.Fatalf("after one body of 1000: est %g seen %v", b.est, b.seen)
	}
	b.observe(5000)
	if b.est != 5000 {
		t.Fatalf("a larger body is taken at once: est %g, want 5000", b.est)
	}
	b.observe(1000)
	if b.est <= 1000 || b.est >= 5000 {
		t.Fatalf("one smaller body moves the estimate only part of the way: est %g", b.est)
	}
	for range 200 {
		b.observe(1000)
	}
	if b.est > 1100 {
		t.Errorf("after 200 bodies of 1000 the estimate is still %g", b.est)
	}
	b.observe(0)
	if b.est < 1 {
		t.Errorf("an empty body makes the estimate %g, want at least 1", b.est)
	}
}

func TestReplace(t *testing.T) {
	cases := []struct {
		cur, prefetch, requested int
		want                     bool
	}{
		{4, 4, 64, false},
		{4, 2, 64, true},    // the budget holds fewer: at once
		{64, 40, 40, true},  // the caller asks for less
		{1, 4, 64, true},    // the first body seen: from 1 to what fits
		{10, 12, 64, false}, // the estimate drifting down: keep
		{10, 15, 64, true},  // half again as large
		{10, 12, 12, true},  // the caller asked for exactly that
	}
	for _, c := range cases {
		if got := replace(c.cur, c.prefetch, c.requested); got != c.want {
			t.Errorf("replace(%d, %d, %d) = %v, want %v", c.cur, c.prefetch, c.requested, got, c.want)
		}
	}
}

// Against the broker: 256 KiB messages under a 1 MiB budget are never more
// than 4 unsettled at once, from the first delivery on and across a pause
// and a Resume that asks for 64, although every consumer the test lets run
// is kept full until its deliveries are settled.
func TestConsumerHoldsWithinBytes(t *testing.T) {
	needBroker(t)
	const n, size, budget = 40, 256 << 10, 1 << 20
	q := declareQueue(t, 0)
	pub := NewPublisher(PublisherOptions{Options: opts(), Channels: 2, ConfirmTimeout: 5 * time.Second})
	defer pub.Close()
	for i := range n {
		if err := pub.Publish(context.Background(), q, &msg.Message{MessageID: strconv.Itoa(i), Body: make([]byte, size)}); err != nil {
			t.Fatal(err)
		}
	}
	c := NewConsumer(ConsumerOptions{Options: opts(), Queue: q, Prefetch: 64, PrefetchBytes: budget})
	var (
		mu      sync.Mutex
		held    []*Delivery
		maxHeld int
		seen    = map[string]int{}
	)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- c.Run(ctx, func(d *Delivery) {
			mu.Lock()
			defer mu.Unlock()
			held = append(held, d)
			maxHeld = max(maxHeld, len(held))
			seen[d.Message().MessageID]++
		})
	}()
	defer func() {
		cancel()
		<-done
		c.Close()
	}()
	settleAll := func() int {
		mu.Lock()
		defer mu.Unlock()
		for _, d := range held {
			if err := d.Ack(); err != nil {
				t.Fatalf("ack %s: %v", d.Message().MessageID, err)
			}
		}
		k := len(held)
		held = nil
		return k
	}
	heldNow := func() int { mu.Lock(); defer mu.Unlock(); return len(held) }
	acked, paused := 0, false
	for acked < n {
		// Settle once the consumer is full, or when it has stopped taking
		// deliveries to wait for room.
		waitfor.Until(t, 30*time.Second, "the consumer full or waiting for room", func() bool {
			h := heldNow()
			return h > 0 && (h >= c.Prefetch() || !c.Active()) || acked+h >= n
		})
		if !paused && acked >= n/2 {
			// Pause while holding a full prefetch, then ask for 64.
			c.Pause()
			waitfor.Until(t, 10*time.Second, "the consumer paused", func() bool { return !c.Active() })
			c.Resume(64)
			paused = true
		}
		acked += settleAll()
	}
	mu.Lock()
	defer mu.Unlock()
	if maxHeld > budget/size {
		t.Errorf("%d deliveries of %d KiB unsettled at once, want at most %d (%d KiB budget)", maxHeld, size>>10, budget/size, budget>>10)
	}
	if maxHeld < budget/size {
		t.Errorf("at most %d unsettled at once: the budget holds %d, the consumer never filled it", maxHeld, budget/size)
	}
	for i := range n {
		if seen[strconv.Itoa(i)] != 1 {
			t.Errorf("message %d delivered %d times, want once", i, seen[strconv.Itoa(i)])
		}
	}
}

// A consumer waiting for room is told of the next settle, once; while
// enough room is left it is not asked to wait.
func TestAckerHeldOver(t *testing.T) {
	w := newWire()
	a := newAcker(w)
	for tag := uint64(1); tag <= 3; tag++ {
		w.deliver(tag)
		a.register(tag)
	}
	wake := make(chan struct{}, 1)
	if held, over := a.heldOver(1, wake); held != 3 || !over {
		t.Fatalf("heldOver(1) = %d, %v; want 3, true", held, over)
	}
	if err := a.ack(2, time.Now()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wake:
	default:
		t.Fatal("a settle while waiting for room did not wake the consumer")
	}
	if err := a.nack(1, true); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wake:
		t.Fatal("woken again without waiting again")
	default:
	}
	if held, over := a.heldOver(1, wake); held != 1 || over {
		t.Fatalf("heldOver(1) after two settles = %d, %v; want 1, false", held, over)
	}
	if err := a.flush(time.Now(), true); err != nil {
		t.Fatal(err)
	}
	if held, _ := a.heldOver(0, wake); held != 1 {
		t.Fatalf("held %d after the flush, want 1: tag 3 is still outstanding", held)
	}
}

// A large body is taken into one buffer of its size, by a consumer and by
// the tools' readers: grown frame by frame it cost about seven times the
// body in allocations, faster than the collector frees them, enough to
// take a 64 MiB container past its limit with one 8 MiB message held.
// What is allocated while the messages arrive is counted for the whole
// process, so the bound leaves room for the frames read (one body more)
// and what else runs meanwhile: 2.75 times the body measured by a
// consumer, 7.36 when the body grew frame by frame.
func TestLargeBodyInOneBuffer(t *testing.T) {
	needBroker(t)
	const n, size = 4, 8 << 20
	fill := func(t *testing.T) string {
		q := declareQueue(t, 0)
		pub := NewPublisher(PublisherOptions{Options: opts(), Channels: 1, ConfirmTimeout: 30 * time.Second})
		defer pub.Close()
		for i := range n {
			if err := pub.Publish(context.Background(), q, &msg.Message{MessageID: strconv.Itoa(i), Body: make([]byte, size)}); err != nil {
				t.Fatal(err)
			}
		}
		return q
	}
	// measure takes the first message (which starts a consumer), then
	// counts what is allocated while the others arrive, each settled
	// before the next is taken.
	type taken interface {
		Message() *msg.Message
		Ack() error
	}
	measure := func(t *testing.T, take func() (taken, error)) {
		d, err := take()
		if err != nil {
			t.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range n - 1 {
			if err := d.Ack(); err != nil {
				t.Fatal(err)
			}
			if d, err = take(); err != nil {
				t.Fatal(err)
			}
			if len(d.Message().Body) != size {
				t.Fatalf("body of %d bytes, want %d", len(d.Message().Body), size)
			}
		}
		runtime.ReadMemStats(&after)
		if err := d.Ack(); err != nil {
			t.Fatal(err)
		}
		per := float64(after.TotalAlloc-before.TotalAlloc) / float64((n-1)*size)
		t.Logf("allocated %.2f times the body per delivery", per)
		if per > 4 {
			t.Errorf("allocated %.2f times the body per delivery, want at most 4", per)
		}
	}
	t.Run("consumer", func(t *testing.T) {
		q := fill(t)
		c := NewConsumer(ConsumerOptions{Options: opts(), Queue: q, Prefetch: 1})
		got := make(chan *Delivery, n)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx, func(d *Delivery) { got <- d }) }()
		defer func() {
			cancel()
			<-done
			c.Close()
		}()
		measure(t, func() (taken, error) {
			select {
			case d := <-got:
				return d, nil
			case <-time.After(30 * time.Second):
				return nil, errors.New("no delivery within 30 s")
			}
		})
	})
	t.Run("exclusive", func(t *testing.T) {
		q := fill(t)
		e, err := OpenExclusive(context.Background(), opts(), q, 1)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		measure(t, func() (taken, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			d, ok, err := e.Next(ctx)
			if err == nil && !ok {
				err = errors.New("queue empty")
			}
			if err != nil {
				return nil, err
			}
			return d, nil
		})
	})
	t.Run("inspector", func(t *testing.T) {
		q := fill(t)
		in, err := OpenInspector(context.Background(), opts())
		if err != nil {
			t.Fatal(err)
		}
		defer in.Close()
		measure(t, func() (taken, error) {
			d, ok, err := in.Get(q)
			if err == nil && !ok {
				err = errors.New("queue empty")
			}
			if err != nil {
				return nil, err
			}
			return d, nil
		})
	})
}
