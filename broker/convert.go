package broker

import (
	"fmt"
	"math"
	"strconv"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hopper-sidecar/hopper/msg"
)

func fromDelivery(d *amqp.Delivery) *msg.Message {
	h := fromTable(d.Headers)
	delete(h, headerPublishID) // the publisher's own bookkeeping
	return &msg.Message{
		Exchange:        d.Exchange,
		RoutingKey:      d.RoutingKey,
		Redelivered:     d.Redelivered,
		Headers:         h,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    d.DeliveryMode,
		Priority:        d.Priority,
		CorrelationID:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		Expiration:      d.Expiration,
		MessageID:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		UserID:          d.UserId,
		AppID:           d.AppId,
		Body:            d.Body,
	}
}

// toPublishing builds the copy Hopper publishes when it moves a message:
// same body and properties, persistent. Expiration is dropped: a per-message
// TTL would let the broker discard the copy in a tier queue or the DLQ;
// Hopper keeps the deadline in its own header instead.
func toPublishing(m *msg.Message) amqp.Publishing {
	return amqp.Publishing{
		Headers:         toTable(m.Headers),
		ContentType:     m.ContentType,
		ContentEncoding: m.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        m.Priority,
		CorrelationId:   m.CorrelationID,
		ReplyTo:         m.ReplyTo,
		MessageId:       m.MessageID,
		Timestamp:       m.Timestamp,
		Type:            m.Type,
		UserId:          m.UserID,
		AppId:           m.AppID,
		Body:            m.Body,
	}
}

func fromTable(t amqp.Table) map[string]any {
	if t == nil {
		return map[string]any{}
	}
	out := make(map[string]any, len(t))
	for k, v := range t {
		out[k] = fromField(v)
	}
	return out
}

func fromField(v any) any {
	switch x := v.(type) {
	case amqp.Decimal:
		return msg.Decimal{Scale: x.Scale, Value: x.Value}
	case amqp.Table:
		return fromTable(x)
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = fromField(e)
		}
		return out
	}
	return v
}

func toTable(m map[string]any) amqp.Table {
	if len(m) == 0 {
		return nil
	}
	out := make(amqp.Table, len(m))
	for k, v := range m {
		out[k] = toField(v)
	}
	return out
}

func toField(v any) any {
	switch x := v.(type) {
	case msg.Decimal:
		return amqp.Decimal{Scale: x.Scale, Value: x.Value}
	case map[string]any:
		t := toTable(x)
		if t == nil {
			t = amqp.Table{}
		}
		return t
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = toField(e)
		}
		return out
	case uint64:
		if x <= math.MaxInt64 {
			return int64(x)
		}
		return strconv.FormatUint(x, 10) // AMQP has no unsigned 64-bit field
	case uint:
		return toField(uint64(x))
	}
	return v
}

// Publishable reports whether m's headers can be written as an AMQP table
// as they are: every value of a type the table encoding carries, every
// name short enough for it. A copy Hopper makes of any delivered message
// must pass, or its move could never be published.
func Publishable(m *msg.Message) error {
	for k := range m.Headers {
		if len(k) > 255 {
			return fmt.Errorf("header name of %d bytes: longer than an AMQP short string", len(k))
		}
	}
	if err := toTable(m.Headers).Validate(); err != nil {
		return fmt.Errorf("headers: %w", err)
	}
	return nil
}
