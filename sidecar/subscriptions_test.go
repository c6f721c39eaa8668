package sidecar_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/sidecar"
)

// twoSubscriptions turns a test config into one with two subscriptions,
// queues <name>.a and <name>.b, both bound to a shared fanout exchange and
// each to a direct exchange of its own; a posts to /a/{routingKey}, b to
// /b/{queue}.
func twoSubscriptions(t *testing.T, cfg config.Config) (config.Config, string, string) {
	t.Helper()
	base := cfg.Queue.Name
	qa, qb := base+".a", base+".b"
	cfg.Queue.Name = ""
	cfg.Topology.Bindings = []config.Binding{{Exchange: base + ".fan", Type: "fanout"}}
	cfg.Subscriptions = []config.Subscription{
		{
			Queue: config.Queue{Name: qa},
			Bindings: []config.Binding{
				{Exchange: base + ".fan", Type: "fanout"},
				{Exchange: base + ".direct-a", Type: "direct", RoutingKeys: []string{"to-a"}},
			},
			Path: "/a/{routingKey}",
		},
		{
			Queue: config.Queue{Name: qb},
			Bindings: []config.Binding{
				{Exchange: base + ".fan", Type: "fanout"},
				{Exchange: base + ".direct-b", Type: "direct", RoutingKeys: []string{"to-b"}},
			},
			Path:  "/b/{queue}",
			Retry: config.SubscriptionRetry{MaxAttempts: ptr(config.Attempts(2))},
		},
	}
	return cfg, qa, qb
}

func ptr[T any](v T) *T { return &v }

// settledAll waits until every work and tier queue of every subscription is
// empty and each DLQ holds what want says (0 when not named).
func (r *running) settledAll(want map[string]int) {
	r.t.Helper()
	var last map[string]int
	waitfor.Until(r.t, 30*time.Second, "every subscription's queues to settle", func() bool {
		last = allDepths(r.t)
		for _, plan := range r.sc.Plans() {
			for _, q := range plan.Queues() {
				if last[q.Name] != want[q.Name] {
					return false
				}
			}
		}
		return true
	})
}

