package main

import (
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// floorLoop moves n messages from src to dst the cheapest way the broker
// offers while still never acking before the copy is confirmed: one
// consumer (prefetch 2 × parallel), one confirm channel with parallel
// publishes in flight, and one multiple-ack per parallel/4 confirmed
// messages. Confirms on a channel come in publish order and the loop
// publishes in delivery order, so every delivery up to the newest
// confirmed one is confirmed. It has no filters, no header rewriting, no
// exclusive ownership and no accounting, so its rate is close to what the
// broker itself allows on this machine: a replay near it has little left to
// win on the client side. (The replay, publishing from many goroutines, can
// come out a little above it in a run.)
func floorLoop(url, src, dst string, n, parallel int) (rawResult, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return rawResult{}, fmt.Errorf("floor loop: %w", err)
	}
	defer conn.Close()
	in, err := conn.Channel()
	if err != nil {
		return rawResult{}, fmt.Errorf("floor loop: %w", err)
	}
	if err := in.Qos(2*parallel, 0, false); err != nil { // prefetchSize=0, global=false
		return rawResult{}, fmt.Errorf("floor loop: %w", err)
	}
	out, err := conn.Channel()
	if err != nil {
		return rawResult{}, fmt.Errorf("floor loop: %w", err)
	}
	if err := out.Confirm(false); err != nil { // noWait=false
		return rawResult{}, fmt.Errorf("floor loop: %w", err)
	}
	confirms := out.NotifyPublish(make(chan amqp.Confirmation, parallel+1))
	deliveries, err := in.Consume(src, "", false, false, false, false, nil) // autoAck, exclusive, noLocal, noWait
	if err != nil {
		return rawResult{}, fmt.Errorf("floor loop: %w", err)
	}

	start := time.Now()
	// tags[i] is the delivery tag of publish i+1.
	tags := make([]uint64, 0, n)
	var confirmed, acked uint64 // publishes confirmed, and acked for, so far
	batch := uint64(max(1, parallel/4))
	settle := func(c amqp.Confirmation) error {
		if !c.Ack {
			return fmt.Errorf("floor loop: publish %d refused", c.DeliveryTag)
		}
		confirmed = max(confirmed, c.DeliveryTag)
		if confirmed-acked >= batch || confirmed == uint64(n) {
			if err := in.Ack(tags[confirmed-1], true); err != nil { // multiple=true
				return fmt.Errorf("floor loop: %w", err)
			}
			acked = confirmed
		}
		return nil
	}
	for len(tags) < n {
		for uint64(len(tags))-confirmed >= uint64(parallel) {
			if err := settle(<-confirms); err != nil {
				return rawResult{}, err
			}
		}
		d, ok := <-deliveries
		if !ok {
			return rawResult{}, fmt.Errorf("floor loop: consumer closed after %d messages", len(tags))
		}
		p := amqp.Publishing{Headers: d.Headers, ContentType: d.ContentType, DeliveryMode: amqp.Persistent, MessageId: d.MessageId, Timestamp: d.Timestamp, Body: d.Body}
		if err := out.Publish("", dst, false, false, p); err != nil { // mandatory, immediate
			return rawResult{}, fmt.Errorf("floor loop: %w", err)
		}
		tags = append(tags, d.DeliveryTag)
	}
	for acked < uint64(n) {
		if err := settle(<-confirms); err != nil {
			return rawResult{}, err
		}
	}
	el := time.Since(start)
	return rawResult{rate: float64(n) / el.Seconds(), elapsed: el}, nil
}
