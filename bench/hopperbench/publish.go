package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// body is a message body of n printable bytes.
func body(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'a' + byte(i%26)
	}
	return b
}

// publishBacklog publishes n persistent messages to queue with publisher
// confirms, keeping up to window publishes unconfirmed, and returns once
// every one is confirmed.
func publishBacklog(ctx context.Context, url, queue, prefix string, n, size int) (time.Duration, error) {
	return publishBacklogTo(ctx, url, "", func(int) string { return queue }, prefix, n, size, 0)
}

// publishKeyedBacklog is publishBacklog with, when keys is above 0, an
// ordering key in header keyHeader: message i has key i mod keys, so every
// key's messages are spread evenly through the backlog.
func publishKeyedBacklog(ctx context.Context, url, queue, prefix string, n, size, keys int) (time.Duration, error) {
	return publishBacklogTo(ctx, url, "", func(int) string { return queue }, prefix, n, size, keys)
}

// publishBacklogTo is publishKeyedBacklog through exchange, message i with
// routing key key(i).
func publishBacklogTo(ctx context.Context, url, exchange string, key func(i int) string, prefix string, n, size, keys int) (time.Duration, error) {
	b := body(size)
	return publishEach(ctx, url, exchange, key, n, func(i int) amqp.Publishing {
		return amqp.Publishing{
			ContentType:  "application/octet-stream",
			DeliveryMode: amqp.Persistent,
			MessageId:    prefix + strconv.Itoa(i),
			Headers:      keyHeaders(i, keys),
			Body:         b,
		}
	})
}

// publishEach publishes message(i) for i < n through exchange with routing
// key key(i), with publisher confirms, keeping up to window publishes
// unconfirmed, and returns once every one is confirmed.
func publishEach(ctx context.Context, url, exchange string, key func(i int) string, n int, message func(i int) amqp.Publishing) (time.Duration, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return 0, fmt.Errorf("publisher dial: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("publisher channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil { // noWait=false
		return 0, fmt.Errorf("confirm mode: %w", err)
	}
	const window = 1000
	pending := make([]*amqp.DeferredConfirmation, 0, 2*window)
	wait := func(dcs []*amqp.DeferredConfirmation) error {
		for _, dc := range dcs {
			ok, err := dc.WaitContext(ctx)
			if err != nil {
				return err
			}
			if !ok {
				return errors.New("broker nacked a backlog message")
			}
		}
		return nil
	}
	start := time.Now()
	for i := range n {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key(i),
			false, // mandatory
			false, // immediate
			message(i))
		if err != nil {
			return 0, fmt.Errorf("publish: %w", err)
		}
		pending = append(pending, dc)
		if len(pending) >= 2*window {
			if err := wait(pending[:window]); err != nil {
				return 0, err
			}
			pending = append(pending[:0], pending[window:]...)
		}
	}
	if err := wait(pending); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// publishPaced publishes messages carrying their send time (sentHeader,
// Unix ns) at a fixed rate for dur, on a schedule that does not drift, and
// returns how many it published. Message ids are idPrefix + a sequence.
func publishPaced(ctx context.Context, ch *amqp.Channel, queue, idPrefix string, rate int, dur time.Duration, size int, mode uint8) (int, error) {
	interval := time.Second / time.Duration(rate)
	n := int(dur / interval)
	b := body(size)
	start := time.Now()
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		err := ch.PublishWithContext(ctx, "", queue,
			false, // mandatory
			false, // immediate
			amqp.Publishing{
				Headers:      amqp.Table{sentHeader: time.Now().UnixNano()},
				ContentType:  "application/octet-stream",
				DeliveryMode: mode,
				MessageId:    idPrefix + strconv.Itoa(i),
				Body:         b,
			})
		if err != nil {
			return i, fmt.Errorf("publish: %w", err)
		}
	}
	return n, nil
}

// publishPairs publishes, at a fixed rate for dur, one message to each of
// two queues per tick (the order alternating from tick to tick), so both
// clients see the same moments of the machine. The ids are prefixes[i] +
// the tick number, which pairs the two samples of a tick.
func publishPairs(ctx context.Context, ch *amqp.Channel, queues, prefixes [2]string, rate int, dur time.Duration, size int, mode uint8) (int, error) {
	interval := time.Second / time.Duration(rate)
	n := int(dur / interval)
	b := body(size)
	start := time.Now()
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		for k := range 2 {
			c := (i + k) % 2
			err := ch.PublishWithContext(ctx, "", queues[c],
				false, // mandatory
				false, // immediate
				amqp.Publishing{
					Headers:      amqp.Table{sentHeader: time.Now().UnixNano()},
					ContentType:  "application/octet-stream",
					DeliveryMode: mode,
					MessageId:    prefixes[c] + strconv.Itoa(i),
					Body:         b,
				})
			if err != nil {
				return i, fmt.Errorf("publish: %w", err)
			}
		}
	}
	return n, nil
}

// keyHeader is the application header the keyed path's messages carry
// their ordering key in.
const keyHeader = "k"

// keyHeaders are the headers of backlog message i of a backlog spread
// over keys keys; nil when keys is 0.
func keyHeaders(i, keys int) amqp.Table {
	if keys <= 0 {
		return nil
	}
	return amqp.Table{keyHeader: strconv.Itoa(i % keys)}
}
