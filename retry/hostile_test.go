package retry

import (
	"math"
	"testing"
	"time"
)

// Decide gets its counters from message headers. Whatever they hold, it
// must neither panic nor let a counter wrap: the attempt stays positive,
// the tier is one of the policy's, and the counters after the decision are
// never below the ones before it.
func TestDecideExtremeCounters(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	outcomes := []Outcome{
		{Kind: Response, Status: 500}, {Kind: Response, Status: 425}, {Kind: Response, Status: 400},
		{Kind: Timeout}, {Kind: Unavailable}, {Kind: Unavailable, Cut: true, Crashed: true}, {Kind: Cut},
		{Kind: Response, Status: 200, Override: "retry"}, {Kind: Response, Status: 200, Override: "requeue"},
	}
	for _, n := range []int{math.MaxInt, math.MaxInt - 1, math.MinInt, -1, 0, 1 << 30, math.MaxInt32} {
		for _, unlimited := range []bool{false, true} {
			for _, o := range outcomes {
				p := defaultPolicy()
				p.MaxCrashes = 3
				if unlimited {
					p.MaxAttempts, p.MaxRequeues, p.MaxCrashes = Unlimited, 0, 0
				}
				st := State{Retries: n, Requeues: n, Crashes: n}
				var d Decision
				func() {
					defer func() {
						if r := recover(); r != nil {
							t.Fatalf("Decide(counters %d, unlimited %v, %+v) panicked: %v", n, unlimited, o, r)
						}
					}()
					d = Decide(p, st, o, now, half)
				}()
				if st.Attempt() < 1 {
					t.Errorf("counters %d: attempt %d", n, st.Attempt())
				}
				if d.Retries < 0 || d.Requeues < 0 || d.Crashes < 0 {
					t.Errorf("counters %d, %+v: decision %+v has a negative counter", n, o, d)
				}
				if n >= 0 && (d.Retries < n || d.Requeues < n || d.Crashes < n) {
					t.Errorf("counters %d, %+v: decision %+v went backwards", n, o, d)
				}
				if d.Action == Retry && !hasTier(p.Tiers, d.Tier) {
					t.Errorf("counters %d, %+v: tier %v is not one of the policy's", n, o, d.Tier)
				}
			}
		}
	}
}

func hasTier(tiers []time.Duration, d time.Duration) bool {
	for _, t := range tiers {
		if t == d {
			return true
		}
	}
	return false
}

// A request the app took and then closed without an answer, while its
// health check kept passing, failed for this message: it is an attempt, so
// a message that always kills its connection ends in the DLQ instead of
// being returned for ever.
func TestDecideCutWhileHealthy(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cut := Outcome{Kind: Cut, Error: "connection closed"}
	if d := Decide(defaultPolicy(), State{}, cut, now, half); d.Action != Retry || d.Retries != 1 || d.Tier != time.Second {
		t.Fatalf("first cut: %+v, want a retry on the first tier", d)
	}
	if d := Decide(defaultPolicy(), State{Retries: 9}, cut, now, half); d.Action != DLQ || d.Reason != ReasonMaxAttempts || d.Retries != 10 {
		t.Fatalf("tenth cut: %+v, want the DLQ as max-attempts", d)
	}
	tbl, err := ParseTable(map[string]string{"cut": "dlq"})
	if err != nil {
		t.Fatal(err)
	}
	p := defaultPolicy()
	p.Table = Merge(DefaultTable(), tbl)
	if d := Decide(p, State{}, cut, now, half); d.Action != DLQ || d.Reason != ReasonNonRetriable {
		t.Fatalf("cut: dlq in the table: %+v", d)
	}
	for _, a := range []string{"return", "requeue", "ack"} {
		if _, err := ParseTable(map[string]string{"cut": a}); err == nil {
			t.Errorf("cut: %s accepted; a cut must spend an attempt or dead-letter", a)
		}
	}
}
