package sidecar

import "testing"

func TestNextPrefetch(t *testing.T) {
	cases := []struct {
		cur, want, next int
		change          bool
	}{
		{64, 64, 64, false},
		{64, 90, 64, false}, // a small rise: keep the consumer
		{64, 96, 96, true},  // half again as large
		{64, 33, 64, false},
		{64, 32, 32, true}, // halved
		{0, 40, 40, true},
	}
	for _, c := range cases {
		next, change := nextPrefetch(c.cur, c.want)
		if next != c.next || change != c.change {
			t.Errorf("nextPrefetch(%d, %d) = %d, %v; want %d, %v", c.cur, c.want, next, change, c.next, c.change)
		}
	}
}

func TestBodySizes(t *testing.T) {
	var b bodySizes
	b.observe(0, 0)
	if b.avg != 0 {
		t.Fatalf("avg %g before any message, want 0", b.avg)
	}
	b.observe(10, 10_000) // 1000 bytes each
	if b.avg != 1000 {
		t.Fatalf("avg %g, want 1000", b.avg)
	}
	b.observe(10, 10_000) // nothing new: unchanged
	if b.avg != 1000 {
		t.Fatalf("avg %g with no new message, want 1000", b.avg)
	}
	b.observe(20, 10_000+10*5000) // larger: followed at once
	if b.avg != 5000 {
		t.Fatalf("avg %g after larger messages, want 5000 at once", b.avg)
	}
	b.observe(30, 60_000+10*1000) // smaller: a quarter of the way
	if b.avg != 4000 {
		t.Fatalf("avg %g after smaller messages, want 4000", b.avg)
	}
}
