package sidecar_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
)

// TestOutcomeTable runs every row of the outcome table through a real broker and a
// real HTTP app, then checks what the app saw and where each message ended.
func TestOutcomeTable(t *testing.T) {
	app := newScriptApp(t)
	r := start(t, testConfig(t, app.URL))

	type row struct {
		id        string
		script    []int
		hdr       http.Header
		wantCalls []int  // statuses the app answered, in order
		wantDLQ   string // reason, "" when acked
	}
	rows := []row{
		{id: "ok-200", script: []int{200}, wantCalls: []int{200}},
		{id: "ok-204", script: []int{204}, wantCalls: []int{204}},
		{id: "too-early", script: []int{425, 425, 200}, wantCalls: []int{425, 425, 200}},
		{id: "rate-limited", script: []int{429, 200}, wantCalls: []int{429, 200}},
		{id: "conflict", script: []int{409, 200}, wantCalls: []int{409, 200}},
		{id: "req-timeout", script: []int{408, 200}, wantCalls: []int{408, 200}},
		{id: "server-error", script: []int{500, 502, 200}, wantCalls: []int{500, 502, 200}},
		{id: "always-503", script: []int{503}, wantCalls: []int{503, 503, 503}, wantDLQ: "max-attempts"},
		{id: "bad-400", script: []int{400}, wantCalls: []int{400}, wantDLQ: "non-retriable"},
		{id: "gone-410", script: []int{410}, wantCalls: []int{410}, wantDLQ: "non-retriable"},
		{id: "unproc-422", script: []int{422}, wantCalls: []int{422}, wantDLQ: "non-retriable"},
		{id: "app-says-dlq", script: []int{200}, hdr: http.Header{"Hopper-Action": {"dlq"}}, wantCalls: []int{200}, wantDLQ: "app-action"},
		{id: "app-says-retry", script: []int{200, 200}, hdr: http.Header{"Hopper-Action": {"retry"}}, wantCalls: []int{200, 200, 200}, wantDLQ: "max-attempts"},
		{id: "app-says-drop", script: []int{500}, hdr: http.Header{"Hopper-Action": {"drop"}}, wantCalls: []int{500}},
	}
	for _, rw := range rows {
		app.script(rw.id, rw.script...)
		if rw.hdr != nil {
			app.hdrs[rw.id] = rw.hdr
		}
		r.publish(rw.id)
	}
	wantDLQ := 0
	for _, rw := range rows {
		if rw.wantDLQ != "" {
			wantDLQ++
		}
	}
	r.settled(wantDLQ)

	dead := r.drain(r.sc.Plan().DLQ.Name)
	for _, rw := range rows {
		if got := app.statuses(rw.id); !slices.Equal(got, rw.wantCalls) {
			t.Errorf("%s: app answered %v, want %v", rw.id, got, rw.wantCalls)
		}
		m, inDLQ := dead[rw.id]
		switch {
		case rw.wantDLQ == "" && inDLQ:
			t.Errorf("%s: in the DLQ (%v), want acked", rw.id, m.Headers[msg.HeaderDeadLetterReason])
		case rw.wantDLQ != "" && !inDLQ:
			t.Errorf("%s: not in the DLQ, want reason %s", rw.id, rw.wantDLQ)
		case inDLQ && m.Headers[msg.HeaderDeadLetterReason] != rw.wantDLQ:
			t.Errorf("%s: reason %v, want %s", rw.id, m.Headers[msg.HeaderDeadLetterReason], rw.wantDLQ)
		}
	}
	// 425 is not an attempt: the requeued message is attempt 1 every time.
	for _, c := range app.callsFor("too-early") {
		if c.Attempt != 1 {
			t.Errorf("too-early: attempt %d after a requeue, want 1", c.Attempt)
		}
	}
	if got := app.attempts("server-error"); !slices.Equal(got, []int{1, 2, 3}) {
		t.Errorf("server-error: attempts %v, want [1 2 3]", got)
	}
	st := r.sc.Stats()
	if st.Dropped.Load() != 1 {
		t.Errorf("dropped = %d, want 1", st.Dropped.Load())
	}
}

