package otlp

import (
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	_ "google.golang.org/grpc/encoding/gzip" // the compressor a collector registers
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// waits records the waits an exporter asks for between tries, instead of
// spending them.
type waits struct {
	mu sync.Mutex
	d  []time.Duration
}

func (w *waits) all() []time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]time.Duration(nil), w.d...)
}

func recordWaits(exp *Exporter) *waits {
	w := &waits{}
	exp.sleep = func(ctx context.Context, d time.Duration) error {
		w.mu.Lock()
		w.d = append(w.d, d)
		w.mu.Unlock()
		return ctx.Err()
	}
	return w
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func mustConfig(t *testing.T, m map[string]string) Config {
	t.Helper()
	cfg, ok, err := FromEnv(env(m))
	if err != nil || !ok {
		t.Fatalf("FromEnv(%v) = ok %v, %v", m, ok, err)
	}
	return cfg
}

// httpCollector answers each request with the next status of answers
// (200 once they run out) and keeps the requests it read.
type httpCollector struct {
	mu      sync.Mutex
	answers []int
	// rejecting, when above 0, is the partial success a 200 reports.
	rejecting int64
	// retryAfter, when set, is the Retry-After of every refusal (a 503
	// otherwise says 0).
	retryAfter string
	requests   []*coltracepb.ExportTraceServiceRequest
	headers    []http.Header
}

func (c *httpCollector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	var req coltracepb.ExportTraceServiceRequest
	if err != nil || r.URL.Path != "/base/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" ||
		proto.Unmarshal(b, &req) != nil {
		http.Error(w, "bad request to "+r.URL.Path, 400)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.requests = append(c.requests, &req)
	c.headers = append(c.headers, r.Header.Clone())
	if len(c.answers) > 0 {
		code := c.answers[0]
		c.answers = c.answers[1:]
		switch {
		case c.retryAfter != "":
			w.Header().Set("Retry-After", c.retryAfter)
		case code == 503:
			w.Header().Set("Retry-After", "0")
		}
		http.Error(w, "busy", code)
		return
	}
	if c.rejecting > 0 {
		b, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{PartialSuccess: &coltracepb.ExportTracePartialSuccess{
			RejectedSpans: c.rejecting, ErrorMessage: "too old"}})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(b) //nolint:errcheck // test collector
	}
}

func TestHTTPExportDeliversAndRetries(t *testing.T) {
	col := &httpCollector{answers: []int{503, 429}}
	srv := httptest.NewServer(col)
	defer srv.Close()
	exp := New(mustConfig(t, map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT":    srv.URL + "/base",
		"OTEL_EXPORTER_OTLP_HEADERS":     "authorization=Bearer%20abc,x-tenant=t1",
		"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
	}))
	recordWaits(exp)
	spans := sampleSpans(t)
	if err := exp.ExportSpans(context.Background(), spans); err != nil {
		t.Fatalf("export after two busy answers: %v", err)
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	if len(col.requests) != 3 {
		t.Fatalf("requests = %d, want 3 (two refused, one taken)", len(col.requests))
	}
	last := col.requests[2]
	if n := len(last.ResourceSpans[0].ScopeSpans[0].Spans) + len(last.ResourceSpans[0].ScopeSpans[1].Spans) +
		len(last.ResourceSpans[1].ScopeSpans[0].Spans); n != len(spans) {
		t.Errorf("spans received = %d, want %d", n, len(spans))
	}
	if h := col.headers[2]; h.Get("Authorization") != "Bearer abc" || h.Get("X-Tenant") != "t1" {
		t.Errorf("headers = %v", h)
	}
}

func TestHTTPExportPermanentFailure(t *testing.T) {
	col := &httpCollector{answers: []int{400}}
	srv := httptest.NewServer(col)
	defer srv.Close()
	exp := New(mustConfig(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL + "/base"}))
	err := exp.ExportSpans(context.Background(), sampleSpans(t))
	if err == nil || !strings.Contains(err.Error(), "400") {
		t.Fatalf("a 400 must fail the export at once, got %v", err)
	}
	if len(col.requests) != 1 {
		t.Errorf("requests = %d, want 1 (no retry of a 400)", len(col.requests))
	}
}

func TestHTTPExportGivesUpAtDeadline(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "down", 503) }))
	defer srv.Close()
	// The first answer must come inside the export's timeout, so the
	// timeout is generous for a loaded machine; the wait after it is longer
	// than any timeout, so the export ends at its deadline, not before.
	exp := New(mustConfig(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL, "OTEL_EXPORTER_OTLP_TIMEOUT": "3000"}))
	exp.minBackoff, exp.maxBackoff = time.Hour, time.Hour
	err := exp.ExportSpans(context.Background(), sampleSpans(t))
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "503") {
		t.Fatalf("want the last answer and the deadline, got %v", err)
	}
}

func TestExportAfterShutdownFails(t *testing.T) {
	exp := New(mustConfig(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}))
	if err := exp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := exp.ExportSpans(context.Background(), sampleSpans(t)); !errors.Is(err, errStopped) {
		t.Fatalf("export after shutdown = %v", err)
	}
}

