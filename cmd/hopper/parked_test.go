package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/topology"
)

// TestParkedList: `hopper parked` lists the messages waiting in a work
// queue's parking queues, soonest due first, with their due time, the time
// left and the parking queue, on a classic and on a quorum work queue.
// Listing takes nothing out of the schedule: every message is still
// parked afterwards, with its headers and body, none returned (no
// x-delivery-count spent) and each queue in its order; a message whose
// time left has shrunk below its queue's delay is moved to the step its
// time left allows (as Hopper's next hop would), one that is due goes to
// the work queue, and one that says no due time stays where it was.
func TestParkedList(t *testing.T) {
	for _, qt := range []string{"classic", "quorum"} {
		t.Run(qt, func(t *testing.T) {
			q := queueName(t)
			args := []string{"--broker-url", rabbit.URL(), "--queue", q, "--log-level", "error",
				"--set", "queue.type=" + qt, "--set", "schedule.enabled=true", "--set", "schedule.maxDelay=1h"}
			if r := hopper(t, append([]string{"topology", "apply"}, args...)...); r.code != 0 {
				t.Fatalf("apply: exit %d\n%s", r.code, r.stderr)
			}
			cfg := config.Default()
			cfg.Queue.Name = q
			cfg.Schedule.Enabled = true
			cfg.Schedule.MaxDelay = config.Duration(time.Hour)
			plan := topology.FromConfig(&cfg)
			park := func(step time.Duration) string {
				name, ok := plan.ParkQueue(step)
				if !ok {
					t.Fatalf("no parking queue of %s", step)
				}
				return name
			}

			pub := broker.NewPublisher(broker.PublisherOptions{Options: broker.Options{URLs: []string{rabbit.URL()}}, Channels: 1, ConfirmTimeout: 5 * time.Second})
			t.Cleanup(func() { pub.Close() })
			now := time.Now()
			type parkedMsg struct {
				id    string
				in    string
				due   time.Time // zero: says none
				after string    // the queue it must be in after listing
			}
			msgs := []parkedMsg{
				{"far-1", park(1024 * time.Second), now.Add(20 * time.Minute), park(1024 * time.Second)},
				{"far-2", park(1024 * time.Second), now.Add(25 * time.Minute), park(1024 * time.Second)},
				{"far-3", park(1024 * time.Second), now.Add(30 * time.Minute), park(1024 * time.Second)},
				{"mid", park(512 * time.Second), now.Add(10 * time.Minute), park(512 * time.Second)},
				// Has waited in its queue: 100s left, the 64s step.
				{"moved", park(512 * time.Second), now.Add(100 * time.Second), park(64 * time.Second)},
				{"past", park(64 * time.Second), now.Add(-2 * time.Second), q},
				{"nodue", park(2048 * time.Second), time.Time{}, park(2048 * time.Second)},
			}
			for _, m := range msgs {
				h := map[string]any{msg.HeaderParked: true, "tenant": "acme"}
				if !m.due.IsZero() {
					h[msg.HeaderDue] = m.due.UnixMilli()
				}
				err := pub.PublishTo(context.Background(), "", m.in, &msg.Message{MessageID: m.id, Headers: h, Body: []byte("body-" + m.id), ContentType: "text/plain"})
				if err != nil {
					t.Fatal(err)
				}
			}
			insp := inspector(t)
			readyIn(t, insp, park(1024*time.Second), 3)

			r := hopper(t, append([]string{"parked"}, args...)...)
			if r.code != 0 {
				t.Fatalf("parked: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
			}
			t.Logf("hopper parked:\n%s", r.stdout)
			var order []string
			for _, line := range strings.Split(r.stdout, "\n")[1:] {
				f := strings.Fields(line)
				if len(f) == 4 {
					order = append(order, f[0])
					for _, m := range msgs {
						if m.id == f[0] && f[3] != m.in {
							t.Errorf("%s listed in %s, want %s", m.id, f[3], m.in)
						}
					}
				}
			}
			if want := []string{"past", "moved", "mid", "far-1", "far-2", "far-3", "nodue"}; !slices.Equal(order, want) {
				t.Errorf("listed %v, want %v (soonest due first, no due time last)", order, want)
			}
			for _, want := range []string{"past  ", "due  ", "(none)", "--- 7 message(s) parked for " + q + " ---"} {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("the listing does not show %q", want)
				}
			}

			// Listed again as JSON: the moved message is now in the 64s
			// step, and the due one is in the work queue, no longer parked.
			r = hopper(t, append([]string{"parked", "-o", "json"}, args...)...)
			if r.code != 0 {
				t.Fatalf("parked -o json: exit %d\n%s", r.code, r.stderr)
			}
			var got struct {
				Queue    string
				Messages []struct {
					ID        string
					Due       time.Time
					LeftMs    int64
					ParkQueue string
				}
			}
			if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
				t.Fatalf("%v:\n%s", err, r.stdout)
			}
			if got.Queue != q || len(got.Messages) != 6 {
				t.Fatalf("json listing of %q with %d messages, want %q with 6:\n%s", got.Queue, len(got.Messages), q, r.stdout)
			}
			for _, g := range got.Messages {
				for _, m := range msgs {
					if m.id != g.ID {
						continue
					}
					if g.ParkQueue != m.after {
						t.Errorf("%s listed in %s, want %s", g.ID, g.ParkQueue, m.after)
					}
					// Read between the publish and now.
					most, least := m.due.Sub(now).Milliseconds(), time.Until(m.due).Milliseconds()
					if !m.due.IsZero() && (!g.Due.Equal(time.UnixMilli(m.due.UnixMilli())) || g.LeftMs > most || g.LeftMs < least) {
						t.Errorf("%s: due %s, %dms left; want %s, %d…%dms left", g.ID, g.Due, g.LeftMs, m.due, least, most)
					}
				}
			}

			// Every message where it belongs, as it was, in order, none
			// returned.
			byQueue := map[string][]string{}
			for _, m := range msgs {
				byQueue[m.after] = append(byQueue[m.after], m.id)
			}
			for queue, want := range byQueue {
				var ids []string
				for {
					d, ok, err := insp.Get(queue)
					if err != nil {
						t.Fatal(err)
					}
					if !ok {
						break
					}
					m := d.Message()
					ids = append(ids, m.MessageID)
					if n, _ := m.Int(msg.HeaderDeliveryCount); n != 0 {
						t.Errorf("%s: x-delivery-count %d: it was returned", m.MessageID, n)
					}
					if string(m.Body) != "body-"+m.MessageID || m.String("tenant") != "acme" || m.Headers[msg.HeaderParked] != true {
						t.Errorf("%s: body %q, headers %v: not as it was parked", m.MessageID, m.Body, m.Headers)
					}
					for _, p := range msgs {
						if due, _ := m.Int(msg.HeaderDue); p.id == m.MessageID && !p.due.IsZero() && due != p.due.UnixMilli() {
							t.Errorf("%s: x-hopper-due %d, want %d", p.id, due, p.due.UnixMilli())
						}
					}
					if err := d.Ack(); err != nil {
						t.Fatal(err)
					}
				}
				if !slices.Equal(ids, want) {
					t.Errorf("%s holds %v, want %v", queue, ids, want)
				}
			}
		})
	}
}

