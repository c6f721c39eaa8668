package sidecar_test

import (
	"fmt"
	"slices"
	"testing"
)

// TestOrderedRetriesInPlace: with consumer.ordered, the app sees 1..N in
// publish order although some messages fail twice before they succeed and
// one fails until the DLQ: each retry happens while the delivery is held,
// so no later message overtakes a failing one, and every attempt of a
// message comes before the next message's first.
func TestOrderedRetriesInPlace(t *testing.T) {
	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	cfg.Consumer.Ordered = true
	r := start(t, cfg)
	const n = 12
	var ids []string
	for i := 1; i <= n; i++ {
		ids = append(ids, fmt.Sprintf("o%02d", i))
	}
	for _, id := range []string{"o03", "o07", "o11"} {
		app.script(id, 503, 500, 200)
	}
	app.script("o09", 503) // fails every attempt: DLQ after 3
	for _, id := range ids {
		r.publish(id)
	}
	r.settled(1)

	order := app.order(func(call) bool { return true })
	if !slices.Equal(order, ids) {
		t.Errorf("the app saw the messages in the order %v, want %v", order, ids)
	}
	for _, id := range []string{"o03", "o07", "o11", "o09"} {
		if got := app.attempts(id); !slices.Equal(got, []int{1, 2, 3}) {
			t.Errorf("%s: attempts %v, want [1 2 3]", id, got)
		}
	}
	dlq := r.drain(r.sc.Plan().DLQ.Name)
	if m, ok := dlq["o09"]; !ok {
		t.Errorf("o09 is not in the DLQ (got %v)", dlq)
	} else if reason, _ := m.Headers["x-dead-letter-reason"].(string); reason != "max-attempts" {
		t.Errorf("o09 dead-lettered as %q, want max-attempts", reason)
	}
}
