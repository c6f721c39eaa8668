package sidecar_test

import (
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
)

// How close to its due time a parked message must reach the app in these
// tests: no earlier than half the default 1s step (plus the clock reads'
// slack), no later than that plus a hop through the broker on a shared
// machine.
const (
	dueEarly = 550 * time.Millisecond
	dueLate  = time.Second
)

// scheduledConfig turns scheduling on with a ladder short enough for a
// test: steps of 1s up to 32s.
func scheduledConfig(cfg config.Config) config.Config {
	cfg.Schedule.Enabled = true
	cfg.Schedule.MaxDelay = config.Duration(time.Minute)
	return cfg
}

// onTime reports how far at is from due, failing the test when it is
// outside the schedule's precision.
func onTime(t *testing.T, what string, at, due time.Time) time.Duration {
	t.Helper()
	off := at.Sub(due)
	t.Logf("%-28s %+7.3fs from its due time", what, off.Seconds())
	if off < -dueEarly || off > dueLate {
		t.Errorf("%s reached the app %s from its due time, want within -%s … +%s", what, off, dueEarly, dueLate)
	}
	return off
}

func (a *batchApp) requestList() []batchRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.requests)
}

// TestScheduledJoinsABatch: with batching on, a message that is not due
// is parked as it is received, outside any batch, so the message published
// just before it goes in a batch that does not wait for it. Once due it
// joins a batch like any other message: with one that was never parked,
// or with the messages due at the same time, whose batch they fill at once
// and which reaches the app on time within the schedule's precision. A
// batch that is not full waits batch.maxWait for more, which then adds to
// the lateness of the parked message in it.
func TestScheduledJoinsABatch(t *testing.T) {
	for _, qt := range []string{"classic", "quorum"} {
		t.Run(qt, func(t *testing.T) {
			app := newBatchApp(t, "hopper")
			const maxWait = 3 * time.Second
			cfg := scheduledConfig(batchConfig(t, app.URL, 4, maxWait))
			cfg.Queue.Type = qt
			r := start(t, cfg)

			t0 := time.Now()
			r.publish("plain")
			soon := t0.Add(1200 * time.Millisecond)
			r.publish("soon", withHeader(msg.HeaderNotBefore, soon.UnixMilli()))
			later := t0.Add(5200 * time.Millisecond)
			group := []string{"g1", "g2", "g3", "g4"}
			for _, id := range group {
				r.publish(id, withHeader(msg.HeaderNotBefore, later.UTC().Format(time.RFC3339Nano)))
			}
			all := append([]string{"plain", "soon"}, group...)
			waitfor.Until(t, 30*time.Second, "every message delivered", func() bool {
				return len(app.calls()) == len(all)
			})
			r.settled(0)

			find := func(id string) batchRequest {
				for _, req := range app.requestList() {
					if slices.Contains(req.ids, id) {
						return req
					}
				}
				t.Fatalf("%s is in no request", id)
				return batchRequest{}
			}
			// plain waited maxWait for its batch to fill; soon came back
			// from parking meanwhile and joined it.
			first := find("plain")
			if !slices.Equal(first.ids, []string{"plain", "soon"}) {
				t.Errorf("plain's batch holds %v, want plain and soon (parked, then due while the batch filled)", first.ids)
			}
			if since := first.at.Sub(t0); since < maxWait-100*time.Millisecond {
				t.Errorf("plain's batch went out %s after the publish, before batch.maxWait (%s): the parked messages filled it", since, maxWait)
			}
			if first.at.Before(soon.Add(-dueEarly)) {
				t.Errorf("soon reached the app %s before its due time", soon.Sub(first.at))
			}
			t.Logf("soon, in the batch it joined, %+.3fs from its due time (that batch waited batch.maxWait %s)",
				first.at.Sub(soon).Seconds(), maxWait)

			// The four due together fill a batch and go at once.
			g := find("g1")
			got := slices.Clone(g.ids)
			sort.Strings(got)
			if !slices.Equal(got, group) {
				t.Errorf("g1's batch holds %v, want the four messages due together", g.ids)
			}
			onTime(t, "the batch of four due together", g.at, later)

			for id, c := range app.calls() {
				if !slices.Equal(c, []string{"1:200"}) {
					t.Errorf("%s: calls %v, want one", id, c)
				}
			}
			if n := parked(r); n < 5 {
				t.Errorf("%d parking moves, want at least one for each of the 5 scheduled messages", n)
			}
		})
	}
}

