package app

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/msg"
)

// captured is what the test app received in its last request.
type captured struct {
	mu     sync.Mutex
	header http.Header
	body   []byte
}

func (c *captured) last() (http.Header, []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.header, c.body
}

// recordingApp is a real HTTP server that keeps the last request's
// headers and body and answers 200.
func recordingApp(t *testing.T) (*httptest.Server, *captured) {
	t.Helper()
	c := &captured{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(400)
			return
		}
		c.mu.Lock()
		c.header, c.body = r.Header.Clone(), b
		c.mu.Unlock()
		w.WriteHeader(200)
	}))
	t.Cleanup(srv.Close)
	return srv, c
}

// testClock is a clock the test moves by hand.
type testClock struct{ ns atomic.Int64 }

func newTestClock(t time.Time) *testClock {
	c := &testClock{}
	c.ns.Store(t.UnixNano())
	return c
}
func (c *testClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *testClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func authClient(t *testing.T, url string, o AuthOptions) *Client {
	t.Helper()
	au, err := NewAuth(o)
	if err != nil {
		t.Fatalf("NewAuth: %v", err)
	}
	return NewClient(ClientOptions{URL: url, Timeout: 10 * time.Second, MaxConns: 4, Auth: au})
}

func deliverOne(t *testing.T, c *Client, body string) {
	t.Helper()
	m := &msg.Message{MessageID: "m-1", Headers: map[string]any{}, Body: []byte(body)}
	if o := c.Deliver(context.Background(), m, msg.Info{Attempt: 1, Queue: "orders"}); o.Status != 200 {
		t.Fatalf("delivery: %+v", o)
	}
}

func TestAuthTokenHeader(t *testing.T) {
	srv, got := recordingApp(t)
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	writeFile(t, tok, "s3cr3t-token\n")

	deliverOne(t, authClient(t, srv.URL, AuthOptions{TokenFile: tok}), "{}")
	h, _ := got.last()
	if v := h.Get("Authorization"); v != "Bearer s3cr3t-token" {
		t.Errorf("Authorization = %q, want the token as a bearer token without the file's newline", v)
	}
	if v := h.Get(HdrSignature); v != "" {
		t.Errorf("%s = %q without a key", HdrSignature, v)
	}

	deliverOne(t, authClient(t, srv.URL, AuthOptions{TokenFile: tok, TokenHeader: "X-Api-Key"}), "{}")
	h, _ = got.last()
	if v := h.Get("X-Api-Key"); v != "s3cr3t-token" {
		t.Errorf("X-Api-Key = %q, want the raw token", v)
	}
	if v := h.Get("Authorization"); v != "" {
		t.Errorf("Authorization = %q, want none when the token goes in another header", v)
	}
}

// TestAuthTokenRotation: a new token written to the file is sent once the
// file has been looked at again (at most once a second of the client's
// clock), and a file that cannot be read keeps the token that was.
func TestAuthTokenRotation(t *testing.T) {
	srv, got := recordingApp(t)
	tok := filepath.Join(t.TempDir(), "token")
	writeFile(t, tok, "old")
	clock := newTestClock(time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC))
	var readErrs []error // appended from the request path, read between requests
	au, err := NewAuth(AuthOptions{TokenFile: tok, Now: clock.Now, OnReadError: func(err error) { readErrs = append(readErrs, err) }})
	if err != nil {
		t.Fatal(err)
	}
	c := NewClient(ClientOptions{URL: srv.URL, Timeout: 10 * time.Second, Auth: au})
	bearer := func() string {
		t.Helper()
		deliverOne(t, c, "x")
		h, _ := got.last()
		return h.Get("Authorization")
	}
	if v := bearer(); v != "Bearer old" {
		t.Fatalf("first token: %q", v)
	}

	writeFile(t, tok, "new-token")
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(tok, later, later); err != nil {
		t.Fatal(err)
	}
	clock.Advance(recheckEvery - time.Millisecond)
	if v := bearer(); v != "Bearer old" {
		t.Errorf("before a second has passed: %q, want the file not looked at again yet", v)
	}
	clock.Advance(time.Millisecond)
	if v := bearer(); v != "Bearer new-token" {
		t.Errorf("after a second: %q, want the rotated token", v)
	}

	// A Secret being swapped: the file is gone for a moment.
	if err := os.Remove(tok); err != nil {
		t.Fatal(err)
	}
	clock.Advance(recheckEvery)
	if v := bearer(); v != "Bearer new-token" {
		t.Errorf("file gone: %q, want the last token kept", v)
	}
	if n := au.ReadErrors(); n != 1 {
		t.Errorf("ReadErrors = %d, want 1", n)
	}
	if len(readErrs) != 1 || !strings.Contains(readErrs[0].Error(), tok) || !errors.Is(readErrs[0], os.ErrNotExist) {
		t.Errorf("OnReadError heard %v, want the missing file named", readErrs)
	}
	// Emptied: not a token either.
	writeFile(t, tok, "\n")
	clock.Advance(recheckEvery)
	if v := bearer(); v != "Bearer new-token" {
		t.Errorf("file emptied: %q, want the last token kept", v)
	}
	if n := au.ReadErrors(); n != 2 {
		t.Errorf("ReadErrors = %d, want 2", n)
	}
	if len(readErrs) != 2 || !strings.Contains(readErrs[1].Error(), "is empty") {
		t.Errorf("OnReadError heard %v, want the empty file", readErrs)
	}
}

