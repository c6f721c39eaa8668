package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// QueueTypeStream is queue.type for a subscription that reads a RabbitMQ
// stream through the stream protocol.
const QueueTypeStream = "stream"

// Stream configures reading a RabbitMQ stream (queue.type stream,
// queue.name the stream). A stream keeps its messages where they are, so
// nothing is ever put back into it: a retry goes through the delay tiers
// and comes back to a queue of the subscription's own, named
// <stream>.<consumer>, which the same Hopper consumes beside the stream,
// and the DLQ is that queue's. The offset stored on the broker under the
// consumer name never passes a message that is not settled.
type Stream struct {
	// Consumer names the reader: the broker keeps its offset under this
	// name, so a restarted or replaced Hopper with the same name goes on
	// where the last one stopped, and it names the subscription's own
	// queue <stream>.<consumer>. Required with queue.type stream.
	Consumer string `yaml:"consumer"`
	// Offset is where a consumer with no stored offset starts reading:
	// first (the oldest message the stream keeps), last (the last chunk
	// written), next (only what is written from now on), a number (that
	// offset), or an RFC 3339 time (the first chunk written at or after
	// it). Once the consumer has stored an offset it resumes after that
	// one, whatever this says. Default first.
	Offset string `yaml:"offset"`
	// Port is the broker's stream protocol port (the rabbitmq_stream
	// plugin's listener); host, user, password and virtual host are the
	// first broker URL's. With an amqps:// URL the stream is read over
	// TLS with broker.tls, so the port must be the broker's TLS stream
	// listener (stream.listeners.ssl, 5551 on RabbitMQ unless set).
	// Default 5552.
	Port int `yaml:"port"`
	// QueueType is the type of the subscription's own queue
	// (<stream>.<consumer>), where retries come back: quorum or classic.
	// Default quorum.
	QueueType string `yaml:"queueType"`
	// StoreEvery is how often the consumer's offset is stored on the
	// broker while it advances; it is also stored at shutdown. A restart
	// delivers again what was settled after the last store. Default 1s.
	StoreEvery Duration `yaml:"storeEvery"`
	// SingleActiveConsumer subscribes as the stream's single active
	// consumer: of the Hoppers reading with this consumer name (the
	// replicas of one app), the broker delivers to one at a time and
	// promotes another when it goes away, which goes on after the offset
	// stored then. Without it, replicas sharing a consumer name each read
	// every message. Needs RabbitMQ 3.11 or later. Default false.
	SingleActiveConsumer *bool `yaml:"singleActiveConsumer,omitempty"`
	// MaxAge is the stream's x-max-age when Hopper declares it
	// (topology.declare): segments older than this are removed. Default
	// 0s (the broker keeps everything unless maxLengthBytes says
	// otherwise).
	MaxAge Duration `yaml:"maxAge"`
	// MaxLengthBytes is the stream's x-max-length-bytes when Hopper
	// declares it: the oldest segments are removed past this size.
	// Default 0 (no limit).
	MaxLengthBytes int `yaml:"maxLengthBytes"`
	// MaxSegmentSizeBytes is the stream's x-stream-max-segment-size-bytes
	// when Hopper declares it: retention removes whole segments, so it
	// sets how finely maxAge and maxLengthBytes apply. Default 0 (the
	// broker's, 500 MB).
	MaxSegmentSizeBytes int `yaml:"maxSegmentSizeBytes"`
	// SuperStream reads queue.name as a super stream: the partition
	// streams bound to the exchange of that name (<name>-0, <name>-1, …),
	// each with its own offset stored under the consumer name. With
	// singleActiveConsumer the broker spreads the partitions among the
	// replicas of the consumer name, one reader per partition. Needs
	// RabbitMQ 3.11 or later, and 3.13 or later for Hopper to declare it.
	// Default false.
	SuperStream bool `yaml:"superStream"`
	// Partitions is the number of partitions of a super stream Hopper
	// declares (topology.declare, RabbitMQ 3.13 or later); a super stream
	// that exists is read with the partitions it has. Default 3.
	Partitions int `yaml:"partitions"`

	// Name is set only on the effective config of a stream subscription
	// (see Config.ForStream): the stream's name, queue.name being the
	// subscription's own queue there. It is no key of the file.
	Name string `yaml:"-"`
}

// MaxSuperStreamPartitions bounds queue.stream.partitions: each partition
// is a stream of its own, with a connection of its own to read it.
const MaxSuperStreamPartitions = 64

// StreamStart is where a consumer with no stored offset starts.
type StreamStart struct {
	// Kind is first, last, next, offset or time.
	Kind   string
	Offset int64
	Time   time.Time
}

// Start reads Offset.
func (s Stream) Start() (StreamStart, error) {
	v := strings.TrimSpace(s.Offset)
	switch v {
	case "first", "last", "next":
		return StreamStart{Kind: v}, nil
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return StreamStart{}, fmt.Errorf("an offset is 0 or more, got %d", n)
		}
		return StreamStart{Kind: "offset", Offset: n}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return StreamStart{Kind: "time", Time: t}, nil
	}
	return StreamStart{}, fmt.Errorf("must be first, last, next, an offset or an RFC 3339 time, got %q", s.Offset)
}

