package route

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

func mustCompile(t *testing.T, s Spec) *Table {
	t.Helper()
	tb, err := Compile(s)
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	return tb
}

var seed = Spec{
	Filter: `properties.type != "heartbeat"`,
	Routes: []RouteSpec{
		{Name: "orders", Match: `headers["x-event-type"] == "order"`},
		{Name: "stock", Match: `routingKey startsWith "stock."`},
		{Name: "priority", Match: `body.priority == "high"`},
	},
}

func TestDecideRoutes(t *testing.T) {
	tb := mustCompile(t, seed)
	cases := []struct {
		name       string
		m          msg.Message
		routingKey string
		want       string
		outcome    Outcome
	}{
		{"by header", msg.Message{Headers: map[string]any{"x-event-type": "order"}}, "any", "orders", Deliver},
		{"header as bytes", msg.Message{Headers: map[string]any{"x-event-type": []byte("order")}}, "any", "orders", Deliver},
		{"by routing key", msg.Message{}, "stock.moved", "stock", Deliver},
		{"by body field", msg.Message{ContentType: "application/json", Body: []byte(`{"priority":"high"}`)}, "x", "priority", Deliver},
		{"first match wins", msg.Message{Headers: map[string]any{"x-event-type": "order"}, Body: []byte(`{"priority":"high"}`)}, "stock.x", "orders", Deliver},
		{"no match", msg.Message{Body: []byte(`{"priority":"low"}`)}, "x", "", Deliver},
		{"filtered", msg.Message{Type: "heartbeat", Headers: map[string]any{"x-event-type": "order"}}, "x", "", Ack},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := tb.Decide(&c.m, c.routingKey, "ex")
			if d.Outcome != c.outcome || d.RouteName() != c.want {
				t.Fatalf("got outcome %v route %q, want %v %q", d.Outcome, d.RouteName(), c.outcome, c.want)
			}
			if c.outcome == Ack && d.Reason != retry.ReasonFiltered {
				t.Fatalf("reason %q, want %q", d.Reason, retry.ReasonFiltered)
			}
			if len(d.Problems) != 0 {
				t.Fatalf("unexpected problems: %v", d.Problems)
			}
		})
	}
}

func TestPropertiesAndExchange(t *testing.T) {
	tb := mustCompile(t, Spec{Routes: []RouteSpec{{Name: "a", Match: `exchange == "wms" && properties.appId == "erp" && properties.priority >= 5 && properties.contentType == "application/json"`}}})
	m := &msg.Message{AppID: "erp", Priority: 7, ContentType: "application/json"}
	if d := tb.Decide(m, "k", "wms"); d.RouteName() != "a" {
		t.Fatalf("route %q, want a", d.RouteName())
	}
	if d := tb.Decide(m, "k", "other"); d.RouteName() != "" {
		t.Fatalf("route %q, want none for another exchange", d.RouteName())
	}
}

func TestFilterDLQ(t *testing.T) {
	tb := mustCompile(t, Spec{Filter: `"x-tenant" in headers`, OnFiltered: "dlq"})
	d := tb.Decide(&msg.Message{}, "k", "")
	if d.Outcome != DeadLetter || d.Reason != retry.ReasonFiltered {
		t.Fatalf("got %v %q, want a dead-lettering as filtered", d.Outcome, d.Reason)
	}
	d = tb.Decide(&msg.Message{Headers: map[string]any{"x-tenant": "a"}}, "k", "")
	if d.Outcome != Deliver {
		t.Fatalf("got %v, want deliver", d.Outcome)
	}
}

func TestMissingHeader(t *testing.T) {
	tb := mustCompile(t, Spec{Routes: []RouteSpec{
		{Name: "eq", Match: `headers["x-missing"] == "a"`},
		{Name: "num", Match: `headers["x-missing"] > 3`},
		{Name: "dot", Match: `headers.tenant == "b"`},
		{Name: "fallback", Match: `true`},
	}})
	d := tb.Decide(&msg.Message{}, "k", "")
	if d.RouteName() != "fallback" {
		t.Fatalf("route %q, want fallback", d.RouteName())
	}
	// Equality with a missing header is plainly false; ordering a missing
	// header against a number cannot be evaluated and is a problem.
	if len(d.Problems) != 1 || d.Problems[0].Rule != "routes[1].match" || d.Problems[0].Kind != ProblemEval {
		t.Fatalf("problems %+v, want one eval problem of routes[1].match", d.Problems)
	}
	d = tb.Decide(&msg.Message{Headers: map[string]any{"x-missing": int32(5)}}, "k", "")
	if d.RouteName() != "num" || len(d.Problems) != 0 {
		t.Fatalf("route %q problems %v, want num and none", d.RouteName(), d.Problems)
	}
}

