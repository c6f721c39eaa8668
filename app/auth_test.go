package app

import (
	"context"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
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

	"github.com/valyala/fasthttp"
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
// alone, as an app would: the time, the delivery id it names, v1 over
// "<t>.<body>" and v2 over "<t>.<id>.<body>".
func verifySignature(t *testing.T, key []byte, header string, body []byte, now time.Time, id string) {
	t.Helper()
	f := strings.Split(header, ",")
	if len(f) != 4 || !strings.HasPrefix(f[0], "t=") || !strings.HasPrefix(f[1], "id=") || !strings.HasPrefix(f[2], "v1=") || !strings.HasPrefix(f[3], "v2=") {
		t.Fatalf("signature %q: want t=<seconds>,id=<id>,v1=<hex>,v2=<hex>", header)
	}
	ts, gotID, v1, v2 := f[0][2:], f[1][3:], f[2][3:], f[3][3:]
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || sec != now.Unix() {
		t.Errorf("signature time %q, want %d", ts, now.Unix())
	}
	if gotID != id {
		t.Errorf("signature id %q, want %q", gotID, id)
	}
	mac := func(s string) string {
		h := hmac.New(sha256.New, key)
		h.Write([]byte(s))
		h.Write(body)
		return hex.EncodeToString(h.Sum(nil))
	}
	if want := mac(ts + "."); v1 != want {
		t.Errorf("v1 = %s, want %s (HMAC-SHA256 of %q)", v1, want, ts+"."+string(body))
	}
	if want := mac(ts + "." + id + "."); v2 != want {
		t.Errorf("v2 = %s, want %s (HMAC-SHA256 of %q)", v2, want, ts+"."+id+"."+string(body))
	}
}

// twoMessages is a batch of two JSON messages on the orders queue.
func twoMessages() *batch.Request {
	return &batch.Request{
		Messages: []*msg.Message{
			{MessageID: "a", Headers: map[string]any{}, Body: []byte(`{"n":1}`)},
			{MessageID: "b", Headers: map[string]any{}, Body: []byte(`{"n":2}`)},
		},
		Infos:  []msg.Info{{Attempt: 1, Queue: "orders"}, {Attempt: 1, Queue: "orders"}},
		Traces: make([]trace.SpanContext, 2),
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
	verifySignature(t, []byte("k3y-bytes"), h.Get(HdrSignature), body, clock.Now(), "m-1")
	if v := h.Get("Authorization"); v != "Bearer tok" {
		t.Errorf("with both set, Authorization = %q", v)
	}
	if v := h.Get(HdrWebhookSignature); v != "" {
		t.Errorf("%s = %q without app.auth.standardWebhooks", HdrWebhookSignature, v)
	}
	if got, want := h.Get(HdrSignature), Sign([]byte("k3y-bytes"), clock.Now(), "m-1", body); got != want {
		t.Errorf("sent %q, Sign gives %q", got, want)
	}

	clock.Advance(90 * time.Second)
	if a := c.DeliverBatch(context.Background(), twoMessages()); a.Whole.Status != 200 {
		t.Fatalf("batch: %+v", a.Whole)
	}
	h, body = got.last()
	if !strings.Contains(string(body), `"id":"b"`) {
		t.Fatalf("batch body %q lacks the second message", body)
	}
	verifySignature(t, []byte("k3y-bytes"), h.Get(HdrSignature), body, clock.Now(), BatchDeliveryID([]string{"a", "b"}))
	if v := h.Get("Authorization"); v != "Bearer tok" {
		t.Errorf("batch Authorization = %q", v)
	}
}

// webhookKeys makes a whsec_ secret and a whsk_ key and returns the file
// line of each with what the app verifies with.
func webhookKeys(t *testing.T) (hmacLine string, hmacKey []byte, edLine string, edPub ed25519.PublicKey) {
	t.Helper()
	hmacKey = make([]byte, 32)
	if _, err := rand.Read(hmacKey); err != nil {
		t.Fatal(err)
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return "whsec_" + base64.StdEncoding.EncodeToString(hmacKey), hmacKey, "whsk_" + base64.StdEncoding.EncodeToString(priv), pub
}

// verifyWebhook checks the Standard Webhooks headers of a request with the
// standard library alone: the id, the time, and one signature per key in
// the order given (HMAC keys as []byte, Ed25519 ones as public keys).
func verifyWebhook(t *testing.T, h http.Header, body []byte, now time.Time, id string, keys ...any) {
	t.Helper()
	if got := h.Get(HdrWebhookID); got != id {
		t.Errorf("%s = %q, want %q", HdrWebhookID, got, id)
	}
	ts := h.Get(HdrWebhookTimestamp)
	if ts != strconv.FormatInt(now.Unix(), 10) {
		t.Errorf("%s = %q, want %d", HdrWebhookTimestamp, ts, now.Unix())
	}
	signed := []byte(id + "." + ts + "." + string(body))
	sigs := strings.Split(h.Get(HdrWebhookSignature), " ")
	if len(sigs) != len(keys) {
		t.Fatalf("%s = %q, want %d signatures", HdrWebhookSignature, sigs, len(keys))
	}
	for i, k := range keys {
		version, sig, _ := strings.Cut(sigs[i], ",")
		raw, err := base64.StdEncoding.DecodeString(sig)
		if err != nil {
			t.Errorf("signature %d %q: %v", i, sigs[i], err)
			continue
		}
		switch k := k.(type) {
		case []byte:
			mac := hmac.New(sha256.New, k)
			mac.Write(signed)
			if version != "v1" || !hmac.Equal(raw, mac.Sum(nil)) {
				t.Errorf("signature %d %q is not v1 HMAC-SHA256 of %q", i, sigs[i], signed)
			}
		case ed25519.PublicKey:
			if version != "v1a" || !ed25519.Verify(k, signed, raw) {
				t.Errorf("signature %d %q is not a v1a Ed25519 signature of %q", i, sigs[i], signed)
			}
		}
	}
}

// TestStandardWebhooksSingleAndBatch: every request, single and batch,
// carries webhook-id, webhook-timestamp and a signature per secret of the
// file, alongside the token and Hopper-Signature when those are set too.
func TestStandardWebhooksSingleAndBatch(t *testing.T) {
	srv, got := recordingApp(t)
	dir := t.TempDir()
	hmacLine, hmacKey, edLine, edPub := webhookKeys(t)
	secrets := filepath.Join(dir, "webhook-secrets")
	writeFile(t, secrets, hmacLine+"\n"+edLine+"\n")
	keyFile := filepath.Join(dir, "key")
	writeFile(t, keyFile, "k3y")
	clock := newTestClock(time.Date(2026, 11, 25, 0, 30, 0, 0, time.UTC))
	c := authClient(t, srv.URL, AuthOptions{StandardWebhooksFile: secrets, HMACKeyFile: keyFile, Now: clock.Now})

	deliverOne(t, c, `{"order":42}`)
	h, body := got.last()
	verifyWebhook(t, h, body, clock.Now(), "m-1", hmacKey, edPub)
	verifySignature(t, []byte("k3y"), h.Get(HdrSignature), body, clock.Now(), "m-1")

	clock.Advance(90 * time.Second)
	if a := c.DeliverBatch(context.Background(), twoMessages()); a.Whole.Status != 200 {
		t.Fatalf("batch: %+v", a.Whole)
	}
	h, body = got.last()
	verifyWebhook(t, h, body, clock.Now(), BatchDeliveryID([]string{"a", "b"}), hmacKey, edPub)

	// The same message again (another attempt) has the same id and a new
	// time.
	clock.Advance(30 * time.Second)
	deliverOne(t, c, `{"order":42}`)
	h, body = got.last()
	verifyWebhook(t, h, body, clock.Now(), "m-1", hmacKey, edPub)
}

// TestStandardWebhooksRotation: secrets written to the file sign from the
// next look at it, and a changed file that holds a bad line keeps the
// secrets before, reported without the secret.
func TestStandardWebhooksRotation(t *testing.T) {
	srv, got := recordingApp(t)
	oldLine, oldKey, edLine, edPub := webhookKeys(t)
	newLine, newKey, _, _ := webhookKeys(t)
	secrets := filepath.Join(t.TempDir(), "webhook-secrets")
	writeFile(t, secrets, oldLine+"\n")
	clock := newTestClock(time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC))
	var readErrs []error
	au, err := NewAuth(AuthOptions{StandardWebhooksFile: secrets, Now: clock.Now, OnReadError: func(err error) { readErrs = append(readErrs, err) }})
	if err != nil {
		t.Fatal(err)
	}
	c := NewClient(ClientOptions{URL: srv.URL, Timeout: 10 * time.Second, Auth: au})
	step := func(content string) {
		t.Helper()
		writeFile(t, secrets, content)
		later := clock.Now().Add(time.Hour)
		if err := os.Chtimes(secrets, later, later); err != nil {
			t.Fatal(err)
		}
		clock.Advance(recheckEvery)
		deliverOne(t, c, "{}")
	}

	deliverOne(t, c, "{}")
	h, body := got.last()
	verifyWebhook(t, h, body, clock.Now(), "m-1", oldKey)
	step(oldLine + "\n" + newLine + "\n") // the app learns the new one meanwhile
	h, body = got.last()
	verifyWebhook(t, h, body, clock.Now(), "m-1", oldKey, newKey)
	step(newLine + "\n" + edLine + "\n")
	h, body = got.last()
	verifyWebhook(t, h, body, clock.Now(), "m-1", newKey, edPub)

	bad := "whsec_" + strings.Repeat("A", 20) + "\n"
	step(newLine + "\n" + bad)
	h, body = got.last()
	verifyWebhook(t, h, body, clock.Now(), "m-1", newKey, edPub)
	if au.ReadErrors() != 1 || len(readErrs) != 1 || !strings.Contains(readErrs[0].Error(), secrets+": line 2: the whsec_ secret decodes to 15 bytes") {
		t.Fatalf("ReadErrors %d, OnReadError heard %v; want the bad line named", au.ReadErrors(), readErrs)
	}
	for _, s := range []string{newLine, bad[6:26], edLine} {
		if strings.Contains(readErrs[0].Error(), s) {
			t.Errorf("the read error %q holds a secret", readErrs[0])
		}
	}
}

// TestDeliveryID: a message id that is safe to sign as it is stays the id;
// any other is hashed to one that is, the same for every attempt.
func TestDeliveryID(t *testing.T) {
	in := msg.Info{Queue: "orders", RoutingKey: "orders.eu"}
	for _, id := range []string{"m-1", "5f0c7a4e-2b1d-4c1a-9b57-0d6f3f1e2a9c", "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", "order:42/eu+x@y~z", strings.Repeat("a", 255)} {
		if got := DeliveryID(&msg.Message{MessageID: id}, in); got != id {
			t.Errorf("DeliveryID(%q) = %q, want it as it is", id, got)
		}
	}
	seen := map[string]string{}
	for _, id := range []string{"order.42", "a,b", "k=v", "with space", "ünïcode", "tab\there", strings.Repeat("a", 256)} {
		got := DeliveryID(&msg.Message{MessageID: id}, in)
		if len(got) != 34 || !strings.HasPrefix(got, "h_") || strings.ContainsAny(got[2:], "ghijklmnopqrstuvwxyz.") {
			t.Errorf("DeliveryID(%q) = %q, want h_ and 32 hex digits", id, got)
		}
		if again := DeliveryID(&msg.Message{MessageID: id, Body: []byte("other")}, msg.Info{}); again != got {
			t.Errorf("DeliveryID(%q) = %q, then %q", id, got, again)
		}
		if other, dup := seen[got]; dup {
			t.Errorf("%q and %q both give %q", id, other, got)
		}
		seen[got] = id
	}
	noID := &msg.Message{Body: []byte(`{"n":1}`)}
	if got := DeliveryID(noID, in); got != CloudEventID(noID, in) || got == DeliveryID(&msg.Message{Body: []byte(`{"n":2}`)}, in) {
		t.Errorf("without a message id: %q, want the content-derived ce-id %q, distinct per body", got, CloudEventID(noID, in))
	}
	ab := BatchDeliveryID([]string{"a", "b"})
	if len(ab) != 34 || !strings.HasPrefix(ab, "b_") || ab != BatchDeliveryID([]string{"a", "b"}) {
		t.Errorf("BatchDeliveryID = %q, want b_ and 32 hex digits, stable", ab)
	}
	for _, ids := range [][]string{{"b", "a"}, {"a"}, {"ab"}, {"a", "b", "c"}, {"a\x00b"}} {
		if BatchDeliveryID(ids) == ab {
			t.Errorf("BatchDeliveryID(%q) = BatchDeliveryID([a b])", ids)
		}
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
	publicKey := filepath.Join(dir, "public")
	writeFile(t, publicKey, "whpk_"+base64.StdEncoding.EncodeToString(make([]byte, 32))+"\n")
	noPrefix := filepath.Join(dir, "no-prefix")
	writeFile(t, noPrefix, "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0\n")
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
		{"missing webhook secrets", AuthOptions{StandardWebhooksFile: filepath.Join(dir, "none")}, "standard webhooks secrets: stat"},
		{"webhook public key", AuthOptions{StandardWebhooksFile: publicKey}, publicKey + ": line 1: a whpk_ public key verifies signatures"},
		{"webhook secret without prefix", AuthOptions{StandardWebhooksFile: noPrefix}, "line 1: not a Standard Webhooks secret"},
	} {
		_, err := NewAuth(tc.o)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to say %q", tc.name, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "c2VjcmV0") {
			t.Errorf("%s: the error %q holds the secret", tc.name, err)
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

// TestAuthHeadSize: the room counted for the token and signatures before
// the other headers are placed within the bounds is what they take, for
// every kind of key, and the Standard Webhooks headers go with the names
// as the specification spells them.
func TestAuthHeadSize(t *testing.T) {
	dir := t.TempDir()
	hmacLine, _, edLine, _ := webhookKeys(t)
	secrets := filepath.Join(dir, "webhook-secrets")
	writeFile(t, secrets, hmacLine+"\n"+edLine+"\n"+hmacLine+"\n")
	keyFile := filepath.Join(dir, "key")
	writeFile(t, keyFile, "k3y")
	tok := filepath.Join(dir, "token")
	writeFile(t, tok, "t0k3n")
	for _, id := range []string{"m-1", "h_0123456789abcdef0123456789abcdef", ""} {
		au, err := NewAuth(AuthOptions{TokenFile: tok, TokenHeader: "X-Api-Key", HMACKeyFile: keyFile, StandardWebhooksFile: secrets})
		if err != nil {
			t.Fatal(err)
		}
		c := NewClient(ClientOptions{URL: "http://127.0.0.1:1/", Auth: au})
		creds, head := c.credentials(id)
		req := fasthttp.AcquireRequest()
		req.SetBodyRaw([]byte(`{"n":1}`))
		creds.authenticate(req)
		var got Head
		names := map[string]bool{}
		for k, v := range req.Header.All() {
			if string(k) == "Content-Type" || string(k) == "Content-Length" || string(k) == "User-Agent" || string(k) == "Host" {
				continue
			}
			names[string(k)] = true
			got.Headers++
			got.Bytes += len(k) + len(v) + 4
		}
		fasthttp.ReleaseRequest(req)
		if got != head {
			t.Errorf("id %q: counted %+v, the headers take %+v", id, head, got)
		}
		for _, n := range []string{"X-Api-Key", HdrSignature, "webhook-id", "webhook-timestamp", "webhook-signature"} {
			if !names[n] {
				t.Errorf("id %q: no header named exactly %q in %v", id, n, names)
			}
		}
	}
}
