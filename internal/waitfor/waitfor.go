// Package waitfor is the one way Hopper's tests wait: for observable state,
// polled, with a bound that fails the test and says what never happened.
// Tests never sleep to let something happen.
package waitfor

import (
	"testing"
	"time"
)

// Poll is how often a condition is checked.
const Poll = 20 * time.Millisecond

// Until polls cond until it holds, and fails t after timeout naming what
// it waited for.
func Until(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(Poll)
	}
}
