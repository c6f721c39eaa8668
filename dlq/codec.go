package dlq

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hopper-sidecar/hopper/msg"
)

// The export format is JSON Lines: one Record per line. It keeps everything
// import needs to republish a message unchanged: the body (base64), every
// AMQP property, and the headers with their AMQP field types, so that an
// int16 comes back an int16 and a byte array does not become a string.
//
// A header value is {"type": T, "value": V}:
//
//	string     V is a JSON string (or {"base64": ...} when not UTF-8)
//	bytes      V is base64
//	bool       V is true or false
//	int8 int16 int32 int64 uint8 uint16 uint32
//	           V is a JSON number
//	float32 float64
//	           V is a string ("1.5", "NaN", "+Inf"): exact, and JSON has no NaN
//	decimal    V is {"scale": S, "value": N}, the number N × 10^-S
//	timestamp  V is Unix seconds (AMQP timestamps have second precision)
//	table      V is an object of header values
//	array      V is an array of header values
//	null       no V
//
// Names and string properties that are not valid UTF-8 (AMQP allows any
// bytes) are kept exactly: a property becomes {"base64": ...}, a header name
// is written as "=b64:" followed by its base64 form.

// RecordVersion is the format version written in every line.
const RecordVersion = 1

// Record is one exported message.
type Record struct {
	V int `json:"v"`
	// Queue, Exchange, RoutingKey and Redelivered describe where the
	// message was read; import does not use them.
	Queue       string           `json:"queue,omitempty"`
	Exchange    Text             `json:"exchange"`
	RoutingKey  Text             `json:"routingKey"`
	Redelivered bool             `json:"redelivered,omitempty"`
	Properties  Properties       `json:"properties"`
	Headers     map[string]Value `json:"headers,omitempty"`
	Body        []byte           `json:"body"`
}

// Properties are the AMQP basic properties.
type Properties struct {
	ContentType     Text  `json:"contentType,omitempty"`
	ContentEncoding Text  `json:"contentEncoding,omitempty"`
	DeliveryMode    uint8 `json:"deliveryMode,omitempty"`
	Priority        uint8 `json:"priority,omitempty"`
	CorrelationID   Text  `json:"correlationId,omitempty"`
	ReplyTo         Text  `json:"replyTo,omitempty"`
	Expiration      Text  `json:"expiration,omitempty"`
	MessageID       Text  `json:"messageId,omitempty"`
	// Timestamp is in Unix seconds.
	Timestamp *int64 `json:"timestamp,omitempty"`
	Type      Text   `json:"type,omitempty"`
	UserID    Text   `json:"userId,omitempty"`
	AppID     Text   `json:"appId,omitempty"`
}

// Text is a string that survives JSON byte for byte: JSON strings must be
// UTF-8, AMQP strings need not be.
type Text string

// MarshalJSON writes a JSON string, or {"base64": ...} when s is not UTF-8.
func (s Text) MarshalJSON() ([]byte, error) {
	if utf8.ValidString(string(s)) {
		return marshal(string(s))
	}
	return marshal(struct {
		B64 []byte `json:"base64"`
	}{[]byte(s)})
}

// UnmarshalJSON reads either form.
func (s *Text) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '{' {
		var o struct {
			B64 []byte `json:"base64"`
		}
		if err := json.Unmarshal(b, &o); err != nil {
			return err
		}
		*s = Text(o.B64)
		return nil
	}
	var v string
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*s = Text(v)
	return nil
}

// Value is one typed header value.
type Value struct {
	Type  string          `json:"type"`
	Value json.RawMessage `json:"value,omitempty"`
}

const b64Key = "=b64:"

func encodeKey(k string) string {
	if utf8.ValidString(k) && !strings.HasPrefix(k, b64Key) {
		return k
	}
	return b64Key + base64.StdEncoding.EncodeToString([]byte(k))
}

func decodeKey(k string) (string, error) {
	if !strings.HasPrefix(k, b64Key) {
		return k, nil
	}
	b, err := base64.StdEncoding.DecodeString(k[len(b64Key):])
	if err != nil {
		return "", fmt.Errorf("header name %q: %w", k, err)
	}
	return string(b), nil
}

