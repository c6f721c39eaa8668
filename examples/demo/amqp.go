package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hopper-sidecar/hopper/internal/testbroker"
)

// This file plays the parts around Hopper that are not Hopper: a producer
// publishing orders, and an operator looking into the DLQ. It speaks AMQP
// directly so that the demo checks Hopper from the outside.

// confirmTimeout bounds the wait for one publisher confirm.
const confirmTimeout = 10 * time.Second

// publish sends every message to the default exchange with routing key
// queue, persistent and mandatory, and waits for each confirm. A message
// the broker returns (no such queue) or nacks is an error: the demo's
// accounting would be wrong from the start.
func publish(ctx context.Context, url, queue string, msgs []demoMessage) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return fmt.Errorf("publisher: dial: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("publisher: open channel: %w", err)
	}
	defer ch.Close()
	if err := ch.Confirm(false /* noWait */); err != nil {
		return fmt.Errorf("publisher: confirm mode: %w", err)
	}
	// Buffered for every message: the library blocks its reader goroutine
	// on an unbuffered notification channel nobody drains.
	returns := ch.NotifyReturn(make(chan amqp.Return, len(msgs)))

	for _, m := range msgs {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue,
			true,  // mandatory: a missing queue comes back instead of vanishing
			false, // immediate
			amqp.Publishing{
				DeliveryMode: amqp.Persistent,
				ContentType:  "application/json",
				MessageId:    m.ID,
				Timestamp:    time.Now(),
				Type:         "demo.order",
				Headers:      amqp.Table{"demo-script": m.Script},
				Body:         []byte(fmt.Sprintf(`{"order":%q}`, m.ID)),
			})
		if err != nil {
			return fmt.Errorf("publish %s: %w", m.ID, err)
		}
		wctx, cancel := context.WithTimeout(ctx, confirmTimeout)
		acked, err := dc.WaitContext(wctx)
		cancel()
		if err != nil {
			return fmt.Errorf("publish %s: wait for confirm: %w", m.ID, err)
		}
		if !acked {
			return fmt.Errorf("publish %s: broker nacked it", m.ID)
		}
		// The broker sends basic.return before the confirm, and the
		// library queues it before it processes the confirm, so a
		// non-blocking look is enough.
		select {
		case r := <-returns:
			return fmt.Errorf("publish %s: returned by the broker: %d %s", r.MessageId, r.ReplyCode, r.ReplyText)
		default:
		}
		logf("published %-12s demo-script=%q (confirmed)", m.ID, m.Script)
	}
	return nil
}

// dlqEntry is what the DLQ holds for one message.
type dlqEntry struct {
	ID                 string
	Reason             string
	FinalStatus        int64
	FinalRetries       int64
	FinalError         string
	OriginalQueue      string
	OriginalRoutingKey string
	// Stream and StreamOffset say where a message read from a stream came
	// from; "" and -1 for one from a queue.
	Stream       string
	StreamOffset int64
}

// peekDLQ reads every message in queue with basic.get and puts them all
// back with one nack (requeue, multiple), so the DLQ is left as it was:
// peeking must never consume what an operator still has to recover.
// Messages are only settled after all are read, else a requeued message
// would be fetched again.
func peekDLQ(url, queue string, limit int) ([]dlqEntry, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, fmt.Errorf("peek %s: dial: %w", queue, err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("peek %s: open channel: %w", queue, err)
	}
	defer ch.Close()

	var (
		entries []dlqEntry
		lastTag uint64
	)
	for len(entries) < limit {
		d, ok, err := ch.Get(queue, false /* autoAck */)
		if err != nil {
			return nil, fmt.Errorf("peek %s: basic.get: %w", queue, err)
		}
		if !ok {
			break
		}
		lastTag = d.DeliveryTag
		entries = append(entries, dlqEntry{
			ID:                 d.MessageId,
			Reason:             str(d.Headers["x-dead-letter-reason"]),
			FinalStatus:        num(d.Headers["x-final-status-code"]),
			FinalRetries:       num(d.Headers["x-final-retry-count"]),
			FinalError:         str(d.Headers["x-final-error"]),
			OriginalQueue:      str(d.Headers["x-original-queue"]),
			OriginalRoutingKey: str(d.Headers["x-original-routing-key"]),
			Stream:             str(d.Headers["x-stream"]),
			StreamOffset:       streamOffset(d.Headers["x-stream-offset"]),
		})
	}
	if lastTag > 0 {
		if err := ch.Nack(lastTag, true /* multiple */, true /* requeue */); err != nil {
			return entries, fmt.Errorf("peek %s: nack-requeue: %w", queue, err)
		}
	}
	// Close explicitly: a nack is asynchronous, and closing the channel
	// (which waits for the broker's close-ok) makes sure it was processed
	// before the caller counts the queue again.
	if err := ch.Close(); err != nil {
		return entries, fmt.Errorf("peek %s: close channel: %w", queue, err)
	}
	return entries, nil
}

func str(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case []byte:
		return string(x)
	case nil:
		return ""
	}
	return fmt.Sprint(v)
}

// num reads an integer header in whatever width the writer chose; -1 when
// it is missing or not a number, so a missing header never reads as 0.
func num(v any) int64 {
	switch x := v.(type) {
	case int8:
		return int64(x)
	case int16:
		return int64(x)
	case int32:
		return int64(x)
	case int64:
		return x
	case int:
		return int64(x)
	case uint8:
		return int64(x)
	case uint16:
		return int64(x)
	case uint32:
		return int64(x)
	case string:
		if n, err := strconv.ParseInt(x, 10, 64); err == nil {
			return n
		}
	}
	return -1
}

// queueDepth is a queue's ready and unacknowledged message counts.
type queueDepth struct {
	Name           string
	Ready, Unacked int
}

// Total counts a message delivered but not yet settled too: it is still
// in the queue as far as loss is concerned.
func (q queueDepth) Total() int { return q.Ready + q.Unacked }

// listQueues returns every queue whose name starts with prefix, sorted by
// name, in one rabbitmqctl call (each call boots an Erlang VM, about half a
// second, so the demo does not ask once per queue).
func listQueues(b *testbroker.Broker, prefix string) ([]queueDepth, error) {
	out, err := b.Ctl("list_queues", "-q", "--no-table-headers", "-p", "/",
		"name", "messages_ready", "messages_unacknowledged")
	if err != nil {
		return nil, fmt.Errorf("list queues: %w", err)
	}
	var qs []queueDepth
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(strings.TrimRight(line, "\r"), "\t")
		if len(f) < 3 {
			continue
		}
		name := strings.Join(f[:len(f)-2], "\t")
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		ready, err1 := strconv.Atoi(strings.TrimSpace(f[len(f)-2]))
		unacked, err2 := strconv.Atoi(strings.TrimSpace(f[len(f)-1]))
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("list queues: line %q: %w", line, err)
		}
		qs = append(qs, queueDepth{Name: name, Ready: ready, Unacked: unacked})
	}
	sort.Slice(qs, func(i, j int) bool { return qs[i].Name < qs[j].Name })
	return qs, nil
}

// streamOffset reads x-stream-offset, -1 when there is none.
func streamOffset(v any) int64 {
	if v == nil {
		return -1
	}
	return num(v)
}
