package app

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

var kindNames = map[retry.Kind]string{retry.Response: "response", retry.Timeout: "timeout", retry.Unavailable: "unavailable"}

func deliverTo(t *testing.T, url string, timeout time.Duration, m *msg.Message, in msg.Info) retry.Outcome {
	t.Helper()
	app := NewClient(ClientOptions{URL: url, Timeout: timeout, MaxBodyBytes: 64 << 10})
	if m == nil {
		m = &msg.Message{MessageID: "m1", Body: []byte("hello")}
	}
	return app.Deliver(context.Background(), m, in)
}

// rawServer accepts TCP connections and hands each to serve.
func rawServer(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return "http://" + ln.Addr().String() + "/msg"
}

// readRequest reads one request (headers and body) so that the client has
// finished sending when the test server misbehaves.
func readRequest(c net.Conn) {
	c.SetReadDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck // best effort
	req, err := http.ReadRequest(bufio.NewReader(c))
	if err == nil {
		io.Copy(io.Discard, req.Body) //nolint:errcheck // best effort
	}
}

func TestClassifyConnectionRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	o := deliverTo(t, "http://"+addr+"/", 2*time.Second, nil, msg.Info{})
	if o.Kind != retry.Unavailable {
		t.Fatalf("refused: kind %s (%q), want unavailable", kindNames[o.Kind], o.Error)
	}
	if o.Error == "" {
		t.Error("no error text")
	}
}

func TestClassifyHangingServerTimesOut(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	began := time.Now()
	o := deliverTo(t, srv.URL, 300*time.Millisecond, nil, msg.Info{})
	if o.Kind != retry.Timeout {
		t.Fatalf("hang: kind %s (%q), want timeout", kindNames[o.Kind], o.Error)
	}
	if el := time.Since(began); el < 250*time.Millisecond || el > 5*time.Second {
		t.Errorf("returned after %v with a 300ms timeout", el)
	}
}

func TestClassifyGarbageResponse(t *testing.T) {
	url := rawServer(t, func(c net.Conn) {
		readRequest(c)
		c.Write([]byte("garbage\r\n\r\n")) //nolint:errcheck // the client decides
		// Keep the connection open: the client must fail on what it read,
		// not on the close.
		c.SetReadDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck
		io.Copy(io.Discard, c)                             //nolint:errcheck
	})
	o := deliverTo(t, url, 2*time.Second, nil, msg.Info{})
	if o.Kind != retry.Response || o.Status != 0 {
		t.Fatalf("garbage: kind %s status %d (%q), want response with status 0", kindNames[o.Kind], o.Status, o.Error)
	}
	// Status 0 is a failed attempt in the default table, never an ack.
	if a := retry.DefaultTable().Lookup(o); a != retry.Retry {
		t.Errorf("status 0 -> %v, want retry", a)
	}
}

func TestClassifyCloseWithoutAnswer(t *testing.T) {
	url := rawServer(t, func(c net.Conn) { readRequest(c) })
	o := deliverTo(t, url, 2*time.Second, nil, msg.Info{})
	if o.Kind != retry.Unavailable {
		t.Fatalf("closed: kind %s status %d (%q), want unavailable", kindNames[o.Kind], o.Status, o.Error)
	}
}

func TestClassifyResetOnAccept(t *testing.T) {
	url := rawServer(t, func(c net.Conn) {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0) //nolint:errcheck // close sends RST
		}
	})
	o := deliverTo(t, url, 2*time.Second, nil, msg.Info{})
	if o.Kind != retry.Unavailable {
		t.Fatalf("reset: kind %s status %d (%q), want unavailable", kindNames[o.Kind], o.Status, o.Error)
	}
}

