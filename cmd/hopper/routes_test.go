package main_test

import (
	"strings"
	"testing"
)

// A bad routing expression is refused by `config validate` with its key
// path and the line and column inside the expression, in text and JSON;
// a type error is a config error too, not one found message by message.
func TestConfigValidateBadRouteExpression(t *testing.T) {
	file := configFile(t, `
app: {url: http://127.0.0.1:8080/}
subscriptions:
  - queue: {name: a}
  - queue: {name: b}
    filter: |
      "x-tenant" in headers &&
        headers["x-tenant"] == = "acme"
    routes:
      - {name: orders, match: 'headers["x-event-type"] == "order"', path: /orders}
      - {name: count, match: 'routingKey > 3'}
`)
	r := hopper(t, "config", "validate", "--config", file)
	if r.code != exitDataErr {
		t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", r.code, exitDataErr, r.stdout, r.stderr)
	}
	for _, want := range []string{
		"subscriptions[1].filter: line 2, column 26: unexpected token Operator(\"=\")",
		"subscriptions[1].routes[1].match: line 1, column 12: invalid operation: > (mismatched types string and int)",
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "routes[0]") {
		t.Errorf("the good route is reported:\n%s", r.stderr)
	}

	r = hopper(t, "config", "validate", "--config", file, "-o", "json")
	doc := decode[validateDoc](t, r)
	found := false
	for _, p := range doc.Errors {
		if p.Key == "subscriptions[1].routes[1].match" && strings.HasPrefix(p.Message, "line 1, column 12:") {
			found = true
		}
	}
	if doc.OK || !found {
		t.Fatalf("JSON report lacks the route's key and position: %+v", doc)
	}
}

// A valid config's report names each queue's routes, in order with their
// paths, and its filter with what becomes of the messages it leaves out and
// of those it cannot be evaluated for; -o json lists them per queue.
func TestConfigValidateShowsRoutes(t *testing.T) {
	file := configFile(t, `
app: {url: http://127.0.0.1:8080/}
subscriptions:
  - queue: {name: plain}
  - queue: {name: routed}
    filter: '"x-tenant" in headers'
    onFiltered: dlq
    routes:
      - {name: orders, match: 'headers["x-event-type"] == "order"', path: /orders}
      - {name: slow, match: 'body.slow == true', retry: {maxAttempts: 2}}
`)
	r := hopper(t, "config", "validate", "--config", file)
	if r.code != 0 {
		t.Fatalf("exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	want := `  queue "routed", 6 delay tier(s), DLQ "routed.dlq"
    routes: orders → /orders, slow → (queue's path) (own retry policy); filter "\"x-tenant\" in headers", filtered messages: dlq, filter errors: dlq
`
	if !strings.Contains(r.stdout, want) {
		t.Errorf("stdout lacks the routed queue's rules:\n%s\nwant:\n%s", r.stdout, want)
	}
	if strings.Count(r.stdout, "routes:") != 1 {
		t.Errorf("a queue without rules shows routes:\n%s", r.stdout)
	}

	doc := decode[validateDoc](t, hopper(t, "config", "validate", "--config", file, "-o", "json"))
	if len(doc.Queues) != 2 || len(doc.Queues[0].Routes) != 0 ||
		strings.Join(doc.Queues[1].Routes, ",") != "orders,slow" || doc.Queues[1].Filter != `"x-tenant" in headers` {
		t.Errorf("JSON queues %+v", doc.Queues)
	}
}
