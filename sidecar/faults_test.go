package sidecar_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/sidecar"
)

// TestAppDownReturnsWithoutAttempt: while the app refuses connections the
// message goes back to the work queue, never to a tier or the DLQ, and is
// delivered as attempt 1 once the app is back.
func TestAppDownReturnsWithoutAttempt(t *testing.T) {
	app := newScriptApp(t)
	r := start(t, testConfig(t, app.URL))
	app.Close()
	r.publish("patient")
	waitfor.Until(t, 10*time.Second, "returns while the app is down", func() bool { return r.sc.Stats().Returned.Load() >= 3 })
	d := allDepths(t)
	plan := r.sc.Plan()
	if d[plan.DLQ.Name] != 0 || d[plan.Tiers[0].Name] != 0 || d[plan.Tiers[1].Name] != 0 {
		t.Fatalf("app outage moved the message: %v", d)
	}
	if d[plan.Work.Name] != 1 {
		t.Fatalf("message not held in the work queue: %v", d)
	}
	app.Restart()
	r.settled(0)
	if got := app.attempts("patient"); len(got) != 1 || got[0] != 1 {
		t.Fatalf("after the outage the app saw attempts %v, want [1]", got)
	}
	if st := r.sc.Stats(); st.Retried.Load() != 0 || st.DeadLettered.Load() != 0 {
		t.Fatalf("outage spent attempts: retried=%d dlq=%d", st.Retried.Load(), st.DeadLettered.Load())
	}
}

// TestRefusedMoveKeepsOriginal: a DLQ full with overflow=reject-publish
// refuses the dead-lettering; the original stays in the work queue (nacked,
// never acked) until there is room.
func TestRefusedMoveKeepsOriginal(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	cfg.Topology.DLQMaxLength = 1
	r := start(t, cfg)
	app.script("first", 400)
	app.script("second", 400)
	r.publish("first")
	waitfor.Until(t, 10*time.Second, "first in the DLQ", func() bool { return allDepths(t)[r.sc.Plan().DLQ.Name] == 1 })
	r.publish("second")
	waitfor.Until(t, 10*time.Second, "a refused move", func() bool { return r.sc.Stats().MoveFailed.Load() >= 1 })
	d := allDepths(t)
	if d[r.cfg.Queue.Name] != 1 || d[r.sc.Plan().DLQ.Name] != 1 {
		t.Fatalf("after a refused move want 1 in the work queue and 1 in the DLQ, got %v", d)
	}
	// Make room: the held message now moves.
	got := r.drain(r.sc.Plan().DLQ.Name)
	if got["first"] == nil {
		t.Fatalf("first not in the DLQ: %v", got)
	}
	r.settled(1)
	if r.drain(r.sc.Plan().DLQ.Name)["second"] == nil {
		t.Fatal("second lost")
	}
}

// TestShutdownFinishesInFlightAndReturnsTheRest: in-flight deliveries
// finish and are acked within the grace period, the prefetched rest goes
// back to the queue unacked, and nothing reaches the DLQ.
func TestShutdownFinishesInFlightAndReturnsTheRest(t *testing.T) {
	var started atomic.Int64
	release := make(chan struct{})
	app := newScriptApp(t)
	app.srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started.Add(1)
		<-release
		w.WriteHeader(200)
	})
	cfg := testConfig(t, app.URL)
	cfg.Consumer.Prefetch = 10
	cfg.Consumer.Workers = 2
	r := start(t, cfg)
	for _, id := range []string{"a", "b", "c", "d", "e", "f"} {
		r.publish(id)
	}
	waitfor.Until(t, 10*time.Second, "two deliveries in flight", func() bool { return started.Load() == 2 })
	errc := make(chan error, 1)
	go func() { errc <- r.shutdown() }()
	// Shutdown has begun once the consumer is cancelled; the two are still
	// in flight, held by the app.
	waitfor.Until(t, 10*time.Second, "consumer cancelled", func() bool { return !r.sc.Consuming() })
	close(release)
	if err := <-errc; err != nil {
		t.Fatalf("Run returned %v, want nil", err)
	}
	st := r.sc.Stats()
	if st.Acked.Load() != 2 {
		t.Errorf("acked %d, want the 2 in flight", st.Acked.Load())
	}
	d := allDepths(t)
	if d[r.cfg.Queue.Name] != 4 || d[r.sc.Plan().DLQ.Name] != 0 {
		t.Errorf("want 4 returned to the work queue and none in the DLQ, got %v", d)
	}
	if started.Load() != 2 {
		t.Errorf("%d deliveries started after shutdown began", started.Load()-2)
	}
}