func TestClassifyStatusRetryAfterAndAction(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "7")
		w.Header().Set("Hopper-Action", "dlq")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, "down for\r\nmaintenance")
	}))
	defer srv.Close()
	o := deliverTo(t, srv.URL, 2*time.Second, nil, msg.Info{})
	if o.Kind != retry.Response || o.Status != 503 || o.RetryAfter != 7*time.Second || !o.HasRetryAfter || o.Override != "dlq" {
		t.Fatalf("got %+v", o)
	}
	if !strings.Contains(o.Error, "HTTP 503") || !strings.Contains(o.Error, "down for") || strings.ContainsAny(o.Error, "\r\n") {
		t.Errorf("error %q", o.Error)
	}
}

func TestClassifyStatuses(t *testing.T) {
	for _, code := range []int{200, 204, 400, 404, 409, 425, 429, 500} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(code) }))
		o := deliverTo(t, srv.URL, 2*time.Second, nil, msg.Info{})
		srv.Close()
		if o.Kind != retry.Response || o.Status != code || o.HasRetryAfter || o.Override != "" {
			t.Errorf("%d: got %+v", code, o)
		}
		if (code < 300) != (o.Error == "") {
			t.Errorf("%d: error %q", code, o.Error)
		}
	}
}

// TestClassifyErrors covers the error values fasthttp and the net package
// return, one by one.
func TestClassifyErrors(t *testing.T) {
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
	read := &net.OpError{Op: "read", Net: "tcp", Err: &os.SyscallError{Syscall: "read", Err: syscall.ECONNRESET}}
	cases := []struct {
		err  error
		want retry.Kind
	}{
		{dial, retry.Unavailable},
		{fmt.Errorf("wrapped: %w", syscall.ECONNREFUSED), retry.Unavailable},
		{fasthttp.ErrDialTimeout, retry.Unavailable},
		{fasthttp.ErrNoFreeConns, retry.Unavailable},
		{fasthttp.ErrConnectionClosed, retry.Unavailable},
		{read, retry.Unavailable},
		{syscall.EPIPE, retry.Unavailable},
		{io.EOF, retry.Unavailable},
		{io.ErrUnexpectedEOF, retry.Unavailable},
		{fasthttp.ErrTimeout, retry.Timeout},
		{context.DeadlineExceeded, retry.Timeout},
		{&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, retry.Timeout},
		{errors.New("cannot parse response status line"), retry.Response},
		{fasthttp.ErrBodyTooLarge, retry.Response},
	}
	for _, tc := range cases {
		o := classify(tc.err)
		if own := errors.Is(tc.err, fasthttp.ErrNoFreeConns); o.Refused != own {
			t.Errorf("classify(%v) refused %v, want %v: only a refusal of Hopper's own pool is Hopper's doing", tc.err, o.Refused, own)
		}
		if o.Kind != tc.want {
			t.Errorf("classify(%v) = %s, want %s", tc.err, kindNames[o.Kind], kindNames[tc.want])
		}
		if o.Kind == retry.Response && o.Status != 0 {
			t.Errorf("classify(%v) status %d, want 0", tc.err, o.Status)
		}
		if o.Error != tc.err.Error() {
			t.Errorf("classify(%v) error %q", tc.err, o.Error)
		}
	}
}

// received is what the test app saw of one request.
type received struct {
	method, path, rawPath, contentType string
	header                             http.Header
	body                               []byte
}

func recordingServer(t *testing.T) (*httptest.Server, chan received) {
	t.Helper()
	ch := make(chan received, 8)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("read body: %v", err)
		}
		ch <- received{r.Method, r.URL.Path, r.URL.EscapedPath(), r.Header.Get("Content-Type"), r.Header.Clone(), b}
	}))
	t.Cleanup(srv.Close)
	return srv, ch
}

