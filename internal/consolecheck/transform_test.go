package consolecheck

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/msg"
)

func TestConsoleTransformGroup(t *testing.T) {
	for _, quorum := range []bool{false, true} {
		t.Run(map[bool]string{false: "classic", true: "quorum"}[quorum], func(t *testing.T) { transformGroup(t, quorum) })
	}
}

// transformGroup fixes a group of 10,000 messages of the classic (orders)
// or quorum (invoices) DLQ: a preview of the first five before and after,
// a dry run that counts, then the run; the ten messages the patch's test
// refuses stay in the DLQ as they were, and so does the other group.
func transformGroup(t *testing.T, quorum bool) {
	e := newEnv(t)
	work := e.Orders
	if quorum {
		work = e.Bills
	}
	dlqName := work + ".dlq"
	const n, usd, others = 10_000, 10, 5
	e.fillMany(work, "fix", n, "order.paid", "non-retriable", 422, func(i int) string {
		currency := "EUR"
		if i%(n/usd) == n/usd-1 {
			currency = "USD"
		}
		return fmt.Sprintf(`{"id":%d,"currency":%q,"amt":%d}`, i, currency, i)
	})
	e.fillMany(work, "other", others, "order.created", "max-attempts", 503, func(i int) string { return fmt.Sprintf(`{"id":%d}`, i) })
	p := e.startConsole()
	p.scansDone(t)
	ctx := browser(t, 12*time.Minute)
	patch := `[{"op": "test", "path": "/body/currency", "value": "EUR"}, {"op": "move", "from": "/body/amt", "path": "/body/amount"}, {"op": "add", "path": "/headers/fixed-by", "value": "transform"}]`
	setPatch := func(text string) chromedp.Action[chromedp.Void] {
		return chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`(() => { const p = document.getElementById('transform-patch'); p.value = %q; p.dispatchEvent(new Event('input')); })()`, text))
	}

	run(t, ctx, "open the transformation of the big group", chromedp.Navigate(p.URL+"#/dlq/"+dlqName), chromedp.SendKeys(chromedp.CSS("#token"), secret),
		poll(`document.querySelectorAll('#groups tr.group').length === 2`),
		chromedp.Click(chromedp.CSS(`#groups tr.group:nth-child(1) button.transform`)),
		poll(`document.getElementById('transform') !== null`))
	// A patch that is not JSON: refused while typing.
	run(t, ctx, "a broken patch", setPatch(`[{"op": "move",]`),
		poll(`document.getElementById('transform-status').textContent.startsWith('not a JSON Patch') && document.getElementById('transform-go').disabled`))
	// One that reaches Hopper's history: refused by the console.
	run(t, ctx, "a patch of a history header", setPatch(`[{"op": "replace", "path": "/headers/x-replay-count", "value": 0}]`),
		chromedp.Click(chromedp.CSS("#transform-go")),
		poll(`!document.getElementById('error').hidden && document.getElementById('error').textContent.includes('history')`))

	run(t, ctx, "preview", setPatch(patch), chromedp.Click(chromedp.CSS("#transform-preview")),
		poll(`document.querySelectorAll('#transform-preview-table tr.preview').length === 5`))
	before, after := texts(t, ctx, "#transform-preview-table pre.before"), texts(t, ctx, "#transform-preview-table pre.after")
	if len(before) != 5 || len(after) != 5 {
		t.Fatalf("preview before %q after %q", before, after)
	}
	for i := range before {
		var id int
		if _, err := fmt.Sscanf(before[i], "{\n  \"id\": %d", &id); err != nil {
			t.Fatalf("preview before %q: %v", before[i], err)
		}
		if !strings.Contains(before[i], fmt.Sprintf(`"amt": %d`, id)) || !strings.Contains(after[i], fmt.Sprintf(`"amount": %d`, id)) || strings.Contains(after[i], `"amt"`) {
			t.Fatalf("preview of %d: before %q after %q", id, before[i], after[i])
		}
	}
	if h := texts(t, ctx, "#transform-preview-table pre.after-headers"); len(h) != 5 || !strings.Contains(h[0], `"fixed-by": "transform"`) {
		t.Errorf("preview of the headers %q", h)
	}

	run(t, ctx, "dry run", chromedp.Click(chromedp.CSS("#transform-dry")),
		pollLong(`Array.from(document.querySelectorAll('#jobs .job[data-kind="transform (dry run)"]')).some(j => j.querySelector('.state').textContent === 'done')`))
	dry := strings.Join(texts(t, ctx, `#jobs .job[data-kind="transform (dry run)"] .summary`), "\n")
	if want := fmt.Sprintf("would replay %d, would change %d; the transformation fails on %d", n-usd, n-usd, usd); !strings.Contains(dry, want) {
		t.Errorf("dry run says %q, want %q", dry, want)
	}
	if got := e.contents(work); len(got) != 0 {
		t.Fatalf("the dry run moved %d messages", len(got))
	}

	// Every action ends with a rescan, which holds the DLQ (a click then
	// is refused: busy) and draws the groups again when it ends: click
	// until the run is under way. A second run of the DLQ is refused while
	// one holds it, so a click too many moves nothing.
	err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`(() => {
			// A click during the rescan is refused (busy) and listed as failed.
			if (Array.from(document.querySelectorAll('#jobs .job[data-kind="transform"]')).some(j => ['running', 'done'].includes(j.querySelector('.state').textContent))) return true;
			const b = document.getElementById('transform-go');
			window.clicks = (window.clicks || 0) + 1;
			window.lastState = b ? (b.disabled ? 'disabled' : 'clicked') : 'no button';
			if (b && !b.disabled) b.click();
			return false;
		})()`, chromedp.WithPollingInterval(time.Second), chromedp.WithPollingTimeout(3*time.Minute)))
	if err != nil {
		state, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`window.lastState + ' after ' + window.clicks + ' tries; error: ' + document.getElementById('error').textContent`))
		t.Fatalf("start the transformation: %v (%s)", err, state)
	}
	run(t, ctx, "transform and replay",
		pollLong(`Array.from(document.querySelectorAll('#jobs .job[data-kind="transform"]')).some(j => j.querySelector('.state').textContent === 'done')`))
	moved := e.messages(work)
	if len(moved) != n-usd {
		t.Fatalf("work queue holds %d, want %d", len(moved), n-usd)
	}
	for _, m := range moved {
		if !strings.Contains(string(m.Body), `"amount":`) || strings.Contains(string(m.Body), `"amt"`) || m.String("fixed-by") != "transform" ||
			m.String(msg.HeaderEditedBy) != "oncall" || !strings.HasPrefix(m.String(msg.HeaderEdited), "transformation:") {
			t.Fatalf("copy %s: body %s headers %v", m.MessageID, m.Body, m.Headers)
		}
	}
	left := e.messages(dlqName)
	if len(left) != usd+others {
		t.Fatalf("DLQ holds %d, want %d", len(left), usd+others)
	}
	for _, m := range left {
		if strings.HasPrefix(m.MessageID, "fix-") && (!strings.Contains(string(m.Body), `"USD"`) || !strings.Contains(string(m.Body), `"amt"`) || m.String("fixed-by") != "") {
			t.Errorf("message left in the DLQ was changed: %s %s", m.MessageID, m.Body)
		}
	}
	if got := e.contents(dlq.OriginalsQueue(dlqName)); len(got) != n-usd {
		t.Errorf("originals queue holds %d, want %d", len(got), n-usd)
	}
}

// fillMany publishes n dead letters of one failure group to queue's DLQ,
// ids prefix-0…, in parallel.
func (e *env) fillMany(queue, prefix string, n int, rk, reason string, status int, body func(i int) string) {
	e.t.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || failed.Load() != nil {
					return
				}
				m := &msg.Message{MessageID: fmt.Sprintf("%s-%d", prefix, i), ContentType: "application/json", Headers: map[string]any{"tenant": "acme"}, Body: []byte(body(i))}
				*m = *msg.DLQCopy(m, msg.Info{Queue: queue, RoutingKey: rk, Retries: 1}, msg.DeadLetter{Status: status, Reason: reason, Retries: 1, Error: "rejected", Now: time.Now()})
				if err := e.pub.Publish(context.Background(), queue+".dlq", m); err != nil {
					failed.Store(&err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if p := failed.Load(); p != nil {
		e.t.Fatal(*p)
	}
}

// pollLong is poll for a run over a whole DLQ of thousands of messages.
func pollLong(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(5*time.Minute))
}
