package app

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// HdrSignature carries the HMAC signature of a request:
// "t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">". The time in it
// lets the app refuse a captured request played again later.
const HdrSignature = "Hopper-Signature"

// DefaultTokenHeader is where the token goes unless AuthOptions says
// otherwise; it is sent there as "Bearer <token>".
const DefaultTokenHeader = "Authorization"

// recheckEvery is how often, at most, a secret file is looked at again on
// the request path: a stat a second costs nothing next to a request, and a
// rotated Secret reaches the pod's volume only after a minute or so anyway.
const recheckEvery = time.Second

// AuthOptions say how requests to the app prove they come from Hopper. The
// files are mounted Secrets: each is read when the Auth is made and again
// when it changes (its size, modification time or identity, looked at no
// more than once a second), so a rotated Secret is picked up without a
// restart.
type AuthOptions struct {
	// TokenFile holds a token sent with every request. Default "": none.
	TokenFile string
	// TokenHeader is the header the token goes in. Default Authorization,
	// as "Bearer <token>"; any other header gets the token as it is.
	TokenHeader string
	// HMACKeyFile holds the key every request body is signed with, in
	// Hopper-Signature. Default "": no signature.
	HMACKeyFile string
	// Now is the clock of the signature times and of the re-reads.
	// Default time.Now.
	Now func() time.Time
	// OnReadError hears of a changed file that could not be read again
	// or held nothing usable: requests go on with the value read before,
	// so a rotation that did not land would otherwise go unnoticed.
	// Default none.
	OnReadError func(error)
}

// Auth adds the token and the signature to requests. It is safe for
// concurrent use.
type Auth struct {
	token  *secretFile
	key    *secretFile
	header string
	bearer bool
	now    func() time.Time
}

// NewAuth reads the files; a file that cannot be read or holds nothing is
// an error. With neither file set it returns nil: nothing to add.
func NewAuth(o AuthOptions) (*Auth, error) {
	if o.TokenFile == "" && o.HMACKeyFile == "" {
		return nil, nil
	}
	a := &Auth{header: o.TokenHeader, now: o.Now}
	if a.header == "" {
		a.header = DefaultTokenHeader
	}
	if !validToken(a.header) {
		return nil, fmt.Errorf("token header %q is not an HTTP header name", a.header)
	}
	a.bearer = strings.EqualFold(a.header, DefaultTokenHeader)
	if a.now == nil {
		a.now = time.Now
	}
	var err error
	if o.TokenFile != "" {
		if a.token, err = openSecret(o.TokenFile, tokenValue, a.now()); err != nil {
			return nil, fmt.Errorf("token: %w", err)
		}
		a.token.onError = o.OnReadError
	}
	if o.HMACKeyFile != "" {
		if a.key, err = openSecret(o.HMACKeyFile, nil, a.now()); err != nil {
			return nil, fmt.Errorf("hmac key: %w", err)
		}
		a.key.onError = o.OnReadError
	}
	return a, nil
}

// ReadErrors is how many times a changed secret file could not be read
// again (or held nothing usable); the value read before stays in use.
func (a *Auth) ReadErrors() int64 {
	var n int64
	for _, s := range []*secretFile{a.token, a.key} {
		if s != nil {
			n += s.errors.Load()
		}
	}
	return n
}

// authenticate adds the token and signature headers to a request whose
// body is set, and returns the size of what it added, for the head's
// bounds. Deliver and DeliverBatch both call it, so a batch's whole body
// is signed as a single message's is.
func (a *Client) authenticate(req *fasthttp.Request) Head {
	au := a.opts.Auth
	if au == nil {
		return Head{}
	}
	var h Head
	now := au.now()
	if au.token != nil {
		v := au.token.get(now)
		if au.bearer {
			v = "Bearer " + v
		}
		req.Header.Set(au.header, v)
		h.Headers++
		h.Bytes += line(Header{Name: au.header, Value: v})
	}
	if au.key != nil {
		v := Sign([]byte(au.key.get(now)), now, req.Body())
		req.Header.Set(HdrSignature, v)
		h.Headers++
		h.Bytes += line(Header{Name: HdrSignature, Value: v})
	}
	return h
}

// Sign is the Hopper-Signature value of body at time t under key:
// "t=<unix seconds>,v1=<lowercase hex HMAC-SHA256 of "<t>.<body>">".
func Sign(key []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(ts)) //nolint:errcheck // a hash never fails to write
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac.Sum(nil))
}

// ReadSecret reads a secret file as Hopper uses it: the trailing newline
// an editor or `echo` leaves is not part of it. Empty is an error.
func ReadSecret(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	b = bytes.TrimRight(b, "\r\n")
	if len(b) == 0 {
		return "", fmt.Errorf("%s is empty", path)
	}
	return string(b), nil
}

// tokenValue refuses a token that cannot be a header value.
func tokenValue(s string) error {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return errors.New("the token holds a control character (a line break inside it?)")
		}
	}
	return nil
}

// secretFile is a file's value, read again when the file changes.
type secretFile struct {
	path  string
	check func(string) error
	value atomic.Pointer[string]
	// next is when the file is looked at again, in Unix nanoseconds; the
	// request that takes the turn does the stat, the others go on with
	// the value they have.
	next    atomic.Int64
	mu      sync.Mutex
	seen    os.FileInfo
	errors  atomic.Int64
	onError func(error)
}

func openSecret(path string, check func(string) error, now time.Time) (*secretFile, error) {
	s := &secretFile{path: path, check: check}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	v, err := s.read()
	if err != nil {
		return nil, err
	}
	s.seen = fi
	s.value.Store(&v)
	s.next.Store(now.Add(recheckEvery).UnixNano())
	return s, nil
}

func (s *secretFile) read() (string, error) {
	v, err := ReadSecret(s.path)
	if err == nil && s.check != nil {
		if cerr := s.check(v); cerr != nil {
			err = fmt.Errorf("%s: %w", s.path, cerr)
		}
	}
	return v, err
}

// get returns the value, first reading the file again if its turn has
// come and it changed. A file that cannot be read now (a Secret being
// swapped) leaves the value it held: requests go on with it.
func (s *secretFile) get(now time.Time) string {
	next := s.next.Load()
	if now.UnixNano() >= next && s.next.CompareAndSwap(next, now.Add(recheckEvery).UnixNano()) {
		s.refresh()
	}
	return *s.value.Load()
}

func (s *secretFile) refresh() {
	s.mu.Lock()
	defer s.mu.Unlock()
	fi, err := os.Stat(s.path)
	if err != nil {
		s.failed(err)
		return
	}
	if os.SameFile(fi, s.seen) && fi.Size() == s.seen.Size() && fi.ModTime().Equal(s.seen.ModTime()) {
		return
	}
	v, err := s.read()
	if err != nil {
		s.failed(err)
		return
	}
	s.seen = fi
	s.value.Store(&v)
}

// failed counts a re-read that did not give a value and tells OnReadError.
func (s *secretFile) failed(err error) {
	s.errors.Add(1)
	if s.onError != nil {
		s.onError(fmt.Errorf("read %s again (the value read before stays in use): %w", s.path, err))
	}
}
