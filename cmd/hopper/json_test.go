package main_test

// -o json on config validate and topology apply/verify: one JSON document
// on standard output, whatever the outcome, and the same exit status as
// the text form.

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

type jsonProblem struct {
	Key, Source, Queue, Message string
}

type validateDoc struct {
	OK     bool `json:"ok"`
	Queues []struct {
		Queue      string   `json:"queue"`
		DelayTiers int      `json:"delayTiers"`
		DLQ        string   `json:"dlq"`
		Routes     []string `json:"routes"`
		Filter     string   `json:"filter"`
	} `json:"queues"`
	Warnings []string      `json:"warnings"`
	Errors   []jsonProblem `json:"errors"`
}

type applyDoc struct {
	OK     bool   `json:"ok"`
	Action string `json:"action"`
	Queues []struct {
		Queue     string   `json:"queue"`
		Queues    []string `json:"queues"`
		Exchanges []string `json:"exchanges"`
	} `json:"queues"`
	Totals *struct{ Queues, Exchanges, Bindings int } `json:"totals"`
	Errors []jsonProblem                              `json:"errors"`
}

// decode requires stdout to be exactly one JSON document.
func decode[T any](t *testing.T, r result) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("stdout is not JSON (%v), exit %d:\n%s\nstderr:\n%s", err, r.code, r.stdout, r.stderr)
	}
	if dec.More() {
		t.Fatalf("stdout holds more than one JSON document:\n%s", r.stdout)
	}
	return v
}

func TestConfigValidateJSON(t *testing.T) {
	r := hopper(t, "config", "validate", "--queue", "orders", "--set", "retry.tiers=1s,5s", "-o", "json")
	doc := decode[validateDoc](t, r)
	if r.code != 0 || !doc.OK || len(doc.Errors) != 0 || len(doc.Queues) != 1 {
		t.Fatalf("exit %d, %+v", r.code, doc)
	}
	if q := doc.Queues[0]; q.Queue != "orders" || q.DelayTiers != 2 || q.DLQ != "orders.dlq" {
		t.Errorf("queue %+v", q)
	}

	// Every problem, each with its key path and the flag it came from.
	file := configFile(t, "queue:\n  type: fifo\nlog:\n  level: loud\n")
	r = hopper(t, "config", "validate", "--config", file, "--set", "app.timeout=-5s", "--prefetch", "many", "-o", "json")
	if r.code != exitDataErr {
		t.Fatalf("exit %d, want %d as with text", r.code, exitDataErr)
	}
	doc = decode[validateDoc](t, r)
	if doc.OK {
		t.Errorf("ok with errors: %+v", doc)
	}
	byKey := map[string]jsonProblem{}
	for _, p := range doc.Errors {
		byKey[p.Key] = p
	}
	for _, key := range []string{"queue.type", "queue.name", "log.level", "app.timeout", "consumer.prefetch"} {
		if _, ok := byKey[key]; !ok {
			t.Errorf("no error with key %s: %+v", key, doc.Errors)
		}
	}
	if p := byKey["app.timeout"]; !strings.Contains(p.Message, "got -5s") {
		t.Errorf("app.timeout: %+v", p)
	}
	if p := byKey["consumer.prefetch"]; p.Source != "--prefetch" || strings.HasPrefix(p.Message, "consumer.prefetch") {
		t.Errorf("consumer.prefetch: %+v", p)
	}
	if p := byKey["queue.type"]; !strings.Contains(p.Message, `"fifo"`) || p.Source != "" {
		t.Errorf("queue.type: %+v", p)
	}

	// A missing file is one error without a key.
	missing := filepath.Join(t.TempDir(), "absent.yaml")
	r = hopper(t, "config", "validate", "--config", missing, "-o", "json")
	doc = decode[validateDoc](t, r)
	if r.code != exitDataErr || doc.OK || len(doc.Errors) != 1 || doc.Errors[0].Message != "config file "+missing+" not found" {
		t.Errorf("exit %d, %+v", r.code, doc)
	}

	if r := hopper(t, "config", "validate", "--queue", "q", "-o", "yaml"); r.code != exitUsage {
		t.Errorf("-o yaml: exit %d, want %d", r.code, exitUsage)
	}
}

func TestTopologyApplyVerifyJSON(t *testing.T) {
	q := queueName(t)
	args := func(sub, queue string, extra ...string) []string {
		return append([]string{"topology", sub, "--broker-url", rabbit.URL(), "--queue", queue, "--set", "retry.tiers=1s,5s", "--log-level", "error", "-o", "json"}, extra...)
	}
	r := hopper(t, args("apply", q)...)
	doc := decode[applyDoc](t, r)
	if r.code != 0 || !doc.OK || doc.Action != "apply" || len(doc.Queues) != 1 || doc.Totals == nil || doc.Totals.Queues != 4 {
		t.Fatalf("apply: exit %d, %+v", r.code, doc)
	}
	got := slices.Clone(doc.Queues[0].Queues)
	want := planned(q)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("apply declared %v, want %v", got, want)
	}
	wantDepths(t, planned(q), nil)

	r = hopper(t, args("verify", q)...)
	doc = decode[applyDoc](t, r)
	if r.code != 0 || !doc.OK || doc.Action != "verify" || doc.Totals == nil || doc.Totals.Queues != 4 {
		t.Fatalf("verify: exit %d, %+v", r.code, doc)
	}

	// A mismatch: same exit status as text, the queue and what differs.
	text := hopper(t, args("verify", q, "--set", "queue.tierType=classic", "-o", "text")...)
	r = hopper(t, args("verify", q, "--set", "queue.tierType=classic")...)
	doc = decode[applyDoc](t, r)
	if r.code == 0 || r.code != text.code {
		t.Errorf("mismatch: exit %d with json, %d with text", r.code, text.code)
	}
	if doc.OK || len(doc.Errors) != 1 || doc.Errors[0].Queue != q || !strings.Contains(doc.Errors[0].Message, q+".retry.1s") {
		t.Errorf("mismatch document %+v", doc)
	}
	if _, err := inspector(t).Depth(q); err != nil {
		t.Errorf("verify changed the broker: %v", err)
	}
}
