package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/retry"
)

// scripted is a batch entry as Hopper writes it: the message's headers,
// its application header demo-script under the name Hopper gives it.
func scripted(id, script string, attempt string) batch.Entry {
	return batch.Entry{
		ID: id,
		Fields: []batch.Field{
			{Name: "Hopper-Message-Id", Value: id}, {Name: "Hopper-Attempt", Value: attempt},
			{Name: "Hopper-Requeue-Count", Value: "0"}, {Name: "Hopper-Routing-Key", Value: "demo.batch"},
			{Name: "Hopper-Header-demo-script", Value: script},
		},
		ContentType: "application/json",
		Body:        []byte(`{"order":"` + id + `"}`),
	}
}

// TestBatchAnswersEachEntryByItsScript: a batch written by Hopper's
// encoder gets, per entry, the answer the entry's own script gives at the
// entry's own attempt, in a results body Hopper reads; /stats records
// every entry with the size of its batch.
func TestBatchAnswersEachEntryByItsScript(t *testing.T) {
	a := &app{reqLog: log.New(io.Discard, "", 0), stats: newStats()}
	srv := httptest.NewServer(http.HandlerFunc(a.handleBatch))
	defer srv.Close()

	entries := []batch.Entry{
		scripted("ok", "200", "1"),
		scripted("flaky", "503,200", "1"),
		scripted("flaky-again", "503,200", "2"),
		scripted("too-early", "425,200", "1"),
		scripted("typo", "20x", "1"),
	}
	resp, err := http.Post(srv.URL, batch.ContentTypeJSON, bytes.NewReader(batch.AppendJSON(nil, entries)))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"ok", "flaky", "flaky-again", "too-early", "typo"}
	outs, err := batch.Read(retry.Outcome{Kind: retry.Response, Status: resp.StatusCode}, body, ids, time.Now())
	if err != nil {
		t.Fatalf("%s %s: Hopper cannot read it: %v", resp.Status, body, err)
	}
	want := []int{200, 503, 200, 425, 400}
	for i, o := range outs {
		if o.Status != want[i] {
			t.Errorf("%s: status %d, want %d (%s)", ids[i], o.Status, want[i], body)
		}
	}
	if !outs[3].HasRetryAfter || outs[3].RetryAfter != time.Second {
		t.Errorf("too-early: Retry-After %v (given %t), want 1s as a single 425 has", outs[3].RetryAfter, outs[3].HasRetryAfter)
	}
	if outs[4].Error == "" {
		t.Errorf("typo: a 400 without the reason: %s", body)
	}

	rec := httptest.NewRecorder()
	a.getStats(rec, httptest.NewRequest(http.MethodGet, "/stats", nil))
	var st struct {
		ByMessage map[string]struct {
			History []entry `json:"history"`
		} `json:"by_message"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		h := st.ByMessage[id].History
		if len(h) != 1 || h[0].Status != want[i] || h[0].Batch != len(entries) {
			t.Errorf("/stats for %s: %+v, want one answer %d in a batch of %d", id, h, want[i], len(entries))
		}
	}
}

// TestBatchRefusesWhatIsNoEnvelope: a body that is not a batch envelope
// (a single message sent to the batch path) gets 400 for the whole
// request.
func TestBatchRefusesWhatIsNoEnvelope(t *testing.T) {
	a := &app{reqLog: log.New(io.Discard, "", 0), stats: newStats()}
	rec := httptest.NewRecorder()
	a.handleBatch(rec, httptest.NewRequest(http.MethodPost, "/batch", bytes.NewReader([]byte("not json"))))
	if rec.Code != http.StatusBadRequest {
		t.Errorf("answered %d, want 400", rec.Code)
	}
}
