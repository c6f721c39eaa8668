package batch

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

var now = time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)

func ok200() retry.Outcome { return retry.Outcome{Kind: retry.Response, Status: 200} }

// decide runs an outcome through the default outcome table, so the tests
// say what happens to the message, not only what the outcome holds.
func decide(t *testing.T, o retry.Outcome) retry.Action {
	t.Helper()
	p := &retry.Policy{MaxAttempts: 5, Tiers: []time.Duration{time.Second}, Table: retry.DefaultTable(), MaxRequeues: 5, MaxHold: time.Second}
	return retry.Decide(p, retry.State{}, o, now, func() float64 { return 0.5 }).Action
}

func actions(t *testing.T, outs []retry.Outcome) []string {
	t.Helper()
	var s []string
	for _, o := range outs {
		s = append(s, decide(t, o).String())
	}
	return s
}

func TestReadShapes(t *testing.T) {
	ids := []string{"a", "b", "c"}
	cases := []struct {
		name string
		body string
		want []string
	}{
		{"empty body acks all", "", []string{"ack", "ack", "ack"}},
		{"whitespace body acks all", " \n", []string{"ack", "ack", "ack"}},
		{"hopper results", `{"results":[{"id":"a","status":200},{"id":"b","status":503},{"id":"c","status":422}]}`,
			[]string{"ack", "retry", "dlq"}},
		{"hopper action and 425", `{"results":[{"id":"a","status":200,"action":"dlq"},{"id":"b","status":425},{"id":"c","status":204}]}`,
			[]string{"dlq", "requeue", "ack"}},
		{"missing entry is retried", `{"results":[{"id":"a","status":200},{"id":"c","status":200}]}`,
			[]string{"ack", "retry", "ack"}},
		{"lambda", `{"batchItemFailures":[{"itemIdentifier":"b"}]}`, []string{"ack", "retry", "ack"}},
		{"lambda none failed", `{"batchItemFailures":[]}`, []string{"ack", "ack", "ack"}},
		{"dapr", `{"statuses":[{"entryId":"a","status":"SUCCESS"},{"entryId":"b","status":"RETRY"},{"entryId":"c","status":"DROP"}]}`,
			[]string{"ack", "retry", "dlq"}},
		{"dapr missing entry is retried", `{"statuses":[{"entryId":"a","status":"SUCCESS"}]}`, []string{"ack", "retry", "retry"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			outs, err := Read(ok200(), []byte(c.body), ids, now)
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
			if got := strings.Join(actions(t, outs), ","); got != strings.Join(c.want, ",") {
				t.Fatalf("actions %s, want %s", got, strings.Join(c.want, ","))
			}
		})
	}
}

func TestReadMalformedRetriesAll(t *testing.T) {
	ids := []string{"a", "b"}
	for _, body := range []string{
		`not json`,
		`[1,2]`,
		`{}`,
		`{"results":[{"id":"a","status":200}]} {"x":1}`,
		`{"results":[{"id":"a","status":200}],"statuses":[]}`,
		`{"results":[{"id":"zz","status":200}]}`,
		`{"results":[{"id":"a","status":200},{"id":"a","status":500}]}`,
		`{"results":[{"status":200}]}`,
		`{"results":[{"id":"a","status":700}]}`,
		`{"results":[{"id":"a","status":200,"action":"explode"}]}`,
		`{"results":[{"id":"a","status":503,"retryAfter":{}}]}`,
		`{"statuses":[{"entryId":"a","status":"MAYBE"}]}`,
		`{"batchItemFailures":[{"itemIdentifier":"nope"}]}`,
		`{"batchItemFailures":[{}]}`,
	} {
		outs, err := Read(ok200(), []byte(body), ids, now)
		if err == nil {
			t.Errorf("%s: no error", body)
			continue
		}
		for i, a := range actions(t, outs) {
			if a != "retry" {
				t.Errorf("%s: entry %d %s, want retry", body, i, a)
			}
		}
		if !strings.Contains(outs[0].Error, "could not be read") {
			t.Errorf("%s: error %q does not say the answer was unreadable", body, outs[0].Error)
		}
	}
}

