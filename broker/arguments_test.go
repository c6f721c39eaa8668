package broker

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/topology"
)

func TestInequivalentArg(t *testing.T) {
	for _, tc := range []struct {
		reason string
		key    string
		want   any
		ok     bool
	}{
		{"PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-exchange' for queue 'e1' in vhost '/': received none but current is the value '' of type 'longstr'", "x-dead-letter-exchange", "", true},
		{"PRECONDITION_FAILED - inequivalent arg 'x-max-priority' for queue 'e1' in vhost '/': received none but current is the value '10' of type 'long'", "x-max-priority", int64(10), true},
		{"PRECONDITION_FAILED - inequivalent arg 'x-queue-version' for queue 'e1' in vhost '/': received the value '2' of type 'signedint' but current is none", "x-queue-version", nil, true},
		{"PRECONDITION_FAILED - inequivalent arg 'x-single-active-consumer' for queue 'e1' in vhost '/': received 'false' but current is 'true'", "x-single-active-consumer", true, true},
		{"PRECONDITION_FAILED - inequivalent arg 'x-max-priority' for queue 'args-1.operator' in vhost '/': received '5' but current is '10'", "x-max-priority", int64(10), true},
		{"PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue 'e4' in vhost '/': \"expected integer, got longstr\"", "", nil, false},
	} {
		key, v, ok := inequivalentArg(tc.reason)
		if key != tc.key || v != tc.want || ok != tc.ok {
			t.Errorf("%s:\n got %q %#v %t, want %q %#v %t", tc.reason, key, v, ok, tc.key, tc.want, tc.ok)
		}
	}
}

