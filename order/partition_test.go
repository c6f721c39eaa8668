package order

import (
	"fmt"
	"testing"
)

// Preference spreads partitions over replicas without them knowing each
// other: for 64 partitions and 4 replicas, each replica is preferred for
// between a quarter and twice its fair share, over many sets of replica
// names; the value stays within 1..MaxPreference and is stable.
func TestPreferenceSpreads(t *testing.T) {
	const partitions, replicas = 64, 4
	for set := range 50 {
		wins := make([]int, replicas)
		for p := range partitions {
			q := fmt.Sprintf("orders.p%d", p)
			best, bestPref := -1, 0
			for r := range replicas {
				inst := fmt.Sprintf("hopper-7d9f-%d-%d", set, r)
				pref := Preference(inst, q)
				if pref < 1 || pref > MaxPreference {
					t.Fatalf("Preference(%s, %s) = %d, out of 1..%d", inst, q, pref, MaxPreference)
				}
				if pref != Preference(inst, q) {
					t.Fatal("Preference is not stable")
				}
				if pref > bestPref {
					best, bestPref = r, pref
				}
			}
			wins[best]++
		}
		for r, w := range wins {
			if fair := partitions / replicas; w < fair/4 || w > 2*fair {
				t.Errorf("set %d: replica %d preferred for %d of %d partitions (fair share %d)", set, r, w, partitions, fair)
			}
		}
	}
}
