package sidecar_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/sidecar"
)

// lockedBuffer is a log destination several goroutines write to.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// randomHex is n random bytes in hex: a secret no log line holds by chance.
func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// mtlsFiles makes a CA, a server certificate for 127.0.0.1 and a client
// certificate, writes the CA and the client pair as PEM files into dir,
// and returns the server's TLS configuration (which requires the client
// certificate) with the file paths and the client key's PEM.
func mtlsFiles(t *testing.T, dir string) (srv *tls.Config, caFile, certFile, keyFile string, keyPEM []byte) {
	t.Helper()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey := newKey()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "secrets test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(serial int64, usage x509.ExtKeyUsage, ips []net.IP) ([]byte, []byte) {
		k := newKey()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "secrets test"},
			IPAddresses: ips, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	}
	srvCert, srvKey := issue(2, x509.ExtKeyUsageServerAuth, []net.IP{net.ParseIP("127.0.0.1")})
	cliCert, cliKey := issue(3, x509.ExtKeyUsageClientAuth, nil)
	pair, err := tls.X509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caFile = write("ca.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}))
	certFile, keyFile = write("client.pem", cliCert), write("client.key", cliKey)
	return &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert},
		caFile, certFile, keyFile, cliKey
}

// TestSecretsNeverLogged configures every secret Hopper reads to
// authenticate itself (broker user and password files, the app's token,
// the Hopper-Signature key, Standard Webhooks secrets of both kinds, the
// client key of mutual TLS, basic-auth user info in app.url), delivers
// messages with them after a health check that fails first, then makes the
// files go bad (a rotation that holds a broken token and a broken secret
// line; a start with a bad secret file and a bad client key; an app.url
// that does not validate), and finds none of the secret values in the log
// (at debug level), the metrics, /readyz, the spans or the errors.
func TestSecretsNeverLogged(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	// Secrets, each one a value no log line holds by chance.
	user, password := "hopper-"+randomHex(t, 6), "pw-"+randomHex(t, 16)
	token := "tok-" + randomHex(t, 16)
	hmacKey := "hmac-" + randomHex(t, 16)
	whsec := base64.StdEncoding.EncodeToString([]byte(randomHex(t, 16)))
	_, edKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	whsk := base64.StdEncoding.EncodeToString(edKey)
	badToken := "tok-" + randomHex(t, 8) + "\x01" + randomHex(t, 8)
	badSecret := base64.StdEncoding.EncodeToString([]byte(randomHex(t, 6))) // 12 bytes: too short
	appUser, appPassword := "app-"+randomHex(t, 6), "apw-"+randomHex(t, 16)
	secrets := map[string]string{
		"app.url user": appUser, "app.url password": appPassword,
		"broker password": password, "token": token, "hmac key": hmacKey,
		"whsec secret": whsec, "whsk key": whsk, "whsk key (unpadded)": strings.TrimRight(whsk, "="),
		"broken token": badToken, "broken token, first part": badToken[:20], "broken token, last part": badToken[21:],
		"broken secret": badSecret,
	}

	if _, err := rabbit.Ctl("add_user", user, password); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rabbit.Ctl("delete_user", user) }) //nolint:errcheck // the node may be gone
	if _, err := rabbit.Ctl("set_permissions", "-p", "/", user, ".*", ".*", ".*"); err != nil {
		t.Fatal(err)
	}

	// An https app that asks for Hopper's client certificate and records
	// what each request carried.
	srvTLS, caFile, certFile, keyFile, keyPEM := mtlsFiles(t, dir)
	for i, line := range strings.Split(strings.TrimSpace(string(keyPEM)), "\n") {
		if !strings.HasPrefix(line, "-----") {
			secrets[fmt.Sprintf("client key, PEM line %d", i)] = line
		}
	}
	var got, healthChecks atomic.Int64
	var lastHeader, healthHeader atomic.Pointer[http.Header]
	app := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			h := r.Header.Clone()
			healthHeader.Store(&h)
			if healthChecks.Add(1) == 1 {
				w.WriteHeader(503) // the first check fails: APP_NOT_READY names the URL
				return
			}
			w.WriteHeader(200)
			return
		}
		io.Copy(io.Discard, r.Body) //nolint:errcheck // the body is not looked at
		h := r.Header.Clone()
		lastHeader.Store(&h)
		got.Add(1)
		w.WriteHeader(200)
	}))
	app.TLS = srvTLS
	app.Config.ErrorLog = log.New(io.Discard, "", 0) // the health check's bare connects
	app.StartTLS()
	t.Cleanup(app.Close)

	cfg := testConfig(t, strings.Replace(app.URL, "https://", "https://"+appUser+":"+appPassword+"@", 1)+"/msg")
	cfg.App.HealthPath = "/healthz"
	cfg.Broker.URLs = []string{fmt.Sprintf("amqp://127.0.0.1:%d/", rabbit.Port())}
	cfg.Broker.UsernameFile, cfg.Broker.PasswordFile = write("username", user+"\n"), write("password", password+"\n")
	cfg.App.TLS.CAFile, cfg.App.TLS.CertFile, cfg.App.TLS.KeyFile = caFile, certFile, keyFile
	cfg.App.Auth.Token.File = write("token", token+"\n")
	cfg.App.Auth.Token.Header = "X-Hopper-Token" // Authorization carries app.url's user info
	cfg.App.Auth.HMAC.KeyFile = write("hmac-key", hmacKey+"\n")
	webhooks := write("webhook-secrets", "whsec_"+whsec+"\nwhsk_"+whsk+"\n")
	cfg.App.Auth.StandardWebhooks.SecretFile = webhooks
	cfg.Admin.Listen = "127.0.0.1:0"
	cfg.Log.Level = "debug"

	var logs lockedBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) }) //nolint:errcheck // the test's own provider
	r := startLogged(t, cfg, logger, func(s *sidecar.Sidecar) { s.TracerProvider = tp })

	r.publish("m-1")
	waitfor.Until(t, 20*time.Second, "the app to get m-1", func() bool { return got.Load() == 1 })
	if !strings.Contains(logs.String(), "APP_NOT_READY") {
		t.Error("the failed health check was not logged")
	}
	if h := *healthHeader.Load(); h.Get("Authorization") != "Basic "+base64.StdEncoding.EncodeToString([]byte(appUser+":"+appPassword)) {
		t.Errorf("the health check did not carry app.url's credentials: %v", h)
	}
	h := *lastHeader.Load()
	if h.Get("X-Hopper-Token") != token || h.Get("Authorization") != (*healthHeader.Load()).Get("Authorization") || h.Get("Hopper-Signature") == "" || len(strings.Fields(h.Get("webhook-signature"))) != 2 {
		t.Fatalf("the request did not carry the token and both signatures: %v", h)
	}

	// A rotation that lands broken: a token with a control character and a
	// secret too short. Requests go on with the values before, and each
	// file is reported once it is looked at again (at most once a second,
	// on the request path: messages keep coming until both are).
	write("token", badToken+"\n")
	write("webhook-secrets", "whsec_"+whsec+"\nwhsec_"+badSecret+"\n")
	n := 1
	waitfor.Until(t, 20*time.Second, "both broken files reported", func() bool {
		if got.Load() == int64(n) {
			n++
			r.publish(fmt.Sprintf("m-%d", n))
		}
		l := logs.String()
		return strings.Contains(l, "APP_AUTH_FILE_UNREADABLE") && strings.Contains(l, filepath.Join(dir, "token")) && strings.Contains(l, webhooks)
	})
	if h := *lastHeader.Load(); h.Get("X-Hopper-Token") != token {
		t.Errorf("after a broken rotation the token sent is %q, want the one before", h.Get("X-Hopper-Token"))
	}
	metrics := scrapeText(t, r.sc.AdminAddr())
	readyz := getText(t, "http://"+r.sc.AdminAddr()+"/readyz")
	if err := r.shutdown(); err != nil {
		t.Errorf("shutdown: %v", err)
	}

	// A start with a broken secrets file, then with a broken client key:
	// config validation and the sidecar both refuse, naming the file.
	write("token", token+"\n")
	var errs []string
	for _, c := range []struct {
		name string
		set  func()
	}{
		{"secrets", func() { cfg.App.Auth.StandardWebhooks.SecretFile = webhooks }},
		{"client key", func() {
			cfg.App.Auth.StandardWebhooks.SecretFile = write("webhook-secrets-ok", "whsec_"+whsec+"\n")
			cfg.App.TLS.KeyFile = write("client-bad.key", strings.Replace(string(keyPEM), "\n", "\n"+badSecret, 2))
		}},
	} {
		c.set()
		if err := cfg.Validate(); err == nil {
			t.Errorf("%s: config validates", c.name)
		} else {
			errs = append(errs, err.Error())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := sidecar.New(&cfg, logger).Run(ctx)
		cancel()
		if err == nil {
			t.Errorf("%s: the sidecar ran", c.name)
		} else {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) != 4 || !strings.Contains(errs[1], "app.auth: standard webhooks secrets: "+webhooks+": line 2: the whsec_ secret decodes to 12 bytes") ||
		!strings.Contains(errs[3], "app.tls: client certificate "+certFile+" with key "+filepath.Join(dir, "client-bad.key")) {
		t.Errorf("the errors do not name the bad line and the bad key:\n%s", strings.Join(errs, "\n"))
	}

	// A config whose app.url does not validate, in each way it can fail.
	for _, bad := range []string{
		"ftp://" + appUser + ":" + appPassword + "@127.0.0.1/msg",
		"http://" + appUser + ":" + appPassword + "@127.0.0.1:port/msg",
	} {
		c := cfg
		c.App.URL = bad
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "app.url") {
			t.Errorf("%s: no app.url error in %v", strings.ReplaceAll(strings.ReplaceAll(bad, appUser, "USER"), appPassword, "PASSWORD"), err)
		} else {
			errs = append(errs, err.Error())
		}
	}

	var spans strings.Builder
	for _, s := range rec.Ended() {
		fmt.Fprintf(&spans, "%s %v %v\n", s.Name(), s.Status(), s.Attributes())
		for _, e := range s.Events() {
			fmt.Fprintf(&spans, "  %s %v\n", e.Name, e.Attributes)
		}
	}
	for what, out := range map[string]string{"log": logs.String(), "metrics": metrics, "readyz": readyz, "spans": spans.String(), "errors": strings.Join(errs, "\n")} {
		if out == "" && what != "errors" {
			t.Errorf("no %s captured", what)
		}
		for name, secret := range secrets {
			if strings.Contains(out, secret) {
				t.Errorf("%s: holds the %s", what, name)
			}
		}
	}
	t.Logf("looked for %d secret values in %d bytes of log, %d of metrics, %d of spans (%d spans) and %d errors",
		len(secrets), len(logs.String()), len(metrics), spans.Len(), len(rec.Ended()), len(errs))
}

// scrapeText is /metrics as it is served.
func scrapeText(t *testing.T, addr string) string {
	t.Helper()
	return getText(t, "http://"+addr+"/metrics")
}

// getText is the body of a GET, whatever its status.
func getText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
