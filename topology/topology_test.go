package topology_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/topology"
)

func topoConfig(t *testing.T, mod func(*config.Config)) *config.Config {
	t.Helper()
	c := config.Default()
	c.Queue.Name = "orders"
	if mod != nil {
		mod(&c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("test config invalid: %v", err)
	}
	return &c
}

func durs(ds ...time.Duration) []config.Duration {
	out := make([]config.Duration, len(ds))
	for i, d := range ds {
		out[i] = config.Duration(d)
	}
	return out
}

var mixedTiers = []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Minute, 90 * time.Minute}

func TestFromConfigClassic(t *testing.T) {
	c := topoConfig(t, func(c *config.Config) { c.Retry.Tiers = durs(mixedTiers...) })
	p := topology.FromConfig(c)

	if !p.Declare {
		t.Error("plan.Declare false with topology.declare true")
	}
	wantWork := topology.Queue{Name: "orders", Role: topology.RoleWork, Owned: true,
		Args: map[string]any{"x-queue-type": "classic", "x-queue-version": int32(2),
			// What the broker drops from the work queue lands in the DLQ.
			"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "orders.dlq"}}
	if !reflect.DeepEqual(p.Work, wantWork) {
		t.Errorf("work queue %+v, want %+v", p.Work, wantWork)
	}

	wantTiers := []struct {
		name string
		ttl  int32
	}{
		{"orders.retry.500ms", 500},
		{"orders.retry.1s", 1000},
		{"orders.retry.2m", 120000},
		{"orders.retry.1h30m", 5400000}, // 1h30m, no zero components
	}
	if len(p.Tiers) != len(wantTiers) {
		t.Fatalf("%d tiers, want %d: %+v", len(p.Tiers), len(wantTiers), p.Tiers)
	}
	for i, w := range wantTiers {
		q := p.Tiers[i]
		if q.Name != w.name || q.Role != topology.RoleTier || q.Delay != mixedTiers[i] || !q.Owned || !q.Unbounded ||
			q.Successor != w.name+".quorum" {
			t.Errorf("tier %d: %+v, want name %s delay %v", i, q, w.name, mixedTiers[i])
		}
		// A classic work queue's tiers are quorum by default: a classic
		// tier hands a retry back at most once.
		want := map[string]any{
			"x-queue-type":              "quorum",
			"x-message-ttl":             w.ttl, // int32: an int64 would be a different argument to the broker
			"x-dead-letter-exchange":    "",
			"x-dead-letter-routing-key": "orders",
			"x-dead-letter-strategy":    "at-least-once",
			"x-overflow":                "reject-publish",
		}
		if !reflect.DeepEqual(q.Args, want) {
			t.Errorf("tier %s args %#v, want %#v", q.Name, q.Args, want)
		}
	}

	wantDLQ := topology.Queue{Name: "orders.dlq", Role: topology.RoleDLQ, Owned: true,
		Args: map[string]any{"x-queue-type": "classic", "x-queue-version": int32(2)}}
	if !reflect.DeepEqual(p.DLQ, wantDLQ) {
		t.Errorf("dlq %+v, want %+v", p.DLQ, wantDLQ)
	}
	if w := p.Warnings(); len(w) != 0 {
		t.Errorf("warnings for a classic plan: %q", w)
	}
	assertNeverExpires(t, &p)
}

// assertNeverExpires: no queue Hopper plans may vanish with its messages.
func assertNeverExpires(t *testing.T, p *topology.Plan) {
	t.Helper()
	for _, q := range p.Queues() {
		if _, ok := q.Args["x-expires"]; ok {
			t.Errorf("%s has x-expires", q.Name)
		}
		if q.Role != topology.RoleTier {
			if _, ok := q.Args["x-message-ttl"]; ok {
				t.Errorf("%s queue %s has a message TTL", q.Role, q.Name)
			}
		}
		if q.Args["x-overflow"] == "drop-head" {
			t.Errorf("%s drops messages on overflow", q.Name)
		}
	}
}

func TestFromConfigDLQMaxLength(t *testing.T) {
	p := topology.FromConfig(topoConfig(t, func(c *config.Config) { c.Topology.DLQMaxLength = 100000 }))
	if p.DLQ.Args["x-max-length"] != int32(100000) || p.DLQ.Args["x-overflow"] != "reject-publish" {
		t.Errorf("dlq args %#v", p.DLQ.Args)
	}
	for _, q := range p.Tiers {
		if _, ok := q.Args["x-max-length"]; ok {
			t.Errorf("tier %s capped", q.Name)
		}
	}
	p = topology.FromConfig(topoConfig(t, nil))
	for _, k := range []string{"x-max-length", "x-overflow"} {
		if _, ok := p.DLQ.Args[k]; ok {
			t.Errorf("uncapped dlq has %s", k)
		}
	}
}

func TestFromConfigQuorum(t *testing.T) {
	c := topoConfig(t, func(c *config.Config) {
		c.Queue.Type = "quorum"
		c.Queue.DeliveryLimit = 50
		c.Retry.Tiers = durs(time.Second, 5*time.Second)
		c.Topology.DLQMaxLength = 10
	})
	p := topology.FromConfig(c)
	if want := map[string]any{"x-queue-type": "quorum", "x-delivery-limit": int32(50),
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "orders.dlq",
		"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}; !reflect.DeepEqual(p.Work.Args, want) {
		t.Errorf("work args %#v, want %#v", p.Work.Args, want)
	}
	for i, q := range p.Tiers {
		want := map[string]any{
			"x-queue-type":              "quorum",
			"x-message-ttl":             int32([]int{1000, 5000}[i]),
			"x-dead-letter-exchange":    "",
			"x-dead-letter-routing-key": "orders",
			// At-least-once dead-lettering back to the work queue needs
			// reject-publish overflow on the source queue.
			"x-dead-letter-strategy": "at-least-once",
			"x-overflow":             "reject-publish",
		}
		if !reflect.DeepEqual(q.Args, want) {
			t.Errorf("tier %s args %#v, want %#v", q.Name, q.Args, want)
		}
	}
	if want := map[string]any{"x-queue-type": "quorum", "x-max-length": int32(10), "x-overflow": "reject-publish"}; !reflect.DeepEqual(p.DLQ.Args, want) {
		t.Errorf("dlq args %#v, want %#v", p.DLQ.Args, want)
	}
	for _, q := range p.Queues() {
		if _, ok := q.Args["x-queue-version"]; ok {
			t.Errorf("quorum queue %s has the classic x-queue-version", q.Name)
		}
	}
	// What nothing but the operator's tools consume must not be dropped by
	// the broker's delivery limit; the work queue keeps the configured one.
	for _, q := range p.Queues() {
		if q.Unbounded != (q.Role != topology.RoleWork) {
			t.Errorf("%s queue %s: unbounded %t", q.Role, q.Name, q.Unbounded)
		}
	}
	if s := p.String(); strings.Count(s, "(and x-delivery-limit=-1 on RabbitMQ 4.x)") != 3 {
		t.Errorf("plan text does not say which queues get no delivery limit:\n%s", s)
	}
	for _, q := range p.Document().Queues {
		if q.UnlimitedDeliveries != (q.Role != topology.RoleWork) {
			t.Errorf("document: %s queue %s: unlimited deliveries %t", q.Role, q.Name, q.UnlimitedDeliveries)
		}
	}
	if w := p.Warnings(); len(w) != 0 {
		t.Errorf("warnings with a delivery limit: %q", w)
	}
	assertNeverExpires(t, &p)
}

// TestFromConfigQuorumTiersOnClassic: queue.tierType quorum makes a
// classic work queue's tiers quorum queues that hand messages back at least
// once; the work queue and the DLQ stay classic.
func TestFromConfigQuorumTiersOnClassic(t *testing.T) {
	c := topoConfig(t, func(c *config.Config) {
		c.Queue.TierType = "quorum"
		c.Retry.Tiers = durs(time.Second, 5*time.Second)
	})
	p := topology.FromConfig(c)
	for _, q := range []topology.Queue{p.Work, p.DLQ} {
		if q.Args["x-queue-type"] != "classic" || q.Unbounded {
			t.Errorf("%s queue %s: args %#v, unbounded %t; want a classic queue", q.Role, q.Name, q.Args, q.Unbounded)
		}
	}
	if _, ok := p.Work.Args["x-dead-letter-strategy"]; ok {
		t.Errorf("classic work queue given a dead-letter strategy: %#v", p.Work.Args)
	}
	if len(p.Tiers) != 2 {
		t.Fatalf("%d tiers", len(p.Tiers))
	}
	for i, q := range p.Tiers {
		want := map[string]any{
			"x-queue-type":              "quorum",
			"x-message-ttl":             int32([]int{1000, 5000}[i]),
			"x-dead-letter-exchange":    "",
			"x-dead-letter-routing-key": "orders",
			"x-dead-letter-strategy":    "at-least-once",
			"x-overflow":                "reject-publish",
		}
		if !reflect.DeepEqual(q.Args, want) || !q.Unbounded {
			t.Errorf("tier %s args %#v unbounded %t, want %#v and unbounded", q.Name, q.Args, q.Unbounded, want)
		}
	}
	// tierType classic is an opt-in, with the risk it takes in a warning.
	c.Queue.TierType = "classic"
	cp := topology.FromConfig(c)
	if got := cp.Tiers[0].Args["x-queue-type"]; got != "classic" || cp.Tiers[0].Successor != "orders.retry.1s.classic" {
		t.Errorf("tierType classic: tier type %v, successor %q", got, cp.Tiers[0].Successor)
	}
	if !cp.TierTypeChosen {
		t.Error("tierType classic: the plan does not say the type was chosen")
	}
	if w := strings.Join(cp.Warnings(), "\n"); !strings.Contains(w, "at most once") {
		t.Errorf("classic tiers without a warning: %q", w)
	}
	c.Queue.TierType = ""
	if dp := topology.FromConfig(c); dp.TierTypeChosen || strings.Contains(strings.Join(dp.Warnings(), "\n"), "at most once") {
		t.Errorf("default tiers: chosen %t, warnings %q", dp.TierTypeChosen, dp.Warnings())
	}
}

// TestTierQueueFollowsUseTier: the name a move publishes to is the one
// the broker package settled on, for every copy of the plan.
func TestTierQueueFollowsUseTier(t *testing.T) {
	p := topology.FromConfig(topoConfig(t, func(c *config.Config) { c.Retry.Tiers = durs(time.Second) }))
	cp := p
	if name, _ := cp.TierQueue(time.Second); name != "orders.retry.1s" {
		t.Fatalf("tier before UseTier: %q", name)
	}
	p.UseTier(time.Second, p.Tiers[0].Successor)
	if name, _ := cp.TierQueue(time.Second); name != "orders.retry.1s.quorum" {
		t.Errorf("a copy of the plan publishes to %q after UseTier", name)
	}
	p.NoteTier("orders.retry.1s", "b")
	p.NoteTier("orders.retry.1s", "a")
	if n := cp.TierNotes(); len(n) != 1 || n[0] != "a" {
		t.Errorf("notes %q", n)
	}
}

func TestQuorumWithoutDeliveryLimitWarns(t *testing.T) {
	p := topology.FromConfig(topoConfig(t, func(c *config.Config) { c.Queue.Type = "quorum" }))
	if _, ok := p.Work.Args["x-delivery-limit"]; ok {
		t.Errorf("x-delivery-limit set without a configured limit: %#v", p.Work.Args)
	}
	w := p.Warnings()
	if len(w) != 1 || !strings.Contains(w[0], `"orders"`) || !strings.Contains(w[0], "delivery-limit") {
		t.Fatalf("warnings %q", w)
	}
	if s := p.String(); !strings.Contains(s, "warning: "+w[0]) {
		t.Errorf("plan text lacks the warning:\n%s", s)
	}
	// A delivery limit on a classic queue means nothing: config
	// validation refuses it (TestValidateRules).
}

// A delivery limit Hopper will not declare (topology.declare false: the
// queue keeps the arguments it was declared with) is a warning, which
// config validate prints and run logs.
func TestDeliveryLimitNotDeclaredWarns(t *testing.T) {
	for _, declare := range []bool{true, false} {
		p := topology.FromConfig(topoConfig(t, func(c *config.Config) {
			c.Queue.Type, c.Queue.DeliveryLimit, c.Topology.Declare = "quorum", 5, declare
		}))
		var found bool
		for _, w := range p.Warnings() {
			found = found || strings.Contains(w, "queue.deliveryLimit 5 is not applied")
		}
		if found == declare {
			t.Errorf("declare %v: warnings %q", declare, p.Warnings())
		}
	}
}

func TestPolicyTiersGetQueues(t *testing.T) {
	c := topoConfig(t, func(c *config.Config) {
		c.Retry.Tiers = durs(time.Second, 30*time.Second)
		c.Retry.Policies = []config.Policy{{Name: "slow", Match: config.Match{Type: "slow"}, Tiers: durs(30*time.Second, time.Hour)}}
	})
	p := topology.FromConfig(c)
	var names []string
	for _, q := range p.Tiers {
		names = append(names, q.Name)
	}
	if want := []string{"orders.retry.1s", "orders.retry.30s", "orders.retry.1h"}; !reflect.DeepEqual(names, want) {
		t.Errorf("tier queues %q, want %q", names, want)
	}
}

func TestNameTemplates(t *testing.T) {
	cases := []struct {
		tmpl, queue string
		delay       time.Duration
		want        string
	}{
		{"{queue}.retry.{delay}", "orders", time.Second, "orders.retry.1s"},
		{"{queue}.retry.{delay}", "orders", 500 * time.Millisecond, "orders.retry.500ms"},
		{"{queue}.retry.{delay}", "orders", 2 * time.Minute, "orders.retry.2m"},
		{"{queue}.retry.{delay}", "orders", 90 * time.Minute, "orders.retry.1h30m"},
		{"{queue}.retry.{delay}", "orders", 2 * time.Hour, "orders.retry.2h"},
		{"{queue}.retry.{delay}", "orders", 90 * time.Second, "orders.retry.1m30s"},
		{"retry-{delay}-{queue}-{delay}", "q", 5 * time.Second, "retry-5s-q-5s"},
		{"{queue}.dlq", "a.b", 0, "a.b.dlq"},
		{"static", "q", time.Second, "static"},
		{"{queue}", "{delay}", time.Second, "{delay}"}, // one pass: no expansion of expanded text
	}
	for _, tc := range cases {
		if got := topology.Name(tc.tmpl, tc.queue, tc.delay); got != tc.want {
			t.Errorf("Name(%q, %q, %v) = %q, want %q", tc.tmpl, tc.queue, tc.delay, got, tc.want)
		}
	}
}

// TestSeed002Naming: the {prefix}.queue.{service} / {prefix}.retry-queue.{service}
// / {prefix}.dlq.{service} scheme of an existing event bus fits the templates.
func TestSeed002Naming(t *testing.T) {
	// One sidecar per service: {queue} is the service's name.
	c := topoConfig(t, func(c *config.Config) {
		c.Queue.Name = "orders"
		c.Topology.RetryQueue = "wms.retry-queue.{queue}-{delay}"
		c.Topology.DLQ = "wms.dlq.{queue}"
		c.Retry.Tiers = durs(5 * time.Second)
	})
	p := topology.FromConfig(c)
	if len(p.Tiers) != 1 || p.Tiers[0].Name != "wms.retry-queue.orders-5s" || p.DLQ.Name != "wms.dlq.orders" {
		t.Errorf("tiers %+v dlq %s", p.Tiers, p.DLQ.Name)
	}
	if p.Tiers[0].Args["x-dead-letter-routing-key"] != "orders" {
		t.Errorf("tier dead-letters to %v", p.Tiers[0].Args["x-dead-letter-routing-key"])
	}

	// The work queue keeps its full seed name; the others are written out.
	c = topoConfig(t, func(c *config.Config) {
		c.Queue.Name = "wms.queue.orders"
		c.Topology.RetryQueue = "wms.retry-queue.orders.{delay}"
		c.Topology.DLQ = "wms.dlq.orders"
		c.Retry.Tiers = durs(5 * time.Second)
	})
	p = topology.FromConfig(c)
	if p.Work.Name != "wms.queue.orders" || p.Tiers[0].Name != "wms.retry-queue.orders.5s" || p.DLQ.Name != "wms.dlq.orders" {
		t.Errorf("work %s tier %s dlq %s", p.Work.Name, p.Tiers[0].Name, p.DLQ.Name)
	}
	if p.Tiers[0].Args["x-dead-letter-routing-key"] != "wms.queue.orders" || p.Tiers[0].Args["x-message-ttl"] != int32(5000) {
		t.Errorf("tier args %#v", p.Tiers[0].Args)
	}
}

func TestTierQueueAndQueues(t *testing.T) {
	p := topology.FromConfig(topoConfig(t, func(c *config.Config) { c.Retry.Tiers = durs(mixedTiers...) }))
	for _, d := range mixedTiers {
		name, ok := p.TierQueue(d)
		if !ok || name != topology.Name("{queue}.retry.{delay}", "orders", d) {
			t.Errorf("TierQueue(%v) = %q, %v", d, name, ok)
		}
	}
	for _, d := range []time.Duration{0, 5 * time.Second, 999 * time.Millisecond} {
		if name, ok := p.TierQueue(d); ok || name != "" {
			t.Errorf("TierQueue(%v) = %q, %v for a delay with no tier", d, name, ok)
		}
	}
	qs := p.Queues()
	if len(qs) != 2+len(mixedTiers) || qs[0].Role != topology.RoleWork || qs[len(qs)-1].Role != topology.RoleDLQ {
		t.Fatalf("Queues() = %+v", qs)
	}
	seen := map[string]bool{}
	for _, q := range qs {
		if seen[q.Name] {
			t.Errorf("queue %s planned twice", q.Name)
		}
		seen[q.Name] = true
	}
	// Each queue has its own argument map.
	p.Tiers[0].Args["x-test"] = 1
	if _, leaked := p.Tiers[1].Args["x-test"]; leaked {
		t.Error("tier queues share one argument map")
	}
	if _, leaked := p.DLQ.Args["x-test"]; leaked {
		t.Error("tier and DLQ share one argument map")
	}
}

func TestVerifyModeAndPlanText(t *testing.T) {
	p := topology.FromConfig(topoConfig(t, func(c *config.Config) { c.Topology.Declare = false }))
	if p.Declare || p.Work.Owned {
		t.Errorf("declare=false: plan.Declare %v, work owned %v", p.Declare, p.Work.Owned)
	}
	for _, q := range append(p.Tiers, p.DLQ) {
		if !q.Owned {
			t.Errorf("%s not owned", q.Name)
		}
	}
	s := p.String()
	for _, want := range []string{
		"mode: verify (topology.declare=false)",
		"work  orders durable=true x-queue-type=classic x-queue-version=2",
		"tier  orders.retry.1s durable=true x-dead-letter-exchange= x-dead-letter-routing-key=orders x-dead-letter-strategy=at-least-once x-message-ttl=1000 x-overflow=reject-publish x-queue-type=quorum",
		"tier  orders.retry.30m durable=true",
		"dlq   orders.dlq durable=true",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("plan text lacks %q:\n%s", want, s)
		}
	}
	// The operator's work queue: Hopper cannot see its arguments, so it
	// says what the queue needs for broker drops to reach the DLQ.
	if want := `warning: work queue "orders" is declared by the operator: give it x-dead-letter-exchange="" and x-dead-letter-routing-key="orders.dlq"`; !strings.Contains(s, want) {
		t.Errorf("plan text lacks %q:\n%s", want, s)
	}
	if n := strings.Count(s, "warning"); n != 1 {
		t.Errorf("%d warnings in a classic verify plan, want 1:\n%s", n, s)
	}
}

// TestLongTierTTLFits: x-message-ttl is an int32 of milliseconds (about
// 24.8 days). A longer tier must be rejected by Validate or declared with
// its real TTL, never with a wrapped-around negative one.
func TestLongTierTTLFits(t *testing.T) {
	c := config.Default()
	c.Queue.Name = "orders"
	c.Retry.Tiers = durs(time.Second, 600*time.Hour)
	if err := c.Validate(); err != nil {
		return // rejected: fine
	}
	p := topology.FromConfig(&c)
	ttl := reflect.ValueOf(p.Tiers[1].Args["x-message-ttl"]).Int()
	if ttl != int64(600*time.Hour/time.Millisecond) {
		t.Fatalf("600h tier planned with x-message-ttl=%d", ttl)
	}
}

// The plan as data (topology plan -o json) holds the same queues and
// arguments as the text, and encodes to JSON.
func TestPlanDocument(t *testing.T) {
	c := topoConfig(t, func(c *config.Config) { c.Retry.Tiers = durs(time.Second, 2*time.Minute) })
	p := topology.FromConfig(c)
	d := p.Document()
	if len(d.Queues) != 4 || d.Queues[0].Role != topology.RoleWork || d.Queues[3].Role != topology.RoleDLQ {
		t.Fatalf("queues %+v", d.Queues)
	}
	if d.Queues[2].Delay != "2m" || d.Queues[2].Name != "orders.retry.2m" {
		t.Errorf("tier %+v", d.Queues[2])
	}
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"x-dead-letter-routing-key":"orders.dlq"`) {
		t.Errorf("json lacks the work queue's dead-letter target: %s", b)
	}
}

func TestBindings(t *testing.T) {
	c := config.Default()
	c.Queue.Name = "wms.queue.cincout"
	no := false
	c.Topology.Bindings = []config.Binding{
		{Exchange: "wms.main-exchange", Type: "fanout"},
		{Exchange: "events", Type: "topic", Durable: &no, RoutingKeys: []string{"order.*", "invoice.#"}},
		{Exchange: "events", Type: "topic", RoutingKeys: []string{"refund.created"}},
		{Exchange: "hdr", Type: "headers", Headers: map[string]string{"kind": "order"}},
		{Exchange: "amq.topic", Type: "topic", RoutingKeys: []string{"audit.#"}},
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	p := topology.FromConfig(&c)
	wantEx := []topology.Exchange{
		{Name: "wms.main-exchange", Type: "fanout", Durable: true, Owned: true},
		{Name: "events", Type: "topic", Durable: false, Owned: true},
		{Name: "hdr", Type: "headers", Durable: true, Owned: true},
		{Name: "amq.topic", Type: "topic", Durable: true, Owned: false},
	}
	if !reflect.DeepEqual(p.Exchanges, wantEx) {
		t.Errorf("exchanges:\n got %+v\nwant %+v", p.Exchanges, wantEx)
	}
	q := c.Queue.Name
	wantB := []topology.Binding{
		{Exchange: "wms.main-exchange", Queue: q},
		{Exchange: "events", Queue: q, RoutingKey: "order.*"},
		{Exchange: "events", Queue: q, RoutingKey: "invoice.#"},
		{Exchange: "events", Queue: q, RoutingKey: "refund.created"},
		{Exchange: "hdr", Queue: q, Args: map[string]any{"x-match": "all", "kind": "order"}},
		{Exchange: "amq.topic", Queue: q, RoutingKey: "audit.#"},
	}
	if !reflect.DeepEqual(p.Bindings, wantB) {
		t.Errorf("bindings:\n got %+v\nwant %+v", p.Bindings, wantB)
	}
	text := p.String()
	for _, want := range []string{
		"exchange events type=topic durable=false\n",
		"exchange amq.topic type=topic durable=true (the broker's own: checked, not declared)\n",
		"binding wms.main-exchange -> wms.queue.cincout routingKey=\"\"\n",
		"binding hdr -> wms.queue.cincout kind=order x-match=all\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("plan text lacks %q:\n%s", want, text)
		}
	}
	doc := p.Document()
	if len(doc.Exchanges) != 4 || len(doc.Bindings) != 6 || doc.Bindings[4].Arguments["x-match"] != "all" {
		t.Errorf("document: %+v", doc)
	}
}

// Arguments that a supported RabbitMQ release refuses or ignores are named
// in the plan's warnings, which `config validate` prints.
func TestArgumentsSomeBrokerRefusesWarn(t *testing.T) {
	c := config.Default()
	c.Queue.Name = "orders"
	c.Queue.Arguments = map[string]config.Argument{
		"x-queue-version":        config.IntArgument(1),
		"x-queue-mode":           config.StringArgument("lazy"),
		"x-queue-master-locator": config.StringArgument("min-masters"),
	}
	p := topology.FromConfig(&c)
	w := strings.Join(p.Warnings(), "\n")
	for _, want := range []string{"x-queue-version=1: RabbitMQ 4.x refuses it", "x-queue-mode=lazy: RabbitMQ 3.12 and later accept it and ignore it",
		"x-queue-master-locator=min-masters: RabbitMQ 4.x refuses it"} {
		if !strings.Contains(w, want) {
			t.Errorf("warnings lack %q:\n%s", want, w)
		}
	}
	c.Queue.Arguments = map[string]config.Argument{"x-queue-version": config.IntArgument(2)}
	p = topology.FromConfig(&c)
	if w := strings.Join(p.Warnings(), "\n"); strings.Contains(w, "x-queue-version") {
		t.Errorf("version 2 warned about:\n%s", w)
	}
}
