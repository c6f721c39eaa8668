package streamsrc

import (
	"math/rand/v2"
	"sync"
	"testing"
)

func settledAt(t *testing.T, o *Offsets) int64 {
	t.Helper()
	off, ok := o.Settled()
	if !ok {
		return -1
	}
	return off
}

func TestOffsetsWatermarkWaitsForTheOldestUnsettled(t *testing.T) {
	o := NewOffsets()
	for off := int64(10); off < 15; off++ {
		if !o.Read(off) {
			t.Fatalf("Read(%d) refused", off)
		}
	}
	steps := []struct {
		settle int64
		want   int64
	}{
		{12, -1}, // 10 and 11 still out
		{14, -1},
		{10, 10}, // 11 holds the rest back
		{11, 12}, // 11 settles: 12 was already, 13 is not
		{13, 14},
	}
	for _, s := range steps {
		if !o.Settle(s.settle) {
			t.Fatalf("Settle(%d) = false", s.settle)
		}
		if got := settledAt(t, o); got != s.want {
			t.Fatalf("after Settle(%d): watermark %d, want %d", s.settle, got, s.want)
		}
	}
	if n := o.Pending(); n != 0 {
		t.Fatalf("Pending = %d after every offset settled", n)
	}
}

func TestOffsetsGapsHoldNothingBack(t *testing.T) {
	o := NewOffsets()
	for _, off := range []int64{3, 7, 8, 20} {
		o.Read(off)
	}
	o.Settle(3)
	o.Settle(8)
	if got := settledAt(t, o); got != 3 {
		t.Fatalf("watermark %d, want 3 (7 is out)", got)
	}
	o.Settle(7)
	if got := settledAt(t, o); got != 8 {
		t.Fatalf("watermark %d, want 8", got)
	}
	o.Settle(20)
	if got := settledAt(t, o); got != 20 {
		t.Fatalf("watermark %d, want 20", got)
	}
}

func TestOffsetsRefuseWhatWasReadAndDoubleSettles(t *testing.T) {
	o := NewOffsets()
	o.Read(5)
	o.Read(6)
	if o.Read(5) || o.Read(6) || o.Read(4) {
		t.Fatal("an offset read before (or below one read) was accepted again")
	}
	if next, _ := o.Next(); next != 7 {
		t.Fatalf("Next = %d, want 7", next)
	}
	if !o.Settle(5) || o.Settle(5) {
		t.Fatal("Settle(5) twice: want true then false")
	}
	if o.Settle(99) {
		t.Fatal("Settle of an offset never read = true")
	}
}

func TestOffsetsResumeAfterTheStoredOne(t *testing.T) {
	o := NewOffsets()
	if _, ok := o.Next(); ok {
		t.Fatal("Next known before anything was read")
	}
	o.Resume(41)
	if next, ok := o.Next(); !ok || next != 42 {
		t.Fatalf("Next = %d, %t; want 42", next, ok)
	}
	if got := settledAt(t, o); got != 41 {
		t.Fatalf("watermark %d, want the stored 41", got)
	}
	if o.Read(41) {
		t.Fatal("the stored offset was read again")
	}
	o.Read(42)
	o.Read(43)
	o.Settle(43)
	if got := settledAt(t, o); got != 41 {
		t.Fatalf("watermark %d passed the unsettled 42", got)
	}
}

// Out-of-order completions from many goroutines: whatever the order, the
// watermark never passes an unsettled offset, and ends at the last one.
func TestOffsetsConcurrentOutOfOrder(t *testing.T) {
	const n = 20000
	o := NewOffsets()
	for off := range int64(n) {
		o.Read(off * 2) // every other offset: gaps too
	}
	order := rand.Perm(n)
	unsettled := make([]bool, n)
	for i := range unsettled {
		unsettled[i] = true
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	work := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range work {
				mu.Lock()
				unsettled[i] = false
				mu.Unlock()
				o.Settle(int64(i) * 2)
				w := settledAt(t, o)
				mu.Lock()
				for j := 0; int64(j)*2 <= w; j++ {
					if unsettled[j] {
						mu.Unlock()
						t.Errorf("watermark %d passed unsettled offset %d", w, j*2)
						return
					}
				}
				mu.Unlock()
			}
		})
	}
	for _, i := range order[:n/10] {
		work <- i
	}
	// The rest without the full scan each time, which is quadratic.
	close(work)
	wg.Wait()
	for _, i := range order[n/10:] {
		o.Settle(int64(i) * 2)
	}
	if got := settledAt(t, o); got != (n-1)*2 {
		t.Fatalf("watermark %d at the end, want %d", got, (n-1)*2)
	}
	if p := o.Pending(); p != 0 {
		t.Fatalf("Pending = %d at the end", p)
	}
}
