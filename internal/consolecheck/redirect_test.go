package consolecheck

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/console"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/topology"
)

func TestConsoleRedirect(t *testing.T) {
	for _, quorum := range []bool{false, true} {
		t.Run(map[bool]string{false: "classic", true: "quorum"}[quorum], func(t *testing.T) { redirect(t, quorum) })
	}
}

// redirect replays a group of the classic (orders) or quorum (invoices)
// DLQ to another queue: a missing queue or exchange is refused before
// anything moves; an existing queue gets exactly the group.
func redirect(t *testing.T, quorum bool) {
	e := newEnv(t)
	work := e.Orders
	if quorum {
		work = e.Bills
	}
	dlqName := work + ".dlq"
	ids := e.fill(work, threeKinds, nil, nil)
	fixed := work + ".fixed"
	ctx0, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := broker.DeclareQueue(ctx0, e.opts, topology.Queue{Name: fixed, Args: map[string]any{"x-queue-type": "classic"}}); err != nil {
		t.Fatal(err)
	}
	p := e.startConsole()
	p.scansDone(t)
	ctx := browser(t, 4*time.Minute)
	row := `#groups tr.group:nth-child(2)`

	run(t, ctx, "groups", chromedp.Navigate(p.URL+"#/dlq/"+dlqName), chromedp.SendKeys(chromedp.CSS("#token"), secret),
		poll(`document.querySelectorAll('#groups tr.group').length === 3`))
	for _, c := range []struct{ field, value, want string }{
		{"redirect-to", work + ".missing", fmt.Sprintf(`destination queue \"%s.missing\"`, work)},
		{"redirect-exchange", work + ".missing-x", fmt.Sprintf(`destination exchange \"%s.missing-x\"`, work)},
	} {
		run(t, ctx, "redirect to a missing "+c.field,
			chromedp.Evaluate[chromedp.Void](`document.querySelectorAll('#groups input.redirect-to, #groups input.redirect-exchange').forEach(i => i.value = '')`),
			chromedp.SendKeys(chromedp.CSS(row+" input."+c.field), c.value),
			chromedp.Click(chromedp.CSS(row+" button.replay")),
			poll(fmt.Sprintf(`!document.getElementById('error').hidden && document.getElementById('error').textContent.includes("nothing moved") && document.getElementById('error').textContent.includes("%s")`, c.want)))
		if got := e.contents(dlqName); len(got) != 9 {
			t.Fatalf("a refused redirect left %d messages in the DLQ, want 9", len(got))
		}
	}
	if got := e.contents(work); len(got) != 0 {
		t.Fatalf("a refused redirect moved %v to %s", got, work)
	}

	run(t, ctx, "redirect to an existing queue",
		chromedp.Evaluate[chromedp.Void](`document.querySelectorAll('#groups input.redirect-to, #groups input.redirect-exchange').forEach(i => i.value = '')`),
		chromedp.SendKeys(chromedp.CSS(row+" input.redirect-to"), fixed),
		chromedp.Click(chromedp.CSS(row+" button.replay")),
		poll(`Array.from(document.querySelectorAll('#jobs .job[data-kind=replay]')).some(j => j.querySelector('.state').textContent === 'done')`))
	if got := e.contents(fixed); !slices.Equal(got, sorted(ids["val"])) {
		t.Fatalf("%s holds %v, want exactly %v", fixed, got, ids["val"])
	}
	if got := e.contents(work); len(got) != 0 {
		t.Fatalf("the redirected replay also went to %s: %v", work, got)
	}
	if got := e.contents(dlqName); !slices.Equal(got, sorted(ids["svc"], ids["exp"])) {
		t.Fatalf("DLQ after the redirect = %v", got)
	}
	run(t, ctx, "the activity names the target", chromedp.Navigate(p.URL+"#/activity"),
		poll(fmt.Sprintf(`Array.from(document.querySelectorAll('#activity td.mono')).some(c => c.textContent.endsWith(" to %s"))`, fixed)))
}

// scansDone waits for the console's scans at start to end, so that the
// page does not draw a DLQ's groups again while the test types in them.
func (p *proc) scansDone(t *testing.T) {
	t.Helper()
	waitfor.Until(t, time.Minute, "the scans at start", func() bool {
		var ov struct {
			DLQs []console.Overview `json:"dlqs"`
		}
		p.api(t, "GET", "api/overview", nil, &ov)
		for _, d := range ov.DLQs {
			if d.Scan == nil || d.Scan.State == console.StateRunning {
				return false
			}
		}
		return len(ov.DLQs) > 0
	})
}
