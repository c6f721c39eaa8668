package otlp

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpproxy"

	"github.com/hopper-sidecar/hopper/internal/redact"
)

// Protocols the exporter speaks, as OTEL_EXPORTER_OTLP_PROTOCOL names them.
const (
	ProtocolHTTP = "http/protobuf"
	ProtocolGRPC = "grpc"
)

// DefaultTimeout bounds one export when OTEL_EXPORTER_OTLP_TIMEOUT is unset.
const DefaultTimeout = 10 * time.Second

// grpcMethod is the collector's trace export method.
const grpcMethod = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"

// Config is where and how spans are sent.
type Config struct {
	Protocol string
	// URL is the full request URL: the traces path for http/protobuf, the
	// export method's path for gRPC.
	URL     string
	Headers map[string]string
	Timeout time.Duration
	Gzip    bool
	// TLS is nil for a plain-text endpoint.
	TLS *tls.Config
	// Proxy is the HTTP proxy to reach the collector through, nil for a
	// direct connection.
	Proxy *url.URL
	// UserAgent is sent with every export; New uses UserAgent("") when
	// it is empty.
	UserAgent string
}

// FromEnv reads the standard OTEL_EXPORTER_OTLP_* variables, each
// OTEL_EXPORTER_OTLP_TRACES_* one winning over its general form. It returns
// ok false when no endpoint is set. A value that cannot be used is an
// error naming the variable, where an exporter that ignored it would send
// traces somewhere else, or nowhere, without a word.
func FromEnv(getenv func(string) string) (cfg Config, ok bool, err error) {
	get := func(name string) (string, string) {
		if v := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_" + name)); v != "" {
			return v, "OTEL_EXPORTER_OTLP_TRACES_" + name
		}
		return strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_" + name)), "OTEL_EXPORTER_OTLP_" + name
	}
	endpoint, endpointVar := get("ENDPOINT")
	if endpoint == "" {
		return Config{}, false, nil
	}
	cfg.Protocol, _ = get("PROTOCOL")
	switch cfg.Protocol {
	case "":
		cfg.Protocol = ProtocolHTTP
	case ProtocolHTTP, ProtocolGRPC:
	default:
		return Config{}, false, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q not supported (want grpc or http/protobuf)", cfg.Protocol)
	}

	secure, err := cfg.setURL(endpoint, endpointVar, getenv)
	if err != nil {
		return Config{}, false, err
	}

	if v, name := get("HEADERS"); v != "" {
		if cfg.Headers, err = parseHeaders(v); err != nil {
			return Config{}, false, fmt.Errorf("%s: %w", name, err)
		}
	}
	cfg.Timeout = DefaultTimeout
	if v, name := get("TIMEOUT"); v != "" {
		ms, err := strconv.Atoi(v)
		if err != nil || ms <= 0 {
			return Config{}, false, fmt.Errorf("%s %q: want a positive number of milliseconds", name, v)
		}
		cfg.Timeout = time.Duration(ms) * time.Millisecond
	}
	switch v, name := get("COMPRESSION"); v {
	case "", "none":
	case "gzip":
		cfg.Gzip = true
	default:
		return Config{}, false, fmt.Errorf("%s %q: want gzip or none", name, v)
	}
	if secure {
		if cfg.TLS, err = tlsFromEnv(get); err != nil {
			return Config{}, false, err
		}
	}
	if cfg.Proxy, err = cfg.proxyFromEnv(getenv); err != nil {
		return Config{}, false, err
	}
	return cfg, true, nil
}

// proxyFromEnv picks the proxy for the collector from HTTPS_PROXY,
// HTTP_PROXY and NO_PROXY (or their lower-case forms), as net/http does
// for http/protobuf: by the URL's scheme, never for localhost or a
// loopback address. gRPC is always tunnelled with CONNECT and, as gRPC
// clients do, takes HTTPS_PROXY whether or not the connection inside is
// TLS.
func (cfg *Config) proxyFromEnv(getenv func(string) string) (*url.URL, error) {
	either := func(upper string) (string, string) {
		if v := getenv(upper); v != "" {
			return v, upper
		}
		return getenv(strings.ToLower(upper)), strings.ToLower(upper)
	}
	httpsProxy, httpsName := either("HTTPS_PROXY")
	httpProxy, httpName := either("HTTP_PROXY")
	noProxy, _ := either("NO_PROXY")
	target, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("collector URL %q: %w", redact.URL(cfg.URL), redact.Error(err, cfg.URL))
	}
	name, value := httpName, httpProxy
	if target.Scheme == "https" || cfg.Protocol == ProtocolGRPC {
		target.Scheme, name, value = "https", httpsName, httpsProxy
	}
	// The proxy function leaves out a value it cannot read, which would
	// send spans around the proxy without a word.
	if err := checkProxy(value); err != nil {
		return nil, fmt.Errorf("%s %q: %w", name, redact.URL(value), redact.Error(err, value))
	}
	proxy, err := (&httpproxy.Config{HTTPProxy: httpProxy, HTTPSProxy: httpsProxy, NoProxy: noProxy}).ProxyFunc()(target)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, redact.Error(err, value))
	}
	if proxy != nil && cfg.Protocol == ProtocolGRPC && proxy.Scheme != "http" {
		return nil, fmt.Errorf("%s %q: gRPC export goes through an http:// proxy (CONNECT), not %s://", name, proxy.Redacted(), proxy.Scheme)
	}
	return proxy, nil
}

