package packaging

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// manifest is one rendered document decoded into its Kubernetes API type.
type manifest struct {
	source     string // helm's "# Source:" template path
	apiVersion string
	kind       string
	name       string
	obj        any
}

// serviceMonitor is the part of monitoring.coreos.com/v1 ServiceMonitor the
// chart renders. The CRD's types are not imported (the prometheus-operator
// module is large); decoding strictly into this struct rejects any field the
// chart renders that is not listed here, and checkServiceMonitor checks the
// values.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		JobLabel          string               `json:"jobLabel,omitempty"`
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector *struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector,omitempty"`
		Endpoints []smEndpoint `json:"endpoints"`
	} `json:"spec"`
}

type smEndpoint struct {
	Port              string       `json:"port,omitempty"`
	Path              string       `json:"path,omitempty"`
	Scheme            string       `json:"scheme,omitempty"`
	Interval          string       `json:"interval,omitempty"`
	ScrapeTimeout     string       `json:"scrapeTimeout,omitempty"`
	HonorLabels       bool         `json:"honorLabels,omitempty"`
	Relabelings       []relabeling `json:"relabelings,omitempty"`
	MetricRelabelings []relabeling `json:"metricRelabelings,omitempty"`
}

type relabeling struct {
	SourceLabels []string `json:"sourceLabels,omitempty"`
	Separator    *string  `json:"separator,omitempty"`
	TargetLabel  string   `json:"targetLabel,omitempty"`
	Regex        string   `json:"regex,omitempty"`
	Modulus      uint64   `json:"modulus,omitempty"`
	Replacement  *string  `json:"replacement,omitempty"`
	Action       string   `json:"action,omitempty"`
}

// crdObject is a custom resource checked elsewhere: here only its metadata
// is read, and the rest kept as it is.
type crdObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              map[string]any `json:"spec"`
}

// newObject maps apiVersion/kind to the API type a manifest must decode into.
// Anything else the chart renders is an error: a new kind needs its type here.
func newObject(apiVersion, kind string) (any, bool) {
	switch apiVersion + "/" + kind {
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}, true
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}, true
	case "v1/Service":
		return &corev1.Service{}, true
	case "policy/v1/PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, true
	case "autoscaling/v2/HorizontalPodAutoscaler":
		return &autoscalingv2.HorizontalPodAutoscaler{}, true
	case "monitoring.coreos.com/v1/ServiceMonitor":
		return &serviceMonitor{}, true
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}, true
	case "batch/v1/Job":
		return &batchv1.Job{}, true
	case "networking.k8s.io/v1/NetworkPolicy":
		return &networkingv1.NetworkPolicy{}, true
	case "monitoring.coreos.com/v1/PodMonitor", "monitoring.coreos.com/v1/PrometheusRule",
		"keda.sh/v1alpha1/ScaledObject", "keda.sh/v1alpha1/TriggerAuthentication":
		// Decoded strictly into the Prometheus Operator's and KEDA's own
		// types by the test-only module internal/kubecheck, which keeps
		// those modules out of Hopper's go.mod.
		return &crdObject{}, true
	}
	return nil, false
}

var (
	docSep   = regexp.MustCompile(`(?m)^---[ \t]*$`)
	sourceRE = regexp.MustCompile(`(?m)^# Source: (\S+)`)
)

// decodeManifests splits helm template output and decodes every document
// strictly: YAML with duplicate keys is rejected, then the JSON is decoded
// the way the API server does with fieldValidation=Strict (case-sensitive
// field names, unknown and duplicate fields are errors) into the typed
// object of k8s.io/api.
func decodeManifests(t *testing.T, out string) []manifest {
	t.Helper()
	var ms []manifest
	for _, doc := range docSep.Split(out, -1) {
		src := ""
		if m := sourceRE.FindStringSubmatch(doc); m != nil {
			src = m[1]
		}
		j, err := yaml.YAMLToJSONStrict([]byte(doc))
		if err != nil {
			t.Errorf("%s: not valid YAML: %v", src, err)
			continue
		}
		if string(j) == "null" {
			continue // an empty document
		}
		var tm metav1.TypeMeta
		if err := kjson.UnmarshalCaseSensitivePreserveInts(j, &tm); err != nil {
			t.Errorf("%s: %v", src, err)
			continue
		}
		obj, ok := newObject(tm.APIVersion, tm.Kind)
		if !ok {
			t.Errorf("%s: unexpected %s %s (add its API type to newObject)", src, tm.APIVersion, tm.Kind)
			continue
		}
		strict, err := kjson.UnmarshalStrict(j, obj, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
		if err != nil {
			t.Errorf("%s: %s %s does not decode: %v", src, tm.APIVersion, tm.Kind, err)
			continue
		}
		for _, e := range strict {
			t.Errorf("%s: %s %s: %v", src, tm.APIVersion, tm.Kind, e)
		}
		name := ""
		if mo, ok := obj.(metav1.Object); ok {
			name = mo.GetName()
		}
		ms = append(ms, manifest{source: src, apiVersion: tm.APIVersion, kind: tm.Kind, name: name, obj: obj})
	}
	return ms
}

// byKind returns the decoded objects of one kind.
func byKind[T any](ms []manifest) []T {
	var out []T
	for _, m := range ms {
		if o, ok := m.obj.(T); ok {
			out = append(out, o)
		}
	}
	return out
}

func (m manifest) String() string { return fmt.Sprintf("%s %s (%s)", m.kind, m.name, m.source) }

// kindsOf lists "Kind/name" of every manifest, for messages.
func kindsOf(ms []manifest) string {
	var s []string
	for _, m := range ms {
		s = append(s, m.kind+"/"+m.name)
	}
	return strings.Join(s, ", ")
}
