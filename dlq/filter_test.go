package dlq

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

var t0 = time.Date(2026, 5, 6, 12, 0, 0, 0, time.UTC)

// dead is a message as Hopper dead-letters it.
func dead(id, queue, rk, reason string, status int, age time.Duration) *msg.Message {
	m := &msg.Message{MessageID: id, RoutingKey: queue + ".dlq", Headers: map[string]any{}, Body: []byte(id)}
	*m = *msg.DLQCopy(m, msg.Info{Queue: queue, RoutingKey: rk}, msg.DeadLetter{Status: status, Reason: reason, Retries: 3, Now: t0.Add(-age)})
	return m
}

func TestFilterMatch(t *testing.T) {
	m := dead("a", "orders", "order.created.eu", "max-attempts", 503, 2*time.Hour)
	m.Headers["tenant"] = "acme"
	m.Headers["shard"] = int16(7)
	m.Headers["nested"] = map[string]any{"x": "y"}
	for _, tc := range []struct {
		name string
		f    Filter
		want bool
	}{
		{"empty", Filter{}, true},
		{"queue", Filter{Queues: []string{"billing", "orders"}}, true},
		{"other queue", Filter{Queues: []string{"billing"}}, false},
		{"reason", Filter{Reasons: []string{"max-attempts"}}, true},
		{"other reason", Filter{Reasons: []string{"expired"}}, false},
		{"status exact", Filter{Statuses: []string{"503"}}, true},
		{"status class", Filter{Statuses: []string{"4xx", "5xx"}}, true},
		{"status other", Filter{Statuses: []string{"4xx", "502"}}, false},
		{"routing key star", Filter{RoutingKeys: []string{"order.*.eu"}}, true},
		{"routing key hash", Filter{RoutingKeys: []string{"order.#"}}, true},
		{"routing key miss", Filter{RoutingKeys: []string{"order.*"}}, false},
		{"header value", Filter{Headers: []HeaderMatch{{Name: "tenant", Value: "acme"}}}, true},
		{"header number", Filter{Headers: []HeaderMatch{{Name: "shard", Value: "7"}}}, true},
		{"header present", Filter{Headers: []HeaderMatch{{Name: "nested", AnyValue: true}}}, true},
		{"header table value never equal", Filter{Headers: []HeaderMatch{{Name: "nested", Value: "x"}}}, false},
		{"header other value", Filter{Headers: []HeaderMatch{{Name: "tenant", Value: "other"}}}, false},
		{"header all must match", Filter{Headers: []HeaderMatch{{Name: "tenant", Value: "acme"}, {Name: "missing", AnyValue: true}}}, false},
		{"older than", Filter{OlderThan: time.Hour}, true},
		{"not older than", Filter{OlderThan: 3 * time.Hour}, false},
		{"newer than", Filter{NewerThan: 3 * time.Hour}, true},
		{"not newer than", Filter{NewerThan: time.Hour}, false},
		{"age window", Filter{OlderThan: time.Hour, NewerThan: 3 * time.Hour}, true},
		{"all", Filter{Queues: []string{"orders"}, Reasons: []string{"max-attempts"}, Statuses: []string{"5xx"}, RoutingKeys: []string{"order.#"}}, true},
	} {
		if got, why := tc.f.Match(m, t0); got != tc.want {
			t.Errorf("%s: match = %v (%s), want %v", tc.name, got, why, tc.want)
		}
	}
}

func TestFilterWithoutHeaders(t *testing.T) {
	bare := &msg.Message{RoutingKey: "raw.key", Headers: map[string]any{}}
	if ok, _ := (&Filter{Statuses: []string{"0"}}).Match(bare, t0); ok {
		t.Error("a message without a status matched status 0")
	}
	if ok, _ := (&Filter{OlderThan: time.Second}).Match(bare, t0); ok {
		t.Error("a message without a time matched an age filter")
	}
	if ok, _ := (&Filter{RoutingKeys: []string{"raw.*"}}).Match(bare, t0); !ok {
		t.Error("the delivered routing key is used when no original one is pinned")
	}
	bare.Timestamp = t0.Add(-time.Minute)
	if ok, _ := (&Filter{NewerThan: time.Hour}).Match(bare, t0); !ok {
		t.Error("the AMQP timestamp is used when x-dead-letter-time is missing")
	}
}

func TestFilterValidate(t *testing.T) {
	for _, f := range []Filter{
		{Statuses: []string{"5x"}},
		{Statuses: []string{"abc"}},
		{Statuses: []string{"1000"}},
		{OlderThan: -time.Second},
		{OlderThan: time.Hour, NewerThan: time.Minute},
		{Statuses: []string{"7xx"}},
		{Statuses: []string{"0xx"}},
		{Statuses: []string{"99"}},
		{Statuses: []string{"600"}},
	} {
		if err := f.Validate(); err == nil {
			t.Errorf("%+v accepted", f)
		}
	}
	for _, f := range []Filter{{}, {Statuses: []string{"5xx", "404", "0"}}, {OlderThan: time.Minute, NewerThan: time.Hour}} {
		if err := f.Validate(); err != nil {
			t.Errorf("%+v: %v", f, err)
		}
	}
}

