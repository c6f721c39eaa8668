package batch

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"testing"
	"unicode/utf8"

	"github.com/hopper-sidecar/hopper/retry"
)

// FuzzRead: whatever the app answers, every entry gets an outcome, and an
// answer that cannot be read acks nothing. Whatever the message ids and
// bodies (bytes that are not UTF-8 among them), the request is JSON text a
// strict parser takes, each entry comes back with its id and body as
// written, and an app that echoes the ids it read has each result settle
// its own entry.
func FuzzRead(f *testing.F) {
	for _, s := range []string{
		``, `{"results":[{"id":"a","status":200}]}`, `{"batchItemFailures":[{"itemIdentifier":"b"}]}`,
		`{"statuses":[{"entryId":"a","status":"DROP"}]}`, `{"results":[{"id":"a","status":503,"retryAfter":"Wed, 21 Oct 2015 07:28:00 GMT"}]}`,
		`{"results":null}`, `[]`, `{"results":[{"id":"a","status":1e400}]}`,
	} {
		f.Add([]byte(s), 200, "a", "b", []byte(`{"n":1}`))
	}
	f.Add([]byte(`{"results":[{"id":"m\\xff","status":200},{"id":"m\\xfe","status":503}]}`), 200, "m\xff", "m\xfe", []byte("{\"note\":\"caf\xe9\"}"))
	f.Add([]byte(`{"statuses":[{"entryId":"\ufffd","status":"SUCCESS"}]}`), 200, "\xed\xa0\x80", `\xed\xa0\x80`, []byte("\"\xff\""))
	f.Add([]byte(`{"batchItemFailures":[{"itemIdentifier":"a#2"}]}`), 200, "a\xc3", "a\xc3\xa9", []byte(" [\"\xc0\xaf\"] "))
	f.Fuzz(func(t *testing.T, answer []byte, status int, id1, id2 string, body []byte) {
		raw := []string{id1, id2, id1}
		ids := IDs(len(raw), func(i int) string { return raw[i] })
		whole := retry.Outcome{Kind: retry.Response, Status: status}
		outs, err := Read(whole, answer, ids, now)
		if len(outs) != len(ids) {
			t.Fatalf("%d outcomes for %d entries", len(outs), len(ids))
		}
		if err != nil {
			for i, o := range outs {
				if a := decide(t, o); a != retry.Retry {
					t.Fatalf("unreadable answer %q: entry %d decided %s", answer, i, a)
				}
			}
		}
		roundTrip(t, raw, ids, body)
	})
}

// roundTrip writes a batch of messages with ids raw (given ids by IDs) and
// one body each under different content types, reads it back as a strict
// app would, and answers each entry by the id it read.
func roundTrip(t *testing.T, raw, ids []string, body []byte) {
	t.Helper()
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		if seen[id] || !utf8.ValidString(id) {
			t.Fatalf("ids %q of %q: want each unique and UTF-8", ids, raw)
		}
		seen[id] = true
	}
	types := []string{"application/json", "text/plain", "application/cloudevents+json; charset=utf-8"}
	entries := make([]Entry, len(ids))
	for i, id := range ids {
		entries[i] = Entry{ID: id, Fields: []Field{{"Hopper-Message-Id", raw[i]}}, ContentType: types[i%len(types)], Body: body}
	}
	req := AppendJSON(nil, entries)
	if !utf8.Valid(req) || !json.Valid(req) {
		t.Fatalf("the request is not JSON text: %q", req)
	}
	var got struct {
		Entries []struct {
			ID         string          `json:"id"`
			Data       json.RawMessage `json:"data"`
			DataBase64 *string         `json:"data_base64"`
		} `json:"entries"`
	}
	if err := json.Unmarshal(req, &got); err != nil || len(got.Entries) != len(ids) {
		t.Fatalf("request %q: %d entries, %v", req, len(got.Entries), err)
	}
	type result struct {
		ID     string `json:"id"`
		Status int    `json:"status"`
	}
	statuses := []int{200, 503, 422}
	var res struct {
		Results []result `json:"results"`
	}
	for i, e := range got.Entries {
		if e.ID != ids[i] {
			t.Fatalf("entry %d: id %q read back as %q", i, ids[i], e.ID)
		}
		switch {
		case (e.Data == nil) == (e.DataBase64 == nil):
			t.Fatalf("entry %d: want exactly one of data and data_base64: %q", i, req)
		case e.Data != nil && !bytes.Equal(e.Data, bytes.Trim(body, " \t\r\n")):
			t.Fatalf("entry %d: data %q, body %q", i, e.Data, body)
		case e.DataBase64 != nil:
			if b, err := base64.StdEncoding.DecodeString(*e.DataBase64); err != nil || !bytes.Equal(b, body) {
				t.Fatalf("entry %d: data_base64 %q, body %q (%v)", i, *e.DataBase64, body, err)
			}
		}
		res.Results = append(res.Results, result{ID: e.ID, Status: statuses[i%len(statuses)]})
	}
	ce := AppendCloudEvents(nil, entries)
	var events []struct {
		ID string `json:"id"`
	}
	if !utf8.Valid(ce) || json.Unmarshal(ce, &events) != nil || len(events) != len(ids) {
		t.Fatalf("the CloudEvents request is not JSON text: %q", ce)
	}
	for i, e := range events {
		if e.ID != ids[i] {
			t.Fatalf("event %d: id %q read back as %q", i, ids[i], e.ID)
		}
	}
	answer, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	outs, err := Read(ok200(), answer, ids, now)
	if err != nil {
		t.Fatalf("the echo %s of ids %q: %v", answer, ids, err)
	}
	for i, o := range outs {
		if o.Status != statuses[i%len(statuses)] {
			t.Fatalf("entry %q settled by status %d, not its own %d", ids[i], o.Status, statuses[i%len(statuses)])
		}
	}
}
