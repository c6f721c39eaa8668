package config_test

import (
	"strings"
	"testing"

	"github.com/hopper-sidecar/hopper/config"
)

// TestQueueArgumentsParse reads queue.arguments from YAML: integers become
// 64-bit integers, strings and booleans stay as they are, and a value of
// another kind is refused with its key path.
func TestQueueArgumentsParse(t *testing.T) {
	c, err := parse(t, "queue:\n  name: orders\n  singleActiveConsumer: true\n  arguments:\n    x-max-priority: 10\n    x-overflow: reject-publish\n    x-custom-flag: true\n")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Queue.Arguments["x-max-priority"].Value(); got != int64(10) {
		t.Errorf("x-max-priority = %#v, want int64(10)", got)
	}
	if got := c.Queue.Arguments["x-overflow"].Value(); got != "reject-publish" {
		t.Errorf("x-overflow = %#v, want the string", got)
	}
	if got := c.Queue.Arguments["x-custom-flag"].Value(); got != true {
		t.Errorf("x-custom-flag = %#v, want true", got)
	}
	if !c.Queue.SAC() {
		t.Error("singleActiveConsumer not read")
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("valid arguments refused: %v", err)
	}

	_, err = parse(t, "queue:\n  name: orders\n  arguments:\n    x-max-priority: [1, 2]\n    x-max-length: 1.5\n")
	mustContain(t, err, "queue.arguments.x-max-priority: must be a string, an integer or true/false",
		"queue.arguments.x-max-length: must be a string, an integer or true/false")
}

func TestQueueArgumentsValidate(t *testing.T) {
	arg := func(k string, a config.Argument) func(*config.Config) {
		return func(c *config.Config) { c.Queue.Arguments = map[string]config.Argument{k: a} }
	}
	quorum := func(k string, a config.Argument) func(*config.Config) {
		return func(c *config.Config) { arg(k, a)(c); c.Queue.Type = "quorum" }
	}
	cases := []struct {
		name string
		mod  func(*config.Config)
		want string // "" = valid
	}{
		{"priority", arg("x-max-priority", config.IntArgument(10)), ""},
		{"priority 0", arg("x-max-priority", config.IntArgument(0)), "queue.arguments.x-max-priority: must be an integer 1..255, got 0"},
		{"priority 256", arg("x-max-priority", config.IntArgument(256)), "queue.arguments.x-max-priority: must be an integer 1..255"},
		{"priority as a string", arg("x-max-priority", config.StringArgument("10")), `queue.arguments.x-max-priority: must be an integer 1..255, got the string "10"`},
		{"priority on quorum", quorum("x-max-priority", config.IntArgument(10)), "queue.arguments.x-max-priority: quorum queues do not support priorities"},
		{"leader locator", arg("x-queue-leader-locator", config.StringArgument("balanced")), ""},
		{"bad leader locator", arg("x-queue-leader-locator", config.StringArgument("random")), "queue.arguments.x-queue-leader-locator: must be one of client-local, balanced"},
		{"max length", arg("x-max-length", config.IntArgument(0)), ""},
		{"negative max length", arg("x-max-length", config.IntArgument(-1)), "queue.arguments.x-max-length: must be an integer 0.."},
		{"max length bytes as bool", arg("x-max-length-bytes", config.BoolArgument(true)), "queue.arguments.x-max-length-bytes: must be an integer"},
		{"overflow", arg("x-overflow", config.StringArgument("reject-publish-dlx")), ""},
		{"bad overflow", arg("x-overflow", config.StringArgument("drop-tail")), "queue.arguments.x-overflow: must be one of drop-head, reject-publish, reject-publish-dlx"},
		{"drop-head on quorum", quorum("x-overflow", config.StringArgument("drop-head")), "queue.arguments.x-overflow: a quorum work queue dead-letters at-least-once"},
		{"ttl", arg("x-message-ttl", config.IntArgument(60000)), ""},
		{"ttl too long", arg("x-message-ttl", config.IntArgument(1<<32)), "queue.arguments.x-message-ttl: must be an integer 0..2147483647"},
		{"lazy", arg("x-queue-mode", config.StringArgument("lazy")), ""},
		{"lazy on quorum", quorum("x-queue-mode", config.StringArgument("lazy")), "queue.arguments.x-queue-mode: applies to classic queues only"},
		{"queue version 3", arg("x-queue-version", config.IntArgument(3)), "queue.arguments.x-queue-version: must be an integer 1..2"},
		{"max age", arg("x-max-age", config.StringArgument("1D")), "queue.arguments.x-max-age: applies to streams only"},
		{"other x- key", arg("x-anything", config.StringArgument("as is")), ""},
		{"not x-", arg("max-priority", config.IntArgument(5)), `queue.arguments.max-priority: queue arguments start with x-`},
		{"queue type", arg("x-queue-type", config.StringArgument("quorum")), "queue.arguments.x-queue-type: is set by Hopper: set queue.type instead"},
		{"dead letter", arg("x-dead-letter-exchange", config.StringArgument("dlx")), "queue.arguments.x-dead-letter-exchange: is set by Hopper: Hopper dead-letters the work queue to its DLQ itself: set topology.dlq instead"},
		{"delivery limit", arg("x-delivery-limit", config.IntArgument(5)), "queue.arguments.x-delivery-limit: is set by Hopper: set queue.deliveryLimit instead"},
		{"sac", arg("x-single-active-consumer", config.BoolArgument(true)), "queue.arguments.x-single-active-consumer: is set by Hopper: set queue.singleActiveConsumer instead"},
		{"expires", arg("x-expires", config.IntArgument(1000)), "queue.arguments.x-expires: is set by Hopper"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.mod(&c)
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				return
			}
			mustContain(t, err, tc.want)
		})
	}
}

