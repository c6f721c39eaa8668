package proxy

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
	"github.com/hopper-sidecar/hopper/route"
)

// routedObserver records what the loop says of routes.
type routedObserver struct {
	countingObserver
	routed, failed []string
}

func (o *routedObserver) Routed(r string)     { o.routed = append(o.routed, r) }
func (o *routedObserver) RuleFailed(k string) { o.failed = append(o.failed, k) }

// A message the filter leaves out never reaches the app: with onFiltered
// ack it is acked; with dlq it is acked only after its DLQ copy, carrying
// the reason, is confirmed (a refused publish is retried while the
// delivery is held). A delivered message is counted under its route, and
// its retry policy is the route's.
func TestRoutedDispatch(t *testing.T) {
	// The rules that could not be evaluated are counted whatever becomes
	// of the message.
	ruleFailures := map[string][]string{
		"body error dlq":                      {"body"},
		"filter error":                        {"eval"},
		"filter error, onFiltered ack":        {"eval"},
		"filter body error, onBodyError skip": {"body"},
		"filter error, onFilterError deliver": {"eval"},
	}
	cases := []struct {
		name       string
		spec       route.Spec
		headers    map[string]any
		pubErr     error
		want       []string
		wantReason string
		called     int
		routed     []string
	}{
		{"filtered ack", route.Spec{Filter: `"x-tenant" in headers`}, nil, nil, []string{"ack"}, "", 0, nil},
		{"filtered dlq", route.Spec{Filter: `"x-tenant" in headers`, OnFiltered: "dlq"}, nil, nil, []string{"publish orders.dlq", "ack"}, "filtered", 0, nil},
		{"filtered dlq refused twice", route.Spec{Filter: `"x-tenant" in headers`, OnFiltered: "dlq"}, nil, errors.New("nacked"),
			[]string{"publish orders.dlq", "publish orders.dlq", "publish orders.dlq", "ack"}, "filtered", 0, nil},
		{"body error dlq", route.Spec{Routes: []route.RouteSpec{{Name: "p", Match: `body.p == 1`}}, OnBodyError: "dlq"}, nil, nil,
			[]string{"publish orders.dlq", "ack"}, "filter-error", 0, nil},
		// A filter that cannot be evaluated has decided nothing: the
		// message is dead-lettered as filter-error (the default), never
		// acked as filtered, or delivered (onFilterError deliver).
		{"filter error", route.Spec{Filter: `headers["x-level"] > 3`}, nil, nil,
			[]string{"publish orders.dlq", "ack"}, "filter-error", 0, nil},
		{"filter error, onFiltered ack", route.Spec{Filter: `headers["x-level"] > 3`, OnFiltered: "ack"}, nil, nil,
			[]string{"publish orders.dlq", "ack"}, "filter-error", 0, nil},
		{"filter body error, onBodyError skip", route.Spec{Filter: `body.ok == true`, OnBodyError: "skip"}, nil, nil,
			[]string{"publish orders.dlq", "ack"}, "filter-error", 0, nil},
		{"filter error, onFilterError deliver", route.Spec{Filter: `headers["x-level"] > 3`, OnFilterError: "deliver"}, nil, nil,
			[]string{"publish orders.retry.1s", "ack"}, "", 1, []string{""}},
		{"filter false", route.Spec{Filter: `headers["x-level"] > 3`}, map[string]any{"x-level": int32(1)}, nil,
			[]string{"ack"}, "", 0, nil},
		{"routed with its own policy", route.Spec{Routes: []route.RouteSpec{{Name: "one", Match: `headers.kind == "x"`,
			Policy: &retry.Policy{Name: "route:one", MaxAttempts: 1, Tiers: []time.Duration{time.Second}, Table: retry.DefaultTable(), ExpiredAction: retry.DLQ}}}},
			map[string]any{"kind": "x"}, nil, []string{"publish orders.dlq", "ack"}, "max-attempts", 1, []string{"one"}},
		{"no route", route.Spec{Routes: []route.RouteSpec{{Name: "one", Match: `headers.kind == "x"`}}}, nil, nil,
			[]string{"publish orders.retry.1s", "ack"}, "", 1, []string{""}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := retry.Outcome{Kind: retry.Response, Status: 503}
			p, pub, j := newTestProxy(t, out, tc.pubErr)
			pub.fails = 2
			calls := 0
			p.o.App = fakeApp{out: out, calls: &calls}
			tb, err := route.Compile(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			p.o.Routes = tb
			obs := &routedObserver{}
			p.obs = obs
			m := msgWith(tc.headers)
			m.ContentType = "text/plain"
			run(p, &fakeDelivery{m: m, j: j, alive: true})
			if got := j.all(); !equal(got, tc.want) {
				t.Fatalf("calls %v, want %v", got, tc.want)
			}
			if calls != tc.called {
				t.Fatalf("the app was called %d times, want %d", calls, tc.called)
			}
			if tc.wantReason != "" {
				last := pub.got[len(pub.got)-1]
				if r := msg.DeadLetterReason(last); r != tc.wantReason {
					t.Fatalf("DLQ copy's reason %q, want %q", r, tc.wantReason)
				}
			}
			if !equal(obs.routed, tc.routed) {
				t.Fatalf("routed %q, want %q", obs.routed, tc.routed)
			}
			if want := ruleFailures[tc.name]; !equal(obs.failed, want) {
				t.Fatalf("rule failures counted %q, want %q", obs.failed, want)
			}
		})
	}
}

