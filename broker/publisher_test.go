package broker

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hopper-sidecar/hopper/internal/testbroker"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
)

// Many publishes in flight on one channel, to three kinds of destination at
// once: a queue that takes everything, a queue that holds 50 and refuses the
// rest (publisher nack), and a queue that does not exist (basic.return).
// Each publish must get its own answer: nil exactly for the copies the
// broker holds, ErrNacked for the refused ones, ErrReturned for the
// unroutable ones, however the answers interleave on the channel.
func TestPublisherPipelinedAnswers(t *testing.T) {
	needBroker(t)
	open := declareQueue(t, 0)
	full := declareArgs(t, amqp.Table{"x-max-length": int32(50), "x-overflow": "reject-publish"})
	missing := fmt.Sprintf("bx-missing-%d", queueSeq.Add(1))

	pub := NewPublisher(PublisherOptions{Options: opts(), Channels: 1, InFlight: 64, ConfirmTimeout: 10 * time.Second})
	defer pub.Close()

	const n = 900
	dest := func(i int) string { return []string{open, full, missing}[i%3] }
	errs := publishAtOnce(pub, n, dest)

	var wantOpen, wantFull []string
	for i, err := range errs {
		id := strconv.Itoa(i)
		switch dest(i) {
		case open:
			if err != nil {
				t.Errorf("publish %s to the open queue: %v", id, err)
			}
			wantOpen = append(wantOpen, id)
		case full:
			switch {
			case err == nil:
				wantFull = append(wantFull, id)
			case !errors.Is(err, ErrNacked):
				t.Errorf("publish %s to the full queue: %v, want nil or ErrNacked", id, err)
			}
		case missing:
			if !errors.Is(err, ErrReturned) {
				t.Errorf("publish %s to a missing queue: %v, want ErrReturned", id, err)
			}
		}
	}
	if len(wantFull) != 50 {
		t.Errorf("%d publishes to the queue of 50 confirmed, want 50", len(wantFull))
	}
	for q, want := range map[string][]string{open: wantOpen, full: wantFull} {
		got := browse(t, q)
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("queue %s holds %d messages %v…, want the %d confirmed ones", q, len(got), head(got), len(want))
		}
	}
}

func head(s []string) []string { return s[:min(len(s), 5)] }

// publishAtOnce publishes n messages from n goroutines, message i (its id)
// to dest(i), and returns each publish's error. Bodies repeat across
// destinations, so only the routing key tells the copies apart.
func publishAtOnce(pub *Publisher, n int, dest func(i int) string) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := &msg.Message{MessageID: strconv.Itoa(i), Body: []byte("same body")}
			errs[i] = pub.Publish(context.Background(), dest(i), m)
		}()
	}
	wg.Wait()
	return errs
}

// declareArgs declares an empty durable queue with a name no other test
// uses and the arguments given.
func declareArgs(t *testing.T, args amqp.Table) string {
	t.Helper()
	name := fmt.Sprintf("bx%d.%s", queueSeq.Add(1), t.Name())
	conn, err := amqp.Dial(rabbit.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(name,
		true,  // durable
		false, // autoDelete
		false, // exclusive
		false, // noWait
		args); err != nil {
		t.Fatal(err)
	}
	return name
}

// A quorum queue that refused publishes (overflow=reject-publish at its
// length limit) may keep refusing the channel it refused after it has room
// again. Once the limit is lifted, a publisher that was refused must get
// its next publish through, on a fresh channel if need be.
func TestPublisherRecoversAfterQuorumRefusal(t *testing.T) {
	needBroker(t)
	q := declareTyped(t, "quorum", 0)
	policy := "refuse-" + q
	if _, err := rabbit.Ctl("set_policy", "--apply-to", "queues", policy, "^"+regexp.QuoteMeta(q)+"$",
		`{"max-length":0,"overflow":"reject-publish"}`); err != nil {
		t.Fatal(err)
	}
	pub := NewPublisher(PublisherOptions{Options: opts(), Channels: 1, ConfirmTimeout: 10 * time.Second})
	defer pub.Close()
	seq := 0
	publish := func() error {
		seq++
		return pub.Publish(context.Background(), q, &msg.Message{MessageID: strconv.Itoa(seq), Body: []byte("x")})
	}
	// The policy reaches the queue asynchronously: publish until refused.
	waitfor.Until(t, 30*time.Second, "a publish refused by the queue at its limit", func() bool {
		err := publish()
		if err != nil && !errors.Is(err, ErrNacked) {
			t.Fatalf("publish: %v, want nil or ErrNacked", err)
		}
		return err != nil
	})
	if _, err := rabbit.Ctl("clear_policy", policy); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, 60*time.Second, "a publish confirmed after the limit was lifted", func() bool {
		err := publish()
		if err != nil && !errors.Is(err, ErrNacked) {
			t.Fatalf("publish: %v, want nil or ErrNacked", err)
		}
		return err == nil
	})
}