// grpcCollector is the collector's trace service on a real gRPC server.
type grpcCollector struct {
	coltracepb.UnimplementedTraceServiceServer
	mu   sync.Mutex
	fail []codes.Code
	// retryDelay, when above 0, is the RetryInfo every refusal carries.
	retryDelay time.Duration
	rejecting  int64
	requests   []*coltracepb.ExportTraceServiceRequest
	tenant     []string
	userAgent  []string
}

func (c *grpcCollector) Export(ctx context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.requests = append(c.requests, req)
	md, _ := metadata.FromIncomingContext(ctx)
	c.tenant = append(c.tenant, strings.Join(md.Get("x-tenant"), ","))
	c.userAgent = append(c.userAgent, strings.Join(md.Get("user-agent"), ","))
	if len(c.fail) > 0 {
		code := c.fail[0]
		c.fail = c.fail[1:]
		st := status.New(code, "refused: "+code.String())
		if c.retryDelay > 0 {
			var err error
			if st, err = st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(c.retryDelay)}); err != nil {
				return nil, err
			}
		}
		return nil, st.Err()
	}
	if c.rejecting > 0 {
		return &coltracepb.ExportTraceServiceResponse{PartialSuccess: &coltracepb.ExportTracePartialSuccess{
			RejectedSpans: c.rejecting, ErrorMessage: "too old"}}, nil
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func startGRPC(t *testing.T, col *grpcCollector) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(s, col)
	go s.Serve(ln) //nolint:errcheck // ends with Stop
	t.Cleanup(s.Stop)
	return ln.Addr().String()
}

func TestGRPCExport(t *testing.T) {
	for _, gz := range []string{"none", "gzip"} {
		t.Run(gz, func(t *testing.T) {
			col := &grpcCollector{fail: []codes.Code{codes.Unavailable}}
			addr := startGRPC(t, col)
			exp := New(mustConfig(t, map[string]string{
				"OTEL_EXPORTER_OTLP_PROTOCOL":           "grpc",
				"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT":    addr,
				"OTEL_EXPORTER_OTLP_INSECURE":           "true",
				"OTEL_EXPORTER_OTLP_TRACES_HEADERS":     "x-tenant=t2",
				"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": gz,
			}))
			recordWaits(exp)
			spans := sampleSpans(t)
			if err := exp.ExportSpans(context.Background(), spans); err != nil {
				t.Fatalf("export after one UNAVAILABLE: %v", err)
			}
			col.mu.Lock()
			defer col.mu.Unlock()
			if len(col.requests) != 2 {
				t.Fatalf("requests = %d, want 2", len(col.requests))
			}
			got := col.requests[1]
			if got.ResourceSpans[0].ScopeSpans[0].Spans[0].Name != "process orders" || len(got.ResourceSpans) != 2 {
				t.Errorf("the server read %v", got)
			}
			if col.tenant[1] != "t2" {
				t.Errorf("metadata x-tenant = %q", col.tenant[1])
			}
		})
	}
}

func TestGRPCExportPermanentFailure(t *testing.T) {
	col := &grpcCollector{fail: []codes.Code{codes.InvalidArgument}}
	addr := startGRPC(t, col)
	exp := New(mustConfig(t, map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + addr}))
	err := exp.ExportSpans(context.Background(), sampleSpans(t))
	if err == nil || !strings.Contains(err.Error(), "status 3") || !strings.Contains(err.Error(), "refused: InvalidArgument") {
		t.Fatalf("want INVALID_ARGUMENT with its message, got %v", err)
	}
	if len(col.requests) != 1 {
		t.Errorf("requests = %d, want 1", len(col.requests))
	}
}

