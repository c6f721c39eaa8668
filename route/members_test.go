package route

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/hopper-sidecar/hopper/msg"
)

// bigUnread holds a number beyond a float64 in a member no rule reads.
const bigUnread = `{"kind":"a","big":1e999}`

// membersBodies are bodies a rule may meet: objects with the named members
// plain, escaped, nested, repeated or missing, and what is not an object or
// not JSON at all.
var membersBodies = []string{
	`{"kind":"a","n":3,"ok":true}`,
	`{"kind":"b","pad":"` + "\u00e9t\u00e9" + `","seq":12345}`,
	` { "kind" : "a" , "order" : { "id" : 7 , "lines" : [1, {"kind":"x"}, "]}"] } } `,
	`{"k\u0069nd":"a","n":1.5e2}`,
	`{"kind":"a","kind":"b"}`,
	`{"kind":"a\"b\\c","n":-0.5,"x":null}`,
	bigUnread,
	`{"kind":1e999}`,
	`{"kind":"caf\u00e9","ok":false,"order":{"id":"7"}}`,
	`{"kind":["a"],"n":{"m":1}}`,
	`{"other":"kind","n":"3"}`,
	`{}`,
	`[{"kind":"a"}]`,
	`"kind"`,
	`42`,
	`null`,
	`{"kind":"a",}`,
	`{"kind":"a"`,
	`not json`,
	``,
	"{\"kind\":\"\xff\"}",
	"{\"\xffkind\":\"a\"}",
}

// TestDecodeMembersAgreesWithUnmarshal: for every body, the members read
// by name are what json.Unmarshal makes of them, present or not, and
// anything but an object, or an error, is json.Unmarshal's own.
func TestDecodeMembersAgreesWithUnmarshal(t *testing.T) {
	names := map[string]bool{"kind": true, "n": true, "order": true, "ok": true, "x": true}
	for _, body := range membersBodies {
		checkMembers(t, []byte(body), names)
	}
}

func FuzzDecodeMembers(f *testing.F) {
	for _, b := range membersBodies {
		f.Add([]byte(b), "kind")
	}
	f.Fuzz(func(t *testing.T, body []byte, name string) {
		checkMembers(t, body, map[string]bool{name: true, "kind": true})
	})
}

func checkMembers(t *testing.T, body []byte, names map[string]bool) {
	t.Helper()
	var full, part any
	fullErr := json.Unmarshal(body, &full)
	partErr := decodeMembers(body, names, &part)
	var overflow *json.UnmarshalTypeError
	if partErr == nil && errors.As(fullErr, &overflow) {
		// A number beyond a float64 in a member no rule reads: the body is
		// JSON, and the member is never decoded.
		return
	}
	if fmt.Sprint(fullErr) != fmt.Sprint(partErr) {
		t.Fatalf("%q: error %v, want json.Unmarshal's %v", body, partErr, fullErr)
	}
	if fullErr != nil {
		return
	}
	obj, isObj := full.(map[string]any)
	if !isObj {
		if !reflect.DeepEqual(part, full) {
			t.Fatalf("%q: %#v, want %#v", body, part, full)
		}
		return
	}
	got, ok := part.(map[string]any)
	if !ok {
		t.Fatalf("%q: %T, want an object", body, part)
	}
	for name := range names {
		want, there := obj[name]
		v, gotThere := got[name]
		if there != gotThere || !reflect.DeepEqual(v, want) {
			t.Fatalf("%q member %q: %#v (there %v), want %#v (there %v)", body, name, v, gotThere, want, there)
		}
	}
}

// TestBodyRulesDecideAsOnTheWholeBody: rules that read members by name
// (the body decoded in part) and rules that need all of it (its size, a
// member named at run time, a test for a member, an optional read) decide
// every body exactly as they do with the whole body decoded.
func TestBodyRulesDecideAsOnTheWholeBody(t *testing.T) {
	specs := []Spec{
		{Routes: []RouteSpec{
			{Name: "a", Match: `body.kind == "a"`},
			{Name: "nested", Match: `body.order.id == 7`},
			{Name: "index", Match: `body["n"] > 100`},
		}},
		{Filter: `body.ok != false`, Routes: []RouteSpec{{Name: "b", Match: `body.kind == "b"`}}},
		{Routes: []RouteSpec{{Name: "size", Match: `body.kind == "a" && len(body) == 3`}}},
		{Routes: []RouteSpec{{Name: "in", Match: `"order" in body`}}},
		{Routes: []RouteSpec{{Name: "optional", Match: `body?.kind == "a"`}}},
		{Routes: []RouteSpec{{Name: "computed", Match: `body[routingKey] == "a"`}}},
		{OnBodyError: "dlq", Routes: []RouteSpec{{Name: "strict", Match: `body.kind == "b"`}}},
	}
	for i, s := range specs {
		part := mustCompile(t, s)
		whole := mustCompile(t, s)
		whole.parse = json.Unmarshal
		for _, body := range membersBodies {
			if body == bigUnread && !part.rules()[0].wholeBody {
				continue // below
			}
			m := &msg.Message{Body: []byte(body)}
			got, want := part.Decide(m, "kind", ""), whole.Decide(m, "kind", "")
			if fmt.Sprintf("%s %v %v %v", got.RouteName(), got.Outcome, got.Reason, got.Problems) !=
				fmt.Sprintf("%s %v %v %v", want.RouteName(), want.Outcome, want.Reason, want.Problems) {
				t.Errorf("spec %d, body %q: %q %v %q %v; with the whole body %q %v %q %v", i, body,
					got.RouteName(), got.Outcome, got.Reason, got.Problems, want.RouteName(), want.Outcome, want.Reason, want.Problems)
			}
		}
	}
}