func TestBodyParsedOnce(t *testing.T) {
	tb := mustCompile(t, Spec{
		Filter: `body.ok == true`,
		Routes: []RouteSpec{
			{Name: "a", Match: `body.kind == "a"`},
			{Name: "b", Match: `body.kind == "b"`},
			{Name: "c", Match: `body.n > 2`},
		},
	})
	calls := 0
	tb.parse = func(b []byte, v any) error { calls++; return json.Unmarshal(b, v) }
	d := tb.Decide(&msg.Message{Body: []byte(`{"ok":true,"kind":"z","n":3}`)}, "k", "")
	if d.RouteName() != "c" || calls != 1 {
		t.Fatalf("route %q after %d parses, want c after 1", d.RouteName(), calls)
	}
}

func TestBodyNotParsedWhenUnused(t *testing.T) {
	tb := mustCompile(t, Spec{Routes: []RouteSpec{
		{Name: "h", Match: `headers.kind == "x"`},
		{Name: "b", Match: `body.kind == "x"`},
	}})
	calls := 0
	tb.parse = func(b []byte, v any) error { calls++; return json.Unmarshal(b, v) }
	if d := tb.Decide(&msg.Message{Headers: map[string]any{"kind": "x"}, Body: []byte(`not json`)}, "k", ""); d.RouteName() != "h" || calls != 0 || len(d.Problems) != 0 {
		t.Fatalf("route %q, %d parses, problems %v: the body must not be read when the rule that matched does not use it", d.RouteName(), calls, d.Problems)
	}
}

func TestBodyErrors(t *testing.T) {
	routes := []RouteSpec{
		{Name: "prio", Match: `body.priority == "high"`},
		{Name: "hdr", Match: `headers.kind == "x"`},
	}
	notJSON := []struct {
		name string
		m    msg.Message
	}{
		{"invalid JSON", msg.Message{ContentType: "application/json", Body: []byte(`{"priority":`), Headers: map[string]any{"kind": "x"}}},
		{"text content type", msg.Message{ContentType: "text/plain", Body: []byte(`{"priority":"high"}`), Headers: map[string]any{"kind": "x"}}},
		{"compressed", msg.Message{ContentEncoding: "gzip", Body: []byte(`{"priority":"high"}`), Headers: map[string]any{"kind": "x"}}},
	}
	for _, c := range notJSON {
		t.Run("skip/"+c.name, func(t *testing.T) {
			tb := mustCompile(t, Spec{Routes: routes})
			d := tb.Decide(&c.m, "k", "")
			if d.Outcome != Deliver || d.RouteName() != "hdr" {
				t.Fatalf("got %v %q, want the body rule skipped and hdr taken", d.Outcome, d.RouteName())
			}
			if len(d.Problems) != 1 || d.Problems[0].Kind != ProblemBody {
				t.Fatalf("problems %+v, want one body problem", d.Problems)
			}
		})
		t.Run("dlq/"+c.name, func(t *testing.T) {
			tb := mustCompile(t, Spec{Routes: routes, OnBodyError: "dlq"})
			d := tb.Decide(&c.m, "k", "")
			if d.Outcome != DeadLetter || d.Reason != retry.ReasonFilterError || d.Err == nil {
				t.Fatalf("got %v %q %v, want a dead-lettering as filter-error with its cause", d.Outcome, d.Reason, d.Err)
			}
		})
	}
	t.Run("JSON content types", func(t *testing.T) {
		tb := mustCompile(t, Spec{Routes: []RouteSpec{{Name: "p", Match: `body.p == 1`}}})
		for _, ct := range []string{"", "application/json", "application/json; charset=utf-8", "application/cloudevents+json", "Application/JSON"} {
			if d := tb.Decide(&msg.Message{ContentType: ct, Body: []byte(`{"p":1}`)}, "k", ""); d.RouteName() != "p" {
				t.Errorf("content type %q: route %q, want p (problems %v)", ct, d.RouteName(), d.Problems)
			}
		}
	})
}

