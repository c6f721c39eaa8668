package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/hopper-sidecar/hopper/internal/redact"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// ClientOptions configure the fasthttp client that talks to the app. Zero
// values take the defaults named.
type ClientOptions struct {
	// URL may hold {routingKey} and {queue} in its path. Required.
	URL string
	// QueueURLs, when set, give the messages of some queues a URL of their
	// own (same templates as URL); a queue not listed uses URL. One app is
	// behind all of them: the connection pool is shared. Default none.
	QueueURLs map[string]string
	// RouteURLs, when set, give the messages a queue's routing rules sent
	// down a route a URL of their own (same templates as URL), by queue
	// and route name; a route not listed uses its queue's URL. Default
	// none.
	RouteURLs map[string]map[string]string
	// Timeout bounds one request (dial, send, wait, read). Default 0: no
	// bound, so callers always set it (config default 30s).
	Timeout time.Duration
	// MaxConns bounds open connections; it should be at least the worker
	// count so no worker waits for a connection. A request past it waits
	// for a connection to come free, and its timeout starts once it has
	// one. Default 64.
	MaxConns int
	// MaxBodyBytes bounds the response body read. Default 0: fasthttp's
	// own limit (config default 64 KiB).
	MaxBodyBytes int
	// Tracer makes the CLIENT span of each request. Default noop.
	Tracer trace.Tracer
	// CloudEvents adds the CloudEvents binary-mode ce-* headers. Default
	// false.
	CloudEvents bool
	// Limits bound each request's head; application headers past them
	// are left out. Default DefaultLimits.
	Limits Limits
	// Auth adds a token and a body signature to every request. Default
	// nil: none.
	Auth *Auth
	// TLS is the configuration of https:// connections (see NewTLS).
	// Default nil: the system's roots, no client certificate.
	TLS *tls.Config
}

// Client delivers messages to the app with pooled keep-alive connections.
type Client struct {
	opts     ClientOptions
	client   *fasthttp.Client
	template bool
	urlAttr  string
	// tracing is false when opts.Tracer records nothing: a request then
	// starts no span, whose context and options would each be made for
	// every message only to be dropped.
	tracing bool
	// spanAttrs are the CLIENT span's fixed attributes: method, URL and
	// the app's address.
	spanAttrs []attribute.KeyValue
	conns     connSet
	// slots holds a token per request on a connection: at most MaxConns,
	// so fasthttp always has a connection to give and never refuses one
	// on its own.
	slots chan struct{}
	// waiting counts the requests waiting for a slot.
	waiting atomic.Int64
	// watched is the Done channel of the context whose cancellation
	// closes conns already (see do).
	watched atomic.Pointer[<-chan struct{}]
	// HeadersSkipped counts application headers not forwarded because
	// their name is not an HTTP token or their value not a scalar.
	HeadersSkipped atomic.Int64
	// omitted counts application headers the limits left out, indexed
	// like OmitReasons.
	omitted [3]atomic.Int64
}

// OmitReasons name why a forwardable application header was left out of a
// request: its value over Limits.MaxValueBytes, or past the header count or
// head size bound.
var OmitReasons = [3]string{"value-too-long", "max-headers", "max-header-bytes"}

// HeadersOmitted is the number of application headers the limits have
// left out, by reason (every one of OmitReasons present).
func (a *Client) HeadersOmitted() map[string]int64 {
	m := make(map[string]int64, len(OmitReasons))
	for i, r := range OmitReasons {
		m[r] = a.omitted[i].Load()
	}
	return m
}

