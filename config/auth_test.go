package config_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hopper-sidecar/hopper/config"
)

func TestAppAuthKeys(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	key := filepath.Join(dir, "key")
	for p, v := range map[string]string{tok: "t0k\n", key: "k3y\n"} {
		if err := os.WriteFile(p, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f := filepath.Join(dir, "hopper.yaml")
	yaml := "queue: {name: orders}\napp:\n  auth:\n    token: {file: " + tok + "}\n    hmac: {keyFile: " + key + "}\n"
	if err := os.WriteFile(f, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := config.Load(f, []string{"HOPPER_APP_AUTH_TOKEN_HEADER=X-Api-Key"})
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("token and hmac both set: %v", err)
	}
	a := cfg.App.Auth
	if a.Token.File != tok || a.Token.Header != "X-Api-Key" || a.HMAC.KeyFile != key {
		t.Errorf("app.auth = %+v", a)
	}
	if d := config.Default().App.Auth; d.Token.File != "" || d.HMAC.KeyFile != "" || d.Token.Header != "Authorization" {
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
	} {
		c := config.Default()
		c.Queue.Name = "orders"
		tc.set(&c.App.Auth)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.want)
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
