// Package auth shows how a Go app checks Hopper's Hopper-Signature header;
// verify.py and verify.js next to it do the same in Python and Node.js.
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
// again later than this is refused.
const Window = 300 * time.Second

// Verify checks that signature ("t=<unix seconds>,v1=<hex>") is key's
// HMAC-SHA256 of "<t>.<body>" and that t is within Window of now.
func Verify(key []byte, signature string, body []byte, now time.Time) error {
	var ts, v1 string
	for _, p := range strings.Split(signature, ",") {
		k, v, _ := strings.Cut(p, "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			v1 = v
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("no time in the signature: %w", err)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > Window || d < -Window {
		return fmt.Errorf("signed %s away from now, outside the %s window", d, Window)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	if got, err := hex.DecodeString(v1); err != nil || !hmac.Equal(got, mac.Sum(nil)) {
		return errors.New("the signature does not match the body")
	}
	return nil
}
