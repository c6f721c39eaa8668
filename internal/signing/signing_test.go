package signing_test

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/hopper-sidecar/hopper/internal/signing"
)

// TestTestVector: the signature the Standard Webhooks reference libraries
// check their signing against (the sign-function test of the Go, Python
// and C# libraries in the specification's repository).
func TestTestVector(t *testing.T) {
	keys, err := signing.ParseSecrets("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n")
	if err != nil {
		t.Fatal(err)
	}
	got := string(signing.AppendSignatures(nil, keys, "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", []byte(`{"test": 2432232314}`)))
	if want := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Errorf("signature %q, want the published %q", got, want)
	}
}

func TestAppendSignaturesEveryKey(t *testing.T) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	file := "\n  whsec_" + base64.StdEncoding.EncodeToString(secret) + "  \r\n\n" +
		"whsk_" + base64.StdEncoding.EncodeToString(priv) + "\n" +
		"whsk_" + base64.RawStdEncoding.EncodeToString(priv.Seed()) + "\n"
	keys, err := signing.ParseSecrets(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 3 || keys[0].Asymmetric() || !keys[1].Asymmetric() || !keys[2].Asymmetric() {
		t.Fatalf("parsed %d keys of kinds %v %v %v", len(keys), keys[0].Asymmetric(), keys[1].Asymmetric(), keys[2].Asymmetric())
	}
	if want := "whpk_" + base64.StdEncoding.EncodeToString(pub); keys[1].PublicKey() != want || keys[2].PublicKey() != want {
		t.Errorf("public keys %q, %q; want %q (a seed and its full key are the same key)", keys[1].PublicKey(), keys[2].PublicKey(), want)
	}
	body := []byte(`{"n":1}`)
	signed := "id-1.1700000000." + string(body)
	sigs := strings.Split(string(signing.AppendSignatures(nil, keys, "id-1", "1700000000", body)), " ")
	if len(sigs) != 3 {
		t.Fatalf("signatures %q, want one per key", sigs)
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(signed))
	if want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil)); sigs[0] != want {
		t.Errorf("v1 = %q, want %q", sigs[0], want)
	}
	for _, s := range sigs[1:] {
		raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, "v1a,"))
		if !strings.HasPrefix(s, "v1a,") || err != nil || !ed25519.Verify(pub, []byte(signed), raw) {
			t.Errorf("%q is not a v1a Ed25519 signature of %q", s, signed)
		}
	}
	// Reused hash states give the same signature again.
	again := strings.Split(string(signing.AppendSignatures(nil, keys[:1], "id-1", "1700000000", body)), " ")
	if again[0] != sigs[0] {
		t.Errorf("second signature %q, first %q", again[0], sigs[0])
	}
}

// TestParseSecretsRefuses: every error names the line and the fault, and
// none repeats the secret.
func TestParseSecretsRefuses(t *testing.T) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	mixed := append(priv.Seed(), other...) // a seed with another key's public half
	good := "whsec_" + base64.StdEncoding.EncodeToString(make([]byte, 24))
	for _, c := range []struct {
		name, file, secret, want string
	}{
		{"empty", "\n \n", "", "no secret in it"},
		{"no prefix", "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0", "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0", "line 1: not a Standard Webhooks secret: it must start with whsec_ (HMAC-SHA256) or whsk_ (Ed25519)"},
		{"not base64", good + "\nwhsec_not*base64*at*all*here*really", "not*base64*at*all*here*really", "line 2: the whsec_ secret is not standard base64"},
		{"short", "whsec_" + base64.StdEncoding.EncodeToString([]byte("sixteen byte key")), "sixteen byte key", "line 1: the whsec_ secret decodes to 16 bytes; Standard Webhooks secrets are 24 to 64 random bytes"},
		{"ed25519 size", "whsk_" + base64.StdEncoding.EncodeToString(priv[:40]), base64.StdEncoding.EncodeToString(priv[:40]), "line 1: the whsk_ key decodes to 40 bytes; an Ed25519 secret key is 64 bytes (seed and public key) or a 32-byte seed"},
		{"ed25519 halves", "whsk_" + base64.StdEncoding.EncodeToString(mixed[:64]), base64.StdEncoding.EncodeToString(mixed[:64]), "line 1: the whsk_ key's public half is not the one of its seed"},
		{"public key", "whpk_" + base64.StdEncoding.EncodeToString(priv[32:]), base64.StdEncoding.EncodeToString(priv[32:]), "line 1: a whpk_ public key verifies signatures, it cannot make them"},
		{"too many", strings.Repeat(good+"\n", 9), good, "9 secrets, at most 8"},
	} {
		_, err := signing.ParseSecrets(c.file)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", c.name, err, c.want)
			continue
		}
		if c.secret != "" && strings.Contains(err.Error(), c.secret) {
			t.Errorf("%s: the error %q repeats the secret", c.name, err)
		}
	}
}

// BenchmarkAppendSignatures is one signature of a 256-byte body: what
// signing adds to a request, by kind of key.
func BenchmarkAppendSignatures(b *testing.B) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	body := []byte(strings.Repeat("x", 256))
	for _, c := range []struct{ name, secret string }{
		{"whsec", "whsec_" + base64.StdEncoding.EncodeToString(make([]byte, 32))},
		{"whsk", "whsk_" + base64.StdEncoding.EncodeToString(priv)},
	} {
		b.Run(c.name, func(b *testing.B) {
			keys, err := signing.ParseSecrets(c.secret)
			if err != nil {
				b.Fatal(err)
			}
			dst := make([]byte, 0, 128)
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				dst = signing.AppendSignatures(dst[:0], keys, "5f0c7a4e-2b1d-4c1a-9b57-0d6f3f1e2a9c", "1700000000", body)
			}
		})
	}
}