// NewClient returns the app client.
func NewClient(o ClientOptions) *Client {
	if o.MaxConns < 1 {
		o.MaxConns = 64
	}
	c := &fasthttp.Client{
		Name:                          "hopper",
		MaxConnsPerHost:               o.MaxConns,
		MaxIdleConnDuration:           30 * time.Second,
		ReadTimeout:                   o.Timeout,
		WriteTimeout:                  o.Timeout,
		MaxResponseBodySize:           o.MaxBodyBytes,
		NoDefaultUserAgentHeader:      false,
		DisableHeaderNamesNormalizing: true,
		DisablePathNormalizing:        true,
		// POST is not idempotent: never resend on our own; the outcome
		// table decides what happens after a failure.
		RetryIfErr: func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
		TLSConfig:  o.TLS,
	}
	if o.Tracer == nil {
		o.Tracer = noop.NewTracerProvider().Tracer("hopper")
	}
	_, off := o.Tracer.(noop.Tracer)
	a := &Client{opts: o, client: c, template: strings.Contains(o.URL, "{"), urlAttr: redact.URL(o.URL),
		tracing: !off, slots: make(chan struct{}, o.MaxConns)}
	for _, u := range o.QueueURLs {
		a.template = a.template || strings.Contains(u, "{")
	}
	for _, routes := range o.RouteURLs {
		for _, u := range routes {
			a.template = a.template || strings.Contains(u, "{")
		}
	}
	a.spanAttrs = []attribute.KeyValue{semconv.HTTPRequestMethodPost, semconv.URLFull(a.urlAttr)}
	if u, err := url.Parse(strings.NewReplacer("{", "", "}", "").Replace(o.URL)); err == nil && u.Hostname() != "" {
		a.spanAttrs = append(a.spanAttrs, semconv.ServerAddress(u.Hostname()))
		port, _ := strconv.Atoi(u.Port())
		if port == 0 {
			port = map[string]int{"http": 80, "https": 443}[u.Scheme]
		}
		if port > 0 {
			a.spanAttrs = append(a.spanAttrs, semconv.ServerPort(port))
		}
	}
	c.DialTimeout = func(addr string, timeout time.Duration) (net.Conn, error) {
		conn, err := fasthttp.DialTimeout(addr, timeout)
		if err != nil {
			return nil, err
		}
		return a.conns.track(conn), nil
	}
	return a
}

// connSet tracks the open connections to the app, so that a cancelled
// context (the end of the shutdown grace period) can cut in-flight calls
// off: fasthttp only knows deadlines.
type connSet struct {
	mu sync.Mutex
	m  map[*trackedConn]struct{}
}

type trackedConn struct {
	net.Conn
	set *connSet
	// raw is the connection's descriptor access, for peeking; nil when
	// it has none.
	raw syscall.RawConn
	// answered is set when the app has sent bytes since the last request
	// was written: the next write starts a request on a connection that
	// sat idle in the pool, which the app may have closed meanwhile.
	answered atomic.Bool
}

// errStaleConn is a keep-alive connection the app closed while it sat idle,
// found before a byte of the next request was written: that request never
// reached the app, so it may go again on a fresh connection.
var errStaleConn = errors.New("idle keep-alive connection closed by the app")

// Read notes that the app answered on this connection.
func (c *trackedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.answered.Store(true)
	}
	return n, err
}

// Write checks, before the first byte of a request on a reused connection,
// that the app has not closed it. Only a request written to a connection
// that was open at that moment can have reached the app; a cut after that
// is the app's doing (it took the message, then broke or died), and is
// never sent again on Hopper's own initiative.
func (c *trackedConn) Write(p []byte) (int, error) {
	if c.answered.Swap(false) {
		if peerClosed(c.raw) {
			return 0, errStaleConn
		}
	}
	return c.Conn.Write(p)
}

func (c *trackedConn) Close() error {
	c.set.mu.Lock()
	delete(c.set.m, c)
	c.set.mu.Unlock()
	return c.Conn.Close()
}

func (s *connSet) track(conn net.Conn) net.Conn {
	tc := &trackedConn{Conn: conn, set: s, raw: rawConn(conn)}
	s.mu.Lock()
	if s.m == nil {
		s.m = map[*trackedConn]struct{}{}
	}
	s.m[tc] = struct{}{}
	s.mu.Unlock()
	return tc
}

// anyClosedByApp reports whether the app has closed one of the connections
// that answered before and sit idle now. A process that dies closes all of
// its connections, idle ones included; a handler that breaks on one
// message closes only its own. Bytes waiting on a connection (an answer
// being read) say nothing and are not counted.
func (s *connSet) anyClosedByApp() bool {
	s.mu.Lock()
	conns := make([]*trackedConn, 0, len(s.m))
	for c := range s.m {
		if c.answered.Load() {
			conns = append(conns, c)
		}
	}
	s.mu.Unlock()
	for _, c := range conns {
		if peerGone(c.raw) {
			return true
		}
	}
	return false
}

// count is the number of open connections.
func (s *connSet) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// Restarted reports whether the app has closed an idle keep-alive
// connection of Hopper's: the mark of the app's process ending, which a
// quick restart leaves behind after the health check passes again.
func (a *Client) Restarted() bool { return a.conns.anyClosedByApp() }

