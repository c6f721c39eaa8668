package app

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
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

	"github.com/hopper-sidecar/hopper/internal/signing"
	"github.com/hopper-sidecar/hopper/msg"
)

// HdrSignature carries Hopper's own HMAC signature of a request:
//
//	t=<unix seconds>,id=<delivery id>,v1=<hex HMAC-SHA256 of "<t>.<body>">,v2=<hex HMAC-SHA256 of "<t>.<id>.<body>">
//
// (lowercase hex). The time lets the app refuse a request older than its
// window. v1, the first form, covers the time and the body only: a request
// captured on its way could be sent again within the window with another
// Hopper-Message-Id or to another route, and the app would take it for a
// new message. v2 also covers the delivery id (see DeliveryID), which
// holds no '.', so "<t>.<id>.<body>" splits one way only: an app that
// checks v2 and remembers the ids it processed for the window refuses such
// a replay. v1 is still sent so that apps written against it keep working
// while they move to v2; it says nothing v2 does not. For a new app,
// app.auth.standardWebhooks signs the same three things in the public
// Standard Webhooks form, with verifiers in every common language.
const HdrSignature = "Hopper-Signature"

// The Standard Webhooks headers (https://www.standardwebhooks.com), named
// as the public specification spells them.
const (
	// HdrWebhookID is the delivery id (see DeliveryID): the same on every
	// attempt of a message, so the app can process it once.
	HdrWebhookID = "webhook-id"
	// HdrWebhookTimestamp is when the request was sent, in Unix seconds.
	HdrWebhookTimestamp = "webhook-timestamp"
	// HdrWebhookSignature holds a signature of "<id>.<timestamp>.<body>"
	// per secret, space-separated: "v1,<base64 HMAC-SHA256>" for a whsec_
	// secret, "v1a,<base64 Ed25519 signature>" for a whsk_ key.
	HdrWebhookSignature = "webhook-signature"
)

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
	// HMACKeyFile holds the key every request is signed with, in
	// Hopper-Signature. Default "": no signature.
	HMACKeyFile string
	// StandardWebhooksFile holds Standard Webhooks secrets, one a line:
	// whsec_<base64> (HMAC-SHA256) or whsk_<base64> (Ed25519). Every
	// request carries webhook-id, webhook-timestamp and a signature by
	// each secret in webhook-signature, so a rotation adds the new secret,
	// lets the app learn it, then drops the old one, and no request in
	// between fails. Default "": none.
	StandardWebhooksFile string
	// Now is the clock of the signature times and of the re-reads.
	// Default time.Now.
	Now func() time.Time
	// OnReadError hears of a changed file that could not be read again
	// or held nothing usable: requests go on with the value read before,
	// so a rotation that did not land would otherwise go unnoticed. The
	// error names the file and what is wrong, never the secret.
	// Default none.
	OnReadError func(error)
}

// Auth adds the token and the signatures to requests. It is safe for
// concurrent use.
type Auth struct {
	token    *secretFile[string]
	key      *secretFile[*signing.MAC]
	webhooks *secretFile[[]*signing.Key]
	header   string
	bearer   bool
	now      func() time.Time
}

// NewAuth reads the files; a file that cannot be read or holds nothing
// usable is an error. With no file set it returns nil: nothing to add.
func NewAuth(o AuthOptions) (*Auth, error) {
	if o.TokenFile == "" && o.HMACKeyFile == "" && o.StandardWebhooksFile == "" {
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
		if a.key, err = openSecret(o.HMACKeyFile, hmacKey, a.now()); err != nil {
			return nil, fmt.Errorf("hmac key: %w", err)
		}
		a.key.onError = o.OnReadError
	}
	if o.StandardWebhooksFile != "" {
		if a.webhooks, err = openSecret(o.StandardWebhooksFile, signing.ParseSecrets, a.now()); err != nil {
			return nil, fmt.Errorf("standard webhooks secrets: %w", err)
		}
		a.webhooks.onError = o.OnReadError
	}
	return a, nil
}

// Changed looks at every file again now, whatever its once-a-second turn,
// reads again those that changed, and reports whether one of them now
// holds a new value. While the app refuses Hopper's credentials no request
// goes out to take that turn, and a rotated Secret that lands meanwhile is
// worth a probe at once (see Refusal).
func (a *Auth) Changed() bool {
	changed := false
	if a.token != nil {
		changed = a.token.refresh() || changed
	}
	if a.key != nil {
		changed = a.key.refresh() || changed
	}
	if a.webhooks != nil {
		changed = a.webhooks.refresh() || changed
	}
	return changed
}

