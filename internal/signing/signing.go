// Package signing holds the keys Hopper signs requests to the app with:
// HMAC-SHA256 keys kept ready for use, and the secrets of the public
// Standard Webhooks specification (https://www.standardwebhooks.com) as
// they are written in a file, one a line. The config package checks a
// secret file with the same parser the app client signs with, so a file
// that passes `hopper config validate` is one Hopper can use.
package signing

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"strings"
	"sync"
)

// Prefixes of the Standard Webhooks key encodings: a symmetric secret, an
// Ed25519 secret (signing) key and its public key, each followed by the
// key's bytes in standard base64.
const (
	SecretPrefix     = "whsec_"
	SigningKeyPrefix = "whsk_"
	PublicKeyPrefix  = "whpk_"
)

// The specification's bounds on a symmetric secret: at least 192 bits so
// that it cannot be guessed, at most 512 (a longer HMAC key is hashed down
// and adds nothing).
const (
	MinSecretBytes = 24
	MaxSecretBytes = 64
)

// MaxSecrets bounds the secrets of one file. Each one adds a signature to
// every request's head (up to 92 bytes for an Ed25519 one), and a rotation
// needs two; more than a handful is a file pasted by mistake.
const MaxSecrets = 8

// MAC is an HMAC-SHA256 key ready for use. The keyed hash states are kept
// and reset between uses, so a signature costs the hashing of what it
// covers and not the key setup (two more SHA-256 blocks) each time.
type MAC struct {
	pool sync.Pool
}

// macState is one keyed hash with the buffer the signed prefix is copied
// into (a caller's stack buffer would escape through hash.Hash.Write).
type macState struct {
	h   hash.Hash
	buf []byte
	sum [sha256.Size]byte
}

// NewMAC keeps key for signing.
func NewMAC(key []byte) *MAC {
	key = bytes.Clone(key)
	m := &MAC{}
	m.pool.New = func() any { return &macState{h: hmac.New(sha256.New, key), buf: make([]byte, 0, 320)} }
	return m
}

// Append appends HMAC-SHA256(key, head || body) to dst.
func (m *MAC) Append(dst, head, body []byte) []byte {
	st := m.pool.Get().(*macState)
	st.h.Reset()
	st.buf = append(st.buf[:0], head...)
	st.h.Write(st.buf) //nolint:errcheck // a hash never fails to write
	st.h.Write(body)   //nolint:errcheck // a hash never fails to write
	sum := st.h.Sum(st.sum[:0])
	dst = append(dst, sum...)
	if cap(st.buf) <= 4<<10 {
		m.pool.Put(st)
	}
	return dst
}

// Key is one Standard Webhooks signing secret: a symmetric one (whsec_,
// signatures "v1,…") or an Ed25519 secret key (whsk_, signatures "v1a,…").
type Key struct {
	mac  *MAC
	priv ed25519.PrivateKey
}

// Asymmetric reports whether the key is an Ed25519 one.
func (k *Key) Asymmetric() bool { return k.priv != nil }

// PublicKey is the whpk_ form of an Ed25519 key's public half, the one the
// app verifies with; "" for a symmetric secret, which the app holds itself.
func (k *Key) PublicKey() string {
	if k.priv == nil {
		return ""
	}
	return PublicKeyPrefix + base64.StdEncoding.EncodeToString(k.priv.Public().(ed25519.PublicKey))
}

// ParseSecrets reads the contents of a secret file: one secret a line,
// blank lines and the spaces around a secret ignored. An error names the
// line and what is wrong with it, never the secret itself, so it can be
// logged.
func ParseSecrets(s string) ([]*Key, error) {
	var keys []*Key
	for i, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		k, err := ParseSecret(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", i+1, err)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, errors.New("no secret in it")
	}
	if len(keys) > MaxSecrets {
		return nil, fmt.Errorf("%d secrets, at most %d: each one signs every request, and a rotation needs two", len(keys), MaxSecrets)
	}
	return keys, nil
}