// closeAll closes every connection; calls on them fail at once.
func (s *connSet) closeAll() {
	s.mu.Lock()
	conns := make([]net.Conn, 0, len(s.m))
	for c := range s.m {
		conns = append(conns, c.Conn)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.Close() //nolint:errcheck // cutting calls off; the callers see the error
	}
}

// Deliver POSTs one message and classifies the result.
func (a *Client) Deliver(ctx context.Context, m *msg.Message, in msg.Info) retry.Outcome {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)

	creds, head := a.prepare(req, m, in)
	// The CLIENT span's context goes to the app as traceparent, so the app's
	// own spans join the message's trace.
	span := noopSpan
	if a.tracing {
		ctx, span = a.opts.Tracer.Start(ctx, "POST", clientSpan)
		defer span.End()
		if span.IsRecording() {
			span.SetAttributes(a.spanAttrs...)
		}
	}
	a.addHeaders(ctx, req, m, in, head)
	creds.authenticate(req)
	return a.exchange(ctx, span, req, resp)
}

// prepare sets the request line, content type and body of one message's
// request, and returns its token and keys with the room the head has
// taken, theirs included.
func (a *Client) prepare(req *fasthttp.Request, m *msg.Message, in msg.Info) (credentials, Head) {
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI(a.url(in))
	ct := m.ContentType
	if ct == "" {
		ct = "application/octet-stream"
	}
	ct = cut(cleanValue(ct), ownValueMax)
	req.Header.SetContentType(ct)
	req.SetBodyRaw(m.Body)
	var id string
	if a.opts.Auth.signs() {
		id = DeliveryID(m, in)
	}
	creds, auth := a.credentials(id)
	head := a.head(req, ct, len(m.Body))
	head.Headers += auth.Headers
	head.Bytes += auth.Bytes
	return creds, head
}

// addHeaders adds Hopper's headers, the trace context of ctx's span and the
// message's application headers to a prepared request, within the limits
// of what head leaves.
func (a *Client) addHeaders(ctx context.Context, req *fasthttp.Request, m *msg.Message, in msg.Info, head Head) {
	var extra traceHeaders
	if a.opts.CloudEvents {
		extra = CloudEventHeaders(extra, m, in)
	}
	if trace.SpanContextFromContext(ctx).IsValid() {
		// The propagator writes nothing for a context without a span
		// context (tracing off), and handing it extra would move extra to
		// the heap for every request.
		extra = injectTrace(ctx, extra)
	}
	hdrs, om := a.opts.Limits.Build(make([]Header, 0, 24), m, in, extra, head)
	a.countOmitted(om)
	// Build returns each name once, and none the request has already
	// (Content-Type, Host, User-Agent, Content-Length): adding them spares
	// the search Set makes through the headers set before for each one.
	for _, h := range hdrs {
		req.Header.Add(h.Name, h.Value)
	}
}

// injectTrace appends the trace context of ctx to extra.
func injectTrace(ctx context.Context, extra traceHeaders) traceHeaders {
	propagator.Inject(ctx, &extra)
	return extra
}

// clientSpan is the option of every CLIENT span, made once.
var clientSpan = trace.WithSpanKind(trace.SpanKindClient)

// noopSpan is the span of a request when tracing is off.
var noopSpan = trace.SpanFromContext(context.Background())