func TestNonBoolBodyField(t *testing.T) {
	tb := mustCompile(t, Spec{Routes: []RouteSpec{{Name: "flag", Match: `body.flag`}}})
	if d := tb.Decide(&msg.Message{Body: []byte(`{"flag":true}`)}, "k", ""); d.RouteName() != "flag" {
		t.Fatalf("route %q, want flag", d.RouteName())
	}
	d := tb.Decide(&msg.Message{Body: []byte(`{"flag":"yes"}`)}, "k", "")
	if d.RouteName() != "" || len(d.Problems) != 1 || d.Problems[0].Kind != ProblemEval {
		t.Fatalf("route %q problems %+v, want no route and one eval problem", d.RouteName(), d.Problems)
	}
}

func TestCompileErrors(t *testing.T) {
	cases := []struct {
		name      string
		spec      Spec
		key       string
		line, col int
		msgPart   string
	}{
		{"syntax", Spec{Routes: []RouteSpec{{Name: "a", Match: `true`}, {Name: "b", Match: `routingKey == "a" &&`}}}, "routes[1].match", 1, 20, "unexpected"},
		{"second line", Spec{Filter: "routingKey == \"a\" &&\n  headers[\"x\"] == = 1"}, "filter", 2, 19, "unexpected"},
		{"type: string vs number", Spec{Routes: []RouteSpec{{Name: "a", Match: `routingKey > 3`}}}, "routes[0].match", 1, 12, "mismatched types"},
		{"not a bool", Spec{Routes: []RouteSpec{{Name: "a", Match: `routingKey`}}}, "routes[0].match", 0, 0, "bool"},
		{"unknown property", Spec{Filter: `properties.typ == "x"`}, "filter", 1, 12, "typ"},
		{"unknown variable", Spec{Filter: `routing_key == "x"`}, "filter", 1, 1, "routing_key"},
		{"missing match", Spec{Routes: []RouteSpec{{Name: "a"}}}, "routes[0].match", 0, 0, "required"},
		{"missing name", Spec{Routes: []RouteSpec{{Match: "true"}}}, "routes[0].name", 0, 0, "required"},
		{"bad name", Spec{Routes: []RouteSpec{{Name: "a b", Match: "true"}}}, "routes[0].name", 0, 0, "letters"},
		{"duplicate name", Spec{Routes: []RouteSpec{{Name: "a", Match: "true"}, {Name: "a", Match: "true"}}}, "routes[1].name", 0, 0, "routes[0]"},
		{"onFiltered", Spec{OnFiltered: "drop"}, "onFiltered", 0, 0, "ack or dlq"},
		{"onBodyError", Spec{OnBodyError: "ack"}, "onBodyError", 0, 0, "skip or dlq"},
		{"onFilterError", Spec{OnFilterError: "ack"}, "onFilterError", 0, 0, "deliver or dlq"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Compile(c.spec)
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("got %v, want a *route.Error", err)
			}
			if e.Key != c.key || !strings.Contains(e.Msg, c.msgPart) {
				t.Fatalf("got %q (key %q), want key %q and a message holding %q", e.Error(), e.Key, c.key, c.msgPart)
			}
			if c.line != 0 && (e.Line != c.line || e.Column != c.col) {
				t.Fatalf("got position %d:%d in %q, want %d:%d", e.Line, e.Column, e.Error(), c.line, c.col)
			}
		})
	}
}

func TestEveryErrorReported(t *testing.T) {
	_, err := Compile(Spec{Filter: `1 +`, Routes: []RouteSpec{{Name: "a", Match: `routingKey > 1`}, {Name: "", Match: "true"}}})
	for _, key := range []string{"filter:", "routes[0].match:", "routes[1].name:"} {
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Fatalf("error %v does not report %s", err, key)
		}
	}
}