// The broker's max_message_size counts the body alone: a copy of a message
// it took, with Hopper's headers added, fits; a body over it is refused
// with an error that says so (ErrTooLarge), on 3.x and 4.x alike.
func TestMaxMessageSizeCountsTheBody(t *testing.T) {
	const limit = 1 << 20
	b := testbroker.MustStartWith(t, testbroker.Options{Quiet: true, ExtraConfig: fmt.Sprintf("max_message_size = %d\n", limit)})
	o := Options{URLs: []string{b.URL()}, ConnectTimeout: 5 * time.Second, ReconnectMin: 50 * time.Millisecond, ReconnectMax: 200 * time.Millisecond}
	in, err := OpenInspector(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if _, err := in.s.ch.QueueDeclare("big", true, false, false, false, nil); err != nil { // durable, autoDelete, exclusive, noWait
		t.Fatal(err)
	}
	pub := NewPublisher(PublisherOptions{Options: o, Channels: 1, ConfirmTimeout: 5 * time.Second})
	defer pub.Close()
	headers := map[string]any{}
	for i := range 200 {
		headers[fmt.Sprintf("x-h%d", i)] = strings.Repeat("v", 200)
	}
	if err := pub.Publish(context.Background(), "big", &msg.Message{MessageID: "at-limit", Body: make([]byte, limit), Headers: headers}); err != nil {
		t.Fatalf("RabbitMQ %s: a body at max_message_size with 40 KB of headers refused: %v", b.Version(), err)
	}
	err = pub.Publish(context.Background(), "big", &msg.Message{MessageID: "over", Body: make([]byte, limit+1), Headers: map[string]any{}})
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "larger than configured max size") {
		t.Fatalf("RabbitMQ %s: a body one byte over max_message_size: %v, want ErrTooLarge with the broker's reason", b.Version(), err)
	}
}

// TestPublisherWaitersSurviveARetiredChannel: with room for one publish in
// flight, publishes to a queue that refuses every message (max length 0,
// reject-publish) retire the channel again and again while publishes to
// an open queue wait for its room. A retired channel is closed once its
// last publish is answered, and a publish that was waiting for room had
// written nothing there, so it goes out on a fresh channel: every publish
// to the open queue is confirmed, and every refused one is nacked.
func TestPublisherWaitersSurviveARetiredChannel(t *testing.T) {
	needBroker(t)
	open := declareQueue(t, 0)
	full := declareArgs(t, amqp.Table{"x-max-length": int32(0), "x-overflow": "reject-publish"})
	pub := NewPublisher(PublisherOptions{Options: opts(), Channels: 1, InFlight: 1, ConfirmTimeout: 10 * time.Second})
	defer pub.Close()

	errs := publishAtOnce(pub, 200, func(i int) string { return []string{open, full}[i%2] })
	var want []string
	for i, err := range errs {
		if i%2 == 0 {
			if err != nil {
				t.Errorf("publish %d to the open queue: %v", i, err)
			}
			want = append(want, strconv.Itoa(i))
		} else if !errors.Is(err, ErrNacked) {
			t.Errorf("publish %d to the refusing queue: %v, want ErrNacked", i, err)
		}
	}
	got := browse(t, open)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("open queue holds %d messages, want the %d confirmed ones", len(got), len(want))
	}
}