func TestDeliverURLTemplate(t *testing.T) {
	srv, ch := recordingServer(t)
	cases := []struct {
		tmpl, rk, queue  string
		wantPath, escape string
	}{
		{"/in/{routingKey}", "order.created", "orders", "/in/order.created", "/in/order.created"},
		{"/q/{queue}/rk/{routingKey}", "a/b c?d#e", "my queue/x", "/q/my queue/x/rk/a/b c?d#e", "/q/my%20queue%2Fx/rk/a%2Fb%20c%3Fd%23e"},
		{"/static", "x", "y", "/static", "/static"},
		{"/{queue}{queue}", "", "q%", "/q%q%", "/q%25q%25"},
		{"/lit/{routingKey}", "{queue}", "Q", "/lit/{queue}", "/lit/%7Bqueue%7D"},
	}
	for _, tc := range cases {
		o := deliverTo(t, srv.URL+tc.tmpl, 2*time.Second, nil, msg.Info{RoutingKey: tc.rk, Queue: tc.queue})
		if o.Kind != retry.Response || o.Status != 200 {
			t.Fatalf("%s: %+v", tc.tmpl, o)
		}
		r := <-ch
		if r.method != http.MethodPost {
			t.Errorf("method %s", r.method)
		}
		if r.path != tc.wantPath {
			t.Errorf("%s with rk %q queue %q: path %q, want %q", tc.tmpl, tc.rk, tc.queue, r.path, tc.wantPath)
		}
		if !strings.EqualFold(r.rawPath, tc.escape) {
			t.Errorf("%s with rk %q queue %q: escaped path %q, want %q", tc.tmpl, tc.rk, tc.queue, r.rawPath, tc.escape)
		}
	}
}

func TestDeliverContentTypeAndBody(t *testing.T) {
	srv, ch := recordingServer(t)
	body := make([]byte, 48<<10)
	if _, err := rand.Read(body); err != nil {
		t.Fatal(err)
	}
	copy(body, "\x00\r\n\r\nPOST / HTTP/1.1\r\n")
	orig := bytes.Clone(body)

	o := deliverTo(t, srv.URL, 2*time.Second, &msg.Message{MessageID: "bin", Body: body}, msg.Info{})
	if o.Status != 200 {
		t.Fatalf("%+v", o)
	}
	r := <-ch
	if r.contentType != "application/octet-stream" {
		t.Errorf("default content type %q", r.contentType)
	}
	if !bytes.Equal(r.body, orig) {
		t.Errorf("body changed: %d bytes received, %d sent", len(r.body), len(orig))
	}
	if !bytes.Equal(body, orig) {
		t.Error("Deliver modified the message body")
	}

	deliverTo(t, srv.URL, 2*time.Second, &msg.Message{ContentType: "application/json; charset=utf-8", Body: []byte(`{"a":1}`)}, msg.Info{})
	r = <-ch
	if r.contentType != "application/json; charset=utf-8" || string(r.body) != `{"a":1}` {
		t.Errorf("content type %q body %q", r.contentType, r.body)
	}

	deliverTo(t, srv.URL, 2*time.Second, &msg.Message{Body: nil}, msg.Info{})
	if r = <-ch; len(r.body) != 0 || r.header.Get("Content-Length") != "0" {
		t.Errorf("empty body: %q, content-length %q", r.body, r.header.Get("Content-Length"))
	}
}