// TestParkedListWhileRunning: listed while a Hopper parks and delivers
// them, scheduled messages still reach the app once each, on time within
// the schedule's precision (half the 1s step early, a second late at
// most): a listing moves each message one more hop from the due time it
// carries, and adds nothing to its wait. Listed before any message has
// come back from its first step, every one is listed once.
func TestParkedListWhileRunning(t *testing.T) {
	for _, qt := range []string{"classic", "quorum"} {
		t.Run(qt, func(t *testing.T) {
			var mu sync.Mutex
			first := map[string]time.Time{}
			calls := map[string]int{}
			app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				now := time.Now()
				id := r.Header.Get("Hopper-Message-Id")
				mu.Lock()
				defer mu.Unlock()
				if _, ok := first[id]; !ok {
					first[id] = now
				}
				calls[id]++
			}))
			defer app.Close()

			q := queueName(t)
			sched := []string{"--set", "queue.type=" + qt, "--set", "schedule.enabled=true", "--set", "schedule.maxDelay=1m"}
			insp := inspector(t)
			p := startRun(t, runArgs(q, app.URL, sched...)...)
			queueExists(t, insp, q, p)

			pub := broker.NewPublisher(broker.PublisherOptions{Options: broker.Options{URLs: []string{rabbit.URL()}}, Channels: 1, ConfirmTimeout: 5 * time.Second})
			t.Cleanup(func() { pub.Close() })
			due := map[string]time.Time{}
			t0 := time.Now()
			for i := range 12 {
				id := fmt.Sprintf("s%02d", i)
				due[id] = t0.Add(4*time.Second + time.Duration(i)*time.Second)
				m := &msg.Message{MessageID: id, Body: []byte(id), Headers: map[string]any{msg.HeaderNotBefore: due[id].UnixMilli()}}
				if err := pub.PublishTo(context.Background(), "", q, m); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(time.Until(t0.Add(1500 * time.Millisecond)))
			list := func() []string {
				args := []string{"parked", "-o", "json", "--broker-url", rabbit.URL(), "--queue", q, "--log-level", "error"}
				r := hopper(t, append(args, sched...)...)
				if r.code != 0 {
					t.Fatalf("parked: exit %d\n%s", r.code, r.stderr)
				}
				var got struct{ Messages []struct{ ID string } }
				if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
					t.Fatalf("%v:\n%s", err, r.stdout)
				}
				var ids []string
				for _, m := range got.Messages {
					ids = append(ids, m.ID)
				}
				return ids
			}
			ids := list()
			slices.Sort(ids)
			if want := slices.Sorted(maps.Keys(due)); !slices.Equal(ids, want) {
				t.Errorf("listed %v, want every message once: %v", ids, want)
			}
			time.Sleep(time.Until(t0.Add(6 * time.Second)))
			began := time.Now()
			ids = list()
			if len(slices.Compact(slices.Sorted(slices.Values(ids)))) != len(ids) {
				t.Errorf("listed %v: a message twice", ids)
			}
			t.Logf("listed at +6s: %d messages, in %s", len(ids), time.Since(began).Round(time.Millisecond))

			waitfor.Until(t, 30*time.Second, "every message delivered", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(first) == len(due)
			})
			time.Sleep(time.Second) // a duplicate would come now
			mu.Lock()
			defer mu.Unlock()
			var offs []time.Duration
			for id, d := range due {
				off := first[id].Sub(d)
				offs = append(offs, off)
				if calls[id] != 1 {
					t.Errorf("%s reached the app %d times", id, calls[id])
				}
				if off < -550*time.Millisecond || off > time.Second {
					t.Errorf("%s reached the app %s from its due time", id, off)
				}
			}
			slices.Sort(offs)
			t.Logf("lateness with two listings: earliest %+.3fs, median %+.3fs, latest %+.3fs",
				offs[0].Seconds(), offs[len(offs)/2].Seconds(), offs[len(offs)-1].Seconds())
		})
	}
}