// TestDLQHeaders checks every dead-letter header on a dead-lettered message, and
// that body and properties are the published ones.
func TestDLQHeaders(t *testing.T) {
	app := newScriptApp(t)
	r := start(t, testConfig(t, app.URL))
	if err := r.insp.Bind(r.cfg.Queue.Name, "amq.topic", "orders.#"); err != nil {
		t.Fatal(err)
	}
	app.script("m1", 500, 502, 503)
	start := time.Now().UTC().Add(-time.Second)
	r.publish("m1", via("amq.topic", "orders.created.eu"), withHeader("tenant", "acme"), func(m *msg.Message) {
		m.CorrelationID, m.Type, m.ContentType = "corr-1", "OrderCreated", "application/json"
		m.Body = []byte(`{"order":1}`)
	})
	r.settled(1)
	m := r.drain(r.sc.Plan().DLQ.Name)["m1"]
	if m == nil {
		t.Fatal("m1 not in the DLQ")
	}
	want := map[string]any{
		"x-original-queue":       r.cfg.Queue.Name,
		"x-original-exchange":    "amq.topic",
		"x-original-routing-key": "orders.created.eu",
		"x-final-status-code":    int64(503),
		"x-final-retry-count":    int64(3),
		"x-retry-count":          int64(3),
		"x-dead-letter-reason":   "max-attempts",
		"tenant":                 "acme",
	}
	for k, v := range want {
		if m.Headers[k] != v {
			t.Errorf("%s = %#v, want %#v", k, m.Headers[k], v)
		}
	}
	if e := m.String("x-final-error"); !strings.Contains(e, "503") {
		t.Errorf("x-final-error %q does not mention the status", e)
	}
	first, err1 := time.Parse(time.RFC3339Nano, m.String("x-first-failure-time"))
	last, err2 := time.Parse(time.RFC3339Nano, m.String("x-last-failure-time"))
	if err1 != nil || err2 != nil || first.Before(start) || !last.After(first) {
		t.Errorf("failure times first=%q last=%q (published after %s)", m.String("x-first-failure-time"), m.String("x-last-failure-time"), start)
	}
	if string(m.Body) != `{"order":1}` || m.ContentType != "application/json" || m.CorrelationID != "corr-1" || m.Type != "OrderCreated" || m.MessageID != "m1" {
		t.Errorf("body or properties changed: %+v", m)
	}
	if m.DeliveryMode != 2 {
		t.Errorf("delivery mode %d, want persistent", m.DeliveryMode)
	}
	// Across retries the app kept seeing the original routing key and exchange.
	for _, c := range app.callsFor("m1") {
		if c.RoutingKey != "orders.created.eu" || c.Exchange != "amq.topic" {
			t.Errorf("attempt %d saw routing key %q exchange %q", c.Attempt, c.RoutingKey, c.Exchange)
		}
		if c.Header.Get("Hopper-Header-Tenant") != "acme" && c.Header.Get("Hopper-Header-tenant") != "acme" {
			t.Errorf("attempt %d: application header not forwarded: %v", c.Attempt, c.Header)
		}
		if c.Body != `{"order":1}` || c.Header.Get("Content-Type") != "application/json" {
			t.Errorf("attempt %d: body %q content type %q", c.Attempt, c.Body, c.Header.Get("Content-Type"))
		}
	}
}

// TestAttemptCountingAcrossTierCycle follows one message through both tier
// queues and back: each return is delivered with attempt+1.
func TestAttemptCountingAcrossTierCycle(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	cfg.Retry.MaxAttempts = 5
	r := start(t, cfg)
	app.script("cycle", 503, 503, 503, 200)
	began := time.Now()
	r.publish("cycle")
	r.settled(0)
	elapsed := time.Since(began)
	calls := app.callsFor("cycle")
	if got := app.attempts("cycle"); !slices.Equal(got, []int{1, 2, 3, 4}) {
		t.Fatalf("attempts %v, want [1 2 3 4]", got)
	}
	// Tiers 200ms, 400ms, 400ms (the last tier repeats): at least 1s.
	if elapsed < time.Second {
		t.Errorf("a full tier cycle took %s, less than the 1s of delays", elapsed)
	}
	if ff := calls[1].Header.Get("Hopper-First-Failure-Time"); ff == "" || calls[3].Header.Get("Hopper-First-Failure-Time") != ff {
		t.Errorf("first failure time not kept across retries: %q then %q", ff, calls[3].Header.Get("Hopper-First-Failure-Time"))
	}
}

// TestTimeoutCountsAsAttempt: a request that hangs past app.timeout is a
// failed attempt and goes through a tier.
func TestTimeoutCountsAsAttempt(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	cfg.App.Timeout = config.Duration(300 * time.Millisecond)
	r := start(t, cfg)
	app.script("slow", 0, 200)
	r.publish("slow")
	r.settled(0)
	if got := app.attempts("slow"); !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("attempts %v, want [1 2]", got)
	}
	if r.sc.Stats().Retried.Load() != 1 {
		t.Fatalf("retried = %d, want 1", r.sc.Stats().Retried.Load())
	}
}

// TestRetryAfterPicksTier: a Retry-After longer than the first tier sends
// the message to the smallest tier at least that long.
func TestRetryAfterPicksTier(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	// The tier Retry-After picks is an hour long, so the message stays
	// there to be seen however slowly the test looks.
	cfg.Retry.Tiers = []config.Duration{config.Duration(100 * time.Millisecond), config.Duration(time.Hour)}
	r := start(t, cfg)
	app.script("ra", 429, 200)
	app.hdrs["ra"] = http.Header{"Retry-After": {"2"}}
	r.publish("ra")
	tier1h := r.cfg.Queue.Name + ".retry.1h"
	waitfor.Until(t, 30*time.Second, "message in the 1h tier", func() bool { return r.depth(tier1h) == 1 })
	if n := r.depth(r.cfg.Queue.Name + ".retry.100ms"); n != 0 {
		t.Errorf("the 100ms tier, shorter than Retry-After, holds %d message(s)", n)
	}
	if got := app.attempts("ra"); !slices.Equal(got, []int{1}) {
		t.Fatalf("attempts %v, want [1]", got)
	}
}

