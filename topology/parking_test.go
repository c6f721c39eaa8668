package topology_test

import (
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/topology"
)

func TestParkingQueues(t *testing.T) {
	c := config.Default()
	c.Queue.Name = "orders"
	if p := topology.FromConfig(&c); len(p.Parking) != 0 {
		t.Fatalf("scheduling off, yet parking queues %v", p.Parking)
	}
	c.Schedule.Enabled = true
	c.Schedule.MaxDelay = config.Duration(time.Hour)
	p := topology.FromConfig(&c)
	if len(p.Parking) != 12 {
		t.Fatalf("%d parking queues for 1s … 1h, want 12 (1s … 2048s)", len(p.Parking))
	}
	var names []string
	for _, q := range p.Parking {
		names = append(names, q.Name)
		if q.Args["x-queue-type"] != "quorum" || q.Args["x-dead-letter-routing-key"] != "orders" ||
			q.Args["x-message-ttl"] != int32(q.Delay/time.Millisecond) || q.Args["x-dead-letter-strategy"] != "at-least-once" || !q.Unbounded {
			t.Fatalf("parking queue %s: %v", q.Name, q.Args)
		}
	}
	if names[0] != "orders.park.1s" || names[6] != "orders.park.1m4s" {
		t.Fatalf("names %v", names)
	}
	if q, ok := p.ParkQueue(4 * time.Second); !ok || q != "orders.park.4s" {
		t.Fatalf("ParkQueue(4s) = %q %t", q, ok)
	}
	if _, ok := p.ParkQueue(3 * time.Second); ok {
		t.Fatal("a parking queue for a delay off the ladder")
	}
	if !strings.Contains(p.String(), "park  orders.park.34m8s") {
		t.Fatalf("plan does not list the parking queues:\n%s", p.String())
	}
	// A classic work queue still parks in quorum queues.
	c.Queue.Type = "classic"
	if p := topology.FromConfig(&c); p.Parking[0].Args["x-queue-type"] != "quorum" {
		t.Fatal("parking queue of a classic work queue is not quorum")
	}
}
