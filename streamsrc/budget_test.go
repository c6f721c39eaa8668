package streamsrc

import (
	"testing"
	"time"
)

func TestBudgetBoundsCountAndBytes(t *testing.T) {
	b := newBudget(3, 100)
	// One delivery always fits, however large: a message over the byte
	// budget must not stop the stream.
	if !b.take(500) {
		t.Fatal("the first delivery did not fit")
	}
	took := make(chan bool, 1)
	go func() { took <- b.take(10) }()
	select {
	case <-took:
		t.Fatal("a delivery fit beside 500 bytes with a budget of 100")
	case <-time.After(50 * time.Millisecond):
	}
	b.give(500)
	if !<-took {
		t.Fatal("take returned false after room was given back")
	}
	if !b.take(40) || !b.take(40) {
		t.Fatal("deliveries within both bounds did not fit")
	}
	if n, bytes := b.held(); n != 3 || bytes != 90 {
		t.Fatalf("held %d, %d bytes; want 3, 90", n, bytes)
	}
	// The count is full now: the next waits, and stop ends the wait
	// without counting it, as it ends every take after it.
	go func() { took <- b.take(1) }()
	select {
	case <-took:
		t.Fatal("a fourth delivery fit with a prefetch of 3")
	case <-time.After(50 * time.Millisecond):
	}
	b.stop()
	if <-took {
		t.Fatal("take counted a delivery after stop")
	}
	if b.take(0) {
		t.Fatal("take counted a delivery after stop")
	}
	if n, _ := b.held(); n != 3 {
		t.Fatalf("held %d after a stopped take, want 3", n)
	}
}

// A bound set lower keeps what is held and takes no more until the count
// is under it; set higher, it lets a waiting delivery in.
func TestBudgetCountFollows(t *testing.T) {
	b := newBudget(4, 0)
	for range 3 {
		if !b.take(1) {
			t.Fatal("a delivery within the bound did not fit")
		}
	}
	b.setCount(2)
	took := make(chan bool, 1)
	go func() { took <- b.take(1) }()
	b.give(1)
	select {
	case <-took:
		t.Fatal("a delivery fit with 2 held and a bound of 2")
	case <-time.After(50 * time.Millisecond):
	}
	b.setCount(3)
	if !<-took {
		t.Fatal("take returned false once the bound was raised")
	}
	if n, _ := b.held(); n != 3 {
		t.Fatalf("held %d, want 3", n)
	}
}
