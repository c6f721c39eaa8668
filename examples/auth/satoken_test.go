package auth_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"math/big"
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

const (
	testIssuer   = "https://kubernetes.default.svc.cluster.local"
	testAudience = "orders-api"
	testSubject  = "system:serviceaccount:shop:orders"
)

// issuer is a stand-in for a cluster's service-account token issuer: an
// RSA key, published in a key set, that signs tokens.
type issuer struct {
	key  *rsa.PrivateKey
	kid  string
	jwks auth.JWKS
	file string // the key set as JSON, for the Python verifier
}

func newIssuer(t *testing.T) *issuer {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	is := &issuer{key: key, kid: "test-key-1"}
	raw, err := json.Marshal(map[string]any{"keys": []map[string]string{{
		"kid": is.kid, "kty": "RSA", "alg": "RS256", "use": "sig",
		"n": base64.RawURLEncoding.EncodeToString(key.N.Bytes()),
		"e": base64.RawURLEncoding.EncodeToString(big.NewInt(int64(key.E)).Bytes()),
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &is.jwks); err != nil {
		t.Fatal(err)
	}
	is.file = filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(is.file, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return is
}

// sign makes a token with claims, as the API server makes a projected one.
func (is *issuer) sign(t *testing.T, claims map[string]any) string {
	t.Helper()
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	input := enc(map[string]string{"alg": "RS256", "kid": is.kid, "typ": "JWT"}) + "." + enc(claims)
	digest := sha256.Sum256([]byte(input))
	sig, err := rsa.SignPKCS1v15(rand.Reader, is.key, crypto.SHA256, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	return input + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func claims(mod func(map[string]any)) map[string]any {
	now := time.Now()
	c := map[string]any{"iss": testIssuer, "sub": testSubject, "aud": []string{testAudience},
		"iat": now.Unix(), "nbf": now.Unix(), "exp": now.Add(time.Hour).Unix()}
	if mod != nil {
		mod(c)
	}
	return c
}

// bearer delivers one message through Hopper's app client with the token
// in its token file, as the chart's app.auth.serviceAccountToken sets it up,
// and returns the token the app received.
func bearer(t *testing.T, token string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Authorization")
	}))
	defer srv.Close()
	au, err := app.NewAuth(app.AuthOptions{TokenFile: file})
	if err != nil {
		t.Fatal(err)
	}
	c := app.NewClient(app.ClientOptions{URL: srv.URL, Timeout: 10 * time.Second, Auth: au})
	if o := c.Deliver(context.Background(), &msg.Message{MessageID: "m-1", Headers: map[string]any{}, Body: []byte("{}")},
		msg.Info{Attempt: 1, Queue: "orders"}); o.Status != 200 {
		t.Fatalf("delivery: %+v", o)
	}
	h := <-got
	token, ok := strings.CutPrefix(h, "Bearer ")
	if !ok {
		t.Fatalf("Authorization = %q, want a bearer token", h)
	}
	return token
}

// The Go and the Python (standard library only) examples accept the
// service-account token Hopper sends and refuse one for another audience,
// from another issuer, expired, not yet valid, signed by another key or
// changed after signing.
func TestServiceAccountTokenVerifiers(t *testing.T) {
	is := newIssuer(t)
	other := newIssuer(t)
	good := is.sign(t, claims(nil))
	tampered := func() string {
		parts := strings.Split(good, ".")
		c := claims(func(c map[string]any) { c["sub"] = "system:serviceaccount:shop:intruder" })
		b, _ := json.Marshal(c)
		parts[1] = base64.RawURLEncoding.EncodeToString(b)
		return strings.Join(parts, ".")
	}()
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is needed to run the Python verifier: %v", err)
	}
	for _, tc := range []struct {
		name  string
		token string
		ok    bool
	}{
		{"sent by Hopper", bearer(t, good), true},
		{"the API server's audience", is.sign(t, claims(func(c map[string]any) { c["aud"] = []string{"https://kubernetes.default.svc"} })), false},
		{"another issuer", is.sign(t, claims(func(c map[string]any) { c["iss"] = "https://elsewhere" })), false},
		{"expired", is.sign(t, claims(func(c map[string]any) { c["exp"] = time.Now().Add(-time.Hour).Unix() })), false},
		{"not yet valid", is.sign(t, claims(func(c map[string]any) { c["nbf"] = time.Now().Add(time.Hour).Unix() })), false},
		{"another key", func() string { o := other; o.kid = is.kid; return o.sign(t, claims(nil)) }(), false},
		{"changed after signing", tampered, false},
		{"one audience as a string", is.sign(t, claims(func(c map[string]any) { c["aud"] = testAudience })), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := auth.VerifyServiceAccountToken(tc.token, is.jwks, testIssuer, testAudience, time.Now())
			if (err == nil) != tc.ok {
				t.Errorf("Go: accepted %t (%v), want %t", err == nil, err, tc.ok)
			}
			if err == nil && c.Subject != testSubject {
				t.Errorf("Go: subject %q", c.Subject)
			}
			cmd := exec.Command(python, "satoken.py", is.file, testIssuer, testAudience, tc.token)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err = cmd.Run()
			if _, exit := err.(*exec.ExitError); err != nil && !exit {
				t.Fatal(err)
			}
			if (err == nil) != tc.ok {
				t.Errorf("Python: accepted %t (%s), want %t", err == nil, strings.TrimSpace(out.String()), tc.ok)
			}
		})
	}
}
