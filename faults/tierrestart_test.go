package faults

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestFaultTierRestartBrokerAlone: the broker alone, no Hopper. A delay
// tier (message TTL 1s, dead-lettering back to a work queue) holds the
// last second of 3,000 persistent, confirmed messages when the node goes
// down, gracefully (an operator's restart, a rolling upgrade) or by
// SIGKILL (a node lost), so they run out of time while it stops or while
// it is down. Three pairs: a classic tier and a quorum tier in front of a
// classic work queue, and a quorum tier in front of a quorum work queue
// (Hopper's default tiers with a quorum work queue). Each round then counts
// the work queue once the broker has settled: a dead letter on its way
// between the two queues is counted in neither for seconds after a restart
// (a quorum tier waits for the work queue's confirm), and a quorum tier
// whose forward was refused while the work queue was still starting sends
// it again only after its dead-letter worker's confirm timeout (minutes by
// default), so a count read when the tier first reads 0, or after a short
// quiet spell, is too early. It reports what each pair lost and how long
// the last message took to reach the work queue, and decides nothing: what
// Hopper guarantees is held by the scenarios that run Hopper.
// Rounds: HOPPER_FAULTS_TIER_RESTARTS per pair and way down; unset,
// the test does not run (make faults runs 5, make tier-restarts 10).
func TestFaultTierRestartBrokerAlone(t *testing.T) {
	if os.Getenv("HOPPER_FAULTS_TIER_RESTARTS") == "" {
		t.Skip("the broker alone decides nothing of Hopper's guarantee; HOPPER_FAULTS_TIER_RESTARTS=N runs N rounds (make faults, make tier-restarts)")
	}
	useTarget(t, singleNode{rabbit})
	rounds := envInt(t, "HOPPER_FAULTS_TIER_RESTARTS", 1)
	confirmWait := dlxConfirmTimeout(t)
	t.Logf("RabbitMQ %s: a quorum tier's dead-letter worker sends a forward again after %s without a confirm", rabbit.Version(), confirmWait)
	type key struct {
		pair tierPair
		down string
	}
	type result struct {
		lost int
		took time.Duration
	}
	results := map[key][]result{}
	for i := 0; i < rounds; i++ {
		for _, pair := range tierPairs {
			for _, down := range []string{"graceful", "sigkill"} {
				k := key{pair, down}
				lost, took := tierRestartRound(t, pair, down, confirmWait)
				results[k] = append(results[k], result{lost, took})
			}
		}
	}
	for _, pair := range tierPairs {
		for _, down := range []string{"graceful", "sigkill"} {
			k := key{pair, down}
			sum, hit := 0, 0
			var lost []int
			var slowest time.Duration
			for _, r := range results[k] {
				sum += r.lost
				lost = append(lost, r.lost)
				slowest = max(slowest, r.took)
				if r.lost != 0 {
					hit++
				}
			}
			t.Logf("RabbitMQ %s, %s, %s stop: %d of %d rounds lost confirmed messages, %d messages in all; per round %v; the slowest round's last message reached the work queue %s after the node was back",
				rabbit.Version(), pair, down, hit, len(results[k]), sum, lost, slowest.Round(100*time.Millisecond))
		}
	}
}

// tierPair is a delay tier's queue type and the type of the work queue it
// dead-letters into.
type tierPair struct{ tier, work string }

func (p tierPair) String() string { return p.tier + " tier into a " + p.work + " work queue" }

var tierPairs = []tierPair{{"classic", "classic"}, {"quorum", "classic"}, {"quorum", "quorum"}}

// dlxConfirmTimeout reads how long the broker's quorum dead-letter worker
// waits for a target queue's confirm before it forwards a message again
// (and waits as long before it tries again a forward the target refused).
func dlxConfirmTimeout(t *testing.T) time.Duration {
	t.Helper()
	out, err := rabbit.Ctl("-q", "eval", "application:get_env(rabbit, dead_letter_worker_publisher_confirm_timeout).")
	if err != nil {
		t.Fatalf("reading the dead-letter worker's confirm timeout: %v", err)
	}
	var ms int
	if _, err := fmt.Sscanf(strings.TrimSpace(out), "{ok,%d}", &ms); err != nil || ms <= 0 {
		t.Fatalf("dead-letter worker's confirm timeout: cannot read %q", out)
	}
	return time.Duration(ms) * time.Millisecond
}