// levelRecorder keeps each record's level and event.
type levelRecorder struct {
	mu     sync.Mutex
	events map[string]slog.Level
}

func (h *levelRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *levelRecorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "event" {
			h.events[a.Value.String()] = r.Level
		}
		return true
	})
	return nil
}
func (h *levelRecorder) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *levelRecorder) WithGroup(string) slog.Handler      { return h }

// A message the filter dead-letters is logged at debug, as a filtered
// ack is: the config asked for it, and a busy filter must not flood the
// log. A body that cannot be read is a warning.
func TestFilteredLoggedAtDebug(t *testing.T) {
	for _, tc := range []struct {
		spec  route.Spec
		event string
		level slog.Level
	}{
		{route.Spec{Filter: `"x-tenant" in headers`, OnFiltered: "dlq"}, "RABBITMQ_MESSAGE_FILTERED", slog.LevelDebug},
		{route.Spec{Filter: `body.ok == true`, OnBodyError: "dlq"}, "RABBITMQ_MESSAGE_FILTER_ERROR", slog.LevelWarn},
		{route.Spec{Filter: `headers["x-level"] > 3`}, "RABBITMQ_MESSAGE_FILTER_ERROR", slog.LevelWarn},
		{route.Spec{Filter: `headers["x-level"] > 3`}, "ROUTE_RULE_FAILED", slog.LevelWarn},
		{route.Spec{Filter: `headers["x-level"] > 3`, OnFilterError: "deliver"}, "ROUTE_RULE_FAILED", slog.LevelWarn},
	} {
		p, _, j := newTestProxy(t, retry.Outcome{Kind: retry.Response, Status: 200}, nil)
		tb, err := route.Compile(tc.spec)
		if err != nil {
			t.Fatal(err)
		}
		p.o.Routes = tb
		rec := &levelRecorder{events: map[string]slog.Level{}}
		p.log = slog.New(rec)
		m := msgWith(nil)
		m.ContentType = "text/plain"
		run(p, &fakeDelivery{m: m, j: j, alive: true})
		if lv, ok := rec.events[tc.event]; !ok || lv != tc.level {
			t.Errorf("%s logged at %v (present %v), want %v; events %v", tc.event, lv, ok, tc.level, rec.events)
		}
	}
}
