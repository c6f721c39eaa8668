package app_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/hopper-sidecar/hopper/app"
	"github.com/hopper-sidecar/hopper/msg"
)

// Benchmarks for the per-delivery header work (run with
// go test -run '^$' -bench . -benchmem ./app/).

// plainMessage is what the throughput benchmark sends: properties only.
func plainMessage() (*msg.Message, msg.Info) {
	return &msg.Message{
			RoutingKey:  "orders",
			MessageID:   "m-12345",
			ContentType: "application/octet-stream",
			Headers:     map[string]any{},
		}, msg.Info{
			Queue: "orders", RoutingKey: "orders", Attempt: 1,
		}
}

// retriedMessage is a message on its second attempt with trace context and
// a few application headers, as a typical production message looks.
func retriedMessage() (*msg.Message, msg.Info) {
	return &msg.Message{
			RoutingKey:    "orders",
			MessageID:     "5f0c7a4e-2b1d-4c1a-9b57-0d6f3f1e2a9c",
			CorrelationID: "c-981",
			Type:          "order.created",
			Timestamp:     time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC),
			ContentType:   "application/json",
			Headers: map[string]any{
				"traceparent":                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
				"tenant":                     "acme",
				"priority":                   int32(5),
				"amount":                     12.5,
				"gift":                       false,
				msg.HeaderRetryCount:         int32(1),
				msg.HeaderOriginalRoutingKey: "orders.eu.created",
				msg.HeaderOriginalExchange:   "shop",
				msg.HeaderFirstFailureTime:   "2026-03-04T05:06:08.123Z",
				msg.HeaderLastFailureTime:    "2026-03-04T05:06:08.123Z",
				msg.HeaderLastStatusCode:     int32(503),
				"x-death":                    []any{map[string]any{"count": int64(1)}},
			},
		}, msg.Info{
			Queue: "orders", Exchange: "shop", RoutingKey: "orders.eu.created", Attempt: 2,
		}
}

func BenchmarkBuildHeaders(b *testing.B) {
	for _, c := range []struct {
		name string
		mk   func() (*msg.Message, msg.Info)
	}{
		{"plain", plainMessage},
		{"retried", retriedMessage},
	} {
		b.Run(c.name, func(b *testing.B) {
			m, in := c.mk()
			dst := make([]app.Header, 0, 24)
			b.ReportAllocs()
			for b.Loop() {
				dst, _ = app.BuildHeaders(dst[:0], m, in)
			}
		})
		// What the delivery path does today: a new slice per message.
		b.Run(c.name+"/fresh-slice", func(b *testing.B) {
			m, in := c.mk()
			b.ReportAllocs()
			for b.Loop() {
				_, _ = app.BuildHeaders(make([]app.Header, 0, 24), m, in)
			}
		})
	}
}

func BenchmarkSanitizeValue(b *testing.B) {
	for _, c := range []struct{ name, v string }{
		{"clean-short", "5f0c7a4e-2b1d-4c1a-9b57-0d6f3f1e2a9c"},
		{"clean-4KiB", strings.Repeat("a", 4096)},
		{"control-chars", "line one\r\nline two\x00"},
		{"over-limit", strings.Repeat("é", 3000)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.v)))
			for b.Loop() {
				_ = app.SanitizeValue(c.v)
			}
		})
	}
}

// signings are the ways a request is signed in the signing benchmarks:
// none, Standard Webhooks with one HMAC secret, with two (a rotation),
// with an Ed25519 key, and Hopper-Signature.
func signings(b *testing.B) []struct {
	name string
	opts app.AuthOptions
} {
	b.Helper()
	dir := b.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			b.Fatal(err)
		}
		return p
	}
	secret := func() string {
		k := make([]byte, 32)
		if _, err := rand.Read(k); err != nil {
			b.Fatal(err)
		}
		return "whsec_" + base64.StdEncoding.EncodeToString(k)
	}
	_, ed, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	return []struct {
		name string
		opts app.AuthOptions
	}{
		{"unsigned", app.AuthOptions{}},
		{"standardWebhooks", app.AuthOptions{StandardWebhooksFile: write("one", secret()+"\n")}},
		{"standardWebhooks-2-secrets", app.AuthOptions{StandardWebhooksFile: write("two", secret()+"\n"+secret()+"\n")}},
		{"standardWebhooks-ed25519", app.AuthOptions{StandardWebhooksFile: write("ed", "whsk_"+base64.StdEncoding.EncodeToString(ed)+"\n")}},
		{"hopperSignature", app.AuthOptions{HMACKeyFile: write("hmac", secret()+"\n")}},
	}
}

// signedMessage is the retried message with a 256-byte JSON body, the
// size the throughput figures are measured with.
func signedMessage() (*msg.Message, msg.Info) {
	m, in := retriedMessage()
	m.Body = []byte(`{"order":"5f0c7a4e-2b1d-4c1a-9b57-0d6f3f1e2a9c","items":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}],"note":"` + strings.Repeat("x", 256-118) + `"}`)
	return m, in
}

// BenchmarkRequestBuild is the building of one message's request, as
// Deliver does it before sending, without and with each way of signing:
// the part of the per-message path that signing adds to. Compare the
// signed cases with "unsigned":
//
//	go test -run '^$' -bench 'RequestBuild|DeliverSigned' -benchmem -count 5 ./app/
func BenchmarkRequestBuild(b *testing.B) {
	for _, s := range signings(b) {
		b.Run(s.name, func(b *testing.B) {
			au, err := app.NewAuth(s.opts)
			if err != nil {
				b.Fatal(err)
			}
			c := app.NewClient(app.ClientOptions{URL: "http://127.0.0.1:8080/", Timeout: time.Second, Auth: au})
			m, in := signedMessage()
			req := fasthttp.AcquireRequest()
			defer fasthttp.ReleaseRequest(req)
			b.ReportAllocs()
			for b.Loop() {
				req.Reset()
				c.BuildRequest(req, m, in)
			}
		})
	}
}

// processCPU is the CPU time this process has used, user and system:
// on a machine shared with other work, the wall time of a request over
// loopback varies with their load far more than its CPU time does.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkDeliverSigned is one message's whole request on the client's
// side: built, sent over loopback to an app that answers 200, and the
// answer read and classified, without and with each way of signing. The
// app is a fasthttp server, which parses headers without allocating, so
// what the signed cases add is Hopper's own work (an app that allocates
// per header pays for three more headers on its side). The broker's side
// of the per-message path (receiving and acknowledging the message) comes
// on top, so signing's share of the whole path is smaller still. Besides
// the wall time it reports cpu-ns/op, the process's CPU time (client and
// app) per request.
func BenchmarkDeliverSigned(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(200) }}
	go srv.Serve(ln)     //nolint:errcheck // ends with Shutdown
	defer srv.Shutdown() //nolint:errcheck // the benchmark's own server
	for _, s := range signings(b) {
		b.Run(s.name, func(b *testing.B) {
			au, err := app.NewAuth(s.opts)
			if err != nil {
				b.Fatal(err)
			}
			c := app.NewClient(app.ClientOptions{URL: "http://" + ln.Addr().String() + "/", Timeout: 10 * time.Second, MaxConns: 4, Auth: au})
			m, in := signedMessage()
			ctx := context.Background()
			b.ReportAllocs()
			cpu0 := processCPU(b)
			for b.Loop() {
				if o := c.Deliver(ctx, m, in); o.Status != 200 {
					b.Fatalf("delivery: %+v", o)
				}
			}
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}
