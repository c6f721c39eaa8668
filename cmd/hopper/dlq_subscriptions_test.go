package main

import (
	"strings"
	"testing"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/topology"
)

func TestPickSubscription(t *testing.T) {
	cfg := config.Default()
	cfg.Topology.DLQ = "{queue}.parked"
	cfg.Subscriptions = []config.Subscription{
		{Queue: config.Queue{Name: "orders"}},
		{Queue: config.Queue{Name: "invoices", Type: "quorum"}},
	}
	eff, err := pickSubscription(&cfg, "invoices", false)
	if err != nil {
		t.Fatal(err)
	}
	if plan := topology.FromConfig(&eff); plan.DLQ.Name != "invoices.parked" || eff.Queue.Type != "quorum" {
		t.Errorf("picked queue %q type %s, DLQ %q", eff.Queue.Name, eff.Queue.Type, plan.DLQ.Name)
	}
	if _, err := pickSubscription(&cfg, "", false); err == nil || !strings.Contains(err.Error(), "orders, invoices") {
		t.Errorf("no --queue among two: %v", err)
	}
	if _, err := pickSubscription(&cfg, "payments", false); err == nil || !strings.Contains(err.Error(), `"payments"`) || !strings.Contains(err.Error(), "orders, invoices") {
		t.Errorf("--queue naming no subscription: %v", err)
	}
	// --dlq names the queue itself: no choice needed.
	if got, err := pickSubscription(&cfg, "", true); err != nil || !got.Multi() {
		t.Errorf("--dlq among two: %v", err)
	}
	cfg.Subscriptions = cfg.Subscriptions[:1]
	if eff, err := pickSubscription(&cfg, "", false); err != nil || eff.Queue.Name != "orders" {
		t.Errorf("the only subscription: %q, %v", eff.Queue.Name, err)
	}
}
