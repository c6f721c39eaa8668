// Package redact keeps credentials that ride in URLs out of what Hopper
// prints: logs, events, /readyz, span attributes and error messages.
//
// A URL's user info is taken out whole, the user name with the password:
// a token is often given as the user name alone (https://TOKEN@host/), so
// the name is as secret as the password.
package redact

import (
	"net/url"
	"strings"
)

// Placeholder stands where user info was taken out.
const Placeholder = "REDACTED"

// URL is raw with its user name and password replaced by REDACTED, the
// form OpenTelemetry's url.full convention asks for. A string that does not parse as a URL
// loses everything between its scheme and the last @ before its path, so
// that even a URL too broken to be used prints without its credentials.
func URL(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		if u.User == nil {
			return raw
		}
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(Placeholder, Placeholder)
		} else {
			u.User = url.User(Placeholder)
		}
		return u.String()
	}
	info, ok := userInfo(raw)
	if !ok {
		return raw
	}
	return strings.Replace(raw, info+"@", Placeholder+"@", 1)
}

// Error is err with the user info of raw, and the password and user name
// found in it, taken out of its text; errors.Is and errors.As still see
// err. Errors from URL parsers and HTTP clients often quote the URL they
// were given.
func Error(err error, raw string) error {
	if err == nil {
		return nil
	}
	msg := Text(err.Error(), raw)
	if msg == err.Error() {
		return err
	}
	return &scrubbed{msg: msg, err: err}
}

// Text is s with the user info of raw, and the password and user name
// found in it, taken out.
func Text(s, raw string) string {
	info, ok := userInfo(raw)
	if !ok {
		return s
	}
	s = strings.ReplaceAll(s, info+"@", Placeholder+"@")
	for _, part := range strings.SplitN(info, ":", 2) {
		if len(part) < 3 {
			continue // too short to tell from the rest of the text
		}
		s = strings.ReplaceAll(s, part, Placeholder)
		if dec, err := url.PathUnescape(part); err == nil && dec != part {
			s = strings.ReplaceAll(s, dec, Placeholder)
		}
	}
	return s
}

// userInfo is the text between the scheme's "//" and the last @ of the
// authority, as written (still percent-encoded).
func userInfo(raw string) (string, bool) {
	_, rest, found := strings.Cut(raw, "//")
	if !found {
		rest = raw
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	at := strings.LastIndex(rest, "@")
	if at <= 0 {
		return "", false
	}
	return rest[:at], true
}

type scrubbed struct {
	msg string
	err error
}

func (s *scrubbed) Error() string { return s.msg }
func (s *scrubbed) Unwrap() error { return s.err }
