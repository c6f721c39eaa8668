package config_test

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/msg"
)

func TestRoutesValidation(t *testing.T) {
	checkValidation(t, []validationCase{
		{`routes: [{name: orders, match: 'headers["x-event-type"] == "order"', path: /orders}]
filter: 'properties.type != "ping"'
onFiltered: dlq
onBodyError: dlq
onFilterError: deliver`, ""},
		{`filter: 'true'
onFilterError: dlq`, ""},
		{`routes: [{name: a, match: 'routingKey == "a" &&'}]`, "routes[0].match: line 1, column 20: unexpected token EOF"},
		{`routes: [{name: a, match: 'true'}, {name: b, match: 'routingKey > 3'}]`, "routes[1].match: line 1, column 12: invalid operation: > (mismatched types string and int)"},
		{`routes: [{name: a, match: 'routingKey'}]`, "routes[0].match: expected bool, but got string"},
		{`filter: 'properties.typ == "x"'`, "filter: line 1, column 12:"},
		{`routes: [{name: a, match: 'true', path: orders}]`, `routes[0].path: must start with /, got "orders"`},
		{`routes: [{match: 'true'}]`, ""},
		{`routes: [{match: 'true', path: /orders}, {match: 'false', path: /orders}]`, ""},
		{`routes: [{name: a, match: 'true'}, {name: a, match: 'false'}]`, `routes[1].name: "a" is already the name of routes[0]`},
		{`onFiltered: drop`, `onFiltered: "drop" is not ack or dlq`},
		{`onBodyError: ack`, `onBodyError: "ack" is not skip or dlq`},
		{`onFilterError: ack`, `onFilterError: "ack" is not deliver or dlq`},
		{`routes: [{name: a, match: 'true', retry: {tiers: [], outcomes: {"999": retry}, onExpired: keep}}]`, "routes[0].retry.tiers: at least one delay tier"},
		{`routes: [{name: a, match: 'true', retry: {outcomes: {"999": retry}}}]`, "routes[0].retry.outcomes"},
		{`routes: [{name: a, match: 'true', retry: {onExpired: keep}}]`, "routes[0].retry.onExpired: must be dlq or drop"},
		{`routes: [{name: a, match: 'true'}]
consumer: {batch: {maxMessages: 8}}`, "routes: routes and filters cannot be combined with batch delivery"},
		{`filter: 'true'
consumer: {batch: {maxMessages: 8}}`, "filter: routes and filters cannot be combined with batch delivery"},
	})
}

const routedSubscriptions = `
app: {url: http://127.0.0.1:8080/}
retry: {maxAttempts: 5, tiers: ["1s", "5s"]}
subscriptions:
  - queue: {name: q0}
  - queue: {name: q1}
    path: /events
    filter: '"x-tenant" in headers'
    routes:
      - {name: orders, match: 'headers["x-event-type"] == "order"', path: "/orders/{routingKey}"}
      - {name: stock, match: 'routingKey startsWith "stock."', retry: {maxAttempts: 2, tiers: ["3s"]}}
      - {name: bad, match: 'body.x == = 1'}
`

func TestRoutesPerSubscriptionKeyPaths(t *testing.T) {
	c, err := parse(t, routedSubscriptions)
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, c.Validate(), "subscriptions[1].routes[2].match: line 1, column 11:")

	c.Subscriptions[1].Routes = c.Subscriptions[1].Routes[:2]
	if err := c.Validate(); err != nil {
		t.Fatalf("valid config rejected: %v", err)
	}
	subs := c.SubscriptionConfigs()
	if subs[0].Routed() {
		t.Fatal("q0 has no rules but is routed")
	}
	if tb, err := subs[0].RouteTable(); tb != nil || err != nil {
		t.Fatalf("q0: table %v, error %v; want none", tb, err)
	}
	e := subs[1]
	tb, err := e.RouteTable()
	if err != nil {
		t.Fatal(err)
	}
	routes := tb.Routes()
	if len(routes) != 2 || routes[0].Policy != nil {
		t.Fatalf("routes %+v: want orders without a policy of its own", routes)
	}
	pol := routes[1].Policy
	if pol == nil || pol.MaxAttempts != 2 || !slices.Equal(pol.Tiers, []time.Duration{3 * time.Second}) {
		t.Fatalf("stock's policy %+v: want maxAttempts 2 and tiers [3s]", pol)
	}
	if def := e.Selector().Default; pol.MaxCrashes != def.MaxCrashes || pol.MaxRequeues != def.MaxRequeues {
		t.Fatalf("stock's policy %+v is not built over the defaults %+v", pol, def)
	}
	if got := e.RouteURLs(); len(got) != 1 || got["orders"] != "http://127.0.0.1:8080/orders/{routingKey}" {
		t.Fatalf("route URLs %v: want orders' path on app.url's host", got)
	}
	// The route's tier needs its tier queue; q0 has none of it.
	if got := e.AllTiers(); !slices.Equal(got, []time.Duration{time.Second, 3 * time.Second, 5 * time.Second}) {
		t.Fatalf("q1 tiers %v, want the route's 3s among them", got)
	}
	if got := subs[0].AllTiers(); slices.Contains(got, 3*time.Second) {
		t.Fatalf("q0 tiers %v hold q1's route tier", got)
	}
	// The filter is the subscription's: a message without the header is
	// left out.
	if d := tb.Decide(&msg.Message{}, "stock.x", ""); d.Reason != "filtered" {
		t.Fatalf("decision %+v, want filtered", d)
	}
}