// TestShutdownGraceExpires: a delivery still in flight when the grace
// period ends is not acked; it goes back to the queue.
func TestShutdownGraceExpires(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	cfg.App.Timeout = config.Duration(20 * time.Second)
	cfg.Shutdown.Grace = config.Duration(500 * time.Millisecond)
	r := start(t, cfg)
	app.script("hang", 0)
	r.publish("hang")
	waitfor.Until(t, 10*time.Second, "the delivery in flight", func() bool { return len(app.callsFor("hang")) == 1 })
	began := time.Now()
	if err := r.shutdown(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("shutdown took %s with a 500ms grace", took)
	}
	waitfor.Until(t, 10*time.Second, "hang back in the work queue", func() bool { return allDepths(t)[r.cfg.Queue.Name] == 1 })
	if n := allDepths(t)[r.sc.Plan().DLQ.Name]; n != 0 {
		t.Errorf("DLQ has %d after shutdown", n)
	}
}

// TestReconnectAfterConnectionsClosed: the broker closing every connection
// (as `rabbitmqctl close_all_connections` does) is followed by a reconnect,
// and messages keep flowing; the one in flight at that moment is not lost.
func TestReconnectAfterConnectionsClosed(t *testing.T) {
	app := newScriptApp(t)
	r := start(t, testConfig(t, app.URL))
	app.script("before", 200)
	r.publish("before")
	r.settled(0)
	if err := rabbit.CloseAllConnections(); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, 15*time.Second, "consumer back", func() bool { return r.sc.Consuming() })
	app.script("after", 503, 200)
	publishRetrying(t, r, "after")
	r.settled(0)
	if got := app.statuses("after"); len(got) != 2 || got[1] != 200 {
		t.Fatalf("after reconnect: app answered %v, want [503 200]", got)
	}
}

