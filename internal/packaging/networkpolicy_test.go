package packaging

import (
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// npPorts lists NetworkPolicy ports as "TCP/5672", for comparisons.
func npPorts(ps []networkingv1.NetworkPolicyPort) []string {
	var out []string
	for _, p := range ps {
		proto := "TCP"
		if p.Protocol != nil {
			proto = string(*p.Protocol)
		}
		port := "any"
		if p.Port != nil {
			port = p.Port.String()
		}
		out = append(out, proto+"/"+port)
	}
	return out
}

// renderNetworkPolicy renders the chart with defaultsArgs and extra, and
// returns the Deployment and the NetworkPolicies.
func renderNetworkPolicy(t *testing.T, extra ...string) (*appsv1.Deployment, []*networkingv1.NetworkPolicy) {
	t.Helper()
	args := templateArgs(renderCase{chart: repoPath(chartDir), args: append(slices.Clone(defaultsArgs), extra...)})
	stdout, stderr, err := runHelm(t, args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	ms := decodeManifests(t, stdout)
	deps := byKind[*appsv1.Deployment](ms)
	if len(deps) != 1 {
		t.Fatalf("want one Deployment, got %s", kindsOf(ms))
	}
	return deps[0], byKind[*networkingv1.NetworkPolicy](ms)
}

// TestChartNetworkPolicyOffByDefault: the chart's defaults render no
// NetworkPolicy (one in a namespace that had none denies everything else).
func TestChartNetworkPolicyOffByDefault(t *testing.T) {
	_, nps := renderNetworkPolicy(t)
	if len(nps) != 0 {
		t.Errorf("the defaults render %d NetworkPolicies, want none", len(nps))
	}
}

// TestChartNetworkPolicyDefaults pins the policy networkPolicy.enabled alone
// renders: both directions restricted, the admin port open to the monitoring
// namespace, the broker's ports to anywhere, DNS to kube-system, and no OTLP
// rule while tracing is off.
func TestChartNetworkPolicyDefaults(t *testing.T) {
	dep, nps := renderNetworkPolicy(t, "--set", "networkPolicy.enabled=true")
	if len(nps) != 1 {
		t.Fatalf("want one NetworkPolicy, got %d", len(nps))
	}
	np := nps[0]
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}) {
		t.Errorf("policyTypes %v, want [Ingress Egress]", np.Spec.PolicyTypes)
	}
	checkPolicySelectsPods(t, np, dep)
	if want := map[string]string{"app.kubernetes.io/name": "hopper", "app.kubernetes.io/instance": release}; !reflect.DeepEqual(np.Spec.PodSelector.MatchLabels, want) || len(np.Spec.PodSelector.MatchExpressions) != 0 {
		t.Errorf("podSelector %+v, want the chart's selector labels %v", np.Spec.PodSelector, want)
	}

	monitoring := metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}}
	if len(np.Spec.Ingress) != 1 {
		t.Fatalf("ingress %+v, want one rule (the admin port)", np.Spec.Ingress)
	}
	in := np.Spec.Ingress[0]
	if got := npPorts(in.Ports); !slices.Equal(got, []string{"TCP/9090"}) {
		t.Errorf("ingress ports %v, want [TCP/9090] (Hopper's default admin port)", got)
	}
	if len(in.From) != 1 || in.From[0].NamespaceSelector == nil || !reflect.DeepEqual(*in.From[0].NamespaceSelector, monitoring) || in.From[0].PodSelector != nil || in.From[0].IPBlock != nil {
		t.Errorf("ingress from %+v, want only namespaceSelector %v", in.From, monitoring)
	}

	if len(np.Spec.Egress) != 2 {
		t.Fatalf("egress %+v, want two rules: broker and DNS", np.Spec.Egress)
	}
	broker, dns := np.Spec.Egress[0], np.Spec.Egress[1]
	if got := npPorts(broker.Ports); !slices.Equal(got, []string{"TCP/5672", "TCP/5671"}) {
		t.Errorf("broker egress ports %v, want [TCP/5672 TCP/5671]", got)
	}
	if len(broker.To) != 0 {
		t.Errorf("broker egress to %+v, want none (any destination)", broker.To)
	}
	if got := npPorts(dns.Ports); !slices.Equal(got, []string{"UDP/53", "TCP/53"}) {
		t.Errorf("DNS egress ports %v, want [UDP/53 TCP/53]", got)
	}
	kubeSystem := metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "kube-system"}}
	if len(dns.To) != 1 || dns.To[0].NamespaceSelector == nil || !reflect.DeepEqual(*dns.To[0].NamespaceSelector, kubeSystem) {
		t.Errorf("DNS egress to %+v, want namespaceSelector %v", dns.To, kubeSystem)
	}
}

