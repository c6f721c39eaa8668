package schedule

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func TestSteps(t *testing.T) {
	p := Policy{Step: time.Second, Max: 10 * time.Second}
	got := p.Steps()
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}
	if len(got) != len(want) {
		t.Fatalf("steps %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("steps %v, want %v", got, want)
		}
	}
	if n := len((Policy{Step: time.Second, Max: 24 * time.Hour}).Steps()); n != 17 {
		t.Fatalf("a day in steps of 1s takes %d queues, want 17 (1s … 65536s)", n)
	}
}

func TestDecide(t *testing.T) {
	p := Policy{Step: time.Second, Max: time.Hour}
	at := func(d time.Duration) When { return When{Due: t0.Add(d)} }
	cases := []struct {
		name string
		p    Policy
		w    When
		act  Action
		step time.Duration
		due  time.Time
	}{
		{"no schedule", p, When{}, Deliver, 0, time.Time{}},
		{"past", p, at(-time.Minute), Deliver, 0, t0.Add(-time.Minute)},
		{"now", p, at(0), Deliver, 0, t0},
		{"under half a step", p, at(499 * time.Millisecond), Deliver, 0, t0.Add(499 * time.Millisecond)},
		{"half a step: one step, late rather than early", p, at(500 * time.Millisecond), Park, time.Second, t0.Add(500 * time.Millisecond)},
		{"one step", p, at(time.Second), Park, time.Second, t0.Add(time.Second)},
		{"between steps: the shorter", p, at(3999 * time.Millisecond), Park, 2 * time.Second, t0.Add(3999 * time.Millisecond)},
		{"a power of two", p, at(64 * time.Second), Park, 64 * time.Second, t0.Add(64 * time.Second)},
		{"the longest step", p, at(time.Hour), Park, 2048 * time.Second, t0.Add(time.Hour)},
		{"past the longest: DLQ", p, at(time.Hour + time.Millisecond), TooFar, 0, t0.Add(time.Hour + time.Millisecond)},
		{"past the longest: pulled in", Policy{Step: time.Second, Max: time.Hour, PastMax: AtLongest},
			at(48 * time.Hour), Park, 2048 * time.Second, t0.Add(time.Hour)},
		{"pinned beyond max stays", p, When{Due: t0.Add(2 * time.Hour), Pinned: true}, Park, 2048 * time.Second, t0.Add(2 * time.Hour)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := c.p.Decide(c.w, t0)
			if d.Action != c.act || d.Step != c.step || !d.Due.Equal(c.due) {
				t.Fatalf("Decide = %v step %s due %s, want %v step %s due %s", d.Action, d.Step, d.Due, c.act, c.step, c.due)
			}
			if !c.w.Due.IsZero() && d.Left != c.w.Due.Sub(t0) && c.p.PastMax == DeadLetter {
				t.Fatalf("left %s, want %s", d.Left, c.w.Due.Sub(t0))
			}
		})
	}
}

// TestLadderReachesDue follows messages through the ladder on a clock
// that each hop moves by the parking step plus the broker's latency, and
// checks that every delay from the shortest to the longest is delivered
// within half a step plus one hop's latency of its due time, in no more
// hops than the ladder has steps, plus one.
func TestLadderReachesDue(t *testing.T) {
	const hop = 30 * time.Millisecond // a hop's latency, larger than measured
	for _, p := range []Policy{
		{Step: time.Second, Max: 24 * time.Hour},
		{Step: 250 * time.Millisecond, Max: 10 * time.Minute},
	} {
		steps := len(p.Steps())
		worst := time.Duration(0)
		for delay := p.Step / 2; delay <= p.Max; delay = delay*3/2 + 7*time.Millisecond {
			now, due := t0, t0.Add(delay)
			w := When{Due: due}
			hops := 0
			for {
				d := p.Decide(w, now)
				if d.Action == TooFar {
					t.Fatalf("delay %s refused as too far", delay)
				}
				if d.Action == Deliver {
					break
				}
				hops++
				if hops > steps+1 {
					t.Fatalf("delay %s: %d hops, more than %d steps + 1", delay, hops, steps)
				}
				now = now.Add(d.Step + hop)
				w = When{Due: d.Due, Pinned: true}
			}
			off := now.Sub(due)
			if off < -p.Step/2 || off > p.Step/2+hop {
				t.Fatalf("step %s delay %s: delivered %s from due, want within -%s … +%s", p.Step, delay, off, p.Step/2, p.Step/2+hop)
			}
			worst = max(worst, off)
		}
		t.Logf("step %s, max %s: %d steps, latest delivery %s after due", p.Step, p.Max, steps, worst)
	}
}

func TestValidate(t *testing.T) {
	if err := (Policy{Step: time.Second, Max: time.Minute}).Validate(); err != nil {
		t.Fatal(err)
	}
	if err := (Policy{Step: 0, Max: 0}).Validate(); err == nil {
		t.Fatal("a zero step was accepted")
	}
	if err := (Policy{Step: time.Minute, Max: time.Second}).Validate(); err == nil {
		t.Fatal("a max under the step was accepted")
	}
}
