package otlp

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/hopper-sidecar/hopper/internal/backoff"
	"github.com/hopper-sidecar/hopper/internal/redact"
)

// Exporter sends spans to one collector. It is an sdktrace.SpanExporter.
type Exporter struct {
	cfg     Config
	client  *http.Client
	stopped atomic.Bool
	// Rejected, when set, is told how many spans of an accepted export
	// the collector said it dropped (a partial success); the export
	// itself succeeded, so they count nowhere else.
	Rejected func(n int64)
	// minBackoff and maxBackoff bound the jittered exponential wait
	// before retrying a refused export, all within the export's deadline.
	minBackoff, maxBackoff time.Duration
	// sleep waits between tries (backoff.Sleep; a test records the waits
	// instead of spending them).
	sleep func(ctx context.Context, d time.Duration) error
}

// The waits between tries start at 100ms and double up to 2s: an export
// has a few seconds at most (the batcher's export timeout), so the
// minutes-long waits of a long-lived client would only end in its
// deadline.
const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 2 * time.Second
)

// UserAgent is the User-Agent both protocols send: the product and its
// version first, then what is talking, so that a collector's logs tell
// Hopper's exporter from the applications' own.
func UserAgent(version string) string {
	if version == "" {
		version = "dev"
	}
	return "hopper/" + version + " OTLP-exporter"
}

