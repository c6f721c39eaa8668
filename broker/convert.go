package broker

import (
	"fmt"
	"math"
	"strconv"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hopper-sidecar/hopper/msg"
)

// fromDelivery turns a delivery into the message the loop works on. The
// message takes the delivery's headers map over, converted in place (see
// fromTable): the delivery is dropped once converted, and copying every
// table of a message that went through a delay tier (x-death is a list of
// tables) cost more allocations than the rest of its receipt.
//
// A message without headers gets an empty map: the tools that read a
// queue's messages (the DLQ's) edit and write them out as they are.
func fromDelivery(d *amqp.Delivery) *msg.Message {
	m := new(msg.Message)
	readDelivery(m, d)
	if m.Headers == nil {
		m.Headers = map[string]any{}
	}
	return m
}

// readDelivery fills m from d, as fromDelivery does, for a caller that
// allocates the message together with what holds it. A message without
// headers keeps nil headers (see newDelivery).
func readDelivery(m *msg.Message, d *amqp.Delivery) {
	h := fromTable(d.Headers)
	delete(h, headerPublishID) // the publisher's own bookkeeping
	*m = msg.Message{
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

// newDelivery is d as the consumer hands it over, on session s: the
// delivery and its message in one allocation, the one every message
// received costs the consumer. A message without headers keeps nil
// headers, not an empty map of its own: the delivery loop only reads a
// delivered message's headers, and gives it a map before it writes one
// (a requeue's count, a failure kept in place); its copies get maps of
// their own.
func newDelivery(d *amqp.Delivery, s *session) *Delivery {
	r := &struct {
		Delivery
		m msg.Message
	}{}
	readDelivery(&r.m, d)
	r.Delivery = Delivery{m: &r.m, tag: d.DeliveryTag, s: s}
	return &r.Delivery
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

// fromTable returns t as the message's headers. An amqp.Table is a
// map[string]any, so it becomes one without a copy; the values that are
// the client's own types (nested tables, decimals) are replaced in place,
// nested tables and lists converted the same way. t is the caller's to
// give up: it must not be read as an amqp.Table afterwards.
func fromTable(t amqp.Table) map[string]any {
	if t == nil {
		return nil
	}
	for k, v := range t {
		switch v.(type) {
		case amqp.Decimal, amqp.Table, []any:
			t[k] = fromField(v)
		}
	}
	return map[string]any(t)
}

func fromField(v any) any {
	switch x := v.(type) {
	case amqp.Decimal:
		return msg.Decimal{Scale: x.Scale, Value: x.Value}
	case amqp.Table:
		if x == nil {
			return map[string]any{} // a nested table stays a table
		}
		return fromTable(x)
	case []any:
		for i, e := range x {
			x[i] = fromField(e)
		}
		return x
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