func TestParseHeaderMatch(t *testing.T) {
	for in, want := range map[string]HeaderMatch{
		"tenant=acme": {Name: "tenant", Value: "acme"},
		"tenant=":     {Name: "tenant", Value: ""},
		"tenant":      {Name: "tenant", AnyValue: true},
		"k=a=b":       {Name: "k", Value: "a=b"},
	} {
		got, err := ParseHeaderMatch(in)
		if err != nil || got != want {
			t.Errorf("%q: %+v, %v", in, got, err)
		}
	}
	if _, err := ParseHeaderMatch("=x"); err == nil {
		t.Error("empty name accepted")
	}
}

func TestStatsAggregate(t *testing.T) {
	st := NewStats("orders.dlq", 5, t0)
	st.Add(dead("1", "orders", "o", "max-attempts", 503, 3*time.Hour))
	st.Add(dead("2", "orders", "o", "non-retriable", 404, time.Hour))
	st.Add(dead("3", "billing", "b", "max-attempts", 503, 2*time.Hour))
	replayed := dead("4", "billing", "b", "expired", 0, 10*time.Minute)
	replayed.Headers[msg.HeaderReplayCount] = int32(2)
	replayed.Headers[msg.HeaderDeliveryCount] = int64(4)
	st.Add(replayed)
	st.Add(&msg.Message{Headers: map[string]any{}}) // not from Hopper: no headers, no time

	if st.Scanned != 5 || st.Replayed != 1 || st.NoTime != 1 || st.MaxDeliveryCount != 4 {
		t.Errorf("scanned=%d replayed=%d noTime=%d", st.Scanned, st.Replayed, st.NoTime)
	}
	want := map[string]map[string]int{
		"queue":  {"orders": 2, "billing": 2, Unknown: 1},
		"reason": {"max-attempts": 2, "non-retriable": 1, "expired": 1, Unknown: 1},
		"status": {"503": 2, "404": 1, "0": 1, Unknown: 1},
	}
	for name, got := range map[string]map[string]int{"queue": st.ByQueue, "reason": st.ByReason, "status": st.ByStatus} {
		for k, n := range want[name] {
			if got[k] != n {
				t.Errorf("by %s %q = %d, want %d (%v)", name, k, got[k], n, got)
			}
		}
	}
	if !st.Oldest.Equal(t0.Add(-3*time.Hour)) || !st.Newest.Equal(t0.Add(-10*time.Minute)) {
		t.Errorf("oldest %v newest %v", st.Oldest, st.Newest)
	}
	if time.Duration(st.OldestAge) != 3*time.Hour || time.Duration(st.NewestAge) != 10*time.Minute {
		t.Errorf("ages %v %v", time.Duration(st.OldestAge), time.Duration(st.NewestAge))
	}

	var js bytes.Buffer
	if err := st.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back["oldestAge"] != "3h0m0s" || back["depth"] != float64(5) {
		t.Errorf("json: %s", js.String())
	}
	var tbl strings.Builder
	if err := st.WriteTable(&tbl); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"depth", "3h00m ago", "By original queue", "billing", "By final status", "replayed before", "delivery count"} {
		if !strings.Contains(tbl.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, tbl.String())
		}
	}
}

// A typo in an enumerated filter is an error naming the valid values, not a
// filter that matches nothing; every problem is reported at once.
func TestValidateReportsEveryProblem(t *testing.T) {
	f := Filter{Reasons: []string{"max-attempts", "max-attemps", "delivery_limit"}, Statuses: []string{"5xx", "abc"}}
	err := f.Validate()
	if err == nil {
		t.Fatal("accepted a misspelt reason")
	}
	for _, want := range []string{`"max-attemps"`, "app-crash", "delivery_limit", `"abc"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %s:\n%v", want, err)
		}
	}
	o := ReplayOptions{DLQ: "q.dlq", To: "q.dlq", Limit: -1, Parallel: 0, IdleTimeout: time.Second, StallTimeout: 0,
		Filter: Filter{Reasons: []string{"nope"}}}
	err = o.Validate()
	for _, want := range []string{"--limit", "--parallel", "--stall-timeout", "--to", `"nope"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("replay options error lacks %s: %v", want, err)
		}
	}
	ok := ReplayOptions{DLQ: "q.dlq", Parallel: 1, IdleTimeout: time.Second, StallTimeout: time.Second,
		Filter: Filter{Reasons: Reasons()}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid options refused: %v", err)
	}
	if err := (&ImportOptions{Parallel: 0, Skip: -1}).Validate(); err == nil || !strings.Contains(err.Error(), "--skip") || !strings.Contains(err.Error(), "--parallel") {
		t.Errorf("import options: %v", err)
	}
}

// Messages the routing rules dead-letter carry Hopper's reasons filtered
// and filter-error: the tools must accept them as --reason.
func TestRoutingReasonsKnown(t *testing.T) {
	for _, r := range []string{retry.ReasonFiltered, retry.ReasonFilterError} {
		if !slices.Contains(Reasons(), r) {
			t.Errorf("Reasons() %v lacks %q", Reasons(), r)
		}
		o := ReplayOptions{DLQ: "q.dlq", Parallel: 1, IdleTimeout: time.Second, StallTimeout: time.Second,
			Filter: Filter{Reasons: []string{r}}}
		if err := o.Validate(); err != nil {
			t.Errorf("--reason %s refused: %v", r, err)
		}
	}
}
