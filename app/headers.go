package app

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hopper-sidecar/hopper/batch"
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

// HdrHeadersOmitted tells the app how many of the message's application
// headers its request leaves out (see BuildHeaders); it is sent only when
// some are.
const HdrHeadersOmitted = "Hopper-Headers-Omitted"

// maxHeaderValue is where SanitizeValue cuts a value.
const maxHeaderValue = 4096

// ownValueMax cuts the values of Hopper's own headers, trace context and
// CloudEvents attributes. AMQP carries its properties, names and routing
// keys in at most 255 bytes, so only a value made up outside the broker is
// ever cut; the bound keeps the headers that are never left out small.
const ownValueMax = 512

// Limits bound the head of one request (request line and header lines), so
// that every common app server accepts it: Python's http.server refuses
// more than 100 headers, Node.js a head over 16 KiB, Tomcat, Jetty and
// Netty one over 8 KiB. A server that refuses the head refuses every
// attempt the same way, and the message ends in the DLQ for nothing. Zero
// fields take DefaultLimits'.
type Limits struct {
	// MaxHeaders bounds the request's header lines: Hopper's own, trace
	// context, CloudEvents, the forwarded application headers and those
	// the HTTP client writes (Host, User-Agent, Content-Type,
	// Content-Length).
	MaxHeaders int
	// MaxHeaderBytes bounds the request head in bytes, as sent: request
	// line, header lines and the blank line after them.
	MaxHeaderBytes int
	// MaxValueBytes is the longest application header value forwarded. A
	// longer one is left out whole: a cut value would reach the app as if
	// it were the message's.
	MaxValueBytes int
}

// DefaultLimits leave room under every common server's limits for what a
// proxy between Hopper and the app adds.
var DefaultLimits = Limits{MaxHeaders: 90, MaxHeaderBytes: 7168, MaxValueBytes: 4096}

func (l Limits) withDefaults() Limits {
	if l.MaxHeaders <= 0 {
		l.MaxHeaders = DefaultLimits.MaxHeaders
	}
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = DefaultLimits.MaxHeaderBytes
	}
	if l.MaxValueBytes <= 0 {
		l.MaxValueBytes = DefaultLimits.MaxValueBytes
	}
	return l
}

// Head is the part of a request head that Build does not return: the
// request line and the headers the HTTP client writes itself.
type Head struct {
	// Headers is the number of header lines.
	Headers int
	// Bytes is their size as sent, the request line and the blank line
	// after the headers included.
	Bytes int
}

// Omitted counts, by reason, the application headers of a message its
// request leaves out. The broker's x-death and the trace context, which
// have names of their own, are not application headers here.
type Omitted struct {
	// Invalid: the name is not an HTTP token, or the value is not a
	// string, number, boolean or timestamp.
	Invalid int
	// ValueTooLong: the value is over Limits.MaxValueBytes.
	ValueTooLong int
	// MaxHeaders: past the header count bound.
	MaxHeaders int
	// MaxHeaderBytes: past the head size bound.
	MaxHeaderBytes int
}

// Total is every application header left out.
func (o Omitted) Total() int { return o.Invalid + o.ValueTooLong + o.MaxHeaders + o.MaxHeaderBytes }

// Header is one HTTP request header. It is the field type of a batch
// entry too, so the headers built for a message go into its entry as they
// are.
type Header = batch.Field

// line is the size of a header line as sent: "Name: value\r\n".
func line(h Header) int { return len(h.Name) + len(h.Value) + 4 }

// BuildHeaders maps a message to request headers within DefaultLimits,
// for a request with nothing else in its head. It appends to dst (to
// reuse its storage) and returns the headers and the number of
// application headers left out.
func BuildHeaders(dst []Header, m *msg.Message, in msg.Info) ([]Header, int) {
	hs, o := DefaultLimits.Build(dst, m, in, nil, Head{})
	return hs, o.Total()
}