func TestFromEnv(t *testing.T) {
	cases := []struct {
		name    string
		env     map[string]string
		url     string
		timeout time.Duration
		tls     bool
		err     string
	}{
		{name: "no endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}},
		{name: "base URL gets the traces path", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4318"},
			url: "http://jaeger:4318/v1/traces", timeout: DefaultTimeout},
		{name: "base URL with a path", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c.example/otlp/"},
			url: "https://c.example/otlp/v1/traces", timeout: DefaultTimeout, tls: true},
		{name: "traces URL as it is", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://ignored:1",
			"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/custom", "OTEL_EXPORTER_OTLP_TIMEOUT": "2500"},
			url: "http://c:4318/custom", timeout: 2500 * time.Millisecond},
		{name: "traces URL without a path", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318"},
			url: "http://c:4318/", timeout: DefaultTimeout},
		{name: "grpc URL", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"},
			url: "http://c:4317" + grpcMethod, timeout: DefaultTimeout},
		{name: "grpc host:port is TLS unless insecure", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "c:4317"},
			url: "https://c:4317" + grpcMethod, timeout: DefaultTimeout, tls: true},
		{name: "traces protocol wins", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
			"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"},
			url: "http://c:4317" + grpcMethod, timeout: DefaultTimeout},
		{name: "unknown protocol", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"},
			err: `"http/json" not supported`},
		{name: "endpoint without scheme for http", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "jaeger:4318"},
			err: "OTEL_EXPORTER_OTLP_ENDPOINT \"jaeger:4318\": want an http:// or https:// URL"},
		{name: "bad timeout", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "10s"},
			err: "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT \"10s\": want a positive number of milliseconds"},
		{name: "bad compression", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"},
			err: "want gzip or none"},
		{name: "bad header", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_HEADERS": "a=1,novalue"},
			err: `OTEL_EXPORTER_OTLP_HEADERS: entry 2: want key=value`},
		{name: "missing CA file", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c", "OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent/ca.pem"},
			err: "OTEL_EXPORTER_OTLP_CERTIFICATE: open /nonexistent/ca.pem"},
		{name: "client key without certificate", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c", "OTEL_EXPORTER_OTLP_CLIENT_KEY": "/k.pem"},
			err: "go together"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, ok, err := FromEnv(env(tc.env))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.url == "" {
				if ok {
					t.Fatalf("no endpoint must leave tracing off, got %+v", cfg)
				}
				return
			}
			if cfg.URL != tc.url || cfg.Timeout != tc.timeout || (cfg.TLS != nil) != tc.tls {
				t.Errorf("got url %q timeout %v tls %v, want %q %v %v", cfg.URL, cfg.Timeout, cfg.TLS != nil, tc.url, tc.timeout, tc.tls)
			}
		})
	}
}

// writeCA writes srv's certificate as a PEM file for
// OTEL_EXPORTER_OTLP_CERTIFICATE.
func writeCA(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ca.pem")
	b := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Both protocols reach a TLS collector whose certificate is trusted only
// through OTEL_EXPORTER_OTLP_CERTIFICATE.
func TestExportOverTLS(t *testing.T) {
	col := &httpCollector{}
	srv := httptest.NewTLSServer(col)
	defer srv.Close()
	ca := writeCA(t, srv)

	t.Run("http/protobuf", func(t *testing.T) {
		exp := New(mustConfig(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL + "/base",
			"OTEL_EXPORTER_OTLP_CERTIFICATE": ca}))
		if err := exp.ExportSpans(context.Background(), sampleSpans(t)); err != nil {
			t.Fatal(err)
		}
		// Without the CA: a certificate error, at once, not retried until
		// the deadline.
		untrusted := New(mustConfig(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL + "/base"}))
		err := untrusted.ExportSpans(context.Background(), sampleSpans(t))
		var certErr *tls.CertificateVerificationError
		if !errors.As(err, &certErr) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("without the CA the export must fail on the certificate at once, got %v", err)
		}
	})

	t.Run("grpc", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		gcol := &grpcCollector{}
		s := grpc.NewServer(grpc.Creds(credentials.NewServerTLSFromCert(&srv.TLS.Certificates[0])))
		coltracepb.RegisterTraceServiceServer(s, gcol)
		go s.Serve(ln) //nolint:errcheck // ends with Stop
		defer s.Stop()
		exp := New(mustConfig(t, map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
			"OTEL_EXPORTER_OTLP_ENDPOINT": "https://" + ln.Addr().String(), "OTEL_EXPORTER_OTLP_CERTIFICATE": ca}))
		if err := exp.ExportSpans(context.Background(), sampleSpans(t)); err != nil {
			t.Fatal(err)
		}
		gcol.mu.Lock()
		defer gcol.mu.Unlock()
		if len(gcol.requests) != 1 {
			t.Fatalf("requests = %d, want 1", len(gcol.requests))
		}
	})
}

// A partial success is an accepted export whose rejected spans are
// reported, over either protocol.
func TestPartialSuccessCountsRejected(t *testing.T) {
	col := &httpCollector{rejecting: 2}
	srv := httptest.NewServer(col)
	defer srv.Close()
	gcol := &grpcCollector{rejecting: 3}
	addr := startGRPC(t, gcol)
	for _, tc := range []struct {
		env  map[string]string
		want int64
	}{
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL + "/base"}, 2},
		{map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + addr}, 3},
	} {
		exp := New(mustConfig(t, tc.env))
		var rejected atomic.Int64
		exp.Rejected = func(n int64) { rejected.Add(n) }
		if err := exp.ExportSpans(context.Background(), sampleSpans(t)); err != nil {
			t.Fatalf("a partial success is a success: %v", err)
		}
		if got := rejected.Load(); got != tc.want {
			t.Errorf("%v: rejected = %d, want %d", tc.env, got, tc.want)
		}
	}
	// A full success reports nothing.
	col.rejecting = 0
	exp := New(mustConfig(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL + "/base"}))
	exp.Rejected = func(n int64) { t.Errorf("rejected %d on a full success", n) }
	if err := exp.ExportSpans(context.Background(), sampleSpans(t)); err != nil {
		t.Fatal(err)
	}
}
