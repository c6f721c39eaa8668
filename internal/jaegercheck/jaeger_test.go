// Package jaegercheck proves, end to end, that every attempt of a message
// shows in one Jaeger trace: a real Jaeger (all-in-one, in-memory), a real
// broker, the hopper binary exporting OTLP, and an app that fails a message
// twice before accepting it. The trace is read back from Jaeger's query API.
package jaegercheck

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/internal/testbroker"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
)

var rabbit *testbroker.Broker

func TestMain(m *testing.M) { os.Exit(testbroker.RunMain(m, &rabbit)) }

func repoRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(wd, "..", "..")
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startJaeger runs all-in-one with in-memory storage and every listener on
// loopback; it returns the OTLP/HTTP and OTLP/gRPC endpoints and the query
// base URL.
func startJaeger(t *testing.T) (otlpHTTP, otlpGRPC, query string) {
	t.Helper()
	bin := os.Getenv("HOPPER_JAEGER_BIN")
	if bin == "" {
		bin = filepath.Join(repoRoot(t), ".cache", "bin", "all-in-one")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("Jaeger all-in-one not found at %s: run scripts/install-jaeger.sh (make tools) first", bin)
	}
	// A port picked free can be taken by another process before Jaeger
	// binds it (the suite runs brokers and Hopper processes meanwhile):
	// Jaeger then exits, and is started again on other ports.
	for attempt := 1; ; attempt++ {
		var exited bool
		otlpHTTP, otlpGRPC, query, exited = runJaeger(t, bin)
		if !exited {
			return otlpHTTP, otlpGRPC, query
		}
		if attempt == 3 {
			t.Fatalf("jaeger exited before serving, %d times", attempt)
		}
		t.Logf("jaeger exited before serving (a port taken meanwhile?); starting it again")
	}
}

