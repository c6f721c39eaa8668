package sidecar_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/testbroker"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/topology"
)

// writeCerts makes a CA and a server certificate for localhost and writes
// them as PEM files into dir.
func writeCerts(t *testing.T, dir string) (ca, cert, key string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "hopper test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", srvDER), write("server.key", "EC PRIVATE KEY", keyDER)
}

// TestTLSWithCredentialFiles: Hopper connects over amqps:// with a private
// CA and the server name checked, taking user and password from mounted
// files (the URL carries none), and delivers as usual.
func TestTLSWithCredentialFiles(t *testing.T) {
	dir := t.TempDir()
	ca, cert, key := writeCerts(t, dir)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tlsPort := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	// The node may run under chroot, so it gets its certificates in its
	// own directory rather than this test's.
	files := map[string][]byte{}
	for name, p := range map[string]string{"ca.pem": ca, "server.pem": cert, "server.key": key} {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		files[name] = data
	}
	tb, err := testbroker.Start(testbroker.Options{Quiet: true, Files: files, ExtraConfig: fmt.Sprintf(
		"listeners.ssl.default = 127.0.0.1:%d\nssl_options.cacertfile = {{dir}}/ca.pem\nssl_options.certfile = {{dir}}/server.pem\n"+
			"ssl_options.keyfile = {{dir}}/server.key\nssl_options.verify = verify_none\nssl_options.fail_if_no_peer_cert = false\n",
		tlsPort)})
	if err != nil {
		t.Fatalf("start a TLS broker: %v", err)
	}
	t.Cleanup(func() { tb.Stop() })
	user, pass := filepath.Join(dir, "username"), filepath.Join(dir, "password")
	if err := os.WriteFile(user, []byte("guest\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pass, []byte("guest\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	app := newScriptApp(t)
	cfg := testConfig(t, app.URL)
	cfg.Broker.URLs = []string{fmt.Sprintf("amqps://localhost:%d/", tlsPort)}
	cfg.Broker.TLS.CAFile = ca
	cfg.Broker.TLS.ServerName = "localhost"
	cfg.Broker.UsernameFile, cfg.Broker.PasswordFile = user, pass
	r := start(t, cfg)
	app.script("secure", 503, 200)
	r.publish("secure")
	waitfor.Until(t, 20*time.Second, "delivered over TLS", func() bool {
		s := app.statuses("secure")
		return len(s) == 2 && s[1] == 200
	})

	// A wrong CA must be refused, not silently accepted.
	other, _, _ := writeCerts(t, t.TempDir())
	bad := cfg
	bad.Broker.TLS.CAFile = other
	bad.Broker.URLs = []string{fmt.Sprintf("amqps://localhost:%d/", tlsPort)}
	if err := applyOnce(&bad); err == nil {
		t.Fatal("connected with a CA that did not sign the server certificate")
	}
}

// applyOnce connects once and verifies the topology, returning the error.
func applyOnce(cfg *config.Config) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	plan := topology.FromConfig(cfg)
	return broker.Apply(ctx, broker.ConfigOptions(cfg.Broker, slog.New(slog.NewTextHandler(io.Discard, nil)), "tls-check"), &plan, false)
}
