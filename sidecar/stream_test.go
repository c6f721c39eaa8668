package sidecar_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/testbroker"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/streamsrc"
)

// streamConfig is testConfig reading the stream name from the node sb,
// which serves the stream protocol, as consumer "app".
func streamConfig(t *testing.T, sb *testbroker.Broker, appURL, name string) config.Config {
	cfg := testConfig(t, appURL)
	cfg.Broker.URLs = []string{sb.URL()}
	cfg.Queue.Name = name
	cfg.Queue.Type = config.QueueTypeStream
	cfg.Queue.Stream.Consumer = "app"
	cfg.Queue.Stream.Port = sb.StreamPort()
	cfg.Queue.Stream.StoreEvery = config.Duration(100 * time.Millisecond)
	cfg.Queue.Stream.MaxAge = config.Duration(time.Hour)
	return cfg
}

func storedOffset(t *testing.T, cfg config.Config) (int64, bool) {
	t.Helper()
	eff := cfg.ForStream()
	o, err := streamsrc.ConfigOptions(&eff, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	off, ok, err := streamsrc.StoredOffset(o)
	if err != nil {
		t.Fatal(err)
	}
	return off, ok
}

func TestStream(t *testing.T) {
	sb := testbroker.MustStartWith(t, testbroker.Options{Quiet: true, Streams: true})

	// The outcome table applies to a stream as to a queue: 2xx done, 503
	// a retry that goes through the delay tiers and comes back to the
	// subscription's own queue (never into the stream again), 425 a hold
	// and then a requeue to that queue, 400 the DLQ, stamped with the
	// stream and the offset it came from. The stored offset ends at the
	// last message.
	t.Run("outcomes", func(t *testing.T) {
		app := newScriptApp(t)
		cfg := streamConfig(t, sb, app.URL, "st.outcomes")
		const n = 30
		kind := func(i int) string {
			switch i % 5 {
			case 1:
				return "retried"
			case 2:
				return "dead"
			case 3:
				if i%10 == 3 {
					return "early"
				}
			}
			return "ok"
		}
		for i := range n {
			switch kind(i) {
			case "retried":
				app.script(fmt.Sprintf("m%d", i), 503, 200)
			case "dead":
				app.script(fmt.Sprintf("m%d", i), 400)
			case "early":
				app.script(fmt.Sprintf("m%d", i), 425, 200)
			}
		}
		r := start(t, cfg)
		// Hopper declared the stream with the retention configured.
		out, err := sb.Ctl("list_queues", "-q", "--no-table-headers", "name", "type", "arguments")
		if err != nil {
			t.Fatal(err)
		}
		declared := false
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == cfg.Queue.Name {
				declared = f[1] == "stream" && strings.Contains(line, "x-max-age") && strings.Contains(line, "3600s")
				t.Logf("the stream as declared: %s", line)
			}
		}
		if !declared {
			t.Fatalf("no stream %s with x-max-age 3600s on the broker:\n%s", cfg.Queue.Name, out)
		}
		for i := range n {
			r.publish(fmt.Sprintf("m%d", i))
		}
		sub := config.StreamQueue(cfg.Queue.Name, "app")
		dlq := sub + ".dlq"
		var dead map[string]*msg.Message
		waitfor.Until(t, 30*time.Second, "every message answered as scripted", func() bool {
			for i := range n {
				id := fmt.Sprintf("m%d", i)
				st := app.statuses(id)
				if len(st) == 0 || (kind(i) == "retried" || kind(i) == "early") && len(st) < 2 {
					return false
				}
			}
			return true
		})
		waitfor.Until(t, 10*time.Second, "6 dead letters", func() bool { d, err := sb.QueueDepth(dlq); return err == nil && d == n/5 })
		dead = r.drain(dlq)
		last := int64(-1)
		for i := range n {
			id := fmt.Sprintf("m%d", i)
			calls := app.callsFor(id)
			want := map[string][]int{"ok": {200}, "retried": {503, 200}, "early": {425, 200}, "dead": {400}}[kind(i)]
			if got := app.statuses(id); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("%s: statuses %v, want %v", id, got, want)
				continue
			}
			// The first delivery came from the stream: it names its offset,
			// which follows the publishing order.
			off, err := strconv.ParseInt(calls[0].Header.Get("Hopper-Header-X-Stream-Offset"), 10, 64)
			if err != nil || off <= last {
				t.Errorf("%s: first delivery's stream offset %d (%v), want one past %d", id, off, err, last)
			}
			last = off
			if kind(i) == "retried" && calls[1].Attempt != 2 {
				t.Errorf("%s: second call is attempt %d, want 2", id, calls[1].Attempt)
			}
			// A 425 is held, then requeued to the subscription's queue (a
			// stream has no requeue): not an attempt.
			if kind(i) == "early" && (calls[1].Attempt != 1 || calls[1].Requeues != 1) {
				t.Errorf("%s: after a 425, attempt %d requeues %d; want 1 and 1", id, calls[1].Attempt, calls[1].Requeues)
			}
			if kind(i) != "dead" {
				continue
			}
			m := dead[id]
			if m == nil {
				t.Errorf("%s not in the DLQ", id)
				continue
			}
			if m.String(msg.HeaderStream) != cfg.Queue.Name || m.Headers[msg.HeaderStreamOffset] != off ||
				m.String(msg.HeaderDeadLetterReason) != "non-retriable" || m.String(msg.HeaderOriginalQueue) != sub {
				t.Errorf("%s: DLQ headers %v", id, m.Headers)
			}
		}
		waitfor.Until(t, 10*time.Second, "the stored offset at the last message", func() bool {
			off, ok := storedOffset(t, cfg)
			return ok && off == last
		})
		// Nothing was appended to the stream: the retries came back
		// through the subscription's queue, and Hopper read no message
		// past the last one published.
		time.Sleep(300 * time.Millisecond)
		if off, _ := storedOffset(t, cfg); off != last {
			t.Fatalf("stored offset %d after the run, want %d (something was appended to the stream)", off, last)
		}
		if st := r.sc.QueueStats(sub); st.Received.Load() != n+n/5+n/10 || st.Retried.Load() != n/5 ||
			st.Requeued.Load() != n/10 || st.DeadLettered.Load() != n/5 {
			t.Fatalf("received %d retried %d requeued %d dead-lettered %d, want %d, %d, %d, %d", st.Received.Load(), st.Retried.Load(),
				st.Requeued.Load(), st.DeadLettered.Load(), n+n/5+n/10, n/5, n/10, n/5)
		}
		if err := r.shutdown(); err != nil {
			t.Fatal(err)
		}
	})

	// A Hopper stopped with messages in flight (its grace period too short
	// for the app) settles none of them: with a classic queue beside the
	// stream they stay unsettled, and the stored offset stays below the
	// first; with a quorum one they are given back to that queue. Either
	// way the next Hopper delivers each of them, and none is skipped.
	for _, qt := range []string{"classic", "quorum"} {
		t.Run("restart-"+qt, func(t *testing.T) {
			app := newScriptApp(t)
			cfg := streamConfig(t, sb, app.URL, "st.restart."+qt)
			cfg.Queue.Stream.QueueType = qt
			cfg.Shutdown.Grace = config.Duration(50 * time.Millisecond)
			cfg.Consumer.Prefetch = 8
			const n = 60
			// Every fifth message hangs until the first Hopper is gone.
			var held []string
			for i := 5; i < n; i += 5 {
				held = append(held, fmt.Sprintf("m%d", i))
			}
			release := app.hold(held...)
			r := start(t, cfg)
			for i := range n {
				r.publish(fmt.Sprintf("m%d", i))
			}
			waitfor.Until(t, 30*time.Second, "the first held message reached", func() bool { return len(app.callsFor("m5")) > 0 })
			time.Sleep(300 * time.Millisecond)
			if err := r.shutdown(); err != nil {
				t.Fatal(err)
			}
			release()
			off, ok := storedOffset(t, cfg)
			st := r.sc.QueueStats(config.StreamQueue(cfg.Queue.Name, "app"))
			d, _ := sb.QueueDepth(config.StreamQueue(cfg.Queue.Name, "app"))
			t.Logf("stored offset after the first run: %d (%t); received %d acked %d returned %d on shutdown %d; queue depth %d", off, ok,
				st.Received.Load(), st.Acked.Load(), st.Returned.Load(), st.ReturnedOnShutdown.Load(), d)
			m5, _ := strconv.ParseInt(app.callsFor("m5")[0].Header.Get("Hopper-Header-X-Stream-Offset"), 10, 64)
			if qt == "classic" && ok && off >= m5 {
				t.Fatalf("the stored offset %d passed m5, which was never settled", off)
			}
			app.mu.Lock()
			firstRun := len(app.calls)
			app.mu.Unlock()
			r2 := start(t, cfg)
			// A held message was cut off unanswered: it must reach the app
			// again. Every other one must have reached it at least once.
			waitfor.Until(t, 30*time.Second, "every message delivered, the cut ones again", func() bool {
				for i := range n {
					id := fmt.Sprintf("m%d", i)
					calls := len(app.callsFor(id))
					if calls == 0 || i%5 == 0 && i > 0 && !calledSince(app, id, firstRun) {
						return false
					}
				}
				return true
			})
			lastOff, err := strconv.ParseInt(app.callsFor(fmt.Sprintf("m%d", n-1))[0].Header.Get("Hopper-Header-X-Stream-Offset"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			waitfor.Until(t, 10*time.Second, "the stored offset at the last message", func() bool {
				off, ok := storedOffset(t, cfg)
				return ok && off == lastOff
			})
			app.mu.Lock()
			total := len(app.calls)
			app.mu.Unlock()
			t.Logf("first run: %d calls; after the restart: %d more for %d messages", firstRun, total-firstRun, n)
			if err := r2.shutdown(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Two Hoppers read one stream under one consumer name as its single
// active consumer: only one delivers; when it stops, the other is
// promoted and goes on after the offset stored, skipping nothing.
func TestStreamSingleActive(t *testing.T) {
	sb := testbroker.MustStartWith(t, testbroker.Options{Quiet: true, Streams: true})
	app := newScriptApp(t)
	cfg := streamConfig(t, sb, app.URL, "st.sac")
	yes := true
	cfg.Queue.Stream.SingleActiveConsumer = &yes
	cfg.Admin.Listen = "127.0.0.1:0"
	if sb.Series() < 4 {
		// The 3.x release the tests run (3.10) has no single active
		// consumer on streams: Hopper exits saying so, rather than
		// subscribing again for ever.
		refused(t, sb, cfg, streamsrc.ErrNoSingleActive, "3.11")
		return
	}
	r1 := start(t, cfg)
	r2 := start(t, cfg)
	const n = 40
	for i := range n / 2 {
		r1.publish(fmt.Sprintf("m%d", i))
	}
	waitfor.Until(t, 20*time.Second, "the first half delivered", func() bool {
		for i := range n / 2 {
			if len(app.callsFor(fmt.Sprintf("m%d", i))) == 0 {
				return false
			}
		}
		return true
	})
	sub := config.StreamQueue(cfg.Queue.Name, "app")
	active, standby := r1, r2
	if r2.sc.QueueStats(sub).Received.Load() > 0 {
		active, standby = r2, r1
	}
	if got := standby.sc.QueueStats(sub).Received.Load(); got != 0 {
		t.Fatalf("the standby received %d messages", got)
	}
	// /readyz names each pod's role and the consumer name's lag, and the
	// lag gauges reach 0 once the first half is settled and stored: on
	// the active pod from its own store, on the standby from the broker's.
	// (Offsets are not the message numbers: a store of the offset while
	// messages are published takes an offset between them.)
	caughtUp := func(r *running) (float64, bool) {
		stored, _ := r.sc.Metrics().Value("hopper_stream_stored_offset", map[string]string{"queue": sub})
		last, _ := r.sc.Metrics().Value("hopper_stream_last_offset", map[string]string{"queue": sub})
		lag, ok := r.sc.Metrics().Value("hopper_stream_lag_messages", map[string]string{"queue": sub})
		return last, ok && lag == 0 && stored == last && last >= n/2-1
	}
	waitfor.Until(t, 20*time.Second, "the lag gauges at 0, the stored offset at the last message", func() bool {
		_, a := caughtUp(active)
		_, s := caughtUp(standby)
		return a && s
	})
	last, _ := caughtUp(active)
	for r, role := range map[*running]string{active: "active (single active consumer", standby: "standing by"} {
		want := fmt.Sprintf(", lag 0 (stored offset %d, last %d)", int64(last), int64(last))
		if _, body := readyz(t, r.sc); !strings.Contains(body, "stream st.sac as app: "+role) || !strings.Contains(body, want) {
			t.Errorf("/readyz does not say %q and %q:\n%s", role, want, body)
		}
	}
	if err := active.shutdown(); err != nil {
		t.Fatal(err)
	}
	for i := n / 2; i < n; i++ {
		standby.publish(fmt.Sprintf("m%d", i))
	}
	waitfor.Until(t, 30*time.Second, "every message delivered", func() bool {
		for i := range n {
			if len(app.callsFor(fmt.Sprintf("m%d", i))) == 0 {
				return false
			}
		}
		return true
	})
	if got := standby.sc.QueueStats(sub).Received.Load(); got < n/2 {
		t.Fatalf("the promoted Hopper received %d messages, want at least %d", got, n/2)
	}
}

// calledSince says whether the app was called for id after its first k
// calls.
func calledSince(a *scriptApp, id string, k int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.calls[k:] {
		if c.ID == id {
			return true
		}
	}
	return false
}
