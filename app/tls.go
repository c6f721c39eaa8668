package app

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// TLSOptions configure TLS to an https:// app: a private CA to trust and a
// client certificate for apps that ask for one (mutual TLS). The files are
// mounted Secrets; the certificate and key are read again when either
// changes (looked at no more than once a second, when a connection is
// made), so a renewed certificate is used on the next new connection
// without a restart.
type TLSOptions struct {
	// CAFile holds the PEM certificates the app's certificate must chain
	// to. Default "": the system's roots.
	CAFile string
	// CertFile and KeyFile hold the client certificate and its key, in
	// PEM; both or neither. Default "": no client certificate.
	CertFile, KeyFile string
	// Now is the clock of the re-reads. Default time.Now.
	Now func() time.Time
	// OnReadError hears of a changed pair that could not be loaded; the
	// pair loaded before stays in use. Default none.
	OnReadError func(error)
}

// NewTLS builds the TLS configuration of the app client and health check.
// With no file set it returns nil: the defaults.
func NewTLS(o TLSOptions) (*tls.Config, error) {
	if o.CAFile == "" && o.CertFile == "" && o.KeyFile == "" {
		return nil, nil
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.CAFile != "" {
		pem, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("ca: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca: %s holds no PEM certificate", o.CAFile)
		}
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		return nil, errors.New("certFile and keyFile must be given together")
	}
	if o.CertFile != "" {
		p, err := newCertPair(o.CertFile, o.KeyFile, o.Now())
		if err != nil {
			return nil, err
		}
		p.onError, p.cert.onError, p.key.onError = o.OnReadError, o.OnReadError, o.OnReadError
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return p.get(o.Now()), nil
		}
	}
	return c, nil
}

// certPair is a client certificate loaded again when its files change.
type certPair struct {
	cert, key *secretFile[string]
	mu        sync.Mutex
	pair      *tls.Certificate
	// loaded are the file contents pair was last built from (or failed
	// to be): a pair that does not load is not tried again until a file
	// changes once more.
	loadedCert, loadedKey string
	onError               func(error)
}

func newCertPair(certFile, keyFile string, now time.Time) (*certPair, error) {
	p := &certPair{}
	var err error
	if p.cert, err = openSecret(certFile, rawValue, now); err != nil {
		return nil, fmt.Errorf("client certificate: %w", err)
	}
	if p.key, err = openSecret(keyFile, rawValue, now); err != nil {
		return nil, fmt.Errorf("client key: %w", err)
	}
	p.loadedCert, p.loadedKey = *p.cert.value.Load(), *p.key.value.Load()
	c, err := tls.X509KeyPair([]byte(p.loadedCert), []byte(p.loadedKey))
	if err != nil {
		return nil, fmt.Errorf("client certificate %s with key %s: %w", certFile, keyFile, err)
	}
	p.pair = &c
	return p, nil
}

// get returns the pair, loading it again when either file changed. A
// certificate renewed before its key (or the other way round) does not
// match for a moment: the pair before stays in use until both do.
func (p *certPair) get(now time.Time) *tls.Certificate {
	p.mu.Lock()
	defer p.mu.Unlock()
	cert, key := p.cert.get(now), p.key.get(now)
	if cert == p.loadedCert && key == p.loadedKey {
		return p.pair
	}
	p.loadedCert, p.loadedKey = cert, key
	c, err := tls.X509KeyPair([]byte(cert), []byte(key))
	if err != nil {
		if p.onError != nil {
			p.onError(fmt.Errorf("load the changed client certificate %s with key %s (the one before stays in use): %w", p.cert.path, p.key.path, err))
		}
		return p.pair
	}
	p.pair = &c
	return p.pair
}
