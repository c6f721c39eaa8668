package topology_test

import (
	"strings"
	"testing"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/topology"
)

// TestWorkQueueArguments: queue.arguments and singleActiveConsumer reach
// the work queue's arguments with the broker's types (an integer as int64,
// never a float or a string), and only the work queue's: a tier or DLQ
// with x-max-length or a single active consumer would drop or stall
// Hopper's own moves.
func TestWorkQueueArguments(t *testing.T) {
	yes := true
	p := topology.FromConfig(topoConfig(t, func(c *config.Config) {
		c.Queue.Arguments = map[string]config.Argument{
			"x-max-priority":         config.IntArgument(10),
			"x-queue-leader-locator": config.StringArgument("balanced"),
			"x-custom":               config.BoolArgument(true),
		}
		c.Queue.SingleActiveConsumer = &yes
	}))
	want := map[string]any{
		"x-max-priority":           int64(10),
		"x-queue-leader-locator":   "balanced",
		"x-custom":                 true,
		"x-single-active-consumer": true,
	}
	for k, v := range want {
		if got, ok := p.Work.Args[k]; !ok || got != v {
			t.Errorf("work queue %s = %#v (%T), want %#v (%T)", k, got, got, v, v)
		}
	}
	if got := strings.Join(p.Work.Checked, ","); got != "x-custom,x-max-priority,x-queue-leader-locator,x-single-active-consumer" {
		t.Errorf("checked = %s", got)
	}
	for _, q := range append(p.Tiers, p.DLQ) {
		for k := range want {
			if _, ok := q.Args[k]; ok {
				t.Errorf("%s queue %s carries the work queue's %s", q.Role, q.Name, k)
			}
		}
	}
	if s := p.String(); !strings.Contains(s, "x-max-priority=10") || !strings.Contains(s, "x-single-active-consumer=true") {
		t.Errorf("plan text lacks the arguments:\n%s", s)
	}
}

// TestVerifiedArgumentsInPlanText: with topology.declare false the plan
// says which arguments of the operator's queue are checked.
func TestVerifiedArgumentsInPlanText(t *testing.T) {
	yes := true
	p := topology.FromConfig(topoConfig(t, func(c *config.Config) {
		c.Topology.Declare = false
		c.Queue.SingleActiveConsumer = &yes
	}))
	if s := p.String(); !strings.Contains(s, "work  orders durable=true x-queue-type=classic x-queue-version=2 x-single-active-consumer=true (checked: x-single-active-consumer)") {
		t.Errorf("plan text:\n%s", s)
	}
	if _, ok := topology.FromConfig(topoConfig(t, nil)).Work.Args["x-single-active-consumer"]; ok {
		t.Error("single active consumer set by default")
	}
}