// TestScheduledLeavesItsKeysLine: with an ordering key (or
// consumer.ordered), a message that is not due does not hold its key:
// it is parked as it is received, the later messages of its key go to the
// app at once, and when it is due it joins its key's line at the tail,
// behind the message of its key then at the app.
func TestScheduledLeavesItsKeysLine(t *testing.T) {
	for _, mode := range []string{"key", "ordered"} {
		t.Run(mode, func(t *testing.T) {
			app := newScriptApp(t)
			cfg := scheduledConfig(testConfig(t, app.URL))
			if mode == "key" {
				cfg.Consumer.OrderingKey = "header:k"
				cfg.Admin.Listen = "127.0.0.1:0"
			} else {
				cfg.Consumer.Ordered = true
			}
			r := start(t, cfg)

			release := app.hold("a03")
			defer release()
			t0 := time.Now()
			due := t0.Add(3 * time.Second)
			r.publish("a01", withHeader("k", "a"), withHeader(msg.HeaderNotBefore, due.UnixMilli()))
			r.publish("a02", withHeader("k", "a"))
			r.publish("a03", withHeader("k", "a"))

			waitfor.Until(t, 10*time.Second, "a02 and a03 at the app", func() bool {
				return len(app.callsFor("a02")) == 1 && len(app.callsFor("a03")) == 1
			})
			if at := app.callsFor("a03")[0].At; !at.Before(due.Add(-dueEarly)) {
				t.Fatalf("a03 reached the app %s after a01's due time: a01 held its key while parked", at.Sub(due))
			}
			// a01 is due now, but a03 of its key is at the app.
			time.Sleep(time.Until(due.Add(1500 * time.Millisecond)))
			if n := len(app.callsFor("a01")); n != 0 {
				t.Fatalf("a01 reached the app while a03 of its key was there")
			}
			if mode == "key" {
				want := "1 keys in delivery, 1 messages waiting behind them"
				if _, body := readyz(t, r.sc); !strings.Contains(body, want) {
					t.Errorf("/readyz does not say %q (a01 due, in line behind a03):\n%s", want, body)
				}
			}
			released := time.Now()
			release()
			waitfor.Until(t, 10*time.Second, "a01 delivered", func() bool { return len(app.callsFor("a01")) == 1 })
			if wait := app.callsFor("a01")[0].At.Sub(released); wait > time.Second {
				t.Errorf("a01 reached the app %s after a03 was answered, want at once (it waited in line)", wait)
			}
			r.settled(0)
			if got, want := app.order(func(call) bool { return true }), []string{"a02", "a03", "a01"}; !slices.Equal(got, want) {
				t.Errorf("the app saw %v, want %v", got, want)
			}
			if n := parked(r); n < 1 {
				t.Errorf("a01 was never parked")
			}
		})
	}
}

