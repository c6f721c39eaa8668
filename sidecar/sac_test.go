package sidecar_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
)

// TestSingleActiveConsumerRoles runs two sidecars on one queue declared
// with a single active consumer: only the first registered receives
// messages; /readyz and hopper_consumer_active say which pod is active
// and which stands by (idle while nothing was delivered from an empty
// queue); when the active one stops, the standby takes over.
func TestSingleActiveConsumerRoles(t *testing.T) {
	app := newScriptApp(t)
	yes := true
	cfgFor := func(base config.Config, pod string) config.Config {
		c := base
		c.App.URL = app.URL + "/" + pod
		return c
	}
	base := testConfig(t, app.URL)
	base.Queue.SingleActiveConsumer = &yes
	base.Consumer.Ordered = true
	base.Consumer.Prefetch = 0
	base.Admin.Listen = "127.0.0.1:0"
	a := start(t, cfgFor(base, "a"))
	b := start(t, cfgFor(base, "b"))
	q := base.Queue.Name
	for pod, r := range map[string]*running{"a": a, "b": b} {
		if role := r.sc.QueueRole(q); role != broker.RoleIdle {
			t.Errorf("pod %s on an empty queue: role %q, want idle", pod, role)
		}
		if _, text := readyz(t, r.sc); !strings.Contains(text, "single active consumer: idle") {
			t.Errorf("pod %s /readyz:\n%s", pod, text)
		}
	}

	// a registered first: it is sent m0, which the app holds, while the
	// rest wait in the queue.
	release := app.hold("m0")
	for i := range 5 {
		a.publish(fmt.Sprintf("m%d", i))
	}
	waitfor.Until(t, 30*time.Second, "a active and b standing by", func() bool {
		return a.sc.QueueRole(q) == broker.RoleActive && b.sc.QueueRole(q) == broker.RoleStandby
	})
	for pod, want := range map[string]struct {
		text   string
		metric float64
	}{"a": {"single active consumer: active", 1}, "b": {"single active consumer: standby", 0}} {
		r := map[string]*running{"a": a, "b": b}[pod]
		code, text := readyz(t, r.sc)
		if code != 200 || !strings.Contains(text, "queue "+q+": "+"consuming, "+want.text) {
			t.Errorf("pod %s /readyz %d:\n%s", pod, code, text)
		}
		if got := metricValue(scrape(t, r.sc.AdminAddr()), "hopper_consumer_active", map[string]string{"queue": q}); got != want.metric {
			t.Errorf("pod %s hopper_consumer_active = %v, want %v", pod, got, want.metric)
		}
	}
	release()
	a.settled(0)
	if got := app.order(func(c call) bool { return true }); strings.Join(got, ",") != "m0,m1,m2,m3,m4" {
		t.Errorf("app saw %v", got)
	}
	for i := range 5 {
		for _, c := range app.callsFor(fmt.Sprintf("m%d", i)) {
			if c.Path != "/msg/a" {
				t.Errorf("m%d delivered by the standby (%s)", i, c.Path)
			}
		}
	}

	// a goes: b is the only consumer left and takes over.
	if err := a.shutdown(); err != nil {
		t.Fatal(err)
	}
	b.publish("m5")
	waitfor.Until(t, 30*time.Second, "b delivers m5", func() bool { return len(app.callsFor("m5")) == 1 })
	if c := app.callsFor("m5")[0]; c.Path != "/msg/b" {
		t.Errorf("m5 delivered by %s, want b", c.Path)
	}
	waitfor.Until(t, 30*time.Second, "b active", func() bool { return b.sc.QueueRole(q) == broker.RoleActive })
	if got := metricValue(scrape(t, b.sc.AdminAddr()), "hopper_consumer_active", map[string]string{"queue": q}); got != 1 {
		t.Errorf("b hopper_consumer_active = %v after taking over, want 1", got)
	}
	b.settled(0)
}

// TestSingleActiveOrderedPauseKeepsRole: the active pod of an ordered
// single-active-consumer queue whose app goes down pauses without
// cancelling its consumer: the standby stays a standby, delivers nothing,
// and once the app is back the active pod delivers everything in order.
// A cancel would make the standby active while the paused pod still holds
// m1, and the standby would deliver m2… first.
func TestSingleActiveOrderedPauseKeepsRole(t *testing.T) {
	appA, appB := newScriptApp(t), newScriptApp(t)
	yes := true
	base := testConfig(t, appA.URL)
	base.Queue.SingleActiveConsumer = &yes
	base.Consumer.OrderingKey = "header:k"
	base.Consumer.Prefetch = 4
	a := start(t, base)
	cfgB := base
	cfgB.App.URL = appB.URL
	b := start(t, cfgB)
	q := base.Queue.Name

	a.publish("m0", withHeader("k", "x"))
	waitfor.Until(t, 30*time.Second, "a active", func() bool { return a.sc.QueueRole(q) == broker.RoleActive })

	appA.Close()
	for i := 1; i <= 8; i++ {
		a.publish(fmt.Sprintf("m%d", i), withHeader("k", "x"))
	}
	waitfor.Until(t, 60*time.Second, "a paused by its breaker and b's role known", func() bool {
		role := b.sc.QueueRole(q)
		return a.sc.Paused() && (role == broker.RoleStandby || role == broker.RoleActive)
	})
	if role := b.sc.QueueRole(q); role != broker.RoleStandby {
		t.Fatalf("with a paused, b is %q: the paused pod gave up the active role", role)
	}
	if n := len(appB.order(func(call) bool { return true })); n != 0 {
		t.Fatalf("b delivered %d messages while a was paused", n)
	}
	appA.Restart()
	a.settled(0)
	want := []string{"m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8"}
	if got := appA.order(func(c call) bool { return c.Status == 200 }); !slices.Equal(got, want) {
		t.Errorf("a's app answered 200 to %v, want %v", got, want)
	}
	if n := len(appB.order(func(call) bool { return true })); n != 0 {
		t.Errorf("b delivered %d messages", n)
	}
}
