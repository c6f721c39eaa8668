// Package tlsfiles builds the TLS client configuration of a broker
// connection from the files an operator mounts: the CA the broker's
// certificate must chain to, and a client certificate for a broker that
// asks for one. The AMQP connections and the stream protocol's reach the
// same broker with the same files, so both build it here.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// Files name what a TLS client configuration is made of. Empty fields take
// the defaults: the system's roots, no client certificate, the name the
// connection dials.
type Files struct {
	CAFile, CertFile, KeyFile, ServerName string
	// InsecureSkipVerify disables the checks of the broker's certificate
	// (for tests only).
	InsecureSkipVerify bool
}

// Client reads f's files into a client configuration (TLS 1.2 at least).
func Client(f Files) (*tls.Config, error) {
	cfg := &tls.Config{ServerName: f.ServerName, InsecureSkipVerify: f.InsecureSkipVerify, MinVersion: tls.VersionTLS12} //nolint:gosec // opt-in for tests
	if f.CAFile != "" {
		pem, err := os.ReadFile(f.CAFile)
		if err != nil {
			return nil, fmt.Errorf("read CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s holds no PEM certificate", f.CAFile)
		}
		cfg.RootCAs = pool
	}
	if f.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("load client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
