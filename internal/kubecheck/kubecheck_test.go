package kubecheck

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	monv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/retry"
	"github.com/hopper-sidecar/hopper/telemetry"
)

// servedMetrics scrapes a live /metrics of Hopper's registry, with every
// optional source present, and returns the series names it serves
// (histograms as their _bucket, _sum and _count series).
func servedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	m := telemetry.NewMetrics(telemetry.Sources{
		Version:          "test",
		Queues:           []string{"wms.queue.billing", "wms.queue.shipping"},
		Tiers:            []time.Duration{time.Second, 2 * time.Minute},
		Connected:        func() bool { return true },
		Paused:           func() bool { return false },
		Refusing:         func() bool { return false },
		Parked:           func() map[string]float64 { return map[string]float64{"wms.queue.billing": 0} },
		NextDue:          func() map[string]float64 { return map[string]float64{"wms.queue.billing": 0} },
		HeadersSkipped:   func() int64 { return 0 },
		HeadersOmitted:   func() map[string]int64 { return map[string]int64{"max-headers": 0} },
		SpansDropped:     func() int64 { return 0 },
		MovesFailing:     func() int64 { return 0 },
		ConcurrencyLimit: func() int64 { return 1 },
		Routes:           map[string][]string{"wms.queue.shipping": {"orders", "priority"}},
		StreamPositions: func() map[string]telemetry.StreamPosition {
			return map[string]telemetry.StreamPosition{"events.billing": {Stored: 41879, Last: 42000, Lag: 121}}
		},
	})
	// One delivery so that the latency histogram, whose series are per
	// queue, has buckets with counts.
	m.InFlight(1)
	m.ForQueue("wms.queue.billing").Decided(retry.Outcome{Kind: retry.Response, Status: 200}, true, retry.Decision{Action: retry.Ack}, 5*time.Millisecond)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	names := map[string]bool{}
	for name, f := range fams {
		switch f.GetType().String() {
		case "HISTOGRAM":
			names[name+"_bucket"], names[name+"_sum"], names[name+"_count"] = true, true, true
		case "SUMMARY":
			names[name+"_sum"], names[name+"_count"] = true, true
			names[name] = true
		default:
			names[name] = true
		}
	}
	if !names["hopper_deliveries_total"] || !names["hopper_delivery_duration_seconds_bucket"] {
		t.Fatalf("/metrics lacks Hopper's own series: %v", keys(names))
	}
	return names
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// metricNames parses a PromQL expression with Prometheus's parser and
// returns the metric names it selects.
func metricNames(expr string) ([]string, error) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var names []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			name := vs.Name
			if name == "" {
				for _, m := range vs.LabelMatchers {
					if m.Name == model.MetricNameLabel {
						name = m.Value
					}
				}
			}
			names = append(names, name)
		}
		return nil
	})
	if len(names) == 0 {
		return nil, fmt.Errorf("selects no metric")
	}
	return names, nil
}

// checkExpr fails the test when expr does not parse or names a metric
// Hopper does not serve; it returns the names.
func checkExpr(t *testing.T, what, expr string, served map[string]bool) []string {
	t.Helper()
	names, err := metricNames(expr)
	if err != nil {
		t.Errorf("%s: %q does not parse: %v", what, expr, err)
		return nil
	}
	for _, n := range names {
		if !served[n] {
			t.Errorf("%s: %q names %s, which Hopper's /metrics does not serve", what, expr, n)
		}
	}
	return names
}

// grafanaVars replaces the dashboard's template variables with values a
// Grafana would put there, so that the query is plain PromQL.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$namespace", ".*", "$pod", ".*")

type dashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		Title   string `json:"title"`
		Type    string `json:"type"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// TestDashboard: every query of the Grafana dashboard parses and names only
// metrics Hopper serves, and the dashboard covers what an operator watches.
func TestDashboard(t *testing.T) {
	served := servedMetrics(t)
	raw, err := os.ReadFile(repoPath("charts", "hopper", "dashboards", "hopper.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("dashboards/hopper.json: %v", err)
	}
	if d.UID == "" || d.Title == "" {
		t.Error("dashboard needs a title and a stable uid")
	}
	used := map[string]bool{}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, n := range checkExpr(t, "panel "+p.Title, grafanaVars.Replace(tg.Expr), served) {
				used[n] = true
			}
		}
	}
	label := regexpLabelValues
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(map[string]any)
		s, _ := q["query"].(string)
		m := label.FindStringSubmatch(s)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(<selector>, <label>)", v.Name, s)
			continue
		}
		checkExpr(t, "variable "+v.Name, grafanaVars.Replace(m[1]), served)
	}
	for _, want := range []string{
		"hopper_deliveries_total",                 // throughput by outcome
		"hopper_retries_total",                    // retries by tier
		"hopper_dead_lettered_total",              // DLQ rate by reason
		"hopper_breaker_state",                    // breaker
		"hopper_concurrency_limit",                // limiter
		"hopper_moves_failed_total",               // move failures
		"hopper_moves_failing",                    // held deliveries
		"hopper_delivery_duration_seconds_bucket", // latency percentiles
		"hopper_broker_connected",                 // broker connection
		"hopper_routed_total",                     // routes taken
		"process_resident_memory_bytes",           // Hopper's memory
		"process_cpu_seconds_total",               // Hopper's CPU per delivery
	} {
		if !used[want] {
			t.Errorf("the dashboard shows nothing from %s", want)
		}
	}
}

// TestRenderedObjects decodes every custom resource the chart renders
// strictly into KEDA's and the Prometheus Operator's types and checks what
// they point at.
func TestRenderedObjects(t *testing.T) {
	served := servedMetrics(t)
	seen := map[string]bool{}
	for _, c := range renderCases(t) {
		t.Run(c.name, func(t *testing.T) {
			docs := render(t, c.chart, c.args...)
			var deps []*appsv1.Deployment
			var hopperCfg *config.Config
			for _, d := range docs {
				switch d.kind {
				case "Deployment":
					var dep appsv1.Deployment
					if err := decodeStrict(d, &dep); err != nil {
						t.Fatal(err)
					}
					// The DLQ console's Deployment is decoded strictly
					// like every object; it is not the app's workload.
					if !strings.HasSuffix(dep.Name, "-console") {
						deps = append(deps, &dep)
					}
				case "ConfigMap":
					var cm corev1.ConfigMap
					if err := decodeStrict(d, &cm); err != nil {
						t.Fatal(err)
					}
					if y, ok := cm.Data["hopper.yaml"]; ok {
						cfg := config.Default()
						if err := config.Parse([]byte(y), &cfg); err != nil {
							t.Fatalf("ConfigMap %s: hopper.yaml: %v", cm.Name, err)
						}
						hopperCfg = &cfg
					}
					if j, ok := cm.Data["hopper.json"]; ok {
						want, err := os.ReadFile(repoPath("charts", "hopper", "dashboards", "hopper.json"))
						if err != nil {
							t.Fatal(err)
						}
						if strings.TrimSpace(j) != strings.TrimSpace(string(want)) {
							t.Errorf("ConfigMap %s: hopper.json differs from dashboards/hopper.json", cm.Name)
						}
						if cm.Labels["grafana_dashboard"] == "" {
							t.Errorf("ConfigMap %s lacks the grafana_dashboard label Grafana's sidecar looks for", cm.Name)
						}
					}
				}
			}
			if hopperCfg == nil || len(deps) != 1 {
				t.Fatalf("want Hopper's ConfigMap and one Deployment, got %d Deployments", len(deps))
			}
			dep := deps[0]
			for _, d := range docs {
				seen[d.kind] = true
				switch d.apiVersion + "/" + d.kind {
				case "keda.sh/v1alpha1/ScaledObject":
					checkScaledObject(t, d, docs, dep, hopperCfg, served)
				case "keda.sh/v1alpha1/TriggerAuthentication":
					var ta kedav1alpha1.TriggerAuthentication
					if err := decodeStrict(d, &ta); err != nil {
						t.Error(err)
						continue
					}
					// Checked with each trigger that uses it (checkRabbitMQAuth).
				case "monitoring.coreos.com/v1/PodMonitor":
					var pm monv1.PodMonitor
					if err := decodeStrict(d, &pm); err != nil {
						t.Error(err)
						continue
					}
					checkPodMonitor(t, &pm, dep)
				case "monitoring.coreos.com/v1/ServiceMonitor":
					var sm monv1.ServiceMonitor
					if err := decodeStrict(d, &sm); err != nil {
						t.Error(err)
					}
				case "networking.k8s.io/v1/NetworkPolicy":
					var np networkingv1.NetworkPolicy
					if err := decodeStrict(d, &np); err != nil {
						t.Error(err)
						continue
					}
					checkNetworkPolicy(t, &np, dep)
				case "monitoring.coreos.com/v1/PrometheusRule":
					var pr monv1.PrometheusRule
					if err := decodeStrict(d, &pr); err != nil {
						t.Error(err)
						continue
					}
					checkRules(t, &pr, served)
				}
			}
		})
	}
	for _, k := range []string{"ScaledObject", "TriggerAuthentication", "PodMonitor", "ServiceMonitor", "PrometheusRule", "NetworkPolicy"} {
		if !seen[k] {
			t.Errorf("no render case renders a %s: add one to charts/hopper/ci", k)
		}
	}
}

// regexpLabelValues matches a Grafana label_values(<selector>, <label>) query.
var regexpLabelValues = mustRegexp(`^label_values\((.+),\s*[a-zA-Z_][a-zA-Z0-9_]*\)$`)

func checkScaledObject(t *testing.T, d doc, docs []doc, dep *appsv1.Deployment, cfg *config.Config, served map[string]bool) {
	t.Helper()
	var so kedav1alpha1.ScaledObject
	if err := decodeStrict(d, &so); err != nil {
		t.Error(err)
		return
	}
	// KEDA's own admission checks.
	if err := kedav1alpha1.ValidateTriggers(so.Spec.Triggers); err != nil {
		t.Errorf("ScaledObject %s: %v", so.Name, err)
	}
	if err := kedav1alpha1.CheckReplicaCountBoundsAreValid(&so); err != nil {
		t.Errorf("ScaledObject %s: %v", so.Name, err)
	}
	ref := so.Spec.ScaleTargetRef
	if ref == nil || ref.Kind != "Deployment" || ref.APIVersion != "apps/v1" || ref.Name != dep.Name {
		t.Errorf("ScaledObject %s scales %+v, want the Deployment %s that runs Hopper", so.Name, ref, dep.Name)
	}
	// One rabbitmq trigger per queue Hopper consumes, in config order: a
	// partitioned queue's partition queues, which hold its messages.
	// A stream subscription's queue is its own, beside the stream; with
	// keda.streamLag a prometheus trigger per stream subscription follows
	// them, on its lag.
	var queues []string
	streams := map[string]bool{}
	for _, s := range cfg.Consumed() {
		queues = append(queues, s.Queue.Name)
		if s.Queue.Stream.Name != "" {
			streams[s.Queue.Name] = true
		}
	}
	var rabbit []kedav1alpha1.ScaleTriggers
	for _, tr := range so.Spec.Triggers {
		if tr.Type == "prometheus" {
			checkLagTrigger(t, tr, streams, served)
			continue
		}
		rabbit = append(rabbit, tr)
	}
	if len(rabbit) != len(queues) {
		t.Fatalf("ScaledObject %s: %d rabbitmq triggers, want one per work queue %v", so.Name, len(rabbit), queues)
	}
	for i, tr := range rabbit {
		if tr.Type != "rabbitmq" {
			t.Errorf("trigger type %q", tr.Type)
		}
		if tr.Metadata["queueName"] != queues[i] {
			t.Errorf("trigger %d queueName %q, want Hopper's work queue %q", i, tr.Metadata["queueName"], queues[i])
		}
		if m := tr.Metadata["mode"]; m != "QueueLength" && m != "MessageRate" {
			t.Errorf("trigger mode %q", m)
		}
		if v, err := strconv.ParseFloat(tr.Metadata["value"], 64); err != nil || v <= 0 {
			t.Errorf("trigger value %q: want a positive number", tr.Metadata["value"])
		}
		var ta *kedav1alpha1.TriggerAuthentication
		for _, o := range docs {
			if o.kind == "TriggerAuthentication" && tr.AuthenticationRef != nil && o.name == tr.AuthenticationRef.Name {
				ta = &kedav1alpha1.TriggerAuthentication{}
				if err := decodeStrict(o, ta); err != nil {
					t.Fatal(err)
				}
			}
		}
		if ta == nil {
			t.Errorf("trigger authenticationRef %+v names no rendered TriggerAuthentication", tr.AuthenticationRef)
			continue
		}
		checkRabbitMQAuth(t, tr, ta, docs, dep)
	}
	// Scale-in removes pods with SIGTERM: each needs its shutdown grace.
	grace := dep.Spec.Template.Spec.TerminationGracePeriodSeconds
	if grace == nil || time.Duration(*grace)*time.Second <= cfg.Shutdown.Grace.D() {
		t.Errorf("Deployment %s: terminationGracePeriodSeconds %v does not exceed shutdown.grace %s: scale-in would cut Hopper's drain short", dep.Name, grace, cfg.Shutdown.Grace.D())
	}
	if dep.Spec.Replicas != nil {
		t.Errorf("Deployment %s sets replicas while KEDA scales it", dep.Name)
	}
}

// checkLagTrigger checks a prometheus trigger on a stream subscription's
// lag: a server to ask, a query Prometheus parses that selects the lag
// gauge Hopper serves for one of the config's stream subscriptions, a
// positive threshold.
func checkLagTrigger(t *testing.T, tr kedav1alpha1.ScaleTriggers, streams map[string]bool, served map[string]bool) {
	t.Helper()
	if tr.Metadata["serverAddress"] == "" {
		t.Errorf("prometheus trigger without serverAddress: %v", tr.Metadata)
	}
	q := tr.Metadata["query"]
	names := checkExpr(t, "prometheus trigger", q, served)
	if len(names) != 1 || names[0] != "hopper_stream_lag_messages" {
		t.Errorf("prometheus trigger query %q selects %v, want hopper_stream_lag_messages", q, names)
	}
	found := false
	for name := range streams {
		if strings.Contains(q, fmt.Sprintf("queue=%q", name)) {
			found = true
		}
	}
	if !found {
		t.Errorf("prometheus trigger query %q names none of the stream subscriptions' queues %v", q, streams)
	}
	if v, err := strconv.ParseFloat(tr.Metadata["threshold"], 64); err != nil || v <= 0 {
		t.Errorf("prometheus trigger threshold %q: want a positive number", tr.Metadata["threshold"])
	}
}

func checkPodMonitor(t *testing.T, pm *monv1.PodMonitor, dep *appsv1.Deployment) {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
	if err != nil || sel.Empty() {
		t.Fatalf("PodMonitor %s: selector %v: %v", pm.Name, sel, err)
	}
	if !sel.Matches(labelsSet(dep.Spec.Template.Labels)) {
		t.Errorf("PodMonitor %s selects %s, which the pods of %s (%v) do not match", pm.Name, sel, dep.Name, dep.Spec.Template.Labels)
	}
	ports := map[string]bool{}
	pod := dep.Spec.Template.Spec
	for _, c := range append(append([]corev1.Container{}, pod.InitContainers...), pod.Containers...) {
		for _, p := range c.Ports {
			ports[p.Name] = true
		}
	}
	if len(pm.Spec.PodMetricsEndpoints) == 0 {
		t.Errorf("PodMonitor %s has no endpoints", pm.Name)
	}
	for _, e := range pm.Spec.PodMetricsEndpoints {
		if e.Port == nil || !ports[*e.Port] {
			t.Errorf("PodMonitor %s scrapes port %v, which no container of %s names", pm.Name, e.Port, dep.Name)
		}
		for _, dur := range []monv1.Duration{e.Interval, e.ScrapeTimeout} {
			if _, err := model.ParseDuration(string(dur)); err != nil {
				t.Errorf("PodMonitor %s: %q: %v", pm.Name, dur, err)
			}
		}
	}
}

// checkNetworkPolicy: the policy applies to the pods that run Hopper, in
// both directions, and admits the port Hopper's container serves its admin
// endpoints on (the one the PodMonitor and ServiceMonitor scrape).
func checkNetworkPolicy(t *testing.T, np *networkingv1.NetworkPolicy, dep *appsv1.Deployment) {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil || sel.Empty() {
		t.Fatalf("NetworkPolicy %s: podSelector %v: %v (empty would select every pod of the namespace)", np.Name, sel, err)
	}
	if !sel.Matches(labelsSet(dep.Spec.Template.Labels)) {
		t.Errorf("NetworkPolicy %s selects %s, which the pods of %s (%v) do not match", np.Name, sel, dep.Name, dep.Spec.Template.Labels)
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}) {
		t.Errorf("NetworkPolicy %s: policyTypes %v, want [Ingress Egress]", np.Name, np.Spec.PolicyTypes)
	}
	var admin int32
	pod := dep.Spec.Template.Spec
	for _, c := range append(append([]corev1.Container{}, pod.InitContainers...), pod.Containers...) {
		for _, p := range c.Ports {
			if p.Name == "hopper-admin" {
				admin = p.ContainerPort
			}
		}
	}
	if admin == 0 {
		t.Fatalf("Deployment %s: no container port hopper-admin", dep.Name)
	}
	admitted := slices.ContainsFunc(np.Spec.Ingress, func(r networkingv1.NetworkPolicyIngressRule) bool {
		return len(r.From) > 0 && slices.ContainsFunc(r.Ports, func(p networkingv1.NetworkPolicyPort) bool {
			return p.Port != nil && (p.Port.IntValue() == int(admin) || p.Port.String() == "hopper-admin") &&
				(p.Protocol == nil || *p.Protocol == corev1.ProtocolTCP)
		})
	})
	if !admitted {
		t.Errorf("NetworkPolicy %s: no ingress rule admits TCP %d (hopper-admin) from a named peer: %+v", np.Name, admin, np.Spec.Ingress)
	}
	if len(np.Spec.Egress) == 0 {
		t.Errorf("NetworkPolicy %s allows no egress: Hopper could not reach the broker", np.Name)
	}
}

func checkRules(t *testing.T, pr *monv1.PrometheusRule, served map[string]bool) {
	t.Helper()
	alerts := map[string]bool{}
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = true
			checkExpr(t, "alert "+r.Alert, r.Expr.String(), served)
			if r.For != nil {
				if _, err := model.ParseDuration(string(*r.For)); err != nil {
					t.Errorf("alert %s: for %q: %v", r.Alert, *r.For, err)
				}
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("alert %s needs a severity label and a summary", r.Alert)
			}
		}
	}
	for _, want := range []string{"HopperDLQGrowing", "HopperBreakerOpen", "HopperMovesFailing", "HopperAppRefusesCredentials", "HopperNotConsuming", "HopperOrderBroken", "HopperSpansDropped"} {
		if !alerts[want] {
			t.Errorf("PrometheusRule %s lacks %s", pr.Name, want)
		}
	}
}

// TestExprCheckFails: the check rejects what it must (so that a passing
// TestDashboard means something).
func TestExprCheckFails(t *testing.T) {
	served := map[string]bool{"hopper_deliveries_total": true}
	for _, expr := range []string{
		"sum(rate(hopper_deliveries_total[5m])",       // unbalanced
		"sum(rate(hopper_delivered_total[5m]))",       // not served
		"rate(hopper_deliveries_total{a=~\"(\"}[5m])", // bad regexp
		"vector(1)", // selects no metric
	} {
		names, err := metricNames(expr)
		bad := err != nil
		for _, n := range names {
			bad = bad || !served[n]
		}
		if !bad {
			t.Errorf("%q passed the check", expr)
		}
	}
}

func labelsSet(m map[string]string) labels.Set { return labels.Set(m) }

func mustRegexp(s string) *regexp.Regexp { return regexp.MustCompile(s) }
