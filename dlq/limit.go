package dlq

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/hopper-sidecar/hopper/msg"
)

// DeliveryLimit is a quorum DLQ's delivery limit as the operator knows it:
// the number of counted returns of a message the queue allows, past which
// it drops (or dead-letters) the message. The broker does not tell: a
// policy's delivery-limit, which wins over the queue's own argument,
// cannot be read over AMQP at all. So the tools take it from the operator,
// and decide from it which messages they may hand back by returning them
// (see Rotation).
//
// The zero value is unknown, and then every message is rotated: a tool
// killed while it holds a message spends one delivery of it on every
// release, and without the limit nothing says that one is not the last.
type DeliveryLimit int

const (
	// UnknownDeliveryLimit rotates every message handed back.
	UnknownDeliveryLimit DeliveryLimit = 0
	// NoDeliveryLimit is a queue that drops nothing however often a
	// message returns (x-delivery-limit -1 on RabbitMQ 4.x and no policy
	// setting one; on 3.x, neither argument nor policy): nothing is
	// rotated.
	NoDeliveryLimit DeliveryLimit = -1
)

// ParseDeliveryLimit reads "none" (NoDeliveryLimit) or a count of at least
// 1. "" is UnknownDeliveryLimit. The broker's own -1 for no limit is
// refused: on RabbitMQ 3.x an x-delivery-limit of -1 drops a message at its
// first return, so the word says which one is meant.
func ParseDeliveryLimit(s string) (DeliveryLimit, error) {
	switch t := strings.TrimSpace(s); strings.ToLower(t) {
	case "":
		return UnknownDeliveryLimit, nil
	case "none":
		return NoDeliveryLimit, nil
	default:
		n, err := strconv.Atoi(t)
		if err != nil || n < 1 {
			return UnknownDeliveryLimit, fmt.Errorf("delivery limit %q: want a count of at least 1, or none for a queue without one", s)
		}
		return DeliveryLimit(n), nil
	}
}

// String is what ParseDeliveryLimit reads back.
func (l DeliveryLimit) String() string {
	switch {
	case l == NoDeliveryLimit:
		return "none"
	case l <= 0:
		return ""
	}
	return strconv.Itoa(int(l))
}

// MustRotate tells whether a message whose x-delivery-count is count must
// be rotated rather than returned: when the limit is unknown, and when one
// more counted return would bring it to the limit (count+1 >= l). The
// broker drops a message only once a return takes its count past the
// limit, so that keeps one return in hand, for one nobody planned (a
// reader other than Hopper's tools, a broker node lost while it held the
// message). A message at or past the threshold is always rotated: its
// copy starts again without a count.
func (l DeliveryLimit) MustRotate(count int64) bool {
	switch {
	case l == NoDeliveryLimit:
		return false
	case l <= 0:
		return true
	}
	return count+1 >= int64(l)
}

// Need is Rotation.Need for a DLQ under limit l: nil (every message) when
// l is unknown, none for a DLQ without a limit, else MustRotate of each
// message's x-delivery-count. A message without the header was never
// returned in a way that counts. One whose header is not an integer (a
// publisher set it) is rotated, which drops the header from its copy.
func (l DeliveryLimit) Need() func(*msg.Message) bool {
	switch {
	case l == NoDeliveryLimit:
		return func(*msg.Message) bool { return false }
	case l <= 0:
		return nil
	}
	return func(m *msg.Message) bool {
		v, ok := m.Headers[msg.HeaderDeliveryCount]
		if !ok {
			return l.MustRotate(0)
		}
		n, ok := msg.AsInt(v)
		return !ok || l.MustRotate(n)
	}
}