// One sidecar, two queues: messages published to an exchange reach the
// subscription bound to it at its own path; each queue retries under its
// own policy, into its own tier queues and DLQ; metrics and /readyz name
// the queue; both consumers share one broker connection.
func TestSubscriptionsRouteAndRetryPerQueue(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	cfg.Admin.Listen = "127.0.0.1:0"
	cfg, qa, qb := twoSubscriptions(t, cfg)
	base := strings.TrimSuffix(qa, ".a")
	r := start(t, cfg)

	app.script("a-fail", 500, 200) // a: 3 attempts inherited, succeeds on the 2nd
	app.script("b-fail", 500)      // b: 2 attempts, then its DLQ
	r.publish("a-ok", via(base+".direct-a", "to-a"))
	r.publish("a-fail", via(base+".direct-a", "to-a"))
	r.publish("b-ok", via(base+".direct-b", "to-b"))
	r.publish("b-fail", via(base+".direct-b", "to-b"))
	r.publish("both", via(base+".fan", "any"))

	dlqA, dlqB := r.sc.Plans()[0].DLQ.Name, r.sc.Plans()[1].DLQ.Name
	r.settledAll(map[string]int{dlqB: 1})

	paths := func(id string) []string {
		var out []string
		for _, c := range app.callsFor(id) {
			out = append(out, c.Path)
		}
		slices.Sort(out)
		return out
	}
	for id, want := range map[string][]string{
		"a-ok":   {"/a/to-a"},
		"a-fail": {"/a/to-a", "/a/to-a"},
		"b-ok":   {"/b/" + qb},
		"b-fail": {"/b/" + qb, "/b/" + qb},
		"both":   {"/a/any", "/b/" + qb},
	} {
		if got := paths(id); !slices.Equal(got, want) {
			t.Errorf("%s reached the app at %v, want %v", id, got, want)
		}
	}
	if got := app.attempts("a-fail"); !slices.Equal(got, []int{1, 2}) {
		t.Errorf("a-fail attempts %v, want [1 2]", got)
	}
	if n := r.depth(dlqA); n != 0 {
		t.Errorf("queue a's DLQ holds %d, want 0", n)
	}
	dead := r.drain(dlqB)
	m, ok := dead["b-fail"]
	if !ok || len(dead) != 1 {
		t.Fatalf("queue b's DLQ holds %v, want only b-fail", dead)
	}
	if q, _ := m.Headers["x-original-queue"].(string); q != qb {
		t.Errorf("b-fail's x-original-queue %q, want %q", q, qb)
	}
	if reason, _ := m.Headers["x-dead-letter-reason"].(string); reason != "max-attempts" {
		t.Errorf("b-fail dead-lettered as %q, want max-attempts (b allows 2 attempts)", reason)
	}

	for q, want := range map[string]int64{qa: 3, qb: 2} {
		if st := r.sc.QueueStats(q); st == nil || st.Acked.Load() != want {
			t.Errorf("queue %s acked %v, want %d", q, st, want)
		}
	}
	if v := labelled(t, r.sc, "hopper_deliveries_total", map[string]string{"outcome": "dlq", "queue": qb, "status_class": "5xx"}); v != 1 {
		t.Errorf("queue b's dlq deliveries = %v, want 1", v)
	}
	if v := labelled(t, r.sc, "hopper_deliveries_total", map[string]string{"outcome": "dlq", "queue": qa, "status_class": "5xx"}); v != 0 {
		t.Errorf("queue a's dlq deliveries = %v, want 0", v)
	}
	if v := labelled(t, r.sc, "hopper_retries_total", map[string]string{"queue": qa, "tier": "200ms"}); v != 1 {
		t.Errorf("queue a's retries = %v, want 1", v)
	}

	code, body := readyz(t, r.sc)
	if code != http.StatusOK || !strings.Contains(body, "queue "+qa+": consuming") || !strings.Contains(body, "queue "+qb+": consuming") {
		t.Errorf("/readyz = %d %q, want both queues listed as consuming", code, body)
	}

	// Both consumers are channels of one connection.
	out, err := rabbit.Ctl("list_consumers", "-q", "--no-table-headers", "queue_name", "channel_pid")
	if err != nil {
		t.Fatal(err)
	}
	chans := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 2 && (f[0] == qa || f[0] == qb) {
			chans[f[0]] = f[1]
		}
	}
	if len(chans) != 2 || chans[qa] == chans[qb] {
		t.Fatalf("consumers by queue %v: want one channel per queue", chans)
	}
	out, err = rabbit.Ctl("list_channels", "-q", "--no-table-headers", "pid", "connection")
	if err != nil {
		t.Fatal(err)
	}
	conns := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			conns[f[0]] = f[1]
		}
	}
	if conns[chans[qa]] == "" || conns[chans[qa]] != conns[chans[qb]] {
		t.Errorf("queue a's channel is on connection %q, b's on %q: want one consuming connection", conns[chans[qa]], conns[chans[qb]])
	}
}

