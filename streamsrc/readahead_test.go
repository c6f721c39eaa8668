package streamsrc

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"github.com/hopper-sidecar/hopper/internal/waitfor"
)

// publishChunks writes n messages to the stream, each alone in a chunk of
// its own: every one is confirmed before the next is sent.
func publishChunks(t *testing.T, o Options, n int) {
	t.Helper()
	env, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetHost(o.Host).SetPort(o.Port))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer env.Close()
	p, err := env.NewProducer(o.Stream, stream.NewProducerOptions())
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	defer p.Close()
	for i := range n {
		m := amqp.NewMessage(fmt.Appendf(nil, "body %d", i))
		m.Properties = &amqp.MessageProperties{MessageID: fmt.Sprintf("m%d", i)}
		if r := sendConfirmed(t, p, []*amqp.AMQP10{m}); !r[0] {
			t.Fatal("a publish was not confirmed")
		}
	}
}

// The source gives the stream client its credits itself, chunk by chunk:
// a backlog of chunks of one message each, and one of a few large chunks
// read with a prefetch far below their size, are each read to the end,
// every message once and in offset order.
func TestSourceCreditsReadEveryChunk(t *testing.T) {
	b := node.Get(t)
	for _, c := range []struct {
		name        string
		prefetch, n int
		single      bool
	}{
		{"single-message chunks", 50, 300, true},
		{"large chunks", 5, 3000, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := options(t, b)
			o.Prefetch = c.prefetch
			src := New(o)
			var got, disorder atomic.Int64
			last := int64(-1) // of the one goroutine that hands over
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go src.Run(ctx, func(d *Delivery) { //nolint:errcheck // ends with ctx
				if d.Offset() <= last {
					disorder.Add(1)
				}
				last = d.Offset()
				got.Add(1)
				if err := d.Ack(); err != nil {
					t.Error(err)
				}
			})
			waitfor.Until(t, 20*time.Second, "the source subscribes", src.Connected)
			if c.single {
				publishChunks(t, o, c.n)
			} else {
				publish(t, o, 0, c.n)
			}
			waitfor.Until(t, 30*time.Second, fmt.Sprintf("%d messages read", c.n), func() bool { return got.Load() >= int64(c.n) })
			cancel()
			if err := src.Close(); err != nil {
				t.Fatal(err)
			}
			if got.Load() != int64(c.n) || disorder.Load() != 0 {
				t.Fatalf("%d messages handed over (%d out of order), want %d in order", got.Load(), disorder.Load(), c.n)
			}
		})
	}
}
