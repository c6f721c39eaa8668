package faults

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/internal/waitfor"
)

// flowSize is the number of messages of a flow scenario: the first value in
// a plain `go test` run, the second under `make faults`.
func flowSize(t *testing.T, small, full int) int {
	if os.Getenv("HOPPER_FAULTS_N") != "" {
		return full
	}
	return small
}

// publishAll publishes ids with confirms, as fast as the broker takes them.
func publishAll(t *testing.T, queue string, ids []string) publishStats {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	return publishPaced(ctx, t, queue, ids, 0)
}

// waitAcked waits until the app has answered 2xx for every id in want, and
// returns how long that took from start (hopper's start, for a prefilled
// run).
func (r *run) waitAcked(want map[string]bool, start time.Time, timeout time.Duration) time.Duration {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok := map[string]bool{}
		for _, rec := range r.app.snapshot() {
			if want[rec.ID] && rec.Status >= 200 && rec.Status <= 299 {
				ok[rec.ID] = true
			}
		}
		if len(ok) == len(want) {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%d of %d messages answered 2xx after %s", len(ok), len(want), timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFaultPoisonBurst: P poison messages (the app answers 503 for them
// while its health check passes) at the head of the queue, H healthy ones
// behind. Failing messages are not a failing app: the healthy ones are all
// acked within twice the time the same run takes with the breaker off, and
// every poison message ends in the DLQ as max-attempts after its last
// attempt reached the app.
func TestFaultPoisonBurst(t *testing.T) {
	p, h := flowSize(t, 50, 200), flowSize(t, 500, 2000)
	on, a := poisonRun(t, "poison-burst", p, h, "")
	off, _ := poisonRun(t, "poison-burst-breaker-off", p, h, "breaker:\n  enabled: false\n")
	line := fmt.Sprintf("poison: healthy=%d in %.2fs (breaker-off %.2fs) ratio=%.2f", h, on.Seconds(), off.Seconds(), off.Seconds()/on.Seconds())
	fmt.Println(line)
	t.Log(line)
	if on > 2*off {
		t.Errorf("with the breaker on the healthy messages took %s, more than twice the %s without it", on, off)
	}
	if a.byReason["max-attempts"] != p {
		t.Errorf("DLQ by reason %v, want %d max-attempts", a.byReason, p)
	}
}

func poisonRun(t *testing.T, name string, p, h int, extra string) (time.Duration, *accounting) {
	t.Helper()
	poison, healthy := makeIDs(name+"-poison", p), makeIDs(name+"-ok", h)
	scripts := map[string]*script{}
	for _, id := range poison {
		scripts[id] = &script{final: answer503, want: expectMaxAttempts}
	}
	want := map[string]bool{}
	for _, id := range healthy {
		want[id] = true
	}
	var ps publishStats
	r := beginPrefilled(t, name, startApp(t, scripts), hopperConfig{Extra: extra}, func(q string) {
		ps = publishAll(t, q, append(append([]string(nil), poison...), healthy...))
	})
	took := r.waitAcked(want, r.began, 3*time.Minute)
	r.step("%d healthy messages acked in %s", h, took.Round(time.Millisecond))
	done := make(chan publishStats, 1)
	done <- ps
	a := r.finish(done)
	a.report(t)
	checkScripts(t, a, scripts)
	for _, id := range poison {
		if a.maxTried[id] != maxAttempts {
			t.Errorf("%s: the app saw attempt %d at most, want every attempt up to %d: %s", id, a.maxTried[id], maxAttempts, a.history(id))
			break
		}
	}
	if n := r.hopper.eventCounts("BREAKER_OPEN")["BREAKER_OPEN"]; n > 0 {
		t.Errorf("the breaker opened %d time(s) on failing messages from a healthy app", n)
	}
	return took, a
}

// TestFaultPoisonCrash: one message kills the app each time it is
// delivered (the request cut, the port refusing until the test restarts
// the app). Hopper counts the crashes on that message and, at
// retry.maxCrashes (3), dead-letters it as app-crash; every other message
// is acked and nothing is lost.
func TestFaultPoisonCrash(t *testing.T) {
	n := flowSize(t, 300, 2000)
	ids := makeIDs("poison-crash", n)
	killer := ids[n/3]
	app := startApp(t, nil)
	app.killers = map[string]bool{killer: true}
	r := beginApp(t, "poison-crash", app, hopperConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pubDone := make(chan publishStats, 1)
	go func() { pubDone <- publishPaced(ctx, t, r.q.work, ids, 3*time.Second) }()

	// After each crash the app stays down until hopper has dealt with the
	// killer's delivery (returned it as a suspect when others were in
	// flight with it, or charged it a crash when it was alone, at the last
	// one dead-lettering it), as a restarting pod would, then comes back.
	// The quick restart is the point: hopper must count the crash even when
	// the app is back before the killer's own request gets to ask.
	const maxCrashes = 3
	id := "message_id=" + killer
	charged := func() int {
		return r.hopper.countLines(id, "event=APP_CRASHED") + r.hopper.countLines(id, "event=RABBITMQ_MESSAGE_CRASHED_APP")
	}
	handled := func() int { return charged() + r.hopper.countLines(id, "event=APP_CRASH_SUSPECT") }
	for crash := 1; charged() < maxCrashes; crash++ {
		waitfor.Until(t, 2*time.Minute, fmt.Sprintf("the killer message delivered a %d. time", crash),
			func() bool { return app.crashCount() >= crash })
		waitfor.Until(t, 2*time.Minute, fmt.Sprintf("hopper dealing with crash %d of the killer", crash),
			func() bool { return handled() >= crash })
		app.restart()
		r.step("app crashed by %s (%d, %d charged) and restarted", killer, crash, charged())
	}
	a := r.finish(pubDone)
	a.report(t)
	if got := a.inDLQ[killer]; len(got) != 1 || got[0] != "app-crash" {
		t.Errorf("%s: DLQ reasons %v, want app-crash: %s", killer, got, a.history(killer))
	}
	// A crash shared with other requests is charged to nobody; from then on
	// the killer is delivered alone, so every later crash is charged.
	if c := app.crashCount(); c < maxCrashes || c > maxCrashes+1 {
		t.Errorf("the app was crashed %d times, want %d (or one more, when the first crash was shared)", c, maxCrashes)
	}
	for _, id := range ids {
		if id != killer && (a.okCount[id] == 0 || len(a.inDLQ[id]) > 0) {
			t.Errorf("%s: not acked, or dead-lettered: %s", id, a.history(id))
		}
	}
	if a.dlq != 1 {
		t.Errorf("%d messages in the DLQ, want only the killer", a.dlq)
	}
}

// TestFaultOverload: an app that serves c requests at once (20 ms each) and
// answers 503 at once beyond that. Hopper with its defaults (50 workers)
// adapts its concurrency down to what the app takes: nothing reaches the
// DLQ, few requests are refused once it has adapted, and throughput stays
// at least 0.8 of what c workers achieve against an app with no limit.
func TestFaultOverload(t *testing.T) {
	const c = 8
	serve := 20 * time.Millisecond
	n := flowSize(t, 1000, 4000)

	limited := startApp(t, nil)
	limited.capacity, limited.serveFor = c, serve
	thr, a, share := overloadRun(t, "overload", limited, n, "")
	if a.dlq != 0 {
		t.Errorf("an overloaded app dead-lettered %d message(s) (by reason %v)", a.dlq, a.byReason)
	}

	free := startApp(t, nil)
	free.capacity, free.serveFor = 1<<20, serve
	base, _, _ := overloadRun(t, "overload-baseline", free, n,
		fmt.Sprintf("consumer:\n  prefetch: %d\n  workers: %d\nlimiter:\n  enabled: false\n", c, c))

	line := fmt.Sprintf("overload: c=%d throughput=%.0f msg/s (%d workers, no limit: %.0f msg/s) ratio=%.2f refused-late=%.0f%% max-busy=%d",
		c, thr, c, base, thr/base, 100*share, limited.maxBusy.Load())
	fmt.Println(line)
	t.Log(line)
	if thr < 0.8*base {
		t.Errorf("throughput %.0f msg/s against the overloaded app, below 0.8 of %.0f", thr, base)
	}
	if share > 0.3 {
		t.Errorf("%.0f%% of the requests in the second half were refused by the app: the concurrency did not adapt", 100*share)
	}
}

// overloadRun prefills n messages, runs hopper until all are acked, and
// returns the throughput, the accounting and the share of requests the app
// refused (503) in the second half of the run.
func overloadRun(t *testing.T, name string, app *faultApp, n int, extra string) (float64, *accounting, float64) {
	t.Helper()
	ids := makeIDs(name, n)
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	var ps publishStats
	r := beginPrefilled(t, name, app, hopperConfig{Extra: extra}, func(q string) { ps = publishAll(t, q, ids) })
	start := r.began
	took := r.waitAcked(want, start, 5*time.Minute)
	recs := r.app.snapshot()
	mid := start.Add(took / 2)
	var late, refused int
	for _, rec := range recs {
		if rec.At.After(mid) {
			late++
			if rec.Status == http.StatusServiceUnavailable {
				refused++
			}
		}
	}
	done := make(chan publishStats, 1)
	done <- ps
	a := r.finish(done)
	a.report(t)
	share := 0.0
	if late > 0 {
		share = float64(refused) / float64(late)
	}
	return float64(n) / took.Seconds(), a, share
}

// TestFaultCutWhileHealthy: the app resets the connection for one message
// every time (its handler dies on that input) while its health check keeps
// passing, with one message at a time, on classic and quorum queues. The
// message ends in the DLQ after its attempt budget, every message behind it
// is acked, and the breaker never opens.
func TestFaultCutWhileHealthy(t *testing.T) {
	for _, qt := range []string{"classic", "quorum"} {
		t.Run(qt, func(t *testing.T) {
			n := flowSize(t, 40, 400)
			ids := makeIDs("cut-"+qt, n)
			cutter := ids[0]
			app := startApp(t, nil)
			app.cutters = map[string]bool{cutter: true}
			r := beginApp(t, "cut-"+qt, app, hopperConfig{QueueType: qt,
				Extra: "consumer:\n  prefetch: 1\n  workers: 1\n"})
			pubDone := make(chan publishStats, 1)
			go func() { pubDone <- publishAll(t, r.q.work, ids) }()
			// The cutter goes round its delay tiers long after the others
			// are done: wait for its last attempt to be settled before the
			// queues are read as settled.
			waitfor.Until(t, 2*time.Minute, "the cutter dead-lettered", func() bool {
				return r.hopper.countLines("message_id="+cutter, "event=RABBITMQ_MESSAGE_MAX_RETRIES_EXCEEDED") > 0
			})
			a := r.finish(pubDone)
			a.report(t)
			if got := a.inDLQ[cutter]; len(got) != 1 || got[0] != "max-attempts" {
				t.Errorf("%s: DLQ reasons %v, want max-attempts: %s", cutter, got, a.history(cutter))
			}
			if a.maxTried[cutter] != maxAttempts {
				t.Errorf("%s: last attempt the app saw %d, want %d", cutter, a.maxTried[cutter], maxAttempts)
			}
			for _, id := range ids[1:] {
				if a.okCount[id] == 0 || len(a.inDLQ[id]) > 0 {
					t.Errorf("%s: not acked, or dead-lettered: %s", id, a.history(id))
				}
			}
			if opens := r.hopper.countLines("event=BREAKER_OPEN"); opens != 0 {
				t.Errorf("the breaker opened %d times on a message cutting its connection", opens)
			}
		})
	}
}