// `hopper parked` refuses a config that parks nothing (usage), and says
// when the broker cannot be reached (unavailable).
func TestParkedExitCodes(t *testing.T) {
	r := hopper(t, "parked", "--broker-url", rabbit.URL(), "--queue", "q")
	if r.code != 64 || !strings.Contains(r.stderr, "schedule.enabled is off") {
		t.Errorf("with scheduling off: exit %d, %s; want 64 and why", r.code, r.stderr)
	}
	r = hopper(t, "parked", "--broker-url", "amqp://guest:guest@127.0.0.1:1/", "--queue", "q", "--set", "schedule.enabled=true")
	if r.code != 69 {
		t.Errorf("against a closed port: exit %d, %s; want 69", r.code, r.stderr)
	}
}

// With several subscriptions, --queue picks whose parked messages are
// listed; without it the command says so and names them.
func TestParkedPicksASubscription(t *testing.T) {
	file := filepath.Join(t.TempDir(), "hopper.yaml")
	yaml := "broker: {urls: [\"" + rabbit.URL() + "\"]}\napp: {url: \"http://127.0.0.1:1/\"}\nschedule: {enabled: true}\n" +
		"subscriptions:\n  - queue: {name: orders}\n  - queue: {name: invoices}\n"
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	r := hopper(t, "parked", "-c", file)
	if r.code != 64 || !strings.Contains(r.stderr, "--queue (one of orders, invoices)") || strings.Contains(r.stderr, "--dlq") {
		t.Errorf("without --queue: exit %d, %s; want 64 naming the subscriptions", r.code, r.stderr)
	}
	q := queueName(t)
	yaml = strings.Replace(yaml, "name: invoices", "name: "+q, 1)
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := hopper(t, "topology", "apply", "-c", file, "--log-level", "error"); r.code != 0 {
		t.Fatalf("apply: exit %d\n%s", r.code, r.stderr)
	}
	r = hopper(t, "parked", "-c", file, "--queue", q)
	if r.code != 0 || !strings.Contains(r.stdout, "--- 0 message(s) parked for "+q+" ---") {
		t.Errorf("--queue %s: exit %d\n%s\n%s", q, r.code, r.stdout, r.stderr)
	}
}
