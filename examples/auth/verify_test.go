package auth_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/app"
	"github.com/hopper-sidecar/hopper/examples/auth"
	"github.com/hopper-sidecar/hopper/msg"
)

// signed is one request as the app received it from Hopper.
type signed struct {
	signature string
	body      []byte
}

// capture delivers a message through Hopper's app client, signing with the
// key in keyFile on a clock offset from the real one, and returns what a
// real HTTP server received.
func capture(t *testing.T, keyFile string, offset time.Duration) signed {
	t.Helper()
	got := make(chan signed, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(400)
			return
		}
		got <- signed{r.Header.Get(app.HdrSignature), b}
	}))
	defer srv.Close()
	au, err := app.NewAuth(app.AuthOptions{HMACKeyFile: keyFile, Now: func() time.Time { return time.Now().Add(offset) }})
	if err != nil {
		t.Fatal(err)
	}
	c := app.NewClient(app.ClientOptions{URL: srv.URL, Timeout: 10 * time.Second, Auth: au})
	m := &msg.Message{MessageID: "m-1", Headers: map[string]any{}, Body: []byte(`{"order":42,"note":"ünïcode, \"quotes\"\n"}`)}
	if o := c.Deliver(context.Background(), m, msg.Info{Attempt: 1, Queue: "orders"}); o.Status != 200 {
		t.Fatalf("delivery: %+v", o)
	}
	s := <-got
	if s.signature == "" {
		t.Fatalf("no %s header", app.HdrSignature)
	}
	return s
}

// verifier runs one of the example verifiers on a captured request and
// returns the delivery id it vouches for, ok false when it refused it.
type verifier func(t *testing.T, keyFile string, s signed) (id string, ok bool)

func program(name string, args ...string) verifier {
	return func(t *testing.T, keyFile string, s signed) (string, bool) {
		t.Helper()
		bin, err := exec.LookPath(name)
		if err != nil {
			t.Fatalf("%s is needed to run the %s verifier: %v", name, name, err)
		}
		cmd := exec.Command(bin, append(args, keyFile, s.signature)...)
		cmd.Stdin = bytes.NewReader(s.body)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err = cmd.Run()
		if _, exit := err.(*exec.ExitError); err != nil && !exit {
			t.Fatalf("%s: %v", name, err)
		}
		t.Logf("%s: %v %s%s", name, err, stdout.String(), stderr.String())
		return strings.TrimSpace(stdout.String()), err == nil
	}
}

func goVerifier(t *testing.T, keyFile string, s signed) (string, bool) {
	t.Helper()
	key, err := app.ReadSecret(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	id, err := auth.Verify([]byte(key), s.signature, s.body, time.Now())
	t.Logf("go: %q %v", id, err)
	return id, err == nil
}

// withField is s with one field of its signature replaced, or dropped
// when value is "".
func withField(s signed, name, value string) signed {
	var out []string
	for _, p := range strings.Split(s.signature, ",") {
		if k, _, _ := strings.Cut(p, "="); k == name {
			if value == "" {
				continue
			}
			p = name + "=" + value
		}
		out = append(out, p)
	}
	s.signature = strings.Join(out, ",")
	return s
}

// TestVerifiers: the Python, Node.js and Go verifiers the README shows
// accept a request Hopper signed and return its delivery id, and refuse it
// under another key, with its body changed, with another id (which v1
// alone would let through), without v2, and signed outside the 300 s
// window either way.
func TestVerifiers(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	otherKey := filepath.Join(dir, "other")
	for p, v := range map[string]string{keyFile: "correct horse battery staple\n", otherKey: "correct horse battery stapler\n"} {
		if err := os.WriteFile(p, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	good := capture(t, keyFile, 0)
	if !strings.Contains(good.signature, ",id=m-1,") {
		t.Fatalf("signature %q does not name the message id m-1", good.signature)
	}
	tampered := good
	tampered.body = append(bytes.Clone(good.body), ' ')
	otherID := withField(good, "id", "m-2")
	v1Only := withField(good, "v2", "")
	// The window is 300 s; 400 s is well outside it whatever the test's
	// own pace.
	old := capture(t, keyFile, -400*time.Second)
	future := capture(t, keyFile, 400*time.Second)

	for name, v := range map[string]verifier{
		"python": program("python3", "verify.py"),
		"node":   program("node", "verify.js"),
		"go":     goVerifier,
	} {
		t.Run(name, func(t *testing.T) {
			if id, ok := v(t, keyFile, good); !ok || id != "m-1" {
				t.Errorf("refused a request Hopper signed, or gave id %q: %q", id, good.signature)
			}
			if _, ok := v(t, otherKey, good); ok {
				t.Error("accepted the request under another key")
			}
			if _, ok := v(t, keyFile, tampered); ok {
				t.Error("accepted a changed body")
			}
			if _, ok := v(t, keyFile, otherID); ok {
				t.Errorf("accepted the request under another id: %q", otherID.signature)
			}
			if _, ok := v(t, keyFile, v1Only); ok {
				t.Errorf("accepted a signature without v2: %q", v1Only.signature)
			}
			if _, ok := v(t, keyFile, old); ok {
				t.Errorf("accepted a request signed 400 s ago: %q", old.signature)
			}
			if _, ok := v(t, keyFile, future); ok {
				t.Errorf("accepted a request signed 400 s ahead: %q", future.signature)
			}
		})
	}
}
