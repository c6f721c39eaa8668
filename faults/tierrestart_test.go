package faults

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestFaultClassicTierRestartBrokerAlone: the broker alone, no Hopper. A
// delay tier (message TTL 1s, dead-lettering back to a classic work
// queue) holds the last second of 3,000 persistent, confirmed messages when
// the broker is restarted gracefully, so they run out of time while it
// stops. A classic tier dead-letters at most once: RabbitMQ 4.3.6 lost a
// few of them now and then here (8 and 29 of 3,000 in 2 of 27 restarts), 3.10.8
// none in 6. A quorum tier (at-least-once dead-lettering, as Hopper
// declares it) must lose none, which is what this test holds the broker to;
// the classic tier's losses are reported. Rounds: HOPPER_FAULTS_TIER_RESTARTS
// (default 1 per tier type; make faults runs 5).
func TestFaultClassicTierRestartBrokerAlone(t *testing.T) {
	useTarget(t, singleNode{rabbit})
	rounds := envInt(t, "HOPPER_FAULTS_TIER_RESTARTS", 1)
	lost := map[string][]int{}
	for i := 0; i < rounds; i++ {
		for _, typ := range []string{"classic", "quorum"} {
			n := tierRestartRound(t, typ)
			lost[typ] = append(lost[typ], n)
		}
	}
	t.Logf("RabbitMQ %s: confirmed messages lost per restart: classic tier %v, quorum tier %v",
		rabbit.Version(), lost["classic"], lost["quorum"])
	for _, n := range lost["quorum"] {
		if n != 0 {
			t.Errorf("a quorum tier lost %d confirmed message(s) across a restart: %v", n, lost["quorum"])
		}
	}
}

// tierRestartRound runs one restart with a tier of type typ and returns
// how many confirmed messages did not reach the work queue.
func tierRestartRound(t *testing.T, typ string) int {
	t.Helper()
	const n = 3000
	work := fmt.Sprintf("faults.tierrestart.%d", queueSeq.Add(1))
	tier := work + ".retry.1s"
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
	// An even pace over 3 s, 30 at a time, each group confirmed before
	// the next: the last second's messages are in the tier at the stop.
	confirmed := 0
	began := time.Now()
	for i := 0; i < n; i += 30 {
		if d := time.Until(began.Add(3 * time.Second * time.Duration(i) / n)); d > 0 {
			time.Sleep(d)
		}
		var dcs []*amqp.DeferredConfirmation
		for j := i; j < i+30; j++ {
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
	conn.Close()
	if err := rabbit.Restart(); err != nil {
		t.Fatalf("broker restart: %v", err)
	}
	// The tier empties within its TTL of the restart; the work queue's
	// count is then final.
	var d map[string]int
	for end := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		d, err = depths()
		if err == nil && d[tier] == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%s tier not empty a minute after the restart: %v", typ, d)
		}
	}
	t.Logf("%s tier: %d confirmed, %d in the work queue after the restart", typ, confirmed, d[work])
	return confirmed - d[work]
}

// TestExcuseTierLoss: only an id whose last request failed in a way that
// sends it through a tier, and began shortly before or during a broker
// stop, is taken for the broker's classic dead-lettering loss.
func TestExcuseTierLoss(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	stops := []brokerStop{{began: t0, back: t0.Add(5 * time.Second)}}
	rec := func(status int, at time.Duration) []record { return []record{{Status: status, At: t0.Add(at)}} }
	a := &accounting{
		lostIDs: []string{"hang-before", "503-during", "200-during", "hang-long-before", "crash-during", "none", "503-after"},
		calls: map[string][]record{
			"hang-before":      rec(statusHang, -time.Second),
			"503-during":       rec(503, 2*time.Second),
			"200-during":       rec(200, 2*time.Second),
			"hang-long-before": rec(statusHang, -tierLossWindow-time.Second),
			"crash-during":     rec(statusCrash, time.Second),
			"503-after":        rec(503, 6*time.Second),
		},
	}
	a.lost = len(a.lostIDs)
	a.excuseTierLoss(stops)
	if want := []string{"hang-before", "503-during"}; !slices.Equal(a.tierLost, want) {
		t.Errorf("excused %v, want %v", a.tierLost, want)
	}
	if want := []string{"200-during", "hang-long-before", "crash-during", "none", "503-after"}; !slices.Equal(a.lostIDs, want) || a.lost != len(want) {
		t.Errorf("still lost %v (%d), want %v", a.lostIDs, a.lost, want)
	}
}
