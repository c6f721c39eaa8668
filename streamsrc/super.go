package streamsrc

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
)

// A super stream is a set of partition streams (<name>-0, <name>-1, …)
// bound to an exchange <name>; a publisher routes each message to one of
// them by its key, so the messages of one key keep their order within one
// partition. A Source reads every partition as it reads a stream, each
// with its own offsets under the consumer name. As single active
// consumers, the readers of one name share the partitions: the broker
// makes one of them the active reader of each partition and moves
// partitions when readers come and go. The client does that grouping for
// a super stream consumer only (the subscription property that names the
// super stream is its own), so a single active reader subscribes through
// it; any other reads each partition with a consumer of its own.

// ErrNoSuperStream is why a super stream cannot be read on this broker:
// it is older than RabbitMQ 3.11, which brought super streams, or the
// super stream is missing and the broker cannot declare one. Subscribing
// again cannot help, so Run returns it.
var ErrNoSuperStream = errors.New("the broker cannot serve this super stream")

// partitions declares the super stream when the options say so and it is
// missing, and returns its partition streams.
func (s *Source) partitions(env *stream.Environment) ([]string, error) {
	var declareErr error
	if s.o.Declare {
		// Each partition gets the retention a stream would.
		opts := stream.NewPartitionsOptions(s.o.Partitions)
		s.setRetention(func(d time.Duration) { opts.SetMaxAge(d) },
			func(b *stream.ByteCapacity) { opts.SetMaxLengthBytes(b) },
			func(b *stream.ByteCapacity) { opts.SetMaxSegmentSizeBytes(b) })
		if err := env.DeclareSuperStream(s.o.Stream, opts); err != nil {
			declareErr = err
		}
	}
	names, err := env.QueryPartitions(s.o.Stream)
	switch {
	case errors.Is(err, stream.StreamDoesNotExist) || err == nil && len(names) == 0:
		if declareErr != nil && strings.Contains(declareErr.Error(), "not supported") {
			// The client declares one only on RabbitMQ 3.13 or later.
			return nil, fmt.Errorf("%w: super stream %s not found, and RabbitMQ before 3.13 cannot declare one "+
				"(3.11 and 3.12 create it with `rabbitmq-streams add_super_stream %s --partitions %d`; 3.10 has no super streams)",
				ErrNoSuperStream, s.o.Stream, s.o.Stream, s.o.Partitions)
		}
		if declareErr != nil {
			return nil, fmt.Errorf("declare super stream: %w", declareErr)
		}
		return nil, fmt.Errorf("super stream %q: %w", s.o.Stream, ErrNoStream)
	case err != nil:
		return nil, fmt.Errorf("list the partitions of super stream %s: %w", s.o.Stream, err)
	}
	if !since311(env, names[0]) {
		return nil, fmt.Errorf("%w: super streams need RabbitMQ 3.11 or later", ErrNoSuperStream)
	}
	return names, nil
}

// subscribeSuper subscribes to every partition as a single active
// consumer of the super stream, so that the broker spreads the partitions
// among the readers of the consumer name; each partition starts where
// promote says once the broker makes this reader its active one. It
// returns what ends the subscription.
func (s *Source) subscribeSuper(env *stream.Environment, gen uint64, lost chan<- error) (func() error, error) {
	parts := s.partList()
	for _, p := range parts {
		p.active.Store(false)
	}
	opts := stream.NewSuperStreamConsumerOptions().
		SetConsumerName(s.o.Consumer).
		SetManualCommit().
		SetOffset(s.firstStart()).
		SetClientProvidedName(s.o.Name).
		SetSingleActiveConsumer(stream.NewSingleActiveConsumer(func(partition string, active bool) stream.OffsetSpecification {
			return s.promote(env, s.partNamed(partition), active)
		}))
	cons, err := env.NewSuperStreamConsumer(s.o.Stream, func(cc stream.ConsumerContext, m *amqp.Message) {
		s.onMessage(gen, s.partNamed(cc.Consumer.GetStreamName()), cc.Consumer.GetOffset(), m)
	}, opts)
	if errors.Is(err, stream.SingleActiveConsumerNotSupported) {
		return nil, ErrNoSingleActive
	}
	if err != nil {
		return nil, fmt.Errorf("subscribe to super stream %s: %w", s.o.Stream, err)
	}
	closed := cons.NotifyPartitionClose(len(parts) + 1)
	go func() {
		for ev := range closed {
			select {
			case lost <- closeError(ev.Partition, ev.Event):
			default: // the session ends at the first
			}
		}
	}()
	s.mu.Lock()
	for _, p := range s.parts {
		name := p.name
		p.save = func(off int64) error { return env.StoreOffset(s.o.Consumer, name, off) }
	}
	s.mu.Unlock()
	s.log.Info("reading the super stream", "event", "STREAM_SUBSCRIBED", "partitions", len(parts))
	return cons.Close, nil
}