// exchange sends a request built by Deliver or DeliverBatch and classifies
// what happened, recording it on the CLIENT span.
func (a *Client) exchange(ctx context.Context, span trace.Span, req *fasthttp.Request, resp *fasthttp.Response) retry.Outcome {
	if !a.takeSlot(ctx) {
		span.SetStatus(codes.Error, "cancelled")
		span.SetAttributes(semconv.ErrorTypeKey.String("cancelled"))
		return retry.Outcome{Kind: retry.Unavailable, Error: "request not sent: " + context.Cause(ctx).Error() + " while waiting for a connection", CutOff: true}
	}
	defer func() { <-a.slots }()
	deadline := time.Now().Add(a.opts.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	err := a.do(ctx, req, resp, deadline)
	if errors.Is(err, errStaleConn) && ctx.Err() == nil && time.Now().Before(deadline) {
		// A pooled keep-alive connection the app closed while idle (it
		// restarted, or its idle timeout ran out), found before the request
		// was written: drop every idle connection and send on a fresh one.
		// The app never saw this request, so sending it is no resend; if
		// the fresh connection is refused the app is down, a refusal.
		a.client.CloseIdleConnections()
		resp.Reset()
		err = a.do(ctx, req, resp, deadline)
	}
	if err != nil && errors.Is(ctx.Err(), context.Canceled) {
		// Shutdown cut the call off. The app may still have done the work;
		// the message goes back to the queue unacked either way.
		span.SetStatus(codes.Error, "cancelled")
		span.SetAttributes(semconv.ErrorTypeKey.String("cancelled"))
		return retry.Outcome{Kind: retry.Unavailable, Error: "request cancelled by shutdown", CutOff: true}
	}
	if err != nil && !(errors.Is(err, fasthttp.ErrBodyTooLarge) && resp.StatusCode() > 0) {
		o := classify(err)
		span.SetStatus(codes.Error, o.Error)
		span.SetAttributes(semconv.ErrorTypeKey.String(map[bool]string{true: "timeout", false: "unavailable"}[o.Kind == retry.Timeout]))
		return o
	}
	// A body over the limit does not undo the status: the app answered.
	o := retry.Outcome{Kind: retry.Response, Status: resp.StatusCode()}
	if span.IsRecording() {
		span.SetAttributes(semconv.HTTPResponseStatusCode(o.Status))
	}
	if o.Status >= 500 {
		// The HTTP client conventions: a 5xx is an error of the call, and
		// error.type is its status code.
		span.SetStatus(codes.Error, "HTTP "+itoa(o.Status))
		span.SetAttributes(semconv.ErrorTypeKey.String(itoa(o.Status)))
	}
	if v := resp.Header.Peek(HdrAction); len(v) > 0 {
		o.Override = string(v)
	}
	if v := resp.Header.Peek(HdrRetryAfter); len(v) > 0 {
		o.RetryAfter, o.HasRetryAfter = retry.ParseRetryAfter(string(v), time.Now())
	}
	if o.Status < 200 || o.Status > 299 {
		o.Error = fmt.Sprintf("HTTP %d: %s", o.Status, summary(resp.Body()))
	}
	return o
}

// takeSlot waits for a connection to be free for one request, as long as
// ctx lasts: more requests than connections (the messages of a batch that
// timed out, sent again each alone) queue here rather than be refused by
// the pool, which would read as the app being down and open the breaker
// on a healthy app. The wait is not part of the request's timeout: the
// app has not seen the request yet.
func (a *Client) takeSlot(ctx context.Context) bool {
	select {
	case a.slots <- struct{}{}:
		return true
	default:
	}
	a.waiting.Add(1)
	defer a.waiting.Add(-1)
	select {
	case a.slots <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// do runs the request; cancelling ctx closes the app connections, which
// ends the call at once.
func (a *Client) do(ctx context.Context, req *fasthttp.Request, resp *fasthttp.Response, deadline time.Time) error {
	if done := ctx.Done(); done != nil {
		if err := ctx.Err(); errors.Is(err, context.Canceled) {
			// Cancelled before it was sent: it is not sent. (Watched, it
			// could get its connection after the watch had closed every
			// one, and reach the app after shutdown.)
			return err
		}
		if !a.watching(ctx, done) {
			stop := context.AfterFunc(ctx, a.cutOff(ctx))
			defer stop()
		}
	}
	return a.client.DoDeadline(req, resp, deadline)
}

// watching says whether the cancellation of ctx, whose Done channel is
// done, closes the connections already, and makes it so for the first
// context it is asked about. Every request's context derives from the
// delivery loop's, which is cancelled at shutdown: watched once, it spares
// every request registering a watch on it and taking it down again, each
// a lock on that one context taken by every worker in turn. A context
// done already is not watched here.
func (a *Client) watching(ctx context.Context, done <-chan struct{}) bool {
	select {
	case <-done:
		return false
	default:
	}
	if w := a.watched.Load(); w != nil {
		return *w == done
	}
	// A pointer of its own, made only here: taking done's address would
	// move done to the heap on every call.
	w := new(<-chan struct{})
	*w = done
	if !a.watched.CompareAndSwap(nil, w) {
		return *a.watched.Load() == done
	}
	context.AfterFunc(ctx, a.cutOff(ctx))
	return true
}

// cutOff closes every connection once ctx is cancelled, cutting off the
// requests on them: fasthttp does not watch a context. A deadline is
// fasthttp's own.
func (a *Client) cutOff(ctx context.Context) func() {
	return func() {
		if errors.Is(ctx.Err(), context.Canceled) {
			a.conns.closeAll()
		}
	}
}

// head is what the request's head holds besides the headers Build
// returns, as fasthttp writes it: the request line, User-Agent, Host,
// Content-Type, Content-Length and the blank line after the headers.
func (a *Client) head(req *fasthttp.Request, contentType string, bodyLen int) Head {
	u := req.URI()
	return Head{
		Headers: 4,
		Bytes: len(fasthttp.MethodPost) + 1 + len(u.RequestURI()) + len(" HTTP/1.1\r\n") +
			len("User-Agent") + len(a.client.Name) + 4 +
			len("Host") + len(u.Host()) + 4 +
			len("Content-Type") + len(contentType) + 4 +
			len("Content-Length") + digits(bodyLen) + 4 +
			2,
	}
}

// digits is the length of n written in decimal, counted rather than
// written: a length over 99 written out would allocate its text for
// every request.
func digits(n int) int {
	d := 1
	if n < 0 {
		d, n = 2, -n
	}
	for ; n >= 10; n /= 10 {
		d++
	}
	return d
}

// traceHeaders collects the trace context the propagator writes, for
// Build to place within the limits. A value over ownValueMax is not kept:
// cut, it would be a different trace state.
type traceHeaders []Header

func (c *traceHeaders) Get(string) string { return "" }
func (c *traceHeaders) Set(key, value string) {
	if len(value) <= ownValueMax {
		*c = append(*c, Header{Name: key, Value: value})
	}
}
func (c *traceHeaders) Keys() []string { return nil }

func (a *Client) url(in msg.Info) string {
	u := a.opts.URL
	if q, ok := a.opts.QueueURLs[in.Queue]; ok {
		u = q
	}
	if in.Route != "" {
		if r, ok := a.opts.RouteURLs[in.Queue][in.Route]; ok {
			u = r
		}
	}
	if !a.template {
		return u
	}
	return strings.NewReplacer(
		"{routingKey}", url.PathEscape(in.RoutingKey),
		"{queue}", url.PathEscape(in.Queue),
	).Replace(u)
}

// summary is a short printable prefix of a response body for logs and the
// DLQ x-final-error header.
func summary(b []byte) string {
	const n = 200
	if len(b) > n {
		b = b[:n]
	}
	return strings.TrimSpace(SanitizeValue(strings.ToValidUTF8(string(b), "?")))
}

// classify sorts transport errors into the outcome kinds: no
// request reached the app (unavailable, not an attempt), or the request was
// sent and no answer came (timeout, an attempt), or the app answered
// something that is not HTTP (a failed attempt).
func classify(err error) retry.Outcome {
	o := retry.Outcome{Error: err.Error()}
	var opErr *net.OpError
	switch {
	case errors.Is(err, errStaleConn):
		// Still stale after the fresh try (every connection the app had
		// closed): the request never left Hopper.
		o.Kind = retry.Unavailable
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		// Hopper's own pool had no connection to give: the request never
		// left Hopper, and says nothing about the app. Given back, no
		// attempt spent, never counted against the app.
		o.Kind = retry.Unavailable
		o.Refused = true
	case errors.Is(err, fasthttp.ErrDialTimeout),
		errors.Is(err, syscall.ECONNREFUSED),
		errors.As(err, &opErr) && opErr.Op == "dial":
		o.Kind = retry.Unavailable
	case errors.Is(err, fasthttp.ErrConnectionClosed),
		errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF):
		// Closed or reset before a response: the app went away while it
		// had the request. The breaker asks the health check whether it
		// died; either way the message did not fail.
		o.Kind = retry.Unavailable
		o.Cut = true
	case errors.Is(err, fasthttp.ErrTimeout), errors.Is(err, context.DeadlineExceeded), isTimeout(err):
		o.Kind = retry.Timeout
	default:
		// A garbled response (not HTTP, body over the limit): the app saw
		// the message and failed; status 0 is retried as an attempt.
		o.Kind = retry.Response
		o.Status = 0
	}
	return o
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
