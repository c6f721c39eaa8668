package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	happ "github.com/hopper-sidecar/hopper/app"
	hbatch "github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/msg"
)

// deliveries are n messages m-<first>… as the backlog holds them.
func deliveries(first, n int) []amqp.Delivery {
	out := make([]amqp.Delivery, n)
	for i := range out {
		out[i] = amqp.Delivery{MessageId: fmt.Sprintf("m-%d", first+i), ContentType: "application/octet-stream", Body: body(256)}
	}
	return out
}

// post sends body to the app's handler as one request and returns the
// status and the answer's body.
func post(a *app, contentType string, body []byte, headers ...string) (int, string) {
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod(fasthttp.MethodPost)
	ctx.Request.SetRequestURI(appPath)
	ctx.Request.Header.SetContentType(contentType)
	for i := 0; i+1 < len(headers); i += 2 {
		ctx.Request.Header.Set(headers[i], headers[i+1])
	}
	ctx.Request.SetBody(body)
	a.handle(&ctx)
	return ctx.Response.StatusCode(), string(ctx.Response.Body())
}

func newTestApp(m mode, target int64) (*app, *appRun) {
	a := &app{}
	r := newAppRun(m, target, nil)
	a.run.Store(r)
	return a, r
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func TestRawEnvelopeFollowsTheContract(t *testing.T) {
	ds := deliveries(0, 2)
	ds = append(ds, amqp.Delivery{MessageId: `q"1`, ContentType: "application/json", Body: []byte(`{"a":[1,2]}`),
		Headers: amqp.Table{"x-retry-count": int32(2)}})
	ds = append(ds, amqp.Delivery{MessageId: "bad-json", ContentType: "application/json", Body: []byte(`{"a"`)})
	ds = append(ds, amqp.Delivery{MessageId: "empty"})
	b := appendEnvelope(nil, ds)

	var env struct {
		Entries []struct {
			ID              string            `json:"id"`
			Headers         map[string]string `json:"headers"`
			DataContentType string            `json:"datacontenttype"`
			Data            json.RawMessage   `json:"data"`
			DataBase64      *string           `json:"data_base64"`
		} `json:"entries"`
	}
	if err := json.Unmarshal(b, &env); err != nil {
		t.Fatalf("envelope is not JSON: %v\n%s", err, b)
	}
	if len(env.Entries) != len(ds) {
		t.Fatalf("%d entries, want %d", len(env.Entries), len(ds))
	}
	for i, en := range env.Entries {
		d := ds[i]
		if en.ID != d.MessageId || en.Headers[hdrMessageID] != d.MessageId {
			t.Errorf("entry %d: id %q, message id header %q, want %q", i, en.ID, en.Headers[hdrMessageID], d.MessageId)
		}
		retries, _ := asInt(d.Headers["x-retry-count"])
		if want := fmt.Sprint(retries + 1); en.Headers[hdrAttempt] != want {
			t.Errorf("entry %d: attempt %q, want %q", i, en.Headers[hdrAttempt], want)
		}
		isJSON := d.ContentType == "application/json" && json.Valid(d.Body)
		switch {
		case isJSON && (en.DataBase64 != nil || string(en.Data) != string(d.Body)):
			t.Errorf("entry %d: JSON body sent as data %q / data_base64 %v, want data %q", i, en.Data, en.DataBase64, d.Body)
		case !isJSON && (en.Data != nil || en.DataBase64 == nil):
			t.Errorf("entry %d: non-JSON body sent as data %q, want data_base64", i, en.Data)
		case !isJSON:
			got, err := base64.StdEncoding.DecodeString(*en.DataBase64)
			if err != nil || string(got) != string(d.Body) {
				t.Errorf("entry %d: data_base64 decodes to %q (%v), want %q", i, got, err, d.Body)
			}
		}
	}
	if env.Entries[4].DataContentType != "application/octet-stream" {
		t.Errorf("no content type given as %q, want application/octet-stream", env.Entries[4].DataContentType)
	}
}

func TestAppendJSONStringRoundTrips(t *testing.T) {
	for _, s := range []string{"", "m-1", `a"b\c`, "tab\there\nnewline\x01", "ünï"} {
		var got string
		b := appendJSONString(nil, s)
		if err := json.Unmarshal(b, &got); err != nil || got != s {
			t.Errorf("%q encoded as %s decodes to %q (%v)", s, b, got, err)
		}
	}
}

func TestIsJSONType(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/json": true, "Application/JSON; charset=utf-8": true, "application/cloudevents+json": true,
		"application/octet-stream": false, "text/plain": false, "+json": false, "": false,
	} {
		if got := isJSONType(ct); got != want {
			t.Errorf("isJSONType(%q) = %v, want %v", ct, got, want)
		}
	}
}

