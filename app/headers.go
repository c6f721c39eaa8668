package app

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
)

// Request header names the app receives. They are part of Hopper's contract
// with apps and are listed in the README.
const (
	HdrMessageID       = "Hopper-Message-Id"
	HdrCorrelationID   = "Hopper-Correlation-Id"
	HdrType            = "Hopper-Type"
	HdrRoutingKey      = "Hopper-Routing-Key"
	HdrExchange        = "Hopper-Exchange"
	HdrQueue           = "Hopper-Queue"
	HdrTimestamp       = "Hopper-Timestamp"
	HdrRedelivered     = "Hopper-Redelivered"
	HdrAttempt         = "Hopper-Attempt"
	HdrRequeueCount    = "Hopper-Requeue-Count"
	HdrFirstFailure    = "Hopper-First-Failure-Time"
	HdrDeadline        = "Hopper-Deadline"
	HdrContentEncoding = "Hopper-Content-Encoding"
	HdrAppID           = "Hopper-App-Id"
	// HdrHeaderPrefix prefixes each AMQP application header that is a
	// string, number or boolean.
	HdrHeaderPrefix = "Hopper-Header-"

	// Response headers the app may send.
	HdrAction     = "Hopper-Action"
	HdrRetryAfter = "Retry-After"
)

// maxHeaderValue bounds one forwarded header value: HTTP servers reject
// requests with huge header blocks, and then every attempt fails the same way.
const maxHeaderValue = 4096

// Header is one HTTP request header.
type Header struct{ Name, Value string }

// BuildHeaders maps a message to request headers. It appends to dst (to
// reuse its storage) and returns the headers and the number of application
// headers skipped because their name is not a valid HTTP token or their
// value is not a string, number or boolean.
func BuildHeaders(dst []Header, m *msg.Message, in msg.Info) ([]Header, int) {
	add := func(name, value string) {
		if value != "" {
			dst = append(dst, Header{name, SanitizeValue(value)})
		}
	}
	add(HdrMessageID, m.MessageID)
	add(HdrCorrelationID, m.CorrelationID)
	add(HdrType, m.Type)
	add(HdrRoutingKey, in.RoutingKey)
	add(HdrExchange, in.Exchange)
	add(HdrQueue, in.Queue)
	if !m.Timestamp.IsZero() {
		add(HdrTimestamp, m.Timestamp.UTC().Format(time.RFC3339))
	}
	add(HdrRedelivered, strconv.FormatBool(m.Redelivered))
	add(HdrAttempt, strconv.Itoa(in.Attempt))
	add(HdrRequeueCount, strconv.Itoa(in.Requeues))
	add(HdrFirstFailure, m.String(msg.HeaderFirstFailureTime))
	if !in.Deadline.IsZero() {
		add(HdrDeadline, in.Deadline.UTC().Format(time.RFC3339Nano))
	}
	add(HdrContentEncoding, m.ContentEncoding)
	add(HdrAppID, m.AppID)

	skipped := 0
	for k, v := range m.Headers {
		switch k {
		case "x-death":
			// The broker's dead-letter history (an array of tables) after a
			// tier: bookkeeping, not the app's data; Hopper-Attempt says it.
			continue
		case "traceparent", "tracestate":
			if s, ok := v.(string); ok && validToken(k) {
				add(k, s)
			}
			continue
		}
		s, ok := scalar(v)
		if !ok || !validToken(k) {
			skipped++
			continue
		}
		// Unlike Hopper's own headers, an empty application header is
		// forwarded: its presence may mean something to the app.
		dst = append(dst, Header{HdrHeaderPrefix + k, SanitizeValue(s)})
	}
	return dst, skipped
}

// scalar renders a string, number, boolean or timestamp header value.
func scalar(v any) (string, bool) { return msg.Scalar(v) }

// validToken reports whether s is an HTTP header name (RFC 9110 token).
func validToken(s string) bool {
	if s == "" || len(s) > 200 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) {
			return false
		}
	}
	return true
}

// SanitizeValue makes a header value safe to send: control characters (CR,
// LF and NUL among them) become spaces, so a header can never split the
// request, and the value is cut at maxHeaderValue bytes on a rune boundary.
func SanitizeValue(s string) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 && c != '\t' || c == 0x7f {
			clean = false
			break
		}
	}
	if clean && len(s) <= maxHeaderValue {
		return s
	}
	b := []byte(s)
	for i, c := range b {
		if c < 0x20 && c != '\t' || c == 0x7f {
			b[i] = ' '
		}
	}
	if len(b) > maxHeaderValue {
		cut := maxHeaderValue
		for cut > 0 && b[cut]&0xC0 == 0x80 {
			cut--
		}
		b = b[:cut]
	}
	return string(b)
}

// CloudEvents binary-mode headers (HTTP protocol binding), for apps written
// for Knative eventing. The message body is the event data and Content-Type
// its datacontenttype.
const (
	ceSpecVersion = "ce-specversion"
	ceID          = "ce-id"
	ceSource      = "ce-source"
	ceType        = "ce-type"
	ceSubject     = "ce-subject"
	ceTime        = "ce-time"
	// DefaultCloudEventType is ce-type for messages without an AMQP type.
	DefaultCloudEventType = "com.rabbitmq.message"
)

// CloudEventHeaders appends the ce-* attributes of a message. ce-id is the
// message id; a message without one gets an id derived from its content, so
// a redelivery keeps the same id (consumers deduplicate on source + id).
func CloudEventHeaders(dst []Header, m *msg.Message, in msg.Info) []Header {
	id := m.MessageID
	if id == "" {
		h := sha256.New()
		h.Write([]byte(in.RoutingKey))
		h.Write([]byte{0})
		h.Write(m.Body)
		id = hex.EncodeToString(h.Sum(nil)[:16])
	}
	source := "/rabbitmq/queue/" + in.Queue
	if in.Exchange != "" {
		source = "/rabbitmq/exchange/" + in.Exchange
	}
	typ := m.Type
	if typ == "" {
		typ = DefaultCloudEventType
	}
	dst = append(dst,
		Header{ceSpecVersion, "1.0"},
		Header{ceID, SanitizeValue(id)},
		Header{ceSource, SanitizeValue(source)},
		Header{ceType, SanitizeValue(typ)},
	)
	if in.RoutingKey != "" {
		dst = append(dst, Header{ceSubject, SanitizeValue(in.RoutingKey)})
	}
	if !m.Timestamp.IsZero() {
		dst = append(dst, Header{ceTime, m.Timestamp.UTC().Format(time.RFC3339)})
	}
	return dst
}
