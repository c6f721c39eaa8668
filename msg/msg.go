// Package msg holds the broker-neutral form of a message and Hopper's header
// contract: every header Hopper keeps on a message (headers.go), how its
// history is read back (history.go), and how each kind of copy is made when
// a message moves (copy.go): to a delay tier (retry), back to the work queue
// (requeue, give-back), into the DLQ, and out of it again (replay).
//
// Only the broker package speaks AMQP. Everything else (proxy, retry, dlq) sees
// a Message, so the outcome logic and the header mapping can be tested without
// a broker and the AMQP client never leaks into the delivery loop.
package msg

import (
	"errors"
	"strconv"
	"strings"
	"time"
)

// Message is one AMQP message: body, properties and application headers.
//
// Header values keep the AMQP field types: string, []byte, bool, the integer
// and float types, time.Time, Decimal, nested map[string]any and []any, or
// nil.
type Message struct {
	// Exchange and RoutingKey are the ones the message was delivered with. After
	// a delay tier the broker delivers it with exchange "" and the work queue as
	// routing key; the original ones are kept in HeaderOriginalExchange and
	// HeaderOriginalRoutingKey.
	Exchange    string
	RoutingKey  string
	Redelivered bool

	Headers map[string]any

	ContentType     string
	ContentEncoding string
	DeliveryMode    uint8
	Priority        uint8
	CorrelationID   string
	ReplyTo         string
	Expiration      string
	MessageID       string
	Timestamp       time.Time
	Type            string
	UserID          string
	AppID           string

	Body []byte
}

// Decimal is an AMQP decimal header value, Value × 10^-Scale. The broker
// package converts the AMQP client's decimal to and from it, so no other
// package needs the client's type.
type Decimal struct {
	Scale uint8 `json:"scale"`
	Value int32 `json:"value"`
}

func (d Decimal) String() string {
	s := strconv.FormatInt(int64(d.Value), 10)
	if d.Scale == 0 {
		return s
	}
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for len(s) <= int(d.Scale) {
		s = "0" + s
	}
	s = s[:len(s)-int(d.Scale)] + "." + s[len(s)-int(d.Scale):]
	if neg {
		s = "-" + s
	}
	return s
}

// Clone returns a copy whose Headers map can be changed without touching m.
// The body is shared: nothing in Hopper mutates a body.
func (m *Message) Clone() *Message {
	c := *m
	c.Headers = make(map[string]any, len(m.Headers)+8)
	for k, v := range m.Headers {
		c.Headers[k] = v
	}
	return &c
}

// Int reads an integer header written by any client: AMQP tables carry
// integers in several widths, and some clients write counters as strings.
// It returns 0 and false when the header is missing or not a number.
func (m *Message) Int(name string) (int64, bool) {
	return AsInt(m.Headers[name])
}

// String reads a string header ([]byte is accepted too). It returns "" when
// the header is missing or of another type.
func (m *Message) String(name string) string {
	switch v := m.Headers[name].(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}

// AsInt converts an AMQP field value to an integer where that is lossless.
func AsInt(v any) (int64, bool) {
	switch n := v.(type) {
	case int:
		return int64(n), true
	case int8:
		return int64(n), true
	case int16:
		return int64(n), true
	case int32:
		return int64(n), true
	case int64:
		return n, true
	case uint8:
		return int64(n), true
	case uint16:
		return int64(n), true
	case uint32:
		return int64(n), true
	case uint64:
		if n > 1<<62 {
			return 0, false
		}
		return int64(n), true
	case float32:
		return int64(n), float32(int64(n)) == n
	case float64:
		return int64(n), float64(int64(n)) == n
	case string:
		i, err := strconv.ParseInt(n, 10, 64)
		return i, err == nil
	case []byte:
		i, err := strconv.ParseInt(string(n), 10, 64)
		return i, err == nil
	}
	return 0, false
}

// Scalar renders a string, boolean, number or timestamp header value as
// text; ok is false for byte strings, tables, arrays, decimals and void.
func Scalar(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case bool:
		return strconv.FormatBool(x), true
	case float32:
		return strconv.FormatFloat(float64(x), 'g', -1, 32), true
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64), true
	case time.Time:
		return x.UTC().Format(time.RFC3339), true
	case []byte:
		return "", false
	}
	if n, ok := AsInt(v); ok {
		return strconv.FormatInt(n, 10), true
	}
	return "", false
}

// Counter reads a counter header saturating: a number of any width, or
// one written as a string, in [0, MaxCount]. Anything else (missing,
// garbage, NaN, a table) is 0: a counter Hopper cannot read has counted
// nothing, which at worst gives a message one more try.
func Counter(v any) int {
	switch n := v.(type) {
	case float32:
		return counterFloat(float64(n))
	case float64:
		return counterFloat(n)
	case uint64:
		return int(min(n, MaxCount))
	case string:
		return counterString(n)
	case []byte:
		return counterString(string(n))
	}
	n, ok := AsInt(v)
	if !ok {
		return 0
	}
	return int(min(max(n, 0), MaxCount))
}

func counterFloat(f float64) int {
	switch {
	case f != f || f <= 0: // NaN or not positive
		return 0
	case f >= MaxCount:
		return MaxCount
	}
	return int(f)
}

// counterString reads a decimal count; strconv saturates a value out of
// range at the int64 limit with ErrRange, which still clamps correctly.
func counterString(s string) int {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0
	}
	return int(min(max(n, 0), MaxCount))
}

// MaxCount is the largest value a counter header (attempts, requeues,
// crashes, replays) is read as. A publisher can write any number there; a
// count this high already means "far past every limit", and keeping it far
// from the integer limits means that adding one to it never wraps.
const MaxCount = 1 << 30

// Property is one AMQP property of a message, named as AMQP names it.
type Property struct{ Name, Value string }

// Properties lists the AMQP properties a message has set, in one fixed
// order, as text: what a person looking at a message (a DLQ peek, the DLQ
// console) is shown of it besides its headers and body. Delivery fields
// (exchange, routing key, redelivered) are not properties and are left to
// the caller.
func Properties(m *Message) []Property {
	var out []Property
	add := func(name, v string) {
		if v != "" {
			out = append(out, Property{Name: name, Value: v})
		}
	}
	add("message-id", m.MessageID)
	add("correlation-id", m.CorrelationID)
	add("type", m.Type)
	add("content-type", m.ContentType)
	add("content-encoding", m.ContentEncoding)
	add("app-id", m.AppID)
	add("user-id", m.UserID)
	add("reply-to", m.ReplyTo)
	add("expiration", m.Expiration)
	if !m.Timestamp.IsZero() {
		add("timestamp", m.Timestamp.UTC().Format(time.RFC3339))
	}
	if m.Priority > 0 {
		add("priority", strconv.Itoa(int(m.Priority)))
	}
	return out
}