// ReadErrors is how many times a changed secret file could not be read
// again (or held nothing usable); the value read before stays in use.
func (a *Auth) ReadErrors() int64 {
	var n int64
	if a.token != nil {
		n += a.token.errors.Load()
	}
	if a.key != nil {
		n += a.key.errors.Load()
	}
	if a.webhooks != nil {
		n += a.webhooks.errors.Load()
	}
	return n
}

// signs reports whether requests carry a signature, which names the
// delivery id.
func (a *Auth) signs() bool { return a != nil && (a.key != nil || a.webhooks != nil) }

// credentials are what one request is authenticated with, read once so
// that the room they take in the head (counted before the other headers
// are placed within the bounds) and the headers added are the same.
type credentials struct {
	au    *Auth
	id    string
	now   time.Time
	token string
	mac   *signing.MAC
	keys  []*signing.Key
}

// credentials reads the token and keys for a request with delivery id id
// (DeliveryID or BatchDeliveryID; needed only when requests are signed)
// and returns them with the room their headers will take in the head.
func (a *Client) credentials(id string) (credentials, Head) {
	au := a.opts.Auth
	if au == nil {
		return credentials{}, Head{}
	}
	c := credentials{au: au, id: id, now: au.now()}
	var h Head
	add := func(name string, n int) {
		h.Headers++
		h.Bytes += len(name) + n + 4
	}
	if au.token != nil {
		c.token = au.token.get(c.now)
		if au.bearer {
			c.token = "Bearer " + c.token
		}
		add(au.header, len(c.token))
	}
	var tb [20]byte
	ts := len(strconv.AppendInt(tb[:0], c.now.Unix(), 10))
	if au.key != nil {
		c.mac = au.key.get(c.now)
		add(HdrSignature, len("t=,id=,v1=,v2=")+ts+len(id)+2*hex.EncodedLen(sha256.Size))
	}
	if au.webhooks != nil {
		c.keys = au.webhooks.get(c.now)
		add(HdrWebhookID, len(id))
		add(HdrWebhookTimestamp, ts)
		add(HdrWebhookSignature, signing.SignaturesLen(c.keys))
	}
	return c, h
}

// authenticate adds the token and signature headers to a request whose
// body is set. They go in last, with Add: fasthttp's Set looks through
// the headers already there, so headers put in first would make every
// later one slower, and none of these can be there already (the token's
// header may not be one Hopper sets). The Standard Webhooks headers go
// with the lowercase names the specification spells. Deliver and
// DeliverBatch both call it, so a batch's whole body is signed as a single
// message's is.
func (c *credentials) authenticate(req *fasthttp.Request) {
	if c.au == nil {
		return
	}
	if c.token != "" {
		req.Header.Add(c.au.header, c.token)
	}
	if c.mac == nil && c.keys == nil {
		return
	}
	var tb [20]byte
	ts := strconv.AppendInt(tb[:0], c.now.Unix(), 10)
	var vb [256]byte
	if c.mac != nil {
		req.Header.AddBytesV(HdrSignature, appendSignature(vb[:0], c.mac, ts, c.id, req.Body()))
	}
	if c.keys != nil {
		req.Header.DisableNormalizing()
		req.Header.Add(HdrWebhookID, c.id)
		req.Header.AddBytesV(HdrWebhookTimestamp, ts)
		req.Header.AddBytesV(HdrWebhookSignature, signing.AppendSignatures(vb[:0], c.keys, c.id, string(ts), req.Body()))
		req.Header.EnableNormalizing()
	}
}

// Sign is the Hopper-Signature value of a request with body and delivery
// id sent at time t under key: "t=<unix seconds>,id=<id>,v1=<lowercase
// hex HMAC-SHA256 of "<t>.<body>">,v2=<lowercase hex HMAC-SHA256 of
// "<t>.<id>.<body>">".
func Sign(key []byte, t time.Time, id string, body []byte) string {
	return string(appendSignature(nil, signing.NewMAC(key), strconv.AppendInt(nil, t.Unix(), 10), id, body))
}

func appendSignature(dst []byte, mac *signing.MAC, ts []byte, id string, body []byte) []byte {
	var hb [320]byte
	var sb [sha256.Size]byte
	dst = append(append(dst, "t="...), ts...)
	dst = append(append(dst, ",id="...), id...)
	dst = append(dst, ",v1="...)
	head := append(append(hb[:0], ts...), '.')
	dst = hex.AppendEncode(dst, mac.Append(sb[:0], head, body))
	dst = append(dst, ",v2="...)
	head = append(append(head, id...), '.')
	return hex.AppendEncode(dst, mac.Append(sb[:0], head, body))
}