// runJaeger starts Jaeger on fresh ports and waits until its query API
// answers, or it exits (exited true).
func runJaeger(t *testing.T, bin string) (otlpHTTP, otlpGRPC, query string, exited bool) {
	t.Helper()
	p := func() string { return "127.0.0.1:" + strconv.Itoa(freePort(t)) }
	otlpAddr, grpcAddr, queryAddr := p(), p(), p()
	args := []string{
		"--collector.otlp.enabled=true",
		"--collector.otlp.http.host-port=" + otlpAddr,
		"--collector.otlp.grpc.host-port=" + grpcAddr,
		"--query.http-server.host-port=" + queryAddr,
		"--query.grpc-server.host-port=" + p(),
		"--collector.http-server.host-port=" + p(),
		"--collector.grpc-server.host-port=" + p(),
		"--admin.http.host-port=" + p(),
		"--processor.jaeger-compact.server-host-port=" + p(),
		"--processor.jaeger-binary.server-host-port=" + p(),
		"--processor.zipkin-compact.server-host-port=" + p(),
		"--http-server.host-port=" + p(),
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "SPAN_STORAGE_TYPE=memory")
	logPath := filepath.Join(t.TempDir(), "jaeger.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start jaeger: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()          //nolint:errcheck // the exit is what matters
	t.Cleanup(func() { cmd.Process.Kill(); <-done }) //nolint:errcheck // test teardown
	query = "http://" + queryAddr
	waitfor.Until(t, 2*time.Minute, "jaeger query API (or jaeger's exit)", func() bool {
		select {
		case <-done:
			exited = true
			return true
		default:
		}
		resp, err := http.Get(query + "/api/services")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	if exited {
		out, _ := os.ReadFile(logPath)
		t.Logf("jaeger log:\n%s", out)
	}
	return "http://" + otlpAddr, "http://" + grpcAddr, query, exited
}

// jaegerTrace is the part of Jaeger's query API answer the check reads.
type jaegerTrace struct {
	Data []struct {
		Spans []struct {
			SpanID        string `json:"spanID"`
			OperationName string `json:"operationName"`
			StartTime     int64  `json:"startTime"`
			ProcessID     string `json:"processID"`
			References    []struct {
				RefType string `json:"refType"`
				SpanID  string `json:"spanID"`
			} `json:"references"`
			Tags []struct {
				Key   string `json:"key"`
				Value any    `json:"value"`
			} `json:"tags"`
		} `json:"spans"`
		Processes map[string]struct {
			ServiceName string `json:"serviceName"`
			Tags        []struct {
				Key   string `json:"key"`
				Value any    `json:"value"`
			} `json:"tags"`
		} `json:"processes"`
	} `json:"data"`
}

// Hopper's spans reach Jaeger over either OTLP protocol, and a message's
// attempts and moves form one trace under its publisher's span.
func TestJaegerShowsEveryAttemptInOneTrace(t *testing.T) {
	otlpHTTP, otlpGRPC, query := startJaeger(t)
	dir := t.TempDir()
	hopper := filepath.Join(dir, "hopper")
	build := exec.Command("go", "build", "-ldflags", "-X main.version="+checkVersion, "-o", hopper, "./cmd/hopper")
	build.Dir = repoRoot(t)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build hopper: %v\n%s", err, out)
	}
	for _, tc := range []struct{ protocol, endpoint, queue string }{
		{"http/protobuf", otlpHTTP, "jaeger.check"},
		{"grpc", otlpGRPC, "jaeger.check.grpc"},
	} {
		t.Run(tc.protocol, func(t *testing.T) { checkTrace(t, hopper, tc.protocol, tc.endpoint, otlpHTTP, query, tc.queue) })
	}
}

// checkVersion is the version the checked binary is built with; it must
// come back as the resource's service.version.
const checkVersion = "check-1.2.3"

// checkTrace runs hopper exporting over protocol to endpoint, publishes
// one message under a publisher span (always sent over OTLP/HTTP to
// publisherOTLP) and reads the trace back from query.
func checkTrace(t *testing.T, hopper, protocol, endpoint, publisherOTLP, query, queue string) {
	// The app fails the message twice, then accepts it.
	var mu sync.Mutex
	var calls []string
	appLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	app := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls = append(calls, r.Header.Get("Traceparent"))
		n := len(calls)
		mu.Unlock()
		if n <= 2 {
			w.WriteHeader(503)
			return
		}
		w.WriteHeader(200)
	})}
	go app.Serve(appLn) //nolint:errcheck // ends with Close
	t.Cleanup(func() { app.Close() })

	dir := t.TempDir()
	cfg := fmt.Sprintf(`broker:
  urls: [%q]
queue:
  name: %s
app:
  url: http://%s/
retry:
  tiers: [200ms]
admin:
  listen: ""
log:
  format: text
  level: debug
`, rabbit.URL(), queue, appLn.Addr())
	cfgFile := filepath.Join(dir, "hopper.yaml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(dir, "hopper.log"))
	if err != nil {
		t.Fatal(err)
	}
	run := exec.Command(hopper, "run", "--config", cfgFile)
	run.Env = append(os.Environ(), "OTEL_EXPORTER_OTLP_ENDPOINT="+endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL="+protocol,
		"OTEL_SERVICE_NAME=hopper-check")
	run.Stdout, run.Stderr = logFile, logFile
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- run.Wait() }()
	t.Cleanup(func() { run.Process.Kill() }) //nolint:errcheck // may have exited
	waitfor.Until(t, 30*time.Second, "hopper consuming (queue declared)", func() bool {
		_, err := rabbit.QueueDepth(queue)
		return err == nil
	})

	// The publisher's own span, exported to the same Jaeger.
	ctx := context.Background()
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(publisherOTLP+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
		sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName("publisher"))))
	pctx, pspan := tp.Tracer("check").Start(ctx, "publish "+queue, trace.WithSpanKind(trace.SpanKindProducer))
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(pctx, carrier)
	traceID := pspan.SpanContext().TraceID().String()

	pub := broker.NewPublisher(broker.PublisherOptions{Options: broker.Options{URLs: []string{rabbit.URL()}}, Channels: 1})
	defer pub.Close()
	m := &msg.Message{MessageID: "traced-1", Body: []byte("hello"), Headers: map[string]any{"traceparent": carrier["traceparent"]}}
	if err := pub.Publish(ctx, queue, m); err != nil {
		t.Fatal(err)
	}
	pspan.End()
	if err := tp.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	waitfor.Until(t, 30*time.Second, "three deliveries", func() bool { mu.Lock(); defer mu.Unlock(); return len(calls) == 3 })
	if err := run.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("hopper exit: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("hopper did not exit after SIGTERM")
	}

	// Read the trace back.
	var tr jaegerTrace
	waitfor.Until(t, 30*time.Second, "the trace in Jaeger with every span", func() bool {
		resp, err := http.Get(query + "/api/traces/" + traceID)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		tr = jaegerTrace{}
		if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&tr) != nil || len(tr.Data) != 1 {
			return false
		}
		return len(tr.Data[0].Spans) >= 1+3+3+2
	})
	d := tr.Data[0]
	sort.Slice(d.Spans, func(i, j int) bool { return d.Spans[i].StartTime < d.Spans[j].StartTime })
	type seen struct{ name, attempt, decision, move, service string }
	var process, sends []seen
	publisher := false
	for _, s := range d.Spans {
		tags := map[string]string{}
		for _, tg := range s.Tags {
			tags[tg.Key] = fmt.Sprint(tg.Value)
		}
		e := seen{s.OperationName, tags["hopper.attempt"], tags["hopper.decision"], tags["hopper.move"], d.Processes[s.ProcessID].ServiceName}
		switch {
		case s.OperationName == "publish "+queue && e.service == "publisher":
			publisher = true
		case s.OperationName == "process "+queue:
			process = append(process, e)
			// A few of the messaging conventions, as Jaeger stored them.
			for k, want := range map[string]string{
				"messaging.system":                           "rabbitmq",
				"messaging.operation.type":                   "process",
				"messaging.destination.name":                 "amq.default",
				"messaging.rabbitmq.destination.routing_key": queue,
				"server.address":                             "127.0.0.1",
			} {
				if tags[k] != want {
					t.Errorf("attempt span: %s = %q, want %q", k, tags[k], want)
				}
			}
			pv := ""
			for _, tg := range d.Processes[s.ProcessID].Tags {
				if tg.Key == "service.version" {
					pv = fmt.Sprint(tg.Value)
				}
			}
			if pv != checkVersion {
				t.Errorf("hopper's resource: service.version %q, want %q", pv, checkVersion)
			}
		case len(s.OperationName) > 5 && s.OperationName[:5] == "send ":
			sends = append(sends, e)
		}
	}
	t.Logf("trace %s: %d spans", traceID, len(d.Spans))
	if !publisher {
		t.Error("the publisher's span is not in the trace")
	}
	want := []seen{{attempt: "1", decision: "retry"}, {attempt: "2", decision: "retry"}, {attempt: "3", decision: "ack"}}
	if len(process) != 3 {
		t.Fatalf("want 3 attempt spans, got %d: %+v", len(process), process)
	}
	for i, w := range want {
		if process[i].attempt != w.attempt || process[i].decision != w.decision || process[i].service != "hopper-check" {
			t.Errorf("attempt span %d = %+v, want attempt %s decision %s from hopper-check", i, process[i], w.attempt, w.decision)
		}
	}
	if len(sends) != 2 || sends[0].move != "retry" || sends[1].move != "retry" {
		t.Errorf("want the two retry moves, got %+v", sends)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, tp := range calls {
		if len(tp) < 36 || tp[3:35] != traceID {
			t.Errorf("delivery %d carried traceparent %q, not of trace %s", i+1, tp, traceID)
		}
	}
}
