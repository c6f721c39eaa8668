package main

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	samqp "github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/valyala/fasthttp"

	happ "github.com/hopper-sidecar/hopper/app"
	"github.com/hopper-sidecar/hopper/msg"
)

// The contract loop hands Hopper's header functions the plain maps they
// read: an x-death the broker wrote stays a readable list of tables (not
// set aside as invalid), and the copy goes out as the AMQP client's tables
// again.
func TestContractLoopKeepsXDeathReadable(t *testing.T) {
	d := amqp.Table{
		"x-retry-count": int32(1),
		"x-death": []any{amqp.Table{"queue": "q.retry.100ms", "reason": "expired", "count": int64(1),
			"routing-keys": []any{"q"}}},
	}
	h := plainTable(d)
	m := &msg.Message{Headers: h, MessageID: "m1"}
	in := msg.Read(m, "q", "", m.Timestamp)
	cp := msg.RetryCopy(m, in, in.Retries+1, 503, m.Timestamp)
	if _, set := cp.Headers[msg.HeaderInvalidDeath]; set {
		t.Fatalf("x-death taken for invalid: %v", cp.Headers)
	}
	back := amqpTable(cp.Headers)
	if _, ok := back["x-death"].([]any)[0].(amqp.Table); !ok {
		t.Fatalf("x-death entry published as %T, want amqp.Table", back["x-death"].([]any)[0])
	}
	if err := back.Validate(); err != nil {
		t.Fatalf("copy headers not publishable: %v", err)
	}
	if !reflect.DeepEqual(amqpTable(h)["x-death"], d["x-death"]) {
		t.Errorf("round trip changed x-death: %v", amqpTable(h)["x-death"])
	}
}

// The raw loop's signer signs the Standard Webhooks test vector (the one
// the specification's reference libraries check against) as published.
func TestRawSignerSignsTheTestVector(t *testing.T) {
	file := filepath.Join(t.TempDir(), "whsec")
	if err := os.WriteFile(file, []byte("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := newRawSigner(file)
	if err != nil {
		t.Fatal(err)
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	s.sign(req, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, []byte(`{"test": 2432232314}`))
	req.Header.DisableNormalizing() // the names went in lowercase, as the specification spells them
	for name, want := range map[string]string{
		"webhook-id":        "msg_p5jXN8AQM9LWM0D4loKWxJek",
		"webhook-timestamp": "1614265330",
		"webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
	} {
		if got := string(req.Header.Peek(name)); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
}

// The stream loop's contract form sends what Hopper sends for a message
// read from a stream: its identity, the subscription's queue, and the
// stream and offset it was read at as application headers.
func TestStreamContractHeaders(t *testing.T) {
	sm := &samqp.Message{Data: [][]byte{[]byte("body")}, ApplicationProperties: map[string]any{"tenant": "a"},
		Properties: &samqp.MessageProperties{MessageID: "m-5", ContentType: "application/json"}}
	m := contractMessage(sm, "orders", 5)
	hs, omitted := happ.BuildHeaders(nil, m, msg.Read(m, "orders.bench", "", time.Now()))
	got := map[string]string{}
	for _, h := range hs {
		got[h.Name] = h.Value
	}
	for name, want := range map[string]string{
		"Hopper-Message-Id":             "m-5",
		"Hopper-Queue":                  "orders.bench",
		"Hopper-Attempt":                "1",
		"Hopper-Header-tenant":          "a",
		"Hopper-Header-x-stream":        "orders",
		"Hopper-Header-x-stream-offset": "5",
	} {
		if got[name] != want {
			t.Errorf("%s = %q, want %q (headers %v)", name, got[name], want, got)
		}
	}
	if omitted != 0 || string(m.Body) != "body" || m.ContentType != "application/json" {
		t.Errorf("omitted %d, body %q, content type %q", omitted, m.Body, m.ContentType)
	}
}
