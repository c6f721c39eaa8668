package sidecar_test

import (
	"net"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
)

// clockApp answers 200 and records when each message id first reached it,
// and how many requests each took.
type clockApp struct {
	URL   string
	mu    sync.Mutex
	first map[string]time.Time
	calls map[string]int
}

func newClockApp(t *testing.T) *clockApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &clockApp{URL: "http://" + ln.Addr().String() + "/msg", first: map[string]time.Time{}, calls: map[string]int{}}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		id := r.Header.Get("Hopper-Message-Id")
		a.mu.Lock()
		if _, ok := a.first[id]; !ok {
			a.first[id] = now
		}
		a.calls[id]++
		a.mu.Unlock()
	})}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	t.Cleanup(func() { srv.Close() })
	return a
}

func (a *clockApp) at(id string) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.first[id]
	return t, ok
}

func (a *clockApp) count(id string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls[id]
}

// scheduled is a message published with a due time, and how it said so.
type scheduled struct {
	id  string
	due time.Time
	opt pubOpt
}

// publishScheduled publishes messages due after each of delays, by turns
// with x-delay, with Hopper-Not-Before as RFC 3339 and as Unix
// milliseconds. The due time of an x-delay is counted from just before
// the publish: Hopper counts it from its receipt, a little later, so the
// measure can only make it look later, never earlier.
func publishScheduled(r *running, prefix string, delays []time.Duration) []scheduled {
	var out []scheduled
	for i, d := range delays {
		id := prefix + time.Duration(d).String()
		now := time.Now()
		due := now.Add(d)
		var opt pubOpt
		switch i % 3 {
		case 0:
			id += "-x-delay"
			opt = withHeader(msg.HeaderDelay, int32(d/time.Millisecond))
		case 1:
			id += "-rfc3339"
			opt = withHeader(msg.HeaderNotBefore, due.UTC().Format(time.RFC3339Nano))
		case 2:
			id += "-epoch-ms"
			opt = withHeader(msg.HeaderNotBefore, due.UnixMilli())
		}
		r.publish(id, opt)
		out = append(out, scheduled{id: id, due: due, opt: opt})
	}
	return out
}

// awaitOnTime waits until every message reached the app and checks each
// did so no earlier than early before its due time and no later than
// late after it; it logs each lateness and returns them sorted.
func awaitOnTime(t *testing.T, app *clockApp, msgs []scheduled, early, late time.Duration, within time.Duration) []time.Duration {
	t.Helper()
	var missing []string
	defer func() {
		if t.Failed() && len(missing) > 0 {
			t.Logf("not delivered when the wait ended: %v (due %s … %s)", missing,
				msgs[0].due.Format("15:04:05.000"), msgs[len(msgs)-1].due.Format("15:04:05.000"))
		}
	}()
	waitfor.Until(t, within, "every scheduled message delivered", func() bool {
		missing = missing[:0]
		for _, m := range msgs {
			if _, ok := app.at(m.id); !ok {
				missing = append(missing, m.id)
			}
		}
		return len(missing) == 0
	})
	var offs []time.Duration
	for _, m := range msgs {
		at, _ := app.at(m.id)
		off := at.Sub(m.due)
		offs = append(offs, off)
		t.Logf("%-22s delivered %+7.3fs from its due time", m.id, off.Seconds())
		if off < -early || off > late {
			t.Errorf("%s delivered %s from its due time, want within -%s … +%s", m.id, off, early, late)
		}
	}
	sort.Slice(offs, func(i, j int) bool { return offs[i] < offs[j] })
	return offs
}