// Build appends to dst the request headers for a message: Hopper's own
// identity and history headers and the trace context, then extra (always
// sent; one named like a header already there replaces its value, so the
// client span's traceparent wins over the message's), then the application
// headers that fit in what the limits leave after those and head. Those go
// in the order of their names, until the first that does not fit; what is
// left out is counted, and the app is told the count in
// Hopper-Headers-Omitted. Hopper's own headers are never left out.
func (l Limits) Build(dst []Header, m *msg.Message, in msg.Info, extra []Header, head Head) ([]Header, Omitted) {
	l = l.withDefaults()
	base := len(dst)
	add := func(name, value string) {
		if value != "" {
			dst = append(dst, Header{Name: name, Value: cut(cleanValue(value), ownValueMax)})
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
	for _, k := range [...]string{"traceparent", "tracestate"} {
		// Trace context is passed through as is or not at all: a cut
		// tracestate would be a different one.
		if s, ok := m.Headers[k].(string); ok && s != "" && len(s) <= ownValueMax {
			dst = append(dst, Header{Name: k, Value: cleanValue(s)})
		}
	}
extras:
	for _, h := range extra {
		h.Value = cut(cleanValue(h.Value), ownValueMax)
		for i := base; i < len(dst); i++ {
			if dst[i].Name == h.Name {
				dst[i].Value = h.Value
				continue extras
			}
		}
		dst = append(dst, h)
	}

	var o Omitted
	names := make([]string, 0, len(m.Headers))
	for k := range m.Headers {
		switch k {
		case "x-death", "traceparent", "tracestate":
			// The broker's dead-letter history (an array of tables) after a
			// tier is bookkeeping, not the app's data: Hopper-Attempt says
			// it. Trace context went out under its own names.
			continue
		}
		names = append(names, k)
	}
	if len(names) == 0 {
		return dst, o
	}
	slices.Sort(names)
	count, size := head.Headers+len(dst)-base, head.Bytes
	for _, h := range dst[base:] {
		size += line(h)
	}
	// The candidates go straight into dst; those that do not fit are cut
	// off its end.
	first := len(dst)
	for _, k := range names {
		s, ok := scalar(m.Headers[k])
		if !ok || !validToken(k) {
			o.Invalid++
			continue
		}
		s = cleanValue(s)
		if len(s) > l.MaxValueBytes {
			o.ValueTooLong++
			continue
		}
		// Unlike Hopper's own headers, an empty application header is
		// forwarded: its presence may mean something to the app.
		dst = append(dst, Header{Name: forwardedName(k), Value: s})
	}
	app := dst[first:]
	n, over := fit(app, l.MaxHeaders-count, l.MaxHeaderBytes-size)
	if n < len(app) || o.Total() > 0 {
		// Something is left out: make room for saying so. The count is at
		// most the number of headers, which bounds its digits.
		signal := Header{Name: HdrHeadersOmitted, Value: strconv.Itoa(len(m.Headers))}
		n, over = fit(app, l.MaxHeaders-count-1, l.MaxHeaderBytes-size-line(signal))
	}
	if rest := len(app) - n; over == overCount {
		o.MaxHeaders = rest
	} else {
		o.MaxHeaderBytes = rest
	}
	dst = dst[:first+n]
	if o.Total() > 0 {
		dst = append(dst, Header{Name: HdrHeadersOmitted, Value: strconv.Itoa(o.Total())})
	}
	return dst, o
}

// forwardedName is the request header name of the application header k.
// The headers Hopper writes itself come with nearly every message of a
// stream (its name and offset) or a retry (its history): their names are
// constants, where joining the prefix to the name would allocate for
// each one of each request.
func forwardedName(k string) string {
	switch k {
	case msg.HeaderStream:
		return HdrHeaderPrefix + msg.HeaderStream
	case msg.HeaderStreamOffset:
		return HdrHeaderPrefix + msg.HeaderStreamOffset
	case msg.HeaderRetryCount:
		return HdrHeaderPrefix + msg.HeaderRetryCount
	case msg.HeaderRequeueCount:
		return HdrHeaderPrefix + msg.HeaderRequeueCount
	case msg.HeaderFirstFailureTime:
		return HdrHeaderPrefix + msg.HeaderFirstFailureTime
	case msg.HeaderLastFailureTime:
		return HdrHeaderPrefix + msg.HeaderLastFailureTime
	case msg.HeaderLastStatusCode:
		return HdrHeaderPrefix + msg.HeaderLastStatusCode
	case msg.HeaderOriginalExchange:
		return HdrHeaderPrefix + msg.HeaderOriginalExchange
	case msg.HeaderOriginalRoutingKey:
		return HdrHeaderPrefix + msg.HeaderOriginalRoutingKey
	case msg.HeaderOriginalQueue:
		return HdrHeaderPrefix + msg.HeaderOriginalQueue
	}
	return HdrHeaderPrefix + k
}

// Which bound fit stopped at.
const (
	overNone = iota
	overCount
	overBytes
)

// fit is how many of hs, from the first, fit in headers header lines and
// bytes bytes, and which bound stopped it.
func fit(hs []Header, headers, bytes int) (int, int) {
	for i, h := range hs {
		if i >= headers {
			return i, overCount
		}
		if bytes -= line(h); bytes < 0 {
			return i, overBytes
		}
	}
	return len(hs), overNone
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

// SanitizeValue makes a header value safe to send: control characters other
// than TAB (CR, LF, NUL and DEL among them) become spaces, so a header can
// never split the request, and the value is cut at maxHeaderValue bytes on
// a rune boundary.
func SanitizeValue(s string) string { return cut(cleanValue(s), maxHeaderValue) }

// cleanValue turns control characters (CR, LF, NUL and DEL among them) into
// spaces, so a header can never split the request. TAB is kept: it is legal
// inside a header value and splits nothing.
func cleanValue(s string) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 && c != '\t' || c == 0x7f {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	b := []byte(s)
	for i, c := range b {
		if c < 0x20 && c != '\t' || c == 0x7f {
			b[i] = ' '
		}
	}
	return string(b)
}

// cut shortens s to at most n bytes on a rune boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
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

// CloudEventID is the CloudEvents id of a message: its message id. The
// delivery loop gives a message published without one an id of its own
// first (msg.EnsureID); one that still has none gets an id derived from
// its routing key and body, the same on every call.
func CloudEventID(m *msg.Message, in msg.Info) string {
	if m.MessageID != "" {
		return m.MessageID
	}
	var sum [sha256.Size]byte
	if n := len(in.RoutingKey) + 1 + len(m.Body); n <= contentIDStack {
		// Most messages are small: hashed from one buffer on the stack,
		// the id costs a single allocation, its own string.
		var b [contentIDStack]byte
		sum = sha256.Sum256(append(append(append(b[:0], in.RoutingKey...), 0), m.Body...))
	} else {
		h := sha256.New()
		h.Write([]byte(in.RoutingKey)) //nolint:errcheck // a hash never fails to write
		h.Write([]byte{0})             //nolint:errcheck // a hash never fails to write
		h.Write(m.Body)                //nolint:errcheck // a hash never fails to write
		h.Sum(sum[:0])
	}
	var hx [32]byte
	hex.Encode(hx[:], sum[:16])
	return string(hx[:])
}

// contentIDStack is the size, in bytes, of routing key and body up to
// which CloudEventID hashes them from a buffer on the stack.
const contentIDStack = 1024

// CloudEventHeaders appends the ce-* attributes of a message. ce-id is the
// message id; a message without one gets an id derived from its content, so
// a redelivery keeps the same id (consumers deduplicate on source + id).
func CloudEventHeaders(dst []Header, m *msg.Message, in msg.Info) []Header {
	id := CloudEventID(m, in)
	source := "/rabbitmq/queue/" + in.Queue
	if in.Exchange != "" {
		source = "/rabbitmq/exchange/" + in.Exchange
	}
	typ := m.Type
	if typ == "" {
		typ = DefaultCloudEventType
	}
	dst = append(dst,
		Header{Name: ceSpecVersion, Value: "1.0"},
		Header{Name: ceID, Value: SanitizeValue(id)},
		Header{Name: ceSource, Value: SanitizeValue(source)},
		Header{Name: ceType, Value: SanitizeValue(typ)},
	)
	if in.RoutingKey != "" {
		dst = append(dst, Header{Name: ceSubject, Value: SanitizeValue(in.RoutingKey)})
	}
	if !m.Timestamp.IsZero() {
		dst = append(dst, Header{Name: ceTime, Value: m.Timestamp.UTC().Format(time.RFC3339)})
	}
	return dst
}
