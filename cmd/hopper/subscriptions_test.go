package main_test

// The CLI with a config that lists subscriptions: every tool acts on each
// subscription's queues, and the DLQ tools pick one subscription.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/topology"
)

func TestConfigValidateSubscriptions(t *testing.T) {
	path := configFile(t, `
retry:
  tiers: ["1s", "10s"]
subscriptions:
  - queue: {name: orders}
  - queue: {name: invoices, type: quorum}
    path: /invoices
    retry:
      tiers: ["1m"]
`)
	r := hopper(t, "config", "validate", "--config", path)
	if r.code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	want := `config OK: 2 subscriptions
  queue "orders", 2 delay tier(s), DLQ "orders.dlq"
  queue "invoices", 1 delay tier(s), DLQ "invoices.dlq"
`
	if r.stdout != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", r.stdout, want)
	}
	// The quorum subscription's plan warns, under its queue; the classic
	// one has nothing to warn about.
	if !strings.Contains(r.stderr, `warning: queue "invoices": quorum work queue "invoices" has no x-delivery-limit`) {
		t.Errorf("stderr lacks the invoices warning:\n%s", r.stderr)
	}
	if strings.Contains(r.stderr, `queue "orders"`) {
		t.Errorf("stderr warns about orders:\n%s", r.stderr)
	}

	// A problem inside a subscription is named by its key path.
	bad := configFile(t, `
subscriptions:
  - queue: {name: orders}
  - queue: {name: invoices, type: fifo}
    path: invoices
`)
	r = hopper(t, "config", "validate", "--config", bad)
	if r.code != exitDataErr || strings.Contains(r.stdout, "config OK") {
		t.Fatalf("bad subscription: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"subscriptions[1].queue.type: must be classic, quorum or stream", "subscriptions[1].path: must start with /"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr does not say %q:\n%s", want, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "subscriptions[0]") {
		t.Errorf("the good subscription is blamed:\n%s", r.stderr)
	}

	// Two subscriptions binding one exchange with different types cannot
	// both be declared: refused before any broker is asked.
	clash := configFile(t, `
subscriptions:
  - queue: {name: orders}
    bindings: [{exchange: events, type: fanout}]
  - queue: {name: invoices}
    bindings: [{exchange: events, type: topic, routingKeys: ["invoice.*"]}]
`)
	r = hopper(t, "config", "validate", "--config", clash)
	if r.code != exitDataErr || !strings.Contains(r.stderr, `subscriptions[1].bindings: exchange "events" is bound as type=topic`) ||
		!strings.Contains(r.stderr, `but subscriptions[0] binds it as type=fanout`) {
		t.Errorf("clashing exchange: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
}

// sharedFanout lists two subscriptions bound to one fanout exchange, the
// second also to a topic exchange of its own.
func sharedFanout(t *testing.T, a, b, fanout, topic string) string {
	return configFile(t, fmt.Sprintf(`
retry: {tiers: [1s, 5s]}
topology:
  bindings: [{exchange: %[3]s, type: fanout}]
subscriptions:
  - queue: {name: %[1]s}
  - queue: {name: %[2]s}
    retry: {tiers: [1s]}
    bindings:
      - {exchange: %[3]s, type: fanout}
      - {exchange: %[4]s, type: topic, routingKeys: ["invoice.*"]}
`, a, b, fanout, topic))
}

func TestTopologyPlanSubscriptions(t *testing.T) {
	path := sharedFanout(t, "orders", "invoices", "events", "billing")
	r := hopper(t, "topology", "plan", "--config", path)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	first, second, ok := strings.Cut(r.stdout, `== queue "invoices" ==`)
	if !ok || !strings.HasPrefix(first, `== queue "orders" ==`+"\n") {
		t.Fatalf("plan lacks the headings, in order:\n%s", r.stdout)
	}
	for _, want := range []string{"work  orders durable=true", "tier  orders.retry.5s", "dlq   orders.dlq", "exchange events type=fanout", "binding events -> orders"} {
		if !strings.Contains(first, want) {
			t.Errorf("orders' plan lacks %q:\n%s", want, first)
		}
	}
	for _, want := range []string{"work  invoices durable=true", "tier  invoices.retry.1s", "dlq   invoices.dlq", "exchange events type=fanout",
		"exchange billing type=topic", "binding events -> invoices", `binding billing -> invoices routingKey="invoice.*"`} {
		if !strings.Contains(second, want) {
			t.Errorf("invoices' plan lacks %q:\n%s", want, second)
		}
	}
	if strings.Contains(second, "orders") || strings.Contains(second, "invoices.retry.5s") || strings.Contains(first, "invoices") {
		t.Errorf("a plan holds the other subscription's queues:\n%s", r.stdout)
	}

	r = hopper(t, "topology", "plan", "--config", path, "-o", "json")
	if r.code != 0 {
		t.Fatalf("json: exit %d: %s", r.code, r.stderr)
	}
	var doc struct {
		Subscriptions []topology.Document `json:"subscriptions"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
		t.Fatalf("json: %v\n%s", err, r.stdout)
	}
	if len(doc.Subscriptions) != 2 {
		t.Fatalf("%d documents, want 2:\n%s", len(doc.Subscriptions), r.stdout)
	}
	names := func(d topology.Document) (qs, exs, bs []string) {
		for _, q := range d.Queues {
			qs = append(qs, q.Role+":"+q.Name)
		}
		for _, e := range d.Exchanges {
			exs = append(exs, e.Name+":"+e.Type)
		}
		for _, b := range d.Bindings {
			bs = append(bs, b.Exchange+"->"+b.Queue+":"+b.RoutingKey)
		}
		return qs, exs, bs
	}
	for i, want := range []string{
		"[work:orders tier:orders.retry.1s tier:orders.retry.5s dlq:orders.dlq] [events:fanout] [events->orders:]",
		"[work:invoices tier:invoices.retry.1s dlq:invoices.dlq] [events:fanout billing:topic] [events->invoices: billing->invoices:invoice.*]",
	} {
		qs, exs, bs := names(doc.Subscriptions[i])
		if got := fmt.Sprint(qs, " ", exs, " ", bs); got != want {
			t.Errorf("document %d: %s, want %s", i, got, want)
		}
	}

	// One queue keeps its plain document.
	r = hopper(t, "topology", "plan", "--queue", "orders", "-o", "json")
	var single map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &single); err != nil || single["queues"] == nil || single["subscriptions"] != nil {
		t.Errorf("single-queue json (%v):\n%s", err, r.stdout)
	}
}

func TestTopologyApplyVerifySubscriptions(t *testing.T) {
	a, b := queueName(t)+".a", queueName(t)+".b"
	fanout, topic := a+".events", b+".billing"
	path := sharedFanout(t, a, b, fanout, topic)
	args := func(sub, file string) []string {
		return []string{"topology", sub, "-c", file, "--broker-url", rabbit.URL(), "--log-level", "error"}
	}
	for _, sub := range []string{"apply", "verify", "apply"} {
		r := hopper(t, args(sub, path)...)
		verb := map[string]string{"apply": "applied", "verify": "verified"}[sub]
		if r.code != 0 {
			t.Fatalf("%s: exit %d\nstdout: %s\nstderr: %s", sub, r.code, r.stdout, r.stderr)
		}
		want := fmt.Sprintf(`topology %[1]s: queue %[2]q OK (4 queues, 1 exchanges, 1 bindings)
topology %[1]s: queue %[3]q OK (3 queues, 2 exchanges, 2 bindings)
topology %[1]s: OK (2 subscriptions, 7 queues, 2 exchanges, 3 bindings)
`, verb, a, b)
		if r.stdout != want {
			t.Errorf("%s: stdout\n%s\nwant\n%s", sub, r.stdout, want)
		}
	}
	wantDepths(t, append(planned(a), b, b+".retry.1s", b+".dlq"), nil)

	// The shared fanout exchange routes to both work queues; the topic
	// exchange to the second only.
	pub := broker.NewPublisher(broker.PublisherOptions{Options: broker.Options{URLs: []string{rabbit.URL()}}, Channels: 1})
	defer pub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := pub.PublishTo(ctx, fanout, "any", &msg.Message{MessageID: "fan", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if err := pub.PublishTo(ctx, topic, "invoice.paid", &msg.Message{MessageID: "inv", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	insp := inspector(t)
	readyIn(t, insp, a, 1)
	readyIn(t, insp, b, 2)

	// One subscription's queue missing: verify fails naming that
	// subscription and queue, after the first one passed, and creates
	// nothing.
	missing := queueName(t) + ".never-applied"
	partial := configFile(t, fmt.Sprintf(`
retry: {tiers: [1s, 5s]}
topology:
  bindings: [{exchange: %s, type: fanout}]
subscriptions:
  - queue: {name: %s}
  - queue: {name: %s}
`, fanout, a, missing))
	r := hopper(t, args("verify", partial)...)
	if r.code == 0 {
		t.Fatalf("verify with a missing queue: exit 0\n%s", r.stdout)
	}
	if !strings.Contains(r.stdout, fmt.Sprintf("topology verified: queue %q OK", a)) || strings.Contains(r.stdout, "topology verified: OK") {
		t.Errorf("stdout:\n%s", r.stdout)
	}
	if want := fmt.Sprintf("hopper: subscriptions[1] (queue %q): topology mismatch: queue %q does not exist", missing, missing); !strings.Contains(r.stderr, want) {
		t.Errorf("stderr does not say %q:\n%s", want, r.stderr)
	}
	if _, err := insp.Depth(missing); err == nil {
		t.Errorf("verify created %s", missing)
	}
}

func TestDLQStatsPicksSubscription(t *testing.T) {
	a, b := queueName(t)+".a", queueName(t)+".b"
	two := configFile(t, fmt.Sprintf(`
retry: {tiers: [1s]}
subscriptions:
  - queue: {name: %s}
  - queue: {name: %s}
`, a, b))
	if r := hopper(t, "topology", "apply", "-c", two, "--broker-url", rabbit.URL(), "--log-level", "error"); r.code != 0 {
		t.Fatalf("apply: exit %d\n%s", r.code, r.stderr)
	}
	publish(t, a+".dlq", "a1")
	publish(t, b+".dlq", "b1", "b2")

	stats := func(file string, extra ...string) result {
		t.Helper()
		return hopper(t, append([]string{"dlq", "stats", "-c", file, "--broker-url", rabbit.URL(), "--log-level", "error", "-o", "json"}, extra...)...)
	}
	for _, tc := range []struct {
		args  []string
		dlq   string
		depth int
	}{
		{[]string{"--queue", b}, b + ".dlq", 2},
		{[]string{"--queue", a}, a + ".dlq", 1},
		{[]string{"--dlq", b + ".dlq"}, b + ".dlq", 2},
	} {
		r := stats(two, tc.args...)
		if r.code != 0 {
			t.Errorf("stats %v: exit %d\n%s", tc.args, r.code, r.stderr)
			continue
		}
		var st struct {
			DLQ   string `json:"dlq"`
			Depth int    `json:"depth"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.DLQ != tc.dlq || st.Depth != tc.depth {
			t.Errorf("stats %v: %+v (%v), want %s with %d\n%s", tc.args, st, err, tc.dlq, tc.depth, r.stdout)
		}
	}

	// Two subscriptions and nothing to choose by: the error lists them.
	r := stats(two)
	if r.code == 0 || !strings.Contains(r.stderr, "--queue") || !strings.Contains(r.stderr, a+", "+b) {
		t.Errorf("stats without --queue: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	r = stats(two, "--queue", "nope")
	if r.code == 0 || !strings.Contains(r.stderr, `--queue "nope" names no subscription`) || !strings.Contains(r.stderr, a+", "+b) {
		t.Errorf("stats --queue nope: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}

	// The only subscription is picked without flags.
	one := configFile(t, fmt.Sprintf("retry: {tiers: [1s]}\nsubscriptions:\n  - queue: {name: %s}\n", b))
	if r = stats(one); r.code != 0 || !strings.Contains(r.stdout, `"dlq": "`+b+`.dlq"`) || !strings.Contains(r.stdout, `"depth": 2`) {
		t.Errorf("stats of the only subscription: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
}