// TestScheduledDelivery publishes messages with x-delay and with an
// absolute Hopper-Not-Before (RFC 3339 and Unix milliseconds) and observes
// when each reaches the app: within step/2 of its due time (500ms with
// the default 1s step), late by no more than that plus the broker's hops.
// Then it parks a second set, restarts the broker while they wait in the
// parking queues, and sees each delivered once, on time again. A message
// with no schedule goes at once, and one due past schedule.maxDelay goes
// to the DLQ without reaching the app.
func TestScheduledDelivery(t *testing.T) {
	app := newClockApp(t)
	cfg := testConfig(t, app.URL)
	cfg.Schedule.Enabled = true
	cfg.Schedule.MaxDelay = config.Duration(time.Minute)
	r := start(t, cfg)

	// Before anything parks: a message without a schedule goes at once.
	r.publish("plain")
	waitfor.Until(t, 10*time.Second, "the plain message delivered", func() bool { _, ok := app.at("plain"); return ok })

	r.publish("too-far", withHeader(msg.HeaderDelay, int64(2*time.Minute/time.Millisecond)))

	delays := []time.Duration{1 * time.Second, 1500 * time.Millisecond, 2200 * time.Millisecond, 3 * time.Second,
		4700 * time.Millisecond, 6 * time.Second, 7300 * time.Millisecond, 9 * time.Second, 11500 * time.Millisecond}
	first := publishScheduled(r, "a-", delays)
	offs := awaitOnTime(t, app, first, 500*time.Millisecond+50*time.Millisecond, time.Second, 30*time.Second)
	t.Logf("without a restart: %d messages, earliest %+.3fs, median %+.3fs, latest %+.3fs",
		len(offs), offs[0].Seconds(), offs[len(offs)/2].Seconds(), offs[len(offs)-1].Seconds())

	dlq := r.drain(r.sc.Plan().DLQ.Name)
	if m, ok := dlq["too-far"]; !ok || m.String(msg.HeaderDeadLetterReason) != "schedule-too-far" {
		t.Fatalf("the message due in 2m (maxDelay 1m) is not in the DLQ with reason schedule-too-far: %v", dlq)
	}
	if app.count("too-far") != 0 {
		t.Fatal("the message due too far reached the app")
	}

	// Parked across a broker restart: due after the broker is back.
	second := publishScheduled(r, "b-", []time.Duration{16 * time.Second, 18500 * time.Millisecond, 21 * time.Second,
		24 * time.Second, 27500 * time.Millisecond, 30 * time.Second})
	waitfor.Until(t, 10*time.Second, "the second set parked", func() bool {
		return r.sc.Metrics() != nil && parked(r) >= int64(len(second))
	})
	restarted := time.Now()
	if err := rabbit.Restart(); err != nil {
		t.Fatal(err)
	}
	t.Logf("broker restarted in %s", time.Since(restarted).Round(time.Millisecond))
	waitfor.Until(t, 30*time.Second, "sidecar consuming again", r.sc.Consuming)
	offs = awaitOnTime(t, app, second, 500*time.Millisecond+50*time.Millisecond, time.Second, 60*time.Second)
	t.Logf("across a broker restart: %d messages, earliest %+.3fs, median %+.3fs, latest %+.3fs",
		len(offs), offs[0].Seconds(), offs[len(offs)/2].Seconds(), offs[len(offs)-1].Seconds())
	for _, m := range append(first, second...) {
		if n := app.count(m.id); n != 1 {
			t.Errorf("%s reached the app %d times, want once", m.id, n)
		}
	}
	if v, ok := r.sc.Metrics().Value("hopper_schedule_lateness_seconds", map[string]string{"queue": cfg.Queue.Name}); !ok || int(v) != len(first)+len(second) {
		t.Errorf("hopper_schedule_lateness_seconds counted %v deliveries, want %d", v, len(first)+len(second))
	}
	r.settled(0)
}

// parked is how many messages the sidecar has parked so far (hops
// included).
func parked(r *running) int64 {
	var n float64
	for _, s := range []string{"1s", "2s", "4s", "8s", "16s", "32s"} {
		v, _ := r.sc.Metrics().Value("hopper_parked_total", map[string]string{"queue": r.cfg.Queue.Name, "step": s})
		n += v
	}
	return int64(n)
}
