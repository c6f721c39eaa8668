package faults

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// orderedBatchHold is the delay tier of the ordered-batch scenario: how
// long the failed head of a batch is held in place before it goes again.
// It is long beside what closing the broker's connections takes, so that
// the close lands while the head is held, whatever the machine's speed.
const orderedBatchHold = 10 * time.Second

// TestFaultOrderedBatch: an ordered queue (consumer.ordered) delivered in
// batches, and the broker closing every connection while the head of a
// batch is held in place for its retry. The broker puts the batch's
// messages back and redelivers them on the new channel; the held batch can
// no longer be settled, so Hopper must not send it again: no request may
// reach the app, once Hopper has consumed again, with a message it had
// been handed before the close and that the broker did not hand out anew
// (Hopper-Redelivered false). Every id must end as its script says (one
// message fails its first attempt, the others succeed at once), the last
// 2xx of the messages in publish order, nothing lost.
func TestFaultOrderedBatch(t *testing.T) {
	n := messageCount(t)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("q-%06d", i) // one key for checkKeyOrder: the whole queue
	}
	victim := ids[n/2]
	scripts := make(map[string]*script, n)
	for _, id := range ids {
		scripts[id] = &script{final: answer2xx, want: expectAck}
	}
	scripts[victim].fails = []behavior{answer503}
	app := startApp(t, scripts)
	cfg := hopperConfig{Extra: fmt.Sprintf("app:\n  url: %q\nconsumer:\n  ordered: true\n  batch: {maxMessages: 8}\nretry:\n  tiers: [%s]\n",
		app.BatchURL(), orderedBatchHold)}
	var ps publishStats
	r := beginPrefilled(t, "ordered-batch", app, cfg, func(q string) { ps = publishInOrder(t, q, ids) })
	r.step("N=%d in one ordered queue, batches of up to 8; %s fails its first attempt and is held %s", n, victim, orderedBatchHold)

	// The broker closes every connection once the victim's first attempt
	// has failed: its batch is held in place.
	var failedAt time.Time
	for end := time.Now().Add(3 * time.Minute); failedAt.IsZero(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the app never failed %s's first attempt", victim)
		}
		for _, rec := range r.app.snapshot() {
			if rec.ID == victim && rec.Status == 503 {
				failedAt = rec.At
			}
		}
	}
	r.step("%s failed, its batch held in place", victim)
	before := map[string]bool{}
	for _, rec := range r.app.snapshot() {
		before[rec.ID] = true
	}
	started := r.hopper.eventCounts("CONSUMER_STARTED")["CONSUMER_STARTED"]
	if err := rabbit.CloseAllConnections(); err != nil {
		t.Fatalf("close the broker's connections: %v", err)
	}
	closedIn := time.Since(failedAt)
	r.step("the broker closed every connection, %s after the failure", closedIn.Round(time.Millisecond))
	if closedIn >= orderedBatchHold {
		t.Fatalf("the close came %s after the failure, past the hold of %s: the fault did not land under the held batch", closedIn, orderedBatchHold)
	}
	for end := time.Now().Add(time.Minute); r.hopper.eventCounts("CONSUMER_STARTED")["CONSUMER_STARTED"] == started; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("hopper did not consume again within a minute of the close")
		}
	}
	consuming := time.Now()
	r.step("hopper consuming again")

	r.waitScripted(scripts)
	done := make(chan publishStats, 1)
	done <- ps
	a := r.finish(done)
	a.report(t)
	checkScripts(t, a, scripts)
	recs := r.app.snapshot()
	checkLastOrder(t, recs)

	var stale []string
	var redelivered time.Time
	for _, rec := range recs {
		if rec.ID == victim && rec.Redelivered && redelivered.IsZero() {
			redelivered = rec.At
		}
		if rec.At.Before(consuming) {
			continue
		}
		if before[rec.ID] && !rec.Redelivered {
			stale = append(stale, fmt.Sprintf("%s (attempt %d, +%s)", rec.ID, rec.Attempt, rec.At.Sub(consuming).Round(time.Millisecond)))
		}
	}
	if len(stale) > 0 {
		t.Errorf("%d request(s), after hopper consumed again, carried a message of the closed channel: %s", len(stale), sample(stale, 10))
	}
	if redelivered.IsZero() {
		t.Errorf("the app never got %s as the broker redelivered it", victim)
	} else {
		r.step("the redelivered %s reached the app %s after its first failure (its hold: %s)",
			victim, redelivered.Sub(failedAt).Round(time.Millisecond), orderedBatchHold)
	}
	ev := r.hopper.eventCounts("BROKER_RECONNECT", "ORDER_BROKEN", "ORDERED_HOLD_EXHAUSTED", "SETTLE_FAILED")
	t.Logf("events %v", ev)
	if ev["BROKER_RECONNECT"] == 0 {
		t.Error("no BROKER_RECONNECT logged: the connections' close was not exercised")
	}
	if ev["ORDER_BROKEN"]+ev["ORDERED_HOLD_EXHAUSTED"] != 0 {
		t.Errorf("hopper reported order broken: %v", ev)
	}
}

// checkLastOrder checks that, per key, the last 2xx of each message came in
// publish order (the number after the key). In an ordered batch the app
// may answer an entry 2xx before the failed entry ahead of it (the entry
// is not acked and goes again with that one), so its first 2xx may come
// early; the answer Hopper acks on is the last, and those come in order.
func checkLastOrder(t *testing.T, recs []record) {
	t.Helper()
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].At.Before(recs[j].At) })
	last := map[string]int{} // id -> index in recs of its last 2xx
	for i, rec := range recs {
		if rec.Status >= 200 && rec.Status <= 299 {
			last[rec.ID] = i
		}
	}
	byKey := map[string]int{}
	var bad []string
	for i, rec := range recs {
		if last[rec.ID] != i || rec.Status < 200 || rec.Status > 299 {
			continue
		}
		key, num, _ := strings.Cut(rec.ID, "-")
		seq, err := strconv.Atoi(num)
		if err != nil {
			t.Fatalf("id %q: %v", rec.ID, err)
		}
		if prev, ok := byKey[key]; ok && seq < prev {
			bad = append(bad, fmt.Sprintf("%s after %s-%06d", rec.ID, key, prev))
		}
		byKey[key] = max(byKey[key], seq)
	}
	t.Logf("per-key order: %d messages last answered 2xx over %d keys, %d out of order", len(last), len(byKey), len(bad))
	if len(bad) > 0 {
		t.Errorf("last 2xx out of publish order within a key: %s", sample(bad, 10))
	}
}
