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
