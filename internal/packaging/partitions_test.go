package packaging

import (
	"slices"
	"testing"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
)

var partitionsValues = []string{chartDir, "ci", "partitions-values.yaml"}

// renderPartitions renders the chart with the partitions ci file and extra
// args.
func renderPartitions(t *testing.T, args ...string) []manifest {
	t.Helper()
	all := append([]string{"-f", repoPath(partitionsValues...)}, args...)
	stdout, stderr, err := runHelm(t, templateArgs(renderCase{chart: repoPath(chartDir), args: all})...)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr)
	}
	return decodeManifests(t, stdout)
}

// scaledObject returns the ScaledObject's maxReplicaCount and the queues
// its triggers watch.
func scaledObject(t *testing.T, ms []manifest) (max float64, queues []string) {
	t.Helper()
	for _, o := range byKind[*crdObject](ms) {
		if o.Kind != "ScaledObject" {
			continue
		}
		switch v := o.Spec["maxReplicaCount"].(type) {
		case float64:
			max = v
		case int64:
			max = float64(v)
		case int:
			max = float64(v)
		default:
			t.Fatalf("maxReplicaCount %v (%T)", v, v)
		}
		list, _ := o.Spec["triggers"].([]any)
		for _, tr := range list {
			m, _ := tr.(map[string]any)
			md, _ := m["metadata"].(map[string]any)
			q, _ := md["queueName"].(string)
			queues = append(queues, q)
		}
		return max, queues
	}
	t.Fatalf("no ScaledObject: %s", kindsOf(ms))
	return 0, nil
}

// With partitions on, the autoscalers never ask for more replicas than
// partitions (each partition has one active consumer; more replicas only
// stand by), and KEDA watches the partition queues, the ones that exist.
func TestChartPartitionsCapReplicas(t *testing.T) {
	max, queues := scaledObject(t, renderPartitions(t))
	if max != 4 {
		t.Errorf("ScaledObject maxReplicaCount %v, want 4 (the partition count; values ask 10)", max)
	}
	if want := []string{"orders.p0", "orders.p1", "orders.p2", "orders.p3"}; !slices.Equal(queues, want) {
		t.Errorf("ScaledObject triggers watch %v, want %v", queues, want)
	}
	// A lower maximum stays as it is; a minimum above the count wins.
	if max, _ := scaledObject(t, renderPartitions(t, "--set", "keda.maxReplicaCount=3")); max != 3 {
		t.Errorf("maxReplicaCount 3 with 4 partitions rendered as %v", max)
	}
	if max, _ := scaledObject(t, renderPartitions(t, "--set", "keda.minReplicaCount=6")); max != 6 {
		t.Errorf("minReplicaCount 6 with 4 partitions: maxReplicaCount %v, want 6", max)
	}
	// Partitions off (the ordered queue then needs a single active
	// consumer of its own to scale): the values' maximum.
	if max, queues := scaledObject(t, renderPartitions(t, "--set", "config.topology.partitions.count=0",
		"--set", "config.queue.singleActiveConsumer=true")); max != 10 || !slices.Equal(queues, []string{"orders"}) {
		t.Errorf("partitions off: maxReplicaCount %v, triggers %v", max, queues)
	}

	// The HPA is capped the same way.
	ms := renderPartitions(t, "--set", "keda.enabled=false", "--set", "autoscaling.enabled=true", "--set", "autoscaling.maxReplicas=12",
		"--set", "autoscaling.targetCPUUtilizationPercentage=80", "--set", "resources.requests.cpu=50m", "--set", "app.resources.requests.cpu=100m")
	hpas := byKind[*autoscalingv2.HorizontalPodAutoscaler](ms)
	if len(hpas) != 1 || hpas[0].Spec.MaxReplicas != 4 {
		t.Errorf("HPA maxReplicas: %v, want 4", hpas)
	}
}

// A subscription with partitions of its own is capped only when every
// subscription is partitioned: an unpartitioned queue can use any replica.
func TestChartPartitionsSubscriptions(t *testing.T) {
	ms, _ := renderSubscriptions(t, "--set", "config.subscriptions[0].partitions.count=2")
	max, queues := scaledObject(t, ms)
	if want := []string{"wms.queue.billing.p0", "wms.queue.billing.p1", "wms.queue.shipping"}; !slices.Equal(queues, want) {
		t.Errorf("triggers %v, want %v", queues, want)
	}
	if max != 4 {
		t.Errorf("maxReplicaCount %v with one queue unpartitioned, want the values' 4", max)
	}
	ms, _ = renderSubscriptions(t, "--set", "config.subscriptions[0].partitions.count=2", "--set", "config.topology.partitions.count=3")
	if max, _ := scaledObject(t, ms); max != 3 {
		t.Errorf("maxReplicaCount %v with 2 and 3 partitions, want 3", max)
	}
}