// workPlan is the plan of a config with queue name q.
func workPlan(t *testing.T, q string, declare bool, mod func(*config.Config)) *topology.Plan {
	t.Helper()
	c := config.Default()
	c.Queue.Name = q
	c.Topology.Declare = declare
	c.Retry.Tiers = []config.Duration{config.Duration(time.Second)}
	if mod != nil {
		mod(&c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	p := topology.FromConfig(&c)
	return &p
}

// TestWorkQueueArgumentsDeclaredAndVerified declares a work queue with
// queue.arguments and a single active consumer on the real broker, then
// verifies operator-declared queues: one that matches (with a dead-letter
// exchange and a length limit of the operator's own, which the config does
// not speak of), and ones that differ in either direction, which are
// refused naming the argument and what to do.
func TestWorkQueueArgumentsDeclaredAndVerified(t *testing.T) {
	needBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	yes, no := true, false
	sac := func(v *bool) func(*config.Config) {
		return func(c *config.Config) {
			c.Queue.SingleActiveConsumer = v
			c.Queue.Arguments = map[string]config.Argument{"x-max-priority": config.IntArgument(10)}
		}
	}
	base := "args-" + strconv.FormatInt(queueSeq.Add(1), 10)

	// Declared by Hopper: the arguments reach the broker with the types it
	// takes (it refuses an x-max-priority that is not an integer), and a
	// second declare, as on every reconnect, is accepted.
	owned := workPlan(t, base+".owned", true, sac(&yes))
	for range 2 {
		if err := Apply(ctx, opts(), owned, true); err != nil {
			t.Fatalf("declare: %v", err)
		}
	}
	// The same queue verified with the config that declared it passes.
	if err := Apply(ctx, opts(), workPlan(t, base+".owned", false, sac(&yes)), false); err != nil {
		t.Fatalf("verify the declared queue: %v", err)
	}
	// Turning single active consumer off on a declared queue: both modes
	// refuse, naming the key and the way out.
	for _, declare := range []bool{true, false} {
		err := Apply(ctx, opts(), workPlan(t, base+".owned", declare, sac(&no)), declare)
		if !errors.Is(err, ErrTopology) {
			t.Fatalf("declare=%t with singleActiveConsumer off: want a topology mismatch, got %v", declare, err)
		}
		for _, want := range []string{"x-single-active-consumer=true", "queue.singleActiveConsumer", "cannot change once it exists", "new queue"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("declare=%t: error lacks %q: %v", declare, want, err)
			}
		}
	}

	// An operator's queue with arguments of its own besides the checked ones.
	opQueue := base + ".operator"
	conn, err := amqp.Dial(rabbit.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(opQueue, true, false, false, false, amqp.Table{ // durable, autoDelete, exclusive, noWait
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": opQueue + ".dlq",
		"x-max-length": int64(1000), "x-max-priority": int64(10), "x-single-active-consumer": true,
	}); err != nil {
		t.Fatal(err)
	}
	// Hopper's own tiers and DLQ exist, as after a first run.
	declareOwned(t, conn, workPlan(t, opQueue, false, sac(&yes)))
	if err := Apply(ctx, opts(), workPlan(t, opQueue, false, sac(&yes)), false); err != nil {
		t.Fatalf("verify a matching operator queue: %v", err)
	}
	for name, mod := range map[string]func(*config.Config){
		"sac off": sac(nil),
		"priority 5": func(c *config.Config) {
			sac(&yes)(c)
			c.Queue.Arguments["x-max-priority"] = config.IntArgument(5)
		},
		"overflow": func(c *config.Config) {
			sac(&yes)(c)
			c.Queue.Arguments["x-overflow"] = config.StringArgument("reject-publish")
		},
	} {
		err := Apply(ctx, opts(), workPlan(t, opQueue, false, mod), false)
		if !errors.Is(err, ErrTopology) || !strings.Contains(err.Error(), "cannot change once it exists") {
			t.Errorf("%s: want a mismatch saying what to do, got %v", name, err)
		}
	}
	// An argument the config does not speak of is the operator's.
	if err := Apply(ctx, opts(), workPlan(t, opQueue, false, func(c *config.Config) { c.Queue.SingleActiveConsumer = &yes }), false); err != nil {
		t.Errorf("verify without asking for x-max-priority: %v", err)
	}
	// A config that asks for nothing accepts an operator's queue with
	// arguments of its own, as before.
	plain := base + ".plain"
	if _, err := ch.QueueDeclare(plain, true, false, false, false, amqp.Table{"x-max-length": int64(5)}); err != nil { // durable, autoDelete, exclusive, noWait
		t.Fatal(err)
	}
	p := workPlan(t, plain, false, nil)
	declareOwned(t, conn, p)
	if err := Apply(ctx, opts(), p, false); err != nil {
		t.Fatalf("verify a queue with the operator's own arguments: %v", err)
	}
	// ... and refuses it when the config asks for a single active consumer
	// the queue does not have.
	err = Apply(ctx, opts(), workPlan(t, plain, false, func(c *config.Config) { c.Queue.SingleActiveConsumer = &yes }), false)
	if !errors.Is(err, ErrTopology) || !strings.Contains(err.Error(), "x-single-active-consumer=none, the config asks for true") {
		t.Errorf("single active consumer asked of a queue without it: got %v", err)
	}
}

// declareOwned declares the plan's tiers and DLQ, leaving the work queue
// to the test.
func declareOwned(t *testing.T, conn *amqp.Connection, p *topology.Plan) {
	t.Helper()
	for _, q := range append(p.Tiers, p.DLQ) {
		if err := declare(conn, q); err != nil {
			t.Fatal(err)
		}
	}
}

// Arguments one supported release refuses and another accepts: on RabbitMQ
// 4.x the declaration fails with the broker's own reason, never as a queue
// that "exists with other arguments" (it does not exist); 3.x declares it.
func TestArgumentsRefusedByTheBrokerNamed(t *testing.T) {
	needBroker(t)
	q := "args-refused-" + strconv.FormatInt(queueSeq.Add(1), 10)
	p := workPlan(t, q, true, func(c *config.Config) {
		c.Queue.Arguments = map[string]config.Argument{"x-queue-version": config.IntArgument(1)}
	})
	if w := strings.Join(p.Warnings(), "\n"); !strings.Contains(w, "x-queue-version=1: RabbitMQ 4.x refuses it") {
		t.Errorf("plan warnings do not say 4.x refuses x-queue-version 1:\n%s", w)
	}
	err := Apply(context.Background(), opts(), p, true)
	if rabbit.Series() < 4 {
		if err != nil {
			t.Fatalf("RabbitMQ %s refused x-queue-version 1: %v", rabbit.Version(), err)
		}
		return
	}
	if err == nil {
		t.Fatalf("RabbitMQ %s declared a version 1 classic queue", rabbit.Version())
	}
	msg := err.Error()
	if !strings.Contains(msg, "the broker refused to declare work queue") || !strings.Contains(msg, "unsupported queue version '1'") ||
		strings.Contains(msg, "exists with other arguments") {
		t.Errorf("error does not pass on the broker's reason, or claims the queue exists:\n%s", msg)
	}
	if !errors.Is(err, ErrTopology) {
		t.Errorf("error is not ErrTopology: %v", err)
	}
}
