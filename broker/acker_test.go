package broker

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// wire records what the acker sent and replays the broker's view: which
// tags are still unacked.
type wire struct {
	sent    []string
	unacked map[uint64]bool
	acked   map[uint64]bool
}

func newWire() *wire { return &wire{unacked: map[uint64]bool{}, acked: map[uint64]bool{}} }

func (w *wire) deliver(tag uint64) { w.unacked[tag] = true }

func (w *wire) Ack(tag uint64, multiple bool) error {
	w.sent = append(w.sent, fmt.Sprintf("ack %d %v", tag, multiple))
	if !multiple {
		if !w.unacked[tag] {
			return fmt.Errorf("PRECONDITION_FAILED unknown delivery tag %d", tag)
		}
		delete(w.unacked, tag)
		w.acked[tag] = true
		return nil
	}
	// The broker looks a multiple-ack's own tag up too: one it does not
	// hold unacked closes the channel.
	if !w.unacked[tag] {
		return fmt.Errorf("PRECONDITION_FAILED unknown delivery tag %d", tag)
	}
	for t := range w.unacked {
		if t <= tag {
			delete(w.unacked, t)
			w.acked[t] = true
		}
	}
	return nil
}

func (w *wire) Nack(tag uint64, _, _ bool) error {
	w.sent = append(w.sent, fmt.Sprintf("nack %d", tag))
	if !w.unacked[tag] {
		return fmt.Errorf("PRECONDITION_FAILED unknown delivery tag %d", tag)
	}
	delete(w.unacked, tag)
	return nil
}

// delivered is an acker on a fresh wire with deliveries 1..n registered.
func delivered(n uint64) (*wire, *acker) {
	w := newWire()
	a := newAcker(w)
	for tag := uint64(1); tag <= n; tag++ {
		w.deliver(tag)
		a.register(tag)
	}
	return w, a
}

// TestAckerNeverAcksOutstanding drives random settle orders and checks,
// after every flush, that no delivery the app has not settled was acked,
// and that every ack reaches the wire after a final flush.
func TestAckerNeverAcksOutstanding(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 7))
		w := newWire()
		a := newAcker(w)
		a.maxBatch = 1 + rng.IntN(10)
		now := time.Unix(0, 0)
		var outstanding []uint64
		decided := map[uint64]string{}
		next := uint64(1)
		for step := 0; step < 300; step++ {
			switch r := rng.IntN(10); {
			case r < 4: // a delivery arrives
				w.deliver(next)
				a.register(next)
				outstanding = append(outstanding, next)
				next++
			case r < 8 && len(outstanding) > 0: // settle a random one
				i := rng.IntN(len(outstanding))
				tag := outstanding[i]
				outstanding = append(outstanding[:i], outstanding[i+1:]...)
				if rng.IntN(5) == 0 {
					decided[tag] = "nack"
					if err := a.nack(tag, true); err != nil {
						t.Fatalf("seed %d: nack: %v", seed, err)
					}
				} else {
					decided[tag] = "ack"
					if err := a.ack(tag, now); err != nil {
						t.Fatalf("seed %d: ack: %v", seed, err)
					}
				}
			default:
				now = now.Add(time.Duration(rng.IntN(30)) * time.Millisecond)
				if err := a.flush(now, false); err != nil {
					t.Fatalf("seed %d: flush: %v", seed, err)
				}
			}
			for _, tag := range outstanding {
				if w.acked[tag] || !w.unacked[tag] {
					t.Fatalf("seed %d: outstanding delivery %d was settled on the wire: %v", seed, tag, w.sent)
				}
			}
			for tag, d := range decided {
				if d == "nack" && w.acked[tag] {
					t.Fatalf("seed %d: nacked delivery %d was acked", seed, tag)
				}
			}
		}
		if err := a.flush(now, true); err != nil {
			t.Fatal(err)
		}
		for tag, d := range decided {
			if d == "ack" && !w.acked[tag] {
				t.Fatalf("seed %d: ack of %d never sent", seed, tag)
			}
		}
	}
}

// TestAckerCoalesces: in-order acks become one multiple-ack.
func TestAckerCoalesces(t *testing.T) {
	w, a := delivered(10)
	now := time.Unix(0, 0)
	for tag := uint64(1); tag <= 10; tag++ {
		if err := a.ack(tag, now); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.flush(now, false); err != nil {
		t.Fatal(err)
	}
	if len(w.sent) != 1 || w.sent[0] != "ack 10 true" {
		t.Fatalf("sent %v, want one multiple-ack", w.sent)
	}
}

// TestAckerWaitsBehindSlowDelivery: acks behind a delivery still in
// progress wait, then go out one by one after maxWait.
func TestAckerWaitsBehindSlowDelivery(t *testing.T) {
	w, a := delivered(3)
	now := time.Unix(0, 0)
	a.ack(2, now)                             //nolint:errcheck // fake wire
	a.ack(3, now)                             //nolint:errcheck // fake wire
	a.flush(now.Add(time.Millisecond), false) //nolint:errcheck // fake wire
	if len(w.sent) != 0 {
		t.Fatalf("acked past the outstanding delivery 1: %v", w.sent)
	}
	a.flush(now.Add(a.maxWait), false) //nolint:errcheck // fake wire
	if len(w.sent) != 2 || w.sent[0] != "ack 2 false" || w.sent[1] != "ack 3 false" || !w.unacked[1] {
		t.Fatalf("sent %v", w.sent)
	}
}

// TestAckerSendsReadyAcksOnRequest: a group's acks go out as one
// multiple-ack when the caller says the group is settled, however few,
// while acks above a delivery still outstanding keep waiting.
func TestAckerSendsReadyAcksOnRequest(t *testing.T) {
	w, a := delivered(6)
	now := time.Unix(0, 0)
	for _, tag := range []uint64{1, 2, 3, 5, 6} { // 4 still at the app
		if err := a.ack(tag, now); err != nil {
			t.Fatal(err)
		}
	}
	if len(w.sent) != 0 {
		t.Fatalf("sent %v before asked, with fewer acks than maxBatch", w.sent)
	}
	if err := a.sendReady(); err != nil {
		t.Fatal(err)
	}
	if len(w.sent) != 1 || w.sent[0] != "ack 3 true" || !w.unacked[4] || !w.unacked[5] {
		t.Fatalf("sent %v, want one multiple-ack up to 3", w.sent)
	}
	if held, _ := a.heldOver(10, nil); held != 1 {
		t.Fatalf("held %d, want 1 (delivery 4)", held)
	}
}

// TestAckerSettlesTagsRegisteredOutOfOrder: a settle is marked even for a
// tag registered out of the channel's order, so the acks behind it still
// go out and the count of held deliveries stays true.
func TestAckerSettlesTagsRegisteredOutOfOrder(t *testing.T) {
	w := newWire()
	a := newAcker(w)
	for _, tag := range []uint64{1, 3, 2, 4} {
		w.deliver(tag)
		a.register(tag)
	}
	for _, tag := range []uint64{1, 2, 3} {
		if err := a.ack(tag, time.Unix(0, 0)); err != nil {
			t.Fatal(err)
		}
	}
	if held, _ := a.heldOver(10, nil); held != 1 {
		t.Fatalf("held %d, want 1 (delivery 4)", held)
	}
	if err := a.sendReady(); err != nil {
		t.Fatal(err)
	}
	if len(w.sent) != 1 || w.sent[0] != "ack 3 true" || !w.unacked[4] {
		t.Fatalf("sent %v, want one multiple-ack up to 3", w.sent)
	}
}
