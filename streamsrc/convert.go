package streamsrc

import (
	"bytes"
	"fmt"
	"strings"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"

	"github.com/hopper-sidecar/hopper/msg"
)

// Message annotations RabbitMQ writes on a message published over AMQP
// 0.9.1 into a stream: where it was published, and the 0.9.1 properties
// AMQP 1.0 has no field for.
const (
	annotationExchange   = "x-exchange"
	annotationRoutingKey = "x-routing-key"
	annotationType       = "x-basic-type"
	annotationAppID      = "x-basic-app-id"
	annotationExpiration = "x-basic-expiration"
	annotationPriority   = "x-basic-priority"
)

// fromStream turns a message read from stream at offset into Hopper's
// message, out. Application properties become headers; so do the message
// annotations whose names start with x-, which is where RabbitMQ 4 keeps
// the x- headers of a message published over AMQP 0.9.1. The stream's
// name (a string, boxed once by the caller) and the offset are written as
// headers of their own (msg.HeaderStream, msg.HeaderStreamOffset), so that
// every copy made of the message says which entry of the stream it is.
func fromStream(out *msg.Message, m *amqp.Message, stream any, offset int64) {
	out.Headers = make(map[string]any, len(m.ApplicationProperties)+4)
	for k, v := range m.Annotations {
		// Annotation keys are AMQP symbols, which the client decodes as
		// strings.
		name, ok := k.(string)
		if !ok {
			continue
		}
		switch name {
		case annotationExchange:
			out.Exchange, _ = v.(string)
		case annotationRoutingKey:
			out.RoutingKey, _ = v.(string)
		case annotationType:
			out.Type, _ = v.(string)
		case annotationAppID:
			out.AppID, _ = v.(string)
		case annotationExpiration:
			out.Expiration, _ = v.(string)
		case annotationPriority:
			if n, ok := msg.AsInt(v); ok && n >= 0 && n <= 255 {
				out.Priority = uint8(n)
			}
		default:
			if strings.HasPrefix(name, "x-") {
				out.Headers[name] = header(v)
			}
		}
	}
	for k, v := range m.ApplicationProperties {
		out.Headers[k] = header(v)
	}
	if p := m.Properties; p != nil {
		out.MessageID = identifier(p.MessageID)
		out.CorrelationID = identifier(p.CorrelationID)
		out.ContentType = p.ContentType
		out.ContentEncoding = p.ContentEncoding
		out.ReplyTo = p.ReplyTo
		out.UserID = string(p.UserID)
		out.Timestamp = p.CreationTime
		if out.Type == "" {
			out.Type = p.Subject
		}
	}
	if h := m.Header; h != nil {
		if h.Durable {
			out.DeliveryMode = 2
		}
		if out.Priority == 0 {
			out.Priority = h.Priority
		}
	}
	out.Body = body(m)
	out.Headers[msg.HeaderStream] = stream
	out.Headers[msg.HeaderStreamOffset] = offset
}

// header keeps a value Hopper's headers can hold as it is, and writes the
// rest (UUIDs, lists, maps with keys that are not strings) as text.
func header(v any) any {
	switch x := v.(type) {
	case nil, string, []byte, bool, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float32, float64, time.Time:
		return x
	case int:
		return int64(x)
	}
	return fmt.Sprint(v)
}

// identifier is a message or correlation id as text: AMQP 1.0 allows a
// string, a number, a UUID or bytes.
func identifier(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case []byte:
		return string(x)
	}
	return fmt.Sprint(v)
}

// body is the message's payload: its data sections joined (one, when
// published over AMQP 0.9.1 or by the stream clients), or an amqp-value
// that is text or bytes.
func body(m *amqp.Message) []byte {
	switch len(m.Data) {
	case 0:
	case 1:
		return m.Data[0]
	default:
		return bytes.Join(m.Data, nil)
	}
	switch v := m.Value.(type) {
	case string:
		return []byte(v)
	case []byte:
		return v
	}
	return nil
}