func TestBatchAppAcksEveryEntryWithAnEmpty200(t *testing.T) {
	a, r := newTestApp(modeBatch, 64)
	for first := 0; first < 64; first += 32 {
		if isClosed(r.done) {
			t.Fatalf("run done after %d of 64 entries", first)
		}
		st, b := post(a, "application/json", appendEnvelope(nil, deliveries(first, 32)))
		if st != fasthttp.StatusOK || b != "" {
			t.Fatalf("answer %d %q, want an empty 200", st, b)
		}
	}
	if !isClosed(r.done) || r.final.Load() != 64 || r.batches.Load() != 2 || r.entries.Load() != 64 {
		t.Errorf("done %v, final %d, batches %d, entries %d; want done, 64, 2, 64", isClosed(r.done), r.final.Load(), r.batches.Load(), r.entries.Load())
	}
}

func TestBatchRetryAppAnswers503OnceForEveryTenth(t *testing.T) {
	a, r := newTestApp(modeBatchRetry, 25)
	type results struct {
		Results []struct {
			ID     string `json:"id"`
			Status int    `json:"status"`
		} `json:"results"`
	}
	st, b := post(a, "application/json", appendEnvelope(nil, deliveries(0, 25)))
	var res results
	if err := json.Unmarshal([]byte(b), &res); err != nil || st != fasthttp.StatusOK {
		t.Fatalf("answer %d %q (%v), want 200 with a results body", st, b, err)
	}
	if len(res.Results) != 25 {
		t.Fatalf("%d results, want 25", len(res.Results))
	}
	for i, e := range res.Results {
		want := fasthttp.StatusOK
		if i%10 == 0 {
			want = fasthttp.StatusServiceUnavailable
		}
		if e.ID != fmt.Sprintf("m-%d", i) || e.Status != want {
			t.Errorf("result %d: %s %d, want m-%d %d", i, e.ID, e.Status, i, want)
		}
	}
	if r.final.Load() != 22 || isClosed(r.done) {
		t.Fatalf("final %d (done %v) after the first answer, want 22 and not done", r.final.Load(), isClosed(r.done))
	}
	// Seen a second time, in a batch of their own: 200.
	again := []amqp.Delivery{deliveries(0, 1)[0], deliveries(10, 1)[0]}
	_, b = post(a, "application/json", appendEnvelope(nil, again))
	res = results{}
	if err := json.Unmarshal([]byte(b), &res); err != nil || len(res.Results) != 2 || res.Results[0].Status != 200 || res.Results[1].Status != 200 {
		t.Fatalf("second answer %q (%v), want both 200", b, err)
	}
	// m-20, sent alone as a single message the second time: 200.
	if st, _ := post(a, "application/octet-stream", body(256), hdrMessageID, "m-20", hdrAttempt, "2"); st != fasthttp.StatusOK {
		t.Fatalf("m-20 alone: %d, want 200", st)
	}
	if !isClosed(r.done) || r.final.Load() != 25 || r.entries503.Load() != 3 {
		t.Errorf("done %v, final %d, 503s %d; want done, 25, 3", isClosed(r.done), r.final.Load(), r.entries503.Load())
	}
}