// TestBodyReadInPartOnlyWhenRulesNameMembers: the size of the body is
// what a rule sees whenever one rule needs the whole of it.
func TestBodyReadInPartOnlyWhenRulesNameMembers(t *testing.T) {
	body := []byte(`{"kind":"a","x":1,"y":2}`)
	tb := mustCompile(t, Spec{Routes: []RouteSpec{
		{Name: "named", Match: `body.kind == "z"`},
		{Name: "size", Match: `len(body) == 3`},
	}})
	if d := tb.Decide(&msg.Message{Body: body}, "k", ""); d.RouteName() != "size" {
		t.Fatalf("route %q, problems %v: want size (the whole body read)", d.RouteName(), d.Problems)
	}
	tb = mustCompile(t, Spec{Routes: []RouteSpec{{Name: "named", Match: `body.kind == "a"`}}})
	var v any
	if err := tb.parse(body, &v); err != nil || len(v.(map[string]any)) != 1 {
		t.Fatalf("read %v (%v), want the one member the rules name", v, err)
	}
}

// TestBodyWithAHugeNumberNoRuleReads: a number beyond a float64 in a member
// no rule reads does not make the body unreadable, as it did when every
// member was decoded; read by a rule, it still does.
func TestBodyWithAHugeNumberNoRuleReads(t *testing.T) {
	tb := mustCompile(t, Spec{Routes: []RouteSpec{{Name: "a", Match: `body.kind == "a"`}}})
	if d := tb.Decide(&msg.Message{Body: []byte(bigUnread)}, "k", ""); d.RouteName() != "a" || len(d.Problems) != 0 {
		t.Fatalf("route %q, problems %v: want a", d.RouteName(), d.Problems)
	}
	tb = mustCompile(t, Spec{Routes: []RouteSpec{{Name: "big", Match: `body.big > 0`}}})
	if d := tb.Decide(&msg.Message{Body: []byte(bigUnread)}, "k", ""); d.RouteName() != "" || len(d.Problems) != 1 || d.Problems[0].Kind != ProblemBody {
		t.Fatalf("route %q, problems %v: want none, and a body problem", d.RouteName(), d.Problems)
	}
}

// TestComparisonsJudgeAsTheProgram: a rule comparing a header or a member
// of the body with a string is judged without running its program, and
// every message gets the same decision as from the program: strings equal
// or not, header bytes, numbers, missing values, and bodies that are not
// objects or not JSON.
func TestComparisonsJudgeAsTheProgram(t *testing.T) {
	spec := Spec{Routes: []RouteSpec{
		{Name: "h", Match: `headers["x-kind"] == "a"`},
		{Name: "h2", Match: `"b" == headers.x`},
		{Name: "b", Match: `body.kind == "b"`},
		{Name: "b2", Match: `"caf` + "\u00e9" + `" == body["kind"]`},
	}}
	fast := mustCompile(t, spec)
	slow := mustCompile(t, spec)
	for i := range fast.routes {
		if fast.routes[i].rule.cmp == nil {
			t.Fatalf("%s: not judged as a comparison", fast.routes[i].Name)
		}
		slow.routes[i].rule.cmp = nil
	}
	headerValues := []any{"a", "b", []byte("a"), int32(5), nil, "A", true}
	for _, body := range membersBodies {
		for _, hv := range headerValues {
			m := &msg.Message{Body: []byte(body), Headers: map[string]any{"x-kind": hv, "x": hv}}
			got, want := fast.Decide(m, "k", ""), slow.Decide(m, "k", "")
			if fmt.Sprint(got.RouteName(), got.Outcome, got.Problems) != fmt.Sprint(want.RouteName(), want.Outcome, want.Problems) {
				t.Errorf("body %q, header %#v: %q %v; the program: %q %v", body, hv, got.RouteName(), got.Problems, want.RouteName(), want.Problems)
			}
		}
	}
	for _, src := range []string{`body.kind != "a"`, `headers.x == 5`, `body.order.id == "7"`, `body?.kind == "a"`, `headers.x == "a" && body.kind == "b"`} {
		if r, err := compile("x", src); err != nil || r.cmp != nil {
			t.Errorf("%s: judged as a comparison (%v)", src, err)
		}
	}
}
