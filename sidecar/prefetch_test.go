package sidecar

import (
	"testing"
	"time"
)

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

func TestFollowerShrinksOnlyWhenTheLimitStaysLow(t *testing.T) {
	t0 := time.Unix(0, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	steps := []struct {
		ms, cur, want, next int
		change              bool
	}{
		{0, 240, 300, 240, false},  // a small rise: kept
		{100, 240, 400, 400, true}, // half again: at once
		{200, 400, 120, 400, false},
		{1000, 400, 190, 400, false},
		{1100, 400, 300, 400, false}, // back above half: the low spell ends
		{1200, 400, 100, 400, false}, // a new spell starts here
		{3100, 400, 150, 400, false},
		{3200, 400, 110, 150, true}, // 2 s low: down to the most it asked for
		{3300, 150, 60, 150, false},
		{3400, 150, 400, 400, true}, // a rise ends the spell at once
	}
	var f follower
	for _, s := range steps {
		next, change := f.next(s.cur, s.want, at(s.ms))
		if next != s.next || change != s.change {
			t.Errorf("at %d ms next(%d, %d) = %d, %v; want %d, %v", s.ms, s.cur, s.want, next, change, s.next, s.change)
		}
	}
}
