package sidecar_test

import (
	"context"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/sidecar"
	"github.com/hopper-sidecar/hopper/topology"
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