func TestBatchRetryAppAnswersASingleMessageAlone(t *testing.T) {
	a, r := newTestApp(modeBatchRetry, 20)
	if st, _ := post(a, "application/octet-stream", body(256), hdrMessageID, "m-10", hdrAttempt, "1"); st != fasthttp.StatusServiceUnavailable {
		t.Errorf("m-10 first seen alone: %d, want 503", st)
	}
	if st, _ := post(a, "application/octet-stream", body(256), hdrMessageID, "m-11", hdrAttempt, "1"); st != fasthttp.StatusOK {
		t.Errorf("m-11 alone: %d, want 200", st)
	}
	if r.final.Load() != 1 {
		t.Errorf("final %d, want 1", r.final.Load())
	}
}

func TestBatchAppStopsTheRunOnABrokenEnvelope(t *testing.T) {
	b64 := base64.StdEncoding.EncodeToString([]byte("x"))
	for name, tc := range map[string]struct{ body, why string }{
		"not JSON":        {`{"entries":[`, "batch request"},
		"no entries":      {`{"entries":[]}`, "no entries"},
		"no id":           {`{"entries":[{"headers":{"Hopper-Message-Id":"m-1","Hopper-Attempt":"1"},"data_base64":""}]}`, "without an id"},
		"no message id":   {`{"entries":[{"id":"m-1","headers":{"Hopper-Attempt":"1"},"data_base64":""}]}`, "Hopper-Message-Id"},
		"no attempt":      {`{"entries":[{"id":"m-1","headers":{"Hopper-Message-Id":"m-1"},"data_base64":""}]}`, "Hopper-Attempt"},
		"no data":         {`{"entries":[{"id":"m-1","headers":{"Hopper-Message-Id":"m-1","Hopper-Attempt":"1"}}]}`, "exactly one"},
		"both data":       {`{"entries":[{"id":"m-1","headers":{"Hopper-Message-Id":"m-1","Hopper-Attempt":"1"},"data":1,"data_base64":"` + b64 + `"}]}`, "exactly one"},
		"bad data_base64": {`{"entries":[{"id":"m-1","headers":{"Hopper-Message-Id":"m-1","Hopper-Attempt":"1"},"data_base64":"!!"}]}`, "data_base64"},
	} {
		t.Run(name, func(t *testing.T) {
			a, r := newTestApp(modeBatch, 10)
			st, _ := post(a, "application/json", []byte(tc.body))
			if st != fasthttp.StatusBadRequest || !isClosed(r.broken) || !strings.Contains(r.brokenWhy, tc.why) || r.final.Load() != 0 {
				t.Errorf("answer %d, broken %v (%q), final %d; want 400, broken saying %q, 0", st, isClosed(r.broken), r.brokenWhy, r.final.Load(), tc.why)
			}
		})
	}
}

// hoppersBatch is the batch request Hopper's app client sends for ds, read
// from queue at now: its body and its headers, as an app receives them.
func hoppersBatch(t *testing.T, ds []amqp.Delivery, queue string, now time.Time) ([]byte, http.Header) {
	t.Helper()
	var body []byte
	var hdr http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ = io.ReadAll(r.Body)
		hdr = r.Header.Clone()
	}))
	defer srv.Close()
	c := happ.NewClient(happ.ClientOptions{URL: srv.URL, Timeout: 5 * time.Second})
	r := &hbatch.Request{Messages: make([]*msg.Message, len(ds)), Infos: make([]msg.Info, len(ds)), Traces: make([]trace.SpanContext, len(ds))}
	for i := range ds {
		r.Messages[i] = deliveryMessage(&ds[i])
		r.Infos[i] = msg.Read(r.Messages[i], queue, "", now)
	}
	if a := c.DeliverBatch(context.Background(), r); a.Unread != nil || len(a.Entries) != len(ds) {
		t.Fatalf("Hopper's batch request: %d outcomes, unread %v", len(a.Entries), a.Unread)
	}
	return body, hdr
}