func TestReadWholeOutcomeAppliesToEach(t *testing.T) {
	whole := retry.Outcome{Kind: retry.Response, Status: 503, RetryAfter: 5 * time.Second, HasRetryAfter: true, Error: "HTTP 503"}
	// A body on a non-2xx is not a results body.
	outs, err := Read(whole, []byte(`{"results":[{"id":"a","status":200}]}`), []string{"a", "b"}, now)
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range outs {
		if o != whole {
			t.Fatalf("entry %d: %+v, want the whole outcome", i, o)
		}
	}
	to := retry.Outcome{Kind: retry.Timeout, Error: "timeout"}
	outs, _ = Read(to, nil, []string{"a"}, now)
	if outs[0] != to {
		t.Fatalf("timeout not applied: %+v", outs[0])
	}
}

func TestReadRetryAfterAndError(t *testing.T) {
	outs, err := Read(ok200(), []byte(`{"results":[{"id":"a","status":429,"retryAfter":7,"error":"slow down"},{"id":"b","status":503,"retryAfter":"3"}]}`), []string{"a", "b"}, now)
	if err != nil {
		t.Fatal(err)
	}
	if !outs[0].HasRetryAfter || outs[0].RetryAfter != 7*time.Second || outs[0].Error != "HTTP 429: slow down" {
		t.Fatalf("entry a: %+v", outs[0])
	}
	if !outs[1].HasRetryAfter || outs[1].RetryAfter != 3*time.Second || outs[1].Status != 503 {
		t.Fatalf("entry b: %+v", outs[1])
	}
}

func TestSplits(t *testing.T) {
	cases := []struct {
		o    retry.Outcome
		want bool
	}{
		{retry.Outcome{Kind: retry.Timeout}, true},
		{retry.Outcome{Kind: retry.Cut}, true},
		{retry.Outcome{Kind: retry.Unavailable, Cut: true}, true},
		{retry.Outcome{Kind: retry.Unavailable, Cut: true, Crashed: true}, true},
		{retry.Outcome{Kind: retry.Unavailable, Cut: true, CrashSuspect: true}, true},
		{retry.Outcome{Kind: retry.Response, Status: 0}, true},
		{retry.Outcome{Kind: retry.Response, Status: 503}, false},
		{retry.Outcome{Kind: retry.Response, Status: 200}, false},
		{retry.Outcome{Kind: retry.Unavailable}, false},
		{retry.Outcome{Kind: retry.Unavailable, Refused: true}, false},
		{retry.Outcome{Kind: retry.Unavailable, Cut: true, CutOff: true}, false},
	}
	for _, c := range cases {
		if got := Splits(c.o); got != c.want {
			t.Errorf("Splits(%+v) = %v, want %v", c.o, got, c.want)
		}
	}
	if Half(32) != 16 || Half(3) != 2 || Half(2) != 1 {
		t.Fatal("Half")
	}
}

func TestLimits(t *testing.T) {
	l := Limits{MaxMessages: 3, MaxBytes: 100}
	if !l.Fits(0, 0, 500) {
		t.Fatal("a first message larger than MaxBytes must go alone, not be refused")
	}
	if l.Fits(1, 60, 50) {
		t.Fatal("a message past MaxBytes joined")
	}
	if !l.Fits(2, 50, 50) || l.Fits(3, 10, 1) {
		t.Fatal("count bound")
	}
	if !l.Full(3, 0) || !l.Full(1, 100) || l.Full(2, 99) {
		t.Fatal("Full")
	}
	if !Alone(msg.Info{Crashes: 1}) || !Alone(msg.Info{Suspect: true}) || Alone(msg.Info{Retries: 3}) {
		t.Fatal("Alone")
	}
}

func TestIDsUnique(t *testing.T) {
	base := []string{"a", "b", "a", "a", "a#2"}
	ids := IDs(len(base), func(i int) string { return base[i] })
	want := "a,b,a#2,a#3,a#2#2"
	if got := strings.Join(ids, ","); got != want {
		t.Fatalf("ids %s, want %s", got, want)
	}
}

