package broker

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
)

// A consumer shut down while most of its prefetch still sits in the client
// library's buffer (the handler is stuck on the first delivery) gives
// those deliveries back before its channel closes: a classic queue has
// them again while the connection is still open; a quorum queue gets
// copies and none of them has spent a delivery (x-delivery-count), which
// RabbitMQ 4.x limits. No message is lost or doubled: the queue holds
// every message the handler was not given.
func TestConsumerShutdownGivesBackUnhanded(t *testing.T) {
	for _, typ := range []string{"quorum", "classic"} {
		t.Run(typ, func(t *testing.T) {
			needBroker(t)
			const n = 100
			q := declareTyped(t, typ, n)
			pub := NewPublisher(PublisherOptions{Options: opts(), Channels: 1, ConfirmTimeout: 10 * time.Second})
			defer pub.Close()
			// Even message ids are ordered: a quorum queue's copies of
			// those go to the tail and are reported.
			var broken atomic.Int64
			c := NewConsumer(ConsumerOptions{Options: opts(), Queue: q, Prefetch: n, Quorum: typ == "quorum", Publisher: pub,
				Ordered: func(m *msg.Message) bool {
					i, _ := strconv.Atoi(m.MessageID)
					return i%2 == 0
				},
				OnOrderBroken: func(k int) { broken.Add(int64(k)) }})

			var (
				mu      sync.Mutex
				handed  []*Delivery
				first   = make(chan struct{})
				release = make(chan struct{})
			)
			handle := func(d *Delivery) {
				mu.Lock()
				handed = append(handed, d)
				k := len(handed)
				mu.Unlock()
				if k == 1 {
					close(first)
					<-release // the loop is busy: the rest stays in the library's buffer
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx, handle) }()
			select {
			case <-first:
			case err := <-done:
				t.Fatalf("consumer ended before its first delivery: %v", err)
			case <-time.After(30 * time.Second):
				t.Fatal("no delivery within 30s")
			}
			// The whole prefetch has left the queue for the consumer.
			waitfor.Until(t, 30*time.Second, "every message delivered to the consumer", func() bool {
				ready, unacked, err := rabbit.QueueCounts(q)
				return err == nil && ready == 0 && unacked == n
			})
			cancel()
			close(release)
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("run: %v", err)
				}
			case <-time.After(60 * time.Second):
				t.Fatal("consumer did not stop within 60s")
			}
			// What the handler got is the app's: settled as done.
			mu.Lock()
			var gone []string
			for _, d := range handed {
				gone = append(gone, d.Message().MessageID)
				if err := d.Ack(); err != nil {
					t.Fatalf("ack handed delivery: %v", err)
				}
			}
			mu.Unlock()
			if len(gone) >= n/2 {
				t.Fatalf("the handler was given %d of %d deliveries; the test needs most still unhanded", len(gone), n)
			}
			// Given back while the connection is still open, not by its close.
			waitfor.Until(t, 30*time.Second, "the unhanded deliveries back in the queue before the channel closes", func() bool {
				ready, unacked, err := rabbit.QueueCounts(q)
				return err == nil && ready == n-len(gone) && unacked == 0
			})
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}

			in, err := OpenInspector(context.Background(), opts())
			if err != nil {
				t.Fatal(err)
			}
			defer in.Close()
			var got []string
			for {
				d, ok, err := in.Get(q)
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					break
				}
				m := d.Message()
				got = append(got, m.MessageID)
				if dc, ok := m.Int(msg.HeaderDeliveryCount); ok && dc > 0 {
					t.Errorf("message %s carries %s=%d: its return was counted against the delivery limit", m.MessageID, msg.HeaderDeliveryCount, dc)
				}
			}
			var want []string
			for i := range n {
				if id := strconv.Itoa(i); !slices.Contains(gone, id) {
					want = append(want, id)
				}
			}
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("queue holds %d messages, want the %d never handed over (each once)", len(got), len(want))
			}
			wantBroken := 0
			if typ == "quorum" {
				for _, id := range want {
					if i, _ := strconv.Atoi(id); i%2 == 0 {
						wantBroken++
					}
				}
			}
			if got := broken.Load(); got != int64(wantBroken) {
				t.Errorf("%d copies reported as out of order, want %d (the ordered ones republished to the tail)", got, wantBroken)
			}
		})
	}
}
