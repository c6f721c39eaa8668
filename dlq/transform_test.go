package dlq

import (
	"strings"
	"testing"

	"github.com/hopper-sidecar/hopper/msg"
)

func TestParseTransformRefuses(t *testing.T) {
	for _, c := range []struct{ patch, want string }{
		{`{"op": "add"}`, "not a JSON Patch"},
		{`[{"op": "add", "path": "/body/a", "value": 1},]`, "not a JSON Patch"},
		{`[]`, "no operation"},
		{`[{"op": "merge", "path": "/body/a", "value": 1}]`, "unsupported operation"},
		{`[{"op": "replace", "path": "/amount", "value": 1}]`, "want a path under /body or /headers/NAME"},
		{`[{"op": "replace", "path": "/headers/x-replay-count", "value": 0}]`, `"x-replay-count" is part of the message's history`},
		{`[{"op": "remove", "path": "/headers/x-hopper-edited-by"}]`, "history"},
		{`[{"op": "move", "from": "/headers/x-death", "path": "/body/death"}]`, `from "/headers/x-death"`},
		{`[{"op": "replace", "value": 1}]`, "missing path"},
	} {
		if _, err := ParseTransform([]byte(c.patch)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.patch, err, c.want)
		}
	}
}

func TestTransformApply(t *testing.T) {
	tr, err := ParseTransform([]byte(`[
		{"op": "test", "path": "/body/currency", "value": "EUR"},
		{"op": "move", "from": "/body/amt", "path": "/body/amount"},
		{"op": "replace", "path": "/headers/tenant", "value": "acme-eu"},
		{"op": "add", "path": "/headers/fixed", "value": true}
	]`))
	if err != nil {
		t.Fatal(err)
	}
	tr.By = "oncall"
	msgOf := func(body string) *msg.Message {
		return &msg.Message{MessageID: "m", ContentType: "application/json", Body: []byte(body), Headers: map[string]any{
			"tenant": "acme", msg.HeaderRetryCount: int64(2), msg.HeaderDeadLetterReason: "non-retriable"}}
	}
	m := msgOf(`{"currency": "EUR", "amt": 5}`)
	cp, err := tr.Apply(m, t0)
	if err != nil {
		t.Fatal(err)
	}
	if string(cp.Body) != `{"currency":"EUR","amount":5}` || cp.Headers["tenant"] != "acme-eu" || cp.Headers["fixed"] != true {
		t.Errorf("copy: body %s headers %v", cp.Body, cp.Headers)
	}
	if cp.Headers[msg.HeaderRetryCount] != int64(2) || cp.Headers[msg.HeaderEditedBy] != "oncall" ||
		!strings.HasPrefix(cp.String(msg.HeaderEdited), "transformation: body") || cp.Headers[msg.HeaderOriginalBodyDigest] != msg.BodyDigest(m.Body) {
		t.Errorf("record %v", cp.Headers)
	}
	if string(m.Body) != `{"currency": "EUR", "amt": 5}` || m.Headers["tenant"] != "acme" {
		t.Error("the message was changed")
	}

	// Failures: each leaves the message as it was.
	for body, want := range map[string]string{
		`{"currency": "USD", "amt": 5}`: "transformation",   // test fails
		`{"currency": "EUR"}`:           "transformation",   // nothing to move
		`not json`:                      "body is not JSON", // no document
	} {
		if cp, err := tr.Apply(msgOf(body), t0); err == nil || cp != nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: copy %v, err %v, want %q", body, cp, err, want)
		}
	}

	// A transformation that changes nothing on a message: replayed as is.
	noop, err := ParseTransform([]byte(`[{"op": "test", "path": "/body/currency", "value": "EUR"}]`))
	if err != nil {
		t.Fatal(err)
	}
	if cp, err := noop.Apply(msgOf(`{"currency":"EUR"}`), t0); cp != nil || err != nil {
		t.Errorf("unchanged: %v %v", cp, err)
	}
	p := tr.Preview(msgOf(`{"currency":"EUR","amt":5}`), t0)
	if p.After == nil || !strings.Contains(p.After.Body, `"amount": 5`) || !strings.Contains(p.Before.Body, `"amt": 5`) || p.After.Headers["tenant"] != "acme-eu" {
		t.Errorf("preview %+v", p)
	}
	if p := tr.Preview(msgOf(`{"currency":"USD"}`), t0); p.After != nil || p.Error == "" {
		t.Errorf("failing preview %+v", p)
	}
}
