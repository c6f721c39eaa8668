// Package order decides which messages of a queue must be delivered one
// after the other: those with the same ordering key. It reads the key from
// a message and keeps, per key, the messages waiting behind the one being
// delivered. It is pure: the proxy runs the deliveries it names.
package order

import (
	"fmt"
	"strings"

	"github.com/hopper-sidecar/hopper/msg"
)

// Where a key comes from.
const (
	FromRoutingKey = "routingKey"
	FromType       = "type"
	// FromHeader is written header:NAME.
	FromHeader = "header"
	// FromMessageID is written messageId:SEP; the key is the message id up
	// to the first SEP.
	FromMessageID = "messageId"
)

// MaxKeyLen bounds a key kept in memory: a longer key is cut to its first
// MaxKeyLen bytes, so a hostile header cannot grow the table of waiting
// keys without limit.
const MaxKeyLen = 256

// Source reads the ordering key of a message. The zero Source reads none:
// every message is unordered.
type Source struct {
	from string
	arg  string
}

// Parse reads a key source as written in configuration: routingKey, type,
// header:NAME or messageId:SEP. "" is no source.
func Parse(s string) (Source, error) {
	if s == "" {
		return Source{}, nil
	}
	from, arg, hasArg := strings.Cut(s, ":")
	switch from {
	case FromRoutingKey, FromType:
		if hasArg {
			return Source{}, fmt.Errorf("%q takes no argument (write %s)", s, from)
		}
		return Source{from: from}, nil
	case FromHeader:
		if arg == "" {
			return Source{}, fmt.Errorf("%q names no header (write header:NAME)", s)
		}
		return Source{from: from, arg: arg}, nil
	case FromMessageID:
		if arg == "" {
			return Source{}, fmt.Errorf("%q names no separator (write messageId:SEP, e.g. messageId:/)", s)
		}
		return Source{from: from, arg: arg}, nil
	}
	return Source{}, fmt.Errorf("unknown ordering key %q: one of routingKey, type, header:NAME, messageId:SEP", s)
}

// Set says whether the source reads a key at all.
func (s Source) Set() bool { return s.from != "" }

// String is the source as written in configuration.
func (s Source) String() string {
	if s.arg == "" {
		return s.from
	}
	return s.from + ":" + s.arg
}

// Key is m's ordering key, or false when m has none: an empty routing key
// or type, a missing or empty header (one without a text form, such as bytes
// or a table, counts as missing), a message id without the separator. A message
// without a key is unordered.
func (s Source) Key(m *msg.Message) (string, bool) {
	var k string
	switch s.from {
	case FromRoutingKey:
		k = m.RoutingKey
	case FromType:
		k = m.Type
	case FromHeader:
		v, ok := m.Headers[s.arg]
		if !ok {
			return "", false
		}
		k, _ = msg.Scalar(v)
	case FromMessageID:
		prefix, _, found := strings.Cut(m.MessageID, s.arg)
		if !found {
			return "", false
		}
		k = prefix
	}
	if k == "" {
		return "", false
	}
	if len(k) > MaxKeyLen {
		k = k[:MaxKeyLen]
	}
	return k, true
}
