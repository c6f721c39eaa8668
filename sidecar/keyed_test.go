package sidecar_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/internal/waitfor"
)

// keyOf is the ordering key of a test message id: the letters before its
// number ("a03" → "a"); ids starting with "u" carry no key.
func keyOf(id string) string { return strings.TrimRight(id, "0123456789") }

// publishKeyed publishes n messages for each key, interleaved
// (a01 b01 c01 a02 …), each with its key in header "k".
func publishKeyed(r *running, keys []string, n int) map[string][]string {
	r.t.Helper()
	ids := map[string][]string{}
	for i := 1; i <= n; i++ {
		for _, k := range keys {
			id := fmt.Sprintf("%s%02d", k, i)
			ids[k] = append(ids[k], id)
			if k == "u" {
				r.publish(id)
				continue
			}
			r.publish(id, withHeader("k", k))
		}
	}
	return ids
}

// TestKeyedOrderPerKey: with consumer.orderingKey, each key's messages
// reach the app one at a time in publish order, though some fail twice
// before they succeed and one fails until the DLQ; a message being retried
// holds only its own key: the other keys, and the messages without a key,
// are all delivered while it is held.
func TestKeyedOrderPerKey(t *testing.T) {
	for _, qt := range []string{"classic", "quorum"} {
		t.Run(qt, func(t *testing.T) {
			app := newScriptApp(t)
			cfg := testConfig(t, app.URL)
			cfg.Queue.Type = qt
			cfg.Consumer.OrderingKey = "header:k"
			cfg.Consumer.Prefetch = 40
			cfg.Admin.Listen = "127.0.0.1:0"
			r := start(t, cfg)

			keys := []string{"a", "b", "c", "d", "u"}
			for _, id := range []string{"a02", "b03", "c05"} {
				app.script(id, 503, 500, 200)
			}
			app.script("b05", 503) // fails every attempt: DLQ after 3
			release := app.hold("a01")
			defer release()
			ids := publishKeyed(r, keys, 6)

			// a01 is held at the app: every other key, and the messages
			// without one, go on; nothing of key a behind it is called.
			waitfor.Until(t, 30*time.Second, "every message of keys b, c, d and u delivered while a01 is held", func() bool {
				for _, k := range []string{"b", "c", "d", "u"} {
					for _, id := range ids[k] {
						if !slices.Contains(app.statuses(id), 200) && id != "b05" {
							return false
						}
					}
				}
				return len(app.callsFor("b05")) == 3
			})
			for _, id := range ids["a"][1:] {
				if n := len(app.callsFor(id)); n != 0 {
					t.Fatalf("%s was called %d times while a01 of the same key was at the app", id, n)
				}
			}
			// /readyz shows the one key in delivery and the five messages
			// of it waiting.
			want := "ordered by header:k: 1 keys in delivery, 5 messages waiting behind them"
			if _, body := readyz(t, r.sc); !strings.Contains(body, want) {
				t.Errorf("/readyz does not say %q:\n%s", want, body)
			}
			release()
			r.settled(1)

			for _, k := range []string{"a", "b", "c", "d"} {
				got := app.order(func(c call) bool { return keyOf(c.ID) == k })
				if !slices.Equal(got, ids[k]) {
					t.Errorf("key %s reached the app in the order %v, want %v", k, got, ids[k])
				}
			}
			for _, id := range []string{"a02", "b03", "c05", "b05"} {
				if got := app.attempts(id); !slices.Equal(got, []int{1, 2, 3}) {
					t.Errorf("%s: attempts %v, want [1 2 3]", id, got)
				}
			}
			dlq := r.drain(r.sc.Plan().DLQ.Name)
			if _, ok := dlq["b05"]; !ok || len(dlq) != 1 {
				t.Errorf("the DLQ holds %d messages, want b05 alone", len(dlq))
			}
		})
	}
}

// TestKeyedTooEarlyKeepsOrder: a 425 on a keyed message is held in place
// for its wait, so the next message of its key comes after it, while the
// other key flows meanwhile.
func TestKeyedTooEarlyKeepsOrder(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	cfg.Consumer.OrderingKey = "header:k"
	r := start(t, cfg)
	app.script("a01", 425, 425, 200)
	ids := publishKeyed(r, []string{"a", "b"}, 4)
	r.settled(0)

	for _, k := range []string{"a", "b"} {
		if got := app.order(func(c call) bool { return keyOf(c.ID) == k }); !slices.Equal(got, ids[k]) {
			t.Errorf("key %s reached the app in the order %v, want %v", k, got, ids[k])
		}
	}
	var requeues []int
	for _, c := range app.callsFor("a01") {
		requeues = append(requeues, c.Requeues)
	}
	if !slices.Equal(requeues, []int{0, 1, 2}) {
		t.Errorf("a01 was called with requeue counts %v, want [0 1 2]", requeues)
	}
	if got := r.sc.Stats().OrderBroken.Load(); got != 0 {
		t.Errorf("%d messages reported out of order, want 0", got)
	}
}
