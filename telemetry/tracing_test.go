package telemetry

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/hopper-sidecar/hopper/telemetry/otlp"
)

// The exporter TracingFromEnv builds names the running binary's version
// in its User-Agent, and the startup line names a proxy without its
// credentials.
func TestTracingUserAgentAndProxy(t *testing.T) {
	var mu sync.Mutex
	var agents []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) //nolint:errcheck // the body is not looked at
		mu.Lock()
		agents = append(agents, r.Header.Get("User-Agent"))
		mu.Unlock()
	}))
	defer srv.Close()
	ctx := context.Background()
	tr, err := TracingFromEnv(ctx, func(k string) string {
		return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL}[k]
	}, "9.9.9")
	if err != nil || !tr.Enabled {
		t.Fatalf("enabled %v, err %v", tr.Enabled, err)
	}
	_, span := tr.Provider.Tracer("test").Start(ctx, "one")
	span.End()
	if err := tr.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(agents) != 1 || agents[0] != "hopper/9.9.9 OTLP-exporter" {
		t.Errorf("User-Agents = %q, want one hopper/9.9.9 OTLP-exporter", agents)
	}

	proxied, err := TracingFromEnv(ctx, func(k string) string {
		return map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector.mon:4317",
			"HTTPS_PROXY": "http://hopper:s3cr3t@proxy.corp:3128"}[k]
	}, "9.9.9")
	if err != nil {
		t.Fatal(err)
	}
	defer proxied.Shutdown(ctx) //nolint:errcheck // nothing was recorded
	if want := "through proxy http://hopper:xxxxx@proxy.corp:3128"; !strings.HasSuffix(proxied.Exporter, want) ||
		strings.Contains(proxied.Exporter, "s3cr3t") {
		t.Errorf("exporter = %q, want it to end with %q", proxied.Exporter, want)
	}
}

// TestTracingCredentialsNeverPrinted gives the collector endpoint, its
// headers and the proxy credentials, then finds none of them in the startup
// line, in the errors of settings that cannot be used, or in the error of
// an export that fails.
func TestTracingCredentialsNeverPrinted(t *testing.T) {
	const user, pass, token = "otel-user", "otel-pw-93b1c7", "tok-5d0e2a7f"
	secrets := []string{user, pass, token}
	ctx := context.Background()
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	var out []string

	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	endpoint := strings.Replace(closed.URL, "http://", "http://"+user+":"+pass+"@", 1)
	tr, err := TracingFromEnv(ctx, env(map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20" + token,
		"OTEL_EXPORTER_OTLP_TIMEOUT": "200",
	}), "9.9.9")
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, tr.Exporter)
	exp, ok, err := otlpFromEnv(env(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_TIMEOUT": "200"}))
	if err != nil || !ok {
		t.Fatalf("exporter: %v", err)
	}
	if err := exp.ExportSpans(ctx, recordedSpans(t)); err == nil {
		t.Error("an export to a closed port succeeded")
	} else {
		out = append(out, err.Error())
	}
	tr.Shutdown(ctx) //nolint:errcheck // the collector is not there

	for _, bad := range []map[string]string{
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + user + ":" + pass + "@collector:port/"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "ftp://" + user + ":" + pass + "@collector/"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_HEADERS": "Authorization Bearer " + token},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=" + token + "%zz"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "HTTP_PROXY": "http://" + user + ":" + pass + "@proxy:port"},
	} {
		_, err := TracingFromEnv(ctx, env(bad), "9.9.9")
		if err == nil {
			t.Errorf("%v: accepted", bad)
			continue
		}
		out = append(out, err.Error())
	}
	for _, o := range out {
		for _, s := range secrets {
			if strings.Contains(o, s) {
				t.Errorf("%q holds %q", o, s)
			}
		}
	}
}

func otlpFromEnv(getenv func(string) string) (*otlp.Exporter, bool, error) {
	cfg, ok, err := otlp.FromEnv(getenv)
	if err != nil || !ok {
		return nil, ok, err
	}
	return otlp.New(cfg), true, nil
}

// recordedSpans is one ended span to export.
func recordedSpans(t *testing.T) []sdktrace.ReadOnlySpan {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	_, span := tp.Tracer("test").Start(context.Background(), "one")
	span.End()
	return rec.Ended()
}
