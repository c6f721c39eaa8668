package broker

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestRunAckerNeverAcksUnsettled hands deliveries out in shuffled order (as
// an Exclusive does when pushed deliveries wait in the client's buffer
// behind a basic.get), holds some for good, nacks some and acks the rest in
// random order. After every step no delivery the caller has not acked may
// be acked on the wire, and after a final flush every ack must be there.
func TestRunAckerNeverAcksUnsettled(t *testing.T) {
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 11))
		w := newWire()
		a := newRunAcker(w, 1+rng.IntN(16), 2*time.Millisecond)
		now := time.Unix(0, 0)
		const n = 200
		for tag := uint64(1); tag <= n; tag++ {
			w.deliver(tag)
		}
		// Handed out in an order that is mostly ascending, with tags
		// overtaking each other.
		order := make([]uint64, 0, n)
		for tag := uint64(1); tag <= n; tag++ {
			order = append(order, tag)
		}
		for i := range order {
			if j := i + rng.IntN(6); j < len(order) {
				order[i], order[j] = order[j], order[i]
			}
		}
		decided := map[uint64]string{}
		var handed []uint64
		for len(order) > 0 || len(handed) > 0 {
			switch r := rng.IntN(10); {
			case r < 4 && len(order) > 0:
				handed = append(handed, order[0])
				order = order[1:]
			case r < 8 && len(handed) > 0:
				i := rng.IntN(len(handed))
				tag := handed[i]
				handed = append(handed[:i], handed[i+1:]...)
				switch k := rng.IntN(20); {
				case k == 0:
					decided[tag] = "hold"
				case k < 3:
					decided[tag] = "nack"
					if err := a.nack(tag, true); err != nil {
						t.Fatalf("seed %d: nack %d: %v", seed, tag, err)
					}
				default:
					decided[tag] = "ack"
					if err := a.ack(tag, now); err != nil {
						t.Fatalf("seed %d: ack %d: %v (sent %v)", seed, tag, err, w.sent)
					}
				}
			default:
				now = now.Add(time.Duration(rng.IntN(3)) * time.Millisecond)
				if err := a.flush(now, false); err != nil {
					t.Fatalf("seed %d: flush: %v (sent %v)", seed, err, w.sent)
				}
			}
			for tag := uint64(1); tag <= n; tag++ {
				if w.acked[tag] && decided[tag] != "ack" {
					t.Fatalf("seed %d: delivery %d (%q) was acked on the wire: %v", seed, tag, decided[tag], w.sent)
				}
			}
		}
		if err := a.flush(now, true); err != nil {
			t.Fatalf("seed %d: final flush: %v", seed, err)
		}
		for tag, d := range decided {
			if d == "ack" && !w.acked[tag] {
				t.Fatalf("seed %d: ack of %d never sent", seed, tag)
			}
			if d == "hold" && !w.unacked[tag] {
				t.Fatalf("seed %d: held delivery %d left the broker's unacked set", seed, tag)
			}
		}
		if a.unsentAcks() != 0 {
			t.Fatalf("seed %d: %d unsent on a live channel", seed, a.unsentAcks())
		}
	}
}

// TestRunAckerCoalesces: in-order acks go out as one multiple-ack per batch.
func TestRunAckerCoalesces(t *testing.T) {
	w := newWire()
	a := newRunAcker(w, 8, 2*time.Millisecond)
	now := time.Unix(0, 0)
	for tag := uint64(1); tag <= 20; tag++ {
		w.deliver(tag)
		if err := a.ack(tag, now); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.flush(now, false); err != nil {
		t.Fatal(err)
	}
	want := []string{"ack 8 true", "ack 16 true", "ack 20 true"}
	if !slices.Equal(w.sent, want) {
		t.Fatalf("sent %v, want %v", w.sent, want)
	}
}

// TestRunAckerPastAHold: a held delivery stops coalescing; the acks past it
// wait maxWait for the gap to close, then go out one by one, and the held
// one is never acked.
func TestRunAckerPastAHold(t *testing.T) {
	w := newWire()
	a := newRunAcker(w, 4, 2*time.Millisecond)
	now := time.Unix(0, 0)
	for tag := uint64(1); tag <= 6; tag++ {
		w.deliver(tag)
	}
	for _, tag := range []uint64{1, 2, 4, 5, 6} { // 3 held
		if err := a.ack(tag, now); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.flush(now.Add(time.Millisecond), false); err != nil {
		t.Fatal(err)
	}
	if len(w.sent) != 1 || w.sent[0] != "ack 2 true" || !w.unacked[4] {
		t.Fatalf("before maxWait sent %v, want only the run below the hold", w.sent)
	}
	if err := a.flush(now.Add(2*time.Millisecond), false); err != nil {
		t.Fatal(err)
	}
	if !w.acked[4] || !w.acked[5] || !w.acked[6] || w.acked[3] {
		t.Fatalf("after maxWait sent %v, want 4, 5 and 6 one by one and 3 held", w.sent)
	}
	// The hold is settled at last: the run passes the tags already sent
	// without a second ack for them.
	if err := a.ack(3, now); err != nil {
		t.Fatal(err)
	}
	w.deliver(7)
	if err := a.ack(7, now); err != nil {
		t.Fatal(err)
	}
	if err := a.flush(now, true); err != nil {
		t.Fatalf("flush after the gap closed: %v (sent %v)", err, w.sent)
	}
	if !w.acked[3] || !w.acked[7] {
		t.Fatalf("sent %v, want 3 and 7 acked", w.sent)
	}
}

// TestRunAckerCountsUnsent: acks held when the channel fails are counted,
// and the caller hears of the failure.
func TestRunAckerCountsUnsent(t *testing.T) {
	f := &failing{}
	a := newRunAcker(f, 100, 2*time.Millisecond)
	now := time.Unix(0, 0)
	for _, tag := range []uint64{1, 2, 3, 5} {
		if err := a.ack(tag, now); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.flush(now, true); err == nil {
		t.Fatal("flush on a failing channel returned no error")
	}
	if got := a.unsentAcks(); got != 4 {
		t.Fatalf("unsent %d, want 4", got)
	}
	if err := a.ack(6, now); err == nil {
		t.Fatal("ack after the channel failed returned no error")
	}
	b := newRunAcker(f, 100, 2*time.Millisecond)
	if err := b.ack(1, now); err != nil {
		t.Fatal(err)
	}
	b.abandon()
	if got := b.unsentAcks(); got != 1 {
		t.Fatalf("abandoned: unsent %d, want 1", got)
	}
}

// TestRunAckerRefusesTwice: settling a tag twice is a caller bug, reported.
func TestRunAckerRefusesTwice(t *testing.T) {
	w := newWire()
	a := newRunAcker(w, 4, 2*time.Millisecond)
	w.deliver(1)
	w.deliver(3)
	now := time.Unix(0, 0)
	for _, tag := range []uint64{1, 3} {
		if err := a.ack(tag, now); err != nil {
			t.Fatal(err)
		}
		if err := a.ack(tag, now); err == nil {
			t.Fatalf("second ack of %d accepted", tag)
		}
	}
}

type failing struct{}

func (failing) Ack(uint64, bool) error        { return errors.New("channel closed") }
func (failing) Nack(uint64, bool, bool) error { return errors.New("channel closed") }
