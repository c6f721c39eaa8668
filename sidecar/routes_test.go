package sidecar_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/sidecar"
)

func withType(typ string) pubOpt { return func(m *msg.Message) { m.Type = typ } }

func withJSON(body string) pubOpt {
	return func(m *msg.Message) { m.ContentType, m.Body = "application/json", []byte(body) }
}

// routedConfig binds the test queue to a topic exchange of its own (so
// messages carry routing keys) and returns the exchange.
func routedConfig(t *testing.T, appURL string) (config.Config, string) {
	cfg := testConfig(t, appURL)
	ex := cfg.Queue.Name + ".ex"
	cfg.Topology.Bindings = []config.Binding{{Exchange: ex, Type: "topic", RoutingKeys: []string{"#"}}}
	return cfg, ex
}

// pathsOf lists the paths a message reached the app at, in order.
func pathsOf(app *scriptApp, id string) []string {
	var out []string
	for _, c := range app.callsFor(id) {
		out = append(out, c.Path)
	}
	return out
}

// Routes by header, by routing key and by a JSON body field send each
// message to its own path, first match wins, and a message no route takes
// goes to the queue's own path. A retried message keeps its route: it comes
// back from its tier queue with another routing key, and the rules see the
// original. A rule ordering a missing header against a number counts as
// false for the messages without it (counted, not fatal), a body rule on a
// text/plain body is skipped, and the filter leaves heartbeats out: acked,
// never sent to the app. Spans and metrics carry the route.
func TestRoutesByHeaderKeyAndBody(t *testing.T) {
	app := newScriptApp(t)
	cfg, ex := routedConfig(t, app.URL)
	cfg.Admin.Listen = "127.0.0.1:0"
	cfg.Filter = `properties.type != "heartbeat"`
	cfg.Routes = []config.Route{
		{Name: "urgent", Match: `headers["x-level"] > 3`, Path: "/urgent"},
		{Name: "orders", Match: `headers["x-event-type"] == "order"`, Path: "/orders"},
		{Name: "stock", Match: `routingKey startsWith "stock."`, Path: "/stock/{routingKey}"},
		{Name: "priority", Match: `body.priority == "high"`, Path: "/priority"},
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	r := startWith(t, cfg, func(s *sidecar.Sidecar) { s.TracerProvider = tp })
	q := r.cfg.Queue.Name

	app.script("stock-1", 500, 200)
	r.publish("urgent-1", via(ex, "any.key"), withHeader("x-level", int32(5)), withHeader("x-event-type", "order"))
	r.publish("order-1", via(ex, "stock.but.order"), withHeader("x-event-type", "order"))
	r.publish("stock-1", via(ex, "stock.moved"))
	r.publish("prio-1", via(ex, "other"), withJSON(`{"priority":"high"}`))
	r.publish("plain-1", via(ex, "other"), withJSON(`{"priority":"low"}`))
	r.publish("text-1", via(ex, "other"))
	r.publish("beat-1", via(ex, "stock.moved"), withType("heartbeat"))
	r.settled(0)

	for id, want := range map[string][]string{
		"urgent-1": {"/urgent"},
		"order-1":  {"/orders"},
		"stock-1":  {"/stock/stock.moved", "/stock/stock.moved"},
		"prio-1":   {"/priority"},
		"plain-1":  {"/msg"},
		"text-1":   {"/msg"},
		"beat-1":   nil,
	} {
		if got := pathsOf(app, id); !slices.Equal(got, want) {
			t.Errorf("%s reached the app at %v, want %v", id, got, want)
		}
	}

	// Counted per delivery, as hopper_deliveries_total is: stock-1 came
	// twice (its retry came back from the tier queue).
	for route, want := range map[string]float64{"urgent": 1, "orders": 1, "stock": 2, "priority": 1, "": 2} {
		if v := labelled(t, r.sc, "hopper_routed_total", map[string]string{"queue": q, "route": route}); v != want {
			t.Errorf("hopper_routed_total{route=%q} = %v, want %v", route, v, want)
		}
	}
	if v := labelled(t, r.sc, "hopper_filtered_total", map[string]string{"queue": q}); v != 1 {
		t.Errorf("hopper_filtered_total = %v, want 1", v)
	}
	// Every delivery but urgent-1's lacks x-level (stock-1 twice); the
	// body rule runs on text-1 alone among text bodies (stock-1 and
	// order-1 are taken before it).
	if v := labelled(t, r.sc, "hopper_route_rule_errors_total", map[string]string{"queue": q, "kind": "eval"}); v != 6 {
		t.Errorf("eval errors = %v, want 6 (one per delivery without x-level)", v)
	}
	if v := labelled(t, r.sc, "hopper_route_rule_errors_total", map[string]string{"queue": q, "kind": "body"}); v != 1 {
		t.Errorf("body errors = %v, want 1 (text-1)", v)
	}
	if v := labelled(t, r.sc, "hopper_deliveries_total", map[string]string{"queue": q, "outcome": "ack", "status_class": "filtered"}); v != 1 {
		t.Errorf("filtered acks = %v, want 1", v)
	}

	waitfor.Until(t, 5*time.Second, "spans ended", func() bool { return len(rec.Ended()) >= 8 })
	routes := map[string][]string{}
	for _, s := range rec.Ended() {
		if s.SpanKind() != trace.SpanKindConsumer {
			continue
		}
		attrs := map[string]string{}
		for _, kv := range s.Attributes() {
			attrs[string(kv.Key)] = kv.Value.Emit()
		}
		id := attrs["messaging.message.id"]
		routes[id] = append(routes[id], attrs["hopper.route"])
		if id == "beat-1" && attrs["hopper.filtered"] != "true" {
			t.Errorf("beat-1's span lacks hopper.filtered: %v", attrs)
		}
	}
	for id, want := range map[string][]string{
		"stock-1": {"stock", "stock"}, "prio-1": {"priority"}, "plain-1": {""}, "beat-1": {""},
	} {
		if got := routes[id]; !slices.Equal(got, want) {
			t.Errorf("%s's spans carry hopper.route %q, want %q", id, got, want)
		}
	}
}

// onFiltered dlq and onBodyError dlq: a message the filter leaves out is
// dead-lettered with reason filtered, one whose body a rule cannot read
// with reason filter-error (and the cause); neither reaches the app, both
// through the confirmed move, so the work queue ends empty and nothing is
// lost.
func TestFilterAndBodyErrorToDLQ(t *testing.T) {
	app := newScriptApp(t)
	cfg, ex := routedConfig(t, app.URL)
	cfg.Filter = `"x-tenant" in headers`
	cfg.OnFiltered = "dlq"
	cfg.OnBodyError = "dlq"
	cfg.Routes = []config.Route{{Name: "priority", Match: `body.priority == "high"`, Path: "/priority"}}
	r := start(t, cfg)

	r.publish("no-tenant", via(ex, "k"), withJSON(`{"priority":"high"}`))
	r.publish("text", via(ex, "k"), withHeader("x-tenant", "acme"))
	r.publish("broken", via(ex, "k"), withHeader("x-tenant", "acme"), withJSON(`{"priority":`))
	r.publish("ok", via(ex, "k"), withHeader("x-tenant", "acme"), withJSON(`{"priority":"high"}`))
	r.settled(3)

	if got := pathsOf(app, "ok"); !slices.Equal(got, []string{"/priority"}) {
		t.Errorf("ok reached the app at %v, want [/priority]", got)
	}
	for _, id := range []string{"no-tenant", "text", "broken"} {
		if n := len(app.callsFor(id)); n != 0 {
			t.Errorf("%s reached the app %d times, want never", id, n)
		}
	}
	dead := r.drain(r.sc.Plan().DLQ.Name)
	for id, want := range map[string]string{"no-tenant": "filtered", "text": "filter-error", "broken": "filter-error"} {
		m, ok := dead[id]
		if !ok {
			t.Errorf("%s is not in the DLQ (holds %d)", id, len(dead))
			continue
		}
		if reason := msg.DeadLetterReason(m); reason != want {
			t.Errorf("%s dead-lettered as %q, want %q", id, reason, want)
		}
		if want == "filter-error" && m.String("x-final-error") == "" {
			t.Errorf("%s carries no x-final-error saying why its body could not be read", id)
		}
	}
	if v := labelled(t, r.sc, "hopper_dead_lettered_total", map[string]string{"queue": r.cfg.Queue.Name, "reason": "filter-error"}); v != 2 {
		t.Errorf("filter-error dead-letterings = %v, want 2", v)
	}
}

// A filter that cannot be evaluated never filters a message. With the
// default onFiltered ack and onBodyError skip, a message the filter errs on
// (a missing header ordered against a number, a body that is not JSON) is
// dead-lettered with reason filter-error and the cause, through the
// confirmed move: never acked unseen. A message the filter makes false is
// filtered, one it makes true delivered. With onFilterError deliver the
// messages it errs on reach the app instead.
func TestFilterErrorNeverAcks(t *testing.T) {
	t.Run("default", func(t *testing.T) {
		app := newScriptApp(t)
		cfg, ex := routedConfig(t, app.URL)
		cfg.Filter = `headers["x-level"] > 3 && body.ok == true`
		r := start(t, cfg)
		q := r.cfg.Queue.Name

		r.publish("no-level", via(ex, "k"), withJSON(`{"ok":true}`))
		r.publish("text", via(ex, "k"), withHeader("x-level", int32(5)))
		r.publish("low", via(ex, "k"), withHeader("x-level", int32(1)), withJSON(`{"ok":true}`))
		r.publish("high", via(ex, "k"), withHeader("x-level", int32(5)), withJSON(`{"ok":true}`))
		r.settled(2)

		if got := pathsOf(app, "high"); !slices.Equal(got, []string{"/msg"}) {
			t.Errorf("high reached the app at %v, want [/msg]", got)
		}
		for _, id := range []string{"no-level", "text", "low"} {
			if n := len(app.callsFor(id)); n != 0 {
				t.Errorf("%s reached the app %d times, want never", id, n)
			}
		}
		dead := r.drain(r.sc.Plan().DLQ.Name)
		for _, id := range []string{"no-level", "text"} {
			m, ok := dead[id]
			if !ok {
				t.Errorf("%s is not in the DLQ (holds %d): a filter error was settled as filtered", id, len(dead))
				continue
			}
			if reason := msg.DeadLetterReason(m); reason != "filter-error" {
				t.Errorf("%s dead-lettered as %q, want filter-error", id, reason)
			}
			if e := m.String("x-final-error"); !strings.Contains(e, "filter") {
				t.Errorf("%s's x-final-error %q does not say the filter failed", id, e)
			}
		}
		for name, want := range map[string]float64{
			"hopper_filtered_total": 1,
		} {
			if v := labelled(t, r.sc, name, map[string]string{"queue": q}); v != want {
				t.Errorf("%s = %v, want %v (low alone)", name, v, want)
			}
		}
		for labels, want := range map[[2]string]float64{
			{"hopper_route_rule_errors_total", "eval"}: 1,
			{"hopper_route_rule_errors_total", "body"}: 1,
		} {
			if v := labelled(t, r.sc, labels[0], map[string]string{"queue": q, "kind": labels[1]}); v != want {
				t.Errorf("%s{kind=%q} = %v, want %v", labels[0], labels[1], v, want)
			}
		}
		if v := labelled(t, r.sc, "hopper_dead_lettered_total", map[string]string{"queue": q, "reason": "filter-error"}); v != 2 {
			t.Errorf("filter-error dead-letterings = %v, want 2", v)
		}
	})
	t.Run("deliver", func(t *testing.T) {
		app := newScriptApp(t)
		cfg, ex := routedConfig(t, app.URL)
		cfg.Filter = `headers["x-level"] > 3`
		cfg.OnFilterError = "deliver"
		cfg.Routes = []config.Route{{Name: "orders", Match: `headers.kind == "order"`, Path: "/orders"}}
		r := start(t, cfg)
		q := r.cfg.Queue.Name

		r.publish("no-level", via(ex, "k"), withHeader("kind", "order"))
		r.publish("low", via(ex, "k"), withHeader("x-level", int32(1)))
		r.settled(0)

		if got := pathsOf(app, "no-level"); !slices.Equal(got, []string{"/orders"}) {
			t.Errorf("no-level reached the app at %v, want [/orders] (through the routes)", got)
		}
		if n := len(app.callsFor("low")); n != 0 {
			t.Errorf("low reached the app %d times, want never", n)
		}
		if v := labelled(t, r.sc, "hopper_filtered_total", map[string]string{"queue": q}); v != 1 {
			t.Errorf("hopper_filtered_total = %v, want 1 (low alone)", v)
		}
		if v := labelled(t, r.sc, "hopper_route_rule_errors_total", map[string]string{"queue": q, "kind": "eval"}); v != 1 {
			t.Errorf("eval errors = %v, want 1", v)
		}
	})
}

// A route's retry block is its messages' policy: route a allows 2 attempts
// and retries through a tier of its own (300ms, declared for it), route b
// has none and keeps the queue's 3 attempts.
func TestRouteRetryPolicy(t *testing.T) {
	app := newScriptApp(t)
	cfg, ex := routedConfig(t, app.URL)
	cfg.Routes = []config.Route{
		{Name: "a", Match: `headers.kind == "a"`, Path: "/a",
			Retry: &config.RouteRetry{MaxAttempts: ptr(config.Attempts(2)), Tiers: []config.Duration{config.Duration(300 * time.Millisecond)}}},
		{Name: "b", Match: `headers.kind == "b"`, Path: "/b"},
	}
	r := start(t, cfg)
	app.script("fail-a", 500)
	app.script("fail-b", 500)
	r.publish("fail-a", via(ex, "k"), withHeader("kind", "a"))
	r.publish("fail-b", via(ex, "k"), withHeader("kind", "b"))
	r.settled(2)

	if got := app.attempts("fail-a"); !slices.Equal(got, []int{1, 2}) {
		t.Errorf("fail-a attempts %v, want [1 2] (route a allows 2)", got)
	}
	if got := app.attempts("fail-b"); !slices.Equal(got, []int{1, 2, 3}) {
		t.Errorf("fail-b attempts %v, want [1 2 3] (the queue's default)", got)
	}
	if got := pathsOf(app, "fail-a"); !slices.Equal(got, []string{"/a", "/a"}) {
		t.Errorf("fail-a paths %v", got)
	}
	dead := r.drain(r.sc.Plan().DLQ.Name)
	for _, id := range []string{"fail-a", "fail-b"} {
		if m, ok := dead[id]; !ok || msg.DeadLetterReason(m) != "max-attempts" {
			t.Errorf("%s not dead-lettered as max-attempts: %v", id, dead[id])
		}
	}
	if v := labelled(t, r.sc, "hopper_retries_total", map[string]string{"queue": r.cfg.Queue.Name, "tier": "300ms"}); v != 1 {
		t.Errorf("retries through route a's 300ms tier = %v, want 1", v)
	}
}

// With ordered consumption, and with an ordering key, a filtered message
// is settled in its turn: it waits behind the message of its key held in
// place for its retry, and the app sees the others in publish order. The
// held message's route is decided once: its in-place attempts are one
// delivery.
func TestFilterKeepsOrder(t *testing.T) {
	for _, mode := range []string{"ordered", "orderingKey"} {
		t.Run(mode, func(t *testing.T) {
			app := newScriptApp(t)
			cfg, ex := routedConfig(t, app.URL)
			if mode == "ordered" {
				cfg.Consumer.Ordered = true
				cfg.Consumer.Workers = 1
			} else {
				cfg.Consumer.OrderingKey = "header:k"
			}
			cfg.Consumer.Prefetch = 10
			cfg.Filter = `headers.skip != true`
			cfg.Routes = []config.Route{{Name: "all", Match: `true`, Path: "/all"}}
			r := start(t, cfg)
			release := app.hold("m1")
			app.script("m1", 500, 200)
			r.publish("m1", via(ex, "k"), withHeader("k", "a"))
			r.publish("m2", via(ex, "k"), withHeader("k", "a"), withHeader("skip", true))
			r.publish("m3", via(ex, "k"), withHeader("k", "a"))
			r.publish("m4", via(ex, "k"), withHeader("k", "a"), withHeader("skip", true))
			r.publish("m5", via(ex, "k"), withHeader("k", "a"))
			// While m1 is at the app, the filtered m2 behind it is not
			// settled: it waits its turn.
			waitfor.Until(t, 30*time.Second, "m1 at the app and the rest delivered to Hopper", func() bool {
				return len(app.callsFor("m1")) == 1 && r.depth(r.cfg.Queue.Name) == 5
			})
			if v := labelled(t, r.sc, "hopper_filtered_total", map[string]string{"queue": r.cfg.Queue.Name}); v != 0 {
				t.Fatalf("hopper_filtered_total = %v while m1 is at the app, want 0: a filtered message jumped its lane", v)
			}
			release()
			r.settled(0)

			if got := app.order(func(call) bool { return true }); !slices.Equal(got, []string{"m1", "m3", "m5"}) {
				t.Errorf("app saw %v, want [m1 m3 m5]", got)
			}
			if got := app.attempts("m1"); !slices.Equal(got, []int{1, 2}) {
				t.Errorf("m1 attempts %v, want [1 2] in place", got)
			}
			q := r.cfg.Queue.Name
			if v := labelled(t, r.sc, "hopper_routed_total", map[string]string{"queue": q, "route": "all"}); v != 3 {
				t.Errorf("hopper_routed_total{route=all} = %v, want 3: m1's attempts in place are one delivery", v)
			}
			if v := labelled(t, r.sc, "hopper_filtered_total", map[string]string{"queue": q}); v != 2 {
				t.Errorf("hopper_filtered_total = %v, want 2", v)
			}
		})
	}
}

// Two subscriptions may name their routes alike: each queue's route sends
// its messages to that queue's path, and each is counted under its queue.
func TestRoutesPerSubscription(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	cfg, qa, qb := twoSubscriptions(t, cfg)
	base := strings.TrimSuffix(qa, ".a")
	cfg.Subscriptions[0].Routes = []config.Route{{Name: "special", Match: `headers.special == true`, Path: "/a-special"}}
	cfg.Subscriptions[1].Routes = []config.Route{{Name: "special", Match: `headers.special == true`, Path: "/b-special/{queue}"}}
	cfg.Subscriptions[1].Filter = `headers.skip != true`
	r := start(t, cfg)

	r.publish("s", via(base+".fan", "any"), withHeader("special", true))
	r.publish("skip", via(base+".fan", "any"), withHeader("skip", true))
	r.settledAll(nil)

	var got []string
	for _, c := range app.callsFor("s") {
		got = append(got, c.Path)
	}
	slices.Sort(got)
	if want := []string{"/a-special", "/b-special/" + qb}; !slices.Equal(got, want) {
		t.Errorf("s reached the app at %v, want %v", got, want)
	}
	if got := pathsOf(app, "skip"); !slices.Equal(got, []string{"/a/any"}) {
		t.Errorf("skip reached the app at %v, want only queue a's path (b filters it)", got)
	}
	for q, want := range map[string]float64{qa: 0, qb: 1} {
		if v := labelled(t, r.sc, "hopper_filtered_total", map[string]string{"queue": q}); v != want {
			t.Errorf("queue %s filtered %v, want %v", q, v, want)
		}
		if v := labelled(t, r.sc, "hopper_routed_total", map[string]string{"queue": q, "route": "special"}); v != 1 {
			t.Errorf("queue %s routed %v to special, want 1", q, v)
		}
	}
}
