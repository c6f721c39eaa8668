package topology_test

import (
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/topology"
)

// A route's own retry tiers get tier queues, dead-lettering back to the
// work queue like the others, so its retries have somewhere to go.
func TestRouteTiersPlanned(t *testing.T) {
	c := topoConfig(t, func(c *config.Config) {
		c.Retry.Tiers = durs(time.Second)
		c.Routes = []config.Route{{Name: "slow", Match: `headers.kind == "slow"`,
			Retry: &config.RouteRetry{Tiers: durs(45 * time.Second)}}}
	})
	plan := topology.FromConfig(c)
	for _, d := range []time.Duration{time.Second, 45 * time.Second} {
		q, ok := plan.TierQueue(d)
		if !ok {
			t.Fatalf("no tier queue for %s in %v", d, plan.Queues())
		}
		if q != "orders.retry."+config.FormatDuration(d) {
			t.Errorf("tier %s queue %q", d, q)
		}
	}
}
