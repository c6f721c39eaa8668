// Package auth shows how a Go app checks Hopper's Hopper-Signature header;
// verify.py and verify.js next to it do the same in Python and Node.js.
// standardwebhooks/ checks the Standard Webhooks headers with the public
// specification's own Node.js library. satoken.go and satoken.py check a
// Kubernetes service-account token sent as Hopper's bearer token.
package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Window is how far a signature's time may be from now: a request played
// again later than this is refused. One played again within it carries
// the id of the first: the app refuses it by remembering, for the window,
// the ids it has processed.
const Window = 300 * time.Second

// Verify checks a Hopper-Signature ("t=<unix seconds>,id=<delivery
// id>,v1=<hex>,v2=<hex>"): that v2 is key's HMAC-SHA256 of
// "<t>.<id>.<body>" and that t is within Window of now. It returns the
// delivery id, which the signature vouches for: the same on every attempt
// of a message, the key to process it once. v1, over "<t>.<body>" only,
// is not checked: it does not cover the id.
func Verify(key []byte, signature string, body []byte, now time.Time) (id string, err error) {
	var ts, v2 string
	hasID := false
	for _, p := range strings.Split(signature, ",") {
		k, v, _ := strings.Cut(p, "=")
		switch k {
		case "t":
			ts = v
		case "id":
			id, hasID = v, true
		case "v2":
			v2 = v
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return "", fmt.Errorf("no time in the signature: %w", err)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > Window || d < -Window {
		return "", fmt.Errorf("signed %s away from now, outside the %s window", d, Window)
	}
	if !hasID || v2 == "" {
		return "", errors.New("no id or no v2 in the signature (a Hopper that signs the body and time only)")
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(ts + "." + id + "."))
	mac.Write(body)
	if got, err := hex.DecodeString(v2); err != nil || !hmac.Equal(got, mac.Sum(nil)) {
		return "", errors.New("the signature does not match the id and body")
	}
	return id, nil
}