// setURL derives the request URL from the endpoint and reports whether
// it is TLS. For http/protobuf the general endpoint is a base URL and
// /v1/traces is added to its path, while the traces endpoint is used as
// it is. A gRPC endpoint may also be a bare host:port, made plain text by
// OTEL_EXPORTER_OTLP_INSECURE=true.
func (cfg *Config) setURL(endpoint, name string, getenv func(string) string) (secure bool, err error) {
	perSignal := strings.HasPrefix(name, "OTEL_EXPORTER_OTLP_TRACES_")
	if cfg.Protocol == ProtocolGRPC && !strings.Contains(endpoint, "://") {
		insecure := getenv("OTEL_EXPORTER_OTLP_TRACES_INSECURE")
		if insecure == "" {
			insecure = getenv("OTEL_EXPORTER_OTLP_INSECURE")
		}
		scheme := "https"
		if strings.EqualFold(strings.TrimSpace(insecure), "true") {
			scheme = "http"
		}
		endpoint = scheme + "://" + endpoint
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return false, fmt.Errorf("%s %q: %w", name, redact.URL(endpoint), redact.Error(err, endpoint))
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return false, fmt.Errorf("%s %q: want an http:// or https:// URL with a host", name, redact.URL(endpoint))
	}
	switch {
	case cfg.Protocol == ProtocolGRPC:
		u.Path = grpcMethod
	case !perSignal:
		u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
	case u.Path == "":
		u.Path = "/"
	}
	cfg.URL = u.String()
	return u.Scheme == "https", nil
}

// checkProxy reports whether a proxy variable's value reads as a URL,
// "host:port" taken as an http:// one.
func checkProxy(v string) error {
	if v == "" {
		return nil
	}
	u, err := url.Parse(v)
	if err == nil && u.Scheme != "" && u.Host != "" {
		return nil
	}
	if !strings.Contains(v, "://") {
		if u, err2 := url.Parse("http://" + v); err2 == nil && u.Host != "" {
			return nil
		}
	}
	if err == nil {
		err = errors.New("want a proxy URL (http://host:port)")
	}
	return err
}

// parseHeaders reads "key=value,key2=value2", values percent-encoded.
// Its errors name an entry by position and key only: the values are
// credentials as often as not.
func parseHeaders(s string) (map[string]string, error) {
	h := map[string]string{}
	for i, pair := range strings.Split(s, ",") {
		if strings.TrimSpace(pair) == "" {
			continue
		}
		k, v, found := strings.Cut(pair, "=")
		k = strings.TrimSpace(k)
		if !found || k == "" {
			return nil, fmt.Errorf("entry %d: want key=value (the entry is not shown: it may hold a credential)", i+1)
		}
		val, err := url.PathUnescape(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("header %s: %w", k, errBadEscape)
		}
		h[k] = val
	}
	return h, nil
}

// errBadEscape stands for url.PathUnescape's error, which quotes the
// part of the value it could not read.
var errBadEscape = errors.New("the value is not valid percent-encoding (the value is not shown: it may hold a credential)")

// tlsFromEnv builds the client TLS settings: a CA bundle replacing the
// system roots, and a client certificate for mutual TLS.
func tlsFromEnv(get func(string) (string, string)) (*tls.Config, error) {
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if file, name := get("CERTIFICATE"); file != "" {
		pem, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s %s: no PEM certificate in it", name, file)
		}
		conf.RootCAs = pool
	}
	cert, certVar := get("CLIENT_CERTIFICATE")
	key, keyVar := get("CLIENT_KEY")
	switch {
	case cert == "" && key == "":
	case cert == "" || key == "":
		return nil, errors.New("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY go together")
	default:
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("%s/%s: %w", certVar, keyVar, err)
		}
		conf.Certificates = []tls.Certificate{pair}
	}
	return conf, nil
}
