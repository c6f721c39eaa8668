package otlp

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/protobuf/encoding/protowire"
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
	// backoff is the first wait before retrying a refused export; it
	// doubles up to maxBackoff, within the export's deadline.
	backoff time.Duration
}

const maxBackoff = 2 * time.Second

// New returns an exporter for cfg. gRPC goes over HTTP/2: with prior
// knowledge on a plain-text endpoint, by ALPN over TLS.
func New(cfg Config) *Exporter {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = cfg.TLS
	t.MaxIdleConnsPerHost = 2
	if cfg.Protocol == ProtocolGRPC {
		var p http.Protocols
		if cfg.TLS != nil {
			p.SetHTTP2(true)
		} else {
			p.SetUnencryptedHTTP2(true)
		}
		t.Protocols = &p
		t.Proxy = nil
	}
	return &Exporter{cfg: cfg, client: &http.Client{Transport: t}, backoff: 100 * time.Millisecond}
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
	wait := e.backoff
	for {
		err := e.send(ctx, body)
		var r *retryable
		if err == nil || !errors.As(err, &r) {
			return err
		}
		if r.after > wait {
			wait = r.after
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("%w (gave up: %w)", err, ctx.Err())
		case <-timer.C:
		}
		wait = min(2*wait, maxBackoff)
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
		err = fmt.Errorf("otlp export to %s: %w", e.cfg.URL, err)
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
		return &retryable{err: err, after: retryAfter(resp.Header.Get("Retry-After"))}
	}
	return err
}

// retryAfter reads a Retry-After given in seconds; 0 when absent.
func retryAfter(v string) time.Duration {
	s, err := strconv.Atoi(v)
	if err != nil || s <= 0 {
		return 0
	}
	return time.Duration(s) * time.Second
}

// gRPC status codes a client may retry (OTLP/gRPC's list).
var grpcRetryable = map[int]bool{1: true, 4: true, 8: true, 10: true, 11: true, 14: true, 15: true}

// grpcStatus reads grpc-status from the trailers, or from the headers of
// a trailers-only answer.
func grpcStatus(resp *http.Response, readErr error) error {
	code, msg := resp.Trailer.Get("Grpc-Status"), resp.Trailer.Get("Grpc-Message")
	if code == "" {
		code, msg = resp.Header.Get("Grpc-Status"), resp.Header.Get("Grpc-Message")
	}
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
	e := fmt.Errorf("otlp export: collector answered gRPC status %d: %s", n, msg)
	if grpcRetryable[n] {
		return &retryable{err: e}
	}
	return e
}

// Shutdown stops further exports and closes idle connections. Spans
// still queued are flushed by the SDK's processor before it gets here.
func (e *Exporter) Shutdown(context.Context) error {
	e.stopped.Store(true)
	e.client.CloseIdleConnections()
	return nil
}
