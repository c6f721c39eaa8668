package consolecheck

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/hopper-sidecar/hopper/msg"
)

// TestConsoleAfterReplay: a group is replayed, its messages fail again and
// come back to the DLQ; the rescan shows them as a group of their own,
// "failed again after replay run …", and the activity list shows per run
// how many came back. A group marked ignored stays in the DLQ and leaves
// the overview's attention figure until unmarked, across restarts of the
// console: the mark is kept on the broker.
func TestConsoleAfterReplay(t *testing.T) {
	e := newEnv(t)
	dlqName := e.Orders + ".dlq"
	ids := e.fill(e.Orders, threeKinds, nil, nil)
	p := e.startConsole()
	p.scansDone(t)
	ctx := browser(t, 4*time.Minute)

	run(t, ctx, "replay the second group", chromedp.Navigate(p.URL+"#/dlq/"+dlqName), chromedp.SendKeys(chromedp.CSS("#token"), secret),
		poll(`document.querySelectorAll('#groups tr.group').length === 3`),
		chromedp.Click(chromedp.CSS(`#groups tr.group:nth-child(2) button.replay`)),
		poll(`Array.from(document.querySelectorAll('#jobs .job[data-kind=replay]')).some(j => j.querySelector('.state').textContent === 'done')`))
	// The app fails them again: Hopper dead-letters each copy, which
	// carries the run's name.
	again := e.messages(e.Orders)
	if len(again) != len(ids["val"]) {
		t.Fatalf("work queue holds %d, want %d", len(again), len(ids["val"]))
	}
	runID := again[0].String(msg.HeaderReplayRun)
	if !strings.HasPrefix(runID, "console ") {
		t.Fatalf("replayed copy names run %q", runID)
	}
	for _, m := range again {
		cp := msg.DLQCopy(m, msg.Info{Queue: e.Orders, RoutingKey: "order.paid", Retries: 4}, msg.DeadLetter{Status: 422, Reason: "non-retriable", Retries: 4, Error: "field amount: must be positive", Now: time.Now()})
		if err := e.pub.Publish(context.Background(), dlqName, cp); err != nil {
			t.Fatal(err)
		}
	}
	p.scansDone(t)
	run(t, ctx, "rescan", chromedp.Navigate(p.URL+"#/dlq/"+dlqName), poll(`document.querySelectorAll('#groups tr.group').length >= 2`),
		chromedp.Click(chromedp.CSS(`#scan-state button.rescan`)),
		poll(fmt.Sprintf(`Array.from(document.querySelectorAll('#groups tr.group .again')).some(a => a.textContent === %q)`, "failed again after replay run "+runID)))
	row := fmt.Sprintf(`Array.from(document.querySelectorAll('#groups tr.group')).find(r => (r.querySelector('.again')||{}).textContent === %q)`, "failed again after replay run "+runID)
	count, err := chromedp.Run(ctx, chromedp.Evaluate[string](row+`.querySelector('.count').textContent`))
	if err != nil || count != fmt.Sprint(len(ids["val"])) {
		t.Fatalf("group of the run: count %q (%v), want %d", count, err, len(ids["val"]))
	}
	run(t, ctx, "activity: came back", chromedp.Navigate(p.URL+"#/activity"),
		poll(fmt.Sprintf(`Array.from(document.querySelectorAll('#activity tr[data-job]')).some(r => r.querySelector('.kind').textContent === 'replay' && r.querySelector('.came-back').textContent === '%d')`, len(ids["val"]))))

	// Ignore the largest group: out of the attention figure, still in the DLQ.
	total := len(ids["svc"]) + len(ids["exp"]) + len(ids["val"])
	attention := func(want string) chromedp.Action[chromedp.Void] {
		return poll(fmt.Sprintf(`(document.querySelector('#dlqs tr[data-dlq=%q] .attention')||{}).textContent === %q`, dlqName, want))
	}
	run(t, ctx, "overview before", chromedp.Navigate(p.URL), attention(fmt.Sprint(total)))
	run(t, ctx, "ignore the largest group", chromedp.Navigate(p.URL+"#/dlq/"+dlqName), poll(`document.querySelectorAll('#groups tr.group').length === 3`),
		chromedp.Click(chromedp.CSS(`#groups tr.group:nth-child(1) button.ignore`)),
		poll(`(document.querySelector('#groups tr.group:nth-child(1) .ignored-mark')||{}).textContent === 'ignored'`),
		chromedp.Navigate(p.URL), attention(fmt.Sprintf("%d (%d ignored)", total-len(ids["svc"]), len(ids["svc"]))))
	if got := e.contents(dlqName); len(got) != total {
		t.Fatalf("DLQ holds %d after ignoring, want %d", len(got), total)
	}
	// The mark is kept on the broker: a second console beside this one
	// shows it, and a console started after this one stopped still leaves
	// the group out.
	beside := e.startConsole()
	beside.scansDone(t)
	run(t, ctx, "a console beside shows the mark", chromedp.Navigate(beside.URL), attention(fmt.Sprintf("%d (%d ignored)", total-len(ids["svc"]), len(ids["svc"]))))
	beside.stop(t)
	p.stop(t)
	if log := p.logText(); !strings.Contains(log, "console: ignore") {
		t.Errorf("ignore not logged:\n%s", log)
	}
	p = e.startConsole()
	p.scansDone(t)
	run(t, ctx, "after a restart, still ignored", chromedp.Navigate(p.URL), attention(fmt.Sprintf("%d (%d ignored)", total-len(ids["svc"]), len(ids["svc"]))),
		chromedp.Navigate(p.URL+"#/dlq/"+dlqName), poll(`document.querySelectorAll('#groups tr.group').length === 3`),
		poll(`(document.querySelector('#groups tr.group:nth-child(1) .ignored-mark')||{}).title.startsWith('marked ignored by oncall from ')`))
	run(t, ctx, "unignore", chromedp.Navigate(p.URL+"#/dlq/"+dlqName), chromedp.SendKeys(chromedp.CSS("#token"), secret),
		poll(`document.querySelectorAll('#groups tr.group').length === 3`),
		chromedp.Click(chromedp.CSS(`#groups tr.group:nth-child(1) button.ignore`)),
		poll(`document.querySelector('#groups tr.group:nth-child(1) .ignored-mark') === null`),
		chromedp.Navigate(p.URL), attention(fmt.Sprint(total)))
	p.stop(t)
	if log := p.logText(); !strings.Contains(log, "console: unignore") {
		t.Errorf("unignore not logged:\n%s", log)
	}
	p = e.startConsole()
	p.scansDone(t)
	run(t, ctx, "after another restart, counted again", chromedp.Navigate(p.URL), attention(fmt.Sprint(total)))
	if got := e.contents(dlqName); len(got) != total {
		t.Fatalf("DLQ holds %d at the end, want %d", len(got), total)
	}
}