// New returns an exporter for cfg. gRPC goes over HTTP/2: with prior
// knowledge on a plain-text endpoint, by ALPN over TLS; through an HTTP
// CONNECT tunnel when cfg.Proxy is set.
func New(cfg Config) *Exporter {
	if cfg.UserAgent == "" {
		cfg.UserAgent = UserAgent("")
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = cfg.TLS
	t.MaxIdleConnsPerHost = 2
	// The proxy was chosen for this one collector when the configuration
	// was read, from the getenv it was given.
	t.Proxy = nil
	if cfg.Proxy != nil {
		t.Proxy = http.ProxyURL(cfg.Proxy)
	}
	if cfg.Protocol == ProtocolGRPC {
		var p http.Protocols
		if cfg.TLS != nil {
			p.SetHTTP2(true)
		} else {
			p.SetUnencryptedHTTP2(true)
		}
		t.Protocols = &p
		// net/http would forward a plain-text request to the proxy as it
		// is, which a proxy cannot do for HTTP/2; gRPC always tunnels.
		t.Proxy = nil
		if cfg.Proxy != nil {
			t.DialContext = connectDialer(cfg.Proxy, cfg.UserAgent)
		}
	}
	return &Exporter{cfg: cfg, client: &http.Client{Transport: t},
		minBackoff: minBackoff, maxBackoff: maxBackoff, sleep: backoff.Sleep}
}

// errStopped is returned by an export after Shutdown.
var errStopped = errors.New("otlp exporter shut down")

// retryable marks a failure the collector asked to be tried again later;
// after is its Retry-After, when it gave one.
type retryable struct {
	err   error
	after time.Duration
}

func (r *retryable) Error() string { return r.err.Error() }
func (r *retryable) Unwrap() error { return r.err }

// ExportSpans sends spans in one request, retrying while the collector
// answers that it is busy or unavailable and the deadline (ctx's, and at
// most the configured timeout) allows.
func (e *Exporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if len(spans) == 0 {
		return nil
	}
	if e.stopped.Load() {
		return errStopped
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	body, err := e.body(Encode(spans))
	if err != nil {
		return err
	}
	b := backoff.Backoff{Min: e.minBackoff, Max: e.maxBackoff}
	for {
		err := e.send(ctx, body)
		var r *retryable
		if err == nil || !errors.As(err, &r) {
			return err
		}
		// A wait the collector asked for that ends past the deadline
		// cannot be honoured: give up now rather than hold the batch.
		if d, ok := ctx.Deadline(); ok && r.after > 0 && time.Until(d) < r.after {
			return fmt.Errorf("%w (the collector asked to wait %v, past the export deadline)", err, r.after)
		}
		// Jittered, so that many sidecars refused together do not come
		// back together; never sooner than the collector asked.
		if serr := e.sleep(ctx, max(b.Next(), r.after)); serr != nil {
			return fmt.Errorf("%w (gave up: %w)", err, serr)
		}
	}
}

// body is the request body: the message, gzipped when configured, and for
// gRPC inside its length-prefixed frame.
func (e *Exporter) body(msg []byte) ([]byte, error) {
	if e.cfg.Gzip {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		if _, err := zw.Write(msg); err != nil {
			return nil, fmt.Errorf("gzip spans: %w", err)
		}
		if err := zw.Close(); err != nil {
			return nil, fmt.Errorf("gzip spans: %w", err)
		}
		msg = buf.Bytes()
	}
	if e.cfg.Protocol != ProtocolGRPC {
		return msg, nil
	}
	framed := make([]byte, 5, 5+len(msg))
	if e.cfg.Gzip {
		framed[0] = 1
	}
	binary.BigEndian.PutUint32(framed[1:], uint32(len(msg)))
	return append(framed, msg...), nil
}

func (e *Exporter) send(ctx context.Context, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("otlp request: %w", err)
	}
	// Set first, so that a User-Agent in the configured headers wins.
	req.Header.Set("User-Agent", e.cfg.UserAgent)
	for k, v := range e.cfg.Headers {
		req.Header.Set(k, v)
	}
	grpc := e.cfg.Protocol == ProtocolGRPC
	if grpc {
		req.Header.Set("Content-Type", "application/grpc")
		req.Header.Set("TE", "trailers")
		if e.cfg.Gzip {
			req.Header.Set("Grpc-Encoding", "gzip")
		}
		if d, ok := ctx.Deadline(); ok {
			req.Header.Set("Grpc-Timeout", strconv.FormatInt(max(time.Until(d).Milliseconds(), 1), 10)+"m")
		}
	} else {
		req.Header.Set("Content-Type", "application/x-protobuf")
		if e.cfg.Gzip {
			req.Header.Set("Content-Encoding", "gzip")
		}
	}
	resp, err := e.client.Do(req)
	if err != nil {
		err = fmt.Errorf("otlp export to %s: %w", redact.URL(e.cfg.URL), redact.Error(err, e.cfg.URL))
		// A certificate that does not verify will not verify on the next
		// try either.
		var certErr *tls.CertificateVerificationError
		if errors.As(err, &certErr) {
			return err
		}
		// The collector was not reached or the connection broke: worth
		// another try while the deadline allows.
		return &retryable{err: err}
	}
	defer resp.Body.Close()
	// Read the whole answer: gRPC's status comes in trailers after it, and
	// a drained body lets the connection be reused.
	answer, readErr := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if grpc && resp.StatusCode == http.StatusOK {
		err = grpcStatus(resp, readErr)
		if err == nil && len(answer) >= 5 && answer[0] == 0 {
			answer = answer[5:] // the frame's header; a compressed answer is not read
		} else {
			answer = nil
		}
	} else {
		err = httpStatus(resp, answer)
	}
	if err == nil && e.Rejected != nil && readErr == nil {
		if n := rejectedSpans(answer); n > 0 {
			e.Rejected(n)
		}
	}
	return err
}

// rejectedSpans reads partial_success.rejected_spans from an
// ExportTraceServiceResponse; 0 when absent or unreadable.
func rejectedSpans(b []byte) int64 {
	partial := field(b, 1, protowire.BytesType)
	if partial == nil {
		return 0
	}
	v := field(partial, 1, protowire.VarintType)
	if v == nil {
		return 0
	}
	n, _ := protowire.ConsumeVarint(v)
	return int64(n)
}

// field returns the last occurrence of field num of type typ in the
// message b (for a varint, its encoding; for bytes, the contents), or nil.
func field(b []byte, num protowire.Number, typ protowire.Type) []byte {
	var out []byte
	for len(b) > 0 {
		n, t, l := protowire.ConsumeTag(b)
		if l < 0 {
			return nil
		}
		b = b[l:]
		vl := protowire.ConsumeFieldValue(n, t, b)
		if vl < 0 {
			return nil
		}
		if n == num && t == typ {
			out = b[:vl]
			if t == protowire.BytesType {
				out, _ = protowire.ConsumeBytes(out)
			}
		}
		b = b[vl:]
	}
	return out
}

// httpStatus turns an OTLP/HTTP answer into an error; 429, 502, 503 and
// 504 are retryable, as the protocol specifies.
func httpStatus(resp *http.Response, answer []byte) error {
	if resp.StatusCode/100 == 2 {
		return nil
	}
	err := fmt.Errorf("otlp export: collector answered %s: %.200s", resp.Status, answer)
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return &retryable{err: err, after: retryAfter(resp.Header.Get("Retry-After"), time.Now())}
	}
	return err
}

