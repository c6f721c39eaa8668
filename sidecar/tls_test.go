package sidecar_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
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
func writeCerts(t *testing.T, dir string) testbroker.Certs {
	t.Helper()
	c, err := testbroker.WriteCerts(dir)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestTLSWithCredentialFiles: Hopper connects over amqps:// with a private
// CA and the server name checked, taking user and password from mounted
// files (the URL carries none), and delivers as usual.
func TestTLSWithCredentialFiles(t *testing.T) {
	dir := t.TempDir()
	certs := writeCerts(t, dir)
	ca := certs.CA
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tlsPort := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	files, sslConf, err := certs.Node()
	if err != nil {
		t.Fatal(err)
	}
	tb, err := testbroker.Start(testbroker.Options{Quiet: true, Files: files, ExtraConfig: fmt.Sprintf("listeners.ssl.default = 127.0.0.1:%d\n", tlsPort) + sslConf})
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
	other := writeCerts(t, t.TempDir())
	bad := cfg
	bad.Broker.TLS.CAFile = other.CA
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