// TestScheduledRouteChosenWhenDue: routes and the filter judge a parked
// message when it is due, not when it is parked. A message is parked under
// a config whose route sends its kind to /v1/orders; Hopper is restarted
// with the route changed to /v2/orders before it is due, and it reaches
// /v2/orders. A message the filter leaves out (onFiltered: dlq) is parked
// too, and dead-lettered as filtered only once due.
func TestScheduledRouteChosenWhenDue(t *testing.T) {
	for _, qt := range []string{"classic", "quorum"} {
		t.Run(qt, func(t *testing.T) {
			app := newScriptApp(t)
			cfg := scheduledConfig(testConfig(t, app.URL))
			cfg.Queue.Type = qt
			cfg.Filter = `properties.type != "heartbeat"`
			cfg.OnFiltered = "dlq"
			cfg.Routes = []config.Route{{Name: "orders", Match: `headers["x-kind"] == "order"`, Path: "/v1/orders"}}
			r := start(t, cfg)
			dlq := r.sc.Plan().DLQ.Name

			due := time.Now().Add(8 * time.Second)
			r.publish("order", withHeader("x-kind", "order"), withHeader(msg.HeaderNotBefore, due.UnixMilli()))
			r.publish("beat", withType("heartbeat"), withHeader(msg.HeaderNotBefore, due.UnixMilli()))
			r.publish("order-now", withHeader("x-kind", "order"))
			waitfor.Until(t, 10*time.Second, "order-now delivered and the two others parked", func() bool {
				return len(app.callsFor("order-now")) == 1 && parked(r) >= 2
			})
			if p := pathsOf(app, "order-now"); !slices.Equal(p, []string{"/v1/orders"}) {
				t.Fatalf("order-now reached %v, want /v1/orders", p)
			}
			if err := r.shutdown(); err != nil {
				t.Fatal(err)
			}
			if n, err := r.insp.Depth(dlq); err != nil || n != 0 {
				t.Fatalf("%d messages in the DLQ before their due time (%v): the filter judged the parked message", n, err)
			}

			cfg.Routes[0].Path = "/v2/orders"
			r2 := start(t, cfg)
			waitfor.Until(t, 30*time.Second, "order delivered", func() bool { return len(app.callsFor("order")) == 1 })
			c := app.callsFor("order")[0]
			if c.Path != "/v2/orders" {
				t.Errorf("order reached %s, want /v2/orders: the route of the Hopper running when it was due", c.Path)
			}
			onTime(t, "order", c.At, due)
			waitfor.Until(t, 10*time.Second, "beat dead-lettered", func() bool { n, err := r2.insp.Depth(dlq); return err == nil && n == 1 })
			if early := due.Sub(time.Now()); early > dueEarly {
				t.Errorf("beat dead-lettered %s before its due time", early)
			}
			dead := r2.drain(dlq)
			if m, ok := dead["beat"]; !ok || m.String(msg.HeaderDeadLetterReason) != "filtered" {
				t.Errorf("beat is not in the DLQ with reason filtered: %v", keys(dead))
			}
			if n := len(app.callsFor("beat")); n != 0 {
				t.Errorf("beat reached the app %d times", n)
			}
			r2.settled(0)
		})
	}
}

// TestScheduledRetryCountsFromDelivery: a scheduled message that fails
// when due is retried through the delay tiers, each retry's delay counted
// from the failed attempt: the schedule is served once and neither adds
// to the retries nor starts again (with an absolute Hopper-Not-Before or
// a relative x-delay alike). Retries are not parked.
func TestScheduledRetryCountsFromDelivery(t *testing.T) {
	for _, qt := range []string{"classic", "quorum"} {
		t.Run(qt, func(t *testing.T) {
			app := newScriptApp(t)
			cfg := scheduledConfig(testConfig(t, app.URL))
			cfg.Queue.Type = qt
			r := start(t, cfg)
			tiers := []time.Duration{cfg.Retry.Tiers[0].D(), cfg.Retry.Tiers[1].D()}

			app.script("at", 503, 200)
			app.script("delay", 503, 503, 200)
			t0 := time.Now()
			due := t0.Add(3 * time.Second)
			r.publish("at", withHeader(msg.HeaderNotBefore, due.UTC().Format(time.RFC3339Nano)))
			r.publish("delay", withHeader(msg.HeaderDelay, int32(3000)))
			waitfor.Until(t, 10*time.Second, "both at the app once", func() bool {
				return len(app.callsFor("at")) >= 1 && len(app.callsFor("delay")) >= 1
			})
			hops := parked(r)
			r.settled(0)

			for id, want := range map[string][]int{"at": {1, 2}, "delay": {1, 2, 3}} {
				calls := app.callsFor(id)
				if got := app.attempts(id); !slices.Equal(got, want) {
					t.Fatalf("%s: attempts %v, want %v", id, got, want)
				}
				onTime(t, id+", attempt 1", calls[0].At, due)
				for i := 1; i < len(calls); i++ {
					gap := calls[i].At.Sub(calls[i-1].At)
					tier := tiers[i-1]
					t.Logf("%s: attempt %d %.3fs after attempt %d (tier %s)", id, i+1, gap.Seconds(), i, tier)
					if gap < tier-50*time.Millisecond || gap > tier+time.Second {
						t.Errorf("%s: attempt %d came %s after attempt %d, want its tier's %s (not the schedule again)", id, i+1, gap, i, tier)
					}
				}
			}
			if n := parked(r); n != hops {
				t.Errorf("%d parking moves after the first attempts, %d at the end: a retry was parked", hops, n)
			}
		})
	}
}
