package packaging

import (
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/hopper-sidecar/hopper/config"
)

// subscriptionsValues is the ci values file with two subscriptions.
var subscriptionsValues = []string{chartDir, "ci", "subscriptions-values.yaml"}

// renderSubscriptions renders the chart with the subscriptions ci file and
// extra args, and returns the manifests and Hopper's parsed config.
func renderSubscriptions(t *testing.T, args ...string) ([]manifest, config.Config) {
	t.Helper()
	all := append([]string{"-f", repoPath(subscriptionsValues...)}, args...)
	stdout, stderr, err := runHelm(t, templateArgs(renderCase{chart: repoPath(chartDir), args: all})...)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr)
	}
	ms := decodeManifests(t, stdout)
	var data string
	for _, cm := range byKind[*corev1.ConfigMap](ms) {
		if d, ok := cm.Data["hopper.yaml"]; ok {
			data = d
		}
	}
	if data == "" {
		t.Fatalf("no ConfigMap holds hopper.yaml: %s", kindsOf(ms))
	}
	cfg := config.Default()
	if err := config.Parse([]byte(data), &cfg); err != nil {
		t.Fatalf("rendered hopper.yaml does not parse: %v\n%s", err, data)
	}
	return ms, cfg
}

// TestChartSubscriptions checks that config.subscriptions reaches Hopper
// whole and that every object naming a work queue names each of them.
func TestChartSubscriptions(t *testing.T) {
	ms, cfg := renderSubscriptions(t)

	// The config: both subscriptions, no top-level queue, and each one's
	// own keys laid over the top-level ones as Hopper will.
	if cfg.Queue.Name != "" {
		t.Errorf("rendered queue.name %q: with subscriptions it must stay unset", cfg.Queue.Name)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("rendered config is invalid: %v", err)
	}
	eff := cfg.SubscriptionConfigs()
	var names []string
	for _, e := range eff {
		names = append(names, e.Queue.Name)
	}
	if want := []string{"wms.queue.billing", "wms.queue.shipping"}; !slices.Equal(names, want) {
		t.Fatalf("rendered subscriptions consume %v, want %v", names, want)
	}
	billing, shipping := eff[0], eff[1]
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"billing app.url", billing.App.URL, "http://127.0.0.1:8080/billing/{routingKey}"},
		{"shipping app.url", shipping.App.URL, "http://127.0.0.1:8080/messages/{queue}"},
		{"billing retry.maxAttempts", billing.Retry.MaxAttempts, config.Attempts(5)},
		{"shipping retry.maxAttempts", shipping.Retry.MaxAttempts, config.Attempts(10)},
		{"billing consumer.prefetch", billing.Consumer.Prefetch, 20},
		{"shipping consumer.prefetch", shipping.Consumer.Prefetch, 50},
		{"billing retry.outcomes[404]", billing.Retry.Outcomes["404"], "dlq"},
		{"billing queue.type", billing.Queue.Type, "quorum"},
		{"shipping queue.type", shipping.Queue.Type, "quorum"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	for _, e := range eff {
		if !slices.ContainsFunc(e.Topology.Bindings, func(b config.Binding) bool {
			return b.Exchange == "wms.main-exchange" && b.Type == "fanout"
		}) {
			t.Errorf("%s is not bound to the fanout exchange wms.main-exchange: %+v", e.Queue.Name, e.Topology.Bindings)
		}
	}

	// KEDA: one rabbitmq trigger per queue, alike but for queueName.
	var triggers []map[string]any
	for _, o := range byKind[*crdObject](ms) {
		if o.Kind != "ScaledObject" {
			continue
		}
		list, _ := o.Spec["triggers"].([]any)
		for _, tr := range list {
			m, _ := tr.(map[string]any)
			triggers = append(triggers, m)
		}
	}
	var queues []string
	for _, tr := range triggers {
		md, _ := tr["metadata"].(map[string]any)
		q, _ := md["queueName"].(string)
		queues = append(queues, q)
		if tr["type"] != "rabbitmq" || md["value"] != "50" || md["mode"] != "QueueLength" {
			t.Errorf("trigger for %s: %v, want a rabbitmq QueueLength trigger with value 50", q, tr)
		}
	}
	if !slices.Equal(queues, names) {
		t.Errorf("ScaledObject triggers watch %v, want one per subscription queue %v", queues, names)
	}

	// The DLQ Job works on the DLQ of the queue dlqJob.queue names.
	jobs := byKind[*batchv1.Job](ms)
	if len(jobs) != 1 {
		t.Fatalf("want the DLQ Job, got %s", kindsOf(ms))
	}
	if args := jobs[0].Spec.Template.Spec.Containers[0].Args; !slices.Equal(args, []string{"dlq", "stats", "--queue", "wms.queue.shipping"}) {
		t.Errorf("DLQ Job args %q, want dlq stats --queue wms.queue.shipping", args)
	}

	// A DLQ named in the args needs no dlqJob.queue, and gets none added.
	ms, _ = renderSubscriptions(t, "--set", "dlqJob.queue=", "--set", "dlqJob.args={dlq,stats,--dlq,wms.dlq.billing}")
	jobs = byKind[*batchv1.Job](ms)
	if len(jobs) != 1 {
		t.Fatalf("want the DLQ Job, got %s", kindsOf(ms))
	}
	if args := jobs[0].Spec.Template.Spec.Containers[0].Args; !slices.Equal(args, []string{"dlq", "stats", "--dlq", "wms.dlq.billing"}) {
		t.Errorf("DLQ Job args %q, want dlq stats --dlq wms.dlq.billing as given", args)
	}
}