// publishRetrying publishes, retrying while the test's own publisher
// reconnects.
func publishRetrying(t *testing.T, r *running, id string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	m := &msg.Message{MessageID: id, Headers: map[string]any{}, Body: []byte(id)}
	for {
		err := r.pub.Publish(context.Background(), r.cfg.Queue.Name, m)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("publish %s: %v", id, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestWorkQueueDeletedIsRecreated: a broker-side consumer cancel (the queue
// deleted) makes Hopper re-declare and re-consume.
func TestWorkQueueDeletedIsRecreated(t *testing.T) {
	app := newScriptApp(t)
	r := start(t, testConfig(t, app.URL))
	if _, err := rabbit.Ctl("delete_queue", r.cfg.Queue.Name); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, 15*time.Second, "queue re-declared", func() bool {
		_, ok := allDepths(t)[r.cfg.Queue.Name]
		return ok && r.sc.Consuming()
	})
	app.script("again", 200)
	publishRetrying(t, r, "again")
	r.settled(0)
	if len(app.callsFor("again")) != 1 {
		t.Fatal("not delivered after the queue came back")
	}
}

// TestVerifyFailsOnMissingTopology: with topology.declare false and the
// queues absent, Run fails at start with a clear error.
func TestVerifyFailsOnMissingTopology(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	cfg.Topology.Declare = false
	sc := sidecar.New(&cfg, testLogger(t))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := sc.Run(ctx)
	if !errors.Is(err, broker.ErrTopology) {
		t.Fatalf("Run = %v, want a topology error", err)
	}
	if !strings.Contains(err.Error(), cfg.Queue.Name) {
		t.Errorf("error does not name the queue: %v", err)
	}
}

// TestVerifyFailsOnMismatchedArguments: a tier queue declared with another
// TTL is a mismatch, reported and not "fixed" by Hopper.
func TestVerifyFailsOnMismatchedArguments(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	sc := sidecar.New(&cfg, testLogger(t))
	if err := broker.Apply(context.Background(), broker.ConfigOptions(cfg.Broker, testLogger(t), "t"), sc.Plan(), true); err != nil {
		t.Fatal(err)
	}
	other := cfg
	other.Retry.Tiers = []config.Duration{config.Duration(200 * time.Millisecond), config.Duration(400 * time.Millisecond)}
	other.Topology.Declare = false
	other.Topology.DLQMaxLength = 7 // the existing DLQ has no x-max-length
	sc2 := sidecar.New(&other, testLogger(t))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := sc2.Run(ctx)
	if !errors.Is(err, broker.ErrTopology) || !strings.Contains(err.Error(), sc.Plan().DLQ.Name) {
		t.Fatalf("Run = %v, want a mismatch naming the DLQ", err)
	}
}

// TestQuorumQueues: the whole topology as quorum queues; a retry cycle and
// an app outage (returns republish instead of nack) work the same.
func TestQuorumQueues(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	cfg.Queue.Type = "quorum"
	cfg.Queue.DeliveryLimit = 5
	// Without the breaker the outage returns the message again and again,
	// which is what must not spend the delivery limit.
	cfg.Breaker.Enabled = false
	r := start(t, cfg)
	app.script("q1", 503, 200)
	app.script("q2", 400)
	r.publish("q1")
	r.publish("q2")
	r.settled(1)
	if got := app.attempts("q1"); len(got) != 2 || got[1] != 2 {
		t.Fatalf("q1 attempts %v", got)
	}
	// An outage longer than the delivery limit: returns must not spend it.
	app.Close()
	r.publish("q3")
	waitfor.Until(t, 15*time.Second, "more returns than the delivery limit", func() bool { return r.sc.Stats().Returned.Load() >= 8 })
	app.Restart()
	r.settled(1)
	if len(app.callsFor("q3")) != 1 {
		t.Fatalf("q3 lost after an outage on a quorum queue (calls %v)", app.callsFor("q3"))
	}
}

// TestHostileHeaders: header values with CR/LF/NUL, invalid names, nested
// tables, arrays, binary and huge values neither break the request nor
// lose the message; what is left out is counted for the app.
func TestHostileHeaders(t *testing.T) {
	app := newScriptApp(t)
	r := start(t, testConfig(t, app.URL))
	app.script("hostile", 200)
	r.publish("hostile",
		withHeader("inject", "a\r\nX-Evil: 1\x00b"),
		withHeader("bad name", "x"),
		withHeader("nested", map[string]any{"k": "v"}),
		withHeader("list", []any{"a", int32(1)}),
		withHeader("bin", []byte{0xff, 0x00, 0x10}),
		withHeader("huge", strings.Repeat("x", 100000)),
		withHeader("count", int64(42)),
		withHeader("flag", true),
		func(m *msg.Message) { m.Body = []byte{0xff, 0xfe, 0x00} },
	)
	r.settled(0)
	c := app.callsFor("hostile")
	if len(c) != 1 {
		t.Fatalf("calls %d", len(c))
	}
	h := c[0].Header
	if h.Get("X-Evil") != "" || strings.ContainsAny(h.Get("Hopper-Header-inject"), "\r\n\x00") {
		t.Errorf("header injection got through: %v", h)
	}
	if h.Get("Hopper-Header-inject") != "a  X-Evil: 1 b" {
		t.Errorf("sanitised value %q", h.Get("Hopper-Header-inject"))
	}
	if h.Get("Hopper-Header-count") != "42" || h.Get("Hopper-Header-flag") != "true" {
		t.Errorf("numbers/booleans not forwarded: count=%q flag=%q", h.Get("Hopper-Header-count"), h.Get("Hopper-Header-flag"))
	}
	if v := h.Values("Hopper-Header-huge"); len(v) > 0 {
		t.Errorf("a value over app.forward.maxValueBytes forwarded (%d bytes)", len(v[0]))
	}
	// bad name, nested, list, bin and huge are left out, and the app is
	// told so.
	if h.Get("Hopper-Headers-Omitted") != "5" {
		t.Errorf("Hopper-Headers-Omitted = %q, want 5", h.Get("Hopper-Headers-Omitted"))
	}
	if c[0].Body != "\xff\xfe\x00" {
		t.Errorf("binary body changed: %q", c[0].Body)
	}
}

// TestBreakerPausesDuringOutage: consecutive unavailable results open the
// breaker, which cancels the consumer: the messages wait in the work queue
// (no tier, no DLQ, no churn), /readyz says paused on purpose, and when the
// app is back one probe delivery closes the breaker and everything flows.
func TestBreakerPausesDuringOutage(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	cfg.Breaker.Failures = 3
	cfg.Admin.Listen = "127.0.0.1:0"
	r := start(t, cfg)
	app.Close()
	for _, id := range []string{"o1", "o2", "o3", "o4", "o5"} {
		r.publish(id)
	}
	waitfor.Until(t, 10*time.Second, "breaker open and consumer paused", func() bool {
		return r.sc.BreakerState() == "open" && r.sc.Paused()
	})
	// Paused: the broker lists no consumer on the work queue, so nothing
	// more is taken from it, and every message is back in it, ready.
	waitfor.Until(t, 10*time.Second, "no consumer on the work queue and all 5 ready", func() bool {
		out, err := rabbit.Ctl("list_queues", "-q", "--no-table-headers", "name", "consumers", "messages_ready")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) == 3 && f[0] == r.cfg.Queue.Name {
				return f[1] == "0" && f[2] == "5"
			}
		}
		return false
	})
	d := allDepths(t)
	plan := r.sc.Plan()
	if d[plan.Work.Name] != 5 || d[plan.DLQ.Name] != 0 || d[plan.Tiers[0].Name] != 0 {
		t.Fatalf("during the outage want all 5 in the work queue, got %v", d)
	}
	resp, err := http.Get("http://" + r.sc.AdminAddr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 200)
	n, _ := resp.Body.Read(body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body[:n]), "paused on purpose") {
		t.Errorf("/readyz during outage: %d %q", resp.StatusCode, body[:n])
	}
	app.Restart()
	r.settled(0)
	waitfor.Until(t, 5*time.Second, "breaker closed", func() bool { return r.sc.BreakerState() == "closed" && r.sc.Consuming() })
	for _, id := range []string{"o1", "o2", "o3", "o4", "o5"} {
		if got := app.attempts(id); len(got) != 1 || got[0] != 1 {
			t.Errorf("%s: attempts %v after the outage, want [1]", id, got)
		}
	}
	if st := r.sc.Stats(); st.Retried.Load() != 0 || st.DeadLettered.Load() != 0 {
		t.Errorf("outage spent attempts: retried=%d dlq=%d", st.Retried.Load(), st.DeadLettered.Load())
	}
}