func TestDeliverSendsHeaders(t *testing.T) {
	srv, ch := recordingServer(t)
	m := &msg.Message{
		MessageID: "m-9", Type: "t", Body: []byte("b"),
		Headers: map[string]any{
			"x-tenant":    "acme",
			"x-count":     int32(3),
			"bad name":    "skipped",
			"evil":        "a\r\nX-Injected: yes",
			"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		},
	}
	app := NewClient(ClientOptions{URL: srv.URL, Timeout: 2 * time.Second})
	o := app.Deliver(context.Background(), m, msg.Info{Queue: "orders", RoutingKey: "rk", Exchange: "ex", Attempt: 2})
	if o.Status != 200 {
		t.Fatalf("%+v", o)
	}
	h := (<-ch).header
	want := map[string]string{
		"Hopper-Message-Id":      "m-9",
		"Hopper-Type":            "t",
		"Hopper-Queue":           "orders",
		"Hopper-Routing-Key":     "rk",
		"Hopper-Exchange":        "ex",
		"Hopper-Attempt":         "2",
		"Hopper-Header-X-Tenant": "acme",
		"Hopper-Header-X-Count":  "3",
		"Hopper-Header-Evil":     "a  X-Injected: yes",
		"Traceparent":            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	}
	for k, v := range want {
		if got := h.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if h.Get("X-Injected") != "" {
		t.Error("header injection through a value")
	}
	if n := app.HeadersSkipped.Load(); n != 1 {
		t.Errorf("HeadersSkipped = %d, want 1", n)
	}
}

// TestDeliverLargeSuccessBody: an app that did the work and answered 200
// with a body over MaxBodyBytes has still succeeded.
func TestDeliverLargeSuccessBody(t *testing.T) {
	big := strings.Repeat("x", 200<<10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, big) }))
	defer srv.Close()
	o := deliverTo(t, srv.URL, 2*time.Second, nil, msg.Info{})
	if o.Kind != retry.Response || o.Status != 200 {
		t.Fatalf("got kind %s status %d (%q), want response 200", kindNames[o.Kind], o.Status, o.Error)
	}
}

// TestDeliverHonoursCancel: sidecar.Run cancels the work context when the
// shutdown grace ends, expecting in-flight HTTP calls to be cut off.
func TestDeliverHonoursCancel(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	app := NewClient(ClientOptions{URL: srv.URL, Timeout: 10 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	began := time.Now()
	app.Deliver(ctx, &msg.Message{Body: []byte("x")}, msg.Info{})
	if el := time.Since(began); el > 3*time.Second {
		t.Fatalf("Deliver returned %v after its context was cancelled at 200ms", el)
	}
}

// TestDeliverCancelCutsEveryContext: the cancellation of a request's
// context cuts it off whether that context is the one the client watches
// for all requests (the first it saw) or another one; a request on a
// context cancelled before it began is not sent at all.
func TestDeliverCancelCutsEveryContext(t *testing.T) {
	arrived := make(chan struct{}, 8)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	app := NewClient(ClientOptions{URL: srv.URL, Timeout: time.Minute})
	// deliver runs a request on ctx, cancels it once the app holds the
	// request (unless it is cancelled already), and reports how it ended.
	deliver := func(ctx context.Context, cancel context.CancelFunc) retry.Outcome {
		t.Helper()
		out := make(chan retry.Outcome, 1)
		go func() { out <- app.Deliver(ctx, &msg.Message{Body: []byte("x")}, msg.Info{}) }()
		if ctx.Err() == nil {
			<-arrived
			cancel()
		}
		select {
		case o := <-out:
			return o
		case <-time.After(30 * time.Second):
			t.Fatal("the request was not cut off by its context's cancellation (the app timeout is a minute)")
			return retry.Outcome{}
		}
	}
	first, cancelFirst := context.WithCancel(context.Background())
	if o := deliver(first, cancelFirst); !o.CutOff {
		t.Fatalf("the first context: %+v, want cut off", o)
	}
	other, cancelOther := context.WithCancel(context.Background())
	if o := deliver(other, cancelOther); !o.CutOff {
		t.Fatalf("another context: %+v, want cut off", o)
	}
	if o := deliver(first, cancelFirst); !o.CutOff {
		t.Fatalf("the first context, cancelled before the request: %+v, want cut off", o)
	}
	select {
	case <-arrived:
		t.Fatal("a request whose context was cancelled before it began reached the app")
	default:
	}
}

func TestDeliverContextDeadlineShortensTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	app := NewClient(ClientOptions{URL: srv.URL, Timeout: 10 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	began := time.Now()
	o := app.Deliver(ctx, &msg.Message{Body: []byte("x")}, msg.Info{})
	if el := time.Since(began); el > 5*time.Second || o.Kind != retry.Timeout {
		t.Fatalf("kind %s after %v", kindNames[o.Kind], el)
	}
}
