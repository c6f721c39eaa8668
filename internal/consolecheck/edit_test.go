package consolecheck

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/msg"
)

func TestConsoleEditAndRetry(t *testing.T) {
	for _, quorum := range []bool{false, true} {
		t.Run(map[bool]string{false: "classic", true: "quorum"}[quorum], func(t *testing.T) { editAndRetry(t, quorum) })
	}
}

// editAndRetry edits one message of the classic (orders) or quorum
// (invoices) DLQ in the message view: a body with a JSON syntax error is
// refused by the page and by the API, a history header by the API; the
// fixed body and headers are replayed, the original kept in the originals
// queue, from which export and import bring it back.
func editAndRetry(t *testing.T, quorum bool) {
	e := newEnv(t)
	work := e.Orders
	if quorum {
		work = e.Bills
	}
	dlqName := work + ".dlq"
	ids := e.fill(work, threeKinds, func(id string) []byte { return []byte(`{"id":"` + id + `","amount":-5}`) }, func(m *msg.Message) {
		m.Headers["tenant"] = "acme"
	})
	p := e.startConsole()
	ctx := browser(t, 4*time.Minute)
	const id = "val-1"

	run(t, ctx, "open the message", chromedp.Navigate(p.URL+"#/dlq/"+dlqName), chromedp.SendKeys(chromedp.CSS("#token"), secret),
		chromedp.Navigate(p.URL+"#/dlq/"+dlqName+"/msg/"+id), poll(`document.getElementById('editor') !== null`))
	if st := texts(t, ctx, "#edit-body-status"); len(st) != 1 || st[0] != "valid JSON" {
		t.Errorf("status of the untouched body %v", st)
	}
	// A syntax error while typing: refused on the page.
	run(t, ctx, "type a body with a syntax error",
		chromedp.Evaluate[chromedp.Void](`(() => { const b = document.getElementById('edit-body'); b.value = '{"id": "val-1", "amount": 5,}'; b.dispatchEvent(new Event('input')); })()`),
		poll(`document.getElementById('edit-body-status').textContent.startsWith('not valid JSON') && document.getElementById('edit-go').disabled`))
	// And by the API, which a script could call without the page.
	var refused map[string]string
	if code := p.apiErr(t, "POST", "api/dlqs/"+dlqName+"/edit", map[string]any{"message": id, "contentType": "application/json", "body": `{"amount": 5,}`}, &refused); code != http.StatusBadRequest ||
		!strings.Contains(refused["error"], "not valid JSON") || !strings.Contains(refused["error"], "line 1, column 14") {
		t.Fatalf("edit with a syntax error: %d %v", code, refused)
	}
	if code := p.apiErr(t, "POST", "api/dlqs/"+dlqName+"/edit", map[string]any{"message": id, "contentType": "application/json", "headers": map[string]any{msg.HeaderReplayCount: 0}}, &refused); code != http.StatusBadRequest ||
		!strings.Contains(refused["error"], "history") {
		t.Fatalf("edit of a history header: %d %v", code, refused)
	}
	// Without the token: 401, nothing moves.
	if code := p.apiNoToken(t, "POST", "api/dlqs/"+dlqName+"/edit", map[string]any{"message": id, "contentType": "application/json", "body": `{}`}); code != http.StatusUnauthorized {
		t.Fatalf("edit without the token: %d", code)
	}
	if got := e.contents(work); len(got) != 0 {
		t.Fatalf("refused edits moved %v", got)
	}

	// The fix: body and a header; replayed, the original kept.
	run(t, ctx, "edit and replay",
		chromedp.Evaluate[chromedp.Void](`(() => {
			const b = document.getElementById('edit-body'); b.value = '{\n  "id": "val-1",\n  "amount": 5\n}'; b.dispatchEvent(new Event('input'));
			const h = document.getElementById('edit-headers'); const v = JSON.parse(h.value); v.tenant = 'acme-eu'; h.value = JSON.stringify(v); h.dispatchEvent(new Event('input'));
		})()`),
		poll(`document.getElementById('edit-body-status').textContent === 'valid JSON' && !document.getElementById('edit-go').disabled`),
		chromedp.Click(chromedp.CSS("#edit-go")),
		poll(`Array.from(document.querySelectorAll('#jobs .job[data-kind=edit]')).some(j => j.querySelector('.state').textContent === 'done')`))
	sum := texts(t, ctx, "#jobs .job[data-kind=edit] .summary")
	if len(sum) != 1 || !strings.Contains(sum[0], "kept in "+dlq.OriginalsQueue(dlqName)) {
		t.Errorf("edit's summary %v", sum)
	}
	moved := e.messages(work)
	if len(moved) != 1 || moved[0].MessageID != id {
		t.Fatalf("work queue after the edit holds %d messages", len(moved))
	}
	cp := moved[0]
	if string(cp.Body) != `{"id":"val-1","amount":5}` || cp.String("tenant") != "acme-eu" {
		t.Errorf("edited copy: body %s, tenant %q", cp.Body, cp.String("tenant"))
	}
	if cp.String(msg.HeaderEditedBy) != "oncall" || cp.String(msg.HeaderOriginalBodyDigest) != msg.BodyDigest([]byte(`{"id":"val-1","amount":-5}`)) ||
		msg.ReplayCount(cp) != 1 || cp.String(msg.HeaderEditedTime) == "" || !strings.Contains(cp.String(msg.HeaderEdited), "headers set: tenant") {
		t.Errorf("edited copy's record: %v", cp.Headers)
	}
	if _, ok := cp.Int(msg.HeaderRetryCount); !ok {
		t.Error("the attempt history was not kept")
	}
	originals := e.messages(dlq.OriginalsQueue(dlqName))
	if len(originals) != 1 || string(originals[0].Body) != `{"id":"val-1","amount":-5}` || originals[0].String("tenant") != "acme" ||
		msg.DeadLetterReason(originals[0]) != "non-retriable" {
		t.Fatalf("originals queue: %d messages %v", len(originals), originals)
	}
	want := sorted(ids["svc"], ids["val"], ids["exp"])
	want = slices.DeleteFunc(want, func(s string) bool { return s == id })
	if got := e.contents(dlqName); !slices.Equal(got, want) {
		t.Fatalf("DLQ after the edit = %v, want %v", got, want)
	}
	run(t, ctx, "the activity names the edit", chromedp.Navigate(p.URL+"#/activity"), poll(`Array.from(document.querySelectorAll('#activity .kind')).some(k => k.textContent === 'edit')`))
	if !strings.Contains(p.logText(), "console: edit done") {
		t.Errorf("the edit was not logged:\n%s", p.logText())
	}

	// Getting the original back: export it from the originals queue and
	// import it into the DLQ.
	file := filepath.Join(t.TempDir(), "original.jsonl")
	for _, args := range [][]string{
		{"dlq", "export", "-c", e.config, "--dlq", dlq.OriginalsQueue(dlqName), "--message-id", id, "--remove", "--file", file},
		{"dlq", "import", "-c", e.config, "--dlq", dlqName, "--file", file},
	} {
		if out, err := e.hopperCmd(args...).CombinedOutput(); err != nil {
			t.Fatalf("hopper %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	back := e.messages(dlqName)
	i := slices.IndexFunc(back, func(m *msg.Message) bool { return m.MessageID == id })
	if i < 0 || string(back[i].Body) != `{"id":"val-1","amount":-5}` || back[i].String("tenant") != "acme" {
		t.Fatalf("the original is not back in the DLQ as it was")
	}
	if got := e.contents(dlq.OriginalsQueue(dlqName)); len(got) != 0 {
		t.Errorf("originals queue still holds %v", got)
	}
}

// apiErr is api that also reads an error answer into out.
func (p *proc) apiErr(t *testing.T, method, path string, body any, out *map[string]string) int {
	t.Helper()
	*out = map[string]string{}
	code, raw := p.call(t, method, path, body, true)
	if code >= 300 {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: %d %s", method, path, code, raw)
		}
	}
	return code
}

// apiNoToken calls the API without the token.
func (p *proc) apiNoToken(t *testing.T, method, path string, body any) int {
	t.Helper()
	code, _ := p.call(t, method, path, body, false)
	return code
}