// TestChartOneSubscription: a list of one needs no dlqJob.queue, and the
// Job is still told its queue, so that it never depends on which DLQ the
// tool would pick by itself.
func TestChartOneSubscription(t *testing.T) {
	one := writeTemp(t, "one-subscription.yaml", `config:
  subscriptions:
    - queue: {name: wms.queue.billing}
dlqJob:
  queue: ""
`)
	ms, cfg := renderSubscriptions(t, "-f", one)
	if len(cfg.Subscriptions) != 1 || cfg.Subscriptions[0].Queue.Name != "wms.queue.billing" {
		t.Fatalf("rendered subscriptions %+v, want the one for wms.queue.billing", cfg.Subscriptions)
	}
	jobs := byKind[*batchv1.Job](ms)
	if len(jobs) != 1 {
		t.Fatalf("want the DLQ Job, got %s", kindsOf(ms))
	}
	if args := jobs[0].Spec.Template.Spec.Containers[0].Args; !slices.Equal(args, []string{"dlq", "stats", "--queue", "wms.queue.billing"}) {
		t.Errorf("DLQ Job args %q, want dlq stats --queue wms.queue.billing", args)
	}
}

// TestChartSubscriptionsReject: the ways config.subscriptions and the
// settings that depend on it go wrong fail the render with a message that
// says what to change.
func TestChartSubscriptionsReject(t *testing.T) {
	subs := repoPath(subscriptionsValues...)
	minimal := repoPath(chartDir, "ci", "minimal-values.yaml")
	both := writeTemp(t, "both.yaml", `config:
  queue: {name: orders}
  subscriptions:
    - queue: {name: wms.queue.billing}
`)
	neither := writeTemp(t, "neither.yaml", `app:
  image: {repository: registry.example.com/wms-api, tag: "1"}
config:
  queue: {type: quorum}
  subscriptions: []
`)
	twice := writeTemp(t, "twice.yaml", `config:
  subscriptions:
    - queue: {name: wms.queue.billing}
    - queue: {name: wms.queue.billing}
      path: /again
`)
	noPath := writeTemp(t, "no-slash.yaml", `config:
  subscriptions:
    - queue: {name: wms.queue.billing}
      path: billing
`)
	unknown := writeTemp(t, "unknown.yaml", `config:
  subscriptions:
    - queue: {name: wms.queue.billing}
      requeue: {maxRequeues: 5}
`)
	unnamed := writeTemp(t, "unnamed.yaml", `config:
  subscriptions:
    - queue: {type: quorum}
`)
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"queue name and subscriptions", []string{"-f", minimal, "-f", both}, "set config.queue.name (one queue) or config.subscriptions (several queues), not both"},
		{"neither", []string{"-f", neither}, "config.queue.name or config.subscriptions is required"},
		{"same queue twice", []string{"-f", subs, "-f", twice}, `config.subscriptions[1].queue.name "wms.queue.billing" is already used by config.subscriptions[0]`},
		{"path without slash", []string{"-f", subs, "-f", noPath}, "/config/subscriptions/0/path"},
		{"key subscriptions lack", []string{"-f", subs, "-f", unknown}, "additional properties 'requeue' not allowed"},
		{"subscription without queue name", []string{"-f", subs, "-f", unnamed}, "missing property 'name'"},
		{"dlq job without queue", []string{"-f", subs, "--set", "dlqJob.queue="}, "dlqJob.queue is required with several config.subscriptions"},
		{"dlq job on a queue not consumed", []string{"-f", subs, "--set", "dlqJob.queue=orders"}, `dlqJob.queue "orders" is not a queue Hopper consumes (wms.queue.billing, wms.queue.shipping)`},
		{"dlq job queue twice", []string{"-f", subs, "--set", "dlqJob.args={dlq,stats,--queue,wms.queue.billing}"}, "not both"},
		{"dlq job queue for a topology tool", []string{"-f", subs, "--set", "dlqJob.args={topology,plan}"}, "unset dlqJob.queue"},
		{"dlq job queue without subscriptions", []string{"-f", minimal, "--set", "dlqJob.enabled=true", "--set", "dlqJob.queue=payments"}, `dlqJob.queue "payments" is not a queue Hopper consumes (orders)`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			args := templateArgs(renderCase{chart: repoPath(chartDir), args: c.args})
			stdout, stderr, err := runHelm(t, args...)
			if err == nil {
				t.Fatalf("helm %s rendered; want an error containing %q\n%s", strings.Join(args, " "), c.want, stdout)
			}
			if !strings.Contains(stderr, c.want) {
				t.Errorf("helm template failed with\n%s\nwant it to mention %q", stderr, c.want)
			}
		})
	}
}
