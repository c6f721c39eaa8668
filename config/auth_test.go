package config_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/retry"
)

func TestAppAuthKeys(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	key := filepath.Join(dir, "key")
	whsec := filepath.Join(dir, "webhook-secrets")
	for p, v := range map[string]string{tok: "t0k\n", key: "k3y\n", whsec: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n"} {
		if err := os.WriteFile(p, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f := filepath.Join(dir, "hopper.yaml")
	yaml := "queue: {name: orders}\napp:\n  auth:\n    token: {file: " + tok + "}\n    hmac: {keyFile: " + key + "}\n"
	if err := os.WriteFile(f, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := config.Load(f, []string{"HOPPER_APP_AUTH_TOKEN_HEADER=X-Api-Key", "HOPPER_APP_AUTH_STANDARD_WEBHOOKS_SECRET_FILE=" + whsec})
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("token and hmac both set: %v", err)
	}
	a := cfg.App.Auth
	if a.Token.File != tok || a.Token.Header != "X-Api-Key" || a.HMAC.KeyFile != key || a.StandardWebhooks.SecretFile != whsec {
		t.Errorf("app.auth = %+v", a)
	}
	if d := config.Default().App.Auth; d.Token.File != "" || d.HMAC.KeyFile != "" || d.StandardWebhooks.SecretFile != "" || d.Token.Header != "Authorization" {
		t.Errorf("default app.auth = %+v, want no files and header Authorization", d)
	}
}

func TestAppAuthValidation(t *testing.T) {
	dir := t.TempDir()
	write := func(name, v string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	empty := write("empty", "\n")
	good := write("good", "secret")
	// A good secret on line 1 and a short one (18 bytes) on line 2.
	shortSecret := write("short", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\nwhsec_c2hvcnQtc2hvcnQtc2hvcnQh\n")
	notBase64 := write("not-base64", "whsec_MfKQ9r8GKYqrTwjUPD8ILP!Io2LaLaSw\n")
	aToken := write("a-token", "t0ken-value-9f3\n")
	unreadable := write("unreadable", "secret")
	if err := os.Chmod(unreadable, 0); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		set  func(*config.AppAuth)
		want string
	}{
		{"missing token file", func(a *config.AppAuth) { a.Token.File = filepath.Join(dir, "none") }, "app.auth.token.file: open " + filepath.Join(dir, "none")},
		{"empty token", func(a *config.AppAuth) { a.Token.File = empty }, "app.auth.token.file: " + empty + " is empty"},
		{"token over two lines", func(a *config.AppAuth) { a.Token.File = write("two", "a\nb") }, "app.auth.token.file: " + filepath.Join(dir, "two") + ": the token holds a control character"},
		{"missing key file", func(a *config.AppAuth) { a.HMAC.KeyFile = filepath.Join(dir, "none") }, "app.auth.hmac.keyFile: open " + filepath.Join(dir, "none")},
		{"empty key", func(a *config.AppAuth) { a.HMAC.KeyFile = empty }, "app.auth.hmac.keyFile: " + empty + " is empty"},
		{"header not a name", func(a *config.AppAuth) { a.Token.File = good; a.Token.Header = "X Api" }, `app.auth.token.header: must be an HTTP header name, got "X Api"`},
		{"header empty", func(a *config.AppAuth) { a.Token.Header = "" }, `app.auth.token.header: must be an HTTP header name, got ""`},
		{"header of Hopper's", func(a *config.AppAuth) { a.Token.Header = "Hopper-Signature" }, `app.auth.token.header: "Hopper-Signature" is a header Hopper or HTTP itself sets`},
		{"header of HTTP's", func(a *config.AppAuth) { a.Token.Header = "content-length" }, `app.auth.token.header: "content-length" is a header`},
		{"header of Standard Webhooks", func(a *config.AppAuth) { a.Token.Header = "Webhook-Signature" }, `app.auth.token.header: "Webhook-Signature" is a header Hopper or HTTP itself sets`},
		{"missing webhook secrets", func(a *config.AppAuth) { a.StandardWebhooks.SecretFile = filepath.Join(dir, "none") }, "app.auth.standardWebhooks.secretFile: open " + filepath.Join(dir, "none")},
		{"empty webhook secrets", func(a *config.AppAuth) { a.StandardWebhooks.SecretFile = empty }, "app.auth.standardWebhooks.secretFile: " + empty + " is empty"},
		{"webhook secret too short", func(a *config.AppAuth) { a.StandardWebhooks.SecretFile = shortSecret }, "app.auth.standardWebhooks.secretFile: " + shortSecret + ": line 2: the whsec_ secret decodes to 18 bytes; Standard Webhooks secrets are 24 to 64 random bytes"},
		{"webhook secret not base64", func(a *config.AppAuth) { a.StandardWebhooks.SecretFile = notBase64 }, "app.auth.standardWebhooks.secretFile: " + notBase64 + ": line 1: the whsec_ secret is not standard base64: illegal base64 data at input byte 22"},
		{"webhook token in the file", func(a *config.AppAuth) { a.StandardWebhooks.SecretFile = aToken }, "app.auth.standardWebhooks.secretFile: " + aToken + ": line 1: not a Standard Webhooks secret: it must start with whsec_ (HMAC-SHA256) or whsk_ (Ed25519)"},
	} {
		c := config.Default()
		c.Queue.Name = "orders"
		tc.set(&c.App.Auth)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.want)
		}
		for _, secret := range []string{"MfKQ9r8GKYqrTwjUPD8IL", "c2hvcnQtc2hvcnQtc2hvcnQh", "t0ken-value"} {
			if err != nil && strings.Contains(err.Error(), secret) {
				t.Errorf("%s: the error %q holds a secret", tc.name, err)
			}
		}
	}
	if os.Geteuid() != 0 { // root reads a file whatever its mode
		c := config.Default()
		c.Queue.Name = "orders"
		c.App.Auth.HMAC.KeyFile = unreadable
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "app.auth.hmac.keyFile: open "+unreadable+": permission denied") {
			t.Errorf("unreadable key: err = %v", err)
		}
	}
}