// FuzzEval feeds hostile messages through a table over every part of the
// message view: a decision always comes back, never a panic.
func FuzzEval(f *testing.F) {
	tb, err := Compile(Spec{
		Filter:      `properties.type != "skip" || headers["force"] == true || headers["n"] > 3`,
		OnBodyError: "skip",
		Routes: []RouteSpec{
			{Name: "a", Match: `headers["n"] > 3`},
			{Name: "b", Match: `body.items[0].qty >= 2`},
			{Name: "c", Match: `routingKey matches "^a\\.[0-9]+$"`},
			{Name: "d", Match: `body.flag`},
			{Name: "e", Match: `len(body.list) > 1`},
		},
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Add("application/json", []byte(`{"items":[{"qty":3}]}`), "a.1", "skip", "x")
	f.Add("", []byte(`{"items":"nope","flag":1,"list":null}`), "", "", "5")
	f.Add("text/plain", []byte("\xff\xfe"), "a.b", "", "")
	f.Add("application/x+json", []byte(`[1,2,3]`), "a.12", "skip", "abc")
	f.Fuzz(func(t *testing.T, ct string, body []byte, rk, typ, hv string) {
		m := &msg.Message{ContentType: ct, Body: body, Type: typ, Headers: map[string]any{"n": hv, "force": hv == "x"}}
		d := tb.Decide(m, rk, "")
		if d.Outcome == Deliver && d.Reason != "" {
			t.Fatalf("delivered with reason %q", d.Reason)
		}
		if d.Outcome != Deliver && d.Route != nil {
			t.Fatalf("not delivered but routed to %q", d.Route.Name)
		}
		if d.Reason == retry.ReasonFiltered {
			for _, p := range d.Problems {
				if p.Rule == "filter" {
					t.Fatalf("filtered although the filter could not be evaluated: %v", p.Err)
				}
			}
		}
	})
}

// Header lookups the compiler rewrites to direct map reads answer as the
// language's own map access does: nil for a missing header, presence for
// in, whatever the form of the lookup.
func TestHeaderLookups(t *testing.T) {
	h := map[string]any{"s": "v", "n": int32(4), "void": nil, "b": []byte("bytes"), "nested": map[string]any{"k": "x"}}
	cases := []struct {
		rule string
		want bool
	}{
		{`headers["s"] == "v"`, true},
		{`headers.s == "v"`, true},
		{`headers["missing"] == nil`, true},
		{`headers.missing == "v"`, false},
		{`"s" in headers`, true},
		{`"void" in headers`, true},
		{`"missing" in headers`, false},
		{`!("missing" in headers)`, true},
		{`"missing" not in headers`, true},
		{`headers["n"] > 3`, true},
		{`headers["b"] == "bytes"`, true},
		{`headers.nested.k == "x"`, true},
		{`headers[properties.type] == "v"`, true}, // a computed name: the language's own access
		{`len(headers) == 5`, true},
		{`"v" in [headers.s]`, true},
	}
	for _, c := range cases {
		tb := mustCompile(t, Spec{Routes: []RouteSpec{{Name: "r", Match: c.rule}}})
		d := tb.Decide(&msg.Message{Type: "s", Headers: h}, "k", "")
		if got := d.RouteName() == "r"; got != c.want || len(d.Problems) != 0 {
			t.Errorf("%s: %v (problems %v), want %v", c.rule, got, d.Problems, c.want)
		}
	}
}

// A filter that cannot be evaluated for a message has decided nothing:
// the message is never settled as filtered. By default it goes to the DLQ
// with reason filter-error and the cause; with onFilterError deliver it
// goes on to the routes as if the filter had passed. Only a filter that
// evaluates to false, without error, filters a message.
func TestFilterErrorNeverFilters(t *testing.T) {
	routes := []RouteSpec{{Name: "hdr", Match: `headers.kind == "x"`}}
	cases := []struct {
		name   string
		filter string
		m      msg.Message
		kind   string
	}{
		{"missing header ordered against a number", `headers["x-level"] > 3`,
			msg.Message{Headers: map[string]any{"kind": "x"}}, ProblemEval},
		{"body field not a bool", `body.flag`,
			msg.Message{Body: []byte(`{"flag":"yes"}`), Headers: map[string]any{"kind": "x"}}, ProblemEval},
		{"body not JSON", `body.ok == true`,
			msg.Message{ContentType: "text/plain", Body: []byte("hi"), Headers: map[string]any{"kind": "x"}}, ProblemBody},
		{"body not JSON, onBodyError skip", `body.ok == true`,
			msg.Message{Body: []byte(`{"ok":`), Headers: map[string]any{"kind": "x"}}, ProblemBody},
	}
	for _, c := range cases {
		for _, onFiltered := range []string{"", "ack", "dlq"} {
			t.Run(c.name+"/default/onFiltered="+onFiltered, func(t *testing.T) {
				tb := mustCompile(t, Spec{Filter: c.filter, OnFiltered: onFiltered, OnBodyError: "skip", Routes: routes})
				d := tb.Decide(&c.m, "k", "")
				if d.Outcome != DeadLetter || d.Reason != retry.ReasonFilterError || d.Route != nil {
					t.Fatalf("got %v %q route %q, want a dead-lettering as filter-error", d.Outcome, d.Reason, d.RouteName())
				}
				if d.Err == nil || !strings.Contains(d.Err.Error(), "filter") {
					t.Fatalf("cause %v, want one naming the filter", d.Err)
				}
				if len(d.Problems) != 1 || d.Problems[0].Rule != "filter" || d.Problems[0].Kind != c.kind {
					t.Fatalf("problems %+v, want one %s problem of the filter", d.Problems, c.kind)
				}
			})
		}
		t.Run(c.name+"/deliver", func(t *testing.T) {
			tb := mustCompile(t, Spec{Filter: c.filter, OnFilterError: "deliver", Routes: routes})
			d := tb.Decide(&c.m, "k", "")
			if d.Outcome != Deliver || d.Reason != "" || d.RouteName() != "hdr" {
				t.Fatalf("got %v %q route %q, want delivered through the routes (hdr)", d.Outcome, d.Reason, d.RouteName())
			}
			if len(d.Problems) != 1 || d.Problems[0].Rule != "filter" || d.Problems[0].Kind != c.kind {
				t.Fatalf("problems %+v, want one %s problem of the filter", d.Problems, c.kind)
			}
		})
	}
	t.Run("onBodyError dlq wins over deliver", func(t *testing.T) {
		tb := mustCompile(t, Spec{Filter: `body.ok == true`, OnFilterError: "deliver", OnBodyError: "dlq"})
		d := tb.Decide(&msg.Message{ContentType: "text/plain", Body: []byte("hi")}, "k", "")
		if d.Outcome != DeadLetter || d.Reason != retry.ReasonFilterError {
			t.Fatalf("got %v %q, want a dead-lettering as filter-error", d.Outcome, d.Reason)
		}
	})
	t.Run("false without error filters", func(t *testing.T) {
		for _, on := range []string{"", "deliver", "dlq"} {
			tb := mustCompile(t, Spec{Filter: `headers["x-level"] > 3`, OnFilterError: on})
			d := tb.Decide(&msg.Message{Headers: map[string]any{"x-level": int32(1)}}, "k", "")
			if d.Outcome != Ack || d.Reason != retry.ReasonFiltered || len(d.Problems) != 0 {
				t.Fatalf("onFilterError %q: got %v %q problems %v, want filtered", on, d.Outcome, d.Reason, d.Problems)
			}
			d = tb.Decide(&msg.Message{Headers: map[string]any{"x-level": int32(5)}}, "k", "")
			if d.Outcome != Deliver || len(d.Problems) != 0 {
				t.Fatalf("onFilterError %q: got %v problems %v, want delivered", on, d.Outcome, d.Problems)
			}
		}
	})
}

// A route whose match cannot be evaluated does not match, whatever
// onFilterError says: the next route is tried and a message none takes
// goes to the subscription's own path. It is delivered, never dropped.
func TestRouteErrorFallsThrough(t *testing.T) {
	for _, on := range []string{"", "deliver", "dlq"} {
		tb := mustCompile(t, Spec{OnFilterError: on, Routes: []RouteSpec{
			{Name: "num", Match: `headers["x-level"] > 3`},
			{Name: "body", Match: `body.kind == "x"`},
			{Name: "hdr", Match: `headers.kind == "x"`},
		}})
		d := tb.Decide(&msg.Message{ContentType: "text/plain", Body: []byte("hi"), Headers: map[string]any{"kind": "x"}}, "k", "")
		if d.Outcome != Deliver || d.RouteName() != "hdr" || len(d.Problems) != 2 {
			t.Fatalf("onFilterError %q: got %v route %q problems %v, want hdr after two problems", on, d.Outcome, d.RouteName(), d.Problems)
		}
		d = tb.Decide(&msg.Message{ContentType: "text/plain", Body: []byte("hi")}, "k", "")
		if d.Outcome != Deliver || d.RouteName() != "" {
			t.Fatalf("onFilterError %q: got %v route %q, want the subscription's own path", on, d.Outcome, d.RouteName())
		}
	}
}