// The contract loop sends, for the same deliveries, the batch request
// Hopper sends: the same body byte for byte (entry ids made unique or
// derived from the content, every header a request of its own would
// carry, a deadline from an expiration, content types cleaned, JSON
// bodies as data) and the same batch headers; its storage, kept from one
// batch to the next, leaves nothing of the first batch in the second. The
// bench app takes the body.
func TestContractEnvelopeIsHoppers(t *testing.T) {
	const queue = "orders.bench"
	now := time.Now()
	ds := []amqp.Delivery{
		{MessageId: "m-1", ContentType: "application/octet-stream", Exchange: "ex", RoutingKey: "orders", Body: body(64),
			Headers: amqp.Table{"tenant": "a", "x-retry-count": int32(2), "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}},
		{MessageId: "m-1", ContentType: "application/json", CorrelationId: "c-9", Type: "order.created", AppId: "shop",
			Timestamp: time.Unix(1700000000, 0), Redelivered: true, Body: []byte(`{"a":[1,2]}`)},
		{ContentType: "text/plain\x01", RoutingKey: "orders", Body: []byte("no id"),
			Headers: amqp.Table{"x-death": []any{amqp.Table{"queue": "orders.retry", "reason": "expired", "count": int64(1)}}}},
		{MessageId: "m-4", Expiration: "60000", Body: []byte("no content type")},
	}
	cb := &contractBatch{queue: queue}
	var buf []byte
	for _, batch := range [][]amqp.Delivery{ds, ds[2:]} {
		want, hdr := hoppersBatch(t, batch, queue, now)
		buf = cb.appendEnvelope(buf[:0], batch, now)
		if !bytes.Equal(buf, want) {
			t.Fatalf("batch of %d: contract envelope\n%s\nHopper's\n%s", len(batch), buf, want)
		}
		req := fasthttp.AcquireRequest()
		cb.setHeaders(req, len(batch))
		for _, name := range []string{happ.HdrBatchSize, happ.HdrQueue} {
			if got := string(req.Header.Peek(name)); got != hdr.Get(name) || got == "" {
				t.Errorf("batch of %d: %s = %q, Hopper's %q", len(batch), name, got, hdr.Get(name))
			}
		}
		fasthttp.ReleaseRequest(req)
		if ct := hdr.Get("Content-Type"); ct != "application/json" {
			t.Errorf("Hopper's batch content type %q, the loop's application/json", ct)
		}
	}
	// Hopper's own headers, the forwarded application header and trace
	// context are in the envelope, as Hopper builds them.
	var env struct {
		Entries []struct {
			ID      string            `json:"id"`
			Headers map[string]string `json:"headers"`
		} `json:"entries"`
	}
	buf = cb.appendEnvelope(buf[:0], ds, now)
	if err := json.Unmarshal(buf, &env); err != nil || len(env.Entries) != len(ds) {
		t.Fatalf("envelope %s: %d entries (%v)", buf, len(env.Entries), err)
	}
	if env.Entries[3].Headers["Hopper-Deadline"] == "" {
		t.Errorf("entry 3: no Hopper-Deadline from its expiration: %v", env.Entries[3].Headers)
	}
	for name, want := range map[string]string{
		"Hopper-Message-Id": "m-1", "Hopper-Attempt": "3", "Hopper-Queue": queue, "Hopper-Routing-Key": "orders",
		"Hopper-Exchange": "ex", "Hopper-Header-tenant": "a", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	} {
		if got := env.Entries[0].Headers[name]; got != want {
			t.Errorf("entry 0: %s = %q, want %q", name, got, want)
		}
	}
	if env.Entries[1].ID != "m-1#2" || env.Entries[2].ID == "" {
		t.Errorf("entry ids %q, %q: want m-1#2 and one derived from the content", env.Entries[1].ID, env.Entries[2].ID)
	}
	// The bench app wants every entry's Hopper-Message-Id, which Hopper
	// sends for a message that has an id (every one of the backlog's).
	withIDs := []amqp.Delivery{ds[0], ds[1], ds[3]}
	a, r := newTestApp(modeBatch, int64(len(withIDs)))
	buf = cb.appendEnvelope(buf[:0], withIDs, now)
	if st, b := post(a, "application/json", buf); st != fasthttp.StatusOK || b != "" || r.entries.Load() != int64(len(withIDs)) {
		t.Errorf("bench app answered %d %q with %d entries (broken: %q), want an empty 200 for %d", st, b, r.entries.Load(), r.brokenWhy, len(withIDs))
	}
}
