package app

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
)

// testCA issues certificates for the mutual TLS tests.
type testCA struct {
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	der    []byte
	serial int64
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "app test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, der: der, serial: 1}
}

// issue returns a certificate for name (server or client) as PEM.
func (ca *testCA) issue(t *testing.T, name string, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial), Subject: pkix.Name{CommonName: name},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:   time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}

func (ca *testCA) pem() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.der})
}

// mtlsApp is an https app that requires a client certificate from ca and
// keeps the common name of the last one it saw.
func mtlsApp(t *testing.T, ca *testCA) (*httptest.Server, func() string) {
	t.Helper()
	var mu sync.Mutex
	var last string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		last = r.TLS.PeerCertificates[0].Subject.CommonName
		mu.Unlock()
		w.WriteHeader(200)
	}))
	certPEM, keyPEM := ca.issue(t, "app", x509.ExtKeyUsageServerAuth)
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, func() string { mu.Lock(); defer mu.Unlock(); return last }
}

func writeBytes(t *testing.T, path string, b []byte) string {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestMutualTLS: with the CA and a client certificate an app that asks for
// one takes deliveries and health checks; without the certificate it
// refuses them; and a renewed certificate is used on the next new
// connection once the files have been looked at again.
func TestMutualTLS(t *testing.T) {
	ca := newTestCA(t)
	srv, seen := mtlsApp(t, ca)
	dir := t.TempDir()
	caFile := writeBytes(t, filepath.Join(dir, "ca.pem"), ca.pem())
	c1, k1 := ca.issue(t, "hopper-1", x509.ExtKeyUsageClientAuth)
	certFile := writeBytes(t, filepath.Join(dir, "tls.crt"), c1)
	keyFile := writeBytes(t, filepath.Join(dir, "tls.key"), k1)
	clock := newTestClock(time.Now())

	cfg, err := NewTLS(TLSOptions{CAFile: caFile, CertFile: certFile, KeyFile: keyFile, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	c := NewClient(ClientOptions{URL: srv.URL, Timeout: 10 * time.Second, TLS: cfg})
	deliverOne(t, c, "x")
	if cn := seen(); cn != "hopper-1" {
		t.Errorf("the app saw client certificate %q, want hopper-1", cn)
	}
	ready, err := NewReady(srv.URL, "/healthz", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ready.UseTLS(cfg)
	if err := ready.Check(context.Background()); err != nil {
		t.Errorf("health check with the client certificate: %v", err)
	}

	caOnly, err := NewTLS(TLSOptions{CAFile: caFile})
	if err != nil {
		t.Fatal(err)
	}
	m := &msg.Message{MessageID: "m", Headers: map[string]any{}, Body: []byte("x")}
	if o := NewClient(ClientOptions{URL: srv.URL, Timeout: 10 * time.Second, TLS: caOnly}).Deliver(context.Background(), m, msg.Info{Attempt: 1}); o.Status == 200 {
		t.Errorf("without a client certificate the app took the request: %+v", o)
	}
	plain, err := NewReady(srv.URL, "/healthz", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Check(context.Background()); err == nil {
		t.Error("health check without the CA and certificate passed")
	}

	// Renewal: new certificate and key land in the files.
	c2, k2 := ca.issue(t, "hopper-2", x509.ExtKeyUsageClientAuth)
	writeBytes(t, certFile, c2)
	writeBytes(t, keyFile, k2)
	later := time.Now().Add(time.Hour)
	for _, f := range []string{certFile, keyFile} {
		if err := os.Chtimes(f, later, later); err != nil {
			t.Fatal(err)
		}
	}
	c.client.CloseIdleConnections() // the next delivery makes a new connection
	deliverOne(t, c, "x")
	if cn := seen(); cn != "hopper-1" {
		t.Errorf("within the second: %q, want the files not looked at again yet", cn)
	}
	clock.Advance(recheckEvery)
	c.client.CloseIdleConnections()
	deliverOne(t, c, "x")
	if cn := seen(); cn != "hopper-2" {
		t.Errorf("after renewal the app saw %q, want hopper-2", cn)
	}
}

func TestNewTLSRefuses(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	caFile := writeBytes(t, filepath.Join(dir, "ca.pem"), ca.pem())
	notPEM := writeBytes(t, filepath.Join(dir, "junk"), []byte("not a certificate\n"))
	c1, _ := ca.issue(t, "one", x509.ExtKeyUsageClientAuth)
	_, k2 := ca.issue(t, "two", x509.ExtKeyUsageClientAuth)
	certFile := writeBytes(t, filepath.Join(dir, "tls.crt"), c1)
	otherKey := writeBytes(t, filepath.Join(dir, "other.key"), k2)
	for _, tc := range []struct {
		name string
		o    TLSOptions
		want string
	}{
		{"ca not PEM", TLSOptions{CAFile: notPEM}, "holds no PEM certificate"},
		{"ca missing", TLSOptions{CAFile: filepath.Join(dir, "none")}, "no such file"},
		{"cert without key", TLSOptions{CAFile: caFile, CertFile: certFile}, "together"},
		{"key of another certificate", TLSOptions{CertFile: certFile, KeyFile: otherKey}, "private key does not match public key"},
	} {
		_, err := NewTLS(tc.o)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to say %q", tc.name, err, tc.want)
		}
	}
	if c, err := NewTLS(TLSOptions{}); c != nil || err != nil {
		t.Errorf("nothing set: %v, %v; want nil, nil", c, err)
	}
}
