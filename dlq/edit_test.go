package dlq

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
)

func str(s string) *string { return &s }

func TestEditValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		e    Edit
		want []string // substrings of the error; none: valid
	}{
		{"body json", Edit{Body: str(`{"a": 1}`), ContentType: "application/json"}, nil},
		{"body text", Edit{Body: str(`{not json`), ContentType: "text/plain"}, nil},
		{"headers only", Edit{Headers: map[string]json.RawMessage{"tenant": json.RawMessage(`"acme"`)}}, nil},
		{"nothing", Edit{}, []string{"changes nothing"}},
		{"json syntax", Edit{Body: str("{\n  \"a\": 1,\n  \"b\": x\n}"), ContentType: "application/json; charset=utf-8"}, []string{"not valid JSON", "line 3, column 8"}},
		{"json ends early", Edit{Body: str(`{"a": 1`), ContentType: "application/vnd.order+json"}, []string{"ends early"}},
		{"two documents", Edit{Body: str(`{} {}`), ContentType: "application/json"}, []string{"more than one document"}},
		{"history header", Edit{Headers: map[string]json.RawMessage{msg.HeaderReplayCount: json.RawMessage(`0`), msg.HeaderEditedBy: json.RawMessage(`"me"`)}},
			[]string{`"x-replay-count" is part of the message's history`, `"x-hopper-edited-by" is part`}},
		{"bad header value", Edit{Headers: map[string]json.RawMessage{"n": json.RawMessage(`1e999`)}}, []string{`header "n"`}},
		{"too big", Edit{Body: str(strings.Repeat("a", MaxEditBody+1))}, []string{"at most"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.e.Validate()
			if len(c.want) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestEditApply(t *testing.T) {
	stamp := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	m := &msg.Message{MessageID: "o-1", ContentType: "application/json", Body: []byte(`{"amount":-5}`), Headers: map[string]any{
		msg.HeaderRetryCount: int64(3), msg.HeaderDeadLetterReason: "non-retriable",
		"tenant": []byte("acme"), "at": stamp, "n": int32(7), "gone": "x",
	}}
	shown := AppHeaders(m)
	if _, ok := shown[msg.HeaderRetryCount]; ok {
		t.Fatal("history headers are offered for editing")
	}
	raw := func(v any) json.RawMessage { b, _ := json.Marshal(v); return b }
	e := Edit{Body: str("{\n  \"amount\": 5\n}"), ContentType: "application/json", By: "oncall", Headers: map[string]json.RawMessage{
		"tenant": raw(shown["tenant"]), "at": raw(shown["at"]), "n": json.RawMessage(`8`), "region": json.RawMessage(`{"zone": ["a", 2.5]}`),
	}}
	cp, err := e.Apply(m, t0)
	if err != nil {
		t.Fatal(err)
	}
	if string(cp.Body) != `{"amount":5}` {
		t.Errorf("body %s: a JSON body is stored compact", cp.Body)
	}
	// Unchanged values keep their AMQP type; changed ones take JSON's.
	if b, ok := cp.Headers["tenant"].([]byte); !ok || string(b) != "acme" {
		t.Errorf("tenant %T %v", cp.Headers["tenant"], cp.Headers["tenant"])
	}
	if cp.Headers["at"] != stamp || cp.Headers["n"] != int64(8) {
		t.Errorf("at %v, n %T %v", cp.Headers["at"], cp.Headers["n"], cp.Headers["n"])
	}
	if z, ok := cp.Headers["region"].(map[string]any); !ok || z["zone"].([]any)[1] != 2.5 {
		t.Errorf("region %v", cp.Headers["region"])
	}
	if _, ok := cp.Headers["gone"]; ok {
		t.Error("a header left out was kept")
	}
	if cp.Headers[msg.HeaderRetryCount] != int64(3) || cp.Headers[msg.HeaderDeadLetterReason] != "non-retriable" {
		t.Error("history lost")
	}
	what, _ := cp.Headers[msg.HeaderEdited].(string)
	if what != "body (12 bytes, was 13); headers set: n, region; headers removed: gone" {
		t.Errorf("edit record %q", what)
	}
	if cp.Headers[msg.HeaderEditedBy] != "oncall" || cp.Headers[msg.HeaderOriginalBodyDigest] != msg.BodyDigest([]byte(`{"amount":-5}`)) {
		t.Errorf("stamp %v", cp.Headers)
	}
	if string(m.Body) != `{"amount":-5}` || m.Headers["gone"] != "x" {
		t.Error("the original was changed")
	}

	// Made for another version of the message: refused, nothing built.
	stale := Edit{Body: str(`{}`), ContentType: "text/plain"}
	if _, err := stale.Apply(m, t0); !errors.Is(err, ErrStale) {
		t.Errorf("stale edit: %v", err)
	}
	bad := Edit{Body: str(`{"amount": }`), ContentType: "application/json"}
	if _, err := bad.Apply(m, t0); err == nil || !strings.Contains(err.Error(), "not valid JSON") {
		t.Errorf("bad JSON applied: %v", err)
	}
}
