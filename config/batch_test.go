package config_test

import (
	"testing"

	"github.com/hopper-sidecar/hopper/config"
)

func TestBatchDefaultsOff(t *testing.T) {
	c, err := parse(t, "queue: {name: q}\n")
	if err != nil {
		t.Fatal(err)
	}
	if c.Consumer.Batch.On() || c.Consumer.Batch.Size() != 1 || c.Consumer.Batch.MaxBytes != config.DefaultBatchMaxBytes {
		t.Fatalf("default batch %+v", c.Consumer.Batch)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestBatchValidation(t *testing.T) {
	cases := []validationCase{
		{"consumer: {batch: {maxMessages: 32, maxWait: 50ms, maxBytes: 65536}}", ""},
		{"consumer: {batch: {maxMessages: 0}}", "consumer.batch.maxMessages: must be between 1"},
		{"consumer: {batch: {maxMessages: 1001}}", "consumer.batch.maxMessages: must be between 1"},
		{"consumer: {prefetch: 10, batch: {maxMessages: 32}}", "consumer.batch.maxMessages: a batch of 32 can never fill with a prefetch of 10"},
		{"consumer: {batch: {maxMessages: 8, maxBytes: 0}}", "consumer.batch.maxBytes: must be at least 1"},
		{"consumer: {batch: {maxMessages: 8, maxWait: -1s}}", "consumer.batch.maxWait: must be between 0s and 5m"},
		{"consumer: {batch: {maxMessages: 8, maxWait: 6m}}", "consumer.batch.maxWait: must be between 0s and 5m"},
		{"consumer: {batch: {maxMessages: 8, maxWait: 5}}", "consumer.batch.maxWait"},
	}
	checkValidation(t, cases)
}

// validationCase is a config fragment laid after queue.name and what
// Validate says of it: "" when valid, else a part of the error.
type validationCase struct {
	doc  string
	want string
}

// checkValidation parses and validates each case's fragment.
func checkValidation(t *testing.T, cases []validationCase) {
	t.Helper()
	for _, c := range cases {
		cfg, err := parse(t, "queue: {name: q}\n"+c.doc+"\n")
		if err == nil {
			err = cfg.Validate()
		}
		if c.want == "" {
			if err != nil {
				t.Errorf("%s: %v", c.doc, err)
			}
			continue
		}
		mustContain(t, err, c.want)
	}
}

func TestBatchPerSubscription(t *testing.T) {
	c, err := parse(t, `
consumer: {batch: {maxMessages: 16, maxWait: 20ms}}
subscriptions:
  - queue: {name: a}
  - queue: {name: b}
    consumer: {batch: {maxMessages: 1}}
  - queue: {name: c}
    consumer: {prefetch: 8, batch: {maxMessages: 32}}
`)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Validate()
	mustContain(t, err, "subscriptions[2].consumer.batch.maxMessages: a batch of 32 can never fill with a prefetch of 8")
	subs := c.SubscriptionConfigs()
	if b := subs[0].Consumer.Batch; b.MaxMessages != 16 || b.MaxWait.D().Milliseconds() != 20 {
		t.Errorf("a inherits: %+v", b)
	}
	if b := subs[1].Consumer.Batch; b.On() || b.MaxWait.D().Milliseconds() != 20 || b.MaxBytes != config.DefaultBatchMaxBytes {
		t.Errorf("b turns batching off, keeps the rest: %+v", b)
	}
}

func TestBatchConcurrency(t *testing.T) {
	cases := []struct {
		doc               string
		prefetch, workers int
		follow            bool
	}{
		{"consumer: {ordered: true, batch: {maxMessages: 10}}", 10, 1, false},
		{"consumer: {prefetch: 256, batch: {maxMessages: 32}}", 256, 8, false},
		{"consumer: {prefetch: 256, workers: 2, batch: {maxMessages: 32}}", 256, 2, false},
		{"limiter: {enabled: false}\nconsumer: {batch: {maxMessages: 4}}", 512, 64, false},
		{"consumer: {batch: {maxMessages: 4}}", 4 * 2 * config.AutoInitial, config.AutoWorkers, true},
	}
	for _, c := range cases {
		cfg, err := parse(t, "queue: {name: q}\n"+c.doc+"\n")
		if err != nil {
			t.Fatal(err)
		}
		p, w, f := cfg.Concurrency()
		if p != c.prefetch || w != c.workers || f != c.follow {
			t.Errorf("%s: prefetch %d workers %d follow %v, want %d %d %v", c.doc, p, w, f, c.prefetch, c.workers, c.follow)
		}
	}
}
