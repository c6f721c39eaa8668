package streamsrc

import (
	"strconv"
	"testing"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
)

// BenchmarkHandOver is what the source does for each message the stream
// client hands it, up to the delivery loop and back: the offset read,
// the message converted, the budget taken, the delivery handed over, and
// its ack (the offset settled, the budget given back). The message is one
// of the benchmark's backlog (hopperbench --paths stream): an id, a
// content type and 256 bytes.
//
//	go test -run '^$' -bench HandOver -benchmem -count 10 ./streamsrc/
func BenchmarkHandOver(b *testing.B) {
	s := New(Options{Stream: "orders", Consumer: "bench", Prefetch: 200})
	p := s.parts[0]
	s.handle = func(d *Delivery) {
		if err := d.Ack(); err != nil {
			b.Fatal(err)
		}
	}
	body := make([]byte, 256)
	msgs := make([]*amqp.Message, 1024)
	for i := range msgs {
		msgs[i] = &amqp.Message{Data: [][]byte{body},
			Properties: &amqp.MessageProperties{MessageID: "m-" + strconv.Itoa(i), ContentType: "application/octet-stream"}}
	}
	b.ReportAllocs()
	off := int64(0)
	for b.Loop() {
		s.onMessage(0, p, off, msgs[off%int64(len(msgs))])
		off++
	}
	if n, _ := s.Held(); n != 0 {
		b.Fatalf("%d deliveries held after every one was acked", n)
	}
}