// retryAfter reads a Retry-After header, given either as seconds or as
// an HTTP-date (then the wait is from now until it); 0 when absent,
// unreadable or already past.
func retryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s <= 0 {
			return 0
		}
		// Beyond what a Duration holds is "later than any deadline".
		return time.Duration(min(s, int64(math.MaxInt64/time.Second))) * time.Second
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(at.Sub(now), 0)
	}
	return 0
}

// gRPC status codes.
const (
	grpcCanceled          = 1
	grpcDeadlineExceeded  = 4
	grpcResourceExhausted = 8
	grpcAborted           = 10
	grpcOutOfRange        = 11
	grpcUnavailable       = 14
	grpcDataLoss          = 15
)

// grpcRetryable are the codes OTLP/gRPC lets a client retry whatever the
// status carries. RESOURCE_EXHAUSTED is retried only when the status
// carries a RetryInfo: without one the collector has not said that
// trying again can succeed (a batch too large stays too large).
var grpcRetryable = map[int]bool{grpcCanceled: true, grpcDeadlineExceeded: true, grpcAborted: true,
	grpcOutOfRange: true, grpcUnavailable: true, grpcDataLoss: true}

// grpcStatus reads grpc-status from the trailers, or from the headers of
// a trailers-only answer, with the RetryInfo of its details.
func grpcStatus(resp *http.Response, readErr error) error {
	meta := resp.Trailer
	if meta.Get("Grpc-Status") == "" {
		meta = resp.Header
	}
	code, msg := meta.Get("Grpc-Status"), meta.Get("Grpc-Message")
	if code == "" {
		if readErr != nil {
			return &retryable{err: fmt.Errorf("otlp export: reading the answer: %w", readErr)}
		}
		return errors.New("otlp export: the gRPC answer carried no grpc-status")
	}
	n, err := strconv.Atoi(code)
	if err != nil {
		return fmt.Errorf("otlp export: grpc-status %q is not a number", code)
	}
	if n == 0 {
		return nil
	}
	if m, err := url.PathUnescape(msg); err == nil {
		msg = m
	}
	delay, hasInfo := retryInfo(meta.Get("Grpc-Status-Details-Bin"))
	switch {
	case grpcRetryable[n] || (n == grpcResourceExhausted && hasInfo):
		return &retryable{err: fmt.Errorf("otlp export: collector answered gRPC status %d: %s", n, msg), after: delay}
	case n == grpcResourceExhausted:
		return fmt.Errorf("otlp export: collector answered gRPC status %d: %s (not retried: no RetryInfo says it may pass)", n, msg)
	}
	return fmt.Errorf("otlp export: collector answered gRPC status %d: %s", n, msg)
}