// verifySignature checks a Hopper-Signature with the standard library
// alone, as an app would.
func verifySignature(t *testing.T, key []byte, header string, body []byte, now time.Time) {
	t.Helper()
	ts, mac, ok := strings.Cut(header, ",")
	if !ok || !strings.HasPrefix(ts, "t=") || !strings.HasPrefix(mac, "v1=") {
		t.Fatalf("signature %q: want t=<seconds>,v1=<hex>", header)
	}
	sec, err := strconv.ParseInt(ts[2:], 10, 64)
	if err != nil || sec != now.Unix() {
		t.Errorf("signature time %q, want %d", ts, now.Unix())
	}
	h := hmac.New(sha256.New, key)
	h.Write([]byte(ts[2:] + "."))
	h.Write(body)
	if want := hex.EncodeToString(h.Sum(nil)); mac[3:] != want {
		t.Errorf("v1 = %s, want %s (HMAC-SHA256 of %q)", mac[3:], want, ts[2:]+"."+string(body))
	}
}

func TestAuthSignatureSingleAndBatch(t *testing.T) {
	srv, got := recordingApp(t)
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	writeFile(t, keyFile, "k3y-bytes\n")
	tok := filepath.Join(dir, "token")
	writeFile(t, tok, "tok")
	clock := newTestClock(time.Date(2026, 11, 25, 0, 30, 0, 0, time.UTC))
	c := authClient(t, srv.URL, AuthOptions{TokenFile: tok, HMACKeyFile: keyFile, Now: clock.Now})

	deliverOne(t, c, `{"order":42}`)
	h, body := got.last()
	if string(body) != `{"order":42}` {
		t.Fatalf("body %q", body)
	}
	verifySignature(t, []byte("k3y-bytes"), h.Get(HdrSignature), body, clock.Now())
	if v := h.Get("Authorization"); v != "Bearer tok" {
		t.Errorf("with both set, Authorization = %q", v)
	}

	clock.Advance(90 * time.Second)
	r := &batch.Request{
		Messages: []*msg.Message{
			{MessageID: "a", Headers: map[string]any{}, Body: []byte(`{"n":1}`)},
			{MessageID: "b", Headers: map[string]any{}, Body: []byte(`{"n":2}`)},
		},
		Infos:  []msg.Info{{Attempt: 1, Queue: "orders"}, {Attempt: 1, Queue: "orders"}},
		Traces: make([]trace.SpanContext, 2),
	}
	if a := c.DeliverBatch(context.Background(), r); a.Whole.Status != 200 {
		t.Fatalf("batch: %+v", a.Whole)
	}
	h, body = got.last()
	if !strings.Contains(string(body), `"id":"b"`) {
		t.Fatalf("batch body %q lacks the second message", body)
	}
	verifySignature(t, []byte("k3y-bytes"), h.Get(HdrSignature), body, clock.Now())
	if v := h.Get("Authorization"); v != "Bearer tok" {
		t.Errorf("batch Authorization = %q", v)
	}
}

