package backoff

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestBackoffSteps: every wait is in the upper half of a step that doubles
// from Min to Max (the library may round up by a nanosecond), and Reset
// starts over.
func TestBackoffSteps(t *testing.T) {
	for range 50 {
		b := Backoff{Min: time.Second, Max: 8 * time.Second}
		for i, step := range []time.Duration{1, 2, 4, 8, 8, 8} {
			step *= time.Second
			got := b.Next()
			if got < step/2 || got > step+time.Nanosecond {
				t.Fatalf("wait %d: %s, want within [%s, %s]", i, got, step/2, step)
			}
		}
		b.Reset()
		if got := b.Next(); got > time.Second+time.Nanosecond {
			t.Fatalf("after Reset: %s", got)
		}
	}
}

func TestBackoffDefaults(t *testing.T) {
	var b Backoff
	if got := b.Next(); got < 250*time.Millisecond || got > 500*time.Millisecond+time.Nanosecond {
		t.Fatalf("zero Backoff waits %s", got)
	}
}

func TestSleepEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep on a done context = %v", err)
	}
	if err := Sleep(context.Background(), time.Nanosecond); err != nil {
		t.Fatal(err)
	}
}
