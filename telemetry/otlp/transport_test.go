package otlp

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Both protocols name Hopper and its version in User-Agent; a
// User-Agent among the configured headers wins.
func TestUserAgent(t *testing.T) {
	col := &httpCollector{}
	srv := httptest.NewServer(col)
	defer srv.Close()
	gcol := &grpcCollector{}
	addr := startGRPC(t, gcol)

	httpEnv := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL + "/base"}
	grpcEnv := map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + addr}
	export := func(env map[string]string, version string) {
		t.Helper()
		cfg := mustConfig(t, env)
		if version != "" {
			cfg.UserAgent = UserAgent(version)
		}
		if err := New(cfg).ExportSpans(context.Background(), sampleSpans(t)); err != nil {
			t.Fatal(err)
		}
	}
	export(httpEnv, "1.4.2")
	export(httpEnv, "")
	export(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL + "/base",
		"OTEL_EXPORTER_OTLP_HEADERS": "User-Agent=gateway%2F7"}, "1.4.2")
	export(grpcEnv, "1.4.2")

	col.mu.Lock()
	defer col.mu.Unlock()
	var got []string
	for _, h := range col.headers {
		got = append(got, h.Get("User-Agent"))
	}
	want := []string{"hopper/1.4.2 OTLP-exporter", "hopper/dev OTLP-exporter", "gateway/7"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("http/protobuf User-Agents = %q, want %q", got, want)
	}
	gcol.mu.Lock()
	defer gcol.mu.Unlock()
	if len(gcol.userAgent) != 1 || gcol.userAgent[0] != "hopper/1.4.2 OTLP-exporter" {
		t.Errorf("gRPC user-agent = %q", gcol.userAgent)
	}
}

// connectProxy is an HTTP proxy that serves CONNECT only. Its routes map
// the host:port a client asks for to where it really is, so that a
// collector under a name nothing else resolves is reachable only through
// it.
type connectProxy struct {
	routes map[string]string

	mu      sync.Mutex
	targets []string
	auth    []string
	agents  []string
}

func (p *connectProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect {
		http.Error(w, "CONNECT only", http.StatusMethodNotAllowed)
		return
	}
	p.mu.Lock()
	p.targets = append(p.targets, r.Host)
	p.auth = append(p.auth, r.Header.Get("Proxy-Authorization"))
	p.agents = append(p.agents, r.Header.Get("User-Agent"))
	to, ok := p.routes[r.Host]
	p.mu.Unlock()
	if !ok {
		http.Error(w, "no route to "+r.Host, http.StatusBadGateway)
		return
	}
	upstream, err := net.Dial("tcp", to)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	conn, buf, err := w.(http.Hijacker).Hijack()
	if err != nil {
		upstream.Close()
		return
	}
	if _, err := conn.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		conn.Close()
		upstream.Close()
		return
	}
	go pipe(upstream, buf.Reader)
	go pipe(conn, upstream)
}

// pipe copies until either side ends, then closes both.
func pipe(dst io.WriteCloser, src io.Reader) {
	io.Copy(dst, src) //nolint:errcheck // the tunnel ends either way
	dst.Close()
	if c, ok := src.(io.Closer); ok {
		c.Close()
	}
}

func startProxy(t *testing.T, routes map[string]string) (*connectProxy, string) {
	t.Helper()
	p := &connectProxy{routes: routes}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return p, srv.Listener.Addr().String()
}

