package testbroker

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Certs is a private CA and a server certificate it signed for localhost
// and 127.0.0.1, written as PEM files, for tests of a node's TLS
// listeners.
type Certs struct {
	// CA, Cert and Key are the paths of the CA certificate, the server
	// certificate and its key.
	CA, Cert, Key string
}

// WriteCerts makes a CA and a server certificate and writes them into dir.
// Each call makes a new CA, which did not sign any other call's.
func WriteCerts(dir string) (Certs, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Certs{}, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "hopper test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return Certs{}, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return Certs{}, err
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Certs{}, err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		return Certs{}, err
	}
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		return Certs{}, err
	}
	var c Certs
	for _, f := range []struct {
		to        *string
		name, typ string
		der       []byte
	}{
		{&c.CA, "ca.pem", "CERTIFICATE", caDER},
		{&c.Cert, "server.pem", "CERTIFICATE", srvDER},
		{&c.Key, "server.key", "EC PRIVATE KEY", keyDER},
	} {
		*f.to = filepath.Join(dir, f.name)
		if err := os.WriteFile(*f.to, pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), 0o644); err != nil {
			return Certs{}, err
		}
	}
	return c, nil
}

// Node gives a node these certificates: the files to put in its own
// directory (Options.Files: a node under chroot cannot see the test's
// directories) and the ssl_options lines of its configuration that name
// them, to which the caller adds its TLS listeners.
func (c Certs) Node() (files map[string][]byte, conf string, err error) {
	files = map[string][]byte{}
	for name, p := range map[string]string{"ca.pem": c.CA, "server.pem": c.Cert, "server.key": c.Key} {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, "", err
		}
		files[name] = data
	}
	conf = fmt.Sprintf("ssl_options.cacertfile = %[1]s/ca.pem\nssl_options.certfile = %[1]s/server.pem\n"+
		"ssl_options.keyfile = %[1]s/server.key\nssl_options.verify = verify_none\nssl_options.fail_if_no_peer_cert = false\n", "{{dir}}")
	return files, conf, nil
}