// retryInfo finds a google.rpc.RetryInfo among the details of the
// google.rpc.Status in a grpc-status-details-bin value (base64, padded or
// not) and returns its retry_delay. ok is false when there is none or the
// value cannot be read.
func retryInfo(bin string) (delay time.Duration, ok bool) {
	if bin == "" {
		return 0, false
	}
	enc := base64.RawStdEncoding
	if len(bin)%4 == 0 {
		enc = base64.StdEncoding
	}
	st, err := enc.DecodeString(bin)
	if err != nil {
		return 0, false
	}
	// Status.details (3) are Anys: type_url (1) and value (2).
	for _, detail := range fields(st, 3) {
		typeURL := field(detail, 1, protowire.BytesType)
		if !strings.HasSuffix(string(typeURL), "/google.rpc.RetryInfo") {
			continue
		}
		// RetryInfo.retry_delay (1) is a Duration: seconds (1), nanos (2).
		d := field(field(detail, 2, protowire.BytesType), 1, protowire.BytesType)
		secs, _ := protowire.ConsumeVarint(field(d, 1, protowire.VarintType))
		nanos, _ := protowire.ConsumeVarint(field(d, 2, protowire.VarintType))
		s, ns := int64(secs), int64(int32(nanos))
		if s < 0 || ns < 0 {
			return 0, true
		}
		if s >= int64(math.MaxInt64/time.Second) {
			return time.Duration(math.MaxInt64), true
		}
		return time.Duration(s)*time.Second + time.Duration(ns), true
	}
	return 0, false
}

// fields returns the contents of every occurrence of the length-delimited
// field num in the message b.
func fields(b []byte, num protowire.Number) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		n, t, l := protowire.ConsumeTag(b)
		if l < 0 {
			return out
		}
		b = b[l:]
		vl := protowire.ConsumeFieldValue(n, t, b)
		if vl < 0 {
			return out
		}
		if n == num && t == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b[:vl])
			out = append(out, v)
		}
		b = b[vl:]
	}
	return out
}

// connectDialer dials the collector through an HTTP proxy's CONNECT
// tunnel, as gRPC clients do whether or not the connection inside is
// TLS. Credentials in the proxy URL go as Basic Proxy-Authorization.
func connectDialer(proxy *url.URL, userAgent string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	proxyAddr := proxy.Host
	if proxy.Port() == "" {
		proxyAddr = net.JoinHostPort(proxy.Hostname(), "80")
	}
	return func(ctx context.Context, network, addr string) (_ net.Conn, err error) {
		conn, err := d.DialContext(ctx, network, proxyAddr)
		if err != nil {
			return nil, fmt.Errorf("dial proxy %s: %w", proxy.Redacted(), err)
		}
		defer func() {
			if err != nil {
				conn.Close()
			}
		}()
		if dl, ok := ctx.Deadline(); ok {
			conn.SetDeadline(dl)                //nolint:errcheck // a failed write or read reports it
			defer conn.SetDeadline(time.Time{}) //nolint:errcheck // as above
		}
		req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Host: addr}, Host: addr,
			Header: http.Header{"User-Agent": {userAgent}}}
		if u := proxy.User; u != nil {
			pw, _ := u.Password()
			req.Header.Set("Proxy-Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(u.Username()+":"+pw)))
		}
		if err := req.Write(conn); err != nil {
			return nil, fmt.Errorf("CONNECT %s through proxy %s: %w", addr, proxy.Redacted(), err)
		}
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			return nil, fmt.Errorf("CONNECT %s through proxy %s: %w", addr, proxy.Redacted(), err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("CONNECT %s through proxy %s: the proxy answered %s", addr, proxy.Redacted(), resp.Status)
		}
		if br.Buffered() > 0 {
			return &bufferedConn{Conn: conn, r: br}, nil
		}
		return conn, nil
	}
}

// bufferedConn reads first what the CONNECT answer's reader took past
// the answer.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// Shutdown stops further exports and closes idle connections. Spans
// still queued are flushed by the SDK's processor before it gets here.
func (e *Exporter) Shutdown(context.Context) error {
	e.stopped.Store(true)
	e.client.CloseIdleConnections()
	return nil
}
