package consolecheck

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestConsoleReplayInBatches replays a group of 30 in batches of 10: the
// run stops after each batch until the operator presses Next, so the
// first 10 can be watched before the rest go.
func TestConsoleReplayInBatches(t *testing.T) {
	e := newEnv(t)
	dlqName := e.Orders + ".dlq"
	e.fill(e.Orders, []failure{{"svc", "order.created", "max-attempts", 503, 30, "upstream answered 503"}, {"val", "order.paid", "non-retriable", 422, 3, "invalid"}}, nil, nil)
	p := e.startConsole()
	p.scansDone(t)
	var refused map[string]string
	var groups struct {
		Groups []struct{ ID string } `json:"groups"`
	}
	p.api(t, "GET", "api/dlqs/"+dlqName+"/groups", nil, &groups)
	if code := p.apiErr(t, "POST", "api/dlqs/"+dlqName+"/replay", map[string]any{"group": groups.Groups[0].ID, "batch": 10, "pause": "soon"}, &refused); code != http.StatusBadRequest || !strings.Contains(refused["error"], "pause") {
		t.Fatalf("a bad pause: %d %v", code, refused)
	}
	ctx := browser(t, 4*time.Minute)
	waiting := func(n int) chromedp.Action[chromedp.Void] {
		return poll(fmt.Sprintf(`Array.from(document.querySelectorAll('#jobs .job[data-kind=replay] .waiting')).some(w => w.textContent.startsWith('%d replayed'))`, n))
	}
	run(t, ctx, "replay in batches of 10", chromedp.Navigate(p.URL+"#/dlq/"+dlqName), chromedp.SendKeys(chromedp.CSS("#token"), secret),
		poll(`document.querySelectorAll('#groups tr.group').length === 2`),
		chromedp.SendKeys(chromedp.CSS(`#groups tr.group:nth-child(1) input.batch`), "10"),
		chromedp.Click(chromedp.CSS(`#groups tr.group:nth-child(1) button.replay`)),
		waiting(10))
	for _, n := range []int{10, 20} {
		if got := e.contents(e.Orders); len(got) != n {
			t.Fatalf("work queue holds %d while the run waits, want %d", len(got), n)
		}
		next := n + 10
		steps := []chromedp.Action[chromedp.Void]{chromedp.Click(chromedp.CSS(`#jobs .job[data-kind=replay] button.next`))}
		if next < 30 {
			steps = append(steps, waiting(next))
		} else {
			steps = append(steps, poll(`Array.from(document.querySelectorAll('#jobs .job[data-kind=replay]')).some(j => j.querySelector('.state').textContent === 'done')`))
		}
		run(t, ctx, fmt.Sprintf("next batch after %d", n), steps...)
	}
	if got := e.contents(e.Orders); len(got) != 30 {
		t.Fatalf("work queue holds %d after the last batch, want 30", len(got))
	}
	if got := e.contents(dlqName); len(got) != 3 {
		t.Fatalf("DLQ holds %d, want the other group's 3", len(got))
	}
}
