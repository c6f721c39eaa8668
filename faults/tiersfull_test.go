package faults

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
)

// TestFaultTiersFullRestarts: Hopper at its default tiers (quorum queues,
// which hand a retry back at least once) in front of a classic work
// queue, the broker stopped again and again while the tiers hold hundreds
// of confirmed retry copies: graceful restarts, then SIGKILLs of the node.
// Every message fails twice (409, a retry through the tiers) and then
// succeeds; each must end answered 2xx, lost=0.
//
// HOPPER_FAULTS_TIER_TYPE=classic runs it on classic tiers instead.
// Rounds: HOPPER_FAULTS_TIER_ROUNDS graceful restarts (default 2), then one
// SIGKILL per five of them (at least one); each round publishes
// HOPPER_FAULTS_N/2 messages. make tier-restarts runs 50 rounds.
func TestFaultTiersFullRestarts(t *testing.T) { tiersFull(t, "tiersfull", "classic") }

// TestFaultTiersFullRestartsQuorum is TestFaultTiersFullRestarts on a
// quorum work queue.
func TestFaultTiersFullRestartsQuorum(t *testing.T) {
	tiersFull(t, "tiersfull-quorum", "quorum")
}

func tiersFull(t *testing.T, name, queueType string) {
	graceful := envInt(t, "HOPPER_FAULTS_TIER_ROUNDS", 2)
	kills := max(1, graceful/5)
	per := max(100, messageCount(t)/2)
	rounds := graceful + kills
	var ids []string
	scripts := map[string]*script{}
	for i := range rounds * per {
		id := fmt.Sprintf("%s-%06d", name, i)
		ids = append(ids, id)
		scripts[id] = &script{fails: []behavior{answer409, answer409}, final: answer2xx, want: expectAck}
	}
	// Tiers long enough to hold a round's retries while the node stops,
	// short enough that the run keeps moving.
	extra := "retry:\n  tiers: [4s, 8s]\n"
	// HOPPER_FAULTS_TIER_TYPE=classic runs the scenario on classic tiers,
	// to see what that opt-in risks.
	tierType := os.Getenv("HOPPER_FAULTS_TIER_TYPE")
	if tierType != "" {
		extra += "queue:\n  tierType: " + tierType + "\n"
	}
	r := beginApp(t, name, startApp(t, scripts), hopperConfig{QueueType: queueType, Extra: extra})
	r.step("%d rounds of %d messages, each failing twice (409) through the tiers, then 2xx; %d graceful restarts, then %d SIGKILLs",
		rounds, per, graceful, kills)

	all := publishStats{confirmed: map[string]bool{}}
	inTiers := make([]int, 0, rounds)
	for round := range rounds {
		batch := ids[round*per : (round+1)*per]
		base := r.app.received()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		ps := publishPaced(ctx, t, r.q.work, batch, 2*time.Second)
		cancel()
		for id := range ps.confirmed {
			all.confirmed[id] = true
		}
		all.failures += ps.failures
		all.took += ps.took
		// The tiers fill as the app refuses each message's first
		// attempts. The stop comes once a quarter of the round has come
		// back from the first tier for its second attempt, so that copies
		// are on their way from a tier to the work queue and to Hopper as
		// well as waiting in the tiers, which must hold a tenth of the
		// round.
		r.waitDelivered(base + per + per/4)
		held := r.waitInTiers(per / 10)
		inTiers = append(inTiers, held)
		if round < graceful {
			r.restartBroker()
		} else {
			r.killBroker()
		}
	}
	r.step("retry copies in the tiers at each stop: %v", inTiers)
	done := make(chan publishStats, 1)
	done <- all
	a := r.finish(done)
	a.report(t)
	checkScripts(t, a, scripts)
	if a.dlq != 0 {
		t.Errorf("%d message(s) dead-lettered, want none (by reason %v)", a.dlq, a.byReason)
	}
	total := 0
	for _, n := range inTiers {
		total += n
	}
	if tierType == "" {
		tierType = "default"
	}
	t.Logf("RabbitMQ %s, %s work queue, %s tiers: %d graceful restarts and %d SIGKILLs with %d retry copies in the tiers in all (at least %d each time): lost=%d",
		rabbit.Version(), queueType, tierType, graceful, kills, total, per/10, a.lost)
}

// waitInTiers waits until the scenario's tier queues hold at least k
// messages together and returns how many they held.
func (r *run) waitInTiers(k int) int {
	r.t.Helper()
	return r.waitHeld(k, "the tiers", func(name string) bool { return strings.HasPrefix(name, r.q.work+".retry.") })
}

// waitHeld waits until the queues of the scenario that match hold at least
// k messages together and returns how many they held. Each queue is
// counted by a passive declare on one connection (a quorum queue's listed
// count lags behind it), plus its dead letters under way.
func (r *run) waitHeld(k int, what string, match func(name string) bool) int {
	r.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	var in *broker.Inspector
	defer func() {
		if in != nil {
			in.Close()
		}
	}()
	var lastErr error
	for {
		held, err := held(&in, match)
		if err != nil {
			lastErr = err
			if in != nil {
				in.Close()
				in = nil
			}
		}
		if held >= k {
			r.step("%s hold %d messages", what, held)
			return held
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s held %d messages after 2m, waiting for %d (last error reading them: %v)", what, held, k, lastErr)
		}
		time.Sleep(50 * time.Millisecond) // the poll interval of a wait for observable state
	}
}

// held counts what the queues that match hold: each by a passive declare
// on *in (opened when nil), plus its dead letters under way.
func held(in **broker.Inspector, match func(name string) bool) (int, error) {
	d, err := depths()
	if err != nil {
		return 0, err
	}
	if *in == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if *in, err = broker.OpenInspector(ctx, brokerOptions("faults-held")); err != nil {
			return 0, err
		}
	}
	dlx, err := dlxByQueue()
	if err != nil {
		return 0, err
	}
	n := 0
	for name := range d {
		if !match(name) {
			continue
		}
		ready, err := (*in).Depth(name)
		if err != nil {
			return 0, fmt.Errorf("depth of %s: %w", name, err)
		}
		n += ready + dlx[name]
	}
	return n, nil
}

// killBroker SIGKILLs the broker's node, the hard fault, and starts it
// again on the same data.
func (r *run) killBroker() {
	r.t.Helper()
	r.step("broker SIGKILLed")
	if err := rabbit.KillNode(); err != nil {
		r.t.Fatalf("broker kill: %v", err)
	}
	if err := rabbit.StartNode(); err != nil {
		r.t.Fatalf("broker start after kill: %v", err)
	}
	r.settleExtra = dlxConfirmTimeout(r.t)
	r.step("broker back")
}