// TestTooEarlyCap: past requeue.maxRequeues a 425 message is dead-lettered
// with reason too-early, never having spent an attempt.
func TestTooEarlyCap(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	cfg.Requeue.MaxRequeues = 3
	r := start(t, cfg)
	app.script("early", 425)
	r.publish("early")
	r.settled(1)
	m := r.drain(r.sc.Plan().DLQ.Name)["early"]
	if m == nil || m.Headers[msg.HeaderDeadLetterReason] != "too-early" {
		t.Fatalf("want early in the DLQ with too-early, got %+v", m)
	}
	if n := len(app.callsFor("early")); n != 4 {
		t.Fatalf("app saw %d calls, want 4 (1 + 3 requeues)", n)
	}
	if m.Headers[msg.HeaderFinalRetryCount] != int64(0) {
		t.Fatalf("requeues must not count as attempts: %v", m.Headers[msg.HeaderFinalRetryCount])
	}
}

// TestPoliciesPerMessage: reminders get one attempt while status
// transitions retry without limit; a team's "every 4xx retried"
// is one outcome entry.
func TestPoliciesPerMessage(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	one := config.Attempts(1)
	unlimited := config.Attempts(0)
	cfg.Retry.Policies = []config.Policy{
		{Name: "reminders", Match: config.Match{RoutingKey: "game.reminder.#"}, MaxAttempts: &one},
		{Name: "status", Match: config.Match{Type: "STATUS_*"}, MaxAttempts: &unlimited},
		{Name: "lenient", Match: config.Match{Header: "lenient=yes"}, Outcomes: map[string]string{"4xx": "retry"}},
	}
	r := start(t, cfg)
	if err := r.insp.Bind(r.cfg.Queue.Name, "amq.topic", "game.#"); err != nil {
		t.Fatal(err)
	}
	app.script("reminder", 503)
	app.script("status", 503, 503, 503, 503, 503, 200)
	app.script("lenient", 404, 404, 200)
	r.publish("reminder", via("amq.topic", "game.reminder.due"))
	r.publish("status", via("amq.topic", "game.status"), func(m *msg.Message) { m.Type = "STATUS_TRANSITION_DUE" })
	r.publish("lenient", withHeader("lenient", "yes"))
	// The queues read empty also while a retried message passes from its
	// tier back to the work queue, where neither holds it: the app's last
	// answers are what says the retries are over.
	waitfor.Until(t, 30*time.Second, "status's sixth attempt and lenient's third", func() bool {
		return len(app.attempts("status")) >= 6 && len(app.statuses("lenient")) >= 3
	})
	r.settled(1)
	dead := r.drain(r.sc.Plan().DLQ.Name)
	if dead["reminder"] == nil || len(app.callsFor("reminder")) != 1 {
		t.Errorf("reminder: want 1 attempt then DLQ, got %d calls, dlq=%v", len(app.callsFor("reminder")), dead["reminder"] != nil)
	}
	if got := app.attempts("status"); !slices.Equal(got, []int{1, 2, 3, 4, 5, 6}) {
		t.Errorf("status: attempts %v, want 6 (beyond the default limit of 3)", got)
	}
	if got := app.statuses("lenient"); !slices.Equal(got, []int{404, 404, 200}) {
		t.Errorf("lenient: statuses %v", got)
	}
}

// TestExpiredNeverDeliveredStale: a message past its deadline is
// dead-lettered with reason expired without being delivered, and a retry
// that would bring it back after its deadline expires it at once.
func TestExpiredNeverDeliveredStale(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	cfg.Retry.DeadlineHeader = "deadline"
	r := start(t, cfg)
	app.script("past", 200)
	app.script("short", 503, 200)
	app.script("fresh", 503, 200)
	deadline := func(d time.Duration) pubOpt {
		return withHeader("deadline", time.Now().Add(d).UTC().Format(time.RFC3339Nano))
	}
	r.publish("past", deadline(-time.Second))
	r.publish("short", deadline(150*time.Millisecond)) // shorter than the 200ms tier
	r.publish("fresh", deadline(time.Minute))
	r.settled(2)
	dead := r.drain(r.sc.Plan().DLQ.Name)
	for id, calls := range map[string]int{"past": 0, "short": 1} {
		if dead[id] == nil || dead[id].Headers[msg.HeaderDeadLetterReason] != "expired" {
			t.Errorf("%s: want DLQ expired, got %v", id, dead[id])
		}
		if n := len(app.callsFor(id)); n != calls {
			t.Errorf("%s delivered %d times, want %d", id, n, calls)
		}
	}
	if got := app.statuses("fresh"); !slices.Equal(got, []int{503, 200}) {
		t.Errorf("fresh: %v", got)
	}
}
