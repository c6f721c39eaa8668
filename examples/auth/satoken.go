package auth

import (
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"time"
)

// JWKS is a JSON Web Key Set as a Kubernetes API server serves it at its
// issuer's jwks_uri (/openid/v1/jwks): the public keys its service-account
// tokens are signed with.
type JWKS struct {
	Keys []struct {
		Kid string `json:"kid"`
		Kty string `json:"kty"`
		Alg string `json:"alg"`
		N   string `json:"n"`
		E   string `json:"e"`
	} `json:"keys"`
}

// Claims are what VerifyServiceAccountToken returns of a token it accepts.
type Claims struct {
	Issuer    string    `json:"iss"`
	Subject   string    `json:"sub"` // system:serviceaccount:<namespace>:<name>
	Audience  audience  `json:"aud"`
	Expiry    unixTime  `json:"exp"`
	NotBefore *unixTime `json:"nbf,omitempty"`
}

// VerifyServiceAccountToken checks a projected service-account token, the
// way an app checks the one Hopper sends as its bearer token: an RS256
// signature by a key of the issuer's set, the issuer, the app's own
// audience (never the API server's: a token for the API server must not
// open the app), and the expiry (and not-before) against now, with a
// minute of leeway for clocks. It returns the token's claims; the app then
// checks that Subject is the service account Hopper's pod runs as.
func VerifyServiceAccountToken(token string, keys JWKS, issuer, audience string, now time.Time) (Claims, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return Claims{}, errors.New("not a JWT (want header.payload.signature)")
	}
	var head struct {
		Alg string `json:"alg"`
		Kid string `json:"kid"`
	}
	if err := decodePart(parts[0], &head); err != nil {
		return Claims{}, fmt.Errorf("token header: %w", err)
	}
	if head.Alg != "RS256" {
		return Claims{}, fmt.Errorf("token signed with %q, want RS256", head.Alg)
	}
	pub, err := keyFor(keys, head.Kid)
	if err != nil {
		return Claims{}, err
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return Claims{}, fmt.Errorf("token signature: %w", err)
	}
	digest := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if err := rsa.VerifyPKCS1v15(pub, crypto.SHA256, digest[:], sig); err != nil {
		return Claims{}, fmt.Errorf("token signature: %w", err)
	}
	var c Claims
	if err := decodePart(parts[1], &c); err != nil {
		return Claims{}, fmt.Errorf("token claims: %w", err)
	}
	const leeway = time.Minute
	switch {
	case c.Issuer != issuer:
		return Claims{}, fmt.Errorf("token issued by %q, want %q", c.Issuer, issuer)
	case !slices.Contains(c.Audience, audience):
		return Claims{}, fmt.Errorf("token for %q, not for %q", c.Audience, audience)
	case c.Expiry.IsZero() || now.After(c.Expiry.Add(leeway)):
		return Claims{}, fmt.Errorf("token expired at %s", c.Expiry.UTC().Format(time.RFC3339))
	case c.NotBefore != nil && now.Add(leeway).Before(c.NotBefore.Time):
		return Claims{}, fmt.Errorf("token not valid before %s", c.NotBefore.UTC().Format(time.RFC3339))
	}
	return c, nil
}

func keyFor(keys JWKS, kid string) (*rsa.PublicKey, error) {
	for _, k := range keys.Keys {
		if k.Kid != kid || k.Kty != "RSA" {
			continue
		}
		n, err := base64.RawURLEncoding.DecodeString(k.N)
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", kid, err)
		}
		e, err := base64.RawURLEncoding.DecodeString(k.E)
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", kid, err)
		}
		return &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(e).Int64())}, nil
	}
	return nil, fmt.Errorf("no RSA key %q in the issuer's key set", kid)
}

func decodePart(part string, v any) error {
	b, err := base64.RawURLEncoding.DecodeString(part)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// audience is a JWT's aud claim: one string or a list of them.
type audience []string

func (a *audience) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*a = audience{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return fmt.Errorf("aud: %w", err)
	}
	*a = many
	return nil
}

// unixTime is a JWT time claim: seconds since the epoch.
type unixTime struct{ time.Time }

func (u *unixTime) UnmarshalJSON(b []byte) error {
	var secs json.Number
	if err := json.Unmarshal(b, &secs); err != nil {
		return fmt.Errorf("time claim: %w", err)
	}
	n, err := secs.Int64()
	if err != nil {
		return fmt.Errorf("time claim: %w", err)
	}
	u.Time = time.Unix(n, 0)
	return nil
}
