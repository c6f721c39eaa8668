package auth_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/hopper-sidecar/hopper/app"
	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/msg"
)

// nodeDir is the Node.js package that checks Hopper's requests with the
// Standard Webhooks library (npm standardwebhooks, pinned by its
// package-lock.json).
const nodeDir = "standardwebhooks"

var (
	npmOnce sync.Once
	npmErr  error
)

// nodeReady returns the node binary once nodeDir's dependencies are
// installed. `npm ci` runs when node_modules is missing or was installed
// from another package-lock.json (a stamp in node_modules records the
// lock's hash), with npm's cache in the repository's .cache/npm, so a
// repeated run installs nothing and a fresh machine downloads three small
// packages from the npm registry once. Without node or npm the test fails:
// the proof that the public library accepts Hopper's requests is not
// optional.
func nodeReady(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is needed to check Hopper's requests with the Standard Webhooks library (Debian: apt-get install nodejs npm): %v", err)
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Fatalf("npm is needed to install the Standard Webhooks library from %s/package-lock.json (Debian: apt-get install npm): %v", nodeDir, err)
	}
	npmOnce.Do(func() { npmErr = npmCI(npm) })
	if npmErr != nil {
		t.Fatal(npmErr)
	}
	return node
}

func npmCI(npm string) error {
	lock, err := os.ReadFile(filepath.Join(nodeDir, "package-lock.json"))
	if err != nil {
		return err
	}
	sum := sha256.Sum256(lock)
	want := hex.EncodeToString(sum[:])
	stamp := filepath.Join(nodeDir, "node_modules", ".hopper-package-lock.sha256")
	if got, err := os.ReadFile(stamp); err == nil && string(got) == want {
		return nil
	}
	cache, err := filepath.Abs(filepath.Join("..", "..", ".cache", "npm"))
	if err != nil {
		return err
	}
	cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund", "--cache", cache)
	cmd.Dir = nodeDir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("npm ci in %s (it needs the npm registry once per machine): %w\n%s", nodeDir, err, out)
	}
	return os.WriteFile(stamp, []byte(want), 0o644)
}

// nodeResult is what the Node.js app said of one request Hopper sent it.
type nodeResult struct {
	ID, Timestamp, Signature                      string
	Good, OtherKey, ChangedBody, ChangedID        string
	Ed25519, Ed25519ChangedBody, Ed25519ChangedID string
}

// nodeApp runs verify.js as an HTTP app with the given keys and returns
// its URL and the results of the requests it receives, one a request.
func nodeApp(t *testing.T, node, secret, otherSecret, publicKey string) (string, <-chan nodeResult) {
	t.Helper()
	cmd := exec.Command(node, "verify.js", "serve", secret, otherSecret, publicKey)
	cmd.Dir = nodeDir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill() //nolint:errcheck // it may have ended on its own
		cmd.Wait()         //nolint:errcheck // killed
	})
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var first string
	select {
	case l, ok := <-lines:
		if !ok {
			t.Fatalf("node verify.js serve ended: %s", stderr.String())
		}
		first = l
	case <-time.After(30 * time.Second):
		t.Fatalf("node verify.js serve did not listen within 30s: %s", stderr.String())
	}
	port, ok := strings.CutPrefix(first, "listening ")
	if !ok {
		t.Fatalf("node verify.js serve said %q", first)
	}
	results := make(chan nodeResult, 16)
	go func() {
		defer close(results)
		for l := range lines {
			var r nodeResult
			if err := json.Unmarshal([]byte(l), &r); err != nil {
				r.Good = fmt.Sprintf("not JSON: %q", l)
			}
			results <- r
		}
	}()
	return "http://127.0.0.1:" + port + "/hook", results
}

// next is the app's result for the request just sent.
func next(t *testing.T, results <-chan nodeResult) nodeResult {
	t.Helper()
	select {
	case r, ok := <-results:
		if !ok {
			t.Fatal("the Node.js app ended")
		}
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("the Node.js app reported nothing within 30s")
	}
	return nodeResult{}
}

