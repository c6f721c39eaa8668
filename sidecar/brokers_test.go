package sidecar_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/sidecar"
	"github.com/hopper-sidecar/hopper/topology"
	amqp "github.com/rabbitmq/amqp091-go"
)

// An operator's quorum work queue (topology.declare false): on RabbitMQ 4.x
// Hopper says at start, in a log event and on /readyz, that the queue has a
// delivery limit it cannot read; on 3.x, which sets none, it says nothing.
func TestOperatorQuorumQueueDeliveryLimitNoted(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	cfg.Admin.Listen = "127.0.0.1:0"
	cfg.Queue.Type = "quorum"
	declared := cfg
	plan := topology.FromConfig(&declared)
	if err := broker.Apply(context.Background(), broker.ConfigOptions(cfg.Broker, testLogger(t), "declare"), &plan, true); err != nil {
		t.Fatal(err)
	}
	cfg.Topology.Declare = false
	r := start(t, cfg)
	code, body := readyz(t, r.sc)
	if code != http.StatusOK {
		t.Fatalf("/readyz %d: %s", code, body)
	}
	noted := strings.Contains(body, "note: work queue \""+cfg.Queue.Name+"\" is a quorum queue Hopper did not declare") &&
		strings.Contains(body, "20 unless an x-delivery-limit argument or a policy sets another")
	if four := rabbit.Series() >= 4; noted != four {
		t.Errorf("RabbitMQ %d: delivery limit noted %t, want %t:\n%s", rabbit.Series(), noted, four, body)
	}
	// What Hopper declares itself carries its own limit: no note.
	cfg2 := testConfig(t, app.URL)
	cfg2.Admin.Listen = "127.0.0.1:0"
	cfg2.Queue.Type = "quorum"
	r2 := start(t, cfg2)
	if _, body := readyz(t, r2.sc); strings.Contains(body, "note:") {
		t.Errorf("a note about a queue Hopper declared:\n%s", body)
	}
}

// An operator's queue of another type than queue.type says is refused at
// start, naming both: a quorum queue taken for a classic one would have its
// messages handed back in a way that spends its delivery limit.
func TestOperatorQueueOfAnotherTypeRefused(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	cfg.Queue.Type = "quorum"
	declared := cfg
	plan := topology.FromConfig(&declared)
	if err := broker.Apply(context.Background(), broker.ConfigOptions(cfg.Broker, testLogger(t), "declare"), &plan, true); err != nil {
		t.Fatal(err)
	}
	cfg.Topology.Declare = false
	cfg.Queue.Type = "classic"
	sc := sidecar.New(&cfg, testLogger(t))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := sc.Run(ctx)
	if !errors.Is(err, broker.ErrTopology) || !strings.Contains(err.Error(), "is a quorum queue, the config says classic") ||
		!strings.Contains(err.Error(), "set queue.type: quorum") {
		t.Fatalf("Run = %v, want the type mismatch named", err)
	}
}

// RabbitMQ 4.x cancels a quorum queue's consumer whose delivery is not
// settled within the consumer timeout (3.x closed the channel) and puts the
// message back. Hopper consumes again on the same channel, the app gets the
// message again (at least once), and once both answers are in nothing is
// left and nothing reached the DLQ.
func TestConsumerTimeoutCancelsTheConsumer(t *testing.T) {
	if rabbit.Series() < 4 {
		t.Skip("RabbitMQ 3.x closes the channel at a consumer timeout, checked only on its minute tick; losing the channel is tested by TestReconnectAfterConnectionsClosed and the fault suite")
	}
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	cfg.Queue.Type = "quorum"
	policy := "ct-" + cfg.Queue.Name
	if out, err := rabbit.Ctl("set_policy", "--apply-to", "queues", policy, "^"+regexp.QuoteMeta(cfg.Queue.Name)+"$", `{"consumer-timeout":1000}`); err != nil {
		t.Fatalf("set_policy: %v\n%s", err, out)
	}
	t.Cleanup(func() { rabbit.Ctl("clear_policy", policy) }) //nolint:errcheck // the node is private to the test run
	release := app.hold("slow")
	defer release()
	r := start(t, cfg)
	r.publish("slow")
	waitfor.Until(t, 20*time.Second, "the message delivered again after the broker cancelled the consumer", func() bool {
		return len(app.callsFor("slow")) >= 2
	})
	if !r.sc.Consuming() {
		t.Error("not consuming after the broker's cancel")
	}
	release()
	r.settled(0)
	app.script("after", 200)
	r.publish("after")
	r.settled(0)
	if n := len(app.callsFor("after")); n != 1 {
		t.Errorf("a message after the timeout was delivered %d times, want once", n)
	}
}

