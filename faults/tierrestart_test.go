package faults

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestFaultTierRestartBrokerAlone: the broker alone, no Hopper. A delay
// tier (message TTL 1s, dead-lettering back to a classic work queue)
// holds the last second of 3,000 persistent, confirmed messages when the
// node goes down, gracefully (an operator's restart, a rolling upgrade) or
// by SIGKILL (a node lost), so they run out of time while it stops or
// while it is down. Each round then counts the work queue once the broker
// has settled: a dead letter on its way between the two queues is counted
// in neither for seconds after a restart (a quorum tier's waits for the
// work queue's confirm), so a count read when the tier first reads 0 is
// too early. It reports what each tier type lost and decides nothing:
// what Hopper guarantees is held by the scenarios that run Hopper.
// Rounds: HOPPER_FAULTS_TIER_RESTARTS per tier type and way down; unset,
// the test does not run (make faults runs 5, make tier-restarts 10).
func TestFaultTierRestartBrokerAlone(t *testing.T) {
	if os.Getenv("HOPPER_FAULTS_TIER_RESTARTS") == "" {
		t.Skip("the broker alone decides nothing of Hopper's guarantee; HOPPER_FAULTS_TIER_RESTARTS=N runs N rounds (make faults, make tier-restarts)")
	}
	useTarget(t, singleNode{rabbit})
	rounds := envInt(t, "HOPPER_FAULTS_TIER_RESTARTS", 1)
	type key struct{ typ, down string }
	lost := map[key][]int{}
	for i := 0; i < rounds; i++ {
		for _, typ := range []string{"classic", "quorum"} {
			for _, down := range []string{"graceful", "sigkill"} {
				k := key{typ, down}
				lost[k] = append(lost[k], tierRestartRound(t, typ, down))
			}
		}
	}
	for _, typ := range []string{"classic", "quorum"} {
		for _, down := range []string{"graceful", "sigkill"} {
			k := key{typ, down}
			sum, hit := 0, 0
			for _, n := range lost[k] {
				sum += n
				if n != 0 {
					hit++
				}
			}
			t.Logf("RabbitMQ %s, %s tier, %s stop: %d of %d rounds lost confirmed messages, %d messages in all; per round %v",
				rabbit.Version(), typ, down, hit, len(lost[k]), sum, lost[k])
		}
	}
}

// settleQuiet is how long the tier and work queue counts must stay the
// same, with the tier empty, before a round with fewer messages than
// confirmed is taken as final. A round that reaches every confirmed
// message ends at once.
const settleQuiet = 30 * time.Second

// tierRestartRound runs one stop of the node, down being "graceful" or
// "sigkill", with a tier of type typ, and returns how many confirmed
// messages did not reach the work queue once the broker settled.
func tierRestartRound(t *testing.T, typ, down string) int {
	t.Helper()
	const n = 3000
	work := fmt.Sprintf("faults.tierrestart.%d", queueSeq.Add(1))
	tier := work + ".retry.1s"
	confirmed := fillTier(t, typ, work, tier, n)
	began := time.Now()
	switch down {
	case "graceful":
		if err := rabbit.Restart(); err != nil {
			t.Fatalf("broker restart: %v", err)
		}
	case "sigkill":
		if err := rabbit.KillNode(); err != nil {
			t.Fatalf("broker kill: %v", err)
		}
		if err := rabbit.StartNode(); err != nil {
			t.Fatalf("broker start after kill: %v", err)
		}
	}
	back := time.Since(began)
	got, tierLeft, firstEmpty := settledCounts(t, work, tier, confirmed)
	t.Logf("%s tier, %s stop (back in %s): %d confirmed; work queue %d when the tier first read 0, %d once settled (tier %d)",
		typ, down, back.Round(100*time.Millisecond), confirmed, firstEmpty, got, tierLeft)
	if tierLeft != 0 {
		t.Errorf("%s tier still holds %d messages %s after the work queue stopped changing", typ, tierLeft, settleQuiet)
	}
	// A quorum tier may hand a message back twice (at least once): more
	// than confirmed is duplicates, not a negative loss.
	return max(0, confirmed-got-tierLeft)
}

// fillTier declares work and a 1s tier of type typ in front of it and
// publishes n persistent messages into the tier at an even pace over 3 s,
// each group of 30 confirmed before the next, so the last second's
// messages are in the tier when the caller stops the node. It returns how
// many were confirmed.
func fillTier(t *testing.T, typ, work, tier string, n int) int {
	t.Helper()
	conn, err := amqp.Dial(rabbit.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(work, true, false, false, false, amqp.Table{"x-queue-type": "classic"}); err != nil {
		t.Fatal(err)
	}
	args := amqp.Table{"x-queue-type": typ, "x-message-ttl": int32(1000), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": work}
	if typ == "quorum" {
		args["x-dead-letter-strategy"] = "at-least-once"
		args["x-overflow"] = "reject-publish"
	}
	if _, err := ch.QueueDeclare(tier, true, false, false, false, args); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	confirmed := 0
	began := time.Now()
	for i := 0; i < n; i += 30 {
		if d := time.Until(began.Add(3 * time.Second * time.Duration(i) / time.Duration(n))); d > 0 {
			time.Sleep(d) // the pace of the publisher, not a wait for the broker
		}
		var dcs []*amqp.DeferredConfirmation
		for j := i; j < i+30 && j < n; j++ {
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", tier, true, false,
				amqp.Publishing{MessageId: fmt.Sprint(j), DeliveryMode: amqp.Persistent, Body: []byte("x")})
			if err != nil {
				t.Fatalf("publish: %v", err)
			}
			dcs = append(dcs, dc)
		}
		for _, dc := range dcs {
			if ok, err := dc.WaitContext(ctx); err != nil {
				t.Fatalf("confirm: %v", err)
			} else if ok {
				confirmed++
			}
		}
	}
	return confirmed
}

// settledCounts polls the work queue and the tier until the work queue
// holds every confirmed message, or until neither count has changed for
// settleQuiet with the tier empty. It returns the final counts and the
// work queue's count at the first moment the tier read 0 (the early read
// this measurement once stopped at).
func settledCounts(t *testing.T, work, tier string, confirmed int) (got, tierLeft, firstEmpty int) {
	t.Helper()
	firstEmpty = -1
	last := [2]int{-1, -1}
	since := time.Now()
	for end := time.Now().Add(5 * time.Minute); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		d, err := depths()
		if err != nil {
			continue
		}
		now := [2]int{d[work], d[tier]}
		if now[1] == 0 && firstEmpty < 0 {
			firstEmpty = now[0]
		}
		if now[0] >= confirmed && now[1] == 0 {
			return now[0], 0, firstEmpty
		}
		if now != last {
			last, since = now, time.Now()
			continue
		}
		if time.Since(since) >= settleQuiet && (now[1] == 0 || time.Since(since) >= 2*settleQuiet) {
			return now[0], now[1], firstEmpty
		}
	}
	t.Fatalf("counts of %s and %s still changing five minutes after the restart: %v", work, tier, last)
	return 0, 0, 0
}