func TestAppendJSON(t *testing.T) {
	entries := []Entry{
		{ID: "m-1", Fields: []Field{{"Hopper-Attempt", "1"}, {"Hopper-Header-Note", "say \"hi\"\x01"}}, ContentType: "application/json", Body: []byte(`{"n":1}`)},
		{ID: "m-2", Fields: []Field{{"Hopper-Attempt", "2"}}, ContentType: "text/plain", Body: []byte("bin\xff\x00")},
		{ID: "m-3", ContentType: "application/json", Body: []byte(`{broken`)},
	}
	b := AppendJSON(nil, entries)
	var got struct {
		Entries []struct {
			ID              string            `json:"id"`
			Headers         map[string]string `json:"headers"`
			DataContentType string            `json:"datacontenttype"`
			Data            json.RawMessage   `json:"data"`
			DataBase64      *string           `json:"data_base64"`
		} `json:"entries"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, b)
	}
	if len(got.Entries) != 3 {
		t.Fatalf("entries %d", len(got.Entries))
	}
	e := got.Entries[0]
	if e.ID != "m-1" || e.Headers["Hopper-Attempt"] != "1" || e.Headers["Hopper-Header-Note"] != "say \"hi\"\x01" || string(e.Data) != `{"n":1}` || e.DataBase64 != nil {
		t.Fatalf("entry 1: %+v", e)
	}
	for i, want := range [][]byte{[]byte("bin\xff\x00"), []byte(`{broken`)} {
		e := got.Entries[i+1]
		if e.DataBase64 == nil || e.Data != nil {
			t.Fatalf("entry %d: want data_base64 only: %+v", i+2, e)
		}
		body, err := base64.StdEncoding.DecodeString(*e.DataBase64)
		if err != nil || string(body) != string(want) {
			t.Fatalf("entry %d: body %q, %v", i+2, body, err)
		}
	}
}

func TestAppendCloudEvents(t *testing.T) {
	entries := []Entry{{
		ID: "m-1",
		Fields: []Field{
			{"ce-specversion", "1.0"}, {"ce-id", "other"}, {"ce-source", "/rabbitmq/queue/q"}, {"ce-type", "t"},
			{"Hopper-Attempt", "2"}, {"Hopper-Header-X-Tenant", "acme"}, {"Hopper-Header-XTenant", "dup"},
			{"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		},
		ContentType: "application/cloudevents+json; charset=utf-8", Body: []byte(`[1]`),
	}}
	b := AppendCloudEvents(nil, entries)
	var got []map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, b)
	}
	e := got[0]
	want := map[string]any{
		"specversion": "1.0", "id": "m-1", "source": "/rabbitmq/queue/q", "type": "t",
		"hopperattempt": "2", "hopperheaderxtenant": "acme",
		"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	}
	for k, v := range want {
		if e[k] != v {
			t.Errorf("%s = %v, want %v", k, e[k], v)
		}
	}
	if d, ok := e["data"].([]any); !ok || len(d) != 1 {
		t.Errorf("data %v", e["data"])
	}
}

func BenchmarkAppendJSON(b *testing.B) {
	entries := make([]Entry, 32)
	for i := range entries {
		entries[i] = Entry{ID: "m-" + string(rune('a'+i)), Fields: []Field{{"Hopper-Attempt", "1"}, {"Hopper-Queue", "orders"}, {"Hopper-Message-Id", "x"}},
			ContentType: "application/json", Body: []byte(`{"order":12345,"items":["a","b","c"],"note":"` + strings.Repeat("x", 200) + `"}`)}
	}
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendJSON(buf[:0], entries)
	}
}

func TestUnsplitChargesNoCrash(t *testing.T) {
	o := Unsplit(retry.Outcome{Kind: retry.Unavailable, Cut: true, Crashed: true})
	if o.Crashed || !o.CrashSuspect {
		t.Fatalf("%+v: a crash under a batch must not be charged to each message", o)
	}
	to := retry.Outcome{Kind: retry.Timeout}
	if Unsplit(to) != to {
		t.Fatal("a timeout is each message's")
	}
}

// TestReadDeadLetterRecord: what a DLQ copy records for an entry of each
// answer shape. Its status (x-final-status-code, and x-last-status-code on
// a retry's copy) is the status Hopper's own shape gives the entry; the
// Lambda and Dapr shapes give none, so it is the whole response's, and
// the error (x-final-error) says what the answer said of the entry.
func TestReadDeadLetterRecord(t *testing.T) {
	p := &retry.Policy{MaxAttempts: 3, Tiers: []time.Duration{time.Second}, Table: retry.DefaultTable(), MaxRequeues: 5, MaxHold: time.Second}
	last := retry.State{Retries: 2} // the third attempt, the last one
	cases := []struct {
		name, body string
		st         retry.State
		action     retry.Action
		reason     string
		status     int
		err        string
	}{
		{"hopper 422", `{"results":[{"id":"a","status":422,"error":"bad qty"}]}`, retry.State{}, retry.DLQ, retry.ReasonNonRetriable, 422, "HTTP 422: bad qty"},
		{"hopper action dlq", `{"results":[{"id":"a","status":200,"action":"dlq"}]}`, retry.State{}, retry.DLQ, retry.ReasonAppAction, 200, ""},
		{"hopper 503 last", `{"results":[{"id":"a","status":503}]}`, last, retry.DLQ, retry.ReasonMaxAttempts, 503, "HTTP 503"},
		{"dapr drop", `{"statuses":[{"entryId":"a","status":"DROP"}]}`, retry.State{}, retry.DLQ, retry.ReasonAppAction, 200, whyDrop},
		{"dapr retry", `{"statuses":[{"entryId":"a","status":"RETRY"}]}`, retry.State{}, retry.Retry, "", 200, whyRetry},
		{"dapr retry last", `{"statuses":[{"entryId":"a","status":"RETRY"}]}`, last, retry.DLQ, retry.ReasonMaxAttempts, 200, whyRetry},
		{"lambda listed last", `{"batchItemFailures":[{"itemIdentifier":"a"}]}`, last, retry.DLQ, retry.ReasonMaxAttempts, 200, whyListed},
		{"left out last", `{"results":[]}`, last, retry.DLQ, retry.ReasonMaxAttempts, 200, whyMissing},
	}
	for _, c := range cases {
		outs, err := Read(ok200(), []byte(c.body), []string{"a"}, now)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		o := outs[0]
		d := retry.Decide(p, c.st, o, now, func() float64 { return 0.5 })
		if d.Action != c.action || d.Reason != c.reason || o.Status != c.status || o.Error != c.err {
			t.Errorf("%s: %s (reason %q), status %d, error %q; want %s (reason %q), status %d, error %q",
				c.name, d.Action, d.Reason, o.Status, o.Error, c.action, c.reason, c.status, c.err)
		}
	}
}

// A 401 in one entry's result of a batch the app took with a 2xx came
// with credentials the app accepted for the whole request: it speaks of
// that message, is decided as the table's 4xx, and pauses nothing; a 401
// for the whole request still does.
func TestReadEntryUnauthorizedIsTheMessages(t *testing.T) {
	body := []byte(`{"results":[{"id":"a","status":200},{"id":"b","status":401,"error":"not your order"}]}`)
	outs, err := Read(ok200(), body, []string{"a", "b"}, now)
	if err != nil {
		t.Fatal(err)
	}
	if got := actions(t, outs); strings.Join(got, ",") != "ack,dlq" {
		t.Errorf("entries decided %v, want ack,dlq", got)
	}
	p := &retry.Policy{MaxAttempts: 5, Tiers: []time.Duration{time.Second}, Table: retry.DefaultTable(), MaxRequeues: 5, MaxHold: time.Second}
	if d := retry.Decide(p, retry.State{}, outs[1], now, func() float64 { return 0.5 }); d.Pause || d.Reason != retry.ReasonNonRetriable || d.Retries != 1 {
		t.Errorf("an entry's 401: %+v, want a non-retriable DLQ move that pauses nothing", d)
	}
	whole := retry.Outcome{Kind: retry.Response, Status: 401}
	outs, err = Read(whole, nil, []string{"a", "b"}, now)
	if err != nil {
		t.Fatal(err)
	}
	if d := retry.Decide(p, retry.State{}, outs[0], now, func() float64 { return 0.5 }); !d.Pause {
		t.Errorf("a 401 for the whole request: %+v, want a pause", d)
	}
}