// A queue whose messages hang in the app does not hold back the queue
// beside it: with every worker of the poisoned queue stuck in a request,
// the healthy queue still drains. At shutdown both drain: the stuck
// requests finish within the grace period and are acked, nothing is left
// unacked in either queue.
func TestSubscriptionsIsolatedAndDrainedOnShutdown(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	cfg.Shutdown.Grace = config.Duration(30 * time.Second)
	cfg.Admin.Listen = "127.0.0.1:0"
	cfg, qa, qb := twoSubscriptions(t, cfg)
	cfg.Subscriptions[0].Consumer = config.SubscriptionConsumer{Prefetch: ptr(2)}
	r := start(t, cfg)

	stuck := []string{"p1", "p2"}
	release := app.hold(stuck...)
	defer release()
	for _, id := range stuck {
		r.publish(id, via("", qa))
	}
	waitfor.Until(t, 30*time.Second, "both of queue a's workers stuck in a request", func() bool {
		return len(app.callsFor("p1")) == 1 && len(app.callsFor("p2")) == 1
	})

	var healthy []string
	for i := range 20 {
		id := "h" + string(rune('a'+i))
		healthy = append(healthy, id)
		r.publish(id, via("", qb))
	}
	waitfor.Until(t, 30*time.Second, "queue b drained beside the stuck queue a", func() bool {
		st := r.sc.QueueStats(qb)
		return st != nil && st.Acked.Load() == int64(len(healthy))
	})
	if n := r.sc.QueueStats(qa).InFlight.Load(); n != 2 {
		t.Fatalf("queue a has %d in flight, want its 2 stuck requests", n)
	}

	// SIGTERM while queue a's requests are held: the sidecar stops
	// consuming, the requests then finish and are acked.
	done := make(chan error, 1)
	go func() { done <- r.shutdown() }()
	waitfor.Until(t, 30*time.Second, "the sidecar stopping", func() bool {
		code, _ := readyz(t, r.sc)
		return code == http.StatusServiceUnavailable && !r.sc.Consuming()
	})
	release()
	if err := <-done; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if got := r.sc.QueueStats(qa).Acked.Load(); got != 2 {
		t.Errorf("queue a acked %d after shutdown, want its 2 held messages", got)
	}
	depths := allDepths(t)
	for _, q := range []string{qa, qb} {
		if depths[q] != 0 {
			t.Errorf("queue %s holds %d after shutdown, want 0", q, depths[q])
		}
	}
}

// labelled reads the counter of name whose labels include every one given.
func labelled(t *testing.T, sc *sidecar.Sidecar, name string, labels map[string]string) float64 {
	t.Helper()
	v, ok := sc.Metrics().Value(name, labels)
	if !ok {
		t.Fatalf("no series %s%v", name, labels)
	}
	return v
}

// An ordered subscription beside a busy one: the app sees its messages 1..N
// in publish order although some fail twice first and one fails until the
// DLQ, while the other queue's messages flow through the same app client,
// breaker and concurrency limit.
func TestSubscriptionOrderedBesideAnother(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	cfg, qa, qb := twoSubscriptions(t, cfg)
	cfg.Subscriptions[1].Consumer = config.SubscriptionConsumer{Ordered: ptr(true)}
	cfg.Subscriptions[1].Retry = config.SubscriptionRetry{} // the inherited 3 attempts
	r := start(t, cfg)

	const n = 12
	var ids, others []string
	for i := 1; i <= n; i++ {
		ids = append(ids, fmt.Sprintf("o%02d", i))
	}
	for _, id := range []string{"o03", "o07", "o11"} {
		app.script(id, 503, 500, 200)
	}
	app.script("o09", 503) // every attempt fails: b's DLQ after 3
	for i := range 40 {
		id := fmt.Sprintf("busy%02d", i)
		others = append(others, id)
		r.publish(id, via("", qa))
	}
	for _, id := range ids {
		r.publish(id, via("", qb))
	}
	r.settledAll(map[string]int{r.sc.Plans()[1].DLQ.Name: 1})

	order := app.order(func(c call) bool { return c.Path == "/b/"+qb })
	if !slices.Equal(order, ids) {
		t.Errorf("the ordered queue's messages reached the app in the order %v, want %v", order, ids)
	}
	for _, id := range []string{"o03", "o07", "o11", "o09"} {
		if got := app.attempts(id); !slices.Equal(got, []int{1, 2, 3}) {
			t.Errorf("%s: attempts %v, want [1 2 3]", id, got)
		}
	}
	if st := r.sc.QueueStats(qa); st.Acked.Load() != int64(len(others)) {
		t.Errorf("queue a acked %d, want %d", st.Acked.Load(), len(others))
	}
	if _, ok := r.drain(r.sc.Plans()[1].DLQ.Name)["o09"]; !ok {
		t.Error("o09 is not in the ordered queue's DLQ")
	}
}
