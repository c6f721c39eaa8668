package faults

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/msg"
)

// orderedKeys is the number of ordering keys of the ordered scenario: the
// ids are spread over them round-robin, so each key's messages are
// interleaved with every other key's in the queue.
const orderedKeys = 40

// TestFaultOrdered: messages with an ordering key (the message id up to
// its first "-") through the seeded mix of app answers, a Hopper SIGKILL
// with deliveries in flight, a broker restart and an app crash. Every id
// must end as its script says, and for every key the app's first 2xx of
// each message come in publish order: a failing message is retried in
// place and holds its key, and whatever a fault hands back to the broker
// comes back to Hopper ahead of the messages behind it.
func TestFaultOrdered(t *testing.T) { ordered(t, "ordered", "classic") }

// TestFaultOrderedQuorum is the ordered scenario on quorum queues.
func TestFaultOrderedQuorum(t *testing.T) { ordered(t, "ordered-quorum", "quorum") }

func ordered(t *testing.T, name, queueType string) {
	n := messageCount(t)
	seed := uint64(envInt(t, "HOPPER_FAULTS_SEED", 1))
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("k%02d-%06d", i%orderedKeys, i)
	}
	scripts := newScripts(ids, seed, maxAttempts)
	app := startApp(t, scripts)
	cfg := hopperConfig{QueueType: queueType, Extra: "consumer:\n  orderingKey: \"messageId:-\"\n"}
	var ps publishStats
	r := beginPrefilled(t, name, app, cfg, func(q string) { ps = publishInOrder(t, q, ids) })
	r.step("N=%d over %d keys, scripts seeded with %d", n, orderedKeys, seed)

	r.waitDelivered(n / 4)
	r.killHopper(300 * time.Millisecond)

	r.waitDelivered(n / 2)
	r.restartBroker()

	r.waitDelivered(3 * n / 4)
	r.crashApp(time.Second)

	// Every id's last scripted answer first: a quorum queue's message
	// count, which settling reads, can show 0 for seconds after a broker
	// restart while it still holds messages.
	r.waitScripted(scripts)
	done := make(chan publishStats, 1)
	done <- ps
	a := r.finish(done)
	a.report(t)
	checkScripts(t, a, scripts)
	checkKeyOrder(t, r.app.snapshot())

	ev := r.hopper.eventCounts("BROKER_RECONNECT", "ORDER_BROKEN", "ORDERED_HOLD_EXHAUSTED")
	t.Logf("hopper: %d starts, %d SIGKILLs (%d with a delivery in flight), app crashed %d times; events %v",
		r.hopper.starts, r.hopper.kills, r.killed, r.app.crashCount(), ev)
	if ev["BROKER_RECONNECT"] == 0 {
		t.Error("no BROKER_RECONNECT logged: the broker restart was not exercised")
	}
	if r.killed == 0 {
		t.Error("no SIGKILL hit a delivery in flight")
	}
	if ev["ORDER_BROKEN"]+ev["ORDERED_HOLD_EXHAUSTED"] != 0 {
		t.Errorf("hopper reported order broken: %v", ev)
	}
}

// publishInOrder publishes the ids one at a time, each confirmed before the
// next, so that the queue holds them in the order given.
func publishInOrder(t *testing.T, queue string, ids []string) publishStats {
	t.Helper()
	pub := broker.NewPublisher(broker.PublisherOptions{
		Options: brokerOptions("faults-ordered-publisher"), Channels: 1, ConfirmTimeout: 5 * time.Second})
	defer pub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	began := time.Now()
	ps := publishStats{confirmed: map[string]bool{}}
	for _, id := range ids {
		m := &msg.Message{MessageID: id, ContentType: "text/plain", DeliveryMode: 2,
			Headers: map[string]any{}, Body: []byte("fault-suite " + id)}
		if err := pub.Publish(ctx, queue, m); err != nil {
			t.Fatalf("publish %s: %v", id, err)
		}
		ps.confirmed[id] = true
	}
	ps.took = time.Since(began)
	return ps
}

// checkKeyOrder checks that, per key, the first 2xx of each message came
// in publish order (the number after the key).
func checkKeyOrder(t *testing.T, recs []record) {
	t.Helper()
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].At.Before(recs[j].At) })
	acked := map[string]bool{}
	last := map[string]int{}
	var bad []string
	for _, rec := range recs {
		if rec.Status < 200 || rec.Status > 299 || acked[rec.ID] {
			continue
		}
		acked[rec.ID] = true
		key, num, _ := strings.Cut(rec.ID, "-")
		seq, err := strconv.Atoi(num)
		if err != nil {
			t.Fatalf("id %q: %v", rec.ID, err)
		}
		if prev, ok := last[key]; ok && seq < prev {
			bad = append(bad, fmt.Sprintf("%s after %s-%06d", rec.ID, key, prev))
		}
		last[key] = max(last[key], seq)
	}
	t.Logf("per-key order: %d messages answered 2xx over %d keys, %d out of order", len(acked), len(last), len(bad))
	if len(bad) > 0 {
		t.Errorf("first 2xx out of publish order within a key: %s", sample(bad, 10))
		// The first pair's stories, for the post-mortem: every request of
		// each, with its attempt, requeue count, answer and time.
		first, _, _ := strings.Cut(bad[0], " ")
		key, _, _ := strings.Cut(first, "-")
		later := fmt.Sprintf("%s-%06d", key, last[key])
		if i := strings.LastIndex(bad[0], " after "); i >= 0 {
			later = bad[0][i+len(" after "):]
		}
		for _, id := range []string{first, later} {
			var parts []string
			for _, rec := range recs {
				if rec.ID == id {
					parts = append(parts, fmt.Sprintf("a%d/r%d:%d@%s", rec.Attempt, rec.Requeues, rec.Status, rec.At.Format("15:04:05.000")))
				}
			}
			t.Logf("%s: %s", id, strings.Join(parts, " "))
		}
	}
}

// waitScripted waits until the app has given every id the answer that ends
// its script: a 2xx, the permanent 400, or the failure of the last attempt.
func (r *run) waitScripted(scripts map[string]*script) {
	r.t.Helper()
	ended := func(s *script, rec record) bool {
		switch s.want {
		case expectAck:
			return rec.Status >= 200 && rec.Status <= 299
		case expectNonRetriable:
			return rec.Status == 400
		}
		return rec.Attempt >= maxAttempts && rec.Status >= 500
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		done := map[string]bool{}
		for _, rec := range r.app.snapshot() {
			if s, ok := scripts[rec.ID]; ok && ended(s, rec) {
				done[rec.ID] = true
			}
		}
		if len(done) == len(scripts) {
			r.step("the app has given every id its last scripted answer")
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("after 5m the app has given %d of %d ids their last scripted answer", len(done), len(scripts))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