// NewRecord encodes a message read from queue.
func NewRecord(m *msg.Message, queue string) (*Record, error) {
	r := &Record{
		V: RecordVersion, Queue: queue,
		Exchange: Text(m.Exchange), RoutingKey: Text(m.RoutingKey), Redelivered: m.Redelivered,
		Properties: Properties{
			ContentType: Text(m.ContentType), ContentEncoding: Text(m.ContentEncoding),
			DeliveryMode: m.DeliveryMode, Priority: m.Priority,
			CorrelationID: Text(m.CorrelationID), ReplyTo: Text(m.ReplyTo), Expiration: Text(m.Expiration),
			MessageID: Text(m.MessageID), Type: Text(m.Type), UserID: Text(m.UserID), AppID: Text(m.AppID),
		},
		Body: m.Body,
	}
	if !m.Timestamp.IsZero() {
		ts := m.Timestamp.Unix()
		r.Properties.Timestamp = &ts
	}
	if len(m.Headers) > 0 {
		h, err := encodeTable(m.Headers)
		if err != nil {
			return nil, err
		}
		r.Headers = h
	}
	return r, nil
}

// Message decodes the record.
func (r *Record) Message() (*msg.Message, error) {
	if r.V != RecordVersion {
		return nil, fmt.Errorf("record version %d: this hopper reads version %d", r.V, RecordVersion)
	}
	p := r.Properties
	m := &msg.Message{
		Exchange: string(r.Exchange), RoutingKey: string(r.RoutingKey), Redelivered: r.Redelivered,
		ContentType: string(p.ContentType), ContentEncoding: string(p.ContentEncoding),
		DeliveryMode: p.DeliveryMode, Priority: p.Priority,
		CorrelationID: string(p.CorrelationID), ReplyTo: string(p.ReplyTo), Expiration: string(p.Expiration),
		MessageID: string(p.MessageID), Type: string(p.Type), UserID: string(p.UserID), AppID: string(p.AppID),
		Body:    r.Body,
		Headers: map[string]any{},
	}
	if p.Timestamp != nil {
		m.Timestamp = time.Unix(*p.Timestamp, 0)
	}
	if r.Headers != nil {
		h, err := decodeTable(r.Headers)
		if err != nil {
			return nil, err
		}
		m.Headers = h
	}
	return m, nil
}

// MarshalLine encodes a message as one JSON line, newline included.
func MarshalLine(m *msg.Message, queue string) ([]byte, error) {
	r, err := NewRecord(m, queue)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // bodies and headers stay readable with jq
	if err := enc.Encode(r); err != nil {
		return nil, fmt.Errorf("encode message %q: %w", m.MessageID, err)
	}
	return buf.Bytes(), nil
}

// UnmarshalLine decodes one JSON line.
func UnmarshalLine(line []byte) (*msg.Message, error) {
	var r Record
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return nil, err
	}
	return r.Message()
}

func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

func encodeTable(t map[string]any) (map[string]Value, error) {
	out := make(map[string]Value, len(t))
	for k, v := range t {
		ev, err := encodeValue(v)
		if err != nil {
			return nil, fmt.Errorf("header %q: %w", k, err)
		}
		out[encodeKey(k)] = ev
	}
	return out, nil
}