// settleQuiet is how long the tier and work queue counts must stay the
// same, with the tier empty, before a round with fewer messages than
// confirmed is taken as final. A round that reaches every confirmed
// message ends at once.
const settleQuiet = 30 * time.Second

// tierRestartRound runs one stop of the node, down being "graceful" or
// "sigkill", with the queue types of pair, and returns how many confirmed
// messages did not reach the work queue once the broker settled, and how
// long after the node was back the work queue's count last grew.
func tierRestartRound(t *testing.T, pair tierPair, down string, confirmWait time.Duration) (int, time.Duration) {
	t.Helper()
	const n = 3000
	work := fmt.Sprintf("faults.tierrestart.%d", queueSeq.Add(1))
	tier := work + ".retry.1s"
	confirmed := fillTier(t, pair, work, tier, n)
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
	backAt := time.Now()
	back := backAt.Sub(began)
	c := settledCounts(t, work, tier, confirmed, confirmWait)
	took := c.lastGrew.Sub(backAt)
	t.Logf("%s, %s stop (back in %s): %d confirmed; work queue %d when the tier first read 0, %d once settled (tier %d), last grew %s after the node was back",
		pair, down, back.Round(100*time.Millisecond), confirmed, c.firstEmpty, c.got, c.tierLeft, took.Round(100*time.Millisecond))
	if c.tierLeft != 0 {
		t.Errorf("%s: the tier still holds %d messages %s after the work queue stopped changing", pair, c.tierLeft, settleQuiet+confirmWait)
	}
	// A quorum tier may hand a message back twice (at least once): more
	// than confirmed is duplicates, not a negative loss.
	return max(0, confirmed-c.got-c.tierLeft), took
}

// fillTier declares work and a 1s tier in front of it, of pair's types, and
// publishes n persistent messages into the tier at an even pace over 3 s,
// each group of 30 confirmed before the next, so the last second's
// messages are in the tier when the caller stops the node. It returns how
// many were confirmed.
func fillTier(t *testing.T, pair tierPair, work, tier string, n int) int {
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
	if _, err := ch.QueueDeclare(work, true, false, false, false, amqp.Table{"x-queue-type": pair.work}); err != nil {
		t.Fatal(err)
	}
	args := amqp.Table{"x-queue-type": pair.tier, "x-message-ttl": int32(1000), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": work}
	if pair.tier == "quorum" {
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

// counts is what settledCounts read: the final counts, the work queue's
// count at the first moment the tier read 0 (the early read this
// measurement once stopped at), and when the work queue's count last grew.
type counts struct {
	got, tierLeft, firstEmpty int
	lastGrew                  time.Time
}

// settledCounts polls the work queue and the tier until the work queue
// holds every confirmed message, or until neither count has changed for
// settleQuiet with the tier empty, or for settleQuiet plus confirmWait
// with messages still in the tier (a quorum tier's dead-letter worker
// tries a refused forward again only after confirmWait).
func settledCounts(t *testing.T, work, tier string, confirmed int, confirmWait time.Duration) counts {
	t.Helper()
	c := counts{firstEmpty: -1, lastGrew: time.Now()}
	last := [2]int{-1, -1}
	since := time.Now()
	limit := 5*time.Minute + confirmWait
	for end := time.Now().Add(limit); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		d, err := depths()
		if err != nil {
			continue
		}
		now := [2]int{d[work], d[tier]}
		if now[1] == 0 && c.firstEmpty < 0 {
			c.firstEmpty = now[0]
		}
		if now[0] > last[0] {
			c.lastGrew = time.Now()
		}
		if now[0] >= confirmed && now[1] == 0 {
			c.got = now[0]
			return c
		}
		if now != last {
			last, since = now, time.Now()
			continue
		}
		if time.Since(since) >= settleQuiet && (now[1] == 0 || time.Since(since) >= settleQuiet+confirmWait) {
			c.got, c.tierLeft = now[0], now[1]
			return c
		}
	}
	t.Fatalf("counts of %s and %s still changing %s after the restart: %v", work, tier, limit, last)
	return c
}
