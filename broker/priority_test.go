package broker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/internal/waitfor"
)

// A consumer with a Priority registers with it as x-priority, which is
// what a single-active-consumer quorum queue of RabbitMQ 4.0 or later
// chooses its active consumer by; one without registers with no
// arguments.
func TestConsumerPriorityReachesTheBroker(t *testing.T) {
	needBroker(t)
	q := declareTyped(t, "quorum", 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, prio := range []int{0, 734} {
		c := NewConsumer(ConsumerOptions{Options: opts(), Queue: q, Prefetch: 1, Priority: prio})
		go c.Run(ctx, func(*Delivery) {}) //nolint:errcheck // ends with ctx
		defer c.Close()
	}
	var lines []string
	waitfor.Until(t, 30*time.Second, "two consumers registered", func() bool {
		var ok bool
		lines, ok = consumersOf(q, "arguments")
		return ok && len(lines) == 2
	})
	var with, without int
	for _, l := range lines {
		switch {
		case strings.Contains(l, "x-priority") && strings.Contains(l, "734"):
			with++
		case !strings.Contains(l, "x-priority"):
			without++
		}
	}
	if with != 1 || without != 1 {
		t.Errorf("consumers of %s: %q; want one with x-priority 734 and one with none", q, lines)
	}
}

// consumersOf lists the consumers the broker has for queue q, a line each:
// the queue's name, then the columns asked for, tab-separated. ok is false
// when rabbitmqctl could not be asked.
func consumersOf(q string, columns ...string) (lines []string, ok bool) {
	out, err := rabbit.Ctl(append([]string{"list_consumers", "-q", "--no-table-headers", "queue_name"}, columns...)...)
	if err != nil {
		return nil, false
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, q+"\t") {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	return lines, true
}