func encodeValue(v any) (Value, error) {
	typed := func(t string, x any) (Value, error) {
		b, err := marshal(x)
		return Value{Type: t, Value: b}, err
	}
	float := func(t string, f float64, bits int) (Value, error) {
		return typed(t, strconv.FormatFloat(f, 'g', -1, bits))
	}
	switch x := v.(type) {
	case nil:
		return Value{Type: "null"}, nil
	case string:
		return typed("string", Text(x))
	case []byte:
		return typed("bytes", x)
	case bool:
		return typed("bool", x)
	case int8:
		return typed("int8", x)
	case int16:
		return typed("int16", x)
	case int32:
		return typed("int32", x)
	case int64:
		return typed("int64", x)
	case int:
		// The AMQP client writes a Go int as a 32-bit field.
		if x >= math.MinInt32 && x <= math.MaxInt32 {
			return typed("int32", x)
		}
		return typed("int64", x)
	case uint8:
		return typed("uint8", x)
	case uint16:
		return typed("uint16", x)
	case uint32:
		return typed("uint32", x)
	case uint64:
		if x <= math.MaxInt64 {
			return typed("int64", x)
		}
		return typed("string", Text(strconv.FormatUint(x, 10)))
	case float32:
		return float("float32", float64(x), 32)
	case float64:
		return float("float64", x, 64)
	case time.Time:
		return typed("timestamp", x.Unix())
	case map[string]any:
		t, err := encodeTable(x)
		if err != nil {
			return Value{}, err
		}
		return typed("table", t)
	case []any:
		arr := make([]Value, len(x))
		for i, e := range x {
			ev, err := encodeValue(e)
			if err != nil {
				return Value{}, fmt.Errorf("[%d]: %w", i, err)
			}
			arr[i] = ev
		}
		return typed("array", arr)
	}
	if d, ok := v.(msg.Decimal); ok {
		return typed("decimal", d)
	}
	return Value{}, fmt.Errorf("unsupported header type %T", v)
}

func decodeTable(t map[string]Value) (map[string]any, error) {
	out := make(map[string]any, len(t))
	for k, v := range t {
		name, err := decodeKey(k)
		if err != nil {
			return nil, err
		}
		dv, err := decodeValue(v)
		if err != nil {
			return nil, fmt.Errorf("header %q: %w", name, err)
		}
		out[name] = dv
	}
	return out, nil
}

func decodeValue(v Value) (any, error) {
	into := func(dst any) error {
		if len(v.Value) == 0 {
			return fmt.Errorf("%s value missing", v.Type)
		}
		if err := json.Unmarshal(v.Value, dst); err != nil {
			return fmt.Errorf("%s value %s: %w", v.Type, v.Value, err)
		}
		return nil
	}
	float := func(bits int) (float64, error) {
		var s string
		if err := into(&s); err != nil {
			return 0, err
		}
		f, err := strconv.ParseFloat(s, bits)
		if err != nil {
			return 0, fmt.Errorf("%s value %q: %w", v.Type, s, err)
		}
		return f, nil
	}
	switch v.Type {
	case "null":
		return nil, nil
	case "string":
		var s Text
		err := into(&s)
		return string(s), err
	case "bytes":
		var b []byte
		err := into(&b)
		if b == nil {
			b = []byte{}
		}
		return b, err
	case "bool":
		var b bool
		err := into(&b)
		return b, err
	case "int8":
		var n int8
		err := into(&n)
		return n, err
	case "int16":
		var n int16
		err := into(&n)
		return n, err
	case "int32":
		var n int32
		err := into(&n)
		return n, err
	case "int64":
		var n int64
		err := into(&n)
		return n, err
	case "uint8":
		var n uint8
		err := into(&n)
		return n, err
	case "uint16":
		var n uint16
		err := into(&n)
		return n, err
	case "uint32":
		var n uint32
		err := into(&n)
		return n, err
	case "float32":
		f, err := float(32)
		return float32(f), err
	case "float64":
		return float(64)
	case "decimal":
		var d msg.Decimal
		err := into(&d)
		return d, err
	case "timestamp":
		var sec int64
		err := into(&sec)
		return time.Unix(sec, 0), err
	case "table":
		var t map[string]Value
		if err := into(&t); err != nil {
			return nil, err
		}
		return decodeTable(t)
	case "array":
		var arr []Value
		if err := into(&arr); err != nil {
			return nil, err
		}
		out := make([]any, len(arr))
		for i, e := range arr {
			dv, err := decodeValue(e)
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			out[i] = dv
		}
		return out, nil
	}
	return nil, fmt.Errorf("unknown header type %q", v.Type)
}