// TestBrokerURLsTriedInTurn: an unreachable first address does not stop
// Hopper; the next one in the list is used.
func TestBrokerURLsTriedInTurn(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	dead := "amqp://guest:guest@127.0.0.1:1/" // nothing listens on port 1
	cfg.Broker.URLs = []string{dead, rabbit.URL()}
	r := start(t, cfg)
	app.script("via-second", 200)
	r.publish("via-second")
	r.settled(0)
	if len(app.callsFor("via-second")) != 1 {
		t.Fatal("not delivered through the second broker address")
	}
}

// TestBlockedBrokerPausesMoves: while a memory alarm blocks publishing, a
// retry move waits instead of failing (longer than the confirm timeout),
// the original stays unacked in the work queue, and the move completes once
// the alarm clears.
func TestBlockedBrokerPausesMoves(t *testing.T) {
	release := make(chan struct{})
	var calls atomic.Int64
	app := newScriptApp(t)
	app.srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Hopper-Message-Id") == "held" && calls.Add(1) == 1 {
			<-release // answer 503 only once the alarm is on
			w.WriteHeader(503)
			return
		}
		w.WriteHeader(200)
	})
	cfg := testConfig(t, app.URL)
	cfg.Broker.ConfirmTimeout = config.Duration(200 * time.Millisecond)
	cfg.App.Timeout = config.Duration(20 * time.Second)
	r := start(t, cfg)
	r.publish("warm") // opens the publishing connections before the alarm
	r.settled(0)
	r.publish("held")
	waitfor.Until(t, 10*time.Second, "the first attempt in progress", func() bool { return calls.Load() == 1 })
	if _, err := rabbit.Ctl("set_vm_memory_high_watermark", "0.000001"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rabbit.Ctl("set_vm_memory_high_watermark", "0.4") }) //nolint:errcheck // best effort
	close(release)
	// The app answers 503: the retry move publishes and the broker blocks
	// the publishing connection, which it then lists as blocked.
	waitfor.Until(t, 15*time.Second, "the publishing connection blocked", func() bool {
		return connectionField(t, "hopper-publisher "+r.cfg.Queue.Name, "state") == "blocked"
	})
	// The property under test is a duration: three confirm timeouts pass
	// while blocked, and none of them fails the move. A slower machine only
	// makes the wait longer.
	time.Sleep(3 * cfg.Broker.ConfirmTimeout.D())
	if n := r.sc.Stats().MoveFailed.Load(); n != 0 {
		t.Fatalf("%d moves failed while the broker was blocked; they must wait", n)
	}
	if n := r.sc.Stats().Retried.Load(); n != 0 {
		t.Fatalf("the retry move completed while the broker was blocked (%d)", n)
	}
	if d := allDepths(t)[r.cfg.Queue.Name]; d != 1 {
		t.Fatalf("work queue %d, want the held message unacked in it", d)
	}
	if _, err := rabbit.Ctl("set_vm_memory_high_watermark", "0.4"); err != nil {
		t.Fatal(err)
	}
	r.settled(0)
	if calls.Load() != 2 || r.sc.Stats().Retried.Load() != 1 {
		t.Fatalf("after the alarm: %d calls, %d retries", calls.Load(), r.sc.Stats().Retried.Load())
	}
}

// connectionField is one field (state, peer_port, …) of the connection
// whose client-given name is name, as the broker lists it; "" when the
// connection is not listed.
func connectionField(t *testing.T, name, field string) string {
	t.Helper()
	out, err := rabbit.Ctl("list_connections", "-q", "--no-table-headers", field, "client_properties")
	if err != nil {
		t.Fatalf("list connections: %v", err)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, name) {
			return strings.Fields(line)[0]
		}
	}
	return ""
}