// onFilterError is a subscription's own, checked under its key path, and
// reaches its table: a message the filter cannot be evaluated for is
// dead-lettered as filter-error by default and delivered with deliver.
func TestOnFilterErrorPerSubscription(t *testing.T) {
	c, err := parse(t, `
app: {url: http://127.0.0.1:8080/}
subscriptions:
  - queue: {name: q0}
    filter: 'headers["x-level"] > 3'
  - queue: {name: q1}
    filter: 'headers["x-level"] > 3'
    onFilterError: deliver
  - queue: {name: q2}
    filter: 'true'
    onFilterError: drop
`)
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, c.Validate(), `subscriptions[2].onFilterError: "drop" is not deliver or dlq`)
	c.Subscriptions = c.Subscriptions[:2]
	if err := c.Validate(); err != nil {
		t.Fatalf("valid config rejected: %v", err)
	}
	subs := c.SubscriptionConfigs()
	for i, want := range []string{"filter-error", ""} {
		tb, err := subs[i].RouteTable()
		if err != nil {
			t.Fatal(err)
		}
		if d := tb.Decide(&msg.Message{}, "k", ""); d.Reason != want {
			t.Errorf("q%d: decision %+v, want reason %q", i, d, want)
		}
	}
}

func TestTopLevelRoutesRefusedWithSubscriptions(t *testing.T) {
	c, err := parse(t, routedSubscriptions+`
routes: [{name: x, match: 'true'}]
filter: 'true'
onFiltered: dlq
onBodyError: dlq
onFilterError: deliver
`)
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, c.Validate(),
		"routes: with subscriptions, set routes on each subscription",
		"filter: with subscriptions, set filter on each subscription",
		"onFiltered: with subscriptions", "onBodyError: with subscriptions", "onFilterError: with subscriptions")
}

func TestOneQueueRoutes(t *testing.T) {
	c, err := parse(t, `
queue: {name: q}
app: {url: "http://127.0.0.1:8080/base?x=1"}
routes:
  - {name: prio, match: 'body.priority == "high"', path: /priority, retry: {tiers: ["7s"]}}
`)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	subs := c.SubscriptionConfigs()
	if len(subs) != 1 || len(subs[0].Routes) != 1 {
		t.Fatalf("the one-queue form lost its routes: %+v", subs)
	}
	if got := subs[0].RouteURLs()["prio"]; got != "http://127.0.0.1:8080/priority" {
		t.Fatalf("prio URL %q", got)
	}
	if !slices.Contains(c.AllTiers(), 7*time.Second) {
		t.Fatalf("tiers %v lack the route's 7s", c.AllTiers())
	}
	var _ config.Route = c.Routes[0]
}

// The routes page's seed example of routes and filters is a valid config
// whose route tier gets its tier queue.
func TestReadmeRoutesExample(t *testing.T) {
	readme, err := os.ReadFile("../docs/routes.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(readme)
	i := strings.Index(s, "# Routes and filters")
	if i < 0 {
		t.Fatal("docs/routes.md has no Routes and filters section")
	}
	j := strings.Index(s[i:], "```yaml\n")
	k := strings.Index(s[i+j+8:], "```")
	if j < 0 || k < 0 {
		t.Fatal("no yaml example in the Routes and filters section")
	}
	c, err := parse(t, s[i+j+8:i+j+8+k])
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("docs/routes.md example invalid: %v", err)
	}
	e := c.SubscriptionConfigs()[0]
	tb, err := e.RouteTable()
	if err != nil || len(tb.Routes()) != 3 || !tb.HasFilter() {
		t.Fatalf("docs/routes.md example: table %v, error %v; want 3 routes and a filter", tb, err)
	}
	if !slices.Contains(e.AllTiers(), 30*time.Second) {
		t.Fatalf("tiers %v lack the stock route's 30s", e.AllTiers())
	}
}

// A route without a name, as configs had before routes were named, is
// still valid: it is named after its path, or its position without one,
// and kept apart from the names given.
func TestRoutesDefaultNames(t *testing.T) {
	c, err := parse(t, `queue: {name: q}
routes:
  - {match: 'routingKey == "a"', path: "/orders/{routingKey}"}
  - {match: 'routingKey == "b"', path: "/orders/{routingKey}"}
  - {match: 'routingKey == "c"'}
  - {name: route-5, match: 'routingKey == "d"'}
  - {match: 'routingKey == "e"', path: /}
subscriptions: []
`)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range c.Routes {
		names = append(names, r.Name)
	}
	if want := []string{"orders-routingKey", "orders-routingKey-2", "route-3", "route-5", "route-5-5"}; !slices.Equal(names, want) {
		t.Errorf("route names %q, want %q", names, want)
	}
}
