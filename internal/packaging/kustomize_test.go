package packaging

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite the generated files of examples/kubernetes from the chart")

// kustomizeDir is the plain-manifest example for teams without Helm.
const kustomizeDir = "examples/kubernetes"

// generatedHeader opens every file generated from the chart.
const generatedHeader = "# Generated from charts/hopper with examples/kubernetes/values.yaml (release \"orders\").\n" +
	"# Do not edit: change the values or the chart and run\n" +
	"#   go test ./internal/packaging/ -run TestKustomizeExample -update\n"

// TestKustomizeExampleInStep renders the chart with the example's values
// and checks that the Kustomize component's ConfigMap and sidecar patch are
// exactly what the chart renders today (with -update, writes them).
func TestKustomizeExampleInStep(t *testing.T) {
	args := []string{"template", "orders", repoPath(chartDir), "--kube-version", kubeVersion,
		"-f", repoPath(kustomizeDir, "values.yaml")}
	stdout, stderr, err := runHelm(t, args...)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr)
	}
	ms := decodeManifests(t, stdout)
	deps := byKind[*appsv1.Deployment](ms)
	var cm *corev1.ConfigMap
	for _, c := range byKind[*corev1.ConfigMap](ms) {
		if _, ok := c.Data["hopper.yaml"]; ok {
			cm = c
		}
	}
	if len(deps) != 1 || cm == nil {
		t.Fatalf("want a Deployment and Hopper's ConfigMap, got %s", kindsOf(ms))
	}
	pod := deps[0].Spec.Template
	hopper, _ := findHopper(t, &pod)
	if hopper == nil {
		t.Fatal("no Hopper container in the rendered Deployment")
	}

	files := map[string]string{
		"configmap.yaml":     toYAML(t, generatedConfigMap(cm)),
		"sidecar-patch.yaml": toYAML(t, sidecarPatch(t, &pod, hopper)),
	}
	for name, want := range files {
		path := repoPath(kustomizeDir, "hopper-sidecar", name)
		want = generatedHeader + want
		if *update {
			if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("%s is out of step with the chart: run go test ./internal/packaging/ -run TestKustomizeExample -update\n--- want\n%s", filepath.Join(kustomizeDir, "hopper-sidecar", name), want)
		}
	}
}

// helmOnlyLabels name Helm as the manager; a plain manifest must not.
var helmOnlyLabels = []string{"helm.sh/chart", "app.kubernetes.io/managed-by"}

func generatedConfigMap(cm *corev1.ConfigMap) map[string]any {
	labels := map[string]string{}
	for k, v := range cm.Labels {
		if !slices.Contains(helmOnlyLabels, k) {
			labels[k] = v
		}
	}
	return map[string]any{
		"apiVersion": "v1",
		"kind":       "ConfigMap",
		"metadata":   map[string]any{"name": cm.Name, "labels": labels},
		"data":       cm.Data,
	}
}

// sidecarPatch is a strategic-merge patch that adds the Hopper container,
// the volumes it mounts, the config checksum and the grace period to a
// Deployment (containers and volumes merge by name).
func sidecarPatch(t *testing.T, pod *corev1.PodTemplateSpec, hopper *corev1.Container) map[string]any {
	t.Helper()
	var vols []corev1.Volume
	for _, m := range hopper.VolumeMounts {
		for _, v := range pod.Spec.Volumes {
			if v.Name == m.Name && !slices.ContainsFunc(vols, func(x corev1.Volume) bool { return x.Name == v.Name }) {
				vols = append(vols, v)
			}
		}
	}
	return map[string]any{
		"apiVersion": "apps/v1",
		"kind":       "Deployment",
		"metadata":   map[string]any{"name": "orders"},
		"spec": map[string]any{
			"template": map[string]any{
				"metadata": map[string]any{"annotations": pod.Annotations},
				"spec": map[string]any{
					"terminationGracePeriodSeconds": pod.Spec.TerminationGracePeriodSeconds,
					"containers":                    []any{hopper},
					"volumes":                       vols,
				},
			},
		},
	}
}

// toYAML marshals through JSON, so the Kubernetes types keep their json
// field names and omitempty.
func toYAML(t *testing.T, v any) string {
	t.Helper()
	j, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	y, err := yaml.JSONToYAML(j)
	if err != nil {
		t.Fatal(err)
	}
	return string(y)
}