// TestChartNetworkPolicyValues: peers, ports, the OTLP rule with tracing on,
// the admin port from config.admin.listen, DNS to anywhere, and the extra
// rules appended as they are.
func TestChartNetworkPolicyValues(t *testing.T) {
	values := `
config:
  admin:
    listen: ":9191"
otel:
  enabled: true
  endpoint: http://otel-collector.observability:4317
  protocol: grpc
networkPolicy:
  enabled: true
  broker:
    ports: [5671]
    to:
      - namespaceSelector:
          matchLabels:
            kubernetes.io/metadata.name: messaging
        podSelector:
          matchLabels:
            app.kubernetes.io/name: rabbitmq
      - ipBlock:
          cidr: 10.20.0.0/16
  otel:
    ports: [4317]
    to:
      - namespaceSelector:
          matchLabels:
            kubernetes.io/metadata.name: observability
  dns:
    to: []
  metrics:
    namespaceSelector:
      matchLabels:
        kubernetes.io/metadata.name: null # Helm merges maps: null drops the default label
        team: observability
  extraIngress:
    - from:
        - podSelector:
            matchLabels:
              app: gateway
      ports:
        - port: 8080
  extraEgress:
    - to:
        - ipBlock:
            cidr: 10.30.0.5/32
      ports:
        - port: 5432
`
	f := filepath.Join(scratch, "networkpolicy-values.yaml")
	if err := os.WriteFile(f, []byte(values), 0o644); err != nil {
		t.Fatal(err)
	}
	var v struct {
		NetworkPolicy struct {
			Broker struct {
				To []networkingv1.NetworkPolicyPeer
			}
			Otel struct {
				To []networkingv1.NetworkPolicyPeer
			}
			ExtraIngress []networkingv1.NetworkPolicyIngressRule `json:"extraIngress"`
			ExtraEgress  []networkingv1.NetworkPolicyEgressRule  `json:"extraEgress"`
		} `json:"networkPolicy"`
	}
	if err := yaml.Unmarshal([]byte(values), &v); err != nil {
		t.Fatal(err)
	}
	dep, nps := renderNetworkPolicy(t, "-f", f)
	if len(nps) != 1 {
		t.Fatalf("want one NetworkPolicy, got %d", len(nps))
	}
	np := nps[0]
	checkPolicySelectsPods(t, np, dep)

	if len(np.Spec.Ingress) != 2 {
		t.Fatalf("ingress %+v, want the admin rule and the extra one", np.Spec.Ingress)
	}
	if got := npPorts(np.Spec.Ingress[0].Ports); !slices.Equal(got, []string{"TCP/9191"}) {
		t.Errorf("admin ingress ports %v, want [TCP/9191] from config.admin.listen", got)
	}
	obs := metav1.LabelSelector{MatchLabels: map[string]string{"team": "observability"}}
	if from := np.Spec.Ingress[0].From; len(from) != 1 || from[0].NamespaceSelector == nil || !reflect.DeepEqual(*from[0].NamespaceSelector, obs) {
		t.Errorf("admin ingress from %+v, want namespaceSelector %v", from, obs)
	}
	if !reflect.DeepEqual(np.Spec.Ingress[1:], v.NetworkPolicy.ExtraIngress) {
		t.Errorf("extra ingress rendered as %+v, want %+v as given", np.Spec.Ingress[1:], v.NetworkPolicy.ExtraIngress)
	}

	if len(np.Spec.Egress) != 4 {
		t.Fatalf("egress %+v, want broker, OTLP, DNS and the extra rule", np.Spec.Egress)
	}
	broker, otel, dns := np.Spec.Egress[0], np.Spec.Egress[1], np.Spec.Egress[2]
	if got := npPorts(broker.Ports); !slices.Equal(got, []string{"TCP/5671"}) {
		t.Errorf("broker egress ports %v, want [TCP/5671]", got)
	}
	if !reflect.DeepEqual(broker.To, v.NetworkPolicy.Broker.To) {
		t.Errorf("broker egress to %+v, want %+v", broker.To, v.NetworkPolicy.Broker.To)
	}
	if got := npPorts(otel.Ports); !slices.Equal(got, []string{"TCP/4317"}) {
		t.Errorf("OTLP egress ports %v, want [TCP/4317]", got)
	}
	if !reflect.DeepEqual(otel.To, v.NetworkPolicy.Otel.To) {
		t.Errorf("OTLP egress to %+v, want %+v", otel.To, v.NetworkPolicy.Otel.To)
	}
	if got := npPorts(dns.Ports); !slices.Equal(got, []string{"UDP/53", "TCP/53"}) || len(dns.To) != 0 {
		t.Errorf("DNS egress %v to %+v, want [UDP/53 TCP/53] to any destination", got, dns.To)
	}
	if !reflect.DeepEqual(np.Spec.Egress[3:], v.NetworkPolicy.ExtraEgress) {
		t.Errorf("extra egress rendered as %+v, want %+v as given", np.Spec.Egress[3:], v.NetworkPolicy.ExtraEgress)
	}
}