// selfSigned writes a self-signed certificate and its key as PEM files.
func selfSigned(t *testing.T, dir, name string) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	cert, key = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	for p, b := range map[string][]byte{
		cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		key:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}),
	} {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return cert, key
}

func TestAppTLSValidation(t *testing.T) {
	dir := t.TempDir()
	cert, key := selfSigned(t, dir, "one")
	_, otherKey := selfSigned(t, dir, "two")
	junk := filepath.Join(dir, "junk")
	if err := os.WriteFile(junk, []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	ok := config.Default()
	ok.Queue.Name = "orders"
	ok.App.URL = "https://app.internal:8443/"
	ok.App.TLS = config.AppTLS{CAFile: cert, CertFile: cert, KeyFile: key}
	if err := ok.Validate(); err != nil {
		t.Fatalf("CA and client certificate: %v", err)
	}
	for _, tc := range []struct {
		name string
		url  string
		tls  config.AppTLS
		want string
	}{
		{"http app", "http://127.0.0.1:8080/", config.AppTLS{CAFile: cert}, `app.tls: applies to an https:// app.url, got "http://127.0.0.1:8080/"`},
		{"ca missing", "", config.AppTLS{CAFile: filepath.Join(dir, "none")}, "app.tls.caFile: open " + filepath.Join(dir, "none")},
		{"ca not PEM", "", config.AppTLS{CAFile: junk}, "app.tls.caFile: " + junk + " holds no PEM certificate"},
		{"cert alone", "", config.AppTLS{CertFile: cert}, "app.tls: certFile and keyFile must be given together"},
		{"key of another cert", "", config.AppTLS{CertFile: cert, KeyFile: otherKey}, "app.tls.certFile: with keyFile " + otherKey + ": tls: private key does not match public key"},
	} {
		c := ok
		c.App.TLS = tc.tls
		if tc.url != "" {
			c.App.URL = tc.url
		}
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.want)
		}
	}
}

// User info in app.url goes as Authorization: Basic, which would take the
// place of a token sent in Authorization: the two together are refused,
// and either alone, or the token in another header, is taken.
func TestAppURLUserInfoAndToken(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("t0k\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		url, file, header string
		wantErr           bool
	}{
		{"http://u:p@127.0.0.1:8080/", tok, "Authorization", true},
		{"http://u:p@127.0.0.1:8080/", tok, "X-Api-Key", false},
		{"http://u:p@127.0.0.1:8080/", "", "Authorization", false},
		{"http://127.0.0.1:8080/", tok, "Authorization", false},
	} {
		cfg := config.Default()
		cfg.Queue.Name = "orders"
		cfg.App.URL, cfg.App.Auth.Token.File, cfg.App.Auth.Token.Header = c.url, c.file, c.header
		err := cfg.Validate()
		if got := err != nil && strings.Contains(err.Error(), "app.auth.token.header: app.url holds user info"); got != c.wantErr || (err != nil && !c.wantErr) {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

// A 401 pauses consuming only when Hopper sends credentials the app could
// be refusing: a token, a signature, a client certificate or app.url's
// user info. Without any it is about the message, decided as the table's
// 4xx (dlq by default); retry.outcomes can still make it pause (a mesh in
// front of the app that authenticates the pod, say).
func TestUnauthorizedPausesOnlyWithCredentials(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("t0k\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		set   func(*config.Config)
		pause bool
	}{
		{"no credentials", func(*config.Config) {}, false},
		{"no credentials, 4xx retried", func(c *config.Config) { c.Retry.Outcomes = map[string]string{"4xx": "retry"} }, false},
		{"no credentials, 401 pause set", func(c *config.Config) { c.Retry.Outcomes = map[string]string{"401": "pause"} }, true},
		{"token", func(c *config.Config) { c.App.Auth.Token.File = tok }, true},
		{"hmac", func(c *config.Config) { c.App.Auth.HMAC.KeyFile = tok }, true},
		{"user info", func(c *config.Config) { c.App.URL = "http://u:p@127.0.0.1:8080/" }, true},
		{"token, 401 dlq set", func(c *config.Config) {
			c.App.Auth.Token.File = tok
			c.Retry.Outcomes = map[string]string{"401": "dlq"}
		}, false},
	} {
		cfg := config.Default()
		cfg.Queue.Name = "orders"
		c.set(&cfg)
		if err := cfg.Validate(); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got := cfg.Selector().Default.Table.Lookup(retry.Outcome{Kind: retry.Response, Status: 401}) == retry.Pause
		if got != c.pause {
			t.Errorf("%s: 401 pauses %v, want %v", c.name, got, c.pause)
		}
	}
}