// TestAuthCountsInHeadBounds: the token is part of the request head, so
// the application headers that still fit make room for it.
func TestAuthCountsInHeadBounds(t *testing.T) {
	srv, _ := recordingApp(t)
	tok := filepath.Join(t.TempDir(), "token")
	writeFile(t, tok, strings.Repeat("t", 1000))
	au, err := NewAuth(AuthOptions{TokenFile: tok})
	if err != nil {
		t.Fatal(err)
	}
	m := &msg.Message{MessageID: "m", Headers: map[string]any{}, Body: []byte("x")}
	for i := range 20 {
		m.Headers["h"+strconv.Itoa(100+i)] = strings.Repeat("v", 100)
	}
	omitted := func(a *Auth) int64 {
		c := NewClient(ClientOptions{URL: srv.URL, Timeout: 10 * time.Second, Auth: a,
			Limits: Limits{MaxHeaderBytes: 2500}})
		if o := c.Deliver(context.Background(), m, msg.Info{Attempt: 1}); o.Status != 200 {
			t.Fatalf("delivery: %+v", o)
		}
		return c.HeadersOmitted()["max-header-bytes"]
	}
	without, with := omitted(nil), omitted(au)
	// A 1000-byte token takes the room of 8 or 9 of these 120-byte lines.
	if with-without < 8 {
		t.Errorf("headers left out: %d without the token, %d with it; want the token's 1 KiB counted", without, with)
	}
}

func TestNewAuthRefuses(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	writeFile(t, empty, "\r\n")
	broken := filepath.Join(dir, "broken")
	writeFile(t, broken, "two\nlines\n")
	good := filepath.Join(dir, "good")
	writeFile(t, good, "ok")
	for _, tc := range []struct {
		name string
		o    AuthOptions
		want string
	}{
		{"missing token file", AuthOptions{TokenFile: filepath.Join(dir, "none")}, "no such file"},
		{"empty token", AuthOptions{TokenFile: empty}, "is empty"},
		{"token over two lines", AuthOptions{TokenFile: broken}, "control character"},
		{"missing key file", AuthOptions{HMACKeyFile: filepath.Join(dir, "none")}, "hmac key"},
		{"empty key", AuthOptions{HMACKeyFile: empty}, "is empty"},
		{"header name", AuthOptions{TokenFile: good, TokenHeader: "X Api"}, "not an HTTP header name"},
	} {
		_, err := NewAuth(tc.o)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to say %q", tc.name, err, tc.want)
		}
	}
	if a, err := NewAuth(AuthOptions{}); a != nil || err != nil {
		t.Errorf("nothing set: %v, %v; want nil, nil", a, err)
	}
}

// TestAuthRotationUnderLoad: requests reading the token while it rotates
// see the old or the new token, whole, and never a torn or empty one; once
// the rotation is looked at, every request sends the new one.
func TestAuthRotationUnderLoad(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	writeFile(t, tok, "old")
	clock := newTestClock(time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC))
	au, err := NewAuth(AuthOptions{TokenFile: tok, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	bad := make(chan string, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range 500 {
				if v := au.token.get(clock.Now()); v != "old" && v != "new-token" {
					bad <- v
					return
				}
			}
		}()
	}
	close(start)
	for i := range 20 {
		writeFile(t, tok, map[bool]string{true: "old", false: "new-token"}[i%2 == 1])
		clock.Advance(recheckEvery)
	}
	wg.Wait()
	writeFile(t, tok, "new-token") // the loop ended on "old": a size of its own
	close(bad)
	for v := range bad {
		t.Errorf("a request saw token %q", v)
	}
	clock.Advance(recheckEvery)
	if v := au.token.get(clock.Now()); v != "new-token" {
		t.Errorf("after the last rotation: %q", v)
	}
}