// TestChartNetworkPolicyOtelDefaultPorts: with tracing on and no otel
// values, the OTLP rule opens both OTLP ports (gRPC and HTTP) to anywhere.
func TestChartNetworkPolicyOtelDefaultPorts(t *testing.T) {
	_, nps := renderNetworkPolicy(t, "--set", "networkPolicy.enabled=true",
		"--set", "otel.enabled=true", "--set", "otel.endpoint=http://collector:4318")
	if len(nps) != 1 || len(nps[0].Spec.Egress) != 3 {
		t.Fatalf("want one NetworkPolicy with broker, OTLP and DNS egress, got %+v", nps)
	}
	otel := nps[0].Spec.Egress[1]
	if got := npPorts(otel.Ports); !slices.Equal(got, []string{"TCP/4317", "TCP/4318"}) || len(otel.To) != 0 {
		t.Errorf("OTLP egress %v to %+v, want [TCP/4317 TCP/4318] to any destination", got, otel.To)
	}
}

// checkPolicySelectsPods fails unless the policy's podSelector selects the
// Deployment's pods.
func checkPolicySelectsPods(t *testing.T, np *networkingv1.NetworkPolicy, dep *appsv1.Deployment) {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil || sel.Empty() {
		t.Fatalf("NetworkPolicy %s: podSelector %v: %v (an empty selector would apply to every pod of the namespace)", np.Name, sel, err)
	}
	if !sel.Matches(labels.Set(dep.Spec.Template.Labels)) {
		t.Errorf("NetworkPolicy %s selects %s; the pods of %s (%v) do not match", np.Name, sel, dep.Name, dep.Spec.Template.Labels)
	}
}

