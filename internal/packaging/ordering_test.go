package packaging

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestChartOrderingNeedsOnePod: ordered delivery holds within one pod, so
// the chart refuses to render consumer.ordered with several replicas or an
// autoscaler, unless the queue has a single active consumer (one pod
// consumes at a time); per subscription, with what each inherits.
func TestChartOrderingNeedsOnePod(t *testing.T) {
	minimal := repoPath(chartDir, "ci", "minimal-values.yaml")
	subs := filepath.Join(t.TempDir(), "subs.yaml")
	if err := os.WriteFile(subs, []byte(`app:
  image: {repository: registry.example.com/wms-api, tag: "2.3.0"}
broker: {existingSecret: rabbitmq-wms, urlKey: url}
deployment: {replicas: 2}
config:
  consumer: {ordered: true}
  subscriptions:
    - queue: {name: a, singleActiveConsumer: true}
    - queue: {name: b}
      consumer: {ordered: false}
    - queue: {name: c}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	sac := []string{"--set", "config.queue.singleActiveConsumer=true"}
	hpa := []string{"--set", "autoscaling.enabled=true", "--set", "app.resources.requests.cpu=100m"}
	cases := []struct {
		name string
		args []string
		want string // "" = renders
	}{
		{"ordered, one replica", []string{"-f", minimal, "--set", "config.consumer.ordered=true"}, ""},
		{"ordered, three replicas", []string{"-f", minimal, "--set", "config.consumer.ordered=true", "--set", "deployment.replicas=3"},
			"config.consumer.ordered: true with deployment.replicas 3: order holds within one pod only"},
		{"ordered, HPA", append([]string{"-f", minimal, "--set", "config.consumer.ordered=true"}, hpa...),
			"config.consumer.ordered: true with autoscaling.enabled"},
		{"ordered, KEDA", []string{"-f", minimal, "--set", "config.consumer.ordered=true", "--set", "keda.enabled=true", "--set", "keda.protocol=amqp"},
			"Set config.queue.singleActiveConsumer: true"},
		{"ordered, three replicas, single active consumer", append([]string{"-f", minimal, "--set", "config.consumer.ordered=true", "--set", "deployment.replicas=3"}, sac...), ""},
		{"ordered, HPA, single active consumer", append(append([]string{"-f", minimal, "--set", "config.consumer.ordered=true"}, hpa...), sac...), ""},
		{"unordered, three replicas", []string{"-f", minimal, "--set", "deployment.replicas=3"}, ""},
		{"ordering key, three replicas", []string{"-f", minimal, "--set", "config.consumer.orderingKey=routingKey", "--set", "deployment.replicas=3"},
			"config.consumer.orderingKey \"routingKey\" with deployment.replicas 3: order holds within one pod only"},
		{"ordered, KEDA, partitioned", []string{"-f", minimal, "--set", "config.consumer.ordered=true", "--set", "keda.enabled=true", "--set", "keda.protocol=amqp", "--set", "config.topology.partitions.count=4"}, ""},
		{"ordering key, three replicas, single active consumer", append([]string{"-f", minimal, "--set", "config.consumer.orderingKey=routingKey", "--set", "deployment.replicas=3"}, sac...), ""},
		{"subscription inheriting ordered without single active consumer", []string{"-f", subs},
			"config.subscriptions[2].consumer.ordered: true with deployment.replicas 2"},
		{"every ordered subscription with single active consumer", []string{"-f", subs, "--set", "config.subscriptions[2].queue.singleActiveConsumer=true"}, ""},
		{"subscriptions inheriting single active consumer", []string{"-f", subs, "--set", "config.queue.singleActiveConsumer=true"}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"template", release, repoPath(chartDir), "--namespace", namespace, "--kube-version", kubeVersion}, c.args...)
			stdout, stderr, err := runHelm(t, args...)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("helm %s failed: %s", strings.Join(args, " "), stderr)
			case c.want != "" && err == nil:
				t.Fatalf("helm %s rendered; want an error containing %q\n%s", strings.Join(args, " "), c.want, stdout)
			case c.want != "" && !strings.Contains(stderr, c.want):
				t.Errorf("helm template failed with\n%s\nwant it to mention %q", stderr, c.want)
			}
		})
	}
}

// TestChartRendersQueueArguments: queue arguments and single active
// consumer reach hopper.yaml as given, integers as integers.
func TestChartRendersQueueArguments(t *testing.T) {
	args := []string{"template", release, repoPath(chartDir), "--namespace", namespace, "--kube-version", kubeVersion,
		"-f", repoPath(chartDir, "ci", "minimal-values.yaml"), "--set", "config.queue.singleActiveConsumer=true",
		"--set-json", `config.queue.arguments={"x-max-priority":10,"x-max-length":100000000,"x-overflow":"reject-publish"}`}
	stdout, stderr, err := runHelm(t, args...)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr)
	}
	for _, want := range []string{"x-max-priority: 10\n", "x-max-length: 100000000\n", "x-overflow: reject-publish\n", "singleActiveConsumer: true\n"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("rendered hopper.yaml lacks %q", want)
		}
	}
}
