package telemetry

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
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