// DeliveryID is the id a signed request for one message names: the same
// on every attempt, so the app can process the message once, and free of
// what would make a signature ambiguous or not survive the trip. It is the
// message id when that is 1 to 255 bytes of ASCII letters, digits and
// "-_:/+@~" (UUIDs, ULIDs, "order-42", "msg_…"); "h_" and the first 32 hex
// digits of the SHA-256 of the message id when it holds anything else (a
// '.' would let "<id>.<t>.<body>" split two ways, a ',' or '=' would break
// Hopper-Signature's fields, and a non-ASCII byte reaches a Node.js app as
// another character than was signed). The delivery loop gives a message
// published without an id one of its own before any request; a message
// that still has none (sent outside the loop) gets the id derived from its
// routing key and body that ce-id carries.
func DeliveryID(m *msg.Message, in msg.Info) string {
	id := m.MessageID
	if id == "" {
		return CloudEventID(m, in)
	}
	if plainID(id) {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "h_" + hex.EncodeToString(sum[:16])
}

// BatchDeliveryID is the id a signed batch request names: "b_" and the
// first 32 hex digits of the SHA-256 of its entries' ids (the "id" of each
// entry in the body), each preceded by its length in bytes as a 4-byte
// big-endian number, so that no two lists of ids hash the same bytes. The
// same messages in the same order give the same id on every attempt; any
// other batch, the halves of a split one included, gets another. The app
// deduplicates entries on their own ids; this id names the request as a
// whole.
func BatchDeliveryID(ids []string) string {
	h := sha256.New()
	var n [4]byte
	for _, id := range ids {
		binary.BigEndian.PutUint32(n[:], uint32(len(id)))
		h.Write(n[:])       //nolint:errcheck // a hash never fails to write
		h.Write([]byte(id)) //nolint:errcheck // a hash never fails to write
	}
	var sb [sha256.Size]byte
	return "b_" + hex.EncodeToString(h.Sum(sb[:0])[:16])
}

// plainID reports whether a message id goes into a signed request as it
// is (see DeliveryID).
func plainID(id string) bool {
	if len(id) > 255 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-_:/+@~", c) >= 0) {
			return false
		}
	}
	return true
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
func tokenValue(s string) (string, error) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return "", errors.New("the token holds a control character (a line break inside it?)")
		}
	}
	return s, nil
}

// rawValue takes a file's contents as they are.
func rawValue(s string) (string, error) { return s, nil }

// hmacKey readies the bytes of a key file as Hopper-Signature's key.
func hmacKey(s string) (*signing.MAC, error) { return signing.NewMAC([]byte(s)), nil }

// secretFile is what a file holds, parsed, and read again when the file
// changes.
type secretFile[T any] struct {
	path  string
	parse func(string) (T, error)
	value atomic.Pointer[T]
	// next is when the file is looked at again, in Unix nanoseconds; the
	// request that takes the turn does the stat, the others go on with
	// the value they have.
	next    atomic.Int64
	mu      sync.Mutex
	seen    os.FileInfo
	errors  atomic.Int64
	onError func(error)
}

func openSecret[T any](path string, parse func(string) (T, error), now time.Time) (*secretFile[T], error) {
	s := &secretFile[T]{path: path, parse: parse}
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

// read reads and parses the file. A parse error names the file and what
// is wrong; the parsers never put the secret in it.
func (s *secretFile[T]) read() (T, error) {
	raw, err := ReadSecret(s.path)
	if err != nil {
		var zero T
		return zero, err
	}
	v, err := s.parse(raw)
	if err != nil {
		return v, fmt.Errorf("%s: %w", s.path, err)
	}
	return v, nil
}

// get returns the value, first reading the file again if its turn has
// come and it changed. A file that cannot be read now (a Secret being
// swapped) leaves the value it held: requests go on with it.
func (s *secretFile[T]) get(now time.Time) T {
	next := s.next.Load()
	if now.UnixNano() >= next && s.next.CompareAndSwap(next, now.Add(recheckEvery).UnixNano()) {
		s.refresh()
	}
	return *s.value.Load()
}

// refresh reads the file again if it changed, and reports whether it now
// holds a new value.
func (s *secretFile[T]) refresh() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	fi, err := os.Stat(s.path)
	if err != nil {
		s.failed(err)
		return false
	}
	if os.SameFile(fi, s.seen) && fi.Size() == s.seen.Size() && fi.ModTime().Equal(s.seen.ModTime()) {
		return false
	}
	v, err := s.read()
	if err != nil {
		s.failed(err)
		return false
	}
	s.seen = fi
	s.value.Store(&v)
	return true
}

// failed counts a re-read that did not give a value and tells OnReadError.
func (s *secretFile[T]) failed(err error) {
	s.errors.Add(1)
	if s.onError != nil {
		s.onError(fmt.Errorf("read %s again (the value read before stays in use): %w", s.path, err))
	}
}