// TestQueueArgumentsInSubscriptions: a subscription's arguments replace the
// top-level map, singleActiveConsumer is inherited unless the subscription
// says otherwise, and a bad value is reported under the subscription.
func TestQueueArgumentsInSubscriptions(t *testing.T) {
	c, err := parse(t, `queue:
  singleActiveConsumer: true
  arguments: {x-max-priority: 5}
subscriptions:
  - queue: {name: a}
  - queue: {name: b, singleActiveConsumer: false, arguments: {x-max-length: 100}}
  - queue: {name: c, type: quorum, arguments: {x-max-priority: 3}}
`)
	if err != nil {
		t.Fatal(err)
	}
	effs := c.SubscriptionConfigs()
	if !effs[0].Queue.SAC() || effs[0].Queue.Arguments["x-max-priority"].Value() != int64(5) {
		t.Errorf("subscription a did not inherit: %+v", effs[0].Queue)
	}
	if effs[1].Queue.SAC() {
		t.Error("subscription b turned single active consumer off, but it is on")
	}
	if _, ok := effs[1].Queue.Arguments["x-max-priority"]; ok || effs[1].Queue.Arguments["x-max-length"].Value() != int64(100) {
		t.Errorf("subscription b's arguments should replace the top-level ones: %v", effs[1].Queue.Arguments)
	}
	err = c.Validate()
	mustContain(t, err, "subscriptions[2].queue.arguments.x-max-priority: quorum queues do not support priorities")
	if strings.Count(errText(err), "x-max-priority") != 1 {
		t.Errorf("want one x-max-priority problem, got:\n%v", err)
	}
}

func TestQueueArgumentsFromEnv(t *testing.T) {
	c, _, err := config.Load("", []string{"HOPPER_QUEUE_NAME=orders", "HOPPER_QUEUE_ARGUMENTS=x-max-priority=9,x-overflow=reject-publish",
		"HOPPER_QUEUE_SINGLE_ACTIVE_CONSUMER=true"})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Queue.Arguments["x-max-priority"].Value(); got != int64(9) {
		t.Errorf("x-max-priority = %#v, want int64(9)", got)
	}
	if got := c.Queue.Arguments["x-overflow"].Value(); got != "reject-publish" {
		t.Errorf("x-overflow = %#v", got)
	}
	if !c.Queue.SAC() {
		t.Error("HOPPER_QUEUE_SINGLE_ACTIVE_CONSUMER not applied")
	}
}