// ParseSecret reads one secret: "whsec_<base64 of 24 to 64 random bytes>"
// or "whsk_<base64 of an Ed25519 secret key>". The Ed25519 key is the 64
// bytes of seed and public key (as Go's crypto/ed25519, libsodium and
// Svix serialize it) or the 32-byte seed alone (as
// `openssl pkey -outform DER | tail -c 32` gives it).
func ParseSecret(s string) (*Key, error) {
	switch {
	case strings.HasPrefix(s, SecretPrefix):
		b, err := decode(s[len(SecretPrefix):])
		if err != nil {
			return nil, fmt.Errorf("the %s secret is not standard base64: %w", SecretPrefix, err)
		}
		if len(b) < MinSecretBytes || len(b) > MaxSecretBytes {
			return nil, fmt.Errorf("the %s secret decodes to %d bytes; Standard Webhooks secrets are %d to %d random bytes", SecretPrefix, len(b), MinSecretBytes, MaxSecretBytes)
		}
		return &Key{mac: NewMAC(b)}, nil
	case strings.HasPrefix(s, SigningKeyPrefix):
		b, err := decode(s[len(SigningKeyPrefix):])
		if err != nil {
			return nil, fmt.Errorf("the %s key is not standard base64: %w", SigningKeyPrefix, err)
		}
		switch len(b) {
		case ed25519.SeedSize:
			return &Key{priv: ed25519.NewKeyFromSeed(b)}, nil
		case ed25519.PrivateKeySize:
			priv := ed25519.NewKeyFromSeed(b[:ed25519.SeedSize])
			if !bytes.Equal(priv[ed25519.SeedSize:], b[ed25519.SeedSize:]) {
				return nil, fmt.Errorf("the %s key's public half is not the one of its seed (a key pasted from two keys?)", SigningKeyPrefix)
			}
			return &Key{priv: priv}, nil
		default:
			return nil, fmt.Errorf("the %s key decodes to %d bytes; an Ed25519 secret key is %d bytes (seed and public key) or a %d-byte seed", SigningKeyPrefix, len(b), ed25519.PrivateKeySize, ed25519.SeedSize)
		}
	case strings.HasPrefix(s, PublicKeyPrefix):
		return nil, fmt.Errorf("a %s public key verifies signatures, it cannot make them: give Hopper the %s secret key and the app the %s one", PublicKeyPrefix, SigningKeyPrefix, PublicKeyPrefix)
	default:
		return nil, fmt.Errorf("not a Standard Webhooks secret: it must start with %s (HMAC-SHA256) or %s (Ed25519)", SecretPrefix, SigningKeyPrefix)
	}
}

// decode reads standard base64, padded or not (the reference libraries
// take both).
func decode(s string) ([]byte, error) {
	if b, err := base64.StdEncoding.DecodeString(s); err == nil {
		return b, nil
	}
	return base64.RawStdEncoding.DecodeString(s)
}

// SignaturesLen is the length of the webhook-signature value
// AppendSignatures makes with keys.
func SignaturesLen(keys []*Key) int {
	n := 0
	for i, k := range keys {
		if i > 0 {
			n++
		}
		if k.priv == nil {
			n += len("v1,") + base64.StdEncoding.EncodedLen(sha256.Size)
		} else {
			n += len("v1a,") + base64.StdEncoding.EncodedLen(ed25519.SignatureSize)
		}
	}
	return n
}

// msgBufs keep the buffers an Ed25519 signature's message is assembled in:
// Ed25519 signs one contiguous message, a batch's body included.
var msgBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// maxPooledMsg is the largest message buffer kept for reuse.
const maxPooledMsg = 1 << 20

// AppendSignatures appends the webhook-signature value of a request under
// keys: space-separated "v1,<base64 HMAC-SHA256>" and "v1a,<base64
// Ed25519 signature>", in the keys' order, each over "<id>.<timestamp>.<body>".
// id and timestamp are the webhook-id and webhook-timestamp values.
func AppendSignatures(dst []byte, keys []*Key, id, timestamp string, body []byte) []byte {
	var hb [320]byte
	head := append(append(append(append(hb[:0], id...), '.'), timestamp...), '.')
	var msg *[]byte
	for i, k := range keys {
		if i > 0 {
			dst = append(dst, ' ')
		}
		if k.priv == nil {
			var sb [sha256.Size]byte
			dst = append(dst, "v1,"...)
			dst = base64.StdEncoding.AppendEncode(dst, k.mac.Append(sb[:0], head, body))
			continue
		}
		if msg == nil {
			msg = msgBufs.Get().(*[]byte)
			*msg = append(append((*msg)[:0], head...), body...)
		}
		dst = append(dst, "v1a,"...)
		dst = base64.StdEncoding.AppendEncode(dst, ed25519.Sign(k.priv, *msg))
	}
	if msg != nil && cap(*msg) <= maxPooledMsg {
		msgBufs.Put(msg)
	}
	return dst
}
