package msg

import (
	"testing"
	"time"
)

func TestEditedCopyKeepsHistoryAndRecordsTheChange(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 3, 0, 0, 0, time.UTC)
	m := &Message{MessageID: "a", Body: []byte(`{"amount":-1}`), Headers: map[string]any{
		HeaderRetryCount: int64(3), HeaderReplayCount: int64(2), HeaderDeadLetterReason: "non-retriable",
		HeaderDeath: []any{map[string]any{"queue": "orders"}}, "x-hopper-crash-count": int64(1),
		"tenant": "acme", "obsolete": "x",
	}}
	cp := EditedCopy(m, Change{Body: []byte(`{"amount":1}`), Headers: map[string]any{
		"tenant": "acme-eu", HeaderReplayCount: int64(0), // a history header in the set is ignored
	}, By: "oncall", What: "body", Now: t0})
	if string(cp.Body) != `{"amount":1}` || string(m.Body) != `{"amount":-1}` {
		t.Fatalf("body %s, original %s", cp.Body, m.Body)
	}
	for _, h := range []string{HeaderRetryCount, HeaderReplayCount, HeaderDeadLetterReason, HeaderDeath, "x-hopper-crash-count"} {
		if _, ok := cp.Headers[h]; !ok {
			t.Errorf("history header %s dropped", h)
		}
	}
	if cp.Headers[HeaderReplayCount] != int64(2) {
		t.Errorf("replay count %v: an edit must not reset it", cp.Headers[HeaderReplayCount])
	}
	if cp.Headers["tenant"] != "acme-eu" {
		t.Errorf("tenant %v", cp.Headers["tenant"])
	}
	if _, ok := cp.Headers["obsolete"]; ok {
		t.Error("an application header left out of the set was kept")
	}
	if m.Headers["tenant"] != "acme" || m.Headers["obsolete"] != "x" {
		t.Error("the original was changed")
	}
	want := BodyDigest([]byte(`{"amount":-1}`))
	if cp.Headers[HeaderOriginalBodyDigest] != want || cp.Headers[HeaderEditedBy] != "oncall" ||
		cp.Headers[HeaderEditedTime] != "2026-11-25T03:00:00Z" || cp.Headers[HeaderEdited] != "body" || cp.Headers[HeaderEditCount] != int64(1) {
		t.Errorf("edit record %v", cp.Headers)
	}
	// A second edit keeps the digest of the body as first published.
	again := EditedCopy(cp, Change{Body: []byte(`{"amount":2}`), By: "lead", What: "body", Now: t0.Add(time.Hour)})
	if again.Headers[HeaderOriginalBodyDigest] != want || again.Headers[HeaderEditCount] != int64(2) || again.Headers[HeaderEditedBy] != "lead" {
		t.Errorf("second edit %v", again.Headers)
	}
	if again.Headers["tenant"] != "acme-eu" {
		t.Error("headers nil must keep the application headers")
	}
}

func TestIsHistory(t *testing.T) {
	for name, want := range map[string]bool{
		HeaderRetryCount: true, HeaderReplayCount: true, HeaderDeath: true, "x-first-death-queue": true,
		HeaderDeliveryCount: true, "x-hopper-publish-id": true, HeaderEditedBy: true, HeaderTraceID: true,
		"tenant": false, "x-custom": false, "X-Retry-Count": false,
	} {
		if got := IsHistory(name); got != want {
			t.Errorf("IsHistory(%q) = %v, want %v", name, got, want)
		}
	}
}