// webhookSecrets writes a file with a whsec_ secret and a whsk_ key, and
// returns it with the secret, another secret and the key's whpk_.
func webhookSecrets(t *testing.T) (file, secret, otherSecret, publicKey string) {
	t.Helper()
	raw := make([]byte, 64)
	if _, err := rand.Read(raw); err != nil {
		t.Fatal(err)
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	secret = "whsec_" + base64.StdEncoding.EncodeToString(raw[:32])
	otherSecret = "whsec_" + base64.StdEncoding.EncodeToString(raw[32:])
	file = filepath.Join(t.TempDir(), "webhook-secrets")
	if err := os.WriteFile(file, []byte(secret+"\nwhsk_"+base64.StdEncoding.EncodeToString(priv)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return file, secret, otherSecret, "whpk_" + base64.StdEncoding.EncodeToString(pub)
}

// webhookClient is Hopper's app client signing with the secrets of file on
// a clock at offset from the real one.
func webhookClient(t *testing.T, url, file string, now func() time.Time) *app.Client {
	t.Helper()
	au, err := app.NewAuth(app.AuthOptions{StandardWebhooksFile: file, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return app.NewClient(app.ClientOptions{URL: url, Timeout: 10 * time.Second, Auth: au})
}

// TestStandardWebhooksLibrary: the Standard Webhooks library (npm
// standardwebhooks, run by Node.js) accepts the requests Hopper sends, a
// single message and a batch, and refuses each with its body changed, its
// id changed, under another secret, and signed 400 s ago (its window is
// 300 s). The v1a Ed25519 signature, which that library does not check,
// is checked with Node's own crypto the same way.
func TestStandardWebhooksLibrary(t *testing.T) {
	node := nodeReady(t)
	file, secret, otherSecret, publicKey := webhookSecrets(t)
	url, results := nodeApp(t, node, secret, otherSecret, publicKey)
	c := webhookClient(t, url, file, time.Now)

	refused := func(t *testing.T, what, got, want string) {
		t.Helper()
		if got == "ok" || !strings.Contains(got, want) {
			t.Errorf("%s: the library said %q, want it refused (%q)", what, got, want)
		}
	}
	check := func(t *testing.T, r nodeResult, id string) {
		t.Helper()
		if r.ID != id {
			t.Errorf("webhook-id %q, want %q", r.ID, id)
		}
		if r.Good != "ok" || r.Ed25519 != "ok" {
			t.Errorf("the library refused a request Hopper signed: v1 %q, v1a %q (headers id=%q timestamp=%q signature=%q)", r.Good, r.Ed25519, r.ID, r.Timestamp, r.Signature)
		}
		refused(t, "another secret", r.OtherKey, "No matching signature found")
		refused(t, "changed body", r.ChangedBody, "No matching signature found")
		refused(t, "changed id", r.ChangedID, "No matching signature found")
		refused(t, "v1a, changed body", r.Ed25519ChangedBody, "No matching signature found")
		refused(t, "v1a, changed id", r.Ed25519ChangedID, "No matching signature found")
	}

	t.Run("single", func(t *testing.T) {
		m := &msg.Message{MessageID: "m-1", Headers: map[string]any{}, ContentType: "application/json",
			Body: []byte(`{"order":42,"note":"ünïcode, \"quotes\"\n"}`)}
		if o := c.Deliver(context.Background(), m, msg.Info{Attempt: 1, Queue: "orders"}); o.Status != 204 {
			t.Errorf("delivery: %+v", o)
		}
		check(t, next(t, results), "m-1")
	})
	t.Run("dotted id", func(t *testing.T) {
		m := &msg.Message{MessageID: "order.42", Headers: map[string]any{}, Body: []byte(`{}`)}
		if o := c.Deliver(context.Background(), m, msg.Info{Attempt: 1, Queue: "orders"}); o.Status != 204 {
			t.Errorf("delivery: %+v", o)
		}
		check(t, next(t, results), app.DeliveryID(m, msg.Info{}))
	})
	t.Run("batch", func(t *testing.T) {
		r := &batch.Request{
			Messages: []*msg.Message{
				{MessageID: "a", Headers: map[string]any{}, Body: []byte(`{"n":1}`)},
				{MessageID: "b", Headers: map[string]any{}, Body: []byte(`{"n":2}`)},
			},
			Infos:  []msg.Info{{Attempt: 1, Queue: "orders"}, {Attempt: 1, Queue: "orders"}},
			Traces: make([]trace.SpanContext, 2),
		}
		// The app answers 204 with no per-message results: the batch as a
		// whole is what this test looks at.
		c.DeliverBatch(context.Background(), r)
		check(t, next(t, results), app.BatchDeliveryID([]string{"a", "b"}))
	})
	t.Run("old", func(t *testing.T) {
		old := webhookClient(t, url, file, func() time.Time { return time.Now().Add(-400 * time.Second) })
		m := &msg.Message{MessageID: "m-1", Headers: map[string]any{}, Body: []byte(`{}`)}
		old.Deliver(context.Background(), m, msg.Info{Attempt: 1, Queue: "orders"})
		r := next(t, results)
		refused(t, "signed 400 s ago", r.Good, "Message timestamp too old")
		refused(t, "v1a signed 400 s ago", r.Ed25519, "too old")
	})
}

// TestStandardWebhooksTestVector: a request Hopper sends with the inputs
// of the test vector the reference libraries' tests check their signing
// against (secret, message id, time and body) carries the published
// signature, and the library itself signs those inputs the same way.
func TestStandardWebhooksTestVector(t *testing.T) {
	const want = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	node := nodeReady(t)
	cmd := exec.Command(node, "verify.js", "vector")
	cmd.Dir = nodeDir
	out, err := cmd.Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		t.Fatalf("node verify.js vector: %v\n%s", err, ee.Stderr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != want {
		t.Errorf("the library signs the vector as %q, published %q", got, want)
	}

	file := filepath.Join(t.TempDir(), "webhook-secrets")
	if err := os.WriteFile(file, []byte("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, secret, otherSecret, publicKey := webhookSecrets(t)
	url, results := nodeApp(t, node, secret, otherSecret, publicKey)
	c := webhookClient(t, url, file, func() time.Time { return time.Unix(1614265330, 0) })
	m := &msg.Message{MessageID: "msg_p5jXN8AQM9LWM0D4loKWxJek", Headers: map[string]any{}, Body: []byte(`{"test": 2432232314}`)}
	c.Deliver(context.Background(), m, msg.Info{Attempt: 1, Queue: "orders"})
	r := next(t, results)
	if r.ID != "msg_p5jXN8AQM9LWM0D4loKWxJek" || r.Timestamp != "1614265330" || r.Signature != want {
		t.Errorf("Hopper sent webhook-id %q, webhook-timestamp %q, webhook-signature %q; want the vector's %q", r.ID, r.Timestamp, r.Signature, want)
	}
}