// Exports reach a collector through HTTPS_PROXY: gRPC (plain text and
// TLS) by a CONNECT tunnel with the proxy URL's credentials, and
// http/protobuf to a TLS collector. The collector's name resolves only
// inside the proxy, so an export that bypassed it would fail.
func TestExportThroughProxy(t *testing.T) {
	plain := startGRPC(t, &grpcCollector{})
	_, plainPort, _ := net.SplitHostPort(plain)

	// TLS collectors under example.com, a name their test certificate
	// carries.
	httpsCol := &httpCollector{}
	httpsSrv := httptest.NewTLSServer(httpsCol)
	defer httpsSrv.Close()
	ca := writeCA(t, httpsSrv)
	_, httpsPort, _ := net.SplitHostPort(httpsSrv.Listener.Addr().String())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.Creds(credentials.NewServerTLSFromCert(&httpsSrv.TLS.Certificates[0])))
	tlsCol := &grpcCollector{}
	coltracepb.RegisterTraceServiceServer(gs, tlsCol)
	go gs.Serve(ln) //nolint:errcheck // ends with Stop
	defer gs.Stop()
	_, tlsPort, _ := net.SplitHostPort(ln.Addr().String())

	proxy, proxyAddr := startProxy(t, map[string]string{
		"collector.test:" + plainPort: plain,
		"example.com:" + tlsPort:      ln.Addr().String(),
		"example.com:" + httpsPort:    httpsSrv.Listener.Addr().String(),
	})
	cases := []struct {
		name   string
		env    map[string]string
		target string
		auth   string
	}{
		{name: "grpc plain text", target: "collector.test:" + plainPort, auth: "Basic aG9wcGVyOnMzY3IzdA==",
			env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
				"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector.test:" + plainPort,
				"HTTPS_PROXY":                 "http://hopper:s3cr3t@" + proxyAddr}},
		{name: "grpc over TLS", target: "example.com:" + tlsPort,
			env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
				"OTEL_EXPORTER_OTLP_ENDPOINT": "https://example.com:" + tlsPort, "OTEL_EXPORTER_OTLP_CERTIFICATE": ca,
				"https_proxy": proxyAddr}},
		{name: "http/protobuf over TLS", target: "example.com:" + httpsPort,
			env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://example.com:" + httpsPort + "/base",
				"OTEL_EXPORTER_OTLP_CERTIFICATE": ca, "HTTPS_PROXY": "http://" + proxyAddr,
				"NO_PROXY": "other.test,.example.org"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			proxy.mu.Lock()
			before := len(proxy.targets)
			proxy.mu.Unlock()
			tc.env["OTEL_EXPORTER_OTLP_TIMEOUT"] = "5000"
			cfg := mustConfig(t, tc.env)
			cfg.UserAgent = UserAgent("1.4.2")
			if err := New(cfg).ExportSpans(context.Background(), sampleSpans(t)); err != nil {
				t.Fatalf("export through the proxy: %v", err)
			}
			proxy.mu.Lock()
			defer proxy.mu.Unlock()
			if len(proxy.targets) != before+1 || proxy.targets[before] != tc.target {
				t.Fatalf("CONNECTs = %q, want one more to %s", proxy.targets, tc.target)
			}
			if proxy.auth[before] != tc.auth {
				t.Errorf("Proxy-Authorization = %q, want %q", proxy.auth[before], tc.auth)
			}
			if tc.env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc" && proxy.agents[before] != "hopper/1.4.2 OTLP-exporter" {
				t.Errorf("CONNECT User-Agent = %q", proxy.agents[before])
			}
		})
	}
}

// Which proxy, if any, the collector is reached through: HTTPS_PROXY for
// gRPC whatever the scheme, the scheme's variable for http/protobuf,
// never for NO_PROXY's hosts or a loopback collector.
func TestProxyFromEnv(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		want string
		err  string
	}{
		{name: "grpc takes HTTPS_PROXY for plain text", want: "http://p:3128",
			env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317",
				"HTTPS_PROXY": "http://p:3128", "HTTP_PROXY": "http://other:3128"}},
		{name: "grpc ignores HTTP_PROXY",
			env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317",
				"HTTP_PROXY": "http://p:3128"}},
		{name: "lower case, bare host:port", want: "http://p:3128",
			env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "c:4317",
				"https_proxy": "p:3128"}},
		{name: "NO_PROXY domain",
			env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "https://c.mon.svc:4317",
				"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "x,.svc"}},
		{name: "no_proxy lower case",
			env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4318",
				"HTTPS_PROXY": "http://p:3128", "no_proxy": "c"}},
		{name: "loopback collector",
			env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
				"HTTPS_PROXY": "http://p:3128"}},
		{name: "http/protobuf plain text takes HTTP_PROXY", want: "http://q:8080",
			env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
				"HTTPS_PROXY": "http://p:3128", "HTTP_PROXY": "http://q:8080"}},
		{name: "http/protobuf TLS takes HTTPS_PROXY", want: "https://p:3129",
			env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4318",
				"HTTPS_PROXY": "https://p:3129", "HTTP_PROXY": "http://q:8080"}},
		{name: "grpc through an https proxy", err: `HTTPS_PROXY "https://p:3129": gRPC export goes through an http:// proxy`,
			env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317",
				"HTTPS_PROXY": "https://p:3129"}},
		{name: "unreadable proxy", err: `HTTPS_PROXY "http://p:port": parse`,
			env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317",
				"HTTPS_PROXY": "http://p:port"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := FromEnv(env(tc.env))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			if cfg.Proxy != nil {
				got = cfg.Proxy.String()
			}
			if got != tc.want {
				t.Errorf("proxy = %q, want %q", got, tc.want)
			}
		})
	}
}