// A message whose body is exactly RabbitMQ 4.x's default max_message_size
// (16 MiB) goes through a delay tier and into the DLQ: every copy Hopper
// publishes keeps the body and adds headers only, which the limit does not
// count.
func TestMessageAtTheDefaultMaxSizeMoves(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	r := start(t, cfg)
	const size = 16 << 20
	app.script("big", 503, 400)
	body := strings.Repeat("b", size)
	r.publish("big", func(m *msg.Message) { m.Body = []byte(body) })
	r.settled(1)
	calls := app.callsFor("big")
	if len(calls) != 2 || len(calls[0].Body) != size || len(calls[1].Body) != size {
		t.Fatalf("app calls %d, want 2 with the whole body", len(calls))
	}
	m, ok := r.drain(r.sc.Plan().DLQ.Name)["big"]
	if !ok {
		t.Fatal("not in the DLQ")
	}
	if len(m.Body) != size || string(m.Body) != body {
		t.Errorf("DLQ copy body %d bytes, want the %d of the original", len(m.Body), size)
	}
}

// queue.tierType quorum on a classic work queue: a retry goes through a
// quorum tier (which hands it back at least once) and comes back to the
// app; switching an existing classic tier to quorum is refused at start,
// naming the tier and what to do, since a queue's type cannot change.
func TestQuorumTiersOnClassicWorkQueue(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	classic := cfg
	classic.Queue.TierType = "classic"
	plan := topology.FromConfig(&classic)
	bo := broker.ConfigOptions(cfg.Broker, testLogger(t), "declare")
	if err := broker.Apply(context.Background(), bo, &plan, true); err != nil {
		t.Fatal(err)
	}
	cfg.Queue.TierType = "quorum"
	sc := sidecar.New(&cfg, testLogger(t))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := sc.Run(ctx)
	if !errors.Is(err, broker.ErrTopology) || !strings.Contains(err.Error(), plan.Tiers[0].Name) ||
		!strings.Contains(err.Error(), "exists as a classic queue, the config asks for a quorum one") {
		t.Fatalf("Run over classic tiers with tierType quorum = %v, want the tier's type named", err)
	}

	cfg = testConfig(t, app.URL)
	cfg.Queue.TierType = "quorum"
	r := start(t, cfg)
	for _, q := range r.sc.Plan().Queues() {
		want := broker.Classic
		if q.Role == topology.RoleTier {
			want = broker.Quorum
		}
		if got, err := broker.QueueTypeOf(context.Background(), bo, q.Name); err != nil || got != want {
			t.Errorf("%s queue %s: type %v (%v), want %v", q.Role, q.Name, got, err, want)
		}
	}
	app.script("t1", 503, 200)
	r.publish("t1")
	r.settled(0)
	if got := app.statuses("t1"); len(got) != 2 || got[1] != 200 {
		t.Fatalf("t1 answered %v, want 503 then 200 after the quorum tier", got)
	}
}