// checkNetworkPolicies checks a rendered release's NetworkPolicy against
// what the pod actually does: it selects the pods, restricts both
// directions, admits the admin port, and lets Hopper reach DNS, each broker
// URL's port and, with tracing on, the OTLP endpoint's port.
func checkNetworkPolicies(t *testing.T, ms []manifest, d *appsv1.Deployment, hopper *corev1.Container, adminPort int, brokerURLs []string) {
	t.Helper()
	for _, np := range byKind[*networkingv1.NetworkPolicy](ms) {
		checkPolicySelectsPods(t, np, d)
		if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}) {
			t.Errorf("NetworkPolicy %s: policyTypes %v, want [Ingress Egress]", np.Name, np.Spec.PolicyTypes)
		}
		ingressAllows := func(port int) bool {
			return slices.ContainsFunc(np.Spec.Ingress, func(r networkingv1.NetworkPolicyIngressRule) bool {
				return slices.ContainsFunc(r.Ports, func(p networkingv1.NetworkPolicyPort) bool { return portIs(p, corev1.ProtocolTCP, port) })
			})
		}
		egressAllows := func(proto corev1.Protocol, port int) bool {
			return slices.ContainsFunc(np.Spec.Egress, func(r networkingv1.NetworkPolicyEgressRule) bool {
				return len(r.Ports) == 0 || slices.ContainsFunc(r.Ports, func(p networkingv1.NetworkPolicyPort) bool { return portIs(p, proto, port) })
			})
		}
		if !ingressAllows(adminPort) {
			t.Errorf("NetworkPolicy %s admits nothing on the admin port %d (metrics scrapes would be dropped)", np.Name, adminPort)
		}
		for _, proto := range []corev1.Protocol{corev1.ProtocolUDP, corev1.ProtocolTCP} {
			if !egressAllows(proto, 53) {
				t.Errorf("NetworkPolicy %s: no egress on %s/53: Hopper could not resolve the broker", np.Name, proto)
			}
		}
		for _, u := range brokerURLs {
			port := urlPort(t, u)
			if !egressAllows(corev1.ProtocolTCP, port) {
				t.Errorf("NetworkPolicy %s: no egress on TCP/%d, the port of broker URL %s", np.Name, port, u)
			}
		}
		for _, e := range hopper.Env {
			if e.Name == "OTEL_EXPORTER_OTLP_ENDPOINT" {
				if port := urlPort(t, e.Value); !egressAllows(corev1.ProtocolTCP, port) {
					t.Errorf("NetworkPolicy %s: no egress on TCP/%d, the port of the OTLP endpoint %s", np.Name, port, e.Value)
				}
			}
		}
	}
}

func portIs(p networkingv1.NetworkPolicyPort, proto corev1.Protocol, port int) bool {
	pp := corev1.ProtocolTCP
	if p.Protocol != nil {
		pp = *p.Protocol
	}
	if pp != proto {
		return false
	}
	if p.Port == nil {
		return true
	}
	if p.Port.Type != intstr.Int {
		return false
	}
	lo := p.Port.IntValue()
	hi := lo
	if p.EndPort != nil {
		hi = int(*p.EndPort)
	}
	return port >= lo && port <= hi
}

// urlPort is the TCP port a URL connects to: its own, or its scheme's
// default (amqp 5672, amqps 5671, http 80, https 443).
func urlPort(t *testing.T, raw string) int {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("%q: %v", raw, err)
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil {
			t.Fatalf("%q: port: %v", raw, err)
		}
		return n
	}
	switch u.Scheme {
	case "amqp":
		return 5672
	case "amqps":
		return 5671
	case "http":
		return 80
	case "https":
		return 443
	}
	t.Fatalf("%q: no port and no known scheme", raw)
	return 0
}

// TestChartNetworkPolicyMetricsPodsOnly: a namespaceSelector set to null
// leaves a peer of podSelector alone (those pods of the release's own
// namespace), never an empty peer.
func TestChartNetworkPolicyMetricsPodsOnly(t *testing.T) {
	_, nps := renderNetworkPolicy(t, "--set", "networkPolicy.enabled=true",
		"--set", "networkPolicy.metrics.namespaceSelector=null",
		"--set", "networkPolicy.metrics.podSelector.matchLabels.app=prometheus")
	if len(nps) != 1 || len(nps[0].Spec.Ingress) != 1 {
		t.Fatalf("want one NetworkPolicy with one ingress rule, got %+v", nps)
	}
	from := nps[0].Spec.Ingress[0].From
	want := metav1.LabelSelector{MatchLabels: map[string]string{"app": "prometheus"}}
	if len(from) != 1 || from[0].NamespaceSelector != nil || from[0].PodSelector == nil || !reflect.DeepEqual(*from[0].PodSelector, want) {
		t.Errorf("admin ingress from %+v, want only podSelector %v", from, want)
	}
}