// StreamQueue is the name of a stream subscription's own queue, where its
// retries come back: one per stream and consumer name, so that two
// consumers of one stream never take each other's retries.
func StreamQueue(stream, consumer string) string { return stream + "." + consumer }

// IsStream says whether the config reads a stream.
func (c *Config) IsStream() bool {
	return c.Queue.Type == QueueTypeStream || c.Queue.Stream.Name != ""
}

// ForStream is the config of a stream subscription as the rest of Hopper
// runs it: queue.name the subscription's own queue (StreamQueue), of
// queue.stream.queueType, with queue.stream.name the stream. The tiers and
// the DLQ are named from that queue, so a retry comes back to it and never
// to the stream. Any other config is returned as it is.
func (c *Config) ForStream() Config {
	e := c.clone()
	if c.Queue.Type != QueueTypeStream {
		return e
	}
	e.Queue.Stream.Name = c.Queue.Name
	e.Queue.Name = StreamQueue(c.Queue.Name, c.Queue.Stream.Consumer)
	e.Queue.Type = c.Queue.Stream.QueueType
	if e.Queue.Type == "" {
		e.Queue.Type = "quorum"
	}
	return e
}

// mergeStream lays the stream keys a subscription gives over the
// inherited ones.
func mergeStream(dst *Stream, s Stream) {
	if s.Consumer != "" {
		dst.Consumer = s.Consumer
	}
	if s.Offset != "" {
		dst.Offset = s.Offset
	}
	if s.Port != 0 {
		dst.Port = s.Port
	}
	if s.QueueType != "" {
		dst.QueueType = s.QueueType
	}
	if s.StoreEvery != 0 {
		dst.StoreEvery = s.StoreEvery
	}
	if s.SingleActiveConsumer != nil {
		dst.SingleActiveConsumer = s.SingleActiveConsumer
	}
	if s.MaxAge != 0 {
		dst.MaxAge = s.MaxAge
	}
	if s.MaxLengthBytes != 0 {
		dst.MaxLengthBytes = s.MaxLengthBytes
	}
	if s.MaxSegmentSizeBytes != 0 {
		dst.MaxSegmentSizeBytes = s.MaxSegmentSizeBytes
	}
	if s.SuperStream {
		dst.SuperStream = true
	}
	if s.Partitions != 0 {
		dst.Partitions = s.Partitions
	}
}

// validateStream checks queue.stream for a stream subscription, and what
// a stream cannot be combined with yet.
func validateStream(c *Config, add func(path, format string, a ...any)) {
	s := c.Queue.Stream
	if strings.TrimSpace(s.Consumer) == "" {
		add("queue.stream.consumer", "required with queue.type stream: the broker stores the offset under this name")
	} else if strings.ContainsAny(s.Consumer, " \t\r\n") {
		add("queue.stream.consumer", "must not hold white space, got %q", s.Consumer)
	} else if n := len(StreamQueue(c.Queue.Name, s.Consumer)); n > 200 {
		add("queue.stream.consumer", "the subscription's queue name %s.%s is %d bytes: at most 200 leave room for its tier queue names", c.Queue.Name, s.Consumer, n)
	}
	if _, err := s.Start(); err != nil {
		add("queue.stream.offset", "%v", err)
	}
	if s.Port < 1 || s.Port > 65535 {
		add("queue.stream.port", "must be a TCP port, got %d", s.Port)
	}
	if s.QueueType != "quorum" && s.QueueType != "classic" {
		add("queue.stream.queueType", "must be quorum or classic, got %q", s.QueueType)
	}
	if s.StoreEvery <= 0 {
		add("queue.stream.storeEvery", "must be positive, got %s", s.StoreEvery)
	}
	if s.MaxAge < 0 {
		add("queue.stream.maxAge", "must not be negative, got %s", s.MaxAge)
	} else if s.MaxAge > 0 && s.MaxAge < Duration(time.Second) {
		add("queue.stream.maxAge", "the broker counts it in whole seconds, got %s", s.MaxAge)
	}
	if s.MaxLengthBytes < 0 {
		add("queue.stream.maxLengthBytes", "must not be negative, got %d", s.MaxLengthBytes)
	}
	if s.MaxSegmentSizeBytes < 0 {
		add("queue.stream.maxSegmentSizeBytes", "must not be negative, got %d", s.MaxSegmentSizeBytes)
	}
	if s.Partitions < 1 || s.Partitions > MaxSuperStreamPartitions {
		add("queue.stream.partitions", "must be 1 to %d, got %d", MaxSuperStreamPartitions, s.Partitions)
	}
	// What a stream subscription does not do yet: each would apply to the
	// subscription's own queue, not to the stream, which is not what it
	// says.
	for _, k := range []struct {
		key string
		set bool
	}{
		{"queue.deliveryLimit", c.Queue.DeliveryLimit != 0},
		{"queue.arguments", len(c.Queue.Arguments) > 0},
		{"queue.singleActiveConsumer", c.Queue.SingleActiveConsumer != nil},
		{"topology.bindings", len(c.Topology.Bindings) > 0},
		{"topology.partitions", c.Topology.Partitions.On()},
		{"schedule.enabled", c.Schedule.Enabled},
	} {
		if k.set {
			add(k.key, "not with queue.type stream: a stream subscription does not support it yet")
		}
	}
}