// TestUpgradeOverClassicTiers: tiers an earlier Hopper declared as classic
// queues (its default) meet today's default of quorum tiers. Hopper
// starts: an empty classic tier is replaced in place by a quorum one; one
// that holds retries keeps handing them back to the work queue as their
// delays run out, while new retries go to a quorum successor; once it is
// empty, the next declare deletes it and the successor stays in use.
func TestUpgradeOverClassicTiers(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	cfg.Retry.Tiers = []config.Duration{config.Duration(200 * time.Millisecond), config.Duration(10 * time.Minute)}
	old := cfg
	old.Queue.TierType = "classic"
	oldPlan := topology.FromConfig(&old)
	bo := broker.ConfigOptions(cfg.Broker, testLogger(t), "declare")
	if err := broker.Apply(context.Background(), bo, &oldPlan, true); err != nil {
		t.Fatal(err)
	}
	fast, slow := oldPlan.Tiers[0], oldPlan.Tiers[1]
	// Retries an earlier Hopper left in its 10m classic tier: five whose
	// own expiration hands them back within seconds, then one that stays
	// for the tier's whole delay and keeps the tier from being empty.
	conn, err := amqp.Dial(rabbit.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	var waiting []string
	put := func(id, expiration string) {
		t.Helper()
		dc, err := ch.PublishWithDeferredConfirm("", slow.Name, true, false,
			amqp.Publishing{MessageId: id, DeliveryMode: amqp.Persistent, Expiration: expiration, Body: []byte(id)})
		if err != nil {
			t.Fatal(err)
		}
		if !dc.Wait() {
			t.Fatalf("%s not confirmed", id)
		}
	}
	for i := range 5 {
		id := fmt.Sprintf("old-%d", i)
		waiting = append(waiting, id)
		put(id, "1500")
	}
	put("old-long", "")

	r := start(t, cfg)
	plan := r.sc.Plan()
	typeOf := func(name string) broker.QueueType {
		t.Helper()
		got, err := broker.QueueTypeOf(context.Background(), bo, name)
		if err != nil {
			t.Fatalf("type of %s: %v", name, err)
		}
		return got
	}
	if got := typeOf(fast.Name); got != broker.Quorum {
		t.Errorf("empty classic tier %s: type %v after the upgrade, want quorum in its place", fast.Name, got)
	}
	if name, _ := plan.TierQueue(fast.Delay); name != fast.Name {
		t.Errorf("retries of %s go to %q, want the tier itself", fast.Delay, name)
	}
	if got := typeOf(slow.Name); got != broker.Classic {
		t.Errorf("classic tier %s holding a retry: type %v, want it kept", slow.Name, got)
	}
	successor := plan.Tiers[1].Successor
	if name, _ := plan.TierQueue(slow.Delay); name != successor || typeOf(successor) != broker.Quorum {
		t.Errorf("retries of %s go to %q, want the quorum successor %q", slow.Delay, name, successor)
	}
	if notes := strings.Join(plan.TierNotes(), "\n"); !strings.Contains(notes, slow.Name) || !strings.Contains(notes, successor) {
		t.Errorf("notes %q do not say where the old tier's retries went", notes)
	}
	// The old tier's retries come back and are delivered; a new retry
	// goes through the quorum tier that replaced the empty one.
	app.script("new", 503, 200)
	r.publish("new")
	waitfor.Until(t, 30*time.Second, "the old tier's expired retries and the new one delivered", func() bool {
		for _, id := range append(waiting, "new") {
			if st := app.statuses(id); len(st) == 0 || st[len(st)-1] != 200 {
				t.Logf("%s answered %v; queues %v", id, st, allDepths(t))
				return false
			}
		}
		return true
	})
	if got := app.statuses("new"); len(got) != 2 {
		t.Errorf("new answered %v, want 503 then 200", got)
	}

	// The last old retry leaves the tier (taken here, as its delay
	// running out would); the next declare, as at a reconnect, deletes
	// the empty old tier and keeps the successor.
	got := r.drain(slow.Name)
	if _, ok := got["old-long"]; !ok || len(got) != 1 {
		t.Fatalf("old tier held %v, want old-long alone", got)
	}
	if err := broker.Apply(context.Background(), bo, plan, true); err != nil {
		t.Fatal(err)
	}
	if _, err := broker.QueueTypeOf(context.Background(), bo, slow.Name); err == nil {
		t.Errorf("empty old tier %s still there after a declare", slow.Name)
	}
	if name, _ := plan.TierQueue(slow.Delay); name != successor {
		t.Errorf("after the old tier's deletion retries go to %q, want %q", name, successor)
	}
	// And a Hopper starting afterwards agrees.
	again := cfg
	p2 := topology.FromConfig(&again)
	if err := broker.Apply(context.Background(), bo, &p2, true); err != nil {
		t.Fatal(err)
	}
	if name, _ := p2.TierQueue(slow.Delay); name != successor {
		t.Errorf("a later start sends retries of %s to %q, want %q", slow.Delay, name, successor)
	}
}
